"""Parity tests for numpy_attn/rms_norm.py and torch_attn/rms_norm.py."""

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, example, given
from hypothesis import strategies as st
from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm
from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from numpy_attn.rms_norm import rms_norm_backward, rms_norm_forward
from parity_tests import strategies as S
from parity_tests.helpers import (
    FD_TOL,
    LOW_DTYPES,
    assert_bad_dout_refused,
    assert_close,
    assert_error_budget,
    assert_tree_close,
    autograd,
    layer_norm_tol,
    numerical_grad,
    round_to,
    to_numpy,
    to_torch,
)
from torch_attn.rms_norm import rms_norm

eps_values = st.sampled_from([1e-6, 1e-5, 1e-2])


@st.composite
def rows(draw, dtype=None):
    """(x, w, dout, eps): x (..., C) with 0 to 2 leading dims, w (C,)."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    lead = draw(S.batch_shapes())
    C = draw(S.dim(1, 8))
    x = draw(S.arrays(dtype, lead + (C,)))
    w = draw(S.arrays(dtype, (C,)))
    dout = draw(S.arrays(dtype, lead + (C,)))
    return x, w, dout, draw(eps_values)


# A zero row (rstd = 1 / sqrt(eps): the output is 0 but the gradient is 1000 * dxhat), a tiny
# row and an ordinary one.
ZERO_ROW = (np.array([[0.0, 0.0, 0.0], [1e-3, -2e-3, 0.0], [-1.0, 0.5, 3.0]]),
            np.array([1.5, -0.5, 2.0]), S.ramp(3, 3), 1e-6)


def _tol(cache, dtype):
    """RMS norm's backward cancels like layer norm's (dxhat - xhat * mean(dxhat * xhat)), scaled
    by rstd up to 1 / sqrt(eps) = 1000 on a zero row: layer_norm_tol's reasoning applies."""
    return layer_norm_tol([cache[1]], dtype)


# -- forward matches the twin -----------------------------------------------------------------

@given(case=rows())
@example(case=ZERO_ROW)
def test_forward_matches_twin(case):
    x, w, dout, eps = case
    out, _ = rms_norm_forward(x, w, eps)
    assert_close("rms_norm.out", out, to_numpy(rms_norm(to_torch(x), to_torch(w), eps)))


# -- backward matches autograd ----------------------------------------------------------------

@pytest.mark.twin_parity
@given(case=rows())
@example(case=ZERO_ROW)
def test_backward_matches_autograd(case):
    x, w, dout, eps = case
    _, cache = rms_norm_forward(x, w, eps)
    dx, dparams = rms_norm_backward(dout, cache)
    _, grads = autograd(lambda **kw: rms_norm(**kw, eps=eps), {"x": x, "w": w}, dout)
    tol = _tol(cache, x.dtype)
    assert_close("rms_norm.dx", dx, grads.pop("x"), **tol)
    assert_tree_close("rms_norm", dparams, grads, **tol)


# -- the twin matches PyTorch's built-in --------------------------------------------------------

@given(case=rows())
@example(case=ZERO_ROW)
def test_twin_matches_builtin(case):
    """F.rms_norm and nn.RMSNorm: the same formula, rounded in another order."""
    x, w, dout, eps = case
    C = x.shape[-1]
    twin_out, twin_grads = autograd(lambda **kw: rms_norm(**kw, eps=eps), {"x": x, "w": w}, dout)
    builtin_out, builtin_grads = autograd(lambda x, w: F.rms_norm(x, (C,), w, eps), {"x": x, "w": w}, dout)
    tol = _tol(rms_norm_forward(x, w, eps)[1], x.dtype)
    assert_close("rms_norm.out vs F.rms_norm", twin_out, builtin_out, **tol)
    assert_tree_close("rms_norm.grads vs F.rms_norm", twin_grads, builtin_grads, **tol)
    module = torch.nn.RMSNorm(C, eps=eps, dtype=to_torch(x).dtype)
    with torch.no_grad():
        module.weight.copy_(to_torch(w))
        assert_close("rms_norm.out vs nn.RMSNorm", twin_out, to_numpy(module(to_torch(x))), **tol)


@given(case=rows())
@example(case=ZERO_ROW)
def test_matches_llama_rms_norm(case):
    """LlamaRMSNorm computes in float32 whatever x's dtype: in float32 it is our computation; in
    float64 it agrees only to float32's tolerance (the numbers are rounded to float32 and back)."""
    x, w, _, eps = case
    C = x.shape[-1]
    module = LlamaRMSNorm(C, eps=eps).to(to_torch(x).dtype)
    with torch.no_grad():
        module.weight.copy_(to_torch(w))
        theirs = to_numpy(module(to_torch(x)))
    out, cache = rms_norm_forward(x, w, eps)
    tol = _tol(cache, np.float32)
    assert_close(f"rms_norm.out vs LlamaRMSNorm ({x.dtype})", out, theirs,
                 rtol=tol["rtol"], atol=tol["atol"] * max(1.0, float(np.abs(theirs).max(initial=0))))


def test_default_eps_is_llama_rms_norms():
    """Without eps both twins use LlamaRMSNorm's default, 1e-6: rows whose mean square is of that
    size (x ~ 1e-3), where another eps changes rstd by tens of percent. float32, where LlamaRMSNorm
    computes what we do."""
    x, w = (S.ramp(3, 5) * 2e-3).astype(np.float32), (S.ramp(5) + 1.5).astype(np.float32)
    module = LlamaRMSNorm(5)
    with torch.no_grad():
        module.weight.copy_(to_torch(w))
        theirs = to_numpy(module(to_torch(x)))
    assert_close("rms_norm.out with the default eps vs LlamaRMSNorm(C)", rms_norm_forward(x, w)[0], theirs)
    assert_close("twin rms_norm.out with the default eps", to_numpy(rms_norm(to_torch(x), to_torch(w))), theirs)


# -- properties ---------------------------------------------------------------------------------

@given(case=rows(), scale=st.sampled_from([1e-3, 0.5, 3.0, 1e3]))
def test_scale_invariant_rows_of_unit_root_mean_square(case, scale):
    """With w = 1 each row has root mean square ms / (ms + eps) under the square root, and with
    eps = 0 scaling x changes nothing."""
    x, _, _, eps = case
    C = x.shape[-1]
    ones = np.ones(C, x.dtype)
    out, _ = rms_norm_forward(x, ones, eps)
    ms = (x.astype(np.float64) ** 2).mean(axis=-1)
    assert_close("rms_norm row mean squares", (out * out).mean(axis=-1),
                 (ms / (ms + eps)).astype(x.dtype))
    x = x + x.dtype.type(0.5)   # no zero rows: with eps = 0 they would divide 0 by 0
    plain, _ = rms_norm_forward(x, ones, 0.0)
    scaled, _ = rms_norm_forward(x * x.dtype.type(scale), ones, 0.0)
    assert_close(f"rms_norm(x * {scale}) vs rms_norm(x), eps = 0", scaled, plain)


# -- finite differences (no torch) ----------------------------------------------------------------

@given(case=rows(dtype=np.float64))
@example(case=ZERO_ROW)
def test_backward_matches_finite_differences(case):
    x, w, dout, eps = case
    _, cache = rms_norm_forward(x, w, eps)
    dx, dparams = rms_norm_backward(dout, cache)
    # RMS norm bends on the scale sqrt(ms + eps), down to 1e-3 on a zero row: step 1e-5 as in
    # test_layer_norm.py, and atol scaled by rstd, as the gradients are.
    fd = {"x": numerical_grad(lambda x: rms_norm_forward(x, w, eps)[0], x.copy(), dout, h=1e-5),
          "w": numerical_grad(lambda w: rms_norm_forward(x, w, eps)[0], w.copy(), dout, h=1e-5)}
    rstd = max(1.0, float(cache[1].max()))
    assert_tree_close("rms_norm vs finite differences", {"x": dx, **dparams}, fd,
                      rtol=FD_TOL["rtol"], atol=FD_TOL["atol"] * rstd)


# -- dtype preservation -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
def test_dtype_is_preserved(dtype):
    x = S.ramp(2, 3, dtype=dtype)
    out, cache = rms_norm_forward(x, np.full(3, 1.5, dtype), eps=np.float64(1e-6))
    dx, dparams = rms_norm_backward(S.ramp(2, 3, dtype=dtype), cache)
    for name, a in [("out", out), ("dx", dx), ("dw", dparams["w"])]:
        assert a.dtype == dtype, f"rms_norm.{name} dtype {a.dtype}"


# -- bad input --------------------------------------------------------------------------------------

def test_bad_input():
    x = np.zeros((2, 3))
    with pytest.raises(ValueError, match=r"w must have shape \(3,\) to match x \(2, 3\), got \(4,\)"):
        rms_norm_forward(x, np.ones(4))
    # The size asked for is x's last axis, whatever x's rank (2-D x alone cannot tell it from the second).
    with pytest.raises(ValueError, match=r"^w must have shape \(4,\) to match x \(2, 3, 4\), got \(3,\)$"):
        rms_norm_forward(np.zeros((2, 3, 4)), np.ones(3))
    with pytest.raises(ValueError, match=r"^w must have shape \(5,\) to match x \(5,\), got \(3,\)$"):
        rms_norm_forward(np.zeros(5), np.ones(3))
    with pytest.raises(ValueError, match="eps must be a number >= 0, got -0.1"):
        rms_norm_forward(x, np.ones(3), eps=-0.1)
    with pytest.raises(ValueError, match="eps must be a number >= 0, got True"):
        rms_norm_forward(x, np.ones(3), eps=True)
    with pytest.raises(TypeError, match="x is float32, w is float64"):
        rms_norm_forward(x.astype(np.float32), np.ones(3))
    # The wrong kind of input: integers would be normalised in float64 without a word.
    with pytest.raises(TypeError, match="^x must be float16, bfloat16, float32 or float64, got dtype int64$"):
        rms_norm_forward(np.arange(3), np.ones(3))
    with pytest.raises(TypeError, match="^w must be float16, bfloat16, float32 or float64, got dtype int64$"):
        rms_norm_forward(x, np.ones(3, np.int64))
    with pytest.raises(TypeError, match="^x must be a NumPy array, got list$"):
        rms_norm_forward([0.0, 1.0, 2.0], np.ones(3))
    with pytest.raises(TypeError, match="^w must be a NumPy array, got list$"):
        rms_norm_forward(x, [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match=r"^w must have shape \(3,\) to match x \(2, 3\), got \(1, 3\)$"):
        rms_norm_forward(x, np.ones((1, 3)))
    for eps in (float("nan"), "1e-6", None):
        with pytest.raises(ValueError, match=f"^eps must be a number >= 0, got {eps!r}$"):
            rms_norm_forward(x, np.ones(3), eps=eps)
    with pytest.raises(ValueError, match=r"at least one dimension .* got shape \(\)"):
        rms_norm_forward(np.array(1.0), np.ones(3))
    _, cache = rms_norm_forward(x, np.ones(3))
    with pytest.raises(ValueError, match=r"rms_norm: dout must have the shape .* \(2, 3\), got \(3, 2\)"):
        rms_norm_backward(np.zeros((3, 2)), cache)


@given(case=rows())
def test_bad_dout_is_refused(case):
    x, w, _, eps = case
    out, cache = rms_norm_forward(x, w, eps)
    assert_bad_dout_refused("rms_norm", out, rms_norm_backward, cache)


# -- Gemma's 1 + w (offset=1.0) -----------------------------------------------------------------

@given(case=rows())
@example(case=ZERO_ROW)
def test_offset_matches_twin_and_autograd(case):
    x, w, dout, eps = case
    out, cache = rms_norm_forward(x, w, eps, offset=1.0)
    dx, dparams = rms_norm_backward(dout, cache)
    twin_out, grads = autograd(lambda **kw: rms_norm(**kw, eps=eps, offset=1.0), {"x": x, "w": w}, dout)
    tol = _tol(cache, x.dtype)
    assert_close("rms_norm(offset=1).out", out, twin_out, **tol)
    assert_close("rms_norm(offset=1).dx", dx, grads.pop("x"), **tol)
    assert_tree_close("rms_norm(offset=1)", dparams, grads, **tol)


@given(case=rows())
@example(case=ZERO_ROW)
def test_offset_is_the_plain_norm_of_shifted_weights(case):
    """offset=1 with w is the plain norm with 1 + w, to the bit, and the same gradients."""
    x, w, dout, eps = case
    out, cache = rms_norm_forward(x, w, eps, offset=1.0)
    plain, plain_cache = rms_norm_forward(x, w + w.dtype.type(1), eps)
    assert np.array_equal(out, plain), "rms_norm(x, w, offset=1) != rms_norm(x, 1 + w)"
    dx, dparams = rms_norm_backward(dout, cache)
    plain_dx, plain_dparams = rms_norm_backward(dout, plain_cache)
    assert np.array_equal(dx, plain_dx), "rms_norm(offset=1).dx != the plain norm's with 1 + w"
    assert np.array_equal(dparams["w"], plain_dparams["w"]), "rms_norm(offset=1).dw != the plain norm's with 1 + w"


@pytest.mark.parametrize("module_class", [Gemma2RMSNorm, Gemma3RMSNorm])
@given(case=rows())
@example(case=ZERO_ROW)
def test_offset_matches_gemma_rms_norm(module_class, case):
    """Gemma2RMSNorm and Gemma3RMSNorm, forward and backward: they compute in float32 whatever
    x's dtype (x.float(), then back), so in float32 they are our computation (rsqrt for 1 / sqrt,
    one rounding apart) and in float64 they agree to float32's tolerance only; as in
    test_matches_llama_rms_norm, atol scales with the largest value compared."""
    x, w, dout, eps = case
    module = module_class(x.shape[-1], eps=eps).to(to_torch(x).dtype)
    with torch.no_grad():
        module.weight.copy_(to_torch(w))
    tx = to_torch(x, requires_grad=True)
    theirs = module(tx)
    (theirs * to_torch(dout)).sum().backward()
    out, cache = rms_norm_forward(x, w, eps, offset=1.0)
    dx, dparams = rms_norm_backward(dout, cache)
    tol = _tol(cache, np.float32)
    name = f"rms_norm(offset=1) vs {module_class.__name__} ({x.dtype})"
    for label, ours, their in [("out", out, theirs), ("dx", dx, tx.grad), ("dw", dparams["w"], module.weight.grad)]:
        their = to_numpy(their.detach())
        assert_close(f"{name}.{label}", ours, their,
                     rtol=tol["rtol"], atol=tol["atol"] * max(1.0, float(np.abs(their).max(initial=0))))


# -- float16 and bfloat16: FlashAttention's error rule -------------------------------------------

def _hf_norm(module_class, x, w, eps):
    """Hugging Face's norm module in x's dtype holding w, as a function of (x, w) for autograd."""
    def f(x, w):
        module = module_class(x.shape[-1], eps=eps).to(x.dtype)
        module.weight = torch.nn.Parameter(w)               # the leaf autograd differentiates
        return module(x)
    return f


@pytest.mark.error_budget
@pytest.mark.parametrize("offset, module_class", [(0.0, LlamaRMSNorm), (1.0, Gemma2RMSNorm)])
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@given(case=rows(dtype=np.float64))
@example(case=ZERO_ROW)
def test_low_precision_meets_the_error_budget(dtype, offset, module_class, case):
    """Ours and the twin against float64 truth (F.rms_norm with weight offset + w), within twice
    the error of Hugging Face's module in the low dtype: LlamaRMSNorm rounds xhat before * w,
    Gemma2RMSNorm rounds only the product, and each of ours follows its own order."""
    x, w, dout = (round_to(a, dtype) for a in case[:3])
    eps = case[3]
    out, cache = rms_norm_forward(x, w, eps, offset)
    dx, dparams = rms_norm_backward(dout, cache)
    twin_out, twin_grads = autograd(lambda x, w: rms_norm(x, w, eps, offset), {"x": x, "w": w}, dout)
    torch_out, torch_grads = autograd(_hf_norm(module_class, x, w, eps), {"x": x, "w": w}, dout)
    truth_out, truth_grads = autograd(lambda x, w: F.rms_norm(x, x.shape[-1:], offset + w, eps),
                                      {"x": x.astype(np.float64), "w": w.astype(np.float64)}, dout.astype(np.float64))
    # dx = rstd * (dxhat - xhat * mean(dxhat * xhat)) cancels to nothing where dxhat is parallel to
    # xhat (one column, dout proportional to x): both sides then carry float32's cancellation error,
    # about eps32 * rstd * |dxhat|, far above an ulp of the tiny truth, and the ratio of two such
    # errors is luck (3.9e-8 against 1.29e-8 on x = [1.125], offset 1). Those cases are left to the
    # float32 tests; any cancellation short of 1/64 stays, where one ulp of the low dtype's truth
    # (at least 2^-11 / 64 of the terms) dwarfs float32's 2^-24.
    terms = np.max(cache[1] * np.abs(dout.astype(np.float64) * (offset + w.astype(np.float64))), initial=0)
    assume(np.max(np.abs(truth_grads["x"]), initial=0) >= terms / 64)
    for who, (o, g) in {"numpy": (out, {"x": dx, **dparams}), "twin": (twin_out, twin_grads)}.items():
        assert_error_budget(f"rms_norm(offset={offset:g})[{who}]", dtype, {
            "out": (o, torch_out, truth_out),
            **{f"d{k}": (g[k], torch_grads[k], truth_grads[k]) for k in ("x", "w")}})


@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_low_precision_follows_each_variants_order(dtype):
    """The forward rounds where each Hugging Face module rounds: equal to LlamaRMSNorm and to
    Gemma2RMSNorm in the low dtype on rows where the two orders give different results (xhat
    near the middle between two low-precision values, scaled by w = 1.75 or 1 + 0.75)."""
    rng = np.random.default_rng(0)
    x, eps = round_to(rng.normal(size=(64, 8)), dtype), 1e-6
    for offset, module_class, w in [(0.0, LlamaRMSNorm, 1.75), (1.0, Gemma2RMSNorm, 0.75)]:
        w = round_to(np.full(8, w), dtype)
        out, _ = rms_norm_forward(x, w, eps, offset)
        theirs = to_numpy(_hf_norm(module_class, x, w, eps)(to_torch(x), to_torch(w)))
        other = to_numpy(_hf_norm({0.0: Gemma2RMSNorm, 1.0: LlamaRMSNorm}[offset], x, w - offset, eps)(
            to_torch(x), to_torch(w - offset if offset else w + 1)))
        assert (theirs != other).any(), "the two orders must differ on these rows for the test to mean anything"
        mismatch = np.mean(out.astype(np.float64) != theirs.astype(np.float64))
        # Both sides round the same float32 values; only the float32 mean square may differ by an
        # ulp (summation order), flipping at most a rare rounding: a few percent of entries at most.
        assert mismatch <= 0.03, f"rms_norm(offset={offset:g}) differs from {module_class.__name__} in {mismatch:.0%}"


@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_mixed_low_precision_dtypes_are_refused(dtype):
    """A low-precision x with float32 weights is a mix, refused as float32 with float64 is."""
    with pytest.raises(TypeError, match=f"share one dtype: x is {dtype}, w is float32"):
        rms_norm_forward(round_to(S.ramp(2, 3), dtype), np.ones(3, np.float32))


def test_bad_offset():
    x = np.zeros((2, 3))
    with pytest.raises(TypeError, match="offset must be a number .* got str '1'"):
        rms_norm_forward(x, np.ones(3), offset="1")
    with pytest.raises(TypeError, match="offset must be a number .* got bool True"):
        rms_norm_forward(x, np.ones(3), offset=True)
    with pytest.raises(ValueError, match="offset must be finite, got nan"):
        rms_norm_forward(x, np.ones(3), offset=float("nan"))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_eps_lost_in_the_dtype_computed_in_is_refused(dtype):
    """eps = inf passed the old `eps >= 0` and gave zeros; 1e300 is inf in float32 (where float16,
    bfloat16 and float32 are computed): zeros too; 1e-50 is 0 there: a constant row divides 0 by 0."""
    x = S.ramp(2, 3).astype(np.float32) if dtype == "float32" else round_to(S.ramp(2, 3), dtype)
    w = np.ones(3, x.dtype)
    for eps, what in ((float("inf"), "is not finite"), (1e300, "overflows to inf"), (1e-50, "underflows to 0")):
        with pytest.raises(ValueError, match=rf"^eps must be finite .* in float32, the dtype it is computed in: "
                                             rf"eps = {re.escape(repr(eps))} {what}$"):
            rms_norm_forward(x, w, eps=eps)
    out, _ = rms_norm_forward(np.zeros((2, 3)), np.ones(3), eps=1e-50)
    assert np.array_equal(out, np.zeros((2, 3))), "float64 holds eps = 1e-50"
