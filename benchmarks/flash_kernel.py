"""``python -m benchmarks.flash_kernel``: the tuned NumPy FlashAttention against F.scaled_dot_product_attention.

One run, interleaved: a NumPy process and a torch process (each library alone in its process,
as ``python -m benchmarks`` does, so that their thread pools never fight) take turns, one call
at a time, for every case and every round. Both therefore see the same load from other
processes, and their ratios are comparable even on a busy machine (the absolute times are not).
Each ratio is given twice: of the medians, and paired, the median over rounds of the ratio of
two calls made back to back, with its quartiles; on a machine whose speed drifts from one round
to the next (a shared virtual machine) the paired one is the one to read. ``--against REV`` adds
the kernel as it was at git revision REV (with the numpy_attn of that revision) to the NumPy
process, interleaved too: the new / old ratio of a change.

Cases (float32, B=4, nh=8, hs=64 unless given): forward, forward+backward and causal forward at
T = S = 2048, and with ``--long`` the forward at T = 8192 with the kernel's peak extra memory
(tracemalloc). Prints the machine (CPU vector extensions, BLAS kernel), the load average and
the medians and ratios; ``--json FILE`` saves them.
"""

import argparse
import importlib
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNEL = "numpy_attn/kernels/flash_attention.py"

# (name, T, is_causal, with backward); --long adds the T = 8192 forward.
CASES = [("fwd", 2048, False, False), ("fwd+bwd", 2048, False, True), ("causal fwd", 2048, True, False)]
LONG_CASES = [("fwd", 8192, False, False)]


# -- the worker processes ------------------------------------------------------------------------

def _load_revision(rev):
    """The kernel module as it was at git revision ``rev``, with the numpy_attn it imported then.

    The package at ``rev`` is extracted to a temporary folder under another name
    (``numpy_attn_at_<rev>``, its imports rewritten to match), so that helpers which have moved or
    changed since, such as input checks, are the ones that kernel was written against.
    """
    for path in (KERNEL, "numpy_attn/flash_attention.py"):   # before and after the kernels/ move
        text = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True,
                              text=True).stdout
        if "def _forward_slice" in text:
            break
    else:
        raise SystemExit(f"no flash attention kernel at revision {rev}")
    name = "numpy_attn_at_" + re.sub(r"\W", "_", rev)
    folder = Path(tempfile.mkdtemp())
    archive = subprocess.run(["git", "archive", "--format=tar", rev, "numpy_attn"], cwd=ROOT,
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    (folder / "numpy_attn").rename(folder / name)
    for file in (folder / name).rglob("*.py"):
        file.write_text(re.sub(r"\bnumpy_attn\b", name, file.read_text()))
    sys.path.insert(0, str(folder))
    # numpy_attn/kernels/flash_attention.py -> numpy_attn_at_<rev>.kernels.flash_attention
    return importlib.import_module(".".join((name, *Path(path).with_suffix("").parts[1:])))


def _serve(library, threads, against, size):
    """Answer requests on stdin, one JSON line each: {"impl", "case"} -> seconds of one call."""
    import numpy as np

    B, nh, hs = size
    if hasattr(os, "sched_setaffinity") and threads < len(os.sched_getaffinity(0)):
        # The kernel sizes its thread pool from the CPUs it may use: give it ``threads`` of them.
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:threads])
    if library == "numpy":
        from threadpoolctl import threadpool_limits

        import numpy_attn.kernels.flash_attention as new
        threadpool_limits(threads, user_api="blas")
        kernels = {"numpy": new}
        if against:
            kernels["numpy@" + against] = _load_revision(against)
    else:
        import torch
        import torch.nn.functional as F

        torch.set_num_threads(threads)
    inputs = {}

    def arrays(T):
        if T not in inputs:
            rng = np.random.default_rng(T)
            inputs.clear()                        # one size at a time: T = 8192 is 256 MiB each
            inputs[T] = [rng.standard_normal((B, nh, T, hs)).astype(np.float32) for _ in range(4)]
        return inputs[T]

    def call(impl, T, causal, backward):
        q, k, v, dout = arrays(T)
        if library == "numpy":
            kernel = kernels[impl]
            out, cache = kernel.flash_attention_forward(q, k, v, is_causal=causal)
            if backward:
                kernel.flash_attention_backward(dout, cache)
        elif backward:
            tq, tk, tv = (torch.from_numpy(a).requires_grad_() for a in (q, k, v))
            F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal).backward(torch.from_numpy(dout))
        else:
            with torch.no_grad():
                F.scaled_dot_product_attention(*map(torch.from_numpy, (q, k, v)), is_causal=causal)

    for line in sys.stdin:
        request = json.loads(line)
        case = request["case"]
        if request.get("memory"):
            import tracemalloc

            tracemalloc.start()
            base = tracemalloc.get_traced_memory()[0]
            call(request["impl"], *case)
            answer = tracemalloc.get_traced_memory()[1] - base
            tracemalloc.stop()
        else:
            start = time.perf_counter()
            call(request["impl"], *case)
            answer = time.perf_counter() - start
        print(json.dumps(answer), flush=True)


class _Worker:
    def __init__(self, library, args):
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = str(args.threads)
        command = [sys.executable, "-m", "benchmarks.flash_kernel", "--serve", library,
                   "--threads", str(args.threads), "--size", *map(str, args.size)]
        if args.against and library == "numpy":
            command += ["--against", args.against]
        self.proc = subprocess.Popen(command, cwd=ROOT, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def ask(self, impl, case, memory=False):
        self.proc.stdin.write(json.dumps(dict(impl=impl, case=case, memory=memory)) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the {impl} worker died (its traceback is above)")
        return json.loads(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


# -- the parent --------------------------------------------------------------------------------

def _environment(threads):
    from threadpoolctl import threadpool_info

    from benchmarks import report
    from benchmarks._worker import _numpy_simd

    blas = [p for p in threadpool_info() if p["user_api"] == "blas"]
    return dict(machine=report.machine(), threads=threads, numpy_simd=_numpy_simd(),
                blas=[dict(api=p["internal_api"], version=p.get("version"),
                           architecture=p.get("architecture")) for p in blas])


def run(args):
    impls = ["numpy", "torch"] + (["numpy@" + args.against] if args.against else [])
    workers = {"numpy": _Worker("numpy", args), "torch": _Worker("torch", args)}
    cases = CASES + (LONG_CASES if args.long else [])
    load = [os.getloadavg()[0]]
    started = time.monotonic()
    times = {(c[0], c[1], i): [] for c in cases for i in impls}
    memory = {}
    try:
        for c in cases:                               # warm-up: first calls allocate and page in
            for impl in impls:
                workers[impl.split("@")[0]].ask(impl, c[1:])
                if c[0] == "fwd" and impl.startswith("numpy"):
                    memory[c[1], impl] = workers["numpy"].ask(impl, c[1:], memory=True)
        for r in range(args.rounds):
            for c in cases:
                if c[1] > 2048 and r >= args.long_rounds:
                    continue
                for impl in impls if r % 2 == 0 else impls[::-1]:   # alternate who goes first
                    times[c[0], c[1], impl].append(workers[impl.split("@")[0]].ask(impl, c[1:]))
            load.append(os.getloadavg()[0])
            print(f"round {r + 1}/{args.rounds} done, load average {load[-1]:.2f}", file=sys.stderr)
    finally:
        for w in workers.values():
            w.close()
    rows = []
    for name, T, *_ in cases:
        med = {i: statistics.median(times[name, T, i]) for i in impls}
        row = dict(case=name, T=T, samples=len(times[name, T, "numpy"]),
                   median_s=med, times_s={i: times[name, T, i] for i in impls},
                   kernel_over_sdpa=med["numpy"] / med["torch"],
                   kernel_over_sdpa_paired=_paired(times[name, T, "numpy"], times[name, T, "torch"]))
        if args.against:
            row["new_over_old"] = med["numpy"] / med["numpy@" + args.against]
            row["new_over_old_paired"] = _paired(times[name, T, "numpy"], times[name, T, "numpy@" + args.against])
        if name == "fwd":
            row["kernel_peak_mib"] = {i: memory[T, i] / 2**20 for i in impls if (T, i) in memory}
        rows.append(row)
    by = {(r["case"], r["T"]): r for r in rows}
    derived = dict(causal_speedup=by["fwd", 2048]["median_s"]["numpy"] / by["causal fwd", 2048]["median_s"]["numpy"],
                   causal_speedup_paired=_paired(times["fwd", 2048, "numpy"], times["causal fwd", 2048, "numpy"]))
    return dict(command="python -m benchmarks.flash_kernel " + " ".join(sys.argv[1:]),
                environment=_environment(args.threads), size=dict(zip(("B", "nh", "hs"), args.size, strict=True)),
                load_average=load, duration_s=round(time.monotonic() - started, 1),
                rows=rows, derived=derived)


def _paired(a, b):
    """Median and quartiles of a[r] / b[r] over rounds r: the two were timed back to back, so a
    change in the machine's speed between rounds cancels in each ratio."""
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    q1, median, q3 = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    return dict(median=median, q25=q1, q75=q3)


def _show(paired):
    return f"{paired['median']:.3f}, IQR {paired['q25']:.3f}-{paired['q75']:.3f}"


def print_results(res):
    m, env = res["environment"]["machine"], res["environment"]
    blas = "; ".join(f"{b['api']} {b['version']} {b['architecture']}" for b in env["blas"])
    print(f"machine: {m['cpu']}, vector extensions: {' '.join(m['vector_extensions'] or ['unknown'])}; "
          f"BLAS {blas}; NumPy SIMD {' '.join(env['numpy_simd'] or ['unknown'])}")
    print(f"threads {env['threads']}, float32, {res['size']}; load average "
          + " ".join(f"{x:.2f}" for x in res["load_average"]) + f"; {res['duration_s']} s")
    for r in res["rows"]:
        med = "  ".join(f"{i} {1e3 * t:.0f} ms" for i, t in r["median_s"].items())
        extra = (f"  new/old {r['new_over_old']:.3f} (paired {_show(r['new_over_old_paired'])})"
                 if "new_over_old" in r else "")
        mem = ("  peak " + ", ".join(f"{i} {v:.0f} MiB" for i, v in r["kernel_peak_mib"].items())
               if "kernel_peak_mib" in r else "")
        print(f"{r['case']:>11} T={r['T']:<5} n={r['samples']}  {med}  kernel/sdpa {r['kernel_over_sdpa']:.3f} "
              f"(paired {_show(r['kernel_over_sdpa_paired'])}){extra}{mem}")
    d = res["derived"]
    print(f"causal forward speed-up over non-causal: {d['causal_speedup']:.2f}x "
          f"(paired {_show(d['causal_speedup_paired'])})")
    print("ratios: of the medians; paired: the median over rounds of the ratio within a round, "
          "with its quartiles, which holds when the machine's speed drifts between rounds")


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.flash_kernel", description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2, help="threads for NumPy's BLAS and the kernel's "
                   "pool, and for torch; default 2")
    p.add_argument("--rounds", type=int, default=7, help="interleaved samples per case; default 7")
    p.add_argument("--long", action="store_true", help="add the T = 8192 forward (time and memory)")
    p.add_argument("--long-rounds", type=int, default=3, help="samples of the T = 8192 case; default 3")
    p.add_argument("--against", metavar="REV", help="also time the kernel at git revision REV")
    p.add_argument("--size", type=int, nargs=3, default=[4, 8, 64], metavar=("B", "NH", "HS"))
    p.add_argument("--json", metavar="FILE", help="save the results")
    p.add_argument("--serve", choices=("numpy", "torch"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        _serve(args.serve, args.threads, args.against, args.size)
        return 0
    res = run(args)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    print_results(res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
