"""Tests of the tuned kernel's own choices in numpy_attn/kernels/flash_attention.py.

The kernel's forward tries each block of query rows with unshifted exponentials (no running
maximum) and falls back to the running maximum where that could overflow or underflow; it
exponentiates in base e or base 2 depending on the CPU. Each path and each base must give the
reference's (numpy_attn/attention.py) output, log-sum-exp and gradients, and the fast path must
be the one taken on ordinary inputs.
"""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import numpy_attn.kernels.flash_attention as fa
from numpy_attn.attention import (
    scaled_dot_product_attention_backward,
    scaled_dot_product_attention_forward,
)
from parity_tests import strategies as S
from parity_tests.helpers import TOLERANCES, assert_close


@st.composite
def kernel_inputs(draw, dtype=None, max_len=9, max_head=4):
    """q, k, v, dout and keyword arguments; ``logits`` multiplies q so that the scores reach past
    exp's overflow (float32: 88.7, float64: 709.8) or far below its underflow."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    lead = draw(S.batch_shapes(max_dims=2, max_side=3))
    T, S_ = draw(S.dim(1, max_len)), draw(S.dim(1, max_len))
    hs, hv = draw(S.dim(1, max_head)), draw(S.dim(1, max_head))
    logits = draw(st.sampled_from([1.0, 30.0 if dtype == np.float32 else 300.0]))
    return dict(
        q=draw(S.arrays(dtype, lead + (T, hs))) * dtype(logits),
        k=draw(S.arrays(dtype, lead + (S_, hs))),
        v=draw(S.arrays(dtype, lead + (S_, hv))),
        dout=draw(S.arrays(dtype, lead + (T, hv))),
        is_causal=draw(st.booleans()),
        scale=draw(st.none() | st.floats(0.1, 2.0)),
        block_q=draw(st.integers(1, T + 2)),
        block_k=draw(st.integers(1, S_ + 2)),
    )


def kernel(case):
    """The kernel's (out, lse, (dq, dk, dv)) on the case."""
    out, cache = fa.flash_attention_forward(case["q"], case["k"], case["v"], is_causal=case["is_causal"],
                                            scale=case["scale"], block_q=case["block_q"],
                                            block_k=case["block_k"])
    return out, cache.lse, fa.flash_attention_backward(case["dout"], cache)


def reference(case):
    """The reference's (out, lse, (dq, dk, dv)); lse from its probabilities' largest entry:
    log p_max = s_max - lse, with s_max recomputed here in float64."""
    q, k, v, dout = (case[n] for n in ("q", "k", "v", "dout"))
    out, cache = scaled_dot_product_attention_forward(q, k, v, is_causal=case["is_causal"],
                                                      scale=case["scale"])
    scale = 1 / math.sqrt(q.shape[-1]) if case["scale"] is None else case["scale"]
    s = (q.astype(np.float64) @ np.swapaxes(k, -1, -2).astype(np.float64)) * scale
    if case["is_causal"]:
        s = np.where(np.tri(*s.shape[-2:], dtype=bool), s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    lse = (m + np.log(np.exp(s - m).sum(axis=-1, keepdims=True)))[..., 0].astype(q.dtype)
    return out, lse, scaled_dot_product_attention_backward(dout, cache)


def tolerances(case):
    """{result: assert_close keywords} for comparing two computations of the case.

    The dtype's defaults, plus what any exact-in-real-arithmetic computation loses to rounding
    here: (1) dq and dk cancel in dS = P (dP - D), so they are off by a few ulps of
    M = scale max|q, k| max(T, S) max|dout| max|v| hv (the bound used for the flash tests), 8 ulps
    allowed; (2) every probability is exp of a score rounded to an ulp of the largest score |s|,
    so P is off by a few ulps of |s|, relatively (4 allowed), whatever the shift: out (a mean of
    v) by that times max|v|, lse by that absolutely, dv (g T rows of P dout) by that times
    T max|dout|, dq and dk by that times M.
    """
    q, k, v, dout = (case[n] for n in ("q", "k", "v", "dout"))
    eps = float(np.finfo(q.dtype).eps)
    T, S_, hs, hv = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    scale = 1 / math.sqrt(hs) if case["scale"] is None else case["scale"]
    qk = max(float(np.abs(q).max()), float(np.abs(k).max()))
    M = scale * qk * max(T, S_) * float(np.abs(dout).max()) * float(np.abs(v).max()) * hv
    largest = scale * hs * float(np.abs(q).max()) * float(np.abs(k).max())   # bound on |score|
    relative = 4 * eps * (1 + largest)
    atol = TOLERANCES[q.dtype]["atol"]
    return {"out": dict(atol=atol + relative * float(np.abs(v).max())),
            "lse": dict(atol=atol + relative),
            "dq": dict(atol=atol + (8 * eps + relative) * M),
            "dk": dict(atol=atol + (8 * eps + relative) * M),
            "dv": dict(atol=atol + relative * T * float(np.abs(dout).max()))}


def assert_all_close(label, got, expected, tol):
    (out, lse, grads), (out_e, lse_e, grads_e) = got, expected
    assert_close(f"{label}.out", out, out_e, **tol["out"])
    assert_close(f"{label}.lse", lse, lse_e, **tol["lse"])
    for name, d, d_e in zip(("dq", "dk", "dv"), grads, grads_e, strict=True):
        assert_close(f"{label}.{name}", d, d_e, **tol[name])


def _always_shifted(monkeypatch):
    """Make the unshifted path refuse every block: the forward takes the fallback everywhere."""
    monkeypatch.setattr(fa, "UNSHIFTED_MIN_SUM", np.inf)


# -- both paths give the reference ---------------------------------------------------------------

@given(case=kernel_inputs(dtype=np.float64))
def test_each_path_matches_the_reference_float64(case):
    """float64: the path taken (unshifted where safe, else shifted) and the shifted path alone
    both equal the reference, scores past exp's overflow included."""
    expected, tol = reference(case), tolerances(case)
    assert_all_close("kernel", kernel(case), expected, tol)
    with pytest.MonkeyPatch.context() as mp:
        _always_shifted(mp)
        assert_all_close("kernel shifted", kernel(case), expected, tol)


@given(case=kernel_inputs(dtype=np.float32))
def test_paths_agree_float32(case):
    """float32: the path taken equals the shifted path alone (same tiles, both in float32) to
    rounding, and the reference computed in float32."""
    got, tol = kernel(case), tolerances(case)
    with pytest.MonkeyPatch.context() as mp:
        _always_shifted(mp)
        assert_all_close("kernel vs shifted", got, kernel(case), tol)
    assert_all_close("kernel vs reference", got, reference(case), tol)


# -- which path is taken ------------------------------------------------------------------------

def _count_fallbacks(monkeypatch):
    calls = []
    shifted = fa._rows_shifted
    monkeypatch.setattr(fa, "_rows_shifted", lambda *a: calls.append(a[4]) or shifted(*a))
    return calls


@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
def test_ordinary_scores_take_the_unshifted_path(monkeypatch, dtype):
    """Scores of a few units (unit-normal q and k): no block falls back, which is the speed-up."""
    calls = _count_fallbacks(monkeypatch)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 64, 16)).astype(dtype) for _ in range(3))
    for is_causal in (False, True):
        fa.flash_attention_forward(q, k, v, is_causal=is_causal, block_q=16, block_k=24)
    assert calls == [], f"blocks starting at rows {calls} fell back to the running maximum"


@pytest.mark.parametrize("dtype, big", [(np.float32, 100.0), (np.float64, 800.0)])
@pytest.mark.parametrize("sign", [1, -1])
def test_overflow_and_underflow_fall_back(monkeypatch, dtype, big, sign):
    """One query row whose scores overflow exp (sign 1) or whose row sum is below 2^-64 (sign -1:
    all scores -big) makes its block, and only it, fall back; the result is the reference's."""
    calls = _count_fallbacks(monkeypatch)
    rng = np.random.default_rng(1)
    q, k, v, dout = (rng.standard_normal((1, 12, 4)).astype(dtype) * 0.5 for _ in range(4))
    k[..., 0] = 1.0
    q[0, 5] = 0                                                   # row 5: scores = big * k[:, 0] = big
    q[0, 5, 0] = sign * big * 2                                   # scale 1/2 for hs = 4
    case = dict(q=q, k=k, v=v, dout=dout, is_causal=False, scale=None, block_q=4, block_k=5)
    assert_all_close("kernel", kernel(case), reference(case), tolerances(case))
    assert calls == [4], f"fallbacks of blocks at rows {calls}, expected the block at row 4 only"


# -- the base of the exponentials ------------------------------------------------------------------

@given(case=kernel_inputs(), base2=st.booleans())
def test_either_base_gives_the_reference(case, base2):
    """Base 2 (chosen on CPUs where NumPy vectorizes exp2) and base e give the reference's
    results (float64) and each other's (float32)."""
    bases = {False: (np.exp, np.log, 1.0), True: (np.exp2, np.log2, fa.LOG2E)}
    with pytest.MonkeyPatch.context() as mp:
        for name, value in zip(("EXP", "LOG", "LOG_FACTOR"), bases[base2], strict=True):
            mp.setattr(fa, name, value)
        got = kernel(case)
    label = f"kernel base {2 if base2 else 'e'}"
    if case["q"].dtype == np.float64:
        assert_all_close(label, got, reference(case), tolerances(case))
    else:
        with pytest.MonkeyPatch.context() as mp:
            for name, value in zip(("EXP", "LOG", "LOG_FACTOR"), bases[not base2], strict=True):
                mp.setattr(fa, name, value)
            assert_all_close(f"{label} vs the other base", got, kernel(case), tolerances(case))


def test_kernel_refuses_alignments_it_does_not_tune():
    """A truthy string would otherwise run as top-left causal attention without a word."""
    q = np.zeros((1, 1, 3, 2))
    with pytest.raises(ValueError, match="is_causal must be True or False .* got 'bottom_right'"):
        fa.flash_attention_forward(q, q, q, is_causal="bottom_right")


def test_kernel_tiles_are_clamped_to_the_lengths():
    """Huge tile sizes on a few tokens allocate tiles of the sequence's size, not of the request."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 3, 4)) for _ in range(3))
    out, cache = fa.flash_attention_forward(q, k, v, block_q=2**40, block_k=2**40)
    ref, _ = scaled_dot_product_attention_forward(q, k, v)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-14, err_msg="kernel out, clamped tiles")
    assert (cache.block_q, cache.block_k) == (3, 3), (cache.block_q, cache.block_k)
