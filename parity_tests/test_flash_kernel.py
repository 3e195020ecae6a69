"""Tests of the tuned kernel's own choices in numpy_attn/kernels/flash_attention.py.

The kernel's forward tries each block of query rows without the running maximum (each row's
exponentials shifted once, by its score against key 0) and falls back to the running maximum
where that overflows; it exponentiates in base e or base 2 depending on the CPU. Each path and
each base must give the reference's (numpy_attn/attention.py) output, log-sum-exp and gradients,
the fast path must be the one taken on ordinary inputs, and on extreme but finite inputs the
kernel must be as accurate as the readable numpy_attn/flash_attention.py.
"""

import math

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import numpy_attn.kernels.flash_attention as fa
from numpy_attn.attention import (
    scaled_dot_product_attention_backward,
    scaled_dot_product_attention_forward,
)
from numpy_attn.flash_attention import flash_attention_backward as readable_backward
from numpy_attn.flash_attention import flash_attention_forward as readable_forward
from parity_tests import strategies as S
from parity_tests.helpers import LOW_DTYPES, TOLERANCES, assert_close, round_to


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
    T max|dout|, dq and dk by that times M. A sink s_h is one more score (its exponent s_h - c
    or s_h - m is one more score difference): |s_h| joins the bound on |s|; and dsinks, a sum
    over R rows of p D (p <= 1, |D| <= G = hv max|dout| max|v|, D's own rounding a few ulps of
    G), is off by (8 eps + P's relative error) R G.
    """
    q, k, v, dout = (case[n] for n in ("q", "k", "v", "dout"))
    eps = float(np.finfo(q.dtype).eps)
    T, S_, hs, hv = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    scale = 1 / math.sqrt(hs) if case["scale"] is None else case["scale"]
    qk = max(float(np.abs(q).max()), float(np.abs(k).max()))
    M = scale * qk * max(T, S_) * float(np.abs(dout).max()) * float(np.abs(v).max()) * hv
    largest = scale * hs * float(np.abs(q).max()) * float(np.abs(k).max())   # bound on |score|
    sinks = case.get("sinks")
    if sinks is not None:
        largest = max(largest, float(np.abs(sinks).max()))
    relative = 4 * eps * (1 + largest)
    atol = TOLERANCES[q.dtype]["atol"]
    extra = {}
    if sinks is not None:
        R, G = q.size // (hs * q.shape[-3]), hv * float(np.abs(dout).max()) * float(np.abs(v).max())
        extra["dsinks"] = dict(atol=atol + (8 * eps + relative) * R * G)
    return {**extra, "out": dict(atol=atol + relative * float(np.abs(v).max())),
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
    monkeypatch.setattr(fa, "_rows_unshifted", lambda q_blk, *args: np.zeros(len(q_blk), bool))   # no slice safe


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


def _one_row_of_scores(dtype, big, first):
    """q, k, v, dout (1, 12, 4) of unit size, except query row 5: its scores are ``first`` * big
    against key 0 and big against every other key (scale 1/2 for hs = 4)."""
    rng = np.random.default_rng(1)
    q, k, v, dout = (rng.standard_normal((1, 12, 4)).astype(dtype) * 0.5 for _ in range(4))
    k[..., 0] = 1.0
    k[0, 0, 0] = first
    q[0, 5] = 0
    q[0, 5, 0] = big * 2
    return dict(q=q, k=k, v=v, dout=dout, is_causal=False, scale=None, block_q=4, block_k=5)


@pytest.mark.parametrize("dtype, big", [(np.float32, 100.0), (np.float64, 800.0)])
def test_scores_far_above_key_0_fall_back(monkeypatch, dtype, big):
    """One query row whose scores rise 2 big above its score against key 0 (past exp's overflow:
    float32 88.7, float64 709.8) makes its block, and only it, fall back to the running maximum;
    the result is the reference's."""
    calls = _count_fallbacks(monkeypatch)
    case = _one_row_of_scores(dtype, big, first=-1.0)
    assert_all_close("kernel", kernel(case), reference(case), tolerances(case))
    assert calls == [4], f"fallbacks of blocks at rows {calls}, expected the block at row 4 only"


@pytest.mark.parametrize("dtype, big", [(np.float32, 100.0), (np.float64, 800.0)])
@pytest.mark.parametrize("sign", [1, -1])
def test_scores_far_from_zero_stay_on_the_fast_path(monkeypatch, dtype, big, sign):
    """A row whose scores are all +big (exp(s) alone would overflow) or all -big (exp(s) alone
    would underflow to 0) is shifted by its score against key 0 and needs no fallback."""
    calls = _count_fallbacks(monkeypatch)
    case = _one_row_of_scores(dtype, sign * big, first=1.0)
    assert_all_close("kernel", kernel(case), reference(case), tolerances(case))
    assert calls == [], f"blocks starting at rows {calls} fell back to the running maximum"


# -- the causal forward's stacks of slices ------------------------------------------------------

def _three_slices(dtype):
    """q, k, v, dout (3, 12, 4), causal: slices 0 and 2 of unit size, slice 1 the row of
    _one_row_of_scores whose scores rise past exp's overflow above its score against key 0."""
    one = _one_row_of_scores(dtype, 100.0 if dtype == np.float32 else 800.0, first=-1.0)
    rng = np.random.default_rng(2)
    case = {name: rng.standard_normal((3, 12, 4)).astype(dtype) for name in ("q", "k", "v", "dout")}
    for name in case:
        case[name][1] = one[name][0]
    return {**one, **case, "is_causal": True}


@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
@pytest.mark.parametrize("threads", [1, 2])
def test_a_stacked_slice_gives_what_it_gives_alone(monkeypatch, dtype, threads):
    """The causal forward stacks slices in its calls; one that falls back is computed again
    alone, so every slice's output, lse and gradients equal, to the last bit, those of the slice
    run by itself, with one stack of three (one thread) or stacks of two and one (two), and only
    the overflowing slice's block falls back."""
    case = _three_slices(dtype)
    monkeypatch.setattr(fa, "PARALLEL_MIN_WORK", 0)
    monkeypatch.setattr(fa, "_cpu_count", lambda: threads)
    assert fa._stack_size(3, case["block_q"], case["block_k"], True) == (3 if threads == 1 else 2)
    calls = _count_fallbacks(monkeypatch)
    out, lse, grads = kernel(case)
    assert calls == [4], f"fallbacks of blocks at rows {calls}, expected slice 1's block at row 4 only"
    for n in range(3):
        alone = kernel({**case, **{name: case[name][n:n + 1] for name in ("q", "k", "v", "dout")}})
        for name, got, expected in [("out", out, alone[0]), ("lse", lse, alone[1]),
                                    *zip(("dq", "dk", "dv"), grads, alone[2], strict=True)]:
            assert np.array_equal(got[n:n + 1], expected), f"slice {n}'s {name} changed by the slices stacked with it"
    assert_all_close("kernel, stacked", (out, lse, grads), reference(case), tolerances(case))


def test_the_causal_forward_stacks_its_calls(monkeypatch):
    """Four causal slices on one thread take one stack: as many exponential calls as one slice
    alone, each over four slices' scores. The non-causal forward stays one slice per call."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((4, 64, 8)).astype(np.float32) for _ in range(3))
    monkeypatch.setattr(fa, "_cpu_count", lambda: 1)
    sizes, exp = [], fa.EXP

    def counting_exp(x, *args, **kwargs):
        if kwargs.get("out") is x:                           # in place: a tile of scores
            sizes.append(x.size)
        return exp(x, *args, **kwargs)

    monkeypatch.setattr(fa, "EXP", counting_exp)
    counts = {}
    for is_causal in (True, False):
        for slices in (1, 4):
            sizes.clear()
            fa.flash_attention_forward(q[:slices], k[:slices], v[:slices], is_causal=is_causal, block_q=16, block_k=32)
            counts[is_causal, slices] = list(sizes)
    assert counts[True, 4] == [4 * x for x in counts[True, 1]], "the causal forward did not stack its four slices"
    assert counts[False, 4] == counts[False, 1] * 4, "the non-causal forward stacked its slices"


# -- as accurate as the readable version on extreme inputs ---------------------------------------

def _float64_truth(q, k, v, is_causal, scale):
    """softmax(scale q k^T) v and the weights, in float64 from the float32 inputs (hs = 1)."""
    s = (q.astype(np.float64) * np.float64(scale)) @ k.astype(np.float64).T   # (T, S), exact to 2^-53
    if is_causal:
        s = np.where(np.tri(*s.shape, dtype=bool), s, -np.inf)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return p @ v.astype(np.float64), p


MAGNITUDES = st.floats(0.25, 4.0, width=32)


@st.composite
def extreme_inputs(draw):
    """float32 q (T, 1), k (S, 1), v (S, hv): scores q k scale from 0 to about 1.6e38 (float32's
    largest is 3.4e38; the kernel's base 2 multiplies them by 1.44), spread over the keys of a
    row by up to 2400, far past exp's underflow (-87 to -104) and overflow (88.7), and often
    drawn near those thresholds themselves (a row maximum within 100 of 0, gaps below it of up
    to 120), where a weight that is lost or kept decides the result; values up to 1e30. |q| >= 1/4 or 0 and the
    scale >= 1/4, so q * scale is never subnormal (which would make both implementations'
    scores, not their softmax, inaccurate)."""
    T, S_, hv = draw(S.dim(1, 4)), draw(S.dim(1, 9)), draw(S.dim(1, 3))
    signed = MAGNITUDES | MAGNITUDES.map(lambda x: -x)
    q = draw(hnp.arrays(np.float32, (T, 1), elements=st.just(1.0) | st.just(0.0) | signed))
    # Keys as a top value less gaps: with q = 1 and scale 1 the top is the row maximum and the
    # gaps the distances below it, often within reach of exp's underflow (87 to 104 below).
    top = np.float32(draw(st.floats(-2.0 ** 125, 2.0 ** 125, width=32)   # about 4e37
                          | st.floats(-100, 100, width=32)))
    gaps = st.floats(0, 2400, width=32) | st.floats(0, 120, width=32)
    k = top - draw(hnp.arrays(np.float32, (S_, 1), elements=gaps))
    values = st.floats(-2.0 ** 100, 2.0 ** 100, width=32) | st.floats(-4, 4, width=32)   # 2^100: 1.3e30
    v = draw(hnp.arrays(np.float32, (S_, hv), elements=values))
    return dict(q=q, k=k.astype(np.float32), v=v, is_causal=draw(st.booleans()),
                scale=draw(st.just(1.0) | st.floats(0.25, 1.0, width=32)),
                block_q=draw(st.integers(1, T + 1)), block_k=draw(st.integers(1, S_ + 1)))


# The case: weights 1 and e^-70 (a normal float32) of values 1 and 1e30: out = 1.3975.
# Exponentials not shifted at all underflowed e^-110 to 0 and gave 1.0.
SMALL_WEIGHT = dict(q=np.array([[1]], np.float32), k=np.array([[-40], [-110]], np.float32),
                    v=np.array([[1], [1e30]], np.float32), is_causal=False, scale=1.0, block_q=1,
                    block_k=2)


@given(case=extreme_inputs())
@example(case=SMALL_WEIGHT)
@example(case={**SMALL_WEIGHT, "k": np.array([[-40], [60], [-50]], np.float32),   # key 0 far below
               "v": np.array([[1e30], [1], [1e30]], np.float32), "block_k": 1})    # the maximum
def test_kernel_is_as_accurate_as_the_readable_version(case):
    """Against the float64 truth, each output element's error is at most twice the readable
    version's plus what the kernel's own roundings can add, bounded here (eps = 2^-23):

    - each weight is exp2 of a score computed as q (scale log2 e) k - c in float32: the products
      and the subtraction of c (another score) round to a few ulps of the largest base-2 score
      |s2| <= L = log2(e) scale max|q| max|k| (hs = 1), 4 (hs + 1) eps L, and exp2 adds an ulp:
      relative error 4 (hs + 1) eps L + eps per weight;
    - the sums over S keys of w v and of w round by S eps relative to sum w |v| and sum w, and
      out = numerator / l once more;
    so out is off by at most 2 eps (4 (hs + 1) L + S + 3) W, W = sum_j p_j |v_j| (the true
    weights; |out| <= W). A weight that underflows loses under 2^-126 against l >= 1: S 2^-126
    max|v| more. Losing a weight the readable version keeps (e^-70 of 1e30 above: 0.4 of 1.4) is
    far outside this: for that case the bound is 2e-4."""
    q, k, v = case["q"], case["k"], case["v"]
    args = (q, k, v)
    kwargs = {n: case[n] for n in ("is_causal", "scale", "block_q", "block_k")}
    truth, p = _float64_truth(q, k, v, case["is_causal"], np.float32(case["scale"]))
    with np.errstate(all="ignore"):   # the readable version's exp of -inf and far-below scores
        readable = readable_forward(*args, **kwargs)[0].astype(np.float64)
    got = fa.flash_attention_forward(*args, **kwargs)[0].astype(np.float64)
    eps = float(np.finfo(np.float32).eps)
    S_, hs = k.shape
    L = math.log2(math.e) * float(case["scale"]) * float(np.abs(q).max()) * float(np.abs(k).max())
    W = p @ np.abs(v.astype(np.float64))                                   # (T, hv)
    allowed = (2 * np.abs(readable - truth) + 2 * eps * (4 * (hs + 1) * L + S_ + 3) * W
               + S_ * 2.0 ** -126 * float(np.abs(v).max()))
    err = np.abs(got - truth)
    worst = np.unravel_index(np.argmax(err - allowed), err.shape)
    assert np.all(err <= allowed), (
        f"kernel out{list(worst)} = {got[worst]!r}, truth {truth[worst]!r}: error {err[worst]:.3g} > "
        f"allowed {allowed[worst]:.3g} (readable's error {abs(readable[worst] - truth[worst]):.3g})")


def test_small_weights_of_large_values_are_kept():
    """The issue's case pinned: the kernel, like the readable version and torch, gives 1.3975."""
    case = SMALL_WEIGHT
    kwargs = {n: case[n] for n in ("is_causal", "scale", "block_q", "block_k")}
    truth = 1 + math.exp(-70) * 1e30 / (1 + math.exp(-70))
    for label, forward in (("kernel", fa.flash_attention_forward), ("readable", readable_forward)):
        out = forward(case["q"], case["k"], case["v"], **kwargs)[0]
        # float32: a few ulps of the result; e^-70 itself is an ulp-accurate normal float32.
        np.testing.assert_allclose(out, [[truth]], rtol=8 * np.finfo(np.float32).eps, atol=0,
                                   err_msg=f"{label} out with a weight e^-70 of 1e30")


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


# -- learned attention sinks -----------------------------------------------------------------------

def with_sinks(case, sinks):
    """The case with a head axis (sinks need one) and ``sinks`` (nh,) in its dtype."""
    if case["q"].ndim == 2:
        case = {**case, **{n: case[n][None] for n in ("q", "k", "v", "dout") if n in case}}
    return {**case, "sinks": np.asarray(sinks, case["q"].dtype).reshape(case["q"].shape[-3])}


def sink_results(forward, backward, case):
    """(out, lse, (dq, dk, dv, dsinks)) of an implementation on a case with sinks."""
    kwargs = {n: case[n] for n in ("is_causal", "scale", "block_q", "block_k", "sinks")}
    out, cache = forward(case["q"], case["k"], case["v"], **kwargs)
    return out, cache.lse, backward(case["dout"], cache)


@given(case=kernel_inputs(), data=st.data())
def test_sinks_each_path_matches_the_readable_version(case, data):
    """With sinks from far below to far above the scores (the logits multiply them too): the path
    taken and the running-maximum path alone give the readable version's out, lse and gradients,
    dsinks included (float64 tightly, float32 to rounding: tolerances counts the sink)."""
    nh = case["q"].shape[-3] if case["q"].ndim >= 3 else 1
    logits = float(np.abs(case["q"]).max()) + 1
    case = with_sinks(case, data.draw(S.arrays(case["q"].dtype, (nh,), 4.0), label="sinks") * logits)
    expected = sink_results(readable_forward, readable_backward, case)
    tol = tolerances(case)
    for label, shifted in (("kernel[sinks]", False), ("kernel[sinks] shifted", True)):
        with pytest.MonkeyPatch.context() as mp:
            if shifted:
                _always_shifted(mp)
            out, lse, grads = sink_results(fa.flash_attention_forward, fa.flash_attention_backward, case)
        assert_all_close(label, (out, lse, grads[:3]), (expected[0], expected[1], expected[2][:3]), tol)
        assert_close(f"{label}.dsinks", grads[3], expected[2][3], **tol["dsinks"])


@pytest.mark.parametrize("dtype, big", [(np.float32, 100.0), (np.float64, 800.0)])
def test_a_sink_far_above_key_0_falls_back(monkeypatch, dtype, big):
    """A sink 2 big above every row's score against key 0 (exp(s_h - c) overflows) sends every
    block, and only then, to the running maximum, which starts at the sink: the result is the
    readable version's, the output about 0 (the sink takes the whole row)."""
    calls = _count_fallbacks(monkeypatch)
    case = with_sinks(_one_row_of_scores(dtype, 1.0, first=1.0), [2 * big])
    got = sink_results(fa.flash_attention_forward, fa.flash_attention_backward, case)
    expected = sink_results(readable_forward, readable_backward, case)
    tol = tolerances(case)
    assert calls == [0, 4, 8], f"fallbacks of blocks at rows {calls}, expected every block (0, 4, 8)"
    assert_all_close("kernel[sinks]", (got[0], got[1], got[2][:3]), (expected[0], expected[1], expected[2][:3]), tol)
    assert_close("kernel[sinks].dsinks", got[2][3], expected[2][3], **tol["dsinks"])
    assert_close("kernel[sinks].out with a sink far above", got[0], np.zeros_like(got[0]))
    calls.clear()
    sink_results(fa.flash_attention_forward, fa.flash_attention_backward, {**case, "sinks": -case["sinks"]})
    assert calls == [], f"a sink far below the scores made blocks at rows {calls} fall back"


@given(case=extreme_inputs(), sink=st.floats(-2.0 ** 125, 2.0 ** 125, width=32) | st.floats(-100, 100, width=32))
@example(case=SMALL_WEIGHT, sink=-45.0)    # the sink between the weights 1 and e^-70
def test_kernel_with_sinks_is_as_accurate_as_the_readable_version(case, sink):
    """test_kernel_is_as_accurate_as_the_readable_version with a sink of any size: its bound holds
    with the sink as one more weight of value 0 (W is unchanged by it, L counts |s_h|)."""
    q, k, v = (case[n][None] for n in ("q", "k", "v"))
    sinks = np.float32([sink])
    kwargs = {n: case[n] for n in ("is_causal", "scale", "block_q", "block_k")}
    s = (q[0].astype(np.float64) * np.float64(np.float32(case["scale"]))) @ k[0].astype(np.float64).T   # (T, S)
    if case["is_causal"]:
        s = np.where(np.tri(*s.shape, dtype=bool), s, -np.inf)
    s = np.concatenate([s, np.full((len(s), 1), float(sink))], axis=1)   # the sink column, value 0
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p = (p / p.sum(axis=1, keepdims=True))[:, :-1]
    truth = p @ v[0].astype(np.float64)
    with np.errstate(all="ignore"):
        readable = readable_forward(q, k, v, sinks=sinks, **kwargs)[0][0].astype(np.float64)
    got = fa.flash_attention_forward(q, k, v, sinks=sinks, **kwargs)[0][0].astype(np.float64)
    eps = float(np.finfo(np.float32).eps)
    S_, hs = k.shape[-2:]
    L = math.log2(math.e) * max(float(case["scale"]) * float(np.abs(q).max()) * float(np.abs(k).max()), abs(sink))
    W = p @ np.abs(v[0].astype(np.float64))
    allowed = (2 * np.abs(readable - truth) + 2 * eps * (4 * (hs + 1) * L + S_ + 4) * W
               + (S_ + 1) * 2.0 ** -126 * float(np.abs(v).max()))
    err = np.abs(got - truth)
    worst = np.unravel_index(np.argmax(err - allowed), err.shape)
    assert np.all(err <= allowed), (
        f"kernel[sinks] out{list(worst)} = {got[worst]!r}, truth {truth[worst]!r}: error {err[worst]:.3g} > "
        f"allowed {allowed[worst]:.3g} (readable's error {abs(readable[worst] - truth[worst]):.3g})")


# -- causal: the diagonal tiles split ---------------------------------------------------------------

@given(case=kernel_inputs(), diag_rows=st.integers(1, 4), data=st.data())
def test_diagonal_pieces_match_the_reference(case, diag_rows, data):
    """Causal, with the diagonal squares cut into pieces of 1 to 4 rows (the default, 64, is more
    than these tiles hold): both paths give the reference, and with sinks the readable version."""
    case = {**case, "is_causal": True}
    tol = tolerances(case)
    nh = case["q"].shape[-3] if case["q"].ndim >= 3 else 1
    sinked = with_sinks(case, data.draw(S.arrays(case["q"].dtype, (nh,), 4.0), label="sinks"))
    expected, expected_sinks = reference(case), sink_results(readable_forward, readable_backward, sinked)
    tol_sinks = tolerances(sinked)
    for label, shifted in (("kernel", False), ("kernel shifted", True)):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(fa, "DIAG_ROWS", diag_rows)
            mp.setattr(fa, "DIAG_ROWS_BACKWARD", diag_rows)
            if shifted:
                _always_shifted(mp)
            got = kernel(case)
            out, lse, grads = sink_results(fa.flash_attention_forward, fa.flash_attention_backward, sinked)
        assert_all_close(f"{label}, diag_rows {diag_rows}", got, expected, tol)
        assert_all_close(f"{label}[sinks], diag_rows {diag_rows}", (out, lse, grads[:3]),
                         (expected_sinks[0], expected_sinks[1], expected_sinks[2][:3]), tol_sinks)
        assert_close(f"{label}[sinks].dsinks", grads[3], expected_sinks[2][3], **tol_sinks["dsinks"])


@pytest.mark.parametrize("shifted", [False, True])
def test_causal_skips_the_scores_above_the_diagonal(monkeypatch, shifted):
    """The causal forward and backward exponentiate no more scores than the diagonal pieces hold:
    T (T + 1) / 2 visible ones plus, per row block, half a DIAG_ROWS-wide strip of its square
    (T DIAG_ROWS / 2 in all; DIAG_ROWS_BACKWARD in the backward). A diagonal tile computed whole
    would take T^2 / 2 + T block_q / 2; its masked part above the diagonal is the causal forward's
    lost speed-up. Nor do the fast path and the backward exponentiate -inf: NumPy's AVX-512
    float32 np.exp2 is several times slower on scores whose result underflows (_exp_visible)."""
    T, block_q, block_k = 512, 256, 512
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, T, 16)).astype(np.float32) for _ in range(3))
    counted, minus_inf = [], []
    exp = fa.EXP

    def counting_exp(x, *args, **kwargs):
        if kwargs.get("out") is x:                           # in place: a tile of scores (not a row's rescaling)
            counted.append(x.size)
            minus_inf.append(int(np.isneginf(x).sum()))
        return exp(x, *args, **kwargs)

    monkeypatch.setattr(fa, "EXP", counting_exp)
    if shifted:
        _always_shifted(monkeypatch)
    out, cache = fa.flash_attention_forward(q, k, v, is_causal=True, block_q=block_q, block_k=block_k)
    forward, forward_inf = sum(counted), sum(minus_inf)
    counted.clear()
    minus_inf.clear()
    fa.flash_attention_backward(np.ones_like(out), cache)
    # The running maximum's path masks with -inf (it is taken only where the fast path overflowed).
    assert (0 if shifted else forward_inf, sum(minus_inf)) == (0, 0), (
        f"-inf scores exponentiated: {forward_inf} in the forward, {sum(minus_inf)} in the backward")
    bound, bound_b = (T * (T + 1) // 2 + T * rows // 2 for rows in (fa.DIAG_ROWS, fa.DIAG_ROWS_BACKWARD))
    assert forward <= bound and sum(counted) <= bound_b, (
        f"causal T={T}, tiles {block_q} x {block_k}: forward exponentiated {forward} scores, at most {bound} "
        f"needed; backward {sum(counted)}, at most {bound_b} (whole diagonal tiles: {T * T // 2 + T * block_q // 2})")


# -- float16 and bfloat16 ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", LOW_DTYPES)
@given(case=kernel_inputs(dtype=np.float64), data=st.data())
def test_low_precision_matches_the_readable_version(dtype, case, data):
    """In float16 and bfloat16 (sinks or none) the kernel gives the readable version's out and
    gradients in the low dtype, and lse in float32. Both compute in float32 from the same
    rounded inputs, so before their one rounding they differ by at most tolerances() of the
    float32 case (its analysis holds for any float32 computation of the case); rounding each to
    the low dtype moves each by at most half an ulp of the low dtype at its magnitude, so they
    differ by at most that float32 tolerance plus one low-dtype ulp of the larger of the two.
    (The budget test in test_flash_attention.py holds the kernel to FlashAttention's rule too.)"""
    low = LOW_DTYPES[dtype][0]
    if data.draw(st.booleans(), label="with sinks"):
        nh = case["q"].shape[-3] if case["q"].ndim >= 3 else 1
        case = with_sinks(case, data.draw(S.arrays(np.float64, (nh,), 4.0), label="sinks"))
    names = ("q", "k", "v", "dout") + (("sinks",) if "sinks" in case else ())
    case = {**case, **{n: round_to(case[n], dtype) for n in names}}
    case32 = {**case, **{n: case[n].astype(np.float32) for n in names}}
    tol = tolerances(case32)
    results = {}
    for impl, (forward, backward) in {"readable": (readable_forward, readable_backward),
                                      "kernel": (fa.flash_attention_forward, fa.flash_attention_backward)}.items():
        kwargs = {n: case[n] for n in ("is_causal", "scale", "block_q", "block_k")}
        out, cache = forward(case["q"], case["k"], case["v"], sinks=case.get("sinks"), **kwargs)
        grads = backward(case["dout"], cache)
        results[impl] = {"out": out, "lse": cache.lse, **dict(zip(("dq", "dk", "dv", "dsinks")[:len(grads)], grads,
                                                                  strict=True))}
    for name, a in results["kernel"].items():
        b = results["readable"][name]
        assert a.dtype == (np.float32 if name == "lse" else low), f"kernel {name} ({dtype}) came back {a.dtype}"
        if name == "lse":   # float32 in both: the float32 tolerance alone
            assert_close(f"kernel.lse ({dtype}) vs readable", a, b, **tol["lse"])
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        one_ulp = np.spacing(np.maximum(np.abs(a64), np.abs(b64)).astype(low)).astype(np.float64)
        allowed = tol[name]["atol"] + one_ulp
        assert np.all(np.abs(a64 - b64) <= allowed), (
            f"kernel.{name} ({dtype}) vs readable: {np.max(np.abs(a64 - b64) - allowed):.3g} past "
            "the float32 tolerance plus one ulp")


def test_a_stack_holds_at_most_stack_scores_scores(monkeypatch):
    """The bound on a causal stack: G slices of a bq x bk tile hold G bq bk scores, at most
    STACK_SCORES (4 MiB of float32: 8 slices of the default 256 x 512 tile), at least one slice
    however large its tile, no more than a worker's share of the N slices, and one slice per call
    without causality."""
    monkeypatch.setattr(fa, "_cpu_count", lambda: 1)
    assert fa.STACK_SCORES * np.dtype(np.float32).itemsize == 4 * 2**20, fa.STACK_SCORES
    for bq, bk, expected in ((256, 512, 8), (1024, 1024, 1), (2048, 1024, 1), (16, 16, 64), (512, 512, 4)):
        G = fa._stack_size(64, bq, bk, True)
        assert G == expected and (G == 1 or G * bq * bk <= fa.STACK_SCORES), f"{bq} x {bk} tiles: {G} slices"
    assert fa._stack_size(64, 256, 511, True) == 8 and fa._stack_size(64, 256, 513, True) == 7, "the bound's edge"
    assert fa._stack_size(5, 16, 16, True) == 5, "more slices than there are"
    monkeypatch.setattr(fa, "_cpu_count", lambda: 4)
    assert fa._stack_size(10, 16, 16, True) == 3, "a worker's share of 10 slices on 4 is ceil(10 / 4)"
    assert fa._stack_size(64, 16, 16, False) == 1, "non-causal slices are not stacked"


@pytest.mark.parametrize("is_causal", [False, True])
def test_the_thread_pool_starts_at_parallel_min_work(monkeypatch, is_causal):
    """The forward and the backward each take the thread pool when their work, slices x T x S x hs
    multiply-adds, reaches PARALLEL_MIN_WORK, and the serial loop one below it: here 2 x 3 x 5 x 4
    = 120, on two cores."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, n, 4)) for n in (3, 5, 5))
    monkeypatch.setattr(fa, "_cpu_count", lambda: 2)
    pools = []

    class CountedPool(fa.ThreadPoolExecutor):
        def __init__(self, *args, **kwargs):
            pools.append("pool")
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(fa, "ThreadPoolExecutor", CountedPool)
    for threshold, expected in ((120, 1), (121, 0)):
        monkeypatch.setattr(fa, "PARALLEL_MIN_WORK", threshold)
        pools.clear()
        out, cache = fa.flash_attention_forward(q, k, v, is_causal=is_causal)
        forward = len(pools)
        fa.flash_attention_backward(np.ones_like(out), cache)
        backward = len(pools) - forward
        assert (forward, backward) == (expected, expected), (
            f"PARALLEL_MIN_WORK {threshold}, work 120: thread pools taken by the forward {forward}, by the "
            f"backward {backward}, expected {expected} each")
