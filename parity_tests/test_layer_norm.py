"""Parity tests for numpy_attn/layer_norm.py and torch_attn/layer_norm.py."""

from fractions import Fraction

import numpy as np
import pytest
import torch.nn.functional as F
from hypothesis import example, given
from hypothesis import strategies as st

from numpy_attn.layer_norm import layer_norm_backward, layer_norm_forward
from parity_tests import strategies as S
from parity_tests.helpers import (
    FD_TOL,
    assert_close,
    assert_tree_close,
    autograd,
    layer_norm_tol,
    numerical_grad,
)
from torch_attn.layer_norm import layer_norm

eps_values = st.sampled_from([1e-5, 1e-2])


@st.composite
def rows(draw, dtype=None):
    """(x, w, b, dout, eps): x (..., C) with 0 to 2 leading dims, w and b (C,)."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    lead = draw(S.batch_shapes())
    C = draw(S.dim(1, 8))
    x = draw(S.arrays(dtype, lead + (C,)))
    w, b = draw(S.arrays(dtype, (C,))), draw(S.arrays(dtype, (C,)))
    dout = draw(S.arrays(dtype, lead + (C,)))
    return x, w, b, dout, draw(eps_values)


# A constant row (zero variance: the output is b), a one-column row, an ordinary row.
CONSTANT_ROW = (np.array([[2.0, 2.0, 2.0], [-1.0, 0.5, 3.0]]), np.array([1.5, -0.5, 2.0]),
                np.array([0.1, 0.2, -0.3]), np.array([[0.3, -1.0, 2.0], [1.0, 0.5, -0.25]]), 1e-5)
# Offset 2, spread 0.06 in float32, where F.layer_norm's dx is off by 5e-4 (found by Hypothesis).
NEAR_CONSTANT_ROW = tuple(np.array(a, np.float32) for a in
                          ([2.0, 1.9375, 1.9375], [2.0, 0.0, 0.0], [0.0, 0.0, 0.0], [2.0, 2.0, 2.0])) + (1e-5,)


def _kappa(x, eps):
    """The largest offset-to-spread ratio max|x| * rstd of the case's rows (the condition number of
    the variance): about 1 to 3 for rows of unit spread, 600 for [1.875] with eps = 1e-5."""
    x64 = x.astype(np.float64)
    return float((np.abs(x64).max(axis=-1) / np.sqrt(x64.var(axis=-1) + eps)).max())


# -- forward matches the twin -----------------------------------------------------------------

@given(case=rows())
@example(case=CONSTANT_ROW)
def test_forward_matches_twin(case):
    x, w, b, dout, eps = case
    out, _ = layer_norm_forward(x, w, b, eps)
    twin_out, _ = autograd(lambda **kw: layer_norm(**kw, eps=eps), {"x": x, "w": w, "b": b}, dout)
    assert_close("layer_norm.out", out, twin_out)


# -- backward matches autograd ----------------------------------------------------------------

@given(case=rows())
@example(case=CONSTANT_ROW)
def test_backward_matches_autograd(case):
    x, w, b, dout, eps = case
    _, cache = layer_norm_forward(x, w, b, eps)
    dx, dparams = layer_norm_backward(dout, cache)
    _, grads = autograd(lambda **kw: layer_norm(**kw, eps=eps), {"x": x, "w": w, "b": b}, dout)
    # dx is a difference of terms rstd times larger (3557 - 3557 on one constant row), so the
    # two programs' rounding differs by up to rstd times the usual atol.
    _, rstd, _ = cache
    assert_close("layer_norm.dx", dx, grads.pop("x"), **layer_norm_tol([rstd], x.dtype))
    assert_tree_close("layer_norm", dparams, grads)


# -- the twin matches PyTorch's built-in --------------------------------------------------------

@given(case=rows())
@example(case=CONSTANT_ROW)
@example(case=NEAR_CONSTANT_ROW)
def test_twin_matches_builtin(case):
    """F.layer_norm centres each row once, so its rounding of the mean (about an ulp of the row's
    largest |x|) reaches xhat multiplied by rstd: a relative error of machine epsilon times kappa
    (see _kappa), which its backward's cancellation multiplies by rstd again. The twin centres
    twice and has no such error (test_near_constant_rows_stay_accurate). So atol is that of two
    correct programs (layer_norm_tol: rstd) times kappa, times the scale of the values compared."""
    x, w, b, dout, eps = case
    C = x.shape[-1]
    twin_out, twin_grads = autograd(lambda **kw: layer_norm(**kw, eps=eps), {"x": x, "w": w, "b": b}, dout)
    builtin_out, builtin_grads = autograd(
        lambda x, w, b: F.layer_norm(x, (C,), w, b, eps), {"x": x, "w": w, "b": b}, dout)
    _, (_, rstd, _) = layer_norm_forward(x, w, b, eps)
    tol = layer_norm_tol([rstd], x.dtype)

    def widened(expected):
        scale = max(1.0, _kappa(x, eps)) * max(1.0, float(np.abs(expected).max()))
        return dict(rtol=tol["rtol"], atol=tol["atol"] * scale)

    assert_close("layer_norm.out vs F.layer_norm", twin_out, builtin_out, **widened(builtin_out))
    for name in ("x", "w", "b"):
        assert_close(f"layer_norm.d{name} vs F.layer_norm", twin_grads[name], builtin_grads[name],
                     **widened(builtin_grads[name]))


# -- properties ---------------------------------------------------------------------------------

@given(case=rows())
def test_rows_have_zero_mean_and_shrunk_unit_variance(case):
    """With w = 1, b = 0 each row has mean 0 and variance var / (var + eps): exactly 1 but for eps."""
    x, _, _, _, eps = case
    C = x.shape[-1]
    out, _ = layer_norm_forward(x, np.ones(C, x.dtype), np.zeros(C, x.dtype), eps)
    var = x.astype(np.float64).var(axis=-1)
    assert_close("layer_norm row means", out.mean(axis=-1), np.zeros(x.shape[:-1], x.dtype))
    assert_close("layer_norm row variances", out.var(axis=-1), (var / (var + eps)).astype(x.dtype))


def _exact_layer_norm(x, eps):
    """Rows normalised with exact rational mean and variance, then one rounding: an oracle that
    shares no arithmetic with the code under test."""
    out = np.empty(x.shape, np.float64)
    for i, row in enumerate(x.astype(np.float64)):
        exact = [Fraction(v) for v in row]
        mu = sum(exact) / len(exact)
        var = sum((v - mu) ** 2 for v in exact) / len(exact)
        out[i] = [float((v - mu) / Fraction(np.sqrt(float(var + Fraction(eps))))) for v in exact]
    return out


@pytest.mark.parametrize("dtype, offset", [(np.float32, 1e2), (np.float32, 1e4),
                                           (np.float64, 1e4), (np.float64, 1e8)])
def test_near_constant_rows_stay_accurate(dtype, offset):
    """Rows offset + U(-1, 1): the mean is computed with an error of a few ulps of the offset,
    which a single centring would amplify by rstd (to 1e-3 in float32 at 1e4). Compared with
    an exact oracle at the dtype's usual tolerance."""
    rng = np.random.default_rng(0)
    x = (offset + rng.uniform(-1, 1, (6, 64))).astype(dtype)
    C = x.shape[-1]
    out, _ = layer_norm_forward(x, np.ones(C, dtype), np.zeros(C, dtype))
    assert_close(f"layer_norm.out near-constant rows (offset {offset:g})", out,
                 _exact_layer_norm(x, 1e-5).astype(dtype))


# -- finite differences (no torch) ----------------------------------------------------------------

@given(case=rows(dtype=np.float64))
def test_backward_matches_finite_differences(case):
    x, w, b, dout, eps = case
    _, cache = layer_norm_forward(x, w, b, eps)
    dx, dparams = layer_norm_backward(dout, cache)
    # Layer norm bends on the scale sqrt(var + eps), down to 3e-3 on a constant row, where the
    # default step 1e-3 is far too coarse; at 1e-5 the stencil's truncation error is below 1e-9
    # relative and its rounding error about 1e-16 * |sum| / h, well inside FD_TOL.
    h = 1e-5
    fd = {
        "x": numerical_grad(lambda x: layer_norm_forward(x, w, b, eps)[0], x.copy(), dout, h=h),
        "w": numerical_grad(lambda w: layer_norm_forward(x, w, b, eps)[0], w.copy(), dout, h=h),
        "b": numerical_grad(lambda b: layer_norm_forward(x, w, b, eps)[0], b.copy(), dout, h=h),
    }
    # Gradients reach rstd * |w * dout| (5000 on a constant row), and the stencil's rounding
    # error grows with them: atol scaled by rstd, as layer_norm_tol does for float rounding.
    rstd = max(1.0, float(cache[1].max()))
    fd_tol = dict(rtol=FD_TOL["rtol"], atol=FD_TOL["atol"] * rstd)
    assert_tree_close("layer_norm vs finite differences", {"x": dx, **dparams}, fd, **fd_tol)


# -- dtype preservation -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
def test_dtype_is_preserved(dtype):
    x = np.array([[1.0, -2.0, 3.0], [0.5, 0.5, 0.5]], dtype=dtype)
    w, b = np.full(3, 1.5, dtype), np.full(3, -0.5, dtype)
    # An eps given as a NumPy float64 must not upcast float32.
    out, cache = layer_norm_forward(x, w, b, eps=np.float64(1e-5))
    dx, dparams = layer_norm_backward(np.full_like(x, 0.25), cache)
    for name, a in [("out", out), ("dx", dx), ("dw", dparams["w"]), ("db", dparams["b"])]:
        assert a.dtype == dtype, f"layer_norm.{name} dtype {a.dtype}"


# -- bad input --------------------------------------------------------------------------------------

def test_bad_input():
    x, w = np.zeros((2, 3)), np.ones(3)
    with pytest.raises(ValueError, match=r"w \(4,\) and b \(3,\) must both have shape \(3,\) to match x \(2, 3\)"):
        layer_norm_forward(x, np.ones(4), np.zeros(3))
    with pytest.raises(ValueError, match=r"w \(3,\) and b \(3, 1\)"):
        layer_norm_forward(x, w, np.zeros((3, 1)))
    with pytest.raises(ValueError, match="eps must be >= 0, got -0.1"):
        layer_norm_forward(x, w, np.zeros(3), eps=-0.1)
    with pytest.raises(TypeError, match="x is float32, w is float64"):
        layer_norm_forward(x.astype(np.float32), w, np.zeros(3))
    with pytest.raises(TypeError, match="int64"):
        layer_norm_forward(np.arange(3), w, np.zeros(3))
    with pytest.raises(ValueError, match=r"at least one dimension .* got shape \(\)"):
        layer_norm_forward(np.array(1.0), w, np.zeros(3))
