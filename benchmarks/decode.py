"""``python -m benchmarks --ops decode``: tokens per second of greedy generation with the mini GPT,
with a key/value cache and without, NumPy beside the torch twin.

Without a cache each new token runs the model on the whole context again (O(T^2) work per token
in attention and O(T) in everything else); with it each step runs the new token only and reads
the past keys and values back. For each prompt length P the model generates ``new`` tokens
greedily from a prompt of P random ids, P + new <= block_size; the report gives tokens per second
of both paths and their ratio (cached over uncached). Before timing, both paths of both libraries
must produce the same tokens. Each library runs in its own timing worker (``_worker.py``),
pinned to ``--threads`` threads, as every timing of ``python -m benchmarks`` does; both build
the same model and prompts from the seed, and the parent compares the tokens they generated.
"""

import dataclasses
import datetime
import time

import numpy as np

from benchmarks import machine, measure, report
from benchmarks.workers import Worker
from numpy_attn.gpt import GPTConfig, gpt_forward, gpt_kv_cache, init_gpt_params

# The mini GPT timed: the full sweep's and --quick's (block_size is the longest context).
FULL = dict(config=GPTConfig(vocab_size=4096, block_size=256, n_layer=2, n_head=4, n_embd=128),
            prompt_lens=[1, 32, 64, 128, 192], new_tokens=64)
QUICK = dict(config=GPTConfig(vocab_size=256, block_size=64, n_layer=2, n_head=2, n_embd=32),
             prompt_lens=[1, 16, 48], new_tokens=16)


def greedy(forward, params, config, ids, new_tokens, kv_cache=None):
    """ids (1, P) -> (1, P + new_tokens), each new id the argmax of the last logits of
    ``forward(ids, params, config, kv_cache=...) -> (logits, cache)``. With a ``kv_cache`` the
    first forward reads the ids it does not hold yet (all of them when it is empty), then one
    token a step; without one, every step reads the whole context again."""
    step = ids if kv_cache is None else ids[:, kv_cache.length:]  # what the next forward reads
    for _ in range(new_tokens):
        logits, _ = forward(step, params, config, kv_cache=kv_cache)             # (1, T, V)
        next_id = np.argmax(logits[0, -1])
        ids = np.concatenate([ids, [[next_id]]], axis=1)            # (1, T) -> (1, T + 1)
        step = ids if kv_cache is None else ids[:, -1:]             # the cache holds the rest
    return ids


def greedy_torch(forward, params, config, ids, new_tokens, kv_cache=None):
    """The same with a torch_attn model, ``forward(...) -> logits``, under torch.no_grad()."""
    import torch

    with torch.no_grad():
        step = ids if kv_cache is None else ids[:, kv_cache.length:]
        for _ in range(new_tokens):
            logits = forward(step, params, config, kv_cache=kv_cache)             # (1, T, V)
            next_id = torch.argmax(logits[0, -1])
            ids = torch.cat([ids, next_id.reshape(1, 1)], dim=1)                  # (1, T) -> (1, T + 1)
            step = ids if kv_cache is None else ids[:, -1:]
        return ids


def greedy_numpy(params, config, prompt, new_tokens, cache):
    """prompt (1, P) -> ids (1, P + new_tokens) with the mini GPT, with a key/value cache or without."""
    kv_cache = gpt_kv_cache(config, 1, params["wte"].dtype) if cache else None
    return greedy(gpt_forward, params, config, prompt, new_tokens, kv_cache)


def greedy_twin(params, config, prompt, new_tokens, cache):
    """The same with torch_attn's GPT."""
    import torch_attn.gpt as tw

    kv_cache = tw.gpt_kv_cache(config, 1, params["wte"].dtype) if cache else None
    return greedy_torch(tw.gpt, params, config, prompt, new_tokens, kv_cache)


def run(args, argv):
    """Timing of every (library, prompt length, cached or not) in one worker per library, then
    the tokens of all four paths compared: the results dict."""
    started, load = time.monotonic(), machine.LoadWatch()
    base = QUICK if args.quick else FULL
    config = base["config"]
    threads = threads_of(args)
    repeats = args.repeats or 3
    min_time = 0.0 if args.min_time is None else args.min_time
    new = base["new_tokens"]
    prompt_lens = [P for P in (args.seq_lens or base["prompt_lens"]) if P + new <= config.block_size]
    if not prompt_lens:
        raise ValueError(f"no prompt length P with P + {new} new tokens <= block_size = {config.block_size}")
    progress = report.progress_bar(len(prompt_lens) * 4, args.no_progress)
    job = dict(device="cpu", threads=threads, dtype=args.dtype, repeats=repeats, min_time=min_time,
               decode=dict(config=dataclasses.asdict(config), prompt_lens=prompt_lens, new_tokens=new,
                           seed=args.seed))
    timed, envs = {}, []                           # (impl, P, cache) -> row of a worker; envs
    for library in ("numpy", "torch"):
        with Worker(dict(job, library=library), progress) as worker:
            for record in worker.records():
                if record["kind"] == "env":
                    envs.append(record)
                elif record["kind"] == "row":
                    timed[record["impl"], record["P"], record["cache"]] = record
    rows = []
    for P in prompt_lens:
        tokens = [timed[impl, P, cache]["tokens"] for impl in ("numpy", "twin") for cache in (True, False)]
        same = all(t == tokens[0] for t in tokens)
        for impl in ("numpy", "twin"):
            times = {cache: timed[impl, P, cache]["time_s"] for cache in (True, False)}
            rows.append(dict(impl=impl, P=P, new_tokens=new, same_tokens=same,
                             cached_tokens_per_s=new / times[True]["median"],
                             uncached_tokens_per_s=new / times[False]["median"],
                             ratio=times[False]["median"] / times[True]["median"],
                             time_s=dict(cached=times[True], uncached=times[False])))
    return dict(schema=1, command="python -m benchmarks " + " ".join(argv),
                started_utc=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                duration_s=round(time.monotonic() - started, 1), **machine.facts(load, threads), workers=envs,
                config=dict(model=dataclasses.asdict(config), dtype=args.dtype, threads=threads,
                            repeats=repeats, min_time=min_time, seed=args.seed, quick=args.quick),
                rows=rows)


def time_in_worker(job):
    """In a timing worker: the rows of one library, {impl, P, cache, tokens, time_s} each.

    The model and the prompts come from the seed, drawn in the same order in either worker.
    """
    spec, dtype = job["decode"], np.dtype(job["dtype"])
    config = GPTConfig(**spec["config"])
    rng = np.random.default_rng(spec["seed"])
    params = init_gpt_params(config, rng, dtype)
    new = spec["new_tokens"]
    if job["library"] == "numpy":
        impl, generate, as_array = "numpy", greedy_numpy, np.asarray
    else:
        import torch

        impl, generate, as_array = "twin", greedy_twin, torch.from_numpy
        params = tree_map(params, torch.from_numpy)
    for P in spec["prompt_lens"]:
        prompt = as_array(rng.integers(0, config.vocab_size, (1, P)))
        for cache in (True, False):
            def fn(cache=cache, prompt=prompt):
                return generate(params, config, prompt, new, cache)

            if impl == "numpy":
                time_s = measure.time_numpy(fn, job["repeats"], job["min_time"], 1)
            else:
                time_s = measure.time_torch(fn, job["repeats"], job["min_time"], 1, job["threads"], "cpu")
            yield dict(impl=impl, P=P, cache=cache, tokens=np.asarray(fn()).tolist(), time_s=time_s)


def threads_of(args):
    """The threads of each timed process of a decode run: --threads, else 1 with --quick, else every
    CPU this process may use."""
    return args.threads or (1 if args.quick else machine.USABLE_CPUS)


def run_results(run, argv, started, load, envs, config, rows):
    """The results dict of a decode run beside this one (decode_cache.py, decode_hf.py): the run, the
    machine and every worker's BLAS and threads, the rows."""
    return dict(schema=1, run=run, command="python -m benchmarks " + " ".join(argv),
                started_utc=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                duration_s=round(time.monotonic() - started, 1), **machine.facts(load, config["threads"]),
                workers=envs, config=config, rows=rows)


def tree_map(tree, fn):
    """``fn`` on every array of nested dicts, tuples and lists (NumPy parameters to torch)."""
    if isinstance(tree, dict):
        return {k: tree_map(v, fn) for k, v in tree.items()}
    if isinstance(tree, tuple | list):
        return type(tree)(tree_map(v, fn) for v in tree)
    return fn(tree)


def table_lines(results):
    """The report: one line per library and prompt length."""
    c = results["config"]
    m = c["model"]
    lines = [*(report.machine_lines(results) if "workers" in results else []),
             f"decode: greedy generation, GPT V={m['vocab_size']} block_size={m['block_size']} "
             f"n_layer={m['n_layer']} n_head={m['n_head']} n_embd={m['n_embd']}, {c['dtype']}, "
             f"{c['threads']} thread(s); tokens/s = new tokens / median time; cached/uncached: tokens/s with "
             "the key/value cache over without it (above 1: the cache is faster)",
             "",
             f"{'impl':<6} {'P':>5} {'new':>4} {'cached tok/s':>13} {'uncached tok/s':>15} "
             f"{'cached/uncached':>16}  same tokens"]
    for r in results["rows"]:
        lines.append(f"{r['impl']:<6} {r['P']:>5} {r['new_tokens']:>4} {r['cached_tokens_per_s']:>13.1f} "
                     f"{r['uncached_tokens_per_s']:>15.1f} {r['ratio']:>15.2f}x  {'yes' if r['same_tokens'] else 'NO'}")
    return lines


RUNS = {"decode": (run, table_lines)}
WORKERS = {"decode": time_in_worker}
