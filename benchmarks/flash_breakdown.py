"""``python -m benchmarks.flash_breakdown``: where the tuned FlashAttention kernel's time goes.

Three measurements, one thread unless stated (the kernel runs each (batch, head) slice on one
core, so a core's throughput is what bounds it; two cores halve the totals):

1. Roofline pieces (the best of many samples): float32 matmul GFLOP/s at a large square size
   and at the kernel's tile shapes, and the element-wise throughput of np.exp, np.exp2 and the
   other ufuncs the kernel uses, on arrays of a tile's size (in L2) and on large ones; with
   ``--torch``, torch's matmul and exp at a tile's size too.
2. The kernel itself, line by line, over every slice of B=4, nh=8, T=S=2048, hs=64: a trace
   function (``LineClock``, through ``sys.settrace``) that Python calls at each line the
   kernel's own functions run reads the clock there, so each line of
   numpy_attn/kernels/flash_attention.py gets the seconds until the next one (calls it makes
   into other modules included) and its count of runs. Nothing is copied from the kernel and
   nothing is added to it: what is timed is what runs, and a change to the kernel is measured
   as it stands. The forward runs once more forced onto its shifted path (the running maximum),
   where it falls back when exponentials could overflow. The untraced kernel is timed beside
   each, so the tracer's own cost (about a microsecond a line) shows as the difference.
3. The thread pool: the kernel's pool on a no-op slice function, the kernel at 1 and 2 threads,
   causal and not, and how far two threads overlap the kernel's own calls (its exponential and
   its scores' matmul at a diagonal piece's size and at a tile's): NumPy releases the GIL inside
   each, but a short call costs a GIL hand-over between the threads. The same is measured of a
   sleep (which overlaps) and of a Python loop (which takes turns), and the report says whether
   the run told those two apart: on a busy machine it may not.
4. With ``--torch``, NumPy's floor: in one process, one thread for each library (then two, where
   there are two cores: the loops and the kernel spread their slices over two threads), taking turns
   round after round, F.scaled_dot_product_attention against the bare tile loops the kernel is
   built on (the forward's two matmuls per tile, then with the kernel's EXP added; the backward's five
   matmuls, exp and multiply) and against the kernel itself. The loops do nothing else: no
   checks, no causal mask, no accumulation, so their time is what any NumPy kernel with these
   tiles must spend, and their ratio to F.sdpa is the best ratio such a kernel can reach.

Prints a table and, from the roofline, the lower bound on the kernel's time; ``--json FILE``
saves everything. The load average is printed with each part: on a shared machine the absolute
times move with it, the shares much less.
"""

import argparse
import contextlib
import inspect
import linecache
import math
import os
import statistics
import sys
import threading
import time
from collections import defaultdict
from functools import partial

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

import numpy_attn.kernels.flash_attention as fa
from benchmarks import report

B, NH, T, HS = 4, 8, 2048, 64
# The kernel's default tile shape (block_q, block_k).
KERNEL_BLOCK = tuple(inspect.signature(fa.flash_attention_forward).parameters[name].default
                     for name in ("block_q", "block_k"))


def _median_time(fn, repeats, number=1):
    return statistics.median(_times(fn, repeats, number))


def _best_time(fn, repeats, number=1):
    """The fastest sample: on a shared machine, the one least disturbed by other processes,
    which is what a rate meant as a ceiling (the roofline) should use. One call per sample:
    a call of a tile's size (0.1 ms) often runs whole between two preemptions."""
    return min(_times(fn, repeats, number))


def _times(fn, repeats, number):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - start) / number)
    return times


# -- 1. roofline pieces --------------------------------------------------------------------------

def roofline(repeats, block):
    rng = np.random.default_rng(0)
    f32 = np.float32
    res = dict(matmul={}, ufunc={})
    n = 2048
    a, b = (rng.standard_normal((n, n)).astype(f32) for _ in range(2))
    c = np.empty_like(a)
    for threads in (1, 2):
        with threadpool_limits(threads, user_api="blas"):
            t = _best_time(lambda: np.matmul(a, b, out=c), max(3, repeats // 4))
        res["matmul"][f"{n}x{n}x{n}, {threads} thread(s)"] = 2 * n**3 / t / 1e9
    with threadpool_limits(1, user_api="blas"):
        for bq, bk in dict.fromkeys((tuple(block), (128, 512), (128, 256), (256, 256), (64, 512), (256, 512))):
            q = rng.standard_normal((bq, HS)).astype(f32)
            k_t = rng.standard_normal((HS, bk)).astype(f32)
            s = np.empty((bq, bk), f32)
            v_1 = rng.standard_normal((bk, HS + 1)).astype(f32)
            pv = np.empty((bq, HS + 1), f32)
            t1 = _best_time(lambda q=q, k_t=k_t, s=s: np.matmul(q, k_t, out=s), 5 * repeats)
            t2 = _best_time(lambda s=s, v_1=v_1, pv=pv: np.matmul(s, v_1, out=pv), 5 * repeats)
            t3 = _best_time(lambda s=s, pv=pv: np.matmul(s.T, pv[:, :HS]), 5 * repeats)
            res["matmul"][f"tile {bq}x{bk}: q_blk @ k^T"] = 2 * bq * bk * HS / t1 / 1e9
            res["matmul"][f"tile {bq}x{bk}: p @ [v | 1]"] = 2 * bq * bk * (HS + 1) / t2 / 1e9
            res["matmul"][f"tile {bq}x{bk}: p^T @ dout"] = 2 * bq * bk * HS / t3 / 1e9
    for shape in (tuple(block), (2048, 2048)):
        x = (rng.standard_normal(shape) * 3 - 3).astype(f32)
        y = np.empty_like(x)
        ufuncs = {"exp": lambda x, y: np.exp(x, out=y), "exp2": lambda x, y: np.exp2(x, out=y),
                  "max over rows": lambda x, y: x.max(axis=1),
                  "subtract a column": lambda x, y: np.subtract(x, x[:, :1], out=y),
                  "multiply": lambda x, y: np.multiply(x, x, out=y),
                  "add": lambda x, y: np.add(x, y, out=y)}
        for name, ufunc in ufuncs.items():
            fn = partial(ufunc, x, y)
            t = _best_time(fn, 5 * repeats if x.size < 1e6 else max(3, repeats // 4))
            res["ufunc"][f"{name} {shape[0]}x{shape[1]}"] = x.size / t / 1e9
    return res


def torch_pieces(repeats, block):
    """The same pieces in torch, one thread: what F.scaled_dot_product_attention's fused loop is
    built from (its exp is vectorized with AVX2 and runs on tiles already in cache)."""
    import torch

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    res = {}
    bq, bk = block
    q = torch.randn(bq, HS, generator=g)
    k_t = torch.randn(HS, bk, generator=g)
    s = torch.empty(bq, bk)
    v = torch.randn(bk, HS, generator=g)
    pv = torch.empty(bq, HS)
    t1 = _best_time(lambda: torch.matmul(q, k_t, out=s), 5 * repeats)
    t2 = _best_time(lambda: torch.matmul(s, v, out=pv), 5 * repeats)
    res[f"torch matmul tile {bq}x{bk}: q_blk @ k^T GFLOP/s"] = 2 * bq * bk * HS / t1 / 1e9
    res[f"torch matmul tile {bq}x{bk}: p @ v GFLOP/s"] = 2 * bq * bk * HS / t2 / 1e9
    x = torch.randn(bq, bk, generator=g) * 3 - 3
    y = torch.empty_like(x)
    res[f"torch exp {bq}x{bk} Gelem/s"] = x.numel() / _best_time(lambda: torch.exp(x, out=y), 5 * repeats) / 1e9
    return res


# -- 2. the kernel, line by line -------------------------------------------------------------------

class LineClock:
    """Seconds and runs per source line of one module's functions, from a ``sys.settrace`` hook.

    Python calls the hook at each line of a traced frame; the time from one line to the next is
    the earlier line's. A call into another of the module's functions pauses the caller's line
    until the callee returns; calls into other modules are part of the calling line. Only this
    thread is traced: run the kernel on one thread (``one_thread``).
    """

    def __init__(self, module):
        self.file = module.__file__
        self.seconds = defaultdict(float)          # (function, line) -> seconds
        self.count = defaultdict(int)              # (function, line) -> runs
        self._where, self._since = None, 0.0

    def _credit(self, where):
        now = time.perf_counter()
        if self._where is not None:
            self.seconds[self._where] += now - self._since
        self._where = where
        self._since = time.perf_counter()          # the hook's own bookkeeping is nobody's line

    def _local(self, frame, event, arg):
        if event == "line":
            where = (frame.f_code.co_name, frame.f_lineno)
            self.count[where] += 1
            self._credit(where)
        elif event == "return":                    # back to the caller's line, if it is ours
            caller = frame.f_back
            self._credit((caller.f_code.co_name, caller.f_lineno)
                         if caller is not None and caller.f_code.co_filename == self.file else None)
        return self._local

    def _call(self, frame, event, arg):
        if frame.f_code.co_filename != self.file:
            return None                            # not ours: its lines are not traced
        self._credit(None)
        return self._local

    @contextlib.contextmanager
    def running(self):
        old = sys.gettrace()
        sys.settrace(self._call)
        try:
            yield self
        finally:
            sys.settrace(old)
            self._credit(None)

    def lines(self):
        """{"function:line source": seconds} and {same: runs}, the source read from the module."""
        def label(where):
            return f"{where[0]}:{where[1]} {linecache.getline(self.file, where[1]).strip()}"
        return ({label(w): t for w, t in self.seconds.items()},
                {label(w): self.count[w] for w in self.seconds})


@contextlib.contextmanager
def one_thread():
    """The kernel on this thread only (its pool off) and BLAS on one thread."""
    old_min_work, fa.PARALLEL_MIN_WORK = fa.PARALLEL_MIN_WORK, 1 << 62
    try:
        with threadpool_limits(1, user_api="blas"):
            yield
    finally:
        fa.PARALLEL_MIN_WORK = old_min_work


def _traced(fn):
    """(what fn returned, {"total", "groups", "calls", "tiles", ...}) of one traced call, with
    the untraced call's time beside it."""
    fn()                                           # warm-up: first calls allocate and page in
    start = time.perf_counter()
    fn()
    untraced = time.perf_counter() - start
    clock = LineClock(fa)
    start = time.perf_counter()
    with clock.running():
        result = fn()
    total = time.perf_counter() - start
    groups, calls = clock.lines()
    # Every tile runs each of its matmul lines once: the most-run matmul line counts the tiles.
    tiles = max((n for line, n in calls.items() if "np.matmul(" in line), default=0)
    return result, dict(total=total, untraced=untraced, groups=groups, calls=calls, tiles=tiles,
                        python_and_clock=total - sum(groups.values()))


def instrumented(is_causal, block_q, block_k):
    """The kernel's forward, its forward forced onto the shifted path, and its backward, each
    traced line by line over all B*nh slices on one thread."""
    rng = np.random.default_rng(0)
    q, k, v, dout = (rng.standard_normal((B, NH, T, HS)).astype(np.float32) for _ in range(4))
    kw = dict(is_causal=is_causal, block_q=block_q, block_k=block_k)
    result = {}
    with one_thread():
        (out, cache), result["forward"] = _traced(lambda: fa.flash_attention_forward(q, k, v, **kw))
        grads, result["backward"] = _traced(lambda: fa.flash_attention_backward(dout, cache))
        # Tracing changes no arithmetic: the traced results are the kernel's, bit for bit.
        ref_out, ref_cache = fa.flash_attention_forward(q, k, v, **kw)
        errors = {"out": float(np.abs(out - ref_out).max())}
        for name, a, b in zip(("dq", "dk", "dv"), grads, fa.flash_attention_backward(dout, ref_cache),
                              strict=True):
            errors[name] = float(np.abs(a - b).max())
        result["max_abs_error_vs_kernel"] = errors
        if hasattr(fa, "UNSHIFTED_MIN_SUM"):       # no block passes the check: all shifted
            old, fa.UNSHIFTED_MIN_SUM = fa.UNSHIFTED_MIN_SUM, np.inf
            try:
                _, result["forward_shifted"] = _traced(lambda: fa.flash_attention_forward(q, k, v, **kw))
            finally:
                fa.UNSHIFTED_MIN_SUM = old
    return result


# -- 3. the thread pool ---------------------------------------------------------------------------

def thread_pool(repeats):
    res = {}
    res["pool: 32 no-op slices"] = _median_time(lambda: fa._map_slices(lambda n: None, 32, 1 << 40), repeats)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, NH, T, HS)).astype(np.float32) for _ in range(3))
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    for threads in (2, 1):
        if cpus and threads < len(cpus):
            os.sched_setaffinity(0, cpus[:threads])
        with threadpool_limits(threads, user_api="blas"):
            for causal in (False, True):
                res[f"kernel forward{', causal' if causal else ''}, {threads} thread(s)"] = _median_time(
                    partial(fa.flash_attention_forward, q, k, v, is_causal=causal), max(3, repeats // 10))
    if cpus:
        os.sched_setaffinity(0, cpus)
    return res


def two_thread_scaling(fn, calls, rounds):
    """How far two threads overlap ``fn(calls)``: twice its time on one thread over its time run
    on two threads at once, median over rounds. 2 if they overlap fully, 1 if they take turns
    (a call that holds the GIL throughout, or one so short that handing the GIL over costs as
    much as the call)."""
    ratios, per_call = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        fn(calls)
        one = time.perf_counter() - start
        pair = [threading.Thread(target=fn, args=(calls,)) for _ in range(2)]
        start = time.perf_counter()
        for thread in pair:
            thread.start()
        for thread in pair:
            thread.join()
        two = time.perf_counter() - start
        ratios.append(2 * one / two)
        per_call.append(one / calls)
    return dict(call_s=statistics.median(per_call), scaling=statistics.median(ratios))


# The tool's own check of two_thread_scaling, run beside the kernel's calls: a sleep lets go of the
# GIL, so two threads overlap it (near 2); a Python loop holds it, so they take turns (near 1). On
# a busy machine the other processes' threads take the cores too and both drift; beyond these
# limits the scalings of that run cannot tell overlapping calls from ones that take turns.
OVERLAP_AT_LEAST, TAKE_TURNS_AT_MOST = 1.6, 1.3


def _sleeps(n):
    for _ in range(n):
        time.sleep(0.002)


def _spins(n):
    """A fixed amount of Python work (a loop to a deadline would overlap in wall time)."""
    for _ in range(n):
        total = 0
        for i in range(20000):
            total += i


def scaling_check():
    """two_thread_scaling of calls whose answer is known: {"sleep": ..., "python loop": ...}."""
    return {"sleep": two_thread_scaling(_sleeps, 10, 3), "python loop": two_thread_scaling(_spins, 10, 3)}


def scaling_check_line(check):
    """What the check says of the run's scalings: that they tell the two apart, or that they do not."""
    sleep, loop = check["sleep"]["scaling"], check["python loop"]["scaling"]
    told = sleep >= OVERLAP_AT_LEAST and loop <= TAKE_TURNS_AT_MOST
    return (f"  check: a sleep scales {sleep:.2f} (overlaps: {OVERLAP_AT_LEAST} or more), a Python loop {loop:.2f} "
            f"(takes turns: {TAKE_TURNS_AT_MOST} or less): "
            + ("the scalings above tell the two apart" if told else
               "NOT MET, the machine was too busy for the scalings above to tell overlap from taking turns"))


def call_scaling(repeats, block):
    """two_thread_scaling of the kernel's own calls, BLAS on one thread as in its pool: the
    exponential and the scores' matmul at a diagonal piece's size (DIAG_ROWS rows against
    block_q keys) and at a whole tile's (block_q x block_k)."""
    rng = np.random.default_rng(0)
    res = {}
    for rows, cols in ((fa.DIAG_ROWS, block[0]), tuple(block)):
        s_in = -20 * rng.random((rows, cols), dtype=np.float32)    # exponentials that neither overflow nor underflow
        q_1 = rng.standard_normal((rows, HS + 1), dtype=np.float32)
        k_t = rng.standard_normal((HS + 1, cols), dtype=np.float32)
        calls = max(50, int(repeats * 2e6 / (rows * cols)))         # 6e7 scores at 30 repeats: 20 ms of np.exp2

        def exp(n, s_in=s_in):
            s = np.empty_like(s_in)
            for _ in range(n):
                fa.EXP(s_in, out=s)

        def matmul(n, q_1=q_1, k_t=k_t):
            s = np.empty((q_1.shape[0], k_t.shape[1]), np.float32)
            for _ in range(n):
                np.matmul(q_1, k_t, out=s)

        with threadpool_limits(1, user_api="blas"):
            res[f"np.{fa.EXP.__name__} on ({rows}, {cols})"] = two_thread_scaling(exp, calls, 5)
            res[f"matmul ({rows}, {HS + 1}) @ ({HS + 1}, {cols})"] = two_thread_scaling(matmul, calls, 5)
    return res


# -- 4. NumPy's floor against F.sdpa ------------------------------------------------------------------

def _bare_forward(q, k_t, v_1, block_q, block_k, with_exp):
    """The forward's tile loop and nothing else: per tile q_blk @ k^T, exp in place, p @ [v | 1];
    its (batch, head) slices spread over threads by the kernel's own pool (kernel_threads)."""
    def one(n):
        s = np.empty((block_q, block_k), np.float32)
        pv = np.empty((block_q, v_1.shape[-1]), np.float32)
        with np.errstate(over="ignore"):             # errstate is per thread
            for i0 in range(0, T, block_q):
                for j0 in range(0, T, block_k):
                    np.matmul(q[n, i0:i0 + block_q], k_t[n, :, j0:j0 + block_k], out=s)
                    if with_exp:
                        fa.EXP(s, out=s)             # the kernel's base: np.exp2 with AVX-512
                    np.matmul(s, v_1[n, j0:j0 + block_k], out=pv)
    fa._map_slices(one, len(q), len(q) * T * T * HS)


def _bare_backward(q_1, k_1, v_1, q, k, dout, dout_1, block_q, block_k):
    """The backward's tile loop and nothing else: five matmuls, exp and one multiply per tile,
    its slices spread as _bare_forward's."""
    def one(n):
        s = np.empty((block_q, block_k), np.float32)
        dp = np.empty((block_q, block_k), np.float32)
        dkv = np.empty((block_k, HS), np.float32)
        dq = np.empty((block_q, HS), np.float32)
        with np.errstate(over="ignore"):
            for j0 in range(0, T, block_k):
                for i0 in range(0, T, block_q):
                    np.matmul(q_1[n, i0:i0 + block_q], k_1[n, :, j0:j0 + block_k], out=s)
                    fa.EXP(s, out=s)
                    np.matmul(s.T, dout[n, i0:i0 + block_q], out=dkv)
                    np.matmul(dout_1[n, i0:i0 + block_q], v_1[n, :, j0:j0 + block_k], out=dp)
                    np.multiply(dp, s, out=dp)
                    np.matmul(dp.T, q[n, i0:i0 + block_q], out=dkv)
                    np.matmul(dp, k[n, j0:j0 + block_k], out=dq)
    fa._map_slices(one, len(q), len(q) * T * T * HS)


@contextlib.contextmanager
def kernel_threads(threads):
    """The kernel on ``threads`` threads: one_thread() for 1, else its own pool of that size."""
    if threads < 2:
        with one_thread():
            yield
        return
    old_count, fa._cpu_count = fa._cpu_count, lambda: threads
    try:
        yield
    finally:
        fa._cpu_count = old_count


def floor(rounds, block_q, block_k, threads=1):
    """Median seconds per case and the median, over rounds, of each case's ratio to F.sdpa in the
    same round (forward cases to its forward, forward+backward cases to its forward+backward),
    each library on ``threads`` threads."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    q, k, v, dout = (rng.standard_normal((B, NH, T, HS)).astype(np.float32) for _ in range(4))
    q3, k3, v3, dout3 = (a.reshape(B * NH, T, HS) for a in (q, k, v, dout))
    ones = np.ones((B * NH, T, 1), np.float32)
    q_s = q3 / np.float32(math.sqrt(HS))
    k_t = np.ascontiguousarray(k3.transpose(0, 2, 1))                 # (N, hs, T)
    v_1 = np.concatenate([v3, ones], axis=2)                           # (N, T, hs+1)
    q_1 = np.concatenate([q_s, -ones], axis=2)                         # [q scale | -lse], lse = 1 here
    k_1 = np.concatenate([k_t, ones.transpose(0, 2, 1)], axis=1)       # (N, hs+1, T)
    dout_1 = np.concatenate([dout3, -ones], axis=2)
    v_1t = np.ascontiguousarray(v_1.transpose(0, 2, 1))                # (N, hs+1, T)
    tq, tk, tv, tdout = map(torch.from_numpy, (q, k, v, dout))

    def sdpa_forward():
        with torch.no_grad():
            F.scaled_dot_product_attention(tq, tk, tv)

    def sdpa_forward_backward():
        leaves = [t.detach().requires_grad_() for t in (tq, tk, tv)]
        F.scaled_dot_product_attention(*leaves).backward(tdout)

    def kernel_forward_backward():
        fa.flash_attention_backward(dout, fa.flash_attention_forward(q, k, v, block_q=block_q, block_k=block_k)[1])

    forward = {
        "F.sdpa forward": sdpa_forward,
        "NumPy tiles, 2 matmuls": partial(_bare_forward, q_s, k_t, v_1, block_q, block_k, False),
        "NumPy tiles, 2 matmuls + EXP (the floor)": partial(_bare_forward, q_s, k_t, v_1, block_q, block_k, True),
        "kernel forward": partial(fa.flash_attention_forward, q, k, v, block_q=block_q, block_k=block_k),
    }
    backward = {
        "F.sdpa forward+backward": sdpa_forward_backward,
        "NumPy tiles, forward floor + backward's 5 matmuls, exp, multiply": lambda: (
            forward["NumPy tiles, 2 matmuls + EXP (the floor)"](),
            _bare_backward(q_1, k_1, v_1t, q3, k3, dout3, dout_1, block_q, block_k)),
        "kernel forward+backward": kernel_forward_backward,
    }
    times = {name: [] for name in (*forward, *backward)}
    with kernel_threads(threads), np.errstate(over="ignore"):   # the kernel and the loops on as many threads
        for fn in (*forward.values(), *backward.values()):
            fn()
        for _ in range(rounds):
            for name, fn in (*forward.items(), *backward.items()):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    res = {}
    for group, base in ((forward, "F.sdpa forward"), (backward, "F.sdpa forward+backward")):
        for name in group:
            res[name] = dict(median_s=statistics.median(times[name]),
                             over_sdpa=statistics.median(a / b for a, b in zip(times[name], times[base], strict=True)),
                             times_s=times[name])
    return res


def _is_matmul_or_exp(label):
    """A traced line that multiplies tiles or exponentiates them (an older run's group names too)."""
    return "np.matmul(" in label or "EXP(" in label or label.startswith(("matmul", "exp"))


def lower_bound(roof, inst, block):
    """Seconds on one core that the matmuls and exponentials alone need at the best measured
    rates, and the share of the instrumented run that matmuls and exponentials took."""
    flops_fwd = 4 * B * NH * T * T * HS
    exps = B * NH * T * T
    bq, bk = block
    tile_gflops = roof["matmul"][f"tile {bq}x{bk}: q_blk @ k^T"]
    exp_rate = roof["ufunc"][f"{'exp2' if fa.EXP is np.exp2 else 'exp'} {bq}x{bk}"]
    fwd = flops_fwd / tile_gflops / 1e9 + exps / exp_rate / 1e9
    bwd = 2.5 * flops_fwd / tile_gflops / 1e9 + exps / exp_rate / 1e9
    shares = {part: sum(t for name, t in inst[part]["groups"].items() if _is_matmul_or_exp(name))
              / inst[part]["total"] for part in ("forward", "backward")}
    return dict(matmul_and_exp_share=shares, forward_one_core=fwd, backward_one_core=bwd, forward_two_cores=fwd / 2,
                backward_two_cores=bwd / 2, tile_gflops=tile_gflops, exp_gelem_s=exp_rate,
                forward_flops=flops_fwd, exps=exps)


def is_breakdown(res):
    """Whether a saved JSON file is this tool's (``python -m benchmarks --from-json`` asks)."""
    return isinstance(res, dict) and "instrumented" in res and "roofline" in res


def report_lines(res):
    """The printed report of a run (also of one saved with --json, older runs included)."""
    inst = res["instrumented"]
    lines = [f"BLAS {res['blas']}; kernel exponentiates with np.{res['exp']}; tiles {res['block']}; "
             f"load average {' '.join(f'{x:.2f}' for x in res['load'])}"]
    for part in ("matmul", "ufunc"):
        for name, rate in res["roofline"][part].items():
            lines.append(f"  {part:6} {name:40} {rate:7.2f} {'GFLOP/s' if part == 'matmul' else 'Gelem/s'}")
    for part in ("forward", "forward_shifted", "backward"):
        if part not in inst:                        # runs before the shifted path was traced
            continue
        r = inst[part]
        lines.append(f"{part}: {r['total']:.3f} s on one thread, {r['tiles']} tiles"
                     + (f" ({r['untraced']:.3f} s untraced)" if "untraced" in r else ""))
        width = max(map(len, r["groups"]), default=0)
        for name, sec in sorted(r["groups"].items(), key=lambda x: -x[1]):
            lines.append(f"  {name:{width}} {sec:7.3f} s  {100 * sec / r['total']:5.1f}%  "
                         f"{r['calls'][name]:7d} x {1e6 * sec / r['calls'][name]:8.1f} us")
        lines.append(f"  {'the rest (calls and returns, the clock)':{width}} {r['python_and_clock']:7.3f} s  "
                     f"{100 * r['python_and_clock'] / r['total']:5.1f}%")
    lines.append("the traced run against the kernel, max abs difference: " + ", ".join(
        f"{k} {v:.1e}" for k, v in inst["max_abs_error_vs_kernel"].items()))
    for name, t in inst.get("shifted_extras_per_tile", {}).items():   # older runs measured these apart
        lines.append(f"  shifted path, {name:40} {1e6 * t:7.1f} us per tile")
    for name, t in res["thread_pool"].items():
        lines.append(f"{name:42} {1e3 * t:8.2f} ms")
    if res.get("call_scaling"):
        lines.append("two threads at once, each making the same calls (scaling 2: they overlap; 1: they take turns):")
        for name, r in res["call_scaling"].items():
            lines.append(f"  {name:40} {1e6 * r['call_s']:8.1f} us a call on one thread, scaling {r['scaling']:.2f}")
        if res.get("scaling_check"):               # runs before the check was made have none
            lines.append(scaling_check_line(res["scaling_check"]))
    for name, rate in res.get("torch", {}).items():
        lines.append(f"  {name:50} {rate:7.2f}")
    for key, threads in (("floor", "one thread"), ("floor_two_threads", "two threads")):
        if key not in res:                          # runs before the two-thread floor have one only
            continue
        rounds = len(next(iter(res[key].values()))["times_s"])
        lines.append(f"NumPy's floor, {threads} each, {rounds} rounds taking turns (ratio: median over "
                     "rounds of time / F.sdpa's time in the same round; above 1: slower than F.sdpa):")
        for name, r in res[key].items():
            lines.append(f"  {name:66} {1e3 * r['median_s']:8.1f} ms  {r['over_sdpa']:.3f}")
    lb = res["lower_bound"]
    lines += [f"lower bound at {lb['tile_gflops']:.1f} GFLOP/s and {lb['exp_gelem_s']:.2f} Gexp/s per core: "
              f"forward {lb['forward_one_core']:.3f} s on one core ({lb['forward_two_cores']:.3f} s on two), "
              f"backward {lb['backward_one_core']:.3f} s ({lb['backward_two_cores']:.3f} s on two)",
              "matmuls and exponentials took " + ", ".join(
                  f"{100 * v:.1f}% of the {k}" for k, v in lb["matmul_and_exp_share"].items())]
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.flash_breakdown", description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--block", type=int, nargs=2, default=list(KERNEL_BLOCK), metavar=("BLOCK_Q", "BLOCK_K"),
                   help="tile shape; default the kernel's, %(default)s")
    p.add_argument("--causal", action="store_true", help="break down the causal kernel")
    p.add_argument("--torch", action="store_true", help="also time torch's matmul and exp at a tile's size, "
                   "and NumPy's floor against F.scaled_dot_product_attention")
    p.add_argument("--rounds", type=int, default=7, help="rounds of the floor comparison; default 7")
    p.add_argument("--json", metavar="FILE", help="save the results (python -m benchmarks --from-json "
                   "FILE prints them again)")
    p.add_argument("--force", action="store_true", help="overwrite the --json file if it exists")
    args = p.parse_args(argv)
    report.check_outputs(p, args)                       # before the run, not after it
    res = dict(blas=[{k: i.get(k) for k in ("internal_api", "version", "architecture")}
                     for i in threadpool_info() if i["user_api"] == "blas"],
               exp=fa.EXP.__name__, block=args.block, causal=args.causal, load=[os.getloadavg()[0]])
    res["roofline"] = roofline(args.repeats, args.block)
    res["load"].append(os.getloadavg()[0])
    res["instrumented"] = instrumented(args.causal, *args.block)
    res["load"].append(os.getloadavg()[0])
    res["thread_pool"] = thread_pool(args.repeats)
    res["call_scaling"] = call_scaling(args.repeats, args.block) if fa._cpu_count() > 1 else {}
    res["scaling_check"] = scaling_check() if res["call_scaling"] else {}
    res["load"].append(os.getloadavg()[0])
    res["lower_bound"] = lower_bound(res["roofline"], res["instrumented"], args.block)
    if args.torch:
        res["torch"] = torch_pieces(args.repeats, args.block)
        res["floor"] = floor(args.rounds, *args.block)
        if fa._cpu_count() > 1:
            res["floor_two_threads"] = floor(args.rounds, *args.block, threads=2)
        res["load"].append(os.getloadavg()[0])
    if args.json:
        report.write_json(res, args.json)
    print("\n".join(report_lines(res)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
