"""Timing subprocess: ``python -m benchmarks._worker`` times one library on one device.

Why a subprocess: NumPy's OpenBLAS threads and torch's OpenMP threads each spin for a while
after a kernel ends, so interleaving the two libraries in one process slowed both down by
1.3-4x on this machine. A NumPy worker never imports torch; a torch worker uses NumPy only to
draw its inputs (no BLAS calls), so its OpenBLAS threads never wake.

Protocol: a JSON job on stdin (written by ``cli.py``); results on stdout, one JSON object per
line after the ``PREFIX``, in this order: ``env``, ``peak``, then one ``row`` per timed case.
Anything else a library prints goes to stderr. A failure exits non-zero with a traceback.
"""

import json
import os
import platform
import sys
import threading
import time

import numpy as np

from benchmarks import calls, measure
from benchmarks.registry import OPS, Size

PREFIX = "BENCH "


def _emit(stream, kind, **record):
    stream.write(PREFIX + json.dumps({"kind": kind, **record}) + "\n")
    stream.flush()


def _env(library, device):
    """What the timed process sees: versions, thread pools and the BLAS kernel in use."""
    from threadpoolctl import threadpool_info

    env = dict(numpy=np.__version__, python=platform.python_version(),
               threadpools=threadpool_info(),
               cpus=sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None)
    env["numpy_simd"] = _numpy_simd()
    if library == "torch":
        import torch

        env.update(torch=torch.__version__, torch_threads=torch.get_num_threads(),
                   torch_interop_threads=torch.get_num_interop_threads(),
                   torch_cpu_capability=torch.backends.cpu.get_cpu_capability())
        if device == "cuda":
            props = torch.cuda.get_device_properties(0)
            env.update(gpu=torch.cuda.get_device_name(0), gpu_memory_bytes=props.total_memory,
                       cuda=torch.version.cuda,
                       tf32_matmul=torch.backends.cuda.matmul.allow_tf32)
    return env


def _numpy_simd():
    """The SIMD targets NumPy found on this CPU beyond its baseline (e.g. ['X86_V3']), or None.

    np.show_runtime() prints them; the dict it reads is private, so its absence is tolerated.
    """
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    except ImportError:
        return None
    return [name for name in __cpu_dispatch__ if __cpu_features__.get(name)]


def _pin_threads(library, threads):
    """Give the process ``threads`` CPUs, and the timed library's pool as many threads.

    The CPU affinity binds code that sizes its own thread pool from the CPU count (the NumPy
    FlashAttention does), which no thread-count setting of a library reaches.
    """
    if hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        if threads < len(cpus):
            os.sched_setaffinity(0, cpus[:threads])
    if library == "numpy":
        from numpy_attn._threads import limit_blas_threads

        limit_blas_threads(threads, required=True)      # for the rest of this process
    else:
        import torch

        torch.set_num_threads(threads)


def _measure_case(job, op, T, impls, out):
    """Time every (impl, mode) of one op at one size; emit a row for each."""
    library, device, dtype = job["library"], job["device"], np.dtype(job["dtype"])
    size = Size(T=T, **job["size"])
    diff, static = calls.make_inputs(op, size, dtype, job["seed"])
    knobs = dict(repeats=job["repeats"], min_time=job["min_time"], warmup=job["warmup"])
    for impl in impls:
        if library == "numpy":
            fwd, _ = calls.numpy_calls(op, diff, static, None)
            dout = calls.make_dout(fwd()[0].shape, dtype, job["seed"])
            modes = calls.numpy_calls(op, diff, static, dout)
        else:
            tensors = calls.to_device(diff, device)
            fwd, _ = calls.torch_calls(op, impl, tensors, static, None)
            dout = calls.make_dout(tuple(fwd().shape), dtype, job["seed"])
            modes = calls.torch_calls(op, impl, tensors, static, calls.to_tensor(dout, device))
        for mode, fn in zip(("fwd", "fwd+bwd"), modes, strict=True):
            if mode not in job["modes"]:
                continue
            if library == "numpy":
                memory = measure.numpy_peak_bytes(fn)
                stats = measure.time_numpy(fn, **knobs)
            else:
                memory = measure.cuda_peak_bytes(fn) if device == "cuda" else None
                stats = measure.time_torch(fn, **knobs, threads=job["threads"], device=device)
            _emit(out, "row", op=op.name, T=T, impl=impl, device=device, mode=mode,
                  time_s=stats, peak_mem_bytes=memory)


PARENT_VAR = "NUMPY_ATTN_BENCH_PARENT"     # the parent's process id, set by cli.py


def _die_with_parent():
    """Exit when the parent (python -m benchmarks) is gone, killed or not: a daemon thread sees
    the parent process id change, as the orphan is adopted, and ends this process. The parent
    names itself in PARENT_VAR, so that one killed while this process was still starting counts."""
    parent = int(os.environ.get(PARENT_VAR, os.getppid()))

    def watch():
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def main():
    _die_with_parent()
    out, sys.stdout = sys.stdout, sys.stderr       # keep stray prints out of the protocol
    job = json.load(sys.stdin)
    library, device = job["library"], job["device"]
    _pin_threads(library, job["threads"])
    _emit(out, "env", library=library, device=device, **_env(library, device))
    _emit(out, "peak", **measure.matmul_peak(
        library, job["peak_n"], np.dtype(job["dtype"]), device, job["repeats"],
        job["min_time"], job["threads"]))
    for case in job["cases"]:
        _measure_case(job, OPS[case["op"]], case["T"], case["impls"], out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
