"""``python -m benchmarks --ops decode_hf --hf DIR``: a Hugging Face folder (GPT-2, Llama or another
family attn_cli/hf/ reads) decoded greedily by numpy-attn's ``generate --hf`` path and by
transformers' ``generate(use_cache=True)``: time per new token, prefill time and peak memory.

Each library runs in its own timing worker (benchmarks/_worker.py), pinned to ``--threads``
threads, and loads the folder once (float32). Both continue the same prompts of P random ids
(``--seq-lens``: P, default 512, at most the context less the new tokens); before anything is
timed, both must generate the same N2 ids from each prompt. Then the workers take turns, round
after round (``--repeats`` rounds, the order reversed every other round), each timing one call of
1, N1 and N2 new tokens from each prompt:

    per token = (t(N2) - t(N1)) / (N2 - N1)      loading, prefill and the first step cancel
    prefill   = t(1)                             the prompt's forward and one argmax

medians over the rounds. ``ours/transformers`` is paired within each round, so a change in the
machine's speed between rounds cancels. Peak RSS is each worker process's (ru_maxrss: the
interpreter, the libraries, the weights, the caches), beside the checkpoint's bytes on disk.
``--against REV`` adds numpy-attn at git revision REV as a third worker (a revision before
``logits_to_keep`` computes every prompt position's logits).
"""

import inspect
import json
import resource
import statistics
import time

import numpy as np

from benchmarks import machine, parity, report
from benchmarks.decode import run_results, threads_of
from benchmarks.workers import Worker, revision_tree

# N1 and N2, the new tokens of the two timed generations: the full run's and --quick's.
FULL = dict(new_tokens=(8, 72), rounds=5, prompt_len=512)
QUICK = dict(new_tokens=(2, 6), rounds=2, prompt_len=512)


# -- in a timing worker ---------------------------------------------------------------------------

def numpy_generator(folder):
    """(generate(prompt, new) -> ids, model info) for numpy-attn: attn_cli/hf_generate.py's path,
    continue_ids with the family's forward and key/value cache, greedy."""
    from attn_cli.generate import continue_ids
    from attn_cli.hf import load_checkpoint
    from attn_cli.hf_generate import family_functions

    kind, config, params = load_checkpoint(folder, "float32")
    forward, new_cache = family_functions(kind)
    # --against a revision before logits_to_keep (its forward computes every position's logits) or
    # before for_backward (it keeps every block's activations): the keywords it lacks are not passed.
    known = inspect.signature(forward).parameters

    def logits(ids, **kw):
        return forward(ids, params, config, **{k: v for k, v in kw.items() if k in known})[0]

    def generate(prompt, new):
        return continue_ids(logits, prompt, config.block_size, new, 0.0, None, None,
                            lambda max_len: new_cache(config, 1, params["wte"].dtype, max_len))

    return generate, dict(family=kind, vocab_size=config.vocab_size, block_size=config.block_size)


def transformers_generator(folder):
    """The same for transformers: AutoModelForCausalLM in float32, ``generate`` greedy with its
    cache, exactly ``new`` tokens (no end-of-text stop)."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    def generate(prompt, new):
        ids = torch.tensor([prompt])                                          # (1, P)
        with torch.no_grad():   # every id attended: without the mask, generate would mask the ids equal to pad_token_id
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                                 do_sample=False, use_cache=True, pad_token_id=0, eos_token_id=None)
        return out[0].tolist()

    return generate, {}


def serve(job, emit, requests):
    """The worker's loop: load the folder, emit a ``model`` record, then for each request line
    ``{"ids", "new"}`` generate and emit a ``sample``: the seconds of the call, the ids when the
    request asks ``"check"``, the process's peak RSS so far."""
    folder = job["decode_hf"]["folder"]
    generate, info = (numpy_generator if job["library"] == "numpy" else transformers_generator)(folder)
    emit("model", **info)
    for line in requests:
        request = json.loads(line)
        start = time.perf_counter()
        ids = generate(request["ids"], request["new"])
        seconds = time.perf_counter() - start
        emit("sample", seconds=seconds, ids=ids if request.get("check") else None,
             peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)   # Linux: KiB


# -- in the parent --------------------------------------------------------------------------------

def run(args, argv):
    """The check, then the rounds, in one worker per library (and per --against revision): the results dict."""
    import contextlib

    from attn_cli.hf import checkpoint_bytes

    started, load = time.monotonic(), machine.LoadWatch()
    if not args.hf:
        raise ValueError("--ops decode_hf needs --hf DIR, a Hugging Face model folder (config.json and safetensors)")
    base = QUICK if args.quick else FULL
    n1, n2 = base["new_tokens"]
    threads = threads_of(args)
    rounds = args.repeats or base["rounds"]
    folder_bytes = checkpoint_bytes(args.hf)                   # also refuses a folder without weights, now
    job = dict(device="cpu", threads=threads, dtype="float32", serve=True, decode_hf=dict(folder=str(args.hf)))
    impls = {"numpy-attn": dict(library="numpy"), "transformers": dict(library="torch")}
    progress = report.progress_bar(1 + rounds, args.no_progress)
    with contextlib.ExitStack() as stack:
        if args.against:
            impls[f"numpy-attn@{args.against}"] = dict(library="numpy", pythonpath=stack.enter_context(
                revision_tree(args.against)), revision=args.against)
        workers, envs, models = {}, [], {}
        for impl, how in impls.items():
            workers[impl] = stack.enter_context(Worker(dict(job, library=how["library"]), pythonpath=how.get(
                "pythonpath"), label=impl))
        for impl, worker in workers.items():      # loading in parallel; each says when it is ready
            envs.append(dict(_record(worker, "env"), revision=impls[impl].get("revision")))
            models[impl] = _record(worker, "model")
        model = models["numpy-attn"]
        prompt_lens = sorted({min(P, model["block_size"] - n2) for P in (args.seq_lens or [base["prompt_len"]])})
        if prompt_lens[0] < 1:
            raise ValueError(f"{args.hf}: a context of block_size = {model['block_size']} leaves no room for a "
                             f"prompt and {n2} new tokens")
        rng = np.random.default_rng(args.seed)
        prompts = {P: rng.integers(0, model["vocab_size"], P).tolist() for P in prompt_lens}
        # The same ids from every worker before anything is timed (this also warms each one up).
        for P, prompt in prompts.items():
            ids = {impl: worker.ask(dict(ids=prompt, new=n2, check=True))["ids"] for impl, worker in workers.items()}
            if any(other != ids["numpy-attn"] for other in ids.values()):
                raise parity.ParityError(f"decode_hf: the generated ids differ, nothing was timed (P = {P}): "
                                         + "; ".join(f"{impl} {out[P:]}" for impl, out in ids.items()))
        progress.step("same ids")
        seconds, peak = {}, {}
        for r in range(rounds):
            order = list(workers) if r % 2 == 0 else list(reversed(workers))
            for P, prompt in prompts.items():
                for impl in order:
                    for new in (1, n1, n2):
                        sample = workers[impl].ask(dict(ids=prompt, new=new))
                        seconds.setdefault((impl, P, new), []).append(sample["seconds"])
                        peak[impl] = sample["peak_rss_bytes"]
            progress.step(f"round {r + 1}/{rounds}")
        for worker in workers.values():
            worker.finish()
    rows = []
    for P in prompt_lens:
        per_token = {impl: [(b - a) / (n2 - n1) for a, b in zip(seconds[impl, P, n1], seconds[impl, P, n2],
                                                                 strict=True)] for impl in impls}
        for impl in impls:
            prefill = seconds[impl, P, 1]
            rows.append(dict(
                impl=impl, P=P, new_tokens=[n1, n2], same_ids=True,
                ms_per_token=1e3 * statistics.median(per_token[impl]),
                tokens_per_s=1 / statistics.median(per_token[impl]),
                prefill_s=statistics.median(prefill),
                per_token_over_transformers=report.paired_ratios(per_token[impl], per_token["transformers"]),
                prefill_over_transformers=report.paired_ratios(prefill, seconds["transformers", P, 1]),
                peak_rss_bytes=peak[impl], checkpoint_bytes=folder_bytes,
                peak_rss_over_checkpoint=peak[impl] / folder_bytes,
                time_s={str(new): seconds[impl, P, new] for new in (1, n1, n2)}))
    config = dict(model=dict(folder=str(args.hf), **model), threads=threads, repeats=rounds, new_tokens=[n1, n2],
                  prompt_lens=prompt_lens, seed=args.seed, against=args.against, checkpoint_bytes=folder_bytes,
                  dtype="float32")
    return run_results("decode_hf", argv, started, load, envs, config, rows)


def _record(worker, kind):
    """The worker's next record, which must be of ``kind``: RuntimeError if it ended first."""
    record = worker.read()
    if record is None or record.pop("kind") != kind:
        raise RuntimeError(f"the {worker.label} timing worker ended before its {kind} record")
    return record


def table_lines(results):
    """The report: the machine, then one line per prompt length and implementation."""
    c, m = results["config"], results["config"]["model"]
    n1, n2 = c["new_tokens"]
    lines = [*report.machine_lines(results),
             f"threads: {c['threads']} per timed process; {c['repeats']} rounds taking turns, the order reversed "
             "every other round; medians over the rounds, ratios paired within a round (median [IQR])", "",
             f"decode_hf: {m['folder']} ({m['family']}, V={m['vocab_size']}, context {m['block_size']}), float32, "
             f"greedy; per token = (t({n2} new) - t({n1} new)) / {n2 - n1}; prefill = t(1 new) of a P-token "
             f"prompt; checkpoint {c['checkpoint_bytes'] / 2**20:.1f} MiB; /transformers: this row's time over "
             "transformers' (below 1: faster than transformers, above 1: slower)", ""]
    header = ["impl", "P", "ms/token", "tok/s", "/transformers", "prefill s", "/transformers", "peak RSS MiB",
              "RSS/ckpt", "same ids"]
    rows = [[r["impl"], str(r["P"]), f"{r['ms_per_token']:.2f}", f"{r['tokens_per_s']:.1f}",
             _ratio(r["per_token_over_transformers"]), f"{r['prefill_s']:.3f}", _ratio(r["prefill_over_transformers"]),
             f"{r['peak_rss_bytes'] / 2**20:.0f}", f"{r['peak_rss_over_checkpoint']:.2f}",
             "yes" if r["same_ids"] else "NO"] for r in results["rows"]]
    return lines + report.layout(header, rows, False, 1)


def _ratio(paired):
    return f"{paired['median']:.2f}x [{paired['q25']:.2f}-{paired['q75']:.2f}]"


RUNS = {"decode_hf": (run, table_lines)}
