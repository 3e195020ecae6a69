"""Timing, peak memory and matmul peak, for NumPy and for torch, with one sampling policy.

Policy for both libraries: ``warmup`` untimed calls (the last one estimates the call's cost),
then samples until there are at least ``repeats`` of them and ``min_time`` seconds have been
timed. A sample times a block of calls long enough that the clock's overhead vanishes; its time
is the block's time divided by the number of calls. We report the median and the quartiles of
the samples (robust to the other processes on a shared machine) and their min and max.
torch is timed by ``torch.utils.benchmark.Timer`` (it sets torch's thread count and
synchronises CUDA before reading the clock); NumPy by ``time.perf_counter``. Peak memory is
taken on one more call before the warm-up, never on a timed one (tracemalloc slows allocation).
Interleaved runs (``--interleave``) take one sample per request instead: ``warm_up`` and
``calls_per_sample`` once, then ``sample`` each round, for both libraries alike.
"""

import math
import statistics
import time
import tracemalloc

import numpy as np

from benchmarks import calls

BLOCK_S = 0.01      # shortest block of calls per sample: perf_counter's ~0.1 us overhead vanishes


def summarize(times, number):
    """Median, quartiles, min and max of per-call sample times (seconds)."""
    q25, median, q75 = (statistics.quantiles(times, n=4, method="inclusive")
                        if len(times) > 1 else times * 3)
    return dict(median=median, q25=q25, q75=q75, min=min(times), max=max(times),
                samples=len(times), number=number)


def _no_sync():
    pass


def warm_up(fn, warmup, sync=_no_sync):
    """Run ``fn`` ``warmup`` times untimed; the seconds the last call took (an estimate)."""
    for _ in range(warmup):
        start = time.perf_counter()
        fn()
        sync()
        estimate = time.perf_counter() - start
    return estimate


def calls_per_sample(estimate):
    """How many calls of ``estimate`` seconds a sample of at least BLOCK_S needs."""
    return max(1, math.ceil(BLOCK_S / max(estimate, 1e-9)))


def sample(fn, number, sync=_no_sync):
    """Seconds per call of one block of ``number`` calls (``sync`` waits for a GPU to finish)."""
    start = time.perf_counter()
    for _ in range(number):
        fn()
    sync()
    return (time.perf_counter() - start) / number


def time_numpy(fn, repeats, min_time, warmup):
    """Sample ``fn()`` as the module docstring says; returns ``summarize``'s dict."""
    number = calls_per_sample(warm_up(fn, warmup))
    times = []
    while len(times) < repeats or sum(times) * number < min_time:
        times.append(sample(fn, number))
    return summarize(times, number)


def time_torch(fn, repeats, min_time, warmup, threads, device):
    """Sample ``fn()`` with ``torch.utils.benchmark.Timer.blocked_autorange``.

    blocked_autorange picks the block size itself and samples until ``min_run_time`` has passed;
    we ask for enough time to collect ``repeats`` samples and top up if noise left us short.
    """
    from torch.utils.benchmark import Timer

    estimate = warm_up(fn, warmup, torch_sync(device))
    timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads)
    times, number = [], 1
    while len(times) < repeats:
        wanted = max(min_time if not times else 0.0, (repeats - len(times)) * estimate * 1.1)
        measurement = timer.blocked_autorange(min_run_time=wanted)
        times += measurement.times                 # per-call times, one per block
        number = measurement.number_per_run
    return summarize(times, number)


def torch_sync(device):
    """What waits for ``device`` to finish its queued kernels before the clock is read."""
    if device != "cuda":
        return _no_sync
    import torch

    return torch.cuda.synchronize


def numpy_peak_bytes(fn):
    """Peak bytes allocated while ``fn()`` runs, above what was allocated before.

    NumPy reports its array buffers to tracemalloc, so this counts temporaries and the cache.
    """
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        fn()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def cuda_peak_bytes(fn):
    """Peak CUDA bytes allocated while ``fn()`` runs, above what was allocated before."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


# Largest operand (elements) of a matmul shape taken from the run's sizes: a T = 8192 score
# matrix is 256 MiB per head, and its shape's rate is reached well below that.
GEMM_ELEMENTS = 2**24


def gemm_shapes(size, seq_lens, n):
    """The matmuls the run's ops perform, as (batch, m, k, n): the n x n square of --peak-size,
    then per T attention's q @ k^T (T, hs) @ (hs, S) and p @ v (T, S) @ (S, hs), one per head, and
    the projections of multi_head, block and gpt_step, (B*T, C) @ (C, C) and (C, 4C). A shape whose
    operands exceed GEMM_ELEMENTS is left out and a batch of heads cut to fit it. ``size`` holds
    B, nh, hs; S = T."""
    B, nh, hs = size["B"], size["nh"], size["hs"]
    C = nh * hs
    shapes = [(1, n, n, n)]
    for T in seq_lens:
        for batch, m, k, w in ((B * nh, T, hs, T), (B * nh, T, T, hs), (1, B * T, C, C), (1, B * T, C, 4 * C)):
            largest = max(m * k, k * w, m * w)
            if largest <= GEMM_ELEMENTS and (shape := (min(batch, GEMM_ELEMENTS // largest), m, k, w)) not in shapes:
                shapes.append(shape)
    return shapes


def matmul_peak(library, shapes, dtype, device, repeats, min_time, threads):
    """The ceiling the op rows are compared against: the fastest of the matmul ``shapes``
    ((batch, m, k, n) each, ``gemm_shapes``), in GFLOP/s of its fastest sample. The fastest, not
    the median: a ceiling is what the machine can do, and a sample slowed by another process says
    nothing about that (the rows keep their medians, so none of them can pass a fair ceiling).

    NumPy's is the matmul numpy_attn computes in: float32 for float16 and bfloat16 (NumPy has no
    BLAS for them; a float16 ``a @ b`` is a generic loop that no operation here runs). torch's is
    in ``dtype``, as its kernels are called with it."""
    rng = np.random.default_rng(0)
    dtype = calls.opmath(dtype) if library == "numpy" else np.dtype(dtype)
    measured = []
    for batch, m, k, n in shapes:
        a = rng.standard_normal((batch, m, k)).astype(dtype)
        b = rng.standard_normal((batch, k, n)).astype(dtype)
        a, b = (a[0], b[0]) if batch == 1 else (a, b)
        if library == "numpy":
            stats = time_numpy(lambda a=a, b=b: a @ b, repeats, min_time, warmup=1)
        else:
            ta, tb = calls.to_tensor(a, device), calls.to_tensor(b, device)
            stats = time_torch(lambda ta=ta, tb=tb: ta @ tb, repeats, min_time, 1, threads, device)
        measured.append(dict(shape=[batch, m, k, n], gflops=2 * batch * m * k * n / stats["min"] / 1e9,
                             time_s=stats))
        del a, b
    best = max(measured, key=lambda x: x["gflops"])
    return dict(library=library, device=device, n=shapes[0][1], dtype=str(np.dtype(dtype)),
                gflops=best["gflops"], shape=best["shape"], shapes=measured)
