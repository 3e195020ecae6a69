"""Parity tests for numpy_attn/softmax.py and torch_attn/softmax.py."""

import re

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import torch_attn.softmax as tw
from numpy_attn.softmax import (
    log_softmax_backward,
    log_softmax_forward,
    softmax_backward,
    softmax_forward,
)
from parity_tests import helpers
from parity_tests import strategies as S
from parity_tests.helpers import FD_TOL, assert_close, autograd, numerical_grad, to_numpy, to_torch

PAIRS = {
    "softmax": (softmax_forward, softmax_backward, tw.softmax, torch.softmax),
    "log_softmax": (log_softmax_forward, log_softmax_backward, tw.log_softmax, torch.log_softmax),
}
ops = st.sampled_from(sorted(PAIRS))


@st.composite
def logits(draw, dtype=None, masked=True):
    """(x, dout, axis): bounded logits, optionally with -inf entries and whole -inf rows."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6))
    x = draw(S.arrays(dtype, shape, bound=10.0))
    if masked and draw(st.booleans()):
        x = np.where(draw(hnp.arrays(np.bool_, shape)), -np.inf, x).astype(dtype)
    dout = draw(S.arrays(dtype, shape))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    return x, dout, axis


# -- forward matches the twin -----------------------------------------------------------------

@given(op=ops, case=logits())
@example(op="softmax", case=(np.full((2, 3), -np.inf), np.ones((2, 3)) * 0.5, -1))
def test_forward_matches_twin(op, case):
    x, dout, axis = case
    forward, _, twin, _ = PAIRS[op]
    y, _ = forward(x, axis=axis)
    assert_close(f"{op}.y", y, to_numpy(twin(to_torch(x), dim=axis)))


# -- backward matches autograd ----------------------------------------------------------------

@pytest.mark.twin_parity
@given(op=ops, case=logits())
@example(op="log_softmax", case=(np.array([[-np.inf, -np.inf], [1.0, -np.inf]]),
                                 np.array([[0.3, -0.7], [0.2, 0.9]]), -1))
def test_backward_matches_autograd(op, case):
    x, dout, axis = case
    forward, backward, twin, _ = PAIRS[op]
    y, cache = forward(x, axis=axis)
    # dout is zeroed where y = -inf, because (-inf * dout).sum() is not finite; both backward
    # passes get the same upstream gradient.
    dout = np.where(np.isfinite(y), dout, 0).astype(x.dtype)
    dx = backward(dout, cache)
    _, grads = autograd(lambda x: twin(x, dim=axis), {"x": x}, dout)
    assert_close(f"{op}.dx", dx, grads["x"])


# -- the twin matches PyTorch's built-in --------------------------------------------------------

@given(op=ops, case=logits())
def test_twin_matches_builtin(op, case):
    """Equal to torch.softmax / torch.log_softmax on every row that has a finite entry."""
    x, dout, axis = case
    _, _, twin, builtin = PAIRS[op]
    xt = to_torch(x, requires_grad=True)
    xb = to_torch(x, requires_grad=True)
    yt, yb = twin(xt, dim=axis), builtin(xb, dim=axis)
    valid = np.isfinite(x).any(axis=axis, keepdims=True) & np.ones_like(x, dtype=bool)
    assert_close(f"{op}.y vs builtin", to_numpy(yt)[valid], to_numpy(yb)[valid])
    g = to_torch(np.where(valid & np.isfinite(to_numpy(yb)), dout, 0))
    (yt * g).nan_to_num(posinf=0.0, neginf=0.0).sum().backward()
    (yb * g).nan_to_num(posinf=0.0, neginf=0.0).sum().backward()
    assert_close(f"{op}.dx vs builtin", to_numpy(xt.grad)[valid], to_numpy(xb.grad)[valid])


def test_builtin_gives_nan_on_all_masked_row_where_we_give_zeros():
    """torch.softmax normalises 0 / 0 on an all -inf row and returns NaN; we return zeros
    (softmax) and -inf (log-softmax), so a fully masked attention row contributes nothing."""
    x = np.array([[-np.inf, -np.inf, -np.inf], [0.0, 1.0, -np.inf]])
    assert torch.isnan(torch.softmax(to_torch(x), dim=-1)[0]).all()
    assert torch.isnan(torch.log_softmax(to_torch(x), dim=-1)[0]).all()
    y, _ = softmax_forward(x)
    assert np.array_equal(y[0], np.zeros(3)), "softmax.y all -inf row"
    ly, _ = log_softmax_forward(x)
    assert np.all(np.isneginf(ly[0])), "log_softmax.y all -inf row"


TORCH_DTYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64,
                **dict(helpers.LOW_DTYPES.values())}


@given(op=ops, case=logits(), dtype=S.dtypes)
@example(op="softmax", case=(np.array([[1e4, -1e4, 0.0]], np.float32), np.array([[0.5, -1.0, 2.0]], np.float32),
                             -1), dtype=np.float64)
def test_dtype_casts_first_as_builtin(op, case, dtype):
    """dtype= casts x before anything else, as torch.softmax(x, dim, dtype=...): the output has
    that dtype and equals the built-in's, the twin's too; the gradient comes back in x's dtype and
    equals autograd's through the built-in, on every row with a finite entry."""
    x, dout, axis = case
    forward, backward, twin, builtin = PAIRS[op]
    y, cache = forward(x, axis=axis, dtype=dtype)
    dout = np.where(np.isfinite(y), dout, 0).astype(dtype)
    dx = backward(dout, cache)
    assert y.dtype == dtype and dx.dtype == x.dtype, \
        f"{op} of {x.dtype} with dtype={np.dtype(dtype)}: y {y.dtype}, dx {dx.dtype}"
    valid = np.isfinite(x).any(axis=axis, keepdims=True) & np.ones_like(x, dtype=bool)
    torch_dtype = TORCH_DTYPES[np.dtype(dtype)]
    built_y, built_grads = autograd(lambda x: builtin(x, dim=axis, dtype=torch_dtype), {"x": x},
                                    np.where(valid, dout, 0).astype(dtype))
    twin_y = to_numpy(twin(to_torch(x), dim=axis, dtype=torch_dtype))
    assert_close(f"{op}.y with dtype= vs the twin", y, twin_y)
    assert_close(f"{op}.y with dtype= vs builtin", y[valid], built_y[valid])
    # Both gradients are computed in dtype and then cast to x's: the coarser dtype's precision.
    tol = helpers.TOLERANCES[min(np.dtype(dtype), x.dtype, key=lambda d: d.itemsize)]
    assert_close(f"{op}.dx with dtype= vs builtin", dx[valid], built_grads["x"][valid], **tol)


@pytest.mark.parametrize("op", sorted(PAIRS))
def test_dtype_casts_integers_and_bools_as_builtin(op):
    """With dtype= an integer or bool x is cast first, as torch does (without it, both refuse it);
    such an x has no gradient, so the backward refuses to make one."""
    forward, backward, twin, builtin = PAIRS[op]
    for x in (np.array([[3, -1, 0], [2, 2, 7]]), np.array([True, False, True])):
        y, cache = forward(x, dtype=np.float32)
        expected = to_numpy(builtin(torch.from_numpy(x), dim=-1, dtype=torch.float32))
        assert_close(f"{op}.y of {x.dtype} with dtype=float32 vs builtin", y, expected)
        assert_close(f"twin {op}.y of {x.dtype} with dtype=float32",
                     to_numpy(twin(torch.from_numpy(x), dtype=torch.float32)), expected)
        with pytest.raises(TypeError, match=f"{op}_backward: the forward's x was {x.dtype}, cast to "
                                            f"float32 by dtype=, and {x.dtype} has no gradient"):
            backward(np.zeros(x.shape, np.float32), cache)


@pytest.mark.parametrize("value", [3.0, -2.5, -np.inf])
@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
@pytest.mark.parametrize("op", sorted(PAIRS))
def test_zero_d_input_as_builtin(op, dtype, value):
    """A 0-d x is one row of one entry along axis 0 or -1, as torch takes it: softmax 1, log-softmax
    0, zero gradient, all 0-d arrays; -inf is a fully masked row (0 and -inf here, NaN in torch).
    Axes 1 and -2 are out of range, as in torch."""
    forward, backward, twin, builtin = PAIRS[op]
    x, dy = np.array(value, dtype), np.array(0.75, dtype)
    for axis in (0, -1):
        y, cache = forward(x, axis=axis)
        dx = backward(dy, cache)
        for name, a in (("y", y), ("dx", dx)):
            assert type(a) is np.ndarray and a.shape == () and a.dtype == dtype, \
                f"{op}.{name} of a 0-d x is {type(a).__name__} {np.shape(a)}"
        assert_close(f"{op}.dx of a 0-d x", dx, np.zeros((), dtype), rtol=0, atol=0)
        twin_y, twin_grads = autograd(lambda x, axis=axis: twin(x, dim=axis), {"x": x}, dy)
        assert_close(f"twin {op}.y of a 0-d x", twin_y, y, rtol=0, atol=0)
        assert_close(f"twin {op}.dx of a 0-d x", twin_grads["x"], dx, rtol=0, atol=0)
        if np.isfinite(value):
            assert_close(f"{op}.y of a 0-d x vs builtin", y, to_numpy(builtin(to_torch(x), dim=axis)))
    for axis in (1, -2):
        with pytest.raises(IndexError, match="Dimension out of range"):
            builtin(to_torch(x), dim=axis)
        with pytest.raises(ValueError, match=rf"axis {axis} is out of range for x of shape \(\)"):
            forward(x, axis=axis)


# -- float16 and bfloat16: FlashAttention's error rule -------------------------------------------

def _low_case(case, dtype):
    """(x, dout) rounded to ``dtype``, rows that are entirely -inf made all zero (there we give
    zeros and PyTorch NaN: test_builtin_gives_nan_on_all_masked_row_where_we_give_zeros), dout
    zeroed where x is -inf (y = -inf there, whose product with dout is not finite)."""
    x, dout, axis = case
    x = np.where(np.isfinite(x).any(axis=axis, keepdims=True), x, 0.0)
    return helpers.round_to(x, dtype), helpers.round_to(np.where(np.isfinite(x), dout, 0.0), dtype)


@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", helpers.LOW_DTYPES)
@given(op=ops, case=logits(dtype=np.float64))
@example(op="softmax", case=(np.array([[9.5, -3.25, 0.125, 7.0, -np.inf]]), np.array([[0.5, -1.0, 2.0, 3.0, 1.5]]),
                             -1))
def test_low_precision_meets_the_error_budget(dtype, op, case):
    """Ours and the twin against float64 truth, within twice the error of PyTorch's own
    low-precision torch.softmax / torch.log_softmax, for y and dx."""
    x, dout = _low_case(case, dtype)                            # the inputs every side shares
    axis = case[2]
    forward, backward, twin, builtin = PAIRS[op]
    y, cache = forward(x, axis=axis)
    dx = backward(dout, cache)
    twin_y, twin_grads = autograd(lambda x: twin(x, dim=axis), {"x": x}, dout)
    torch_y, torch_grads = autograd(lambda x: builtin(x, dim=axis), {"x": x}, dout)
    truth_y, truth_grads = autograd(lambda x: builtin(x, dim=axis), {"x": x.astype(np.float64)},
                                    dout.astype(np.float64))
    for who, (o, g) in {"numpy": (y, dx), "twin": (twin_y, twin_grads["x"])}.items():
        helpers.assert_error_budget(f"{op}[{who}]", dtype, {
            "y": (o, torch_y, truth_y), "dx": (g, torch_grads["x"], truth_grads["x"])})


@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", helpers.LOW_DTYPES)
@given(op=ops, case=logits(dtype=np.float32))
def test_dtype_casts_to_a_low_dtype_as_builtin(dtype, op, case):
    """dtype=float16/bfloat16 on a float32 x: y in that dtype within the budget of
    torch.softmax(x, dim, dtype=...), dx back in float32 but holding values of the low dtype (the
    gradient of the cast x, as autograd's), within the budget too; the twin the same."""
    x32, dout, axis = case
    x32 = np.where(np.isfinite(x32).any(axis=axis, keepdims=True), x32, 0).astype(np.float32)
    low, torch_dtype = helpers.LOW_DTYPES[dtype]
    forward, backward, twin, builtin = PAIRS[op]
    y, cache = forward(x32, axis=axis, dtype=low)
    dout = helpers.round_to(np.where(np.isfinite(y.astype(np.float64)), dout, 0), dtype)
    dx = backward(dout, cache)
    assert y.dtype == low and dx.dtype == np.float32, f"{op} with dtype={dtype}: y {y.dtype}, dx {dx.dtype}"
    assert np.array_equal(dx, dx.astype(low).astype(np.float32)), f"{op}.dx with dtype={dtype} is not rounded"
    twin_y, twin_grads = autograd(lambda x: twin(x, dim=axis, dtype=torch_dtype), {"x": x32}, dout)
    torch_y, torch_grads = autograd(lambda x: builtin(x, dim=axis, dtype=torch_dtype), {"x": x32}, dout)
    # The truth computes on x rounded to the low dtype, as every side does after the cast.
    x64 = helpers.round_to(x32, dtype).astype(np.float64)
    truth_y, truth_grads = autograd(lambda x: builtin(x, dim=axis), {"x": x64}, dout.astype(np.float64))
    for who, (o, g) in {"numpy": (y, dx), "twin": (twin_y, twin_grads["x"])}.items():
        assert g.dtype == np.float32, f"{op}[{who}].dx with dtype={dtype} is {g.dtype}"
        helpers.assert_error_budget(f"{op}[{who}] dtype=", dtype, {
            "y": (o, torch_y, truth_y), "dx": (g.astype(low), torch_grads["x"].astype(low), truth_grads["x"])})


@pytest.mark.parametrize("dtype", helpers.LOW_DTYPES)
@pytest.mark.parametrize("op", sorted(PAIRS))
def test_low_precision_mix_is_refused(op, dtype):
    """A float32 dy for a float16/bfloat16 y (and the reverse) is refused, naming both dtypes."""
    forward, backward, _, _ = PAIRS[op]
    low = helpers.LOW_DTYPES[dtype][0]
    _, cache = forward(np.zeros((2, 3), low))
    with pytest.raises(TypeError, match=f"dy must have the dtype of the forward's output, {dtype}, got float32"):
        backward(np.zeros((2, 3), np.float32), cache)
    _, cache = forward(np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError, match=f"dy must have the dtype of the forward's output, float32, got {dtype}"):
        backward(np.zeros((2, 3), low), cache)


# -- properties ---------------------------------------------------------------------------------

@given(case=logits())
def test_rows_sum_to_one_or_zero(case):
    x, _, axis = case
    y, _ = softmax_forward(x, axis=axis)
    expected = np.isfinite(x).any(axis=axis).astype(x.dtype)
    assert_close("softmax row sums", y.sum(axis=axis), expected, rtol=1e-5 if x.dtype == np.float32 else None)
    assert np.all(y >= 0), "softmax.y has a negative entry"


@given(case=logits(masked=False), shift=st.floats(-50, 50))
def test_shift_invariance(case, shift):
    x, _, axis = case
    y, _ = softmax_forward(x, axis=axis)
    y_shifted, _ = softmax_forward(x + x.dtype.type(shift), axis=axis)
    assert_close("softmax.y after shifting x", y_shifted, y)


@given(case=logits(masked=True))
def test_log_softmax_is_log_of_softmax(case):
    x, _, axis = case
    y, _ = softmax_forward(x, axis=axis)
    ly, _ = log_softmax_forward(x, axis=axis)
    with np.errstate(divide="ignore"):
        assert_close("log_softmax.y vs log(softmax.y)", ly, np.log(y), rtol=1e-4 if x.dtype == np.float32 else 1e-9)


@pytest.mark.parametrize("dtype, big", [(np.float32, 1e4), (np.float64, 1e300)])
@pytest.mark.parametrize("op", sorted(PAIRS))
def test_extreme_logits_stay_finite(op, dtype, big):
    x = np.array([[big, -big, 0.0], [-big, -big, -big], [big, big, -np.inf]], dtype=dtype)
    forward, backward, _, _ = PAIRS[op]
    y, cache = forward(x)
    dx = backward(np.array([[0.5, -1.0, 2.0]] * 3, dtype=dtype), cache)
    assert not np.isnan(y).any(), f"{op}.y has NaN for logits of +-{big}"
    assert np.isfinite(dx).all(), f"{op}.dx is not finite for logits of +-{big}"
    if op == "softmax":
        assert_close("softmax.y extreme rows", y, np.array(
            [[1, 0, 0], [1 / 3, 1 / 3, 1 / 3], [0.5, 0.5, 0]], dtype=dtype))


# What NumPy warns about by default (underflow is silent, and exp(-1000) = 0 is right).
RAISE = dict(divide="raise", over="raise", invalid="raise")


@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
@pytest.mark.parametrize("op", sorted(PAIRS))
def test_extreme_logits_raise_no_numpy_warning(op, dtype):
    """Logits at the ends of the float range: x - m overflows to -inf, whose exp is the right 0,
    so no warning may escape (a caller running with warnings as errors would crash)."""
    big = np.finfo(dtype).max
    x = np.array([[big, -big, 0.0], [-big, -big, -big], [big, big, -np.inf], [-np.inf] * 3], dtype=dtype)
    forward, backward, _, _ = PAIRS[op]
    with np.errstate(**RAISE):
        y, cache = forward(x)
        dx = backward(np.array([[0.5, -1.0, 2.0]] * 4, dtype=dtype), cache)
    assert np.isfinite(dx).all(), f"{op}.dx is not finite for logits of +-{big}"
    if op == "softmax":
        assert_close("softmax.y rows at the float range", y, np.array(
            [[1, 0, 0], [1 / 3, 1 / 3, 1 / 3], [0.5, 0.5, 0], [0, 0, 0]], dtype=dtype), rtol=0, atol=0)


@given(op=ops, data=st.data())
def test_fully_masked_rows_pass_back_exactly_zero(op, data):
    """Rows that are entirely -inf get exactly zero gradient whatever dy holds there (drawn away
    from zero, so that a dy passed through would show), with NumPy's warnings raised as errors."""
    dtype = data.draw(S.dtypes)
    rows, n = data.draw(S.dim(1, 4)), data.draw(S.dim(1, 5))
    masked = data.draw(hnp.arrays(np.bool_, (rows, 1))) | (np.arange(rows) == 0)[:, None]
    x = np.where(masked, -np.inf, data.draw(S.arrays(dtype, (rows, n), bound=10.0))).astype(dtype)
    magnitude = data.draw(hnp.arrays(dtype, (rows, n), elements=st.floats(0.5, 4.0, width=32)))
    dy = np.where(data.draw(hnp.arrays(np.bool_, (rows, n))), magnitude, -magnitude).astype(dtype)
    forward, backward, _, _ = PAIRS[op]
    with np.errstate(**RAISE):
        _, cache = forward(x)
        dx = backward(dy, cache)
    assert np.all(dx[masked[:, 0]] == 0), f"{op}.dx on fully masked rows: {dx[masked[:, 0]]}"


@pytest.mark.parametrize("op", sorted(PAIRS))
def test_empty_axis_gives_empty_output(op):
    forward, backward, _, builtin = PAIRS[op]
    y, cache = forward(np.zeros((2, 0)))
    assert y.shape == (2, 0) and builtin(torch.zeros(2, 0), dim=-1).shape == (2, 0)
    assert backward(np.zeros((2, 0)), cache).shape == (2, 0), f"{op}.dx shape"


# -- finite differences (no torch) ----------------------------------------------------------------

@given(op=ops, case=logits(dtype=np.float64, masked=False))
def test_backward_matches_finite_differences(op, case):
    x, dout, axis = case
    forward, backward, _, _ = PAIRS[op]
    _, cache = forward(x, axis=axis)
    dx = backward(dout, cache)
    expected = numerical_grad(lambda x: forward(x, axis=axis)[0], x.copy(), dout)
    assert_close(f"{op}.dx vs finite differences", dx, expected, **FD_TOL)


# -- dtype preservation -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES + tuple(d.type for d, _ in helpers.LOW_DTYPES.values()))
@pytest.mark.parametrize("op", sorted(PAIRS))
def test_dtype_is_preserved(op, dtype):
    forward, backward, _, _ = PAIRS[op]
    x = np.array([[1.0, -np.inf, 3.0], [-np.inf] * 3], dtype=dtype)
    y, cache = forward(x)
    dx = backward(np.ones_like(x) * dtype(0.25), cache)
    assert y.dtype == dtype, f"{op}.y dtype {y.dtype}"
    assert dx.dtype == dtype, f"{op}.dx dtype {dx.dtype}"


@pytest.mark.parametrize("shape", [(), (3, 4)])
@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
def test_softmax_hands_out_the_cached_y_read_only(dtype, shape):
    """softmax's y is the very array its backward reads, not a copy of it, handed out read-only:
    changing it in place is NumPy's error, never a silent change to the gradient."""
    x = S.ramp(*shape, dtype=dtype)
    y, cache = softmax_forward(x)
    assert np.shares_memory(y, cache.y), "softmax.y is a copy of what the backward reads"
    assert not y.flags.writeable, "softmax.y is writeable"
    expected = softmax_backward(np.ones_like(x), softmax_forward(x)[1])
    with pytest.raises(ValueError, match="read-only"):
        y *= 2
    assert_close("softmax.dx after y *= 2 was refused", softmax_backward(np.ones_like(x), cache), expected,
                 rtol=0, atol=0)


# -- bad input --------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", sorted(PAIRS))
def test_bad_input(op):
    forward = PAIRS[op][0]
    with pytest.raises(TypeError, match="int64"):
        forward(np.arange(3))
    with pytest.raises(ValueError, match=r"axis 2 is out of range for x of shape \(2, 3\)"):
        forward(np.zeros((2, 3)), axis=2)
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        forward(np.array([0.0, np.nan]))
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        forward(np.array([0.0, np.inf]))
    with pytest.raises(TypeError, match="axis must be an integer, got float 1.0"):
        forward(np.zeros((2, 3)), axis=1.0)
    for dtype, shown in (("int32", "int32"), (np.complex64, "complex64"), (torch.float64, "torch.float64")):
        with pytest.raises(TypeError, match=re.escape(
                f"dtype must be float16, bfloat16, float32 or float64 (or None), got {shown}")):
            forward(np.zeros(3), dtype=dtype)
    with pytest.raises(TypeError, match="x must be a NumPy array of bools, integers or floats to cast to dtype "
                                        "float64, got list"):
        forward([1.0, 2.0], dtype=np.float64)
    with pytest.raises(TypeError, match="x must be a NumPy array of bools, integers or floats to cast to dtype "
                                        "float32, got complex128"):
        forward(np.zeros(3, complex), dtype=np.float32)
    with pytest.raises(ValueError, match=r"x of shape \(2,\) holds NaN or \+inf"):
        forward(np.array([0.0, np.nan], np.float32), dtype=np.float64)


def _one_bad_entry(n):
    """Positions in a row of n entries to put one NaN or +inf at: every one for short rows (the
    SIMD widths of float32 and float64 and their tails), the ends and block edges for long ones."""
    return range(n) if n <= 40 else sorted({0, 1, 15, 16, 31, 32, 63, 64, n // 2, n - 2, n - 1})


@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
@pytest.mark.parametrize("op", sorted(PAIRS))
def test_nan_or_inf_anywhere_in_a_row_is_refused(op, dtype):
    """The NaN/+inf check reads the row maxima, not x: one NaN or +inf at any position of a row,
    among finite or -inf entries, makes that row's maximum NaN or +inf and is refused, whether the
    row runs along the last axis or the first (contiguous or strided: NumPy's max runs other loops)."""
    forward = PAIRS[op][0]
    for n in list(range(1, 41)) + [127, 128, 129, 1031]:
        for fill, bad in ((0.5, np.nan), (0.5, np.inf), (-np.inf, np.nan), (-np.inf, np.inf)):
            for pos in _one_bad_entry(n):
                x = np.full((3, n), fill, dtype)
                x[1, pos] = bad
                for axis, rows in ((-1, x), (0, x.T), (0, np.ascontiguousarray(x.T))):
                    with pytest.raises(ValueError, match=r"holds NaN or \+inf"):
                        forward(rows, axis=axis)
                        pytest.fail(f"{op} of {dtype.__name__} rows of {n} with {bad} at {pos} "
                                    f"among {fill}, axis {axis}: no error")


@given(op=ops, case=logits(), dtype=st.none() | S.dtypes)
def test_bad_dy_is_refused(op, case, dtype):
    """dy has the output's shape and dtype (dtype='s, not x's, when given)."""
    x, _, axis = case
    forward, backward, _, _ = PAIRS[op]
    y, cache = forward(x, axis=axis, dtype=dtype)
    helpers.assert_bad_dout_refused(f"{op}_backward", y, backward, cache, dout_name="dy")
