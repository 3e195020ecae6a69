"""Parity tests for numpy_attn/gelu.py and torch_attn/gelu.py."""

import numpy as np
import pytest
import torch.nn.functional as F
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import torch_attn.gelu as tw
from numpy_attn.gelu import gelu_backward, gelu_forward
from parity_tests import helpers
from parity_tests import strategies as S
from parity_tests.helpers import (
    FD_TOL,
    LOW_DTYPES,
    assert_close,
    assert_one_input_budget,
    autograd,
    gelu_truth,
    numerical_grad,
    round_to,
    to_numpy,
    to_torch,
)

approximations = st.sampled_from(["none", "tanh"])


@st.composite
def activations(draw, dtype=None):
    """(x, dout): x bounded by 10, so x / sqrt(2) reaches every interval of erf, saturation too."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6))
    return draw(S.arrays(dtype, shape, bound=10.0)), draw(S.arrays(dtype, shape))


# Points in each region of erf (|x| / sqrt(2) below 1: Taylor series at 0; below 2: Taylor
# series at 1.5; below 6: continued fraction; beyond: 1), on both sides of zero.
EDGES = np.array([0.0, 0.5, -1.5, 2.0, -3.0, 5.0, -7.0, 9.0, -10.0])
EDGE_CASE = (EDGES, np.linspace(-1.0, 1.5, EDGES.size))


# -- forward matches the twin -----------------------------------------------------------------

@given(approximate=approximations, case=activations())
@example(approximate="none", case=EDGE_CASE)
def test_forward_matches_twin(approximate, case):
    x, _ = case
    out, _ = gelu_forward(x, approximate)
    assert_close(f"gelu[{approximate}].out", out, to_numpy(tw.gelu(to_torch(x), approximate)))


# -- backward matches autograd ----------------------------------------------------------------

@pytest.mark.twin_parity
@given(approximate=approximations, case=activations())
@example(approximate="tanh", case=EDGE_CASE)
def test_backward_matches_autograd(approximate, case):
    x, dout = case
    _, cache = gelu_forward(x, approximate)
    dx = gelu_backward(dout, cache)
    _, grads = autograd(lambda x: tw.gelu(x, approximate), {"x": x}, dout)
    assert_close(f"gelu[{approximate}].dx", dx, grads["x"])


# -- the twin matches PyTorch's built-in --------------------------------------------------------

@given(approximate=approximations, case=activations())
@example(approximate="none", case=EDGE_CASE)
def test_twin_matches_builtin(approximate, case):
    x, dout = case
    twin_out, twin_grads = autograd(lambda x: tw.gelu(x, approximate), {"x": x}, dout)
    builtin_out, builtin_grads = autograd(lambda x: F.gelu(x, approximate=approximate), {"x": x}, dout)
    assert_close(f"gelu[{approximate}].out vs F.gelu", twin_out, builtin_out)
    assert_close(f"gelu[{approximate}].dx vs F.gelu", twin_grads["x"], builtin_grads["x"])


# -- properties ---------------------------------------------------------------------------------

@given(approximate=approximations, case=activations())
def test_gelu_minus_mirror_is_identity(approximate, case):
    """gelu(x) - gelu(-x) = x (Phi(x) + Phi(-x)) = x, for erf and tanh alike: both are odd."""
    x, _ = case
    out, _ = gelu_forward(x, approximate)
    mirror, _ = gelu_forward(-x, approximate)
    assert_close(f"gelu[{approximate}](x) - gelu(-x)", out - mirror, x)


# -- finite differences (no torch) ----------------------------------------------------------------

@given(approximate=approximations, case=activations(dtype=np.float64))
def test_backward_matches_finite_differences(approximate, case):
    x, dout = case
    _, cache = gelu_forward(x, approximate)
    dx = gelu_backward(dout, cache)
    expected = numerical_grad(lambda x: gelu_forward(x, approximate)[0], x.copy(), dout)
    assert_close(f"gelu[{approximate}].dx vs finite differences", dx, expected, **FD_TOL)


# -- dtype preservation -----------------------------------------------------------------------------

# -- float16 and bfloat16: FlashAttention's error rule -------------------------------------------

@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@given(approximate=approximations, case=activations(dtype=np.float64))
@example(approximate="none", case=EDGE_CASE)
@example(approximate="tanh", case=EDGE_CASE)
def test_low_precision_meets_the_error_budget(dtype, approximate, case):
    """Ours and the twin against float64 truth, within twice the error of F.gelu in the low
    dtype, in both forms (x and dout rounded first: every side sees them). EDGE_CASE's x = -5.25
    held the tanh form's cdf as (1 + tanh) / 2 to 1.2e-7 off a truth of -4.0e-8 (tanh within float32's
    spacing of -1), past PyTorch's float16 error, 0 there by luck; computed as sigmoid(2 inner) it is not.
    The truth is helpers.gelu_truth: F.gelu's own float64 cancels where ours now does not."""
    x, dout = round_to(case[0], dtype), round_to(case[1], dtype)
    out, cache = gelu_forward(x, approximate)
    dx = gelu_backward(dout, cache)
    assert_one_input_budget(f"gelu[{approximate}]", dtype, (out, dx), lambda x: tw.gelu(x, approximate),
                            lambda x: F.gelu(x, approximate=approximate), {"x": x}, dout,
                            truth=lambda x: gelu_truth(x, approximate))


@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_dtype_is_preserved(approximate, dtype):
    x = np.array([[-3.0, 0.5], [1.0, 9.0]], dtype=dtype)
    out, cache = gelu_forward(x, approximate)
    dx = gelu_backward(np.full_like(x, 0.25), cache)
    assert out.dtype == dtype, f"gelu[{approximate}].out dtype {out.dtype}"
    assert dx.dtype == dtype, f"gelu[{approximate}].dx dtype {dx.dtype}"


@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_zero_d_input(approximate, dtype):
    """A 0-d array works and gives 0-d arrays (NumPy arithmetic on 0-d arrays returns scalars,
    which erf once refused with a message about an intermediate)."""
    x, dout = np.array(0.7, dtype), np.array(-0.3, dtype)
    out, cache = gelu_forward(x, approximate)
    dx = gelu_backward(dout, cache)
    for name, a in (("out", out), ("dx", dx)):
        assert isinstance(a, np.ndarray) and a.shape == () and a.dtype == dtype, \
            f"gelu[{approximate}].{name} is {type(a).__name__} {np.shape(a)} {getattr(a, 'dtype', '')}"
    twin_out, twin_grads = autograd(lambda x: tw.gelu(x, approximate), {"x": x}, dout)
    assert_close(f"gelu[{approximate}].out (0-d)", out, twin_out)
    assert_close(f"gelu[{approximate}].dx (0-d)", dx, twin_grads["x"])


# -- bad input --------------------------------------------------------------------------------------

def test_bad_input():
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh', got 'sigmoid'"):
        gelu_forward(np.zeros(3), approximate="sigmoid")
    for approximate in ("none", "tanh"):   # the tanh form would return float64 for an int x
        for x, got in ((np.arange(3), "got dtype int64"), (np.zeros(3, np.complex64), "got dtype complex64"),
                       (np.zeros(3, bool), "got dtype bool")):
            with pytest.raises(TypeError, match=f"^x must be float16, bfloat16, float32 or float64, {got}$"):
                gelu_forward(x, approximate)
        with pytest.raises(TypeError, match="^x must be a NumPy array, got list$"):
            gelu_forward([0.5, 1.0], approximate)
        with pytest.raises(TypeError, match="^x must be a NumPy array, got float$"):
            gelu_forward(0.5, approximate)


# -- bad upstream gradients --------------------------------------------------------------------------

@given(approximate=approximations, case=activations())
def test_bad_dout_is_refused(approximate, case):
    """A dout of another shape, layout, dtype or type is refused; a NaN in a right one flows on
    as in autograd."""
    x, dout = case
    out, cache = gelu_forward(x, approximate)
    helpers.assert_bad_dout_refused("gelu_backward", out, gelu_backward, cache)
    dout.flat[0] = np.nan
    _, grads = autograd(lambda x: tw.gelu(x, approximate), {"x": x}, dout)
    assert_close(f"gelu[{approximate}].dx with a NaN in dout", gelu_backward(dout, cache), grads["x"])


@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_mixed_low_precision_dtypes_are_refused(dtype):
    """A float32 dout for a low-precision x is a mix, refused (the cache keeps float32 inside)."""
    _, cache = gelu_forward(round_to(EDGES, dtype))
    with pytest.raises(TypeError, match=f"gelu_backward: dout must have the dtype .* {dtype}, got float32"):
        gelu_backward(EDGES.astype(np.float32), cache)
