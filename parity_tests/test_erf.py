"""Parity tests for numpy_attn/erf.py and torch_attn/erf.py.

erf has no backward of its own: gelu's backward uses erf's derivative, the normal density, in
closed form (parity_tests/test_gelu.py checks it). Tolerance: two ulps (rtol = 2 * machine
epsilon), far tighter than TOLERANCES. Against mpmath, the NumPy erf is within 1.2 ulp of the true
erf and torch.erf within 1 ulp (numpy_attn/erf.py), so the two may differ by two; the twin does
the NumPy erf's float64 arithmetic, where only exp may round differently in the last bit, and
erf's condition number |x erf'(x) / erf(x)| is at most 1, so one ulp in stays about one ulp out.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import torch_attn.erf as tw
from numpy_attn.erf import erf
from parity_tests import strategies as S
from parity_tests.helpers import LOW_DTYPES, assert_close, assert_error_budget, round_to, to_numpy, to_torch

# Points in each region (|x| below 1: Taylor series at 0; below 2: Taylor series at 1.5; below 6:
# continued fraction; beyond: 1), their boundaries and both sides of zero.
EDGES = np.array([0.0, 0.5, -1.0, 1.5, -2.0, 3.0, -6.0, 7.0, -30.0])


def two_ulps(dtype):
    finfo = np.finfo(dtype)
    return dict(rtol=2 * float(finfo.eps), atol=float(finfo.smallest_subnormal))


@st.composite
def arguments(draw, dtype=None):
    """x of any shape, bounded by 8 so that every region of erf and its saturation are reached."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=6))
    return draw(S.arrays(dtype, shape, bound=8.0))


# -- forward matches the twin -----------------------------------------------------------------

@pytest.mark.twin_parity
@given(x=arguments())
@example(x=EDGES)
def test_forward_matches_twin(x):
    assert_close("erf", erf(x), to_numpy(tw.erf(to_torch(x))), **two_ulps(x.dtype))


# -- the twin matches PyTorch's built-in --------------------------------------------------------

@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
def test_erf_matches_torch(dtype):
    """A dense sweep of [-8, 8] (erf is +-1 to the last bit beyond 6) plus tiny and huge values,
    for the NumPy erf and its twin: this is what "gelu matches F.gelu to float64 precision"
    rests on."""
    tiny = np.geomspace(np.finfo(dtype).smallest_normal, 1.0, 2001)
    x = np.concatenate([np.linspace(-8.0, 8.0, 400_001), tiny, -tiny, [0.0, 30.0, 1e30, np.inf]])
    x = x.astype(dtype)
    expected = to_numpy(torch.erf(to_torch(x)))
    assert_close("erf vs torch.erf (sweep)", erf(x), expected, **two_ulps(dtype))
    assert_close("twin erf vs torch.erf (sweep)", to_numpy(tw.erf(to_torch(x))), expected,
                 **two_ulps(dtype))


@given(x=st.floats(-30, 30, allow_subnormal=False))
def test_erf_matches_torch_on_drawn_scalars(x):
    x = np.array([x])
    assert_close("erf vs torch.erf (drawn)", erf(x), to_numpy(torch.erf(to_torch(x))),
                 rtol=2 * float(np.finfo(np.float64).eps), atol=0.0)


# -- properties ---------------------------------------------------------------------------------

def test_erf_is_odd_bounded_and_nan_aware():
    x = np.array([-np.inf, -6.0, -0.3, 0.0, 0.3, 6.0, np.inf, np.nan])
    y = erf(x)
    assert np.array_equal(y[:7], -erf(-x[:7])), "erf is not odd"
    assert np.all(np.abs(y[:7]) <= 1), "erf left [-1, 1]"
    assert np.array_equal(y[[0, 6]], [-1.0, 1.0]), "erf(+-inf) is not +-1"
    assert np.isnan(y[7]), "erf(NaN) is not NaN"


# -- dtype and shape preservation -------------------------------------------------------------------

@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
def test_dtype_and_shape_are_preserved(dtype):
    """A 0-d array and a NumPy scalar give a 0-d array (NumPy arithmetic on a 0-d array returns
    a scalar, so erf must not depend on receiving an array)."""
    x = np.array([[-3.0, 0.5], [1.0, 9.0]], dtype=dtype)
    assert erf(x).dtype == dtype, f"erf dtype {erf(x).dtype}"
    for given_x in (np.array(0.5, dtype), dtype(0.5)):
        y = erf(given_x)
        assert isinstance(y, np.ndarray) and y.shape == () and y.dtype == dtype, \
            f"erf of {type(given_x).__name__} {dtype.__name__} gave {type(y).__name__} {np.shape(y)}"
        assert_close("erf(0.5)", y, to_numpy(torch.erf(torch.tensor(0.5, dtype=to_torch(x).dtype))),
                     **two_ulps(dtype))


# -- float16 and bfloat16: FlashAttention's error rule -------------------------------------------

@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@given(x=arguments(dtype=np.float64))
@example(x=EDGES)
def test_low_precision_meets_the_error_budget(dtype, x):
    """Ours and the twin against float64 truth, within twice the error of torch.erf in the low
    dtype (erf has no backward: gelu's test covers its derivative). A 0-d x too."""
    x = round_to(x, dtype)
    truth = to_numpy(torch.erf(to_torch(x.astype(np.float64))))
    theirs = to_numpy(torch.erf(to_torch(x)))
    for who, ours in {"numpy": erf(x), "twin": to_numpy(tw.erf(to_torch(x)))}.items():
        assert_error_budget(f"erf[{who}]", dtype, {"out": (ours, theirs, truth)})
        # erf is bounded by 1, so the budget's one ulp of max|truth| lets through any evaluation
        # good to an ulp of 1. Ours is sharper: float64 to 1.2 ulp of float64, then one rounding,
        # so it is the correctly rounded truth unless the truth lies within ~1e-16 of a midpoint
        # between two low-precision values (about 2^-40 of draws).
        assert np.array_equal(ours, round_to(truth, dtype), equal_nan=True), \
            f"erf[{who}] ({dtype}) is not the correctly rounded float64 erf"


@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_low_precision_scalar_gives_a_0d_array(dtype):
    """A float16 or bfloat16 NumPy scalar is taken, as float32's is, and keeps its dtype."""
    x = round_to(np.array(0.5), dtype)[()]
    y = erf(x)
    assert isinstance(y, np.ndarray) and y.shape == () and y.dtype == x.dtype, f"erf gave {type(y).__name__} {y!r}"
    assert y == round_to(np.array(math.erf(0.5)), dtype), f"erf(0.5) in {dtype} is {y!r}"


# -- bad input --------------------------------------------------------------------------------------

def test_bad_input():
    for x, got in ((np.arange(3), "int64"), (np.zeros(2, np.complex64), "complex64"), (np.zeros(2, bool), "bool")):
        with pytest.raises(TypeError, match=f"^x must be float16, bfloat16, float32 or float64, got dtype {got}$"):
            erf(x)
    with pytest.raises(TypeError, match="^x must be a NumPy array, got float$"):   # a Python float
        erf(0.5)
    with pytest.raises(TypeError, match="x must be a NumPy array, got list"):
        erf([0.5])
