"""Parity tests for numpy_attn/loss.py and torch_attn/loss.py."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from numpy_attn.loss import cross_entropy_backward, cross_entropy_forward
from parity_tests import strategies as S
from parity_tests.helpers import FD_TOL, assert_close, autograd, numerical_grad, to_torch
from torch_attn.loss import cross_entropy


@st.composite
def batches(draw, dtype=None):
    """(logits, targets, ignore_index, dloss): logits (..., V), repeating targets (...), some of
    them set to ignore_index (None, PyTorch's -100, or a real class), and a drawn scalar dloss."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    lead = draw(S.batch_shapes())
    V = draw(S.dim(1, 8))
    logits = draw(S.arrays(dtype, lead + (V,), bound=10.0))
    targets = draw(S.token_ids(V, lead))
    ignore_index = draw(st.sampled_from([None, -100]) | st.integers(0, V - 1))
    if ignore_index is not None:
        targets = np.where(draw(hnp.arrays(np.bool_, lead)), ignore_index, targets)
    return logits, targets, ignore_index, draw(S.arrays(dtype, ()))


def _twin(targets, ignore_index):
    """The twin as a function of logits alone, for autograd (targets are not differentiable)."""
    return lambda logits: cross_entropy(logits, to_torch(targets), ignore_index)


# Two tokens with the same target, one ignored, in a vocabulary of three.
REPEATED = (np.array([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0], [2.0, 2.0, 2.0]]), np.array([1, -100, 1]),
            -100, np.array(0.75))


# -- forward matches the twin -----------------------------------------------------------------

@given(case=batches())
@example(case=REPEATED)
def test_forward_matches_twin(case):
    logits, targets, ignore_index, dloss = case
    loss, _ = cross_entropy_forward(logits, targets, ignore_index)
    twin_loss, _ = autograd(_twin(targets, ignore_index), {"logits": logits}, dloss)
    assert_close("cross_entropy.loss", loss, twin_loss)


# -- backward matches autograd ----------------------------------------------------------------

@given(case=batches())
@example(case=REPEATED)
def test_backward_matches_autograd(case):
    logits, targets, ignore_index, dloss = case
    _, cache = cross_entropy_forward(logits, targets, ignore_index)
    dlogits = cross_entropy_backward(dloss, cache)
    _, grads = autograd(_twin(targets, ignore_index), {"logits": logits}, dloss)
    assert_close("cross_entropy.dlogits", dlogits, grads["logits"])


# -- the twin matches PyTorch's built-in --------------------------------------------------------

@given(case=batches())
@example(case=REPEATED)
def test_twin_matches_builtin(case):
    """F.cross_entropy on the tokens flattened to (N, V); its ignore_index must be an int, and
    -100 (its default) never matches a real class. All ignored: see the next test."""
    logits, targets, ignore_index, dloss = case
    V = logits.shape[-1]
    builtin_ignore = -100 if ignore_index is None else ignore_index

    def builtin(logits):
        return F.cross_entropy(logits.reshape(-1, V), to_torch(targets).reshape(-1),
                               ignore_index=builtin_ignore)

    twin_loss, twin_grads = autograd(_twin(targets, ignore_index), {"logits": logits}, dloss)
    builtin_loss, builtin_grads = autograd(builtin, {"logits": logits}, dloss)
    if (targets != builtin_ignore).any():
        assert_close("cross_entropy.loss vs F.cross_entropy", twin_loss, builtin_loss)
        assert_close("cross_entropy.dlogits vs F.cross_entropy", twin_grads["logits"],
                     builtin_grads["logits"])
    else:
        assert np.isnan(builtin_loss), "F.cross_entropy over no tokens was expected to be NaN"
        assert twin_loss == 0, f"cross-entropy over no tokens is {twin_loss}, not 0"


def test_all_ignored_gives_zero_where_builtin_gives_nan():
    """Mean over zero tokens: PyTorch computes 0 / 0 = NaN; we return 0 and zero gradients, so
    a batch of padding cannot poison the optimiser (documented in both twins)."""
    logits = np.array([[1.0, 2.0, 3.0], [0.5, 0.5, -1.0]])
    targets = np.array([-100, -100])
    assert torch.isnan(F.cross_entropy(to_torch(logits), to_torch(targets))), "built-in not NaN"
    loss, cache = cross_entropy_forward(logits, targets, ignore_index=-100)
    assert loss == 0, f"cross_entropy.loss over no tokens is {loss}"
    assert np.array_equal(cross_entropy_backward(np.array(1.5), cache), np.zeros_like(logits)), \
        "cross_entropy.dlogits over no tokens is not zero"
    twin = cross_entropy(to_torch(logits), to_torch(targets), ignore_index=-100)
    assert twin.item() == 0, f"twin cross_entropy over no tokens is {twin.item()}"


# -- properties ---------------------------------------------------------------------------------

@given(case=batches(), constant=st.floats(-10, 10))
def test_uniform_logits_give_log_V(case, constant):
    """Equal logits are a uniform prediction: every counted token costs log V."""
    logits, targets, ignore_index, _ = case
    uniform = np.full_like(logits, constant)
    loss, _ = cross_entropy_forward(uniform, targets, ignore_index)
    counted = targets != ignore_index
    expected = np.log(logits.shape[-1]) if counted.any() else 0.0
    assert_close("cross_entropy.loss of uniform logits", loss, np.asarray(expected, logits.dtype))


@given(case=batches())
def test_gradient_rows_sum_to_zero_and_ignored_rows_are_zero(case):
    """softmax - onehot sums to zero over V; ignored tokens contribute nothing."""
    logits, targets, ignore_index, dloss = case
    loss, cache = cross_entropy_forward(logits, targets, ignore_index)
    dlogits = cross_entropy_backward(dloss, cache)
    assert loss >= 0, f"cross_entropy.loss {loss} is negative"
    assert_close("cross_entropy.dlogits row sums", dlogits.sum(axis=-1),
                 np.zeros(targets.shape, logits.dtype))
    ignored = targets == ignore_index
    assert not dlogits[ignored].any(), "an ignored token received a gradient"


# -- finite differences (no torch) ----------------------------------------------------------------

@given(case=batches(dtype=np.float64))
def test_backward_matches_finite_differences(case):
    logits, targets, ignore_index, dloss = case
    _, cache = cross_entropy_forward(logits, targets, ignore_index)
    dlogits = cross_entropy_backward(dloss, cache)
    expected = numerical_grad(lambda z: cross_entropy_forward(z, targets, ignore_index)[0],
                              logits.copy(), dloss)
    assert_close("cross_entropy.dlogits vs finite differences", dlogits, expected, **FD_TOL)


# -- dtype preservation -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
def test_dtype_is_preserved(dtype):
    logits = np.array([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0]], dtype=dtype)
    loss, cache = cross_entropy_forward(logits, np.array([2, 0], dtype=np.int32))
    # A dloss given as a NumPy float64 must not upcast float32.
    dlogits = cross_entropy_backward(np.float64(0.5), cache)
    assert loss.dtype == dtype, f"cross_entropy.loss dtype {loss.dtype}"
    assert dlogits.dtype == dtype, f"cross_entropy.dlogits dtype {dlogits.dtype}"


# -- bad input --------------------------------------------------------------------------------------

def test_bad_input():
    logits = np.zeros((2, 5))
    with pytest.raises(ValueError, match=r"target 5 is out of range for V = 5 classes \(ignore_index = None\)"):
        cross_entropy_forward(logits, np.array([0, 5]))
    with pytest.raises(ValueError, match="target -1 is out of range for V = 5"):
        cross_entropy_forward(logits, np.array([-1, 2]))
    with pytest.raises(ValueError, match="target -100 is out of range for V = 5 classes \\(ignore_index = -1\\)"):
        cross_entropy_forward(logits, np.array([-100, -1]), ignore_index=-1)
    with pytest.raises(ValueError, match=r"targets of shape \(3,\) must match logits \(2, 5\)"):
        cross_entropy_forward(logits, np.array([0, 1, 2]))
    with pytest.raises(TypeError, match="targets must be integers, got dtype float64"):
        cross_entropy_forward(logits, np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"logits of shape \(2, 5\) hold NaN or \+inf"):
        cross_entropy_forward(np.where(np.eye(2, 5, dtype=bool), np.nan, logits), np.array([0, 1]))
    with pytest.raises(TypeError, match="logits must be float32 or float64, got dtype int64"):
        cross_entropy_forward(np.zeros((2, 5), dtype=np.int64), np.array([0, 1]))


@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
def test_loss_is_a_zero_d_array(dtype):
    """The loss is a 0-d NumPy array of the logits' dtype (not a NumPy scalar, not a Python float),
    with or without ignored tokens, so that loss.dtype, loss.shape and in-place use behave as for
    every other output."""
    logits = np.array([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0]], dtype=dtype)
    for targets, ignore_index in ((np.array([2, 0]), None), (np.array([-100, -100]), -100)):
        loss, _ = cross_entropy_forward(logits, targets, ignore_index)
        assert type(loss) is np.ndarray and loss.shape == () and loss.dtype == dtype, \
            f"cross_entropy.loss is {type(loss).__name__} {np.shape(loss)} {loss.dtype}"
