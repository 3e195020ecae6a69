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

Anything else a library prints goes to stderr. A failure exits non-zero with a traceback.
"""

import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks import calls, measure
from benchmarks.registry import OPS, Size

PREFIX = "BENCH "
ROOT = Path(__file__).resolve().parents[1]


def _emit(stream, kind, **record):
    stream.write(PREFIX + json.dumps({"kind": kind, **record}) + "\n")
    stream.flush()


def _env(library, device):
    """What the timed process sees: versions, thread pools and the BLAS kernel in use."""
    from threadpoolctl import threadpool_info

    import numpy_attn

    env = dict(numpy=np.__version__, python=platform.python_version(),
               threadpools=threadpool_info(),
               cpus=sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
               numpy_attn_path=str(Path(numpy_attn.__file__).resolve().parent))
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


PARENT_VAR = "NUMPY_ATTN_BENCH_PARENT"     # the parent's process id, set by Worker


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
    _emit(out, "env", library=library, device=device, **_env(library, device))
    if "decode_hf" in job:
        from benchmarks import decode_hf

        decode_hf.serve(job, lambda kind, **record: _emit(out, kind, **record), sys.stdin)
        return 0
    if "decode" in job:
        from benchmarks import decode

        for row in decode.time_in_worker(job):
            _emit(out, "row", **row)
        return 0
    _emit(out, "peak", **measure.matmul_peak(
        library, job["peak_n"], np.dtype(job["dtype"]), device, job["repeats"],
        job["min_time"], job["threads"]))
    if job.get("serve"):
        _serve(job, out, sys.stdin)
    else:
        _sweep(job, out)
    return 0


# -- the parent's side ------------------------------------------------------------------------------

def _describe(label, record):
    """What a progress line says of a record."""
    if record["kind"] == "peak":
        return f"{label} matmul peak"
    if "P" in record:                              # decode
        return f"decode {record['impl']} P={record['P']} {'cached' if record['cache'] else 'uncached'}"
    return f"{record['op']} T={record['T']} {record['impl']} {record['device']} {record['mode']}"


class Worker:
    """The parent's handle on one timing subprocess: ``read()`` its records, ``ask()`` for one
    sample, ``finish()`` to check how it ended. As a context manager it kills a worker still
    running when the parent stops early (an error, Ctrl-C): no orphan keeps timing.

    ``pythonpath`` comes first on the worker's import path (it is also the worker's folder,
    which ``python -m`` puts before everything else): a folder holding another ``numpy_attn``
    times that one with this revision's benchmarks (``--against``).
    """

    def __init__(self, job, progress=None, pythonpath=None, label=None):
        self.label = label or f"{job['library']} {job['device']}"
        self.progress = progress
        path = [pythonpath, str(ROOT), os.environ.get("PYTHONPATH")]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, path)))
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = str(job["threads"])         # read once, when each library loads
        env[PARENT_VAR] = str(os.getpid())         # the worker exits if this process dies
        self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks._worker"], cwd=pythonpath or ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
            if not job.get("serve"):
                self.proc.stdin.close()
        except BrokenPipeError:                    # it died at once: read() reports how
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if not stream.closed:
                try:
                    stream.close()
                except BrokenPipeError:            # a dead worker's stdin: nothing to flush to
                    pass

    def read(self):
        """The next record as a dict (its ``kind`` included), or None once the worker has ended."""
        for line in self.proc.stdout:
            if line.startswith(PREFIX):
                record = json.loads(line[len(PREFIX):])
                if self.progress and record["kind"] in ("peak", "row"):
                    self.progress.step(_describe(self.label, record))
                return record
            sys.stderr.write(line)                 # a library's stray print
        self.finish()
        return None

    def records(self):
        """Every record until the worker ends; then ``finish()``."""
        while (record := self.read()) is not None:
            yield record

    def ask(self, request):
        """Send one request to a serving worker; its ``sample`` record."""
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass                                   # it died: read() reports how
        record = self.read()
        if record is None:
            raise RuntimeError(f"the {self.label} timing worker ended before answering")
        return record

    def finish(self):
        """Close a serving worker's requests and wait; RuntimeError if it failed."""
        if not self.proc.stdin.closed:
            self.proc.stdin.close()
        if self.proc.wait() < 0:                   # the kernel's OOM killer sends SIGKILL
            raise RuntimeError(f"the {self.label} timing worker was killed by signal "
                               f"{-self.proc.returncode} (out of memory? try smaller --seq-lens or --batch)")
        if self.proc.returncode != 0:
            raise RuntimeError(f"the {self.label} timing worker failed with exit status "
                               f"{self.proc.returncode} (its traceback is above)")


if __name__ == "__main__":
    raise SystemExit(main())
