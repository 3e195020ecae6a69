"""Parity tests for numpy_attn/softcap.py and torch_attn/softcap.py."""

import re

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import torch_attn.softcap as tw
from numpy_attn.softcap import logit_softcap_backward, logit_softcap_forward
from parity_tests import strategies as S
from parity_tests.attention_kit import BAD_SOFTCAPS
from parity_tests.helpers import (
    FD_TOL,
    LOW_DTYPES,
    assert_close,
    assert_one_input_budget,
    autograd,
    numerical_grad,
    round_to,
    to_numpy,
    to_torch,
)

# Gemma 2's caps (attn_logit_softcapping, final_logit_softcapping), a small one that saturates
# the inputs below, and drawn ones.
CAPS = st.sampled_from([50.0, 30.0, 0.5]) | st.floats(0.1, 100.0)


@st.composite
def capped(draw, dtype=None, bound=60.0):
    """(x, dout, c): logits bounded by 60, so that a cap of 0.5 to 100 reaches saturation and
    the near-linear region alike."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6))
    return draw(S.arrays(dtype, shape, bound)), draw(S.arrays(dtype, shape)), draw(CAPS)


EDGE_CASE = (np.array([0.0, 1e-3, -0.5, 29.0, -31.0, 60.0]), np.linspace(-1.0, 1.5, 6), 30.0)


# -- forward matches the twin -----------------------------------------------------------------

@given(case=capped())
@example(case=EDGE_CASE)
def test_forward_matches_twin(case):
    x, _, c = case
    out, _ = logit_softcap_forward(x, c)
    assert_close("softcap.out", out, to_numpy(tw.logit_softcap(to_torch(x), c)))


# -- backward matches autograd ----------------------------------------------------------------

@pytest.mark.twin_parity
@given(case=capped())
@example(case=EDGE_CASE)
def test_backward_matches_autograd(case):
    x, dout, c = case
    _, cache = logit_softcap_forward(x, c)
    _, grads = autograd(lambda x: tw.logit_softcap(x, c), {"x": x}, dout)
    assert_close("softcap.dx", logit_softcap_backward(dout, cache), grads["x"])


# -- the twin matches transformers' Gemma 2 ------------------------------------------------------

@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
@pytest.mark.parametrize("c", [30.0, 2.0, 0.5])
def test_twin_matches_gemma2_final_logits(c, dtype):
    """Gemma2ForCausalLM caps its final logits (divide by final_logit_softcapping, tanh,
    multiply): a small random transformers model run with the cap gives the twin's cap of the
    same model's logits run without it (config.final_logit_softcapping = None), the NumPy op
    too. Its lm_head is scaled by 20, so that the logits reach the saturated part of each cap."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Gemma2Config(vocab_size=11, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                       num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                                       final_logit_softcapping=c)
    torch.manual_seed(0)
    model = transformers.Gemma2ForCausalLM(config).to(to_torch(np.zeros(0, dtype)).dtype).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20)
        ids = torch.randint(0, 11, (2, 5))
        capped = to_numpy(model(ids).logits)
        model.config.final_logit_softcapping = None
        raw = to_numpy(model(ids).logits)
    assert np.abs(raw).max() > 2 * c or c == 30.0, f"logits up to {np.abs(raw).max()} never saturate c = {c}"
    assert_close("softcap twin vs Gemma 2 logits", to_numpy(tw.logit_softcap(to_torch(raw), c)), capped)
    assert_close("softcap vs Gemma 2 logits", logit_softcap_forward(raw, c)[0], capped)


# -- properties ---------------------------------------------------------------------------------

@given(case=capped())
@example(case=EDGE_CASE)
@example(case=(np.array([1.1754944e-38], np.float32), np.array([0.0], np.float32), 50.0))   # x / c subnormal
def test_bounded_odd_increasing_and_near_identity(case):
    """|out| <= c; the cap is odd and never decreasing; and where |x| <= c / 10 it moves x by
    at most |x|^3 / (3 c^2) (the Taylor series' next term bounds the rest: it alternates)."""
    x, _, c = case
    out, _ = logit_softcap_forward(x, c)
    eps = float(np.finfo(x.dtype).eps)
    assert np.all(np.abs(out) <= x.dtype.type(c)), f"softcap |out| above c = {c}: {np.abs(out).max()}"
    assert_close("softcap odd", logit_softcap_forward(-x, c)[0], -out, rtol=0, atol=0)
    order = np.argsort(x.reshape(-1), kind="stable")
    assert np.all(np.diff(out.reshape(-1)[order]) >= 0), "softcap decreases somewhere"
    small = np.abs(x) <= c / 10
    # Rounding: x / c, tanh and * c each lose half an ulp of |x|. Where x / c falls below the
    # smallest normal number (x = 1.2e-38, c = 50 in float32) its ulp is the fixed subnormal step,
    # not relative to |x|: x / c and tanh of it each lose up to half that step, which * c scales
    # by c (the CI profile drew that case: 1.1e-44 off, within c times the step, 7.0e-44).
    tiny = float(np.finfo(x.dtype).smallest_subnormal)
    allowed = np.abs(x[small]).astype(np.float64) ** 3 / (3 * c**2) + 4 * eps * np.abs(x[small]) + c * tiny
    assert np.all(np.abs(out[small] - x[small]) <= allowed), "softcap moves a small logit too far"


# -- finite differences (no torch) ----------------------------------------------------------------

@given(case=capped(dtype=np.float64, bound=5.0))
@example(case=(EDGE_CASE[0] / 10, EDGE_CASE[1], 1.0))
def test_backward_matches_finite_differences(case):
    """Inputs bounded by 5, caps of 0.1 and up. The stencil's truncation error is h^4 / 30 times
    the fifth derivative of c tanh(x / c), tanh^(5)(u) / c^4 with u = x / c; tanh^(5)(u) =
    (1 - t^2)(16 - 120 t^2 + 120 t^4) is at most 16 (1 - t^2), so the error is at most
    16 h^4 / (30 c^4) = 5.3e-9 (h = 1e-3, c = 0.1) of the gradient dout (1 - t^2) itself: far
    inside FD_TOL's rtol of 1e-6, saturated or not."""
    x, dout, c = case
    _, cache = logit_softcap_forward(x, c)
    expected = numerical_grad(lambda a: logit_softcap_forward(a, c)[0], x.copy(), dout)
    assert_close("softcap.dx vs finite differences", logit_softcap_backward(dout, cache), expected, **FD_TOL)


# -- float16 and bfloat16: FlashAttention's error rule -------------------------------------------

@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@given(case=capped(dtype=np.float64))
@example(case=EDGE_CASE)
def test_low_precision_meets_the_error_budget(dtype, case):
    """Ours and the twin against float64 truth, within twice the error of PyTorch's own
    low-precision softcap: transformers' three ops (divide, torch.tanh, multiply), each rounded."""
    x, dout = round_to(case[0], dtype), round_to(case[1], dtype)   # the inputs every side shares
    c = case[2]
    out, cache = logit_softcap_forward(x, c)
    dx = logit_softcap_backward(dout, cache)
    # dx = dout (1 - t^2) with t = tanh(x / c) in float32: where every x saturates, the true dx
    # is far below one low-dtype ulp of dout and PyTorch's low-precision 1 - y^2 may be exactly 0
    # by luck (y rounds to 1), while float32 keeps its own noise. t off by eps/2 relatively makes
    # 1 - t^2 off by eps, t * t adds eps/2 and 1 - t * t another eps/2: 2 eps |dout| (eps float32's;
    # a wrong rounding is off by the low dtype's eps, 2^13 or 2^16 times more).
    extra = {"dx": 2 * float(np.finfo(np.float32).eps) * float(np.abs(dout.astype(np.float64)).max())}
    assert_one_input_budget("softcap", dtype, (out, dx), lambda x: tw.logit_softcap(x, c),
                            lambda x: c * torch.tanh(x / c), {"x": x}, dout, extra=extra)


# -- dtype and bad input -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
@pytest.mark.parametrize("c", [np.float64(30.0), np.float32(30.0), 30, 30.0])
def test_dtype_is_preserved(dtype, c):
    x = S.ramp(3, 4, dtype=dtype) * 40
    out, cache = logit_softcap_forward(x, c)
    dx = logit_softcap_backward(np.ones_like(x), cache)
    assert out.dtype == dx.dtype == dtype, f"softcap dtypes out {out.dtype}, dx {dx.dtype} for {dtype}"


@pytest.mark.parametrize("softcap, error, message",
                         BAD_SOFTCAPS + [(None, TypeError, "softcap must be a finite number > 0, got None")])
def test_bad_softcap_is_refused(softcap, error, message):
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        logit_softcap_forward(np.zeros(3), softcap)


def test_bad_input_is_refused():
    with pytest.raises(TypeError, match="x must be float16, bfloat16, float32 or float64, got dtype int64"):
        logit_softcap_forward(np.zeros(3, np.int64), 30.0)
    with pytest.raises(TypeError, match="x must be a NumPy array, got list"):
        logit_softcap_forward([1.0, 2.0], 30.0)
    _, cache = logit_softcap_forward(np.zeros((2, 3)), 30.0)
    with pytest.raises(ValueError, match=r"logit_softcap: dout must have the shape .* \(2, 3\), got \(3, 2\)"):
        logit_softcap_backward(np.zeros((3, 2)), cache)
    with pytest.raises(TypeError, match="logit_softcap: dout must have the dtype .* float64, got float32"):
        logit_softcap_backward(np.zeros((2, 3), np.float32), cache)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_cap_lost_in_the_dtype_computed_in_is_refused(dtype):
    """c = 1e300 is finite in float64 but inf in float32, where float16, bfloat16 and float32 inputs
    are computed: inf * tanh(x / inf) was NaN. c = 1e-50 rounds to 0 there, a division by zero.
    float64 input holds both and is capped by them."""
    x = S.ramp(2, 3).astype(np.float32) if dtype == "float32" else round_to(S.ramp(2, 3), dtype)
    for c, what in ((1e300, "overflows to inf"), (1e-50, "underflows to 0")):
        with pytest.raises(ValueError, match=rf"^softcap must be finite .* in float32, the dtype it is computed in: "
                                             rf"softcap = {re.escape(repr(c))} {what}$"):
            logit_softcap_forward(x, c)
        out, _ = logit_softcap_forward(S.ramp(2, 3), c)
        assert np.isfinite(out).all() and np.all(np.abs(out) <= c), f"float64 capped at {c}: {out}"
