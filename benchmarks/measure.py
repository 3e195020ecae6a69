"""Timing, peak memory and matmul peak, for NumPy and for torch, with one sampling policy.

Policy for both libraries: ``warmup`` untimed calls (the last one estimates the call's cost),
then samples until there are at least ``repeats`` of them and ``min_time`` seconds have been
timed. A sample times a block of calls long enough that the clock's overhead vanishes; its time
is the block's time divided by the number of calls. We report the median and the quartiles of
the samples (robust to the other processes on a shared machine) and their min and max.
torch is timed by ``torch.utils.benchmark.Timer`` (it sets torch's thread count and
synchronises CUDA before reading the clock); NumPy by ``time.perf_counter``. Peak memory is
taken on one more call before the warm-up, never on a timed one (tracemalloc slows allocation).
"""

import math
import statistics
import time
import tracemalloc

import numpy as np

BLOCK_S = 0.01      # shortest block of calls per sample: perf_counter's ~0.1 us overhead vanishes


def summarize(times, number):
    """Median, quartiles, min and max of per-call sample times (seconds)."""
    q25, median, q75 = (statistics.quantiles(times, n=4, method="inclusive")
                        if len(times) > 1 else times * 3)
    return dict(median=median, q25=q25, q75=q75, min=min(times), max=max(times),
                samples=len(times), number=number)


def time_numpy(fn, repeats, min_time, warmup):
    """Sample ``fn()`` as the module docstring says; returns ``summarize``'s dict."""
    for _ in range(warmup):
        start = time.perf_counter()
        fn()
        estimate = time.perf_counter() - start
    number = max(1, math.ceil(BLOCK_S / max(estimate, 1e-9)))
    times, total = [], 0.0
    while len(times) < repeats or total < min_time:
        start = time.perf_counter()
        for _ in range(number):
            fn()
        elapsed = time.perf_counter() - start
        times.append(elapsed / number)
        total += elapsed
    return summarize(times, number)


def time_torch(fn, repeats, min_time, warmup, threads, device):
    """Sample ``fn()`` with ``torch.utils.benchmark.Timer.blocked_autorange``.

    blocked_autorange picks the block size itself and samples until ``min_run_time`` has passed;
    we ask for enough time to collect ``repeats`` samples and top up if noise left us short.
    """
    import torch
    from torch.utils.benchmark import Timer

    for _ in range(warmup):
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        estimate = time.perf_counter() - start
    timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads)
    times, number = [], 1
    while len(times) < repeats:
        wanted = max(min_time if not times else 0.0, (repeats - len(times)) * estimate * 1.1)
        measurement = timer.blocked_autorange(min_run_time=wanted)
        times += measurement.times                 # per-call times, one per block
        number = measurement.number_per_run
    return summarize(times, number)


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


def matmul_peak(library, n, dtype, device, repeats, min_time, threads):
    """GFLOP/s of an (n, n) @ (n, n) matmul: the ceiling the op rows are compared against."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(dtype) for _ in range(2))
    if library == "numpy":
        stats = time_numpy(lambda: a @ b, repeats, min_time, warmup=1)
    else:
        import torch

        ta, tb = torch.from_numpy(a).to(device), torch.from_numpy(b).to(device)
        stats = time_torch(lambda: ta @ tb, repeats, min_time, 1, threads, device)
    return dict(library=library, device=device, n=n, dtype=str(np.dtype(dtype)),
                gflops=2 * n**3 / stats["median"] / 1e9, time_s=stats)
