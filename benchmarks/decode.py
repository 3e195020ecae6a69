"""``python -m benchmarks --ops decode``: tokens per second of greedy generation with the mini GPT,
with a key/value cache and without, NumPy beside the torch twin.

Without a cache each new token runs the model on the whole context again (O(T^2) work per token
in attention and O(T) in everything else); with it each step runs the new token only and reads
the past keys and values back. For each prompt length P the model generates ``new`` tokens
greedily from a prompt of P random ids, P + new <= block_size; the report gives tokens per second
of both paths and their ratio (cached over uncached). Before timing, both paths of both libraries
must produce the same tokens. Both libraries run in this process, one after the other, each
pinned to ``--threads`` threads.
"""

import dataclasses
import datetime
import json
import time
from pathlib import Path

import numpy as np

from benchmarks import measure, report
from numpy_attn.gpt import GPTConfig, gpt_forward, gpt_kv_cache, init_gpt_params

# The mini GPT timed: the full sweep's and --quick's (block_size is the longest context).
FULL = dict(config=GPTConfig(vocab_size=4096, block_size=256, n_layer=2, n_head=4, n_embd=128),
            prompt_lens=[1, 32, 64, 128, 192], new_tokens=64)
QUICK = dict(config=GPTConfig(vocab_size=256, block_size=64, n_layer=2, n_head=2, n_embd=32),
             prompt_lens=[1, 16, 48], new_tokens=16)


def greedy_numpy(params, config, prompt, new_tokens, cache):
    """prompt (1, P) -> ids (1, P + new_tokens), each new id the argmax of the last logits."""
    ids = prompt
    kv_cache = gpt_kv_cache(config, 1, params["wte"].dtype) if cache else None
    step = ids                                                      # what the next forward reads
    for _ in range(new_tokens):
        logits, _ = gpt_forward(step, params, config, kv_cache=kv_cache)          # (1, T, V)
        next_id = np.argmax(logits[0, -1])
        ids = np.concatenate([ids, [[next_id]]], axis=1)            # (1, T) -> (1, T + 1)
        step = ids[:, -1:] if cache else ids                        # the cache holds the rest
    return ids


def greedy_twin(params, config, prompt, new_tokens, cache):
    """The same with torch_attn's GPT, under torch.no_grad()."""
    import torch

    import torch_attn.gpt as tw

    with torch.no_grad():
        ids = prompt
        kv_cache = tw.gpt_kv_cache(config, 1, params["wte"].dtype) if cache else None
        step = ids
        for _ in range(new_tokens):
            logits = tw.gpt(step, params, config, kv_cache=kv_cache)                # (1, T, V)
            next_id = torch.argmax(logits[0, -1])
            ids = torch.cat([ids, next_id.reshape(1, 1)], dim=1)                    # (1, T) -> (1, T + 1)
            step = ids[:, -1:] if cache else ids
        return ids


def run(args, argv):
    """Parity, then timing of every (library, prompt length, cached or not): the results dict."""
    import threadpoolctl
    import torch

    started = time.monotonic()
    base = QUICK if args.quick else FULL
    config = base["config"]
    threads = args.threads or (1 if args.quick else measure_threads())
    repeats = args.repeats or 3
    min_time = 0.0 if args.min_time is None else args.min_time
    dtype = np.dtype(args.dtype)
    new = base["new_tokens"]
    prompt_lens = [P for P in (args.seq_lens or base["prompt_lens"]) if P + new <= config.block_size]
    if not prompt_lens:
        raise ValueError(f"no prompt length P with P + {new} new tokens <= block_size = {config.block_size}")
    rng = np.random.default_rng(args.seed)
    params = init_gpt_params(config, rng, dtype)
    tparams = _tree(params, torch.from_numpy)
    progress = report.Progress(len(prompt_lens) * 5, enabled=not args.no_progress)
    rows = []
    for P in prompt_lens:
        prompt = rng.integers(0, config.vocab_size, (1, P))
        with threadpoolctl.threadpool_limits(threads, user_api="blas"):
            tokens = {cache: greedy_numpy(params, config, prompt, new, cache) for cache in (True, False)}
        torch.set_num_threads(threads)
        tokens_t = {cache: greedy_twin(tparams, config, torch.from_numpy(prompt), new, cache).numpy()
                    for cache in (True, False)}
        same = all(np.array_equal(t, tokens[True]) for t in (tokens[False], tokens_t[True], tokens_t[False]))
        progress.step(f"decode parity P={P}")
        for impl in ("numpy", "twin"):
            times = {}
            for cache in (True, False):
                if impl == "numpy":
                    with threadpoolctl.threadpool_limits(threads, user_api="blas"):
                        times[cache] = measure.time_numpy(
                            lambda c=cache, p=prompt: greedy_numpy(params, config, p, new, c), repeats, min_time, 1)
                else:
                    tprompt = torch.from_numpy(prompt)
                    times[cache] = measure.time_torch(
                        lambda c=cache, p=tprompt: greedy_twin(tparams, config, p, new, c), repeats, min_time, 1,
                        threads, "cpu")
                progress.step(f"decode {impl} P={P} {'cached' if cache else 'uncached'}")
            rows.append(dict(impl=impl, P=P, new_tokens=new, same_tokens=same,
                             cached_tokens_per_s=new / times[True]["median"],
                             uncached_tokens_per_s=new / times[False]["median"],
                             ratio=times[False]["median"] / times[True]["median"],
                             time_s=dict(cached=times[True], uncached=times[False])))
    return dict(schema=1, command="python -m benchmarks " + " ".join(argv),
                started_utc=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                duration_s=round(time.monotonic() - started, 1), machine=report.machine(),
                config=dict(model=dataclasses.asdict(config), dtype=str(dtype), threads=threads,
                            repeats=repeats, min_time=min_time, seed=args.seed, quick=args.quick),
                rows=rows)


def measure_threads():
    from benchmarks.cli import USABLE_CPUS

    return USABLE_CPUS


def _tree(tree, fn):
    return {k: _tree(v, fn) if isinstance(v, dict) else fn(v) for k, v in tree.items()}


def table_lines(results):
    """The report: one line per library and prompt length."""
    c = results["config"]
    m = c["model"]
    lines = [f"decode: greedy generation, GPT V={m['vocab_size']} block_size={m['block_size']} "
             f"n_layer={m['n_layer']} n_head={m['n_head']} n_embd={m['n_embd']}, {c['dtype']}, "
             f"{c['threads']} thread(s); tokens/s = new tokens / median time",
             "",
             f"{'impl':<6} {'P':>5} {'new':>4} {'cached tok/s':>13} {'uncached tok/s':>15} {'cached/uncached':>16}  same tokens"]
    for r in results["rows"]:
        lines.append(f"{r['impl']:<6} {r['P']:>5} {r['new_tokens']:>4} {r['cached_tokens_per_s']:>13.1f} "
                     f"{r['uncached_tokens_per_s']:>15.1f} {r['ratio']:>15.2f}x  {'yes' if r['same_tokens'] else 'NO'}")
    return lines


def main(args, argv):
    """Run the decode benchmark for the command line's ``args``; returns the exit status."""
    try:
        results = run(args, argv)
    except ValueError as err:
        print(f"python -m benchmarks: {err}")
        return 2
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    print("\n".join(table_lines(results)))
    return 0 if all(r["same_tokens"] for r in results["rows"]) else 1
