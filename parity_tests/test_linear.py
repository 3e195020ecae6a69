"""Parity tests for numpy_attn/linear.py and torch_attn/linear.py."""

import numpy as np
import pytest
import torch.nn.functional as F
from hypothesis import example, given
from hypothesis import strategies as st

from numpy_attn.linear import linear_backward, linear_forward
from parity_tests import helpers
from parity_tests import strategies as S
from parity_tests.helpers import (
    FD_TOL,
    LOW_DTYPES,
    assert_close,
    assert_error_budget,
    assert_tree_close,
    autograd,
    numerical_grad,
    round_to,
    to_numpy,
    to_torch,
)
from torch_attn.linear import linear


@st.composite
def affine(draw, dtype=None, bias=None):
    """(x, w, b, dout): x (..., C_in) with 0 to 2 leading dims, w (C_in, C_out), b or None."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    lead = draw(S.batch_shapes())
    C_in, C_out = draw(S.dim(1, 8)), draw(S.dim(1, 8))
    x = draw(S.arrays(dtype, lead + (C_in,)))
    w = draw(S.arrays(dtype, (C_in, C_out)))
    b = draw(S.arrays(dtype, (C_out,))) if (draw(st.booleans()) if bias is None else bias) else None
    dout = draw(S.arrays(dtype, lead + (C_out,)))
    return x, w, b, dout


def _params(w, b):
    return {"w": w} if b is None else {"w": w, "b": b}


ONE_ROW = (np.array([1.0, -2.0]), np.array([[0.5, 1.0, -1.0], [2.0, 0.0, 3.0]]), None,
           np.array([0.25, -0.5, 1.5]))


# -- forward matches the twin -----------------------------------------------------------------

@given(case=affine())
@example(case=ONE_ROW)
def test_forward_matches_twin(case):
    x, w, b, dout = case
    out, _ = linear_forward(x, w, b)
    twin_out, _ = autograd(linear, {"x": x, **_params(w, b)}, dout)
    assert_close("linear.out", out, twin_out)


# -- backward matches autograd ----------------------------------------------------------------

@pytest.mark.twin_parity
@given(case=affine())
@example(case=ONE_ROW)
def test_backward_matches_autograd(case):
    x, w, b, dout = case
    _, cache = linear_forward(x, w, b)
    dx, dparams = linear_backward(dout, cache)
    _, grads = autograd(linear, {"x": x, **_params(w, b)}, dout)
    assert_close("linear.dx", dx, grads.pop("x"))
    assert_tree_close("linear", dparams, grads)


# -- the twin matches PyTorch's built-in --------------------------------------------------------

@given(case=affine())
def test_twin_matches_builtin(case):
    """F.linear stores the weight (C_out, C_in), so it gets w.T."""
    x, w, b, dout = case
    twin_out, twin_grads = autograd(linear, {"x": x, **_params(w, b)}, dout)
    builtin_out, builtin_grads = autograd(
        lambda x, w, b=None: F.linear(x, w.T, b), {"x": x, **_params(w, b)}, dout)
    assert_close("linear.out vs F.linear", twin_out, builtin_out)
    assert_tree_close("linear grads vs F.linear", twin_grads, builtin_grads)


# -- properties ---------------------------------------------------------------------------------

@given(case=affine(bias=True))
def test_leading_dims_are_rows(case):
    """Any leading shape gives the same result as its rows stacked into a matrix."""
    x, w, b, dout = case
    out, cache = linear_forward(x, w, b)
    flat_out, flat_cache = linear_forward(x.reshape(-1, w.shape[0]), w, b)
    assert_close("linear.out flattened", out.reshape(-1, w.shape[1]), flat_out)
    _, dparams = linear_backward(dout, cache)
    _, flat_dparams = linear_backward(dout.reshape(-1, w.shape[1]), flat_cache)
    assert_tree_close("linear grads flattened", dparams, flat_dparams)


def test_no_bias_means_no_b_gradient():
    _, cache = linear_forward(np.ones((2, 3)), np.ones((3, 4)))
    _, dparams = linear_backward(np.ones((2, 4)), cache)
    assert set(dparams) == {"w"}, f"gradient keys {set(dparams)} without a bias"


def test_cache_holds_the_inputs_by_reference():
    """docs/design.md: the cache keeps the inputs, not copies; changing x in place between the
    forward and the backward changes dw (PyTorch would refuse this backward instead)."""
    x, w, b = np.ones((2, 3)), np.ones((3, 4)), np.zeros(4)
    _, cache = linear_forward(x, w, b)
    x *= 2
    _, grads = linear_backward(np.ones((2, 4)), cache)
    # dw = x^T @ dout sums the two rows of the new x, 2 each (the x seen by the forward gave 2)
    assert np.array_equal(grads["w"], np.full((3, 4), 4.0)), grads["w"]


# -- finite differences (no torch) ----------------------------------------------------------------

@given(case=affine(dtype=np.float64, bias=True))
def test_backward_matches_finite_differences(case):
    x, w, b, dout = case
    _, cache = linear_forward(x, w, b)
    dx, dparams = linear_backward(dout, cache)
    assert_close("linear.dx vs finite differences", dx,
                 numerical_grad(lambda x: linear_forward(x, w, b)[0], x.copy(), dout), **FD_TOL)
    assert_close("linear.w vs finite differences", dparams["w"],
                 numerical_grad(lambda w: linear_forward(x, w, b)[0], w.copy(), dout), **FD_TOL)
    assert_close("linear.b vs finite differences", dparams["b"],
                 numerical_grad(lambda b: linear_forward(x, w, b)[0], b.copy(), dout), **FD_TOL)


# -- float16 and bfloat16: FlashAttention's error rule -------------------------------------------

@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@given(case=affine(dtype=np.float64, bias=True))
@example(case=(ONE_ROW[0], ONE_ROW[1], np.array([0.1, -0.3, 2.7]), ONE_ROW[3]))
def test_low_precision_meets_the_error_budget(dtype, case):
    """Ours and the twin against float64 truth, within twice the error of PyTorch's own
    low-precision F.linear, for out, dx, dw and db."""
    x, w, b, dout = (round_to(a, dtype) for a in case)         # the inputs every side shares
    out, cache = linear_forward(x, w, b)
    dx, dparams = linear_backward(dout, cache)
    ours = {"numpy": (out, {"x": dx, **dparams}), "twin": autograd(linear, {"x": x, "w": w, "b": b}, dout)}
    builtin = lambda x, w, b: F.linear(x, w.T, b)             # noqa: E731
    torch_out, torch_grads = autograd(builtin, {"x": x, "w": w, "b": b}, dout)
    truth_out, truth_grads = autograd(builtin, {"x": x.astype(np.float64), "w": w.astype(np.float64),
                                                "b": b.astype(np.float64)}, dout.astype(np.float64))
    for who, (o, g) in ours.items():
        assert_error_budget(f"linear[{who}]", dtype, {
            "out": (o, torch_out, truth_out),
            **{f"d{k}": (g[k], torch_grads[k], truth_grads[k]) for k in ("x", "w", "b")}})


@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_low_precision_mix_is_refused(dtype):
    """A low-precision x with float32 weights is refused as a float32/float64 mix is."""
    low = LOW_DTYPES[dtype][0]
    x, w = np.zeros((2, 3), low), np.zeros((3, 4), np.float32)
    with pytest.raises(TypeError, match=f"^arrays must share one dtype: x is {dtype}, w is float32$"):
        linear_forward(x, w)
    with pytest.raises(TypeError, match=f"^arrays must share one dtype: x is {dtype}, w is {dtype}, b is float32$"):
        linear_forward(x, w.astype(low), np.zeros(4, np.float32))


# -- dtype preservation -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES + tuple(d for d, _ in LOW_DTYPES.values()))
def test_dtype_is_preserved(dtype):
    x, w, b = np.ones((2, 3), dtype), np.ones((3, 4), dtype), np.ones(4, dtype)
    out, cache = linear_forward(x, w, b)
    dx, dparams = linear_backward(np.ones_like(out), cache)
    for name, arr in [("out", out), ("dx", dx), ("w", dparams["w"]), ("b", dparams["b"])]:
        assert arr.dtype == dtype, f"linear.{name} dtype {arr.dtype}"


# -- bad input --------------------------------------------------------------------------------------

def test_bad_input():
    w = np.zeros((3, 4))
    with pytest.raises(ValueError, match=r"x of shape \(2, 5\) does not end in C_in = 3 of w \(3, 4\)"):
        linear_forward(np.zeros((2, 5)), w)
    with pytest.raises(ValueError, match=r"b must have shape \(4,\) to match w \(3, 4\), got \(3,\)"):
        linear_forward(np.zeros((2, 3)), w, np.zeros(3))
    with pytest.raises(ValueError, match=r"w must have 2 dimensions, got shape \(3,\)"):
        linear_forward(np.zeros((2, 3)), np.zeros(3))
    with pytest.raises(TypeError, match="x is float32, w is float64"):
        linear_forward(np.zeros((2, 3), np.float32), w)
    with pytest.raises(TypeError, match=r"arrays must share one dtype: x is float64, w is float64, b is float32"):
        linear_forward(np.zeros((2, 3)), w, np.zeros(4, np.float32))
    # Integers would come out as int64 or float64 without a word (x @ w promotes).
    for name, args in (("x", (np.zeros((2, 3), np.int64), w)), ("w", (np.zeros((2, 3)), w.astype(np.int32))),
                       ("b", (np.zeros((2, 3)), w, np.zeros(4, np.int64)))):
        dtype = args[["x", "w", "b"].index(name)].dtype
        with pytest.raises(TypeError,
                           match=f"^{name} must be float16, bfloat16, float32 or float64, got dtype {dtype}$"):
            linear_forward(*args)
    with pytest.raises(TypeError, match="^x must be a NumPy array, got list$"):
        linear_forward([[0.0, 1.0, 2.0]], w)
    with pytest.raises(TypeError, match="^w must be a NumPy array, got list$"):
        linear_forward(np.zeros((2, 3)), w.tolist())
    with pytest.raises(ValueError, match=r"^w must have 2 dimensions, got shape \(3, 4, 1\)$"):
        linear_forward(np.zeros((2, 3)), np.zeros((3, 4, 1)))
    with pytest.raises(ValueError, match=r"^x of shape \(\) does not end in C_in = 3 of w \(3, 4\)$"):
        linear_forward(np.array(1.0), w)
    with pytest.raises(ValueError, match=r"^b must have shape \(4,\) to match w \(3, 4\), got \(1, 4\)$"):
        linear_forward(np.zeros((2, 3)), w, np.zeros((1, 4)))
    # narrower as well as wider: a check of one side only would let the other through to matmul
    with pytest.raises(ValueError, match=r"^x of shape \(2, 2\) does not end in C_in = 3 of w \(3, 4\)$"):
        linear_forward(np.zeros((2, 2)), w)
    with pytest.raises(ValueError, match=r"^b must have shape \(4,\) to match w \(3, 4\), got \(5,\)$"):
        linear_forward(np.zeros((2, 3)), w, np.zeros(5))


def test_gpt2_width_runs_as_the_builtin():
    """C_in = 768 (GPT-2's width, past the small integers Python shares, so the sizes are compared
    by value) runs as F.linear, forward and backward, in float64."""
    rng = np.random.default_rng(0)
    x, w, b, dout = rng.standard_normal((2, 768)), rng.standard_normal((768, 3)), rng.standard_normal(3), \
        rng.standard_normal((2, 3))
    out, cache = linear_forward(x, w, b)
    dx, grads = linear_backward(dout, cache)
    tx, tw, tb = (to_torch(a, requires_grad=True) for a in (x, w, b))
    ref = F.linear(tx, tw.T, tb)
    ref.backward(to_torch(dout))
    assert_close("linear C_in=768 out", out, to_numpy(ref))
    assert_close("linear C_in=768 dx", dx, to_numpy(tx.grad))
    assert_close("linear C_in=768 dw", grads["w"], to_numpy(tw.grad))
    assert_close("linear C_in=768 db", grads["b"], to_numpy(tb.grad))


# -- bad upstream gradients --------------------------------------------------------------------------

@given(case=affine())
def test_bad_dout_is_refused(case):
    """A dout of another shape, layout, dtype or type is refused; a NaN in a right one flows on
    as in autograd."""
    x, w, b, dout = case
    out, cache = linear_forward(x, w, b)
    helpers.assert_bad_dout_refused("linear_backward", out, linear_backward, cache)
    dout.flat[0] = np.nan
    dx, dparams = linear_backward(dout, cache)
    _, grads = autograd(linear, {"x": x, **_params(w, b)}, dout)
    assert_close("linear.dx with a NaN in dout", dx, grads.pop("x"))
    assert_tree_close("linear with a NaN in dout", dparams, grads)
