"""Parity tests for numpy_attn/layer_norm.py and torch_attn/layer_norm.py."""

import math
import re
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given
from hypothesis import strategies as st
from torch import nn

from numpy_attn.layer_norm import layer_norm_backward, layer_norm_forward
from parity_tests import strategies as S
from parity_tests.helpers import (
    FD_TOL,
    LOW_DTYPES,
    assert_close,
    assert_error_budget,
    assert_tree_close,
    autograd,
    layer_norm_tol,
    numerical_grad,
    round_to,
    to_numpy,
)
from torch_attn.layer_norm import layer_norm

eps_values = st.sampled_from([1e-5, 1e-2])


AFFINE = ("w and b", "w only", "neither")


@st.composite
def rows(draw, dtype=None, affine=None):
    """(x, w, b, dout, eps, normalized_shape): x (..., *S) with 0 to 2 leading dims; S the last
    axis (normalized_shape None) or the last one to three axes; w and b of shape S, or w alone,
    or neither (``affine``: one of AFFINE, drawn if None)."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    lead = draw(S.batch_shapes())
    k = draw(st.sampled_from([None, 1, 2, 3]))
    shape = (draw(S.dim(1, 8)),) if k is None else tuple(draw(S.dim(1, 4)) for _ in range(k))
    x = draw(S.arrays(dtype, lead + shape))
    w, b = draw(S.arrays(dtype, shape)), draw(S.arrays(dtype, shape))
    affine = draw(st.sampled_from(AFFINE)) if affine is None else affine
    w = None if affine == "neither" else w
    b = b if affine == "w and b" else None
    dout = draw(S.arrays(dtype, lead + shape))
    return x, w, b, dout, draw(eps_values), None if k is None else shape


def _params(w, b):
    """The given parameters only, as keyword arguments (autograd differentiates arrays)."""
    return {k: v for k, v in (("w", w), ("b", b)) if v is not None}


def _twin(eps, normalized_shape):
    return lambda **kw: layer_norm(**kw, eps=eps, normalized_shape=normalized_shape)


# A constant row (zero variance: the output is b), a one-column row, an ordinary row.
CONSTANT_ROW = (np.array([[2.0, 2.0, 2.0], [-1.0, 0.5, 3.0]]), np.array([1.5, -0.5, 2.0]),
                np.array([0.1, 0.2, -0.3]), np.array([[0.3, -1.0, 2.0], [1.0, 0.5, -0.25]]), 1e-5, None)
# Offset 2, spread 0.06 in float32, where F.layer_norm's dx is off by 5e-4 (found by Hypothesis).
NEAR_CONSTANT_ROW = tuple(np.array(a, np.float32) for a in
                          ([2.0, 1.9375, 1.9375], [2.0, 0.0, 0.0], [0.0, 0.0, 0.0], [2.0, 2.0, 2.0])) + (1e-5, None)
# Two normalised axes (2, 3), a weight without a bias.
TWO_AXES = (S.ramp(2, 2, 3), S.ramp(2, 3) + 1, None, S.ramp(2, 2, 3)[::-1].copy(), 1e-5, (2, 3))
# No affine parameters at all, the normalised axes being all of x's.
NO_AFFINE = (S.ramp(3, 2) * 3, None, None, S.ramp(3, 2)[:, ::-1].copy(), 1e-2, (3, 2))


def _kappa(x, eps, normalized_shape=None):
    """The largest offset-to-spread ratio max|x| * rstd of the case's rows (the condition number of
    the variance): about 1 to 3 for rows of unit spread, 600 for [1.875] with eps = 1e-5."""
    axes = tuple(range(-len(normalized_shape or (1,)), 0))
    x64 = x.astype(np.float64)
    return float((np.abs(x64).max(axis=axes) / np.sqrt(x64.var(axis=axes) + eps)).max())


# -- forward matches the twin -----------------------------------------------------------------

@given(case=rows())
@example(case=CONSTANT_ROW)
@example(case=TWO_AXES)
@example(case=NO_AFFINE)
def test_forward_matches_twin(case):
    x, w, b, dout, eps, shape = case
    out, _ = layer_norm_forward(x, w, b, eps, shape)
    twin_out, _ = autograd(_twin(eps, shape), {"x": x, **_params(w, b)}, dout)
    assert_close("layer_norm.out", out, twin_out)


# -- backward matches autograd ----------------------------------------------------------------

@pytest.mark.twin_parity
@given(case=rows())
@example(case=CONSTANT_ROW)
@example(case=TWO_AXES)
@example(case=NO_AFFINE)
def test_backward_matches_autograd(case):
    """Only the parameters given come back, under their names."""
    x, w, b, dout, eps, shape = case
    _, cache = layer_norm_forward(x, w, b, eps, shape)
    dx, dparams = layer_norm_backward(dout, cache)
    _, grads = autograd(_twin(eps, shape), {"x": x, **_params(w, b)}, dout)
    # dx is a difference of terms rstd times larger (3557 - 3557 on one constant row), so the
    # two programs' rounding differs by up to rstd times the usual atol.
    rstd = cache[1]
    assert_close("layer_norm.dx", dx, grads.pop("x"), **layer_norm_tol([rstd], x.dtype))
    assert_tree_close("layer_norm", dparams, grads)


# -- the twin matches PyTorch's built-in --------------------------------------------------------

@given(case=rows())
@example(case=CONSTANT_ROW)
@example(case=NEAR_CONSTANT_ROW)
@example(case=TWO_AXES)
@example(case=NO_AFFINE)
def test_twin_matches_builtin(case):
    """F.layer_norm centres each row once, so its rounding of the mean (about an ulp of the row's
    largest |x|) reaches xhat multiplied by rstd: a relative error of machine epsilon times kappa
    (see _kappa), which its backward's cancellation multiplies by rstd again. The twin centres
    twice and has no such error (test_near_constant_rows_stay_accurate). So atol is that of two
    correct programs (layer_norm_tol: rstd) times kappa, times the scale of the values compared.
    The same normalized_shape and the same missing parameters on both sides."""
    x, w, b, dout, eps, shape = case
    builtin_shape = x.shape[-1:] if shape is None else shape
    params = _params(w, b)
    twin_out, twin_grads = autograd(_twin(eps, shape), {"x": x, **params}, dout)
    builtin_out, builtin_grads = autograd(
        lambda x, w=None, b=None: F.layer_norm(x, builtin_shape, w, b, eps), {"x": x, **params}, dout)
    rstd = layer_norm_forward(x, w, b, eps, shape)[1][1]
    tol = layer_norm_tol([rstd], x.dtype)

    def widened(expected):
        scale = max(1.0, _kappa(x, eps, shape)) * max(1.0, float(np.abs(expected).max()))
        return dict(rtol=tol["rtol"], atol=tol["atol"] * scale)

    assert_close("layer_norm.out vs F.layer_norm", twin_out, builtin_out, **widened(builtin_out))
    assert twin_grads.keys() == builtin_grads.keys() == {"x", *params}, "layer_norm gradients"
    for name in twin_grads:
        assert_close(f"layer_norm.d{name} vs F.layer_norm", twin_grads[name], builtin_grads[name],
                     **widened(builtin_grads[name]))


@pytest.mark.parametrize("bias", [True, False])
def test_matches_nn_layer_norm_module(bias):
    """nn.LayerNorm(S, elementwise_affine=False) and nn.LayerNorm(S, bias=False) hold what we
    pass as w and b: none, or w alone (float64, two normalised axes)."""
    x, w, _, dout, eps, shape = TWO_AXES
    for affine in (False, True):
        module = nn.LayerNorm(shape, eps=eps, elementwise_affine=affine, bias=bias, dtype=torch.float64)
        if affine:
            with torch.no_grad():
                module.weight.copy_(torch.from_numpy(w))
                if bias:
                    module.bias.copy_(torch.from_numpy(w[::-1].copy()))
        b = w[::-1].copy() if affine and bias else None
        out, _ = layer_norm_forward(x, w if affine else None, b, eps, shape)
        assert_close(f"layer_norm.out vs nn.LayerNorm(affine={affine}, bias={bias})", out,
                     to_numpy(module(torch.from_numpy(x))))


def test_default_eps_is_nn_layer_norms():
    """Without eps both twins use nn.LayerNorm's default, 1e-5: rows whose variance is of that
    size (spread ~ 3e-3), where another eps changes rstd by tens of percent."""
    x, w = S.ramp(3, 5) * 4e-3 + 0.5, S.ramp(5) + 1.5
    module = nn.LayerNorm(5, dtype=torch.float64)
    with torch.no_grad():
        module.weight.copy_(torch.from_numpy(w))
        module.bias.copy_(torch.from_numpy(w[::-1].copy()))
        theirs = to_numpy(module(torch.from_numpy(x)))
    assert_close("layer_norm.out with the default eps vs nn.LayerNorm(C)", layer_norm_forward(x, w, w[::-1].copy())[0],
                 theirs)
    twin = layer_norm(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(w[::-1].copy()))
    assert_close("twin layer_norm.out with the default eps", to_numpy(twin), theirs)


# -- properties ---------------------------------------------------------------------------------

@given(case=rows())
def test_rows_have_zero_mean_and_shrunk_unit_variance(case):
    """Without w and b each row (all of its normalised axes) has mean 0 and variance
    var / (var + eps): exactly 1 but for eps."""
    x, _, _, _, eps, shape = case
    axes = tuple(range(-len(shape or (1,)), 0))
    out, _ = layer_norm_forward(x, eps=eps, normalized_shape=shape)
    var = x.astype(np.float64).var(axis=axes)
    assert_close("layer_norm row means", out.mean(axis=axes), np.zeros(var.shape, x.dtype))
    assert_close("layer_norm row variances", out.var(axis=axes), (var / (var + eps)).astype(x.dtype))


@given(case=rows(affine="w and b"))
def test_several_axes_equal_one_flattened_axis(case):
    """Normalising the trailing axes S together is normalising one axis of prod(S) elements."""
    x, w, b, dout, eps, shape = case
    k = len(shape or (1,))
    C = int(np.prod(x.shape[x.ndim - k:]))
    flat = x.shape[:x.ndim - k] + (C,)
    out, cache = layer_norm_forward(x, w, b, eps, shape)
    dx, dparams = layer_norm_backward(dout, cache)
    out1, cache1 = layer_norm_forward(x.reshape(flat), w.reshape(C), b.reshape(C), eps)
    dx1, dparams1 = layer_norm_backward(dout.reshape(flat), cache1)
    tol = layer_norm_tol([cache[1]], x.dtype)
    assert_close("layer_norm.out over several axes vs flattened", out, out1.reshape(x.shape))
    assert_close("layer_norm.dx over several axes vs flattened", dx, dx1.reshape(x.shape), **tol)
    assert_tree_close("layer_norm over several axes vs flattened", dparams,
                      {k: v.reshape(w.shape) for k, v in dparams1.items()}, **tol)


@given(case=rows())
def test_gradients_share_no_memory(case):
    """dx, dw and db are fresh arrays, with or without w and b: never x, w, b, dout or the cache
    (without w, dxhat is dout itself, which the backward must not hand back)."""
    x, w, b, dout, eps, shape = case
    _, cache = layer_norm_forward(x, w, b, eps, shape)
    dx, dparams = layer_norm_backward(dout, cache)
    inputs = {"x": x, "dout": dout, "cache xhat": cache[0], "cache rstd": cache[1], **_params(w, b)}
    for out_name, g in (("dx", dx), *(("d" + k, v) for k, v in dparams.items())):
        for name, a in inputs.items():
            assert not np.shares_memory(g, a), f"layer_norm.{out_name} shares memory with {name}"


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
@example(case=TWO_AXES)
@example(case=NO_AFFINE)
def test_backward_matches_finite_differences(case):
    x, w, b, dout, eps, shape = case
    _, cache = layer_norm_forward(x, w, b, eps, shape)
    dx, dparams = layer_norm_backward(dout, cache)
    # Layer norm bends on the scale sqrt(var + eps), down to 3e-3 on a constant row, where the
    # default step 1e-3 is far too coarse; at 1e-5 the stencil's truncation error is below 1e-9
    # relative and its rounding error about 1e-16 * |sum| / h, well inside FD_TOL.
    h = 1e-5
    inputs = {"x": x, **_params(w, b)}

    def f_of(name):
        return lambda a: layer_norm_forward(**dict(inputs, **{name: a}), eps=eps, normalized_shape=shape)[0]

    fd = {name: numerical_grad(f_of(name), a.copy(), dout, h=h) for name, a in inputs.items()}
    # Gradients reach rstd * |w * dout| (5000 on a constant row), and the stencil's rounding
    # error grows with them: atol scaled by rstd, as layer_norm_tol does for float rounding.
    rstd = max(1.0, float(cache[1].max()))
    fd_tol = dict(rtol=FD_TOL["rtol"], atol=FD_TOL["atol"] * rstd)
    assert_tree_close("layer_norm vs finite differences", {"x": dx, **dparams}, fd, **fd_tol)


# -- float16 and bfloat16: FlashAttention's error rule -------------------------------------------

@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@given(case=rows(dtype=np.float64))
@example(case=CONSTANT_ROW)
@example(case=TWO_AXES)
@example(case=NO_AFFINE)
def test_low_precision_meets_the_error_budget(dtype, case):
    """Ours and the twin against float64 truth, within twice the error of F.layer_norm in the low
    dtype, for out, dx and the given dw, db (x, w, b and dout rounded first: every side sees them)."""
    x, w, b, dout, eps, shape = case
    x, dout = round_to(x, dtype), round_to(dout, dtype)
    params = {k: round_to(v, dtype) for k, v in _params(w, b).items()}
    builtin_shape = x.shape[-1:] if shape is None else shape

    def builtin(x, w=None, b=None):
        return F.layer_norm(x, builtin_shape, w, b, eps)

    out, cache = layer_norm_forward(x, params.get("w"), params.get("b"), eps, shape)
    dx, dparams = layer_norm_backward(dout, cache)
    twin_out, twin_grads = autograd(_twin(eps, shape), {"x": x, **params}, dout)
    torch_out, torch_grads = autograd(builtin, {"x": x, **params}, dout)
    truth_out, truth_grads = autograd(builtin, {"x": x.astype(np.float64),
                                                **{k: v.astype(np.float64) for k, v in params.items()}},
                                      dout.astype(np.float64))
    # dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dout * w, cancels to exactly 0 where g is
    # constant along a row (a constant dout and w): PyTorch's low-dtype result may then be 0 by luck
    # while float32 keeps its own rounding of the terms. Each term is at most rstd |g| (1 + xhat^2);
    # the two means of N terms and the three subtractions keep at most (N + 2) eps of that (eps
    # float32's: a wrong rounding is off by the low dtype's eps, 2^13 or 2^16 times more).
    axes = tuple(range(-len(builtin_shape), 0))
    x64 = x.astype(np.float64)
    rstd = 1 / np.sqrt(x64.var(axis=axes, keepdims=True) + eps)
    xhat = (x64 - x64.mean(axis=axes, keepdims=True)) * rstd
    g = dout.astype(np.float64) * (params["w"].astype(np.float64) if "w" in params else 1.0)
    extra = {"dx": (math.prod(builtin_shape) + 2) * float(np.finfo(np.float32).eps) * float(np.max(rstd, initial=0))
             * float(np.max(np.abs(g), initial=0)) * (1 + float(np.max(xhat ** 2, initial=0)))}
    for who, (o, g) in {"numpy": (out, {"x": dx, **dparams}), "twin": (twin_out, twin_grads)}.items():
        assert g.keys() == {"x", *params}, f"layer_norm[{who}] gradients"
        assert_error_budget(f"layer_norm[{who}]", dtype, {
            "out": (o, torch_out, truth_out),
            **{f"d{k}": (g[k], torch_grads[k], truth_grads[k]) for k in g}}, extra=extra)


@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_mixed_low_precision_dtypes_are_refused(dtype):
    """A low-precision x with float32 parameters is a mix, refused as float32 with float64 is."""
    x = round_to(S.ramp(2, 3), dtype)
    with pytest.raises(TypeError, match=f"share one dtype: x is {dtype}, w is float32"):
        layer_norm_forward(x, np.ones(3, np.float32))
    with pytest.raises(TypeError, match=f"x is {dtype}, w is {dtype}, b is float32"):
        layer_norm_forward(x, round_to(np.ones(3), dtype), np.zeros(3, np.float32))


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
    with pytest.raises(ValueError, match=r"w \(4,\) must have shape \(3,\) to match x \(2, 3\) \(w \(4,\), b \(3,\)\)"):
        layer_norm_forward(x, np.ones(4), np.zeros(3))
    with pytest.raises(ValueError, match=r"^b \(3, 1\) must have shape \(3,\) to match x \(2, 3\) "
                                         r"\(w \(3,\), b \(3, 1\)\)$"):
        layer_norm_forward(x, w, np.zeros((3, 1)))
    with pytest.raises(ValueError, match=r"^b \(2,\) must have shape \(3,\) to match x \(2, 3\) \(w \(\), b \(2,\)\)$"):
        layer_norm_forward(x, None, np.zeros(2))
    with pytest.raises(ValueError, match="eps must be >= 0, got -0.1"):
        layer_norm_forward(x, w, np.zeros(3), eps=-0.1)
    for eps in (float("nan"), True, "1e-5", None):   # a comparison error or a silent eps = 1 before
        with pytest.raises(ValueError, match=f"^eps must be >= 0, got {re.escape(repr(eps))}$"):
            layer_norm_forward(x, w, np.zeros(3), eps=eps)
    with pytest.raises(TypeError, match="x is float32, w is float64"):
        layer_norm_forward(x.astype(np.float32), w, np.zeros(3))
    with pytest.raises(TypeError, match="x is float64, b is float32"):
        layer_norm_forward(x, None, np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="x must be float16, bfloat16, float32 or float64, got dtype int64"):
        layer_norm_forward(np.arange(3), w, np.zeros(3))
    with pytest.raises(TypeError, match="w must be a NumPy array, got list"):
        layer_norm_forward(x, [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match=r"at least one dimension .* got shape \(\)"):
        layer_norm_forward(np.array(1.0), w, np.zeros(3))
    for shape in ((2,), (4, 2, 3), ()):
        with pytest.raises(ValueError, match=rf"^normalized_shape {re.escape(str(shape))} must be a non-empty "
                                             r"tail of x's shape \(2, 3\)$"):
            layer_norm_forward(x, normalized_shape=shape)
    with pytest.raises(ValueError, match=r"^w \(3,\) must have shape \(2, 3\) to match x \(2, 3\)"):
        layer_norm_forward(x, w, normalized_shape=(2, 3))
    _, cache = layer_norm_forward(x, w)
    with pytest.raises(ValueError, match=r"layer_norm_backward: dout must have the shape .* \(2, 3\), got \(3, 2\)"):
        layer_norm_backward(np.zeros((3, 2)), cache)
    with pytest.raises(TypeError, match="layer_norm_backward: dout must have the dtype .* float64, got float32"):
        layer_norm_backward(np.zeros((2, 3), np.float32), cache)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_eps_lost_in_the_dtype_computed_in_is_refused(dtype):
    """eps = inf passed the old `eps >= 0` and gave b alone; 1e300 is inf in float32 (where float16,
    bfloat16 and float32 are computed); 1e-50 is 0 there: a constant row divides 0 by 0."""
    x = S.ramp(2, 3).astype(np.float32) if dtype == "float32" else round_to(S.ramp(2, 3), dtype)
    for eps, what in ((float("inf"), "is not finite"), (1e300, "overflows to inf"), (1e-50, "underflows to 0")):
        with pytest.raises(ValueError, match=rf"^eps must be finite .* in float32, the dtype it is computed in: "
                                             rf"eps = {re.escape(repr(eps))} {what}$"):
            layer_norm_forward(x, eps=eps)
    out, _ = layer_norm_forward(np.ones((2, 3)), eps=1e-50)
    assert np.array_equal(out, np.zeros((2, 3))), "float64 holds eps = 1e-50"


@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_low_precision_parameter_gradients_are_summed_in_float32_and_rounded_once(dtype):
    """db and dw of 4096 rows: summed in float16 or bfloat16 they would lose most of their digits
    (at 4096 a float16 ulp is 4); they are the float32 sums of the float32 products rounded once
    to the dtype, bit for bit."""
    rng = np.random.default_rng(0)
    x, dout = round_to(rng.standard_normal((4096, 3)), dtype), round_to(1 + rng.uniform(0, 0.1, (4096, 3)), dtype)
    w, b = round_to(np.ones(3), dtype), round_to(np.zeros(3), dtype)
    _, cache = layer_norm_forward(x, w, b)
    _, grads = layer_norm_backward(dout, cache)
    xhat = cache[0]
    expected_db = dout.astype(np.float32).sum(axis=0).astype(x.dtype)
    expected_dw = (dout.astype(np.float32) * xhat).sum(axis=0).astype(x.dtype)
    assert np.array_equal(grads["b"], expected_db), f"db {grads['b']} vs {expected_db}"
    assert np.array_equal(grads["w"], expected_dw), f"dw {grads['w']} vs {expected_dw}"
