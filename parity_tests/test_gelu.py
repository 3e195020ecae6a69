"""Parity tests for numpy_attn/gelu.py and torch_attn/gelu.py."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import torch_attn.gelu as tw
from numpy_attn.gelu import erf, gelu_backward, gelu_forward
from parity_tests import strategies as S
from parity_tests.helpers import FD_TOL, assert_close, autograd, numerical_grad, to_numpy, to_torch

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


@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
def test_erf_matches_torch(dtype):
    """A dense sweep of [-8, 8] (erf is +-1 to the last bit beyond 6) plus tiny and huge values.

    The bound is two ulps (rtol = 2 * machine epsilon), far tighter than TOLERANCES: this is what
    "matches F.gelu to float64 precision" rests on. Against mpmath, ours is within 1.2 ulp of
    the true erf and torch's within 1 ulp (numpy_attn/gelu.py), so they may differ by two.
    """
    tiny = np.geomspace(np.finfo(dtype).smallest_normal, 1.0, 2001)
    x = np.concatenate([np.linspace(-8.0, 8.0, 400_001), tiny, -tiny, [0.0, 30.0, 1e30, np.inf]])
    x = x.astype(dtype)
    y = erf(x)
    finfo = np.finfo(dtype)
    assert_close("erf vs torch.erf (sweep)", y, to_numpy(torch.erf(to_torch(x))),
                 rtol=2 * float(finfo.eps), atol=float(finfo.smallest_subnormal))


@given(x=st.floats(-30, 30, allow_subnormal=False))
def test_erf_matches_torch_on_drawn_scalars(x):
    x = np.array([x])
    assert_close("erf vs torch.erf (drawn)", erf(x), to_numpy(torch.erf(to_torch(x))),
                 rtol=2 * float(np.finfo(np.float64).eps), atol=0.0)


# -- properties ---------------------------------------------------------------------------------

@given(approximate=approximations, case=activations())
def test_gelu_minus_mirror_is_identity(approximate, case):
    """gelu(x) - gelu(-x) = x (Phi(x) + Phi(-x)) = x, for erf and tanh alike: both are odd."""
    x, _ = case
    out, _ = gelu_forward(x, approximate)
    mirror, _ = gelu_forward(-x, approximate)
    assert_close(f"gelu[{approximate}](x) - gelu(-x)", out - mirror, x)


def test_erf_is_odd_bounded_and_nan_aware():
    x = np.array([-np.inf, -6.0, -0.3, 0.0, 0.3, 6.0, np.inf, np.nan])
    y = erf(x)
    assert np.array_equal(y[:7], -erf(-x[:7])), "erf is not odd"
    assert np.all(np.abs(y[:7]) <= 1), "erf left [-1, 1]"
    assert np.array_equal(y[[0, 6]], [-1.0, 1.0]), "erf(+-inf) is not +-1"
    assert np.isnan(y[7]), "erf(NaN) is not NaN"


# -- finite differences (no torch) ----------------------------------------------------------------

@given(approximate=approximations, case=activations(dtype=np.float64))
def test_backward_matches_finite_differences(approximate, case):
    x, dout = case
    _, cache = gelu_forward(x, approximate)
    dx = gelu_backward(dout, cache)
    expected = numerical_grad(lambda x: gelu_forward(x, approximate)[0], x.copy(), dout)
    assert_close(f"gelu[{approximate}].dx vs finite differences", dx, expected, **FD_TOL)


# -- dtype preservation -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_dtype_is_preserved(approximate, dtype):
    x = np.array([[-3.0, 0.5], [1.0, 9.0]], dtype=dtype)
    out, cache = gelu_forward(x, approximate)
    dx = gelu_backward(np.full_like(x, 0.25), cache)
    assert out.dtype == dtype, f"gelu[{approximate}].out dtype {out.dtype}"
    assert dx.dtype == dtype, f"gelu[{approximate}].dx dtype {dx.dtype}"
    assert erf(x).dtype == dtype, f"erf dtype {erf(x).dtype}"


# -- bad input --------------------------------------------------------------------------------------

def test_bad_input():
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh', got 'sigmoid'"):
        gelu_forward(np.zeros(3), approximate="sigmoid")
    with pytest.raises(TypeError, match="int64"):
        gelu_forward(np.arange(3))
    with pytest.raises(TypeError, match="int64"):
        erf(np.arange(3))
