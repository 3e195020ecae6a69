"""``python -m benchmarks``: options, then parity, timing in subprocesses, and the report.

Exit status: 0 when every requested row was measured or reported as not available, 1 when an
implementation disagrees with NumPy (nothing is timed then) or a timing worker fails, 2 for a
bad option or an unknown op.
"""

import argparse
import datetime
import importlib.util
import json
import os
import platform
import shlex
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from benchmarks import parity, registry, report
from benchmarks._worker import PARENT_VAR, PREFIX
from benchmarks.registry import IMPLS, MODES, Size

ROOT = Path(__file__).resolve().parents[1]

FLOPS_CONVENTION = (
    "forward counts the dominant terms (attention 4*B*nh*T*S*hs, halved when causal); "
    "forward+backward = (1 + b) x forward with b = 2 (a matmul's backward is two matmuls), "
    "except softmax: 5 FLOPs per element forward, b = 0.8"
)

USABLE_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()

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
        "\n"
        + textwrap.fill(f"FLOPs: {FLOPS_CONVENTION}.", 88) + "\n"
        f"gpt_step is the loss (fwd) and the loss with every parameter's gradient (fwd+bwd) of a\n"
        f"{registry.GPT_LAYERS}-layer GPT with a {registry.GPT_VOCAB}-token vocabulary.\n"
        "exit status: 0 done (rows that cannot run are listed as not available), 1 parity\n"
        "failure or a failed timing worker, 2 bad option.",
    )
    f = FULL
    p.add_argument("--ops", nargs="+", default=[], metavar="OP",
                   help=f"ops to run, by name or file stem (a stem selects every op built on it, "
                   f"e.g. attention = attention + attention_causal); default all: {', '.join(registry.OPS)}")
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
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                   help="floating-point type of every array and tensor; default float32")
    p.add_argument("--threads", type=_number(int, 1, 1024),
                   help=f"threads for NumPy's BLAS and torch's intra-op pool in each timed process; "
                   f"default: the CPUs this process may use ({USABLE_CPUS}), 1 with --quick")
    p.add_argument("--repeats", type=_number(int, 1, 100000), metavar="N",
                   help=f"at least this many timed samples per row (median and quartiles are taken "
                   f"over them); default {f['repeats']}")
    p.add_argument("--min-time", type=_number(float, 0, 600), metavar="SEC",
                   help=f"and at least this many seconds of timed calls per row; default {f['min_time']}")
    p.add_argument("--warmup", type=_number(int, 1, 1000), default=1, metavar="N",
                   help="untimed calls before sampling (the first call pays for allocation and "
                   "lazy initialisation; the last one sizes the blocks of calls timed); default 1")
    p.add_argument("--peak-size", type=_number(int, 1, 32768), metavar="N",
                   help=f"N of the N x N matmul that measures each CPU library's peak GFLOP/s "
                   f"(CUDA uses max(N, 8192)); default {f['peak_size']}")
    p.add_argument("--tolerance", type=_number(float, 0, 1), metavar="REL",
                   help="parity tolerance on max |torch - numpy| / max(max |numpy|, 1) per tensor; "
                   "default 1e-4 for float32, 1e-9 for float64")
    p.add_argument("--seed", type=_number(int, 0), default=0, help="seed of the random inputs; default 0")
    p.add_argument("--force", action="store_true",
                   help="overwrite output files (--json, --csv, --markdown, --plot) that exist")
    p.add_argument("--quick", action="store_true",
                   help=f"a tiny sweep that finishes in well under a minute (T in {QUICK['seq_lens']}, "
                   f"B={QUICK['batch']}, nh={QUICK['heads']}, hs={QUICK['head_size']}, "
                   f"{QUICK['repeats']} samples, 1 thread); explicit options still win")
    p.add_argument("--json", metavar="FILE", help="write every row, the machine and the settings as JSON "
                   "(missing folders are created; every output path is checked before measuring)")
    p.add_argument("--csv", metavar="FILE", help="write one CSV line per row")
    p.add_argument("--markdown", metavar="FILE",
                   help="write the table as Markdown (for the README), header lines first")
    p.add_argument("--plot", metavar="FILE.png",
                   help="write a PNG: time against T (log-log) and %% of matmul peak, per op")
    p.add_argument("--from-json", metavar="FILE",
                   help="measure nothing: re-render a run saved with --json (table, --csv, "
                   "--markdown, --plot)")
    p.add_argument("--list", action="store_true",
                   help="list the ops, their files and built-ins, and whether they can run; then exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def _settings(args):
    """The sized options: explicit values, else the --quick or full defaults."""
    base = QUICK if args.quick else FULL
    return {k: getattr(args, k) if getattr(args, k) is not None else v for k, v in base.items()}


def _list_ops():
    for op in registry.OPS.values():
        missing = {impl: op.missing(impl) for impl in IMPLS}
        where = op.describe()
        print(f"{op.name}: " + "; ".join(
            f"{impl} {where[impl]}" + (f" ({missing[impl]})" if missing[impl] else "")
            for impl in IMPLS))


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


def _run_worker(library, device, job, cases, progress):
    """Run one timing subprocess; yield its records as they arrive."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(job["threads"])             # read once, when each library loads
    env[PARENT_VAR] = str(os.getpid())             # the worker exits if this process dies
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks._worker"], cwd=ROOT, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        proc.stdin.write(json.dumps(dict(job, library=library, device=device, cases=cases)))
        proc.stdin.close()
        yield from _records(proc, library, device, progress)
    finally:                                       # an error or Ctrl-C here: no orphan worker
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _records(proc, library, device, progress):
    for line in proc.stdout:
        if not line.startswith(PREFIX):
            sys.stderr.write(line)                 # a library's stray print
            continue
        record = json.loads(line[len(PREFIX):])
        if record["kind"] != "env":
            what = (f"{record['op']} T={record['T']} {record['impl']} {device} {record['mode']}"
                    if record["kind"] == "row" else f"{library} {device} matmul peak")
            progress.step(what)
        yield record
    if proc.wait() < 0:                            # the kernel's OOM killer sends SIGKILL
        raise RuntimeError(f"the {library} {device} timing worker was killed by signal "
                           f"{-proc.returncode} (out of memory? try smaller --seq-lens or --batch)")
    if proc.returncode != 0:
        raise RuntimeError(f"the {library} {device} timing worker failed with exit status "
                           f"{proc.returncode} (its traceback is above)")


def _git_state():
    """The commit measured, and whether the working tree differed from it (None outside git)."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=30).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD")
        return dict(commit=commit, dirty=bool(git("status", "--porcelain", "--untracked-files=no"))) if commit else None
    except (OSError, subprocess.SubprocessError):
        return None


def _load_average():
    """The 1-minute load average (None where the OS has none)."""
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def _library(impl):
    return "numpy" if impl == "numpy" else "torch"


def _check_parity(runnable, sizes, args, threads, progress):
    """parity.check for every op and size; {(op, T): {(impl, device): result}}."""
    import torch

    from numpy_attn._threads import limit_blas_threads

    # Nothing is timed here, so both pools may run; they get the timed thread count to finish
    # sooner, and are restored afterwards for whoever called main() in-process (the tests).
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with limit_blas_threads(threads, required=True):
            checks = {}
            for name, targets in runnable.items():
                for T, size in sizes.items():
                    checks[name, T] = parity.check(registry.OPS[name], size, args.dtype,
                                                   args.seed, targets, args.tolerance)
                    progress.step(f"parity {name} T={T}")
            return checks
    finally:
        torch.set_num_threads(old)


def _time(workers, job, peak_size, progress):
    """Run one worker per (library, device): (worker envs, {(library, device): peak}, rows)."""
    envs, peaks, timed = [], {}, []
    for (library, device), cases in workers.items():
        peak_n = peak_size if device == "cpu" else max(peak_size, 8192)   # a GPU needs more work
        cases = [dict(op=name, T=T, impls=impls) for (name, T), impls in cases.items()]
        for record in _run_worker(library, device, dict(job, peak_n=peak_n), cases, progress):
            kind = record.pop("kind")
            if kind == "env":
                envs.append(record)
            elif kind == "peak":
                peaks[library, device] = record
            else:
                timed.append(record)
    return envs, peaks, timed


def _finish_rows(timed, sizes, peaks, checks, dtype):
    """Add sizes, FLOPs, GFLOP/s, share of peak, parity and the ratio to NumPy to each row."""
    rows = []
    for r in timed:
        op, size = registry.OPS[r["op"]], sizes[r["T"]]
        flops = op.count_flops(size, r["mode"])
        gflops = flops / r["time_s"]["median"] / 1e9
        peak = peaks[_library(r["impl"]), r["device"]]["gflops"]
        rows.append(dict(r, S=size.S, B=size.B, nh=size.nh, hs=size.hs, dtype=dtype,
                         status="ok", reason=None, flops=flops, gflops=gflops,
                         peak_fraction=gflops / peak,
                         parity=checks[r["op"], r["T"]][r["impl"], r["device"]]))
    numpy_time = {(r["op"], r["mode"], r["T"]): r["time_s"]["median"]
                  for r in rows if r["impl"] == "numpy"}
    for r in rows:
        ref = numpy_time.get((r["op"], r["mode"], r["T"]))
        r["numpy_over_this"] = ref / r["time_s"]["median"] if ref else None
    return rows


def measure(ops, args, argv):
    """Parity for every case, then timing in one worker per library and device: the results dict."""
    import numpy as np
    import threadpoolctl
    import torch

    started = time.monotonic()
    load_before = _load_average()
    s = _settings(args)
    cuda_reason = None if torch.cuda.is_available() else (
        "torch.cuda.is_available() is False" + ("" if torch.version.cuda else " (CPU-only torch build)"))
    runnable, unavailable = _plan(ops, args, cuda_reason)
    seq_lens = sorted(set(s["seq_lens"]))
    sizes = {T: Size(B=s["batch"], nh=s["heads"], T=T, hs=s["head_size"]) for T in seq_lens}
    workers = {}                                   # (library, device) -> {(op, T): [impls]}
    for name, targets in runnable.items():
        for T in seq_lens:
            for impl, device in targets:
                workers.setdefault((_library(impl), device), {}).setdefault((name, T), []).append(impl)
    steps = len(runnable) * len(seq_lens) + len(workers) + sum(
        len(impls) * len(args.modes) for cases in workers.values() for impls in cases.values())
    progress = report.Progress(steps, enabled=not args.no_progress)

    checks = _check_parity(runnable, sizes, args, s["threads"], progress)
    job = dict(threads=s["threads"], dtype=args.dtype, seed=args.seed, repeats=s["repeats"],
               min_time=s["min_time"], warmup=args.warmup, modes=args.modes,
               size=dict(B=s["batch"], nh=s["heads"], hs=s["head_size"]))
    envs, peaks, timed = _time(workers, job, s["peak_size"], progress)
    rows = _finish_rows(timed, sizes, peaks, checks, args.dtype) + unavailable

    return dict(
        schema=1,
        command="python -m benchmarks " + shlex.join(argv),
        started_utc=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        duration_s=round(time.monotonic() - started, 1),
        # Other processes' load makes timings noisy (threads wait for descheduled siblings).
        load_average=dict(before=load_before, after=_load_average()),
        machine=report.machine(),
        git=_git_state(),
        versions=dict(python=platform.python_version(), numpy=np.__version__,
                      torch=torch.__version__, threadpoolctl=threadpoolctl.__version__),
        config=dict(ops=[op.name for op in ops], impls=args.impls, device=args.device,
                    modes=args.modes, seq_lens=seq_lens, batch=s["batch"], heads=s["heads"],
                    head_size=s["head_size"], dtype=args.dtype, threads=s["threads"],
                    repeats=s["repeats"], min_time=s["min_time"], warmup=args.warmup,
                    peak_size=s["peak_size"], seed=args.seed, quick=args.quick,
                    tolerance=args.tolerance),
        cuda=dict(available=cuda_reason is None, reason=cuda_reason),
        flops_convention=FLOPS_CONVENTION,
        ops={op.name: dict(stem=op.stem, **op.describe(), bwd_factor=op.bwd_factor) for op in ops},
        environment={k: v for k, v in os.environ.items()   # as the user set them
                     if k.startswith(("OPENBLAS_", "OMP_", "MKL_", "GOMP_", "KMP_"))},
        workers=envs,
        peaks=list(peaks.values()),
        rows=rows,
    )


def _check_outputs(parser, args):
    """Fail now, not after a long run, when an output cannot be written."""
    for path in filter(None, (args.json, args.csv, args.markdown, args.plot)):
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            parser.error(f"cannot create the folder of {path}: {err}")
        if Path(path).is_dir() or not os.access(Path(path).parent, os.W_OK):
            parser.error(f"cannot write {path}")
        if Path(path).exists() and not args.force:
            parser.error(f"{path} exists; pass --force to overwrite it")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            parser.error("--plot needs matplotlib (pip install numpy-attn[plots])")


def main(argv=None):
    """Run the command line ``argv`` (default sys.argv[1:]); returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list:
        _list_ops()
        return 0
    _check_outputs(parser, args)
    if args.ops == ["decode"]:   # generation, not an op: its own timing and table (benchmarks/decode.py)
        from benchmarks import decode
        return decode.main(args, argv)
    if args.from_json:
        results = json.loads(Path(args.from_json).read_text())
    else:
        try:
            ops = registry.select(args.ops)
        except ValueError as err:
            parser.error(str(err))
        missing = [name for name in ("torch", "threadpoolctl") if importlib.util.find_spec(name) is None]
        if missing:
            parser.error(f"measuring needs {' and '.join(missing)}: "
                         "pip install -c constraints.txt -e '.[benchmarks]'")
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
        Path(args.markdown).write_text("\n".join(
            [f"- {line}" for line in report.header_lines(results)] + [""]
            + report.table_lines(results, markdown=True)) + "\n")
        print(f"wrote {args.markdown}", file=sys.stderr)
    if args.plot:
        try:
            report.write_plot(results, args.plot)
        except ValueError as err:
            print(f"python -m benchmarks: no plot written: {err}", file=sys.stderr)
            return 1
        print(f"wrote {args.plot}", file=sys.stderr)
    print("\n".join(report.header_lines(results) + [""] + report.table_lines(results)))
    return 0
