"""``python -m benchmarks.flash_breakdown``: where the tuned FlashAttention kernel's time goes.

Three measurements, one thread unless stated (the kernel runs each (batch, head) slice on one
core, so a core's throughput is what bounds it; two cores halve the totals):

1. Roofline pieces (the best of many samples): float32 matmul GFLOP/s at a large square size
   and at the kernel's tile shapes, and the element-wise throughput of np.exp, np.exp2 and the
   other ufuncs the kernel uses, on arrays of a tile's size (in L2) and on large ones; with
   ``--torch``, torch's matmul and exp at a tile's size too.
2. An instrumented copy of the kernel's forward and backward loops (the same statements, with a
   clock around each group) run over every slice of B=4, nh=8, T=S=2048, hs=64: seconds per
   group (matmuls, exponentials, row reductions, rescaling, masks, accumulation), and the rest
   of the measured time, which is Python: the loop, slicing, reshapes, calls. The copy's
   results are checked against the kernel's.
3. The thread pool: the kernel's pool on a no-op slice function, and the kernel at 1 and 2 threads.
4. With ``--torch``, NumPy's floor: in one process, one thread for each library, taking turns
   round after round, F.scaled_dot_product_attention against the bare tile loops the kernel is
   built on (the forward's two matmuls per tile, then with np.exp added; the backward's five
   matmuls, exp and multiply) and against the kernel itself. The loops do nothing else: no
   checks, no causal mask, no accumulation, so their time is what any NumPy kernel with these
   tiles must spend, and their ratio to F.sdpa is the best ratio such a kernel can reach.

Prints a table and, from the roofline, the lower bound on the kernel's time; ``--json FILE``
saves everything. The load average is printed with each part: on a shared machine the absolute
times move with it, the shares much less.
"""

import argparse
import inspect
import json
import math
import os
import statistics
import sys
import time
from collections import defaultdict
from functools import partial
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

import numpy_attn.kernels.flash_attention as fa

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


# -- 2. instrumented copy of the kernel's loops ------------------------------------------------------

class Clock:
    """Accumulates seconds per label: ``with clock("exp"): ...``."""

    def __init__(self):
        self.seconds = defaultdict(float)
        self.count = defaultdict(int)
        self._label = None

    def __call__(self, label):
        self._label = label
        return self

    def __enter__(self):
        self._start = time.perf_counter()

    def __exit__(self, *exc):
        self.seconds[self._label] += time.perf_counter() - self._start
        self.count[self._label] += 1


def forward_slice(clock, q, k, v, out, lse_b, is_causal, scale, block_q, block_k):
    """fa._forward_slice with a clock on each group of statements (the unshifted path)."""
    S, hv = v.shape
    dtype = q.dtype
    with clock("per slice: k^T, [v | 1], buffers"):
        k_t = np.ascontiguousarray(k.T)
        v_1 = np.ones((S, hv + 1), dtype)
        v_1[:, :hv] = v
        s_buf = np.empty(block_q * block_k, dtype)
        pv_buf = np.empty(block_q * (hv + 1), dtype)
        future = fa._future_mask(block_q, len(q), dtype) if is_causal else None
    for i0 in range(0, len(q), block_q):
        i1 = min(i0 + block_q, len(q))
        with clock("per row block: scale q, zero acc"):
            q_blk = q[i0:i1] * (scale * fa.LOG_FACTOR)
            acc = np.zeros((i1 - i0, hv + 1), dtype)
        S_seen = min(S, i1) if is_causal else S
        pv = pv_buf[:(i1 - i0) * (hv + 1)].reshape(i1 - i0, hv + 1)
        bq = i1 - i0
        for j0 in range(0, S_seen, block_k):
            j1 = min(j0 + block_k, S_seen)
            with clock("matmul q_blk @ k^T"):
                s = np.matmul(q_blk, k_t[:, j0:j1], out=s_buf[:bq * (j1 - j0)].reshape(bq, j1 - j0))
            if is_causal and j1 - 1 > i0:
                with clock("causal mask"):
                    fa._mask_future(s, i0, j0, future)
            with clock("exp"):
                p = fa.EXP(s, out=s)
            with clock("matmul p @ [v | 1]"):
                pv = np.matmul(p, v_1[j0:j1], out=pv)
            with clock("accumulate acc += pv"):
                acc += pv
        with clock("per row block: overflow/underflow check"):
            ok = bool(np.isfinite(acc).all() and acc[:, -1].min() >= fa.UNSHIFTED_MIN_SUM)
        with clock("per row block: out = acc / l, lse = log l"):
            row_sum = acc[:, hv]
            out[i0:i1] = acc[:, :hv] / row_sum[:, None]
            lse_b[i0:i1] = fa.LOG(row_sum)
        assert ok, "the instrumented copy only follows the unshifted path"


def shifted_tile_extras(clock, bq, bk, repeats):
    """What the running maximum costs per tile (the shifted path; the kernel before the
    unshifted path): row max, new maximum, rescale of acc, subtract the maximum."""
    rng = np.random.default_rng(0)
    s = rng.standard_normal((bq, bk)).astype(np.float32)
    acc = np.ones((bq, HS + 1), np.float32)
    m = np.zeros(bq, np.float32)
    return {
        "row max s.max(axis=1) and np.maximum": _median_time(lambda: np.maximum(m, s.max(axis=1)), repeats, 20),
        "rescale acc *= exp(m - m_new)": _median_time(lambda: acc.__imul__(fa.EXP(m - m)[:, None]), repeats, 20),
        "subtract s -= m[:, None]": _median_time(lambda: s.__isub__(m[:, None]), repeats, 20),
    }


def backward_slice(clock, q, k, v, out, dout, lse_b, dq, dk, dv, is_causal, scale, block_q, block_k):
    """fa._backward_slice with a clock on each group of statements."""
    g, T_, hs = q.shape
    S, hv = v.shape
    dtype = q.dtype
    with clock("per slice: [k | 1], [v | 1], buffers"):
        k_1 = np.ones((hs + 1, S), dtype)
        k_1[:hs] = k.T
        v_1 = np.ones((hv + 1, S), dtype)
        v_1[:hv] = v.T
        q_lse = np.empty((T_, hs + 1), dtype)
        dout_D = np.empty((T_, hv + 1), dtype)
        s_buf = np.empty(block_q * block_k, dtype)
        dp_buf = np.empty(block_q * block_k, dtype)
        dkv_buf = np.empty(block_k * max(hs, hv), dtype)
        dq_buf = np.empty(block_q * hs, dtype)
        future = fa._future_mask(block_q, T_, dtype) if is_causal else None
    for h in range(g):
        with clock("per head: [q scale | -lse], [dout | -D]"):
            np.multiply(q[h], scale * fa.LOG_FACTOR, out=q_lse[:, :hs])
            np.negative(lse_b[h], out=q_lse[:, hs])
            dout_D[:, :hv] = dout[h]
            np.negative(np.einsum("ij,ij->i", dout[h], out[h]), out=dout_D[:, hv])
        dq_h = dq[h]
        for j0 in range(0, S, block_k):
            j1 = min(j0 + block_k, S)
            i_first = j0 // block_q * block_q if is_causal else 0
            for i0 in range(i_first, T_, block_q):
                i1 = min(i0 + block_q, T_)
                shape = (i1 - i0, j1 - j0)
                with clock("matmul [q | -lse] @ [k | 1]^T"):
                    s = np.matmul(q_lse[i0:i1], k_1[:, j0:j1], out=s_buf[:shape[0] * shape[1]].reshape(shape))
                if is_causal and j1 - 1 > i0:
                    with clock("causal mask"):
                        fa._mask_future(s, i0, j0, future)
                with clock("exp"):
                    p = fa.EXP(s, out=s)
                with clock("matmul p^T @ dout"):
                    dv_tile = np.matmul(p.T, dout[h, i0:i1], out=dkv_buf[:(j1 - j0) * hv].reshape(j1 - j0, hv))
                with clock("accumulate dv, dk, dq"):
                    dv[j0:j1] += dv_tile
                with clock("matmul [dout | -D] @ [v | 1]^T"):
                    dp = np.matmul(dout_D[i0:i1], v_1[:, j0:j1], out=dp_buf[:shape[0] * shape[1]].reshape(shape))
                with clock("multiply dS = P * (dP - D)"):
                    ds = np.multiply(dp, p, out=dp)
                with clock("matmul dS^T @ q"):
                    dk_tile = np.matmul(ds.T, q[h, i0:i1], out=dkv_buf[:(j1 - j0) * hs].reshape(j1 - j0, hs))
                with clock("accumulate dv, dk, dq"):
                    dk[j0:j1] += dk_tile
                with clock("matmul dS @ k"):
                    dq_tile = np.matmul(ds, k[j0:j1], out=dq_buf[:(i1 - i0) * hs].reshape(i1 - i0, hs))
                with clock("accumulate dv, dk, dq"):
                    dq_h[i0:i1] += dq_tile
        with clock("per head: scale dq"):
            dq_h *= scale
    with clock("per head: scale dq"):
        dk *= scale


def instrumented(is_causal, block_q, block_k):
    """Seconds per group over all B*nh slices, serially on one thread, and the total."""
    rng = np.random.default_rng(0)
    q, k, v, dout = (rng.standard_normal((B * NH, T, HS)).astype(np.float32) for _ in range(4))
    scale = np.float32(1 / math.sqrt(HS))
    out = np.zeros_like(q)
    lse_b = np.zeros((B * NH, T), np.float32)
    result = {}
    with threadpool_limits(1, user_api="blas"):
        clock = Clock()
        start = time.perf_counter()
        for n in range(B * NH):
            forward_slice(clock, q[n], k[n], v[n], out[n], lse_b[n], is_causal, scale, block_q, block_k)
        result["forward"] = dict(total=time.perf_counter() - start, groups=dict(clock.seconds),
                                 calls=dict(clock.count))
        ref_out, cache = fa.flash_attention_forward(q, k, v, is_causal=is_causal, block_q=block_q, block_k=block_k)
        # The copy must compute what the kernel computes, or its clocks describe something else.
        errors = {"out": float(np.abs(out - ref_out).max())}
        dq, dk, dv = (np.zeros_like(a) for a in (q, k, v))
        clock = Clock()
        start = time.perf_counter()
        for n in range(B * NH):
            backward_slice(clock, q[n][None], k[n], v[n], out[n][None], dout[n][None], lse_b[n][None],
                           dq[n][None], dk[n], dv[n], is_causal, scale, block_q, block_k)
        result["backward"] = dict(total=time.perf_counter() - start, groups=dict(clock.seconds),
                                  calls=dict(clock.count))
        grads = fa.flash_attention_backward(dout, cache)
        for name, a, b in zip(("dq", "dk", "dv"), (dq, dk, dv), grads, strict=True):
            errors[name] = float(np.abs(a - b).max())
        result["max_abs_error_vs_kernel"] = errors
        # Same statements in the same order: only the instrumented copy's separate accumulation
        # of dq/dk/dv could round differently, far below this.
        if max(errors.values()) > 1e-4:
            raise AssertionError(f"the instrumented copy no longer follows the kernel: {errors}")
        tiles = result["forward"]["calls"]["exp"]
        result["shifted_extras_per_tile"] = shifted_tile_extras(clock, block_q, block_k, 50)
        result["shifted_extras_total"] = {k_: t * tiles for k_, t in result["shifted_extras_per_tile"].items()}
    for part in ("forward", "backward"):
        r = result[part]
        r["python_and_clock"] = r["total"] - sum(r["groups"].values())
        r["tiles"] = r["calls"]["exp"]
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
            res[f"kernel forward, {threads} thread(s)"] = _median_time(
                lambda: fa.flash_attention_forward(q, k, v), max(3, repeats // 10))
    if cpus:
        os.sched_setaffinity(0, cpus)
    return res


# -- 4. NumPy's floor against F.sdpa ------------------------------------------------------------------

def _bare_forward(q, k_t, v_1, block_q, block_k, with_exp):
    """The forward's tile loop and nothing else: per tile q_blk @ k^T, exp in place, p @ [v | 1]."""
    s = np.empty((block_q, block_k), np.float32)
    pv = np.empty((block_q, v_1.shape[-1]), np.float32)
    for n in range(len(q)):
        for i0 in range(0, T, block_q):
            for j0 in range(0, T, block_k):
                np.matmul(q[n, i0:i0 + block_q], k_t[n, :, j0:j0 + block_k], out=s)
                if with_exp:
                    np.exp(s, out=s)
                np.matmul(s, v_1[n, j0:j0 + block_k], out=pv)


def _bare_backward(q_1, k_1, v_1, q, k, dout, dout_1, block_q, block_k):
    """The backward's tile loop and nothing else: five matmuls, exp and one multiply per tile."""
    s = np.empty((block_q, block_k), np.float32)
    dp = np.empty((block_q, block_k), np.float32)
    dkv = np.empty((block_k, HS), np.float32)
    dq = np.empty((block_q, HS), np.float32)
    for n in range(len(q)):
        for j0 in range(0, T, block_k):
            for i0 in range(0, T, block_q):
                np.matmul(q_1[n, i0:i0 + block_q], k_1[n, :, j0:j0 + block_k], out=s)
                np.exp(s, out=s)
                np.matmul(s.T, dout[n, i0:i0 + block_q], out=dkv)
                np.matmul(dout_1[n, i0:i0 + block_q], v_1[n, :, j0:j0 + block_k], out=dp)
                np.multiply(dp, s, out=dp)
                np.matmul(dp.T, q[n, i0:i0 + block_q], out=dkv)
                np.matmul(dp, k[n, j0:j0 + block_k], out=dq)


def floor(rounds, block_q, block_k):
    """Median seconds per case and the median, over rounds, of each case's ratio to F.sdpa in the
    same round (forward cases to its forward, forward+backward cases to its forward+backward)."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
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
        "NumPy tiles, 2 matmuls + np.exp (the floor)": partial(_bare_forward, q_s, k_t, v_1, block_q, block_k, True),
        "kernel forward": partial(fa.flash_attention_forward, q, k, v, block_q=block_q, block_k=block_k),
    }
    backward = {
        "F.sdpa forward+backward": sdpa_forward_backward,
        "NumPy tiles, forward floor + backward's 5 matmuls, exp, multiply": lambda: (
            forward["NumPy tiles, 2 matmuls + np.exp (the floor)"](),
            _bare_backward(q_1, k_1, v_1t, q3, k3, dout3, dout_1, block_q, block_k)),
        "kernel forward+backward": kernel_forward_backward,
    }
    times = {name: [] for name in (*forward, *backward)}
    old_min_work, fa.PARALLEL_MIN_WORK = fa.PARALLEL_MIN_WORK, 1 << 62   # the kernel on one thread too
    try:
        with threadpool_limits(1, user_api="blas"), np.errstate(over="ignore"):
            for fn in (*forward.values(), *backward.values()):
                fn()
            for _ in range(rounds):
                for name, fn in (*forward.items(), *backward.items()):
                    start = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - start)
    finally:
        fa.PARALLEL_MIN_WORK = old_min_work
    res = {}
    for group, base in ((forward, "F.sdpa forward"), (backward, "F.sdpa forward+backward")):
        for name in group:
            res[name] = dict(median_s=statistics.median(times[name]),
                             over_sdpa=statistics.median(a / b for a, b in zip(times[name], times[base], strict=True)),
                             times_s=times[name])
    return res


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
    shares = {part: sum(t for name, t in inst[part]["groups"].items() if name.startswith(("matmul", "exp")))
              / inst[part]["total"] for part in ("forward", "backward")}
    return dict(matmul_and_exp_share=shares, forward_one_core=fwd, backward_one_core=bwd, forward_two_cores=fwd / 2,
                backward_two_cores=bwd / 2, tile_gflops=tile_gflops, exp_gelem_s=exp_rate,
                forward_flops=flops_fwd, exps=exps)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.flash_breakdown", description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--block", type=int, nargs=2, default=list(KERNEL_BLOCK), metavar=("BLOCK_Q", "BLOCK_K"),
                   help="tile shape; default the kernel's, %(default)s")
    p.add_argument("--causal", action="store_true", help="break down the causal kernel")
    p.add_argument("--torch", action="store_true", help="also time torch's matmul and exp at a tile's size, "
                   "and NumPy's floor against F.scaled_dot_product_attention")
    p.add_argument("--rounds", type=int, default=7, help="rounds of the floor comparison; default 7")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    res = dict(blas=[{k: i.get(k) for k in ("internal_api", "version", "architecture")}
                     for i in threadpool_info() if i["user_api"] == "blas"],
               exp=fa.EXP.__name__, block=args.block, causal=args.causal, load=[os.getloadavg()[0]])
    res["roofline"] = roofline(args.repeats, args.block)
    res["load"].append(os.getloadavg()[0])
    res["instrumented"] = instrumented(args.causal, *args.block)
    res["load"].append(os.getloadavg()[0])
    res["thread_pool"] = thread_pool(args.repeats)
    res["load"].append(os.getloadavg()[0])
    res["lower_bound"] = lower_bound(res["roofline"], res["instrumented"], args.block)
    if args.torch:
        res["torch"] = torch_pieces(args.repeats, args.block)
        res["floor"] = floor(args.rounds, *args.block)
        res["load"].append(os.getloadavg()[0])
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    print(f"BLAS {res['blas']}; kernel exponentiates with np.{res['exp']}; tiles {args.block}; "
          f"load average {' '.join(f'{x:.2f}' for x in res['load'])}")
    for part in ("matmul", "ufunc"):
        for name, rate in res["roofline"][part].items():
            print(f"  {part:6} {name:40} {rate:7.2f} {'GFLOP/s' if part == 'matmul' else 'Gelem/s'}")
    for part in ("forward", "backward"):
        r = res["instrumented"][part]
        print(f"{part}: {r['total']:.3f} s on one thread, {r['tiles']} tiles")
        for name, sec in sorted(r["groups"].items(), key=lambda x: -x[1]):
            print(f"  {name:40} {sec:7.3f} s  {100 * sec / r['total']:5.1f}%  "
                  f"{1e6 * sec / r['calls'][name]:8.1f} us per call")
        print(f"  {'Python and clock (the rest)':40} {r['python_and_clock']:7.3f} s  "
              f"{100 * r['python_and_clock'] / r['total']:5.1f}%  "
              f"{1e6 * r['python_and_clock'] / r['tiles']:8.1f} us per tile")
    print("the instrumented copy against the kernel, max abs difference: " + ", ".join(
        f"{k} {v:.1e}" for k, v in res["instrumented"]["max_abs_error_vs_kernel"].items()))
    print("shifted path's extra passes, per tile and over all tiles:")
    for name, t in res["instrumented"]["shifted_extras_per_tile"].items():
        print(f"  {name:40} {1e6 * t:7.1f} us  {res['instrumented']['shifted_extras_total'][name]:.3f} s")
    for name, t in res["thread_pool"].items():
        print(f"{name:42} {1e3 * t:8.2f} ms")
    for name, rate in res.get("torch", {}).items():
        print(f"  {name:50} {rate:7.2f}")
    if "floor" in res:
        print(f"NumPy's floor, one thread each, {args.rounds} rounds taking turns (ratio: median over rounds of "
              "time / F.sdpa's time in the same round):")
        for name, r in res["floor"].items():
            print(f"  {name:66} {1e3 * r['median_s']:8.1f} ms  {r['over_sdpa']:.3f}")
    lb = res["lower_bound"]
    print(f"lower bound at {lb['tile_gflops']:.1f} GFLOP/s and {lb['exp_gelem_s']:.2f} Gexp/s per core: "
          f"forward {lb['forward_one_core']:.3f} s on one core ({lb['forward_two_cores']:.3f} s on two), "
          f"backward {lb['backward_one_core']:.3f} s ({lb['backward_two_cores']:.3f} s on two)")
    print("matmuls and exponentials took " + ", ".join(
        f"{100 * v:.1f}% of the {k}" for k, v in lb["matmul_and_exp_share"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
