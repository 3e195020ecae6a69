"""Parity tests for numpy_attn/flash_attention.py and torch_attn/flash_attention.py, and for the
tuned numpy_attn/kernels/flash_attention.py against the readable version."""

import math
import re
import tracemalloc
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import numpy_attn.kernels.flash_attention as fa
import torch_attn.flash_attention as tw
from numpy_attn.attention import (
    scaled_dot_product_attention_backward,
    scaled_dot_product_attention_forward,
)
from numpy_attn.flash_attention import flash_attention_backward, flash_attention_forward
from parity_tests import strategies as S
from parity_tests.attention_kit import (
    BAD_SOFTCAPS,
    BAD_WINDOWS,
    assert_dout_refused,
    assert_fa4_rule,
    cancelled_size,
    dsinks_size,
    float32_allowance,
)
from parity_tests.attention_kit import numpy_backward as attention_backward
from parity_tests.attention_kit import numpy_forward as attention_forward
from parity_tests.helpers import (
    FD_TOL,
    LOW_DTYPES,
    TOLERANCES,
    assert_close,
    assert_error_budget,
    autograd,
    numerical_grad,
    round_to,
    to_numpy,
    to_torch,
)


@st.composite
def flash_inputs(draw, dtype=None, max_len=9, max_head=4, max_side=3, bound=4.0):
    """A case: q, k, v, dout and the forward's keyword arguments, block sizes included.

    Leading dimensions are (), (nh,) or (B, nh); q may have g times the heads of k and v
    (grouped-query). Block sizes run from 1 to past the lengths, so they often do not divide them.
    """
    dtype = draw(S.dtypes) if dtype is None else dtype
    kv_lead = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=max_side))
    g = draw(st.integers(1, max_side)) if kv_lead else 1    # query heads per key/value head
    q_lead = kv_lead[:-1] + (kv_lead[-1] * g,) if kv_lead else ()
    T, S_ = draw(S.dim(1, max_len)), draw(S.dim(1, max_len))
    hs, hv = draw(S.dim(1, max_head)), draw(S.dim(1, max_head))
    return dict(
        q=draw(S.arrays(dtype, q_lead + (T, hs), bound)),
        k=draw(S.arrays(dtype, kv_lead + (S_, hs), bound)),
        v=draw(S.arrays(dtype, kv_lead + (S_, hv), bound)),
        dout=draw(S.arrays(dtype, q_lead + (T, hv))),
        is_causal=draw(st.booleans()),
        scale=draw(st.none() | st.floats(0.1, 2.0)),
        block_q=draw(st.integers(1, T + 2)),
        block_k=draw(st.integers(1, S_ + 2)),
    )


def ramp(*shape, dtype=np.float64):
    """Distinct, bounded values of ``shape`` for hand-written examples."""
    return np.sin(np.arange(1, math.prod(shape) + 1)).reshape(shape).astype(dtype)


def make_case(q, k, v, is_causal=False, scale=None, block_q=1, block_k=1):
    return dict(q=q, k=k, v=v, dout=ramp(*q.shape[:-1], v.shape[-1]) * 0.5, is_causal=is_causal,
                scale=scale, block_q=block_q, block_k=block_k)


# Blocks of 1; causal with T > S (rows past S see every key) and with T < S; GQA with blocks that
# divide nothing; T = 1 with one head.
EDGE_CASES = [
    make_case(ramp(2, 5, 3), ramp(2, 4, 3), ramp(2, 4, 2), is_causal=True),
    make_case(ramp(3, 7, 2), ramp(3, 3, 2), ramp(3, 3, 4), is_causal=True, block_q=2, block_k=2),
    make_case(ramp(1, 3, 2), ramp(1, 8, 2), ramp(1, 8, 1), is_causal=True, block_q=2, block_k=3),
    make_case(ramp(2, 4, 5, 3), ramp(2, 2, 7, 3), ramp(2, 2, 7, 2), block_q=3, block_k=4),
    make_case(ramp(1, 1, 1, 2), ramp(1, 1, 3, 2), ramp(1, 1, 3, 2), block_q=5, block_k=2),
]

KWARGS = ("is_causal", "scale", "block_q", "block_k")

# The readable transcription and the tuned kernel: (forward, backward).
IMPLS = {"readable": (flash_attention_forward, flash_attention_backward),
         "kernel": (fa.flash_attention_forward, fa.flash_attention_backward)}


def numpy_forward(case, impl="readable", **changes):
    c = {**case, **changes}
    return IMPLS[impl][0](c["q"], c["k"], c["v"], **{n: c[n] for n in KWARGS})


def twin_fn(case):
    """The torch twin's output as a function of (q, k, v) only."""
    return lambda q, k, v: tw.flash_attention(q, k, v, **{n: case[n] for n in KWARGS})[0]


def qkv(case):
    return {name: case[name] for name in ("q", "k", "v")}


def grad_tol(case):
    """assert_close's tolerance for dq and dk: the dtype's default, with an atol for cancellation.

    dS = P * (dP - D) cancels: dP and D are sums of up to hv terms |dout| |v|, and dS keeps their
    rounding, a few ulps of that size, however small the difference. dq and dk sum dS over up to
    max(T, S) rows times |k| or |q| and the scale, so their error reaches a few ulps of
    M = scale max|q, k| max(T, S) max|dout| max|v| hv, in any implementation. Measured: the
    thorough profile reached 2.4 float32 ulps of M (4.3e-4 in dk, between two block sizes; with
    the default atol 1e-5 it failed by 16 times, also between torch's built-in and the twin), and
    the ci profile 4.4 float64 ulps of M in the reference's dk (1.1e-12 where flash gives the exact
    0: v's rows were equal). Hence 8 ulps of M; a real bug is off by a fraction of M itself.
    """
    q, k, v, dout = (case[n] for n in ("q", "k", "v", "dout"))
    if q.size * k.size * dout.size == 0:
        return {}
    default = TOLERANCES[q.dtype]["atol"]
    return dict(atol=max(default, 8 * float(np.finfo(q.dtype).eps) * cancelled_size(case)))


# -- forward matches the twin -------------------------------------------------------------------

@given(case=flash_inputs())
@example(case=EDGE_CASES[0])
@example(case=EDGE_CASES[1])
@example(case=EDGE_CASES[3])
def test_forward_matches_twin(case):
    out, cache = numpy_forward(case)
    out_t, lse_t = tw.flash_attention(*(to_torch(a) for a in qkv(case).values()),
                                      **{n: case[n] for n in KWARGS})
    assert_close("flash.out", out, to_numpy(out_t))
    assert_close("flash.lse", cache.lse, to_numpy(lse_t))


# -- backward matches autograd --------------------------------------------------------------------

@pytest.mark.twin_parity
@given(case=flash_inputs())
@example(case=EDGE_CASES[0])
@example(case=EDGE_CASES[2])
@example(case=EDGE_CASES[3])
def test_backward_matches_autograd(case):
    _, cache = numpy_forward(case)
    dq, dk, dv = flash_attention_backward(case["dout"], cache)
    _, grads = autograd(twin_fn(case), qkv(case), case["dout"])
    assert_close("flash.dq", dq, grads["q"], **grad_tol(case))
    assert_close("flash.dk", dk, grads["k"], **grad_tol(case))
    assert_close("flash.dv", dv, grads["v"])


# -- the twin matches PyTorch's built-in ------------------------------------------------------------

@given(case=flash_inputs())
@example(case=EDGE_CASES[1])
@example(case=EDGE_CASES[3])
def test_twin_matches_builtin(case):
    """Equal to F.scaled_dot_product_attention, output and gradients, for every block size; lse
    equals torch.logsumexp of the (causally masked) scores."""
    gqa = case["q"].shape[:-2] != case["k"].shape[:-2]

    def builtin(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=case["is_causal"],
                                              scale=case["scale"], enable_gqa=gqa)
    out_b, grads_b = autograd(builtin, qkv(case), case["dout"])
    out_t, grads_t = autograd(twin_fn(case), qkv(case), case["dout"])
    assert_close("flash.out vs builtin", out_t, out_b)
    for name in ("q", "k"):
        assert_close(f"flash.d{name} vs builtin", grads_t[name], grads_b[name], **grad_tol(case))
    assert_close("flash.dv vs builtin", grads_t["v"], grads_b["v"])
    q, k, v = (to_torch(a) for a in qkv(case).values())
    _, lse_t = tw.flash_attention(q, k, v, **{n: case[n] for n in KWARGS})
    T, S_, hs = q.shape[-2], k.shape[-2], q.shape[-1]
    if gqa:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    scale = 1 / math.sqrt(hs) if case["scale"] is None else case["scale"]
    scores = q @ k.transpose(-1, -2) * scale
    if case["is_causal"]:
        scores = scores.masked_fill(torch.ones(T, S_, dtype=torch.bool).triu(1), -torch.inf)
    assert_close("flash.lse vs logsumexp", to_numpy(lse_t), to_numpy(torch.logsumexp(scores, dim=-1)))


# -- equal to the reference attention (numpy_attn/attention.py) ------------------------------------

def reference(case, dtype=None):
    """The reference's (out, (dq, dk, dv)) on the case, its arrays cast to ``dtype`` if given."""
    q, k, v, dout = (case[n] if dtype is None else case[n].astype(dtype) for n in ("q", "k", "v", "dout"))
    out, cache = scaled_dot_product_attention_forward(q, k, v, is_causal=case["is_causal"],
                                                      scale=case["scale"])
    return out, scaled_dot_product_attention_backward(dout, cache)


# Equal rows of v make dP - D vanish: flash's dk is exactly 0, the reference's is round-off of
# 4.4 float64 ulps of grad_tol's M (the ci profile found it with the default atol).
EQUAL_VALUES = dict(q=np.full((2, 4, 1), 4.0), k=np.array([[[1.5], [0], [0], [0], [0], [0]]]),
                    v=np.full((1, 6, 3), 4.0), dout=np.full((2, 4, 3), 4.0), is_causal=False,
                    scale=None, block_q=1, block_k=1)


@given(case=flash_inputs(dtype=np.float64))
@example(case=EDGE_CASES[0])
@example(case=EDGE_CASES[1])
@example(case=EDGE_CASES[2])
@example(case=EDGE_CASES[3])
@example(case=EQUAL_VALUES)
def test_matches_reference(case):
    """float64: every block size, dividing the lengths or not, gives the reference's output and
    gradients to float64 precision."""
    out, cache = numpy_forward(case)
    grads = flash_attention_backward(case["dout"], cache)
    out_r, grads_r = reference(case)
    assert_close("flash.out vs reference", out, out_r)
    for name, d, d_r, tol in zip(("dq", "dk", "dv"), grads, grads_r, (grad_tol(case),) * 2 + ({},),
                                 strict=True):
        assert_close(f"flash.{name} vs reference", d, d_r, **tol)


# The reference's own float32 error: the largest |float32 result - float64 result| of
# numpy_attn/attention.py over two runs of 3000 examples of flash_inputs(float32), with Hypothesis
# targeting the largest error. The reference must stay within twice these (margin for examples
# those runs did not reach), and so must flash, up to the one error the reference does not have
# (lse_allowance).
REFERENCE_F32_ERROR = {"out": 1.3e-5, "dq": 3.4e-5, "dk": 3.3e-4, "dv": 4.1e-5}


def lse_allowance(case):
    """Flash's extra float32 error, per result: its backward recomputes P = exp2(s2 - lse2) with
    lse2 rounded to float32 and s2 recomputed by another matmul, so P is off by a few ulps of the
    largest base-2 score, relatively; the reference's exp(s - max) / sum is exact where the
    scores are equal (the thorough profile found flash's dv 9 times the reference's worst there:
    all inputs 4, v's rows equal). Bounded by 4 ulps of that score times each result's size:
    out is a mean of v; dv sums g T rows of P dout; dq and dk are bounded by grad_tol's M.
    """
    q, k, v, dout = (case[n] for n in ("q", "k", "v", "dout"))
    hs = q.shape[-1]
    scale = 1 / math.sqrt(hs) if case["scale"] is None else case["scale"]
    largest = scale * math.log2(math.e) * hs * np.abs(q).max() * np.abs(k).max()   # base-2 score bound
    relative = 4 * float(np.finfo(np.float32).eps) * (1 + largest)
    rows = q.size // q.shape[-1] // max(k.size // k.shape[-1] // k.shape[-2], 1)   # g T per key
    M = grad_tol(case).get("atol", 0) / (8 * float(np.finfo(np.float32).eps))
    return {"out": relative * np.abs(v).max(), "dv": relative * rows * np.abs(dout).max(),
            "dq": relative * M, "dk": relative * M}


@given(case=flash_inputs(dtype=np.float32))
@example(case={**EDGE_CASES[1], **{n: EDGE_CASES[1][n].astype(np.float32) for n in ("q", "k", "v", "dout")}})
@example(case=dict(q=np.full((2, 8, 4), 4, np.float32), k=np.full((1, 8, 4), 4, np.float32),
                   v=np.full((1, 8, 4), 4, np.float32), dout=np.full((2, 8, 4), 4, np.float32),
                   is_causal=False, scale=2.0, block_q=3, block_k=5))   # equal scores of 128
def test_float32_error_within_the_references(case):
    """float32 against the float64 truth (the reference on the same inputs, upcast exactly), for
    the readable version and for the kernel."""
    out_r, grads_r = reference(case)
    out_64, grads_64 = reference(case, np.float64)
    extra = lse_allowance(case)
    for name, r, truth in zip(("out", "dq", "dk", "dv"), (out_r, *grads_r), (out_64, *grads_64), strict=True):
        assert_close(f"reference.{name} float32 vs float64", r.astype(np.float64), truth, rtol=0,
                     atol=2 * REFERENCE_F32_ERROR[name])
    for impl, (_, backward) in IMPLS.items():
        out, cache = numpy_forward(case, impl)
        flash = (out, *backward(case["dout"], cache))
        for name, f, truth in zip(("out", "dq", "dk", "dv"), flash, (out_64, *grads_64), strict=True):
            assert_close(f"flash {impl}.{name} float32 vs float64", f.astype(np.float64), truth, rtol=0,
                         atol=2 * REFERENCE_F32_ERROR[name] + extra[name])


# -- the kernel equals the readable version ---------------------------------------------------------

@given(case=flash_inputs())
@example(case=EDGE_CASES[0])
@example(case=EDGE_CASES[1])
@example(case=EDGE_CASES[2])
@example(case=EDGE_CASES[3])
@example(case=EQUAL_VALUES)
def test_kernel_matches_readable(case):
    """numpy_attn/kernels/flash_attention.py gives the readable version's output, lse and
    gradients. float64: to float64 precision (grad_tol for dq, dk, as against the reference).
    float32: test_float32_error_within_the_references bounds each one's distance to the float64
    truth by 2 * REFERENCE_F32_ERROR + lse_allowance, so by the triangle inequality they are
    within twice that of each other (lse is not compared there: out is what both promise)."""
    out, cache = numpy_forward(case)
    out_k, cache_k = numpy_forward(case, "kernel")
    grads = flash_attention_backward(case["dout"], cache)
    grads_k = fa.flash_attention_backward(case["dout"], cache_k)
    if case["q"].dtype == np.float64:
        tols = {"out": {}, "dq": grad_tol(case), "dk": grad_tol(case), "dv": {}}
        assert_close("flash kernel.lse vs readable", cache_k.lse, cache.lse)
    else:
        extra = lse_allowance(case)
        tols = {name: dict(rtol=0, atol=2 * (2 * REFERENCE_F32_ERROR[name] + extra[name]))
                for name in ("out", "dq", "dk", "dv")}
    for name, a_k, a in zip(("out", "dq", "dk", "dv"), (out_k, *grads_k), (out, *grads), strict=True):
        assert a_k.dtype == a.dtype, f"flash kernel.{name} dtype {a_k.dtype}, readable {a.dtype}"
        assert_close(f"flash kernel.{name} vs readable", a_k, a, **tols[name])


# -- properties ---------------------------------------------------------------------------------

@given(case=flash_inputs(), data=st.data())
def test_block_sizes_do_not_change_the_result(case, data):
    """Tiling is exact: other block sizes give the same output and gradients up to rounding."""
    other = dict(block_q=data.draw(st.integers(1, 12), label="block_q"),
                 block_k=data.draw(st.integers(1, 12), label="block_k"))
    out, cache = numpy_forward(case)
    out_o, cache_o = numpy_forward(case, **other)
    assert_close("flash.out for other block sizes", out_o, out)
    assert_close("flash.lse for other block sizes", cache_o.lse, cache.lse)
    grads = flash_attention_backward(case["dout"], cache)
    grads_o = flash_attention_backward(case["dout"], cache_o)
    for name, d, d_o, tol in zip(("dq", "dk", "dv"), grads, grads_o, (grad_tol(case),) * 2 + ({},),
                                 strict=True):
        assert_close(f"flash.{name} for other block sizes", d_o, d, **tol)


@given(case=flash_inputs())
@example(case=EDGE_CASES[1])
def test_causal_row_t_attends_to_keys_up_to_t_only(case):
    """With is_causal, row t equals plain attention of query t over keys 0..t alone: no later key,
    value or query has any influence (rows t >= S see every key)."""
    out, cache = numpy_forward(case, is_causal=True)
    rows = [numpy_forward(case, q=case["q"][..., t:t + 1, :], k=case["k"][..., :t + 1, :],
                          v=case["v"][..., :t + 1, :], is_causal=False)
            for t in range(case["q"].shape[-2])]
    assert_close("flash.out causal vs row by row", out, np.concatenate([o for o, _ in rows], axis=-2))
    assert_close("flash.lse causal vs row by row", cache.lse, np.concatenate([c.lse for _, c in rows], axis=-1))


@pytest.mark.parametrize("dtype, big", [(np.float32, 30.0), (np.float64, 300.0)])
def test_large_scores_stay_finite(dtype, big):
    """Scores of +-big^2 (about 1e3 and 1e5, far past exp's overflow) with the maximum in a late
    block: the running maximum rescales the earlier blocks instead of overflowing."""
    q = np.array([[big, 0.0], [-big, 0.0], [0.0, big]], dtype=dtype)
    k = np.array([[-big, 0.0], [0.0, -big], [big, 1.0], [1.0, big]], dtype=dtype)
    v = ramp(4, 3, dtype=dtype)
    out, cache = flash_attention_forward(q, k, v, scale=1.0, block_q=2, block_k=1)
    grads = flash_attention_backward(ramp(3, 3, dtype=dtype), cache)
    assert all(np.isfinite(a).all() for a in (out, cache.lse, *grads)), "flash: not finite"
    # Each row's largest score beats the next by far more than float precision: a one-hot weight.
    assert_close("flash.out with large scores", out, v[[2, 0, 3]])


@pytest.mark.parametrize("impl, blocks", [
    ("kernel", {}),
    # The readable version takes every head at once, and a tile lives in a few temporaries
    # (s, s - m, p): 2 heads x 128 x 128 float32 is 128 KiB each, well under the bound.
    ("readable", dict(block_q=128, block_k=128)),
])
def test_forward_never_holds_a_T_by_S_array(impl, blocks):
    """tracemalloc: the forward's peak extra memory is far below one (T, S) score matrix.

    The kernel holds one tile of scores per thread (512 KiB at its default 256 x 512, two threads
    here) and O(T) per slice; at T = S = 2048 one head's scores are 16 MiB, four times the bound.
    """
    T = S_ = 2048
    q, k, v = (ramp(2, T, 8, dtype=np.float32) for _ in range(3))
    forward = IMPLS[impl][0]
    forward(q, k, v, **blocks)                           # warm up: first-call allocations
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        out, _ = forward(q, k, v, **blocks)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    scores = T * S_ * 4                                  # one head's float32 scores: 16 MiB
    assert peak < scores / 4, f"flash {impl} forward peak {peak / 2**20:.2f} MiB for T = S = {T}"


@pytest.mark.parametrize("is_causal", [False, True])
def test_threads_give_the_same_result(monkeypatch, is_causal):
    """The kernel's thread pool (forced here, even for small inputs) computes each slice exactly as
    the serial loop does: the same code on the same numbers, so equal to the last bit. Causal, the
    serial loop takes the 8 slices in one stack, the two threads in stacks of 4."""
    case = make_case(ramp(2, 4, 9, 3), ramp(2, 2, 11, 3), ramp(2, 2, 11, 2), is_causal=is_causal, block_q=4,
                     block_k=3)
    monkeypatch.setattr(fa, "_cpu_count", lambda: 1)
    out, cache = numpy_forward(case, "kernel")
    grads = fa.flash_attention_backward(case["dout"], cache)
    monkeypatch.setattr(fa, "PARALLEL_MIN_WORK", 0)
    monkeypatch.setattr(fa, "_cpu_count", lambda: 2)
    out_p, cache_p = numpy_forward(case, "kernel")
    grads_p = fa.flash_attention_backward(case["dout"], cache_p)
    for name, a, b in [("out", out_p, out), *zip(("dq", "dk", "dv"), grads_p, grads, strict=True)]:
        assert np.array_equal(a, b), f"flash.{name} differs between threads and the serial loop"


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("is_causal", [False, True])
def test_no_keys_gives_zeros(is_causal, impl):
    """S = 0: every row has no key; out and the gradients are zeros, lse is -inf (log 0), as
    F.scaled_dot_product_attention gives zeros."""
    q, k, v = ramp(2, 3, 4), np.zeros((2, 0, 4)), np.zeros((2, 0, 5))
    forward, backward = IMPLS[impl]
    out, cache = forward(q, k, v, is_causal=is_causal)
    dq, dk, dv = backward(ramp(2, 3, 5), cache)
    builtin = F.scaled_dot_product_attention(to_torch(q), to_torch(k), to_torch(v), is_causal=is_causal)
    assert_close("flash.out with S = 0 vs builtin", out, to_numpy(builtin))
    assert_close("flash.out with S = 0", out, np.zeros((2, 3, 5)))
    assert np.all(np.isneginf(cache.lse)), "flash.lse with S = 0 is not -inf"
    assert_close("flash.dq with S = 0", dq, np.zeros_like(q))
    assert dk.shape == (2, 0, 4) and dv.shape == (2, 0, 5), f"dk {dk.shape}, dv {dv.shape}"


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("is_causal", [False, True])
def test_no_queries_gives_empty_results(is_causal, impl):
    """T = 0 with S > 0: out (.., 0, hv) and lse (..., 0), as F.scaled_dot_product_attention;
    the backward gives an empty dq and zero dk, dv of k's and v's shapes (no query reads them)."""
    q, k, v = np.zeros((2, 0, 4)), ramp(2, 3, 4), ramp(2, 3, 5)
    forward, backward = IMPLS[impl]
    out, cache = forward(q, k, v, is_causal=is_causal)
    builtin = F.scaled_dot_product_attention(to_torch(q), to_torch(k), to_torch(v), is_causal=is_causal)
    assert out.shape == tuple(builtin.shape) == (2, 0, 5), f"flash.out with T = 0: {out.shape}"
    assert cache.lse.shape == (2, 0), f"flash.lse with T = 0: {cache.lse.shape}"
    dq, dk, dv = backward(np.zeros((2, 0, 5)), cache)
    assert dq.shape == (2, 0, 4), f"flash.dq with T = 0: {dq.shape}"
    assert_close("flash.dk with T = 0", dk, np.zeros_like(k))
    assert_close("flash.dv with T = 0", dv, np.zeros_like(v))


# -- finite differences (no torch) ----------------------------------------------------------------

@given(case=flash_inputs(dtype=np.float64, max_len=5, max_head=3, max_side=2, bound=1.0))
@example(case=EDGE_CASES[1])
def test_backward_matches_finite_differences(case):
    """Elements bounded by 1, as in test_attention.py: it keeps the stencil's truncation error,
    which grows with the softmax's fifth derivative, near 1e-12 (see numerical_grad). Few heads:
    each element of q, k and v costs four forward passes."""
    assert_matches_finite_differences("flash", case, numpy_forward)


def assert_matches_finite_differences(label, case, forward):
    """dq, dk, dv (and dsinks, given sinks) of the readable backward against finite differences
    of ``forward`` (float64)."""
    _, cache = forward(case)
    names = ("q", "k", "v") + (("sinks",) if case.get("sinks") is not None else ())
    grads = dict(zip(names, flash_attention_backward(case["dout"], cache), strict=True))
    for name in names:
        a = case[name].copy()
        expected = numerical_grad(lambda a, name=name: forward(case, **{name: a})[0], a, case["dout"])
        assert_close(f"{label}.d{name} vs finite differences", grads[name], expected, **FD_TOL)


# -- dtype preservation -----------------------------------------------------------------------------

@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
def test_dtype_is_preserved(dtype, is_causal):
    """float32 stays float32, with GQA and a float64 scale."""
    case = make_case(*(ramp(2, 2, 3, 2, dtype=dtype), ramp(2, 1, 4, 2, dtype=dtype),
                       ramp(2, 1, 4, 3, dtype=dtype)), is_causal=is_causal, scale=np.float64(0.5),
                     block_q=2, block_k=3)
    case["dout"] = case["dout"].astype(dtype)
    out, cache = numpy_forward(case)
    grads = flash_attention_backward(case["dout"], cache)
    for name, a in [("out", out), ("lse", cache.lse), *zip(("dq", "dk", "dv"), grads, strict=True)]:
        assert a.dtype == dtype, f"flash.{name} dtype {a.dtype}"


# -- bad input --------------------------------------------------------------------------------------

Q, K, V = (np.zeros(shape) for shape in ((2, 4, 3, 8), (2, 4, 5, 8), (2, 4, 5, 6)))
BAD_INPUTS = [   # (q, k, v, keyword arguments), the error, and what its message must say
    *[((Q, K, V, {name: bad}), ValueError, rf"{name} must be a positive integer, got {bad}")
      for name in ("block_q", "block_k") for bad in (0, -3)],
    ((Q, np.zeros((2, 4, 5, 7)), V, {}), ValueError, r"head sizes differ: q \(2, 4, 3, 8\), k \(2, 4, 5, 7\)"),
    ((Q, K, np.zeros((2, 4, 6, 6)), {}), ValueError, r"lengths differ: k \(2, 4, 5, 8\), v \(2, 4, 6, 6\)"),
    ((Q, np.zeros((2, 3, 5, 8)), np.zeros((2, 3, 5, 6)), {}), ValueError,
     r"query head count 4 to be a multiple of the key/value head count 3: q \(2, 4, 3, 8\), k \(2, 3, 5, 8\)"),
    ((Q, np.zeros((3, 4, 5, 8)), np.zeros((3, 4, 5, 6)), {}), ValueError,
     r"q \(2, 4, 3, 8\) and k \(3, 4, 5, 8\) must have the same leading dimensions"),
    ((np.zeros(8), K, V, {}), ValueError, r"q must have shape \(..., length, head size\), got \(8,\)"),
    ((Q.astype(np.int64), K, V, {}), TypeError, "float32 or float64"),
    ((Q.astype(np.float32), K, V, {}), TypeError, "must share one dtype"),
]


# A block size that is not an integer at all: TypeError in the readable version (a wrong type),
# ValueError in the kernel, which checks it as it always has.
BAD_BLOCK_TYPES = [((Q, K, V, {name: bad}), rf"{name} must be a positive integer, got {bad}")
                   for name in ("block_q", "block_k") for bad in (2.5, None, True)]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("args, error, message", BAD_INPUTS)
def test_bad_input(args, error, message, impl):
    *arrays, kwargs = args
    with pytest.raises(error, match=message):
        IMPLS[impl][0](*arrays, **kwargs)


@pytest.mark.parametrize("args, message", BAD_BLOCK_TYPES)
def test_bad_block_type(args, message):
    *arrays, kwargs = args
    with pytest.raises(TypeError, match=message):
        flash_attention_forward(*arrays, **kwargs)
    if kwargs[next(iter(kwargs))] is not True:   # the kernel takes True as 1
        with pytest.raises(ValueError, match=message):
            fa.flash_attention_forward(*arrays, **kwargs)


@pytest.mark.parametrize("scale", [math.inf, -math.inf, math.nan])
def test_non_finite_scale_is_refused(scale):
    """An inf or NaN scale makes every score inf or NaN and the output all NaN (as
    F.scaled_dot_product_attention returns it): the readable version, the kernel and the twin
    refuse it, with one message, as flex_attention does."""
    messages = {}
    for label, forward in (*((impl, fns[0]) for impl, fns in IMPLS.items()), ("twin", tw.flash_attention)):
        arrays = (Q, K, V) if label != "twin" else (to_torch(Q), to_torch(K), to_torch(V))
        with pytest.raises(ValueError) as info:
            forward(*arrays, scale=scale)
        messages[label] = str(info.value)
    assert set(messages.values()) == {f"scale must be a finite number or None, got {scale!r}"}, messages


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("scale", [np.float32(0.5), np.float64(0.5), np.int64(1), 0.5, 1])
def test_numpy_scalar_scales_are_taken(impl, scale):
    """Any finite real scale, NumPy scalars included, gives what the same Python float gives."""
    q, k, v = ramp(2, 3, 4), ramp(2, 5, 4), ramp(2, 5, 2)
    out, _ = IMPLS[impl][0](q, k, v, scale=scale)
    expected, _ = IMPLS[impl][0](q, k, v, scale=float(scale))
    assert np.array_equal(out, expected), f"flash {impl}.out with scale {scale!r}"


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("scale", ["0.5", True, np.ones(1)])
def test_scale_of_another_type_is_refused(impl, scale):
    with pytest.raises(TypeError, match="scale must be a finite number or None, got "):
        IMPLS[impl][0](Q, K, V, scale=scale)


@pytest.mark.parametrize("dout, error, message", [
    (np.zeros((2, 4, 3, 5)), ValueError, r"dout of shape \(2, 4, 3, 5\) must have the output's shape \(2, 4, 3, 6\)"),
    (np.zeros((2, 4, 3, 6), np.float32), TypeError, "must share one dtype"),
    (np.zeros((2, 4, 3, 6), np.int64), TypeError, "float32 or float64"),
])
def test_kernel_bad_dout(dout, error, message):
    _, cache = fa.flash_attention_forward(Q, K, V)
    with pytest.raises(error, match=message):
        fa.flash_attention_backward(dout, cache)


@given(case=flash_inputs(), data=st.data())
def test_bad_dout_is_refused(case, data):
    out, cache = numpy_forward(case)
    assert_dout_refused("flash_attention", flash_attention_backward, cache, out.shape, out.dtype, data)


@given(case=flash_inputs())
def test_changing_out_leaves_gradients_alone(case):
    """The cache holds a copy of ``out``: writing into ``out`` after the forward changes no gradient."""
    out, cache = numpy_forward(case)
    grads = flash_attention_backward(case["dout"], cache)
    out[...] = 7.0
    again = flash_attention_backward(case["dout"], cache)
    for name, a, b in zip(("dq", "dk", "dv"), again, grads, strict=True):
        assert np.array_equal(a, b), f"flash.{name} changed after writing into out"


def test_huge_blocks_are_one_tile():
    """Block sizes beyond the lengths mean one tile; nothing is allocated at the block size
    (2**40 queries by 2**40 keys would be petabytes)."""
    q, k, v = ramp(2, 3, 4), ramp(2, 5, 4), ramp(2, 5, 2)
    out, cache = flash_attention_forward(q, k, v, block_q=2**40, block_k=2**40)
    out_1, cache_1 = flash_attention_forward(q, k, v, block_q=3, block_k=5)
    assert_close("flash.out with blocks of 2**40", out, out_1)
    grads = flash_attention_backward(ramp(2, 3, 2), cache)
    grads_1 = flash_attention_backward(ramp(2, 3, 2), cache_1)
    for name, a, b in zip(("dq", "dk", "dv"), grads, grads_1, strict=True):
        assert_close(f"flash.{name} with blocks of 2**40", a, b)


@given(case=flash_inputs())
@example(case=EDGE_CASES[1])    # T > S: the first T - S rows see no key
@example(case=EDGE_CASES[2])    # T < S
def test_bottom_right_causal(case):
    """is_causal="bottom_right": the readable flash gives the reference's output and gradients
    (numpy_attn/attention.py, same alignment; rows without a key give zeros), its lse equals
    log-sum-exp over the keys each row sees, and the twin agrees with it and with
    F.scaled_dot_product_attention(attn_mask=causal_lower_right(T, S))."""
    from torch.nn.attention.bias import causal_lower_right

    case = {**case, "is_causal": "bottom_right"}
    out, cache = numpy_forward(case)
    grads = flash_attention_backward(case["dout"], cache)
    out_r, grads_r = reference(case)
    assert_close("flash.out bottom-right vs reference", out, out_r)
    for name, d, d_r, tol in zip(("dq", "dk", "dv"), grads, grads_r, (grad_tol(case),) * 2 + ({},), strict=True):
        assert_close(f"flash.{name} bottom-right vs reference", d, d_r, **tol)
    out_t, lse_t = tw.flash_attention(*(to_torch(a) for a in qkv(case).values()), **{n: case[n] for n in KWARGS})
    assert_close("flash.out bottom-right vs twin", out, to_numpy(out_t))
    assert_close("flash.lse bottom-right vs twin", cache.lse, to_numpy(lse_t))
    T, S_ = case["q"].shape[-2], case["k"].shape[-2]
    with warnings.catch_warnings():   # its NaN warning for T > S is about the fused kernels; the
        warnings.simplefilter("ignore")   # materialised bool mask gives zeros on empty rows
        mask = causal_lower_right(T, S_)._materialize()
    gqa = case["q"].shape[:-2] != case["k"].shape[:-2]
    builtin = F.scaled_dot_product_attention(*(to_torch(a) for a in qkv(case).values()), attn_mask=mask,
                                             scale=case["scale"], enable_gqa=gqa)
    assert_close("flash.out bottom-right twin vs builtin", to_numpy(out_t), to_numpy(builtin))


def test_bad_is_causal():
    with pytest.raises(ValueError, match='is_causal must be False, True, "top_left" or "bottom_right", got \'lower\''):
        flash_attention_forward(Q, K, V, is_causal="lower")


# -- sliding window and softcap (FlashAttention-2's window_size and softcap) -------------------------

@st.composite
def window_inputs(draw, dtype=None, max_len=9, **kw):
    """A flash_inputs case, causal in a drawn alignment, with a window from 1 to past the keys
    (or none) and a softcap (or none), never neither."""
    case = draw(flash_inputs(dtype=dtype, max_len=max_len, **kw))
    case["is_causal"] = draw(st.sampled_from((True, "bottom_right")), label="is_causal")
    case["window"] = draw(st.none() | st.integers(1, case["k"].shape[-2] + 1), label="window")
    case["softcap"] = draw((st.none() if case["window"] else st.nothing())
                           | st.sampled_from((0.5, 2.0, 50.0)) | st.floats(0.2, 60.0), label="softcap")
    return case


WKWARGS = KWARGS + ("softcap", "window")

# T > S top-left with a window of 2: rows 4.. see no key; blocks of 2 by 3 (a row's window may start
# in the second key tile of its query tile); the 3 x 5 picture bottom-right with blocks of 1.
WINDOW_EDGES = [
    {**make_case(ramp(2, 7, 3), ramp(2, 3, 3), ramp(2, 3, 2), is_causal=True, block_q=3, block_k=2),
     "window": 2, "softcap": None},
    {**make_case(ramp(1, 9, 2), ramp(1, 9, 2), ramp(1, 9, 3), is_causal=True, block_q=4, block_k=3),
     "window": 3, "softcap": 1.0},
    {**make_case(ramp(3, 2), ramp(5, 2), ramp(5, 2), is_causal="bottom_right"), "window": 2, "softcap": None},
    # A window of 1 with query tiles of 4 and key tiles of 1: rows 1..3 see nothing of key tile 0.
    {**make_case(ramp(2, 6, 2), ramp(2, 6, 2), ramp(2, 6, 2), is_causal=True, block_q=4, block_k=1),
     "window": 1, "softcap": 2.0},
]


def window_forward(case, **changes):
    c = {**case, **changes}
    return flash_attention_forward(c["q"], c["k"], c["v"], **{n: c[n] for n in WKWARGS})


def window_reference(case):
    """The dense op with the window as its mask (masks.sliding_window_mask): numpy_attn/attention.py,
    or with a softcap flex attention with soft_cap (attention_kit's numpy_forward): (out, (dq, dk, dv))."""
    out, cache = attention_forward({**case, "attn_mask": None, "dropout_p": 0.0, "seed": 0})
    return out, attention_backward(case["dout"], cache)


@given(case=window_inputs())
@example(case=WINDOW_EDGES[0])
@example(case=WINDOW_EDGES[1])
@example(case=WINDOW_EDGES[2])
@example(case=WINDOW_EDGES[3])
def test_window_softcap_match_twin_autograd_and_dense(case):
    """Output, lse and gradients equal the twin's and autograd's, and the dense op's given the
    same window and softcap. grad_tol's analysis holds: the cap multiplies dS by 1 - tanh^2 <= 1
    and adds a tanh whose rounding is below that of the score; the window only removes terms."""
    out, cache = window_forward(case)
    t = {n: to_torch(a) for n, a in qkv(case).items()}
    out_t, lse_t = tw.flash_attention(*t.values(), **{n: case[n] for n in WKWARGS})
    assert_close("flash[window].out", out, to_numpy(out_t))
    assert_close("flash[window].lse", cache.lse, to_numpy(lse_t))
    grads = flash_attention_backward(case["dout"], cache)
    _, grads_t = autograd(lambda q, k, v: tw.flash_attention(q, k, v, **{n: case[n] for n in WKWARGS})[0],
                          qkv(case), case["dout"])
    out_r, grads_r = window_reference(case)
    assert_close("flash[window].out vs dense", out, out_r)
    for name, d, d_r, tol in zip("qkv", grads, grads_r, (grad_tol(case),) * 2 + ({},), strict=True):
        assert_close(f"flash[window].d{name}", d, grads_t[name], **tol)
        assert_close(f"flash[window].d{name} vs dense", d, d_r, **tol)


@given(case=window_inputs())
@example(case=WINDOW_EDGES[0])
def test_window_softcap_twin_matches_flex_attention(case):
    """torch.nn.attention.flex_attention (eager, CPU, forward only) with score_mod
    c * tanh(score / c) and the causal window as a mask_mod, written here from the definition,
    gives the twin's output and lse; rows that see no key give 0 and -inf in both."""
    out_b, lse_b = builtin_flex(case)
    out_t, lse_t = tw.flash_attention(*(to_torch(case[n]) for n in "qkv"), **{n: case[n] for n in WKWARGS})
    assert_close("flash[window] twin vs flex_attention", to_numpy(out_t), to_numpy(out_b).reshape(out_t.shape))
    assert_close("flash[window].lse twin vs flex_attention", to_numpy(lse_t), to_numpy(lse_b).reshape(lse_t.shape))


def builtin_flex(case):
    """torch.nn.attention.flex_attention (eager, CPU, forward only) on the case, with score_mod
    c * tanh(score / c) and, when causal, the causal window as a mask_mod, written here from the
    definition: (out, lse) as tensors of shape (-1, nh, T, .), (-1, nh, T)."""
    from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

    q, k, v = (to_torch(a.reshape((-1,) + a.shape[-3:]) if a.ndim >= 3 else a.reshape((1, 1) + a.shape))
               for a in (case["q"], case["k"], case["v"]))
    T, S_ = q.shape[-2], k.shape[-2]
    offset = S_ - T if case["is_causal"] == "bottom_right" else 0
    c, w = case["softcap"], case["window"]

    def mask_mod(b, h, q_idx, kv_idx):
        seen = kv_idx <= q_idx + offset
        return seen & (kv_idx > q_idx + offset - w) if w else seen

    def score_mod(score, b, h, q_idx, kv_idx):
        return c * torch.tanh(score / c) if c else score
    with warnings.catch_warnings():     # "called without torch.compile()": eager is the point here
        warnings.simplefilter("ignore", UserWarning)
        block_mask = create_block_mask(mask_mod, None, None, T, S_, device="cpu") if case["is_causal"] else None
        out_b, aux = flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=case["scale"],
                                    enable_gqa=q.shape[1] != k.shape[1], return_aux=AuxRequest(lse=True))
    return out_b, aux.lse


@given(case=window_inputs(dtype=np.float64, max_len=6, max_head=3, max_side=2, bound=1.0))
@example(case=WINDOW_EDGES[1])
def test_window_softcap_backward_matches_finite_differences(case):
    """Bounded by 1 as test_backward_matches_finite_differences; caps of 0.2 and up, whose fifth
    derivative adds at most 3.3e-10 of the gradient to the stencil's error (test_attention.py)."""
    assert_matches_finite_differences("flash[window]", case, window_forward)


class Recorded(np.ndarray):
    """An array that logs (name, row slice) each time flash attention takes a tile of it
    (``a[..., i0:i1, :]``); arrays computed from it log nothing."""

    def __getitem__(self, index):
        if getattr(self, "log", None) is not None and isinstance(index, tuple) and index[0] is Ellipsis:
            self.log.append((self.name, index[-2]))
        return super().__getitem__(index)

    def __array_finalize__(self, obj):
        self.log = None


def recorded(name, a, log):
    r = a.view(Recorded)
    r.name, r.log = name, log
    return r


def visited_tiles(log):
    """{(query rows, key cols)}: each key tile taken paired with the query tile taken last."""
    tiles, rows = set(), None
    for name, index in log:
        if name == "q":
            rows = (index.start, index.stop)
        elif name == "k":
            tiles.add((rows, (index.start, index.stop)))
    return tiles


@given(case=window_inputs(max_len=24), data=st.data())
@example(case={**make_case(ramp(64, 4), ramp(64, 4), ramp(64, 4), is_causal=True, block_q=8, block_k=8),
               "window": 8, "softcap": None}, data=None)
def test_window_skips_the_tiles_outside_it(case, data):
    """The forward and the backward compute the scores of only the tiles that hold a key some row
    of them may see (every tile they take meets the dense mask), and of every visible key (the
    tiles cover the mask). T = S = 64, blocks of 8 and a window of 8 visit 15 tiles, where the
    causal path visits 36; the output is the dense op's."""
    if case["q"].ndim > 2 and case["q"].shape[:-2] != case["k"].shape[:-2]:
        case = {**case, "q": case["q"][..., :1, :, :], "k": case["k"][..., :1, :, :],
                "v": case["v"][..., :1, :, :], "dout": case["dout"][..., :1, :, :]}   # no repeat of k: one head
    T, S_ = case["q"].shape[-2], case["k"].shape[-2]
    offset = S_ - T if case["is_causal"] == "bottom_right" else 0
    t, s = np.arange(T)[:, None] + offset, np.arange(S_)[None, :]
    dense = (s <= t) & (s > t - case["window"]) if case["window"] else s <= t
    for part in ("forward", "backward"):
        log = []
        q, k = recorded("q", case["q"], log), recorded("k", case["k"], log)
        out, cache = window_forward(case, q=q, k=k)
        if part == "forward":
            tiles = visited_tiles(log)
        else:
            log.clear()
            flash_attention_backward(case["dout"], cache)
            tiles = visited_tiles(log)
        covered = np.zeros((T, S_), bool)                 # the score entries computed
        for (r0, r1), (c0, c1) in tiles:
            assert dense[r0:r1, c0:c1].any(), f"flash {part} computed tile rows {r0}:{r1} keys {c0}:{c1}, all masked"
            covered[r0:r1, c0:c1] = True
        assert np.all(covered[dense]), f"flash {part} skipped a visible key: {np.argwhere(dense & ~covered)[:3]}"
        if data is None and part == "forward":
            assert len(tiles) == 15, f"flash forward visited {len(tiles)} tiles of 8 x 8, not 15"
            causal = visited_tiles(_log_of(case))
            assert len(causal) == 36, f"the causal path visited {len(causal)} tiles, not 36"
    assert_close("flash[window].out recorded vs dense", out, window_reference(case)[0])


def _log_of(case):
    """The forward's tile log on the case without its window."""
    log = []
    window_forward(case, q=recorded("q", case["q"], log), k=recorded("k", case["k"], log), window=None)
    return log


@pytest.mark.parametrize("kwargs, error, message",
                         [(dict(is_causal=is_causal, window=w), error, message)
                          for w, is_causal, error, message in BAD_WINDOWS]
                         + [(dict(softcap=c), error, message) for c, error, message in BAD_SOFTCAPS])
def test_bad_window_or_softcap_is_refused(kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        flash_attention_forward(Q, K, V, **kwargs)


# -- learned attention sinks (gpt-oss): one more softmax column per query head, value 0 ---------------

@st.composite
def sink_inputs(draw, dtype=None, max_len=9, sink_bound=8.0, **kw):
    """A flash_inputs or window_inputs case with a head axis and sinks (nh,), one per query head
    (grouped-query heads too). Sinks up to 8 against scores of a few units: the sink takes from
    nothing to nearly the whole row."""
    case = draw(flash_inputs(dtype=dtype, max_len=max_len, **kw) | window_inputs(dtype=dtype, max_len=max_len, **kw))
    case = {"softcap": None, "window": None, **case}
    if case["q"].ndim == 2:   # sinks need a head axis
        case.update({n: case[n][None] for n in ("q", "k", "v", "dout")})
    nh = case["q"].shape[-3]
    case["sinks"] = draw(S.arrays(case["q"].dtype, (nh,), sink_bound), label="sinks")
    return case


SKWARGS = WKWARGS + ("sinks",)

# GQA bottom-right with T > S (rows 0 and 1 see no key: out 0, lse = s_h); a window top-left with
# T > S + w - 1 (the last rows see no key); softcap with a sink far above the scores; one head, T = 1.
SINK_EDGES = [
    {**make_case(ramp(2, 4, 5, 3), ramp(2, 2, 3, 3), ramp(2, 2, 3, 2), is_causal="bottom_right", block_q=2,
                 block_k=2), "window": None, "softcap": None, "sinks": np.array([0.5, -1.0, 2.0, 0.0])},
    {**WINDOW_EDGES[0], "sinks": np.array([1.0, -3.0])},
    {**WINDOW_EDGES[1], "sinks": np.array([6.0])},
    {**make_case(ramp(1, 1, 2), ramp(1, 3, 2), ramp(1, 3, 2)), "window": None, "softcap": None,
     "sinks": np.array([-0.5])},
]


def sink_forward(case, impl="readable", **changes):
    c = {**case, **changes}
    if impl == "kernel":   # no window, softcap or bottom-right alignment in the tuned kernel
        return fa.flash_attention_forward(c["q"], c["k"], c["v"], **{n: c[n] for n in KWARGS + ("sinks",)})
    return flash_attention_forward(c["q"], c["k"], c["v"], **{n: c[n] for n in SKWARGS})


def sink_twin(case):
    """The torch twin's (out, lse) as a function of (q, k, v, sinks)."""
    return lambda q, k, v, sinks: tw.flash_attention(q, k, v, **{n: case[n] for n in WKWARGS}, sinks=sinks)


def sink_inputs_of(case):
    return {name: case[name] for name in ("q", "k", "v", "sinks")}


def dsinks_tol(case):
    """assert_close's atol for dsinks: dsinks_h = -sum over R rows (batch and query positions of
    head h) of p D, p = exp(s_h - lse) <= 1 and D = rowsum(dout * out), a sum of hv terms of at
    most G = max|dout| max|v| each. Each term is off by a few ulps of hv G (D's rounding) plus
    p's relative error, an ulp of |lse| (exp of s_h - lse rounds with lse), |lse| below
    max|s_h| + the largest score + log(S + 1); the sum of R terms adds R ulps. Hence 8 ulps of
    R hv G (1 + that bound); a bug is off by a fraction of R hv G itself."""
    q = case["q"]
    return dict(atol=max(TOLERANCES[q.dtype]["atol"], 8 * float(np.finfo(q.dtype).eps) * dsinks_size(case)))


def direct_sinks(case, q, k, v, sinks=None):
    """The sink as the issue defines it, in plain torch: the masked, capped scores, the sink
    column concatenated, softmax, the column dropped, times v. A row without a key has only its
    sink: weights 0. Without ``sinks``, plain attention with the case's mask and cap, a row
    without a key giving 0 as flash attention does (its softmax of -inf only is NaN)."""
    T, S_, hs = q.shape[-2], k.shape[-2], q.shape[-1]
    if q.shape[:-2] != k.shape[:-2]:   # grouped-query heads (no head axis: none)
        g = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(g, dim=-3), v.repeat_interleave(g, dim=-3)
    scale = 1 / math.sqrt(hs) if case["scale"] is None else case["scale"]
    s = (q * scale) @ k.transpose(-1, -2)                             # (..., nh, T, S)
    if case["softcap"] is not None:
        s = case["softcap"] * torch.tanh(s / case["softcap"])
    if case["is_causal"]:
        offset = S_ - T if case["is_causal"] == "bottom_right" else 0
        t, j = torch.arange(T)[:, None] + offset, torch.arange(S_)[None, :]
        seen = (j <= t) & (j > t - case["window"]) if case["window"] else j <= t
        s = s.masked_fill(~seen, -torch.inf)
    if sinks is None:
        weights = torch.softmax(s, dim=-1)
        return torch.where(torch.isnan(weights), 0, weights) @ v   # rows without a key: 0
    sink_column = sinks[:, None, None].expand(s.shape[:-1] + (1,))   # (nh,) -> (..., nh, T, 1)
    weights = torch.softmax(torch.cat([s, sink_column], dim=-1), dim=-1)[..., :-1]   # (..., nh, T, S)
    return weights @ v


@given(case=sink_inputs())
@example(case=SINK_EDGES[0])
@example(case=SINK_EDGES[1])
@example(case=SINK_EDGES[2])
@example(case=SINK_EDGES[3])
def test_sinks_match_twin_and_autograd(case):
    """With sinks (and causal, window, softcap, GQA as drawn): out and lse equal the twin's, and
    dq, dk, dv, dsinks autograd's of the twin."""
    out, cache = sink_forward(case)
    out_t, lse_t = tw.flash_attention(*(to_torch(case[n]) for n in ("q", "k", "v")),
                                      **{n: case[n] for n in WKWARGS}, sinks=to_torch(case["sinks"]))
    assert_close("flash[sinks].out", out, to_numpy(out_t))
    assert_close("flash[sinks].lse", cache.lse, to_numpy(lse_t))
    grads = flash_attention_backward(case["dout"], cache)
    assert len(grads) == 4, f"flash[sinks] backward returned {len(grads)} gradients, not dq, dk, dv, dsinks"
    _, grads_t = autograd(lambda **t: sink_twin(case)(**t)[0], sink_inputs_of(case), case["dout"])
    for name, d, tol in zip(("q", "k", "v", "sinks"), grads, (grad_tol(case),) * 2 + ({}, dsinks_tol(case)),
                            strict=True):
        assert_close(f"flash[sinks].d{name}", d, grads_t[name], **tol)


@given(case=sink_inputs())
@example(case=SINK_EDGES[0])
@example(case=SINK_EDGES[2])
def test_sinks_twin_matches_direct_torch(case):
    """The twin equals the sink column written out in torch (concatenate, softmax, drop), output
    and every gradient, sinks' included."""
    out_d, grads_d = autograd(lambda **t: direct_sinks(case, **t), sink_inputs_of(case), case["dout"])
    out_t, grads_t = autograd(lambda **t: sink_twin(case)(**t)[0], sink_inputs_of(case), case["dout"])
    assert_close("flash[sinks] twin.out vs direct", out_t, out_d)
    for name, tol in zip(("q", "k", "v", "sinks"), (grad_tol(case),) * 2 + ({}, dsinks_tol(case)), strict=True):
        assert_close(f"flash[sinks] twin.d{name} vs direct", grads_t[name], grads_d[name], **tol)


@given(case=window_inputs() | flash_inputs(), data=st.data())
@example(case={**make_case(ramp(2, 7, 3), ramp(2, 3, 3), ramp(2, 3, 2), is_causal=True, block_q=3, block_k=2),
               "window": 2, "softcap": None}, data=None)
def test_sinks_twin_matches_builtin(case, data):
    """torch.nn.attention.flex_attention's output and lse without a sink give the twin's with one:
    out * sigmoid(lse - s_h) (the sink only enlarges the denominator exp(lse) by exp(s_h)) and
    logaddexp(lse, s_h); rows without a key give 0 and s_h."""
    case = {"softcap": None, "window": None, **case}
    if case["q"].ndim == 2:
        case.update({n: case[n][None] for n in ("q", "k", "v")})
    nh = case["q"].shape[-3]
    drawn = None if data is None else data.draw(S.arrays(case["q"].dtype, (nh,), 8.0), label="sinks")
    sinks = (np.linspace(-3, 5, nh) if drawn is None else drawn).astype(case["q"].dtype)
    out_b, lse_b = builtin_flex(case)
    s_h = to_torch(sinks)[:, None]                                       # (nh, 1)
    out_sink, lse_sink = out_b * torch.sigmoid(lse_b - s_h)[..., None], torch.logaddexp(lse_b, s_h)
    out_t, lse_t = tw.flash_attention(*(to_torch(case[n]) for n in "qkv"), **{n: case[n] for n in WKWARGS},
                                      sinks=to_torch(sinks))
    assert_close("flash[sinks] twin.out vs flex_attention", to_numpy(out_t), to_numpy(out_sink).reshape(out_t.shape))
    assert_close("flash[sinks] twin.lse vs flex_attention", to_numpy(lse_t), to_numpy(lse_sink).reshape(lse_t.shape))


@given(case=sink_inputs(dtype=np.float64, max_len=5, max_head=3, max_side=2, bound=1.0, sink_bound=2.0))
@example(case=SINK_EDGES[0])
@example(case=SINK_EDGES[2])
def test_sinks_backward_matches_finite_differences(case):
    """dq, dk, dv and dsinks against finite differences in float64 (bounded as the tests above:
    the stencil's error stays near 1e-12)."""
    if case["softcap"] is not None:
        case = {**case, "softcap": max(case["softcap"], 0.2)}
    assert_matches_finite_differences("flash[sinks]", case, sink_forward)


@given(case=sink_inputs(dtype=np.float32))
@example(case={**SINK_EDGES[1], **{n: SINK_EDGES[1][n].astype(np.float32) for n in ("q", "k", "v", "dout", "sinks")}})
def test_sinks_float32_follow_the_fa4_rule(case):
    """dsinks and out in float32 of the readable version and of the kernel (where it applies)
    against the float64 truth: within the FlashAttention-4 rule of the twin's float32 error, plus
    the roundings in which an implementation may differ from the twin's on the same formula. The
    scores are rounded by each one's own matmul, tanh and exp (NumPy's, not torch's; the kernel
    folds log2(e) into q's scale, subtracts c inside the matmul and takes its sink times
    log2(e)), each to a few ulps of the largest score or sink |s| (|s2| = log2(e) |s| in the
    kernel's base 2), twice for a difference of two; so every probability is off by 4 eps (1 + 2 |s|)
    relatively, as in lse_allowance. That scales sum over the rows of |p D| for dsinks_h (from
    the float64 forward) and max|v| for out. On a small case a lucky twin can be nearly exact,
    and without this the rule would ask the other roundings to be exact too."""
    case64 = {**case, **{n: case[n].astype(np.float64) for n in ("q", "k", "v", "dout", "sinks")}}
    out_64, grads_64 = autograd(lambda **t: direct_sinks(case64, **t), sink_inputs_of(case64), case64["dout"])
    out_t, grads_t = autograd(lambda **t: sink_twin(case)(**t)[0], sink_inputs_of(case), case["dout"])
    _, cache_64 = sink_forward(case64)
    pD = np.abs(cache_64.sink_p * (case64["dout"] * cache_64.out).sum(axis=-1))   # (..., nh, T)
    pD = pD.sum(axis=-1).reshape(-1, pD.shape[-2]).sum(axis=0)                    # (nh,)
    q, k = case["q"], case["k"]
    scale = 1 / math.sqrt(q.shape[-1]) if case["scale"] is None else case["scale"]
    largest = max(scale * q.shape[-1] * float(np.abs(q).max()) * float(np.abs(k).max()),
                  float(np.abs(case["sinks"]).max()))
    kernel_applies = case["is_causal"] != "bottom_right" and case["window"] is None and case["softcap"] is None
    for impl in ("readable", "kernel") if kernel_applies else ("readable",):
        out, cache = sink_forward(case, impl)
        dsinks = IMPLS[impl][1](case["dout"], cache)[3]
        s = largest * (math.log2(math.e) if impl == "kernel" else 1)
        relative = 4 * float(np.finfo(np.float32).eps) * (1 + 2 * s)
        assert_fa4_rule(f"flash {impl}[sinks].dsinks float32", dsinks, grads_t["sinks"], grads_64["sinks"],
                        extra=relative * pD)
        assert_fa4_rule(f"flash {impl}[sinks].out float32", out, out_t, out_64,
                        extra=relative * float(np.abs(case["v"]).max()))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("is_causal", [False, True])
def test_sinks_without_keys_give_zeros(impl, is_causal):
    """S = 0: each row holds its sink alone, so weights 0 and output 0 (not NaN), lse = s_h, and
    every gradient 0, dsinks included (D = rowsum(dout * 0) = 0)."""
    q, k, v, sinks = ramp(2, 3, 4), np.zeros((2, 0, 4)), np.zeros((2, 0, 5)), np.array([1.5, -2.0])
    forward, backward = IMPLS[impl]
    out, cache = forward(q, k, v, is_causal=is_causal, sinks=sinks)
    dq, dk, dv, dsinks = backward(ramp(2, 3, 5), cache)
    assert_close("flash[sinks].out with S = 0", out, np.zeros((2, 3, 5)))
    assert_close("flash[sinks].lse with S = 0", cache.lse, np.repeat(sinks[:, None], 3, axis=1))
    assert_close("flash[sinks].dq with S = 0", dq, np.zeros_like(q))
    assert_close("flash[sinks].dsinks with S = 0", dsinks, np.zeros(2))
    assert dk.shape == (2, 0, 4) and dv.shape == (2, 0, 5), f"dk {dk.shape}, dv {dv.shape}"


def test_sinks_rows_without_keys_give_zeros():
    """Bottom-right with T > S: rows 0..T-S-1 see no key; with a sink they give output 0, lse = s_h
    and no gradient, while the other rows' weights sum to 1 - p, p the sink's probability."""
    case = SINK_EDGES[0]
    out, cache = sink_forward(case)
    dq, _, _, _ = flash_attention_backward(case["dout"], cache)
    assert np.all(out[..., :2, :] == 0) and np.all(dq[..., :2, :] == 0), "flash[sinks]: rows without a key"
    assert_close("flash[sinks].lse of rows without a key", cache.lse[..., :2],
                 np.broadcast_to(case["sinks"][:, None], cache.lse[..., :2].shape))
    # v = 1 everywhere: out = sum of the weights = 1 - exp(s_h - lse)
    ones = {**case, "v": np.ones_like(case["v"])}
    out_1, cache_1 = sink_forward(ones)
    p_sink = np.exp(case["sinks"][:, None] - cache_1.lse)
    assert_close("flash[sinks] weights sum to 1 - p_sink", out_1[..., 0], 1 - p_sink)


def test_sinks_large_against_the_scores_stay_finite():
    """A sink far above every score (1e3 in float32, past exp's overflow against m = 0) takes the
    whole row: output about 0, dsinks about 0; far below, it changes nothing."""
    q, k, v = (ramp(2, 4, 3, dtype=np.float32) for _ in range(3))
    dout = ramp(2, 4, 3, dtype=np.float32)
    for impl, (forward, backward) in IMPLS.items():
        plain, _ = forward(q, k, v)
        high, cache = forward(q, k, v, sinks=np.float32([1e3, 1e3]))
        grads = backward(dout, cache)
        assert all(np.isfinite(a).all() for a in (high, cache.lse, *grads)), f"flash {impl}[sinks]: not finite"
        assert_close(f"flash {impl}[sinks].out with a sink of 1e3", high, np.zeros_like(high))
        low, _ = forward(q, k, v, sinks=np.float32([-1e3, -1e3]))
        assert_close(f"flash {impl}[sinks].out with a sink of -1e3", low, plain)


BAD_SINKS = [   # (sinks, q, error, what the message must say)
    (np.zeros(3), Q, ValueError,
     "sinks must have shape (nh,) = (4,), one per query head (q (2, 4, 3, 8)), got shape (3,)"),
    (np.zeros((4, 1)), Q, ValueError, "got shape (4, 1)"),
    (np.zeros(4, np.float32), Q, TypeError, "sinks must have q's dtype float64, got dtype float32"),
    ([0.0] * 4, Q, TypeError, "sinks must be a NumPy array (nh,) or None, got list [0.0, 0.0, 0.0, 0.0]"),
    (np.array([0, np.nan, 0, 0]), Q, ValueError, "sinks must be finite, got array([ 0., nan,  0.,  0.])"),
    (np.array([0, 0, np.inf, 0]), Q, ValueError, "sinks must be finite, got array([ 0.,  0., inf,  0.])"),
    (np.zeros(3), Q[0, 0], ValueError, "sinks must have shape (nh,), but q has no head axis"),
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("sinks, q, error, message", BAD_SINKS)
def test_bad_sinks_are_refused(impl, sinks, q, error, message):
    k, v = (K, V) if q.ndim == 4 else (K[0, 0], V[0, 0])
    with pytest.raises(error, match=re.escape(message)):
        IMPLS[impl][0](q, k, v, sinks=sinks)


# -- float16 and bfloat16: FlashAttention's error rule ---------------------------------------------

def torch_lowp(case, q, k, v, sinks=None):
    """PyTorch's own attention in the low dtype of q: F.scaled_dot_product_attention (on CPU its
    default backend is the flash kernel, which rounds P before P @ V, docs/precision.md) where it
    expresses the case (no softcap, window or sinks; no mask or the top-left causal one), else
    direct_sinks, plain torch ops each rounding in the low dtype as a user's code would."""
    if case["softcap"] is None and case["window"] is None and sinks is None and case["is_causal"] != "bottom_right":
        return F.scaled_dot_product_attention(q, k, v, is_causal=bool(case["is_causal"]), scale=case["scale"],
                                              enable_gqa=q.shape[:-2] != k.shape[:-2])
    return direct_sinks(case, q, k, v, sinks)


@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@given(case=flash_inputs(dtype=np.float64) | window_inputs(dtype=np.float64) | sink_inputs(dtype=np.float64))
@example(case=EDGE_CASES[1])
@example(case=EDGE_CASES[3])
@example(case=WINDOW_EDGES[1])
@example(case=SINK_EDGES[0])
@example(case=SINK_EDGES[2])
def test_low_precision_meets_the_error_budget(dtype, case):
    """The readable version, its twin and (where it applies) the tuned kernel in float16 and
    bfloat16 against the float64 truth on the same rounded inputs (direct_sinks, autograd):
    within twice PyTorch's own low-precision error (torch_lowp), out and every gradient."""
    case = {"softcap": None, "window": None, "sinks": None, **case}
    names = ("q", "k", "v") + (("sinks",) if case["sinks"] is not None else ())
    low = {n: round_to(case[n], dtype) for n in names}                 # the inputs every side shares
    dout = round_to(case["dout"], dtype)
    truth_out, truth_grads = autograd(lambda **t: direct_sinks(case, **t),
                                      {n: a.astype(np.float64) for n, a in low.items()}, dout.astype(np.float64))
    torch_out, torch_grads = autograd(lambda **t: torch_lowp(case, **t), low, dout)
    twin_out, twin_grads = autograd(lambda **t: tw.flash_attention(**t, **{n: case[n] for n in WKWARGS})[0],
                                    low, dout)
    ours = {"numpy": sink_forward({**case, **low}), "twin": (twin_out, tuple(twin_grads.values()))}
    ours["numpy"] = (ours["numpy"][0], flash_attention_backward(dout, ours["numpy"][1]))
    if case["is_causal"] != "bottom_right" and case["window"] is None and case["softcap"] is None:
        out_k, cache_k = sink_forward({**case, **low}, "kernel")
        ours["kernel"] = (out_k, fa.flash_attention_backward(dout, cache_k))
    extra = float32_allowance({**case, **{n: a.astype(np.float64) for n, a in low.items()}})
    for who, (out, grads) in ours.items():
        tensors = {"out": (out, torch_out, truth_out)}
        tensors.update({f"d{n}": (g, torch_grads[n], truth_grads[n]) for n, g in zip(names, grads, strict=True)})
        assert_error_budget(f"flash_attention[{who}]", dtype, tensors, extra=extra)


@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_low_precision_mixed_dtypes_are_refused(dtype):
    """A low-precision q with float32 k and v (or sinks) is refused, as a float32/float64 mix."""
    low = LOW_DTYPES[dtype][0]
    q, k, v = (ramp(2, 3, 4).astype(low), ramp(2, 5, 4).astype(np.float32), ramp(2, 5, 4).astype(np.float32))
    for forward, _ in IMPLS.values():
        with pytest.raises(TypeError, match=f"must share one dtype: q is {dtype}, k is float32"):
            forward(q, k, v)
        with pytest.raises(TypeError, match=f"sinks must have q's dtype {dtype}, got dtype float32"):
            forward(q, k.astype(low), v.astype(low), sinks=np.zeros(2, np.float32))
    _, cache = flash_attention_forward(q, k.astype(low), v.astype(low))
    with pytest.raises(TypeError, match=f"dout must have the dtype of the forward's output, {dtype}, got float32"):
        flash_attention_backward(np.zeros((2, 3, 4), np.float32), cache)


@pytest.mark.parametrize("impl", IMPLS)
def test_scale_and_cap_lost_in_the_dtype_computed_in_are_refused(impl):
    """1e300 is finite in float64 but inf in float32, where float32 (and float16, bfloat16) inputs
    are computed: every score inf or NaN, c * tanh(s / c) NaN. 1e-50 is 0 there. float64 holds both."""
    q = Q.astype(np.float32)
    names = ("scale", "softcap") if impl == "readable" else ("scale",)   # the kernel has no cap
    for name in names:
        for value, what in ((1e300, "overflows to inf"), (1e-50, "underflows to 0")):
            with pytest.raises(ValueError, match=rf"^{name} must be finite .* in float32, the dtype it is computed "
                                                 rf"in: {name} = {re.escape(repr(value))} {what}$"):
                IMPLS[impl][0](q, q, q, **{name: value})
        out, _ = IMPLS[impl][0](Q, Q, Q, **{name: 1e-50})
        assert np.isfinite(out).all(), f"float64 holds {name} = 1e-50"
