"""Timing subprocess: ``python -m benchmarks._worker`` times one library on one device.

Why a subprocess: NumPy's OpenBLAS threads and torch's OpenMP threads each spin for a while
after a kernel ends, so interleaving the two libraries in one process slowed both down by
1.3-4x on this machine. A NumPy worker never imports torch; a torch worker uses NumPy only to
draw its inputs (no BLAS calls), so its OpenBLAS threads never wake. Every timing of
``python -m benchmarks`` (op sweeps, ``--interleave``, ``--ops decode``) goes through here.

Protocol: a JSON job on the first line of stdin (written by ``Worker`` below, in the parent);
results on stdout, one JSON object per line after the ``PREFIX``: ``env``, then

- a sweep: ``peak``, then one ``row`` per timed (case, impl, mode);
- ``"serve": true`` (interleaved): ``peak``, then one ``sample`` per request line on stdin,
  ``{"case": index into the job's cases, "impl", "mode"}``, until stdin closes;
- ``"decode": {...}``: one ``row`` per prompt length and cache setting (benchmarks/decode.py);
- ``"decode_hf": {...}`` (serving): ``model``, then one ``sample`` per request line, a generation
  from a Hugging Face folder (benchmarks/decode_hf.py).

Anything else a library prints goes to stderr. A failure exits non-zero with a traceback. The
parent's side, ``Worker``, is in workers.py.
"""

import json
import os
import sys
import threading
import time

import numpy as np

from benchmarks import calls, measure
from benchmarks.machine import process_env
from benchmarks.registry import OPS, Size
from benchmarks.workers import PARENT_VAR, PREFIX


def _emit(stream, kind, **record):
    stream.write(PREFIX + json.dumps({"kind": kind, **record}) + "\n")
    stream.flush()


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


def _prepare(job, op, T, impls):
    """{(impl, mode): a closure timing one call} for one op at one size, every mode of the job."""
    library, device, dtype = job["library"], job["device"], np.dtype(job["dtype"])
    diff, static = calls.make_inputs(op, Size(T=T, **job["size"]), dtype, job["seed"])
    fns = {}
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
        fns.update({(impl, mode): fn for mode, fn in zip(("fwd", "fwd+bwd"), modes, strict=True)
                    if mode in job["modes"]})
    return fns


def _peak_bytes(library, device, fn):
    if library == "numpy":
        return measure.numpy_peak_bytes(fn)
    return measure.cuda_peak_bytes(fn) if device == "cuda" else None


def _sweep(job, out):
    """Time every case to the job's repeats and min_time; one ``row`` each."""
    library, device = job["library"], job["device"]
    knobs = dict(repeats=job["repeats"], min_time=job["min_time"], warmup=job["warmup"])
    for case in job["cases"]:
        for (impl, mode), fn in _prepare(job, OPS[case["op"]], case["T"], case["impls"]).items():
            memory = _peak_bytes(library, device, fn)
            if library == "numpy":
                stats = measure.time_numpy(fn, **knobs)
            else:
                stats = measure.time_torch(fn, **knobs, threads=job["threads"], device=device)
            _emit(out, "row", op=case["op"], T=case["T"], impl=impl, device=device, mode=mode,
                  time_s=stats, peak_mem_bytes=memory)


def _serve(job, out, requests):
    """One ``sample`` per request; the first of each (case, impl, mode) also warms it up and
    measures its peak memory. Only one case's inputs are held at a time (T = 8192 attention
    inputs are 256 MiB each), rebuilt, untimed, when the requests move to another case."""
    library, device = job["library"], job["device"]
    sync = measure.torch_sync(device) if library == "torch" else measure._no_sync
    held, fns, number = None, {}, {}
    for line in requests:
        request = json.loads(line)
        index, impl, mode = request["case"], request["impl"], request["mode"]
        if index != held:
            case = job["cases"][index]
            fns = {}                                   # free the old inputs first
            fns, held = _prepare(job, OPS[case["op"]], case["T"], case["impls"]), index
        fn, memory = fns[impl, mode], None
        if (index, impl, mode) not in number:
            memory = _peak_bytes(library, device, fn)
            number[index, impl, mode] = measure.calls_per_sample(measure.warm_up(fn, job["warmup"], sync))
        _emit(out, "sample", seconds=measure.sample(fn, number[index, impl, mode], sync),
              number=number[index, impl, mode], peak_mem_bytes=memory)


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
    job = json.loads(sys.stdin.readline())
    library, device = job["library"], job["device"]
    _pin_threads(library, job["threads"])
    _emit(out, "env", library=library, device=device, **process_env(library, device))
    if "decode_hf" in job:
        from benchmarks import decode_hf

        decode_hf.serve(job, lambda kind, **record: _emit(out, kind, **record), sys.stdin)
        return 0
    if "decode" in job:
        from benchmarks import decode, decode_cache

        timed = {**decode.WORKERS, **decode_cache.WORKERS}[job["decode"].get("run", "decode")]
        for row in timed(job):
            _emit(out, "row", **row)
        return 0
    shapes = measure.gemm_shapes(job["size"], sorted({case["T"] for case in job["cases"]}), job["peak_n"])
    _emit(out, "peak", **measure.matmul_peak(
        library, shapes, np.dtype(job["dtype"]), device, job["repeats"], job["min_time"], job["threads"]))
    if job.get("serve"):
        _serve(job, out, sys.stdin)
    else:
        _sweep(job, out)
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except BrokenPipeError:      # the parent stopped reading (a signal ended it): no one to tell, nothing to flush
        os._exit(3)
