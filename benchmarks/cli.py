"""``python -m benchmarks``: options, then parity, timing in subprocesses, and the report.

Timing runs in one subprocess per library and device (``_worker.py``), either one after the
other (the default sweep) or taking turns, one sample each, round after round
(``--interleave``), which also gives each ratio paired within a round; ``--against REV`` adds
the numpy_attn of git revision REV, checked out in a temporary ``git worktree``.

Exit status: 0 when every requested row was measured or reported as not available (also when
stdout is closed early, as by ``| head``), 1 when an implementation disagrees with NumPy
(nothing is timed then) or a timing worker fails, 2 for a bad option, an unknown op or a file
that cannot be read or written; 128 + the signal when stopped by SIGINT (Ctrl-C), SIGTERM or
SIGHUP, after one line on stderr and no traceback: the timing workers are stopped, ``--against``'s
worktree and temporary folder removed, and each output file is whole or as it was.
"""

import argparse
import contextlib
import datetime
import importlib.util
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from attn_cli.checkpoint import Terminated, termination_raises
from attn_cli.decoding import memory_limits
from attn_cli.hf.files import bytes_text
from benchmarks import calls, decode, decode_cache, decode_hf, machine, parity, registry, report
from benchmarks import measure as sampling
from benchmarks.machine import ROOT, USABLE_CPUS
from benchmarks.registry import IMPLS, MODES, Size
from benchmarks.workers import Worker, check_repository, revision_tree

# Not ops of the registry: decoding, timed by benchmarks/decode.py, decode_cache.py and decode_hf.py;
# each runs alone. {name: what it measures}, and {name: (run(args, argv) -> results, table_lines(results))}.
DECODE_RUNS = {
    "decode": "tokens/s of greedy generation with the mini GPT, with a key/value cache and without "
              "(--seq-lens: prompt lengths)",
    "decode_sliding": "tokens/s and cache bytes of a Gemma 2 decoding to 4x its window, bounded cache against "
                      "a full one (--seq-lens: windows)",
    "decode_mla": "tokens/s and cache bytes per token of one decode step over S cached tokens: MLA absorbed, "
                  "MLA naive, GQA, MHA (--seq-lens: S)",
    "decode_hf": "a Hugging Face folder (--hf DIR) in numpy-attn and in transformers: ms per new token, prefill "
                 "time and peak RSS (--seq-lens: prompt lengths, default 512; --against REV adds a revision)",
}
DECODE_FUNCTIONS = {**decode.RUNS, **decode_cache.RUNS, **decode_hf.RUNS}

FLOPS_CONVENTION = (
    "forward counts the dominant terms (attention 4*B*nh*T*S*hs, halved when causal); "
    "forward+backward = (1 + b) x forward with b = 2 (a matmul's backward is two matmuls), "
    "except softmax: 5 FLOPs per element forward, b = 0.8"
)

# Defaults of the sized options: the full sweep, and the --quick one (about 20 s here). The
# quick sweep's arrays are tiny: a second thread only adds synchronisation (and, on a busy
# machine, waits for a descheduled thread), so it uses one.
FULL = dict(seq_lens=[128, 256, 512, 1024, 2048], batch=4, heads=8, head_size=64,
            repeats=5, min_time=0.5, peak_size=2048, threads=USABLE_CPUS)
QUICK = dict(seq_lens=[32, 64, 128], batch=2, heads=4, head_size=32,
             repeats=3, min_time=0.02, peak_size=512, threads=1)


def _number(kind, minimum=1, maximum=None):
    """An argparse type: ``kind`` (int or float) in [minimum, maximum], with a clear message."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value >= minimum:                    # also refuses NaN
            raise argparse.ArgumentTypeError(f"{text!r} must be at least {minimum}")
        if maximum is not None and not value <= maximum:
            raise argparse.ArgumentTypeError(f"{text!r} must be at most {maximum}")
        return value
    return parse


def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Time numpy_attn (NumPy, hand-written backward) against its torch_attn twin\n"
        "(autograd) and PyTorch's built-in, forward and forward+backward, over a sweep of\n"
        "sequence lengths. Parity with NumPy is checked at every size before timing; each\n"
        "library is timed in its own subprocess so that their thread pools do not fight.",
        epilog="examples:\n"
        "  python -m benchmarks --quick                 every op at tiny sizes (about 30 s)\n"
        "  python -m benchmarks --ops attention --json benchmarks/results/cpu.json \\\n"
        "      --plot benchmarks/results/cpu.png        the committed CPU results\n"
        "  python -m benchmarks --from-json benchmarks/results/cpu.json \\\n"
        "      --markdown benchmarks/results/cpu.md     its tables for the README, no re-run\n"
        "  python -m benchmarks --list                  the ops and whether they can run\n"
        "  python -m benchmarks --ops decode            tokens/s of greedy generation, with and\n"
        "                                               without a key/value cache (--seq-lens: prompts)\n"
        "  python -m benchmarks --ops decode_sliding    a sliding-window model's bounded cache against\n"
        "                                               a full one (--seq-lens: windows)\n"
        "  python -m benchmarks --ops decode_mla        MLA absorbed and naive, GQA and MHA: one\n"
        "                                               decode step, cache bytes (--seq-lens: S)\n"
        "  python -m benchmarks --ops decode_hf --hf gpt2 --threads 2 --seq-lens 19 512\n"
        "                                               a Hugging Face folder, numpy-attn against\n"
        "                                               transformers: ms/token, prefill, peak RSS\n"
        "  python -m benchmarks --ops flash_attention --seq-lens 2048 --impls numpy builtin \\\n"
        "      --device cpu --threads 2 --interleave 7 --against HEAD~1\n"
        "                                               turns, paired ratios, before/after a change\n"
        "\n"
        + textwrap.fill(f"FLOPs: {FLOPS_CONVENTION}.", 88) + "\n"
        f"gpt_step is the loss (fwd) and the loss with every parameter's gradient (fwd+bwd) of a\n"
        f"{registry.GPT_LAYERS}-layer GPT with a {registry.GPT_VOCAB}-token vocabulary.\n"
        "exit status: 0 done (rows that cannot run are listed as not available), 1 parity\n"
        "failure or a failed timing worker, 2 bad option, 128 + the signal when stopped by\n"
        "SIGINT, SIGTERM or SIGHUP (--against's worktree and temporary folder removed).",
    )
    f = FULL
    p.add_argument("--ops", nargs="+", default=[], metavar="OP",
                   help=f"ops to run, by name or file stem (a stem selects every op built on it, "
                   f"e.g. attention = attention + attention_causal); default all: {', '.join(registry.OPS)}; "
                   f"or one decoding run alone: {', '.join(DECODE_RUNS)} (see --list)")
    p.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS),
                   help="implementations: numpy (numpy_attn, CPU), twin (torch_attn, autograd), "
                   "builtin (PyTorch's own); default all")
    p.add_argument("--device", choices=("cpu", "cuda", "all"), default="all",
                   help="devices for the torch implementations (NumPy always runs on the CPU); "
                   "'all' = cpu and cuda, where cuda rows are reported as not available when "
                   "torch.cuda.is_available() is False; default all")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES),
                   help="forward only, and/or forward+backward; default both")
    # Upper bounds keep a typo from asking for hours of timing or more memory than any machine has.
    p.add_argument("--seq-lens", nargs="+", type=_number(int, 1, 65536), metavar="T",
                   help=f"sequence lengths T (= key length S) to sweep; default {f['seq_lens']}")
    p.add_argument("--batch", type=_number(int, 1, 4096), metavar="B", help=f"batch size; default {f['batch']}")
    p.add_argument("--heads", type=_number(int, 1, 1024), metavar="NH", help=f"attention heads; default {f['heads']}")
    p.add_argument("--head-size", type=_number(int, 1, 4096), metavar="HS",
                   help=f"head size (model width C = heads * head size); default {f['head_size']}")
    p.add_argument("--dense-max-seq-len", type=_number(int, 1, 65536), metavar="T",
                   help="run the ops that hold every score (a (B, nh, T, S) array: attention, "
                   "attention_causal, ...) only up to this T; their longer rows are listed as not "
                   "available with their score array's bytes, while the tiled ops go on; default no bound")
    p.add_argument("--dtype", choices=calls.DTYPES, default="float32",
                   help="floating-point type of every array and tensor (bfloat16: ml_dtypes' for NumPy); "
                   "numpy_attn computes float16 and bfloat16 in float32 after a cast, as NumPy has no "
                   "BLAS for them; default float32")
    p.add_argument("--threads", type=_number(int, 1, 1024),
                   help=f"threads for NumPy's BLAS and torch's intra-op pool in each timed process; "
                   f"default: the CPUs this process may use ({USABLE_CPUS}), 1 with --quick")
    p.add_argument("--repeats", type=_number(int, 1, 100000), metavar="N",
                   help=f"at least this many timed samples per row (median and quartiles are taken "
                   f"over them; with --interleave, the rounds are the samples); default {f['repeats']}")
    p.add_argument("--min-time", type=_number(float, 0, 600), metavar="SEC",
                   help=f"and at least this many seconds of timed calls per row; default {f['min_time']}")
    p.add_argument("--warmup", type=_number(int, 1, 1000), default=1, metavar="N",
                   help="untimed calls before sampling (the first call pays for allocation and "
                   "lazy initialisation; the last one sizes the blocks of calls timed); default 1")
    p.add_argument("--peak-size", type=_number(int, 1, 32768), metavar="N",
                   help=f"N of the N x N matmul that, with the matmuls of the run's sizes, measures the "
                   f"peak GFLOP/s that %% peak divides by (CUDA uses max(N, 8192)); default {f['peak_size']}")
    p.add_argument("--tolerance", type=_number(float, 0, 1), metavar="REL",
                   help="parity tolerance on max |torch - numpy| / max(max |numpy|, 1) per tensor; "
                   "default 1e-4 for float32, 1e-9 for float64, 8 ulps at 1 for float16 (7.8e-3) "
                   "and bfloat16 (6.25e-2)")
    p.add_argument("--seed", type=_number(int, 0), default=0, help="seed of the random inputs; default 0")
    p.add_argument("--interleave", type=_number(int, 1, 10000), metavar="ROUNDS",
                   help="take turns instead of timing each library's cases one after the other: "
                   "every round, case by case, each worker times one sample (a block of calls) in "
                   "turn, the order reversed every other round; each ratio to NumPy is then also "
                   "given paired (the median over rounds of the ratio within a round, with its "
                   "quartiles), which holds when the machine's speed drifts. ROUNDS samples per "
                   "row (--repeats and --min-time do not apply)")
    p.add_argument("--against", metavar="REV",
                   help="also time numpy_attn as it was at git revision REV (checked out in a "
                   "temporary git worktree, timed by this revision's worker): rows numpy@REV, "
                   "whose np/this is the current NumPy time over REV's; best with --interleave")
    p.add_argument("--hf", metavar="DIR",
                   help="--ops decode_hf only: the Hugging Face model folder (config.json and safetensors, "
                   "as save_pretrained writes) to decode in both libraries")
    p.add_argument("--force", action="store_true",
                   help="overwrite output files (--json, --csv, --markdown, --plot) that exist")
    p.add_argument("--quick", action="store_true",
                   help=f"a tiny sweep that finishes in well under a minute (T in {QUICK['seq_lens']}, "
                   f"B={QUICK['batch']}, nh={QUICK['heads']}, hs={QUICK['head_size']}, "
                   f"{QUICK['repeats']} samples, 1 thread); explicit options still win")
    p.add_argument("--json", metavar="FILE", help="write every row, the machine and the settings as JSON "
                   "(missing folders are created; every output path is checked before measuring: two outputs "
                   "to one file, or one over the --from-json file, are refused)")
    p.add_argument("--csv", metavar="FILE", help="write one CSV line per row")
    p.add_argument("--markdown", metavar="FILE",
                   help="write the table as Markdown (for the README), header lines first")
    p.add_argument("--plot", metavar="FILE.png",
                   help="write a PNG: time against T (log-log) and %% of matmul peak, per op")
    p.add_argument("--plot-together", action="store_true",
                   help="--plot draws every op's time on one panel (log-log), the decode steps' against "
                   "the tokens held on a second, and marks where two ops' lines cross")
    p.add_argument("--from-json", metavar="FILE",
                   help="measure nothing: re-render a run saved with --json (table, --csv, "
                   "--markdown, --plot)")
    p.add_argument("--list", action="store_true",
                   help="list the ops, their files and built-ins, and whether they can run; then exit")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar on stderr (it is drawn only where stderr is a terminal)")
    return p


def _settings(args):
    """The sized options: explicit values, else the --quick or full defaults."""
    base = QUICK if args.quick else FULL
    return {k: getattr(args, k) if getattr(args, k) is not None else v for k, v in base.items()}


def check_scores_fit(ops, args):
    """Raise ValueError, naming the options, where an op that holds every score (numpy_attn and the
    twin: a (B, nh, T, S) array in the compute dtype) would need more than memory_limits allows at
    the longest --seq-lens: each option has its own bound, their product none, so it is checked
    here, before any allocation."""
    dense = [op.name for op in ops if op.dense_scores]
    if not dense or not set(args.impls) & {"numpy", "twin"}:
        return
    s = _settings(args)
    T = min(max(s["seq_lens"]), args.dense_max_seq_len or math.inf)
    itemsize = calls.opmath(calls.dtype_of(args.dtype)).itemsize
    need = s["batch"] * s["heads"] * T * T * itemsize
    for what, memory in memory_limits().items():
        if need > memory:
            raise ValueError(
                f"--batch {s['batch']} x --heads {s['heads']} x --seq-lens {T} x {T} (T x S) x {itemsize} bytes "
                f"(--dtype {args.dtype}, computed in {calls.opmath(calls.dtype_of(args.dtype)).name}) = "
                f"{need:,} bytes ({bytes_text(need)}) for one score array of {', '.join(dense)}, more than "
                f"{what}, {bytes_text(memory)}: lower --seq-lens, --batch or --heads (flash_attention "
                f"holds a tile at a time)")


def _list_ops():
    for op in registry.OPS.values():
        missing = {impl: op.missing(impl) for impl in IMPLS}
        where = op.describe()
        print(f"{op.name}: " + "; ".join(
            f"{impl} {where[impl]}" + (f" ({missing[impl]})" if missing[impl] else "")
            for impl in IMPLS))
    for name, what in DECODE_RUNS.items():
        print(f"{name}: {what}; runs alone")


def _plan(ops, args, cuda_reason):
    """({op name: [(impl, device)] that can run}, [not-available rows])."""
    devices = ["cpu", "cuda"] if args.device == "all" else [args.device]
    runnable, unavailable = {}, []
    for op in ops:
        for impl in args.impls:
            for device in ["cpu"] if impl == "numpy" else devices:
                why = op.missing(impl) or (cuda_reason if device == "cuda" else None)
                if why:
                    unavailable.append(dict(op=op.name, impl=impl, device=device, mode=None,
                                            T=None, status="not available", reason=why))
                else:
                    runnable.setdefault(op.name, []).append((impl, device))
    return runnable, unavailable


def _cases(runnable, sizes, args):
    """({(op name, T): [(impl, device)]} to run, [not-available rows]): every op at every T, but
    an op that holds every score past --dense-max-seq-len, which is named with its array's bytes."""
    cases, skipped = {}, []
    for name, targets in runnable.items():
        for T, size in sizes.items():
            limit = args.dense_max_seq_len
            if limit is None or T <= limit or not registry.OPS[name].dense_scores:
                cases[name, T] = targets
                continue
            itemsize = calls.opmath(calls.dtype_of(args.dtype)).itemsize
            need = size.B * size.nh * T * size.S * itemsize
            skipped += [dict(op=name, impl=impl, device=device, mode=None, T=T, status="not available",
                             reason=f"T = {T} is past --dense-max-seq-len {limit}: one (B, nh, T, S) score "
                             f"array is {need:,} bytes ({bytes_text(need)})")
                        for impl, device in targets]
    return cases, skipped


def _library(impl):
    return "numpy" if impl == "numpy" else "torch"


def _check_parity(cases, sizes, args, threads, progress):
    """parity.check for every case (op, T); {(op, T): {(impl, device): result}}."""
    import torch

    from numpy_attn._threads import limit_blas_threads

    # Nothing is timed here, so both pools may run; they get the timed thread count to finish
    # sooner, and are restored afterwards for whoever called main() in-process (the tests).
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with limit_blas_threads(threads, required=True):
            checks = {}
            for (name, T), targets in cases.items():
                checks[name, T] = parity.check(registry.OPS[name], sizes[T], args.dtype,
                                               args.seed, targets, args.tolerance)
                progress.step(f"parity {name} T={T}")
            return checks
    finally:
        torch.set_num_threads(old)


def _worker(key, cases, job, peak_size, progress, against, serve=False):
    """(the Worker for key = (library, device, revision), the cases it was given in order).
    ``against`` is (REV, folder) for numpy_attn at REV beside this revision's."""
    library, device, rev = key
    listed = [dict(op=name, T=T, impls=impls) for (name, T), impls in cases.items()]
    worker_job = dict(job, library=library, device=device, cases=listed, serve=serve,
                      peak_n=peak_size if device == "cpu" else max(peak_size, 8192))   # a GPU needs more work
    pythonpath, label = (against[1], f"numpy cpu @{rev}") if rev else (None, None)
    return Worker(worker_job, progress, pythonpath, label), listed


def _time(workers, job, peak_size, progress, against=None):
    """One worker per (library, device, revision), one after the other: (worker envs,
    {(library, device): peak}, rows)."""
    envs, peaks, timed = [], {}, []
    for key, cases in workers.items():
        worker, _ = _worker(key, cases, job, peak_size, progress, against)
        with worker:
            for record in worker.records():
                _collect(record, key[2], envs, peaks, timed)
    return envs, peaks, timed


def _collect(record, rev, envs, peaks, timed):
    """File one worker record: an env, a peak (this revision's only), or a row."""
    kind = record.pop("kind")
    if kind == "env":
        envs.append(dict(record, revision=rev))
    elif kind == "peak" and rev is None:
        peaks[record["library"], record["device"]] = record
    elif kind == "row":
        timed.append(dict(record, revision=rev))


def _time_interleaved(workers, job, peak_size, rounds, progress, against=None):
    """Every worker at once, taking turns: per round, per (op, T), one sample of every
    (worker, impl, mode), the order reversed on odd rounds. Same return as ``_time``."""
    envs, peaks, timed = [], {}, []
    with contextlib.ExitStack() as stack:
        handles, turns = {}, {}                    # turns: (op, T) -> [(worker key, index, impl, mode)]
        for key, cases in workers.items():
            worker, listed = _worker(key, cases, job, peak_size, progress, against, serve=True)
            handles[key] = stack.enter_context(worker)
            for index, case in enumerate(listed):
                turns.setdefault((case["op"], case["T"]), []).extend(
                    (key, index, impl, mode) for impl in case["impls"] for mode in job["modes"])
        for key, worker in handles.items():        # env, then the matmul peak, from each
            for _ in range(2):
                _collect(worker.read(), key[2], envs, peaks, timed)
        samples = {}
        for r in range(rounds):
            for (name, T), order in turns.items():
                for key, index, impl, mode in order if r % 2 == 0 else order[::-1]:
                    record = handles[key].ask(dict(case=index, impl=impl, mode=mode))
                    entry = samples.setdefault((name, T, key, impl, mode), dict(seconds=[]))
                    entry["seconds"].append(record["seconds"])
                    entry.setdefault("number", record["number"])
                    entry.setdefault("peak_mem_bytes", record["peak_mem_bytes"])
                progress.step(f"round {r + 1}/{rounds} {name} T={T}")
        for worker in handles.values():
            worker.finish()
    for (name, T, (_, device, rev), impl, mode), entry in samples.items():
        timed.append(dict(op=name, T=T, impl=impl, device=device, mode=mode, revision=rev,
                          time_s=dict(sampling.summarize(entry["seconds"], entry["number"]),
                                      rounds=entry["seconds"]),
                          peak_mem_bytes=entry["peak_mem_bytes"]))
    return envs, peaks, timed


def _finish_rows(timed, sizes, peaks, checks, dtype):
    """Add sizes, FLOPs, GFLOP/s, share of peak, parity and the ratio to NumPy to each row
    (paired too, when the run was interleaved). Rows of another revision are not parity-checked:
    this process holds only the current numpy_attn."""
    rows = []
    for r in timed:
        op, size = registry.OPS[r["op"]], sizes[r["T"]]
        flops = op.count_flops(size, r["mode"])
        gflops = flops / r["time_s"]["median"] / 1e9
        parity_check = None if r["revision"] else checks[r["op"], r["T"]][r["impl"], r["device"]]
        rows.append(dict(r, S=size.S, B=size.B, nh=size.nh, hs=size.hs, dtype=dtype,
                         status="ok", reason=None, flops=flops, gflops=gflops,
                         parity=parity_check))
        rows[-1]["peak_fraction"] = report.peak_share(rows[-1], list(peaks.values()))
    numpy_time = {(r["op"], r["mode"], r["T"]): r["time_s"]
                  for r in rows if r["impl"] == "numpy" and not r["revision"]}
    for r in rows:
        ref = numpy_time.get((r["op"], r["mode"], r["T"]))
        r["numpy_over_this"] = ref["median"] / r["time_s"]["median"] if ref else None
        if ref and "rounds" in ref:
            r["numpy_over_this_paired"] = report.paired_ratios(ref["rounds"], r["time_s"]["rounds"])
    return rows


def measure(ops, args, argv):
    """Parity for every case, then timing in one worker per library and device: the results dict."""
    import torch

    started = time.monotonic()
    load = machine.LoadWatch()
    try:                                           # the sampling thread ends with the run, failed or not
        s = _settings(args)
        cuda_reason = None if torch.cuda.is_available() else (
            "torch.cuda.is_available() is False" + ("" if torch.version.cuda else " (CPU-only torch build)"))
        runnable, unavailable = _plan(ops, args, cuda_reason)
        seq_lens = sorted(set(s["seq_lens"]))
        sizes = {T: Size(B=s["batch"], nh=s["heads"], T=T, hs=s["head_size"]) for T in seq_lens}
        cases, skipped = _cases(runnable, sizes, args)
        unavailable += skipped
        workers = {}                                   # (library, device, revision) -> {(op, T): [impls]}
        for (name, T), targets in cases.items():
            for impl, device in targets:
                for rev in [None] + ([args.against] if args.against and impl == "numpy" else []):
                    workers.setdefault((_library(impl), device, rev), {}).setdefault((name, T), []).append(impl)
        timed_steps = (len(cases) * args.interleave if args.interleave else sum(
            len(impls) * len(args.modes) for listed in workers.values() for impls in listed.values()))
        progress = report.progress_bar(len(cases) + len(workers) + timed_steps, args.no_progress)

        checks = _check_parity(cases, sizes, args, s["threads"], progress)
        job = dict(threads=s["threads"], dtype=args.dtype, seed=args.seed, repeats=s["repeats"],
                   min_time=s["min_time"], warmup=args.warmup, modes=args.modes,
                   size=dict(B=s["batch"], nh=s["heads"], hs=s["head_size"]))
        with revision_tree(args.against) if args.against else contextlib.nullcontext() as folder:
            against = (args.against, folder) if args.against else None
            if args.interleave:
                envs, peaks, timed = _time_interleaved(workers, job, s["peak_size"], args.interleave,
                                                       progress, against)
            else:
                envs, peaks, timed = _time(workers, job, s["peak_size"], progress, against)
        rows = _finish_rows(timed, sizes, peaks, checks, args.dtype) + unavailable
    except BaseException:
        load.stop()
        raise
    return dict(
        schema=1,
        command="python -m benchmarks " + shlex.join(argv),
        started_utc=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        duration_s=round(time.monotonic() - started, 1),
        **machine.facts(load, s["threads"]),
        config=dict(ops=[op.name for op in ops], impls=args.impls, device=args.device,
                    modes=args.modes, seq_lens=seq_lens, batch=s["batch"], heads=s["heads"],
                    head_size=s["head_size"], dtype=args.dtype, threads=s["threads"],
                    repeats=s["repeats"], min_time=s["min_time"], warmup=args.warmup,
                    peak_size=s["peak_size"], seed=args.seed, quick=args.quick,
                    tolerance=args.tolerance, interleave=args.interleave, against=args.against,
                    dense_max_seq_len=args.dense_max_seq_len),
        cuda=dict(available=cuda_reason is None, reason=cuda_reason),
        flops_convention=FLOPS_CONVENTION,
        ops={op.name: dict(stem=op.stem, **op.describe(), bwd_factor=op.bwd_factor) for op in ops},
        environment={k: v for k, v in os.environ.items()   # as the user set them
                     if k.startswith(("OPENBLAS_", "OMP_", "MKL_", "GOMP_", "KMP_"))},
        workers=envs,
        peaks=list(peaks.values()),
        rows=rows,
    )


def install_hint(extra):
    """How to install an extra: from this checkout when running from one (constraints.txt pins
    what CI tests), else the published package's extra."""
    if (ROOT / "setup.cfg").is_file() and (ROOT / "constraints.txt").is_file():
        return f"pip install -c constraints.txt -e '.[{extra}]'"
    return f"pip install 'numpy-attn[{extra}]'"


def _fail(message):
    """One line on stderr, no usage (the option was well formed; its value names no file or op): 2."""
    print(f"python -m benchmarks: error: {message}", file=sys.stderr)
    return 2


def _read_results(path):
    """The results dict saved by --json at ``path``; OSError or ValueError naming the file."""
    try:
        results = json.loads(Path(path).read_text())
    except OSError as err:
        raise OSError(f"cannot read --from-json {path}: {err.strerror or err}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"--from-json {path} is not JSON: {err}") from None
    if not isinstance(results, dict) or not (
            report.is_breakdown(results) or report.is_former_flash_kernel(results) or (
                isinstance(results.get("rows"), list) and isinstance(results.get("config"), dict)
                and ("workers" in results or report.is_decode(results)))):
        raise ValueError(f"--from-json {path} is not a results file of python -m benchmarks --json")
    missing = report.missing_machine_facts(results)
    if missing:   # its figures cannot be compared with any other run's
        raise ValueError(f"--from-json {path} does not name the machine it ran on: no {', '.join(missing)} "
                         "(recorded by every run since 2026-12)")
    return results


def _select(names):
    """The registry's ops for --ops, or ValueError in one line naming every valid choice."""
    for name in DECODE_RUNS:
        if name in names and len(names) > 1:
            raise ValueError(f"--ops {name} runs alone (it times decoding, not an op)")
    try:
        return registry.select(names)
    except ValueError:
        unknown = [n for n in names if n not in registry.OPS and n not in registry.STEMS]
        raise ValueError(f"unknown op {', '.join(map(repr, unknown))}; choose from: "
                         f"{', '.join([*registry.OPS, *DECODE_RUNS])} (or a file stem: "
                         f"{', '.join(s for s in registry.STEMS if s not in registry.OPS)})") from None


def main(argv=None):
    """Run the command line ``argv`` (default sys.argv[1:]); returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.plot_together and not args.plot:
        parser.error("--plot-together says how --plot draws: give --plot FILE.png")
    try:
        with termination_raises():                 # SIGTERM, SIGHUP: cleaned up as for Ctrl-C
            status = _run(parser, args, argv)
            sys.stdout.flush()                     # here, not at exit, where a closed pipe is a traceback
        return status
    except BrokenPipeError:        # stdout closed early (``| head``): the files are already written
        with contextlib.suppress(OSError, ValueError):   # a test's StringIO has no descriptor
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (KeyboardInterrupt, Terminated) as stop:
        # The timing workers are killed, --against's worktree and temporary folder removed, each
        # output file whole or as it was: one line says so, no traceback.
        signum = getattr(stop, "signum", signal.SIGINT)
        print(f"python -m benchmarks: stopped by {signal.Signals(signum).name}; nothing is left "
              "half-written (temporary worktree and files removed)", file=sys.stderr)
        return 128 + signum


def _run(parser, args, argv):
    """main() without its closed-pipe handling: every check first, then the run, then the files."""
    if args.list:
        _list_ops()
        return 0
    generation = len(args.ops) == 1 and args.ops[0] in DECODE_RUNS
    if not args.from_json and not generation:
        try:
            ops = _select(args.ops)
        except ValueError as err:
            return _fail(err)
    if args.from_json:
        try:
            results = _read_results(args.from_json)
        except (OSError, ValueError) as err:
            return _fail(err)
    hf_run = generation and args.ops[0] == "decode_hf"
    if generation and (args.interleave or args.against and not hf_run):
        return _fail(f"--interleave and --against time ops; --ops {args.ops[0]} takes neither")
    if bool(args.hf) != hf_run and not args.from_json:
        return _fail("--hf DIR goes with --ops decode_hf" if args.hf else "--ops decode_hf needs --hf DIR, "
                     "a Hugging Face model folder (config.json and safetensors)")
    if hf_run and args.dtype != "float32":
        return _fail(f"--ops decode_hf loads the folder in float32 in both libraries, not --dtype {args.dtype}")
    if hf_run and importlib.util.find_spec("transformers") is None:
        return _fail("--ops decode_hf times transformers too, which is not installed: pip install 'transformers>=5.0'")
    if generation and args.dtype in calls.LOW_PRECISION:
        return _fail(f"--ops {args.ops[0]} times float32 and float64 only, not --dtype {args.dtype}")
    if (generation or args.from_json and not report.is_op_run(results)) and (args.csv or args.plot):
        return _fail("--csv and --plot draw op runs; this run has only its report (--json, --markdown)")
    if args.against and not args.from_json:
        try:
            check_repository()
        except ValueError as err:
            return _fail(err)
        commit = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{args.against}^{{commit}}"],
                                cwd=ROOT, capture_output=True, text=True).stdout.strip()
        if not commit:
            return _fail(f"--against {args.against}: not a commit of the git repository at {ROOT}")
    report.check_outputs(parser, args)
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        parser.error(f"--plot needs matplotlib: {install_hint('plots')}")
    if generation:   # not an op: its own table (benchmarks/decode.py, decode_cache.py, decode_hf.py)
        return _run_decode(args, argv, args.ops[0])
    if not args.from_json:
        missing = [name for name in ("torch", "threadpoolctl") if importlib.util.find_spec(name) is None]
        if missing:
            parser.error(f"measuring needs {' and '.join(missing)}: {install_hint('benchmarks')}")
        try:
            check_scores_fit(ops, args)
        except ValueError as err:
            return _fail(err)
        try:
            results = measure(ops, args, argv)
        except (parity.ParityError, RuntimeError) as err:
            print(f"python -m benchmarks: {err}", file=sys.stderr)
            return 1
    # Files first: a closed stdout (``| head``) must not cost the results. Each is announced on
    # stderr, so that stdout stays the table.
    if args.json:
        report.write_json(results, args.json)
        print(f"wrote {args.json}", file=sys.stderr)
    if args.csv:
        report.write_csv(results, args.csv)
        print(f"wrote {args.csv}", file=sys.stderr)
    if args.markdown:
        report.write_markdown(results, args.markdown, render(results))
        print(f"wrote {args.markdown}", file=sys.stderr)
    if args.plot:
        try:
            report.write_plot(results, args.plot, together=args.plot_together)
        except ValueError as err:
            print(f"python -m benchmarks: no plot written: {err}", file=sys.stderr)
            return 1
        print(f"wrote {args.plot}", file=sys.stderr)
    print("\n".join(render(results)))
    return 0


def render(results):
    """The report's lines for a saved run of any kind: an op sweep, a decode run, a flash breakdown."""
    if report.is_decode(results):
        return DECODE_FUNCTIONS[results.get("run", "decode")][1](results)
    if report.is_breakdown(results):   # imported here: it needs threadpoolctl, which --help does not
        from benchmarks import flash_breakdown

        return flash_breakdown.report_lines(results)
    if report.is_former_flash_kernel(results):
        return report.former_flash_kernel_lines(results)
    return report.header_lines(results) + [""] + report.table_lines(results)


def _run_decode(args, argv, name):
    """Run the decode benchmark ``name`` (one of DECODE_RUNS) for the command line's ``args``;
    returns the exit status."""
    try:
        results = DECODE_FUNCTIONS[name][0](args, argv)
    except ValueError as err:
        print(f"python -m benchmarks: error: {err}", file=sys.stderr)
        return 2
    except (parity.ParityError, RuntimeError) as err:   # tokens or outputs differ; a failed timing worker
        print(f"python -m benchmarks: {err}", file=sys.stderr)
        return 1
    if args.json:
        report.write_json(results, args.json)
    if args.markdown:
        report.write_markdown(results, args.markdown, render(results))
    print("\n".join(render(results)))
    return 0 if all(r.get("same_tokens", True) for r in results["rows"]) else 1   # decode_mla: checked before
