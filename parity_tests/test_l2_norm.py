"""Parity tests for numpy_attn/l2_norm.py and torch_attn/l2_norm.py: the q and k normalisation of
the delta rule, against Hugging Face's two spellings of it (Qwen3.5's and Kimi Linear's l2norm)."""

import numpy as np
import pytest
import torch.nn.functional as F
from hypothesis import assume, example, given
from hypothesis import strategies as st
from transformers.models.kimi_linear.modeling_kimi_linear import l2norm as kimi_l2norm
from transformers.models.qwen3_5.modeling_qwen3_5 import l2norm as qwen3_5_l2norm

from numpy_attn.l2_norm import l2_norm_backward, l2_norm_forward
from parity_tests import strategies as S
from parity_tests.helpers import (
    FD_TOL,
    LOW_DTYPES,
    assert_bad_dout_refused,
    assert_close,
    assert_one_input_budget,
    autograd,
    layer_norm_tol,
    numerical_grad,
    round_to,
    to_numpy,
    to_torch,
)
from torch_attn.l2_norm import l2_norm

eps_values = st.sampled_from([1e-6, 1e-5, 1e-2])


@st.composite
def rows(draw, dtype=None):
    """(x, dout, eps): x (..., d) with 0 to 2 leading dims (as (B, T, nh, hs) rows are, flattened)."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    shape = draw(S.batch_shapes()) + (draw(S.dim(1, 8)),)
    return draw(S.arrays(dtype, shape)), draw(S.arrays(dtype, shape)), draw(eps_values)


# A zero row (rnorm = 1 / sqrt(eps) = 1000: the output is 0 but the gradient is 1000 * dout), a
# tiny row and an ordinary one.
ZERO_ROW = (np.array([[0.0, 0.0, 0.0], [1e-3, -2e-3, 0.0], [-1.0, 0.5, 3.0]]), S.ramp(3, 3), 1e-6)


def _tol(cache, dtype):
    """out = x * rnorm is a product of correctly rounded factors (a few ulps relative), but the
    backward rnorm * (dout - out * sum(dout * out)) cancels inside the parentheses, to an absolute
    error of about d ulps of |dout| (|out| <= 1), and then multiplies it by rnorm, up to
    1 / sqrt(eps) = 1000 on a zero row: layer norm's cancellation times its rstd, so
    layer_norm_tol's bound applies with rnorm in rstd's place."""
    return layer_norm_tol([cache[1]], dtype)


# -- forward and backward match the twin and autograd ------------------------------------------------

@pytest.mark.twin_parity
@given(case=rows())
@example(case=ZERO_ROW)
def test_matches_twin_and_autograd(case):
    x, dout, eps = case
    out, cache = l2_norm_forward(x, eps)
    dx = l2_norm_backward(dout, cache)
    twin_out, grads = autograd(lambda x: l2_norm(x, eps), {"x": x}, dout)
    tol = _tol(cache, x.dtype)
    assert_close("l2_norm.out", out, twin_out, **tol)
    assert_close("l2_norm.dx", dx, grads["x"], **tol)


# -- the twin matches Hugging Face's l2norm and F.normalize ----------------------------------------

@pytest.mark.parametrize("theirs", [qwen3_5_l2norm, kimi_l2norm], ids=["qwen3_5", "kimi_linear"])
@given(case=rows())
@example(case=ZERO_ROW)
def test_matches_hugging_face_l2norm(theirs, case):
    """Qwen3.5's x * rsqrt(sum + eps) and Kimi Linear's x / sqrt(sum + eps), forward and gradient,
    in float32 and float64: the same function as ours, each rounding in its own order (rsqrt for
    1 / sqrt, a division for a product), which the tolerance of _tol covers."""
    x, dout, eps = case
    out, cache = l2_norm_forward(x, eps)
    dx = l2_norm_backward(dout, cache)
    their_out, their_grads = autograd(lambda x: theirs(x, dim=-1, eps=eps), {"x": x}, dout)
    tol = _tol(cache, x.dtype)
    assert_close(f"l2_norm.out vs {theirs.__module__.split('.')[-2]} l2norm", out, their_out, **tol)
    assert_close(f"l2_norm.dx vs {theirs.__module__.split('.')[-2]} l2norm", dx, their_grads["x"], **tol)


def test_default_eps_is_hugging_faces():
    """Without eps both twins use the l2norm's default, 1e-6: rows of length about 1e-3, where
    another eps changes the result by tens of percent."""
    x = S.ramp(3, 4) * 1e-3
    theirs = to_numpy(qwen3_5_l2norm(to_torch(x)))
    assert_close("l2_norm.out with the default eps vs l2norm(x)", l2_norm_forward(x)[0], theirs)
    assert_close("twin l2_norm.out with the default eps", to_numpy(l2_norm(to_torch(x))), theirs)
    assert not np.allclose(l2_norm_forward(x, 1e-5)[0], theirs, rtol=1e-2), "eps must matter on these rows"


@given(case=rows(dtype=np.float64))
@example(case=(np.array([1.5e-22, 1.5e-22]), np.array([0.0, 1.0]), 1e-6))   # a row F.normalize's default eps clamps
def test_twin_matches_f_normalize_away_from_eps(case):
    """F.normalize divides by max(|x|, eps) instead: the same function wherever |x| passes its eps
    and |x|^2 dwarfs ours. Both eps are 1e-300 here: below float64's relative spacing of any
    |x|^2 > 1e-280 (F.normalize's default 1e-12 would clamp rows of length 1e-22, which float64 draws)."""
    x, dout, _ = case
    assume(np.all((x * x).sum(axis=-1) > 1e-280))
    twin_out, twin_grads = autograd(lambda x: l2_norm(x, 1e-300), {"x": x}, dout)
    built_out, built_grads = autograd(lambda x: F.normalize(x, dim=-1, eps=1e-300), {"x": x}, dout)
    tol = _tol(l2_norm_forward(x, 1e-300)[1], x.dtype)
    assert_close("l2_norm.out vs F.normalize", twin_out, built_out, **tol)
    assert_close("l2_norm.dx vs F.normalize", twin_grads["x"], built_grads["x"], **tol)


# -- properties ---------------------------------------------------------------------------------

@given(case=rows(), scale=st.sampled_from([1e-3, 0.5, 3.0, 1e3]))
def test_unit_length_rows_and_scale_invariance(case, scale):
    """Each row's squared length is ss / (ss + eps) (1 when eps is 0), and with eps = 0 scaling a
    row changes nothing: what bounds the delta rule's step whatever the projections learn."""
    x, _, eps = case
    out, _ = l2_norm_forward(x, eps)
    ss = (x.astype(np.float64) ** 2).sum(axis=-1)
    assert_close("l2_norm row squared lengths", (out * out).sum(axis=-1), (ss / (ss + eps)).astype(x.dtype))
    x = x + x.dtype.type(0.5)   # no zero rows: with eps = 0 they would divide 0 by 0
    plain, _ = l2_norm_forward(x, 0.0)
    scaled, _ = l2_norm_forward(x * x.dtype.type(scale), 0.0)
    assert_close(f"l2_norm(x * {scale}) vs l2_norm(x), eps = 0", scaled, plain)


# -- finite differences (no torch) ----------------------------------------------------------------

@given(case=rows(dtype=np.float64))
@example(case=ZERO_ROW)
def test_backward_matches_finite_differences(case):
    x, dout, eps = case
    _, cache = l2_norm_forward(x, eps)
    dx = l2_norm_backward(dout, cache)
    # The norm bends on the scale sqrt(ss + eps), down to 1e-3 on a zero row: step 1e-5 as in
    # test_rms_norm.py, and atol scaled by rnorm, as the gradient is.
    fd = numerical_grad(lambda x: l2_norm_forward(x, eps)[0], x.copy(), dout, h=1e-5)
    rnorm = max(1.0, float(cache[1].max()))
    assert_close("l2_norm.dx vs finite differences", dx, fd, rtol=FD_TOL["rtol"], atol=FD_TOL["atol"] * rnorm)


# -- float16 and bfloat16: FlashAttention's error rule -------------------------------------------

@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@given(case=rows(dtype=np.float64))
@example(case=ZERO_ROW)
def test_low_precision_meets_the_error_budget(dtype, case):
    """Ours and the twin against float64 truth, within twice the error of Qwen3.5's l2norm run in
    the low dtype (its square, sum, rsqrt and product each rounded)."""
    x, dout = round_to(case[0], dtype), round_to(case[1], dtype)   # the inputs every side shares
    eps = case[2]
    # PyTorch's float16 backward forms rsqrt's slope (ss + eps)^(-3/2), which passes float16's
    # largest 65504 below ss + eps = 6.1e-4 and makes its gradient inf or NaN (ours forms it in
    # float32: test_float16_short_rows_keep_finite_gradients): no budget can be taken from it there.
    ss = (x.astype(np.float64) ** 2).sum(axis=-1)
    assume(dtype == "bfloat16" or np.all(ss + eps >= 1e-3))
    out, cache = l2_norm_forward(x, eps)
    dx = l2_norm_backward(dout, cache)
    # dx = rnorm * (dout - out * s), s = sum(dout * out), cancels to nearly nothing where dout is
    # parallel to out (one column: dx = rnorm dout eps / (x^2 + eps)), and then float32's own
    # rounding, not the low dtype's, is what is left: s off by at most d eps32 sum|dout * out|
    # <= d sqrt(d) eps32 max|dout| (|out| <= 1, Cauchy-Schwarz), the product and the difference
    # by eps32 (1 + sqrt(d)) max|dout| more, all times rnorm. PyTorch's error may be 0 there by luck.
    d = x.shape[-1]
    extra = {"dx": (d + 2) * np.sqrt(d) * float(np.finfo(np.float32).eps) * float(cache[1].max())
             * float(np.abs(dout.astype(np.float64)).max())}
    assert_one_input_budget("l2_norm", dtype, (out, dx), lambda x: l2_norm(x, eps),
                            lambda x: qwen3_5_l2norm(x, eps=eps), {"x": x}, dout, extra=extra)


def test_float16_short_rows_keep_finite_gradients():
    """A zero row and a short one in float16: Qwen3.5's l2norm run in float16 gives inf or NaN
    gradients (its rsqrt's slope overflows), ours the float64 truth rounded, within an ulp."""
    x, dout = round_to(ZERO_ROW[0][:2], "float16"), round_to(ZERO_ROW[1][:2], "float16")
    _, theirs = autograd(lambda x: qwen3_5_l2norm(x, eps=1e-6), {"x": x}, dout)
    assert not np.isfinite(theirs["x"]).all(), "PyTorch's float16 gradient is finite here: the test shows nothing"
    _, cache = l2_norm_forward(x, 1e-6)
    _, truth = autograd(lambda x: qwen3_5_l2norm(x, eps=1e-6), {"x": x.astype(np.float64)}, dout.astype(np.float64))
    dx = l2_norm_backward(dout, cache).astype(np.float64)
    assert np.all(np.abs(dx - truth["x"]) <= np.spacing(np.abs(truth["x"]).astype(np.float16)).astype(np.float64)), \
        "l2_norm.dx (float16) on short rows vs the float64 truth"


# -- dtype preservation -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
def test_dtype_is_preserved(dtype):
    out, cache = l2_norm_forward(S.ramp(2, 3, dtype=dtype), eps=np.float64(1e-6))
    dx = l2_norm_backward(S.ramp(2, 3, dtype=dtype), cache)
    for name, a in [("out", out), ("dx", dx)]:
        assert a.dtype == dtype, f"l2_norm.{name} dtype {a.dtype}"


# -- bad input --------------------------------------------------------------------------------------

def test_bad_input_is_refused_naming_it():
    x = np.zeros((2, 3))
    with pytest.raises(TypeError, match="^x must be float16, bfloat16, float32 or float64, got dtype int64$"):
        l2_norm_forward(np.arange(3))
    with pytest.raises(TypeError, match="^x must be a NumPy array, got list$"):
        l2_norm_forward([0.0, 1.0, 2.0])
    with pytest.raises(ValueError, match=r"^x must have at least one dimension \(\.\.\., d\), got shape \(\)$"):
        l2_norm_forward(np.array(1.0))
    for eps in (-0.1, float("nan"), "1e-6", None, True):
        with pytest.raises(ValueError, match=f"^eps must be a number >= 0, got {eps!r}$"):
            l2_norm_forward(x, eps=eps)


@given(case=rows())
def test_bad_dout_is_refused(case):
    x, _, eps = case
    out, cache = l2_norm_forward(x, eps)
    assert_bad_dout_refused("l2_norm", out, l2_norm_backward, cache)
