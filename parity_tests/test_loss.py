"""Parity tests for numpy_attn/loss.py and torch_attn/loss.py."""

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from numpy_attn.loss import REDUCTIONS, cross_entropy_backward, cross_entropy_forward
from parity_tests import strategies as S
from parity_tests.helpers import (
    FD_TOL,
    LOW_DTYPES,
    TOLERANCES,
    assert_close,
    assert_error_budget,
    autograd,
    numerical_grad,
    round_to,
    to_torch,
)
from torch_attn.loss import cross_entropy


@st.composite
def batches(draw, dtype=None, soft=None, options=True):
    """(logits, targets, options, dloss): logits with V classes on a drawn axis; targets either
    class indices (repeating, some set to ignore_index: None, PyTorch's -100, or a real class) of
    logits' shape without that axis, or probabilities of logits' shape; drawn keyword options
    (axis, reduction, label_smoothing, weight; only the defaults with ``options=False``), and dloss
    of the loss's shape."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    lead = draw(S.batch_shapes())
    V = draw(S.dim(1, 8))
    soft = draw(st.booleans()) if soft is None else soft
    axis = draw(st.integers(-len(lead) - 1, len(lead))) if options else -1
    at = axis % (len(lead) + 1)
    shape = lead[:at] + (V,) + lead[at:]
    logits = draw(S.arrays(dtype, shape, bound=10.0))
    kw = dict(axis=axis, reduction="mean", label_smoothing=0.0, weight=None)
    if options:
        kw["reduction"] = draw(st.sampled_from(REDUCTIONS))
        kw["label_smoothing"] = draw(st.sampled_from([0.0, 0.1, 1.0]) | st.floats(0, 1))
        # Class weights are 0 or in [1/16, 2]: a mean divides by the counted tokens' weight, and
        # weights that cancel, or a lone counted weight of 1e-184, would make that divisor nearly
        # 0 and the gradients as large as 1e182, where no fixed tolerance means anything.
        weights = st.just(0.0) | st.floats(1 / 16, 2.0, width=32 if dtype == np.float32 else 64)
        kw["weight"] = draw(st.none() | hnp.arrays(dtype, (V,), elements=weights))
    if soft:
        raw = np.abs(draw(S.arrays(dtype, shape, 1.0)))
        total = raw.sum(axis=at, keepdims=True)
        targets = np.where(total > 0, raw / np.where(total > 0, total, 1), 1 / V).astype(dtype)
        # PyTorch takes probabilities with any negative ignore_index (its default -100 among them)
        # and ignores it; so do we.
        kw["ignore_index"] = draw(st.sampled_from([None, -100]) | st.integers(-1000, -1))
    else:
        targets = draw(S.token_ids(V, lead))
        kw["ignore_index"] = draw(st.sampled_from([None, -100]) | st.integers(0, V - 1))
        if kw["ignore_index"] is not None:
            targets = np.where(draw(hnp.arrays(np.bool_, lead)), kw["ignore_index"], targets)
    dloss = draw(S.arrays(dtype, lead if kw["reduction"] == "none" else ()))
    return logits, targets, kw, dloss


def _twin(targets, kw):
    """The twin as a function of logits alone, for autograd (targets and weight are constants)."""
    weight = None if kw["weight"] is None else to_torch(kw["weight"])
    return lambda logits: cross_entropy(logits, to_torch(targets), **dict(kw, weight=weight))


def _builtin(targets, kw):
    """F.cross_entropy with the same options: the class axis moved to 1 (0 for logits (V,)); its
    ignore_index must be an int, and -100 (its default) never matches a real class."""
    weight = None if kw["weight"] is None else to_torch(kw["weight"])
    ignore = -100 if kw["ignore_index"] is None else kw["ignore_index"]

    def builtin(logits):
        logits = torch.movedim(logits, kw["axis"], min(1, logits.ndim - 1))
        targets_t = to_torch(targets)
        if targets_t.is_floating_point():
            targets_t = torch.movedim(targets_t, kw["axis"], min(1, logits.ndim - 1))
        return F.cross_entropy(logits, targets_t, weight, ignore_index=ignore,
                               reduction=kw["reduction"], label_smoothing=kw["label_smoothing"])

    return builtin


def _divisor(targets, kw, V):
    """The mean's divisor: the counted tokens' summed weight (class targets), the token count
    (probabilities)."""
    if np.issubdtype(targets.dtype, np.floating):
        return targets.size // V
    counted = targets != kw["ignore_index"] if kw["ignore_index"] is not None else np.ones(targets.shape, bool)
    weight = np.ones(V) if kw["weight"] is None else kw["weight"]
    return weight[np.where(counted, targets, 0)][counted].sum()


# Two tokens with the same target, one ignored, in a vocabulary of three.
REPEATED = (np.array([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0], [2.0, 2.0, 2.0]]), np.array([1, -100, 1]),
            dict(axis=-1, reduction="mean", label_smoothing=0.0, weight=None, ignore_index=-100),
            np.array(0.75))
# (N, V, d1) as F.cross_entropy takes it, weighted and smoothed, one token per position kept.
CLASS_AXIS_1 = (S.ramp(2, 3, 2) * 4, np.array([[0, 2], [1, -100]]),
                dict(axis=1, reduction="none", label_smoothing=0.2,
                     weight=np.array([0.5, 2.0, 1.0]), ignore_index=-100),
                S.ramp(2, 2) + 0.5)
# Probabilities on the last axis, one of them a one-hot row, summed.
SOFT = (S.ramp(2, 4) * 5, np.array([[0.25, 0.25, 0.5, 0.0], [0.0, 1.0, 0.0, 0.0]]),
        dict(axis=-1, reduction="sum", label_smoothing=0.1, weight=None, ignore_index=None),
        np.array(-1.25))


# A class that cannot occur (logit -inf) beside the targets, summed: its weight is 0 in q.
MINUS_INF = (np.array([[1.0, -np.inf, 0.5], [-np.inf, 3.0, -1.0]]), np.array([0, 1]),
             dict(axis=-1, reduction="sum", label_smoothing=0.0, weight=np.array([1.0, 0.0, 2.0]),
                  ignore_index=None), np.array(0.5))


# -- forward matches the twin -----------------------------------------------------------------

@given(case=batches())
@example(case=REPEATED)
@example(case=CLASS_AXIS_1)
@example(case=SOFT)
@example(case=MINUS_INF)
def test_forward_matches_twin(case):
    logits, targets, kw, dloss = case
    loss, _ = cross_entropy_forward(logits, targets, **kw)
    twin_loss, _ = autograd(_twin(targets, kw), {"logits": logits}, dloss)
    assert_close("cross_entropy.loss", loss, twin_loss)


# -- backward matches autograd ----------------------------------------------------------------

@pytest.mark.twin_parity
@given(case=batches())
@example(case=REPEATED)
@example(case=CLASS_AXIS_1)
@example(case=SOFT)
@example(case=MINUS_INF)
def test_backward_matches_autograd(case):
    logits, targets, kw, dloss = case
    _, cache = cross_entropy_forward(logits, targets, **kw)
    dlogits = cross_entropy_backward(dloss, cache)
    _, grads = autograd(_twin(targets, kw), {"logits": logits}, dloss)
    assert_close("cross_entropy.dlogits", dlogits, grads["logits"])


# -- the twin matches PyTorch's built-in --------------------------------------------------------

@given(case=batches())
@example(case=REPEATED)
@example(case=CLASS_AXIS_1)
@example(case=SOFT)
@example(case=MINUS_INF)
def test_twin_matches_builtin(case):
    """F.cross_entropy with the same reduction, label_smoothing, weight and targets, the class
    axis moved to where it expects it. A mean over zero weight: see the next test."""
    logits, targets, kw, dloss = case
    twin_loss, twin_grads = autograd(_twin(targets, kw), {"logits": logits}, dloss)
    builtin_loss, builtin_grads = autograd(_builtin(targets, kw), {"logits": logits}, dloss)
    if kw["reduction"] != "mean" or _divisor(targets, kw, logits.shape[kw["axis"]]) != 0:
        assert_close("cross_entropy.loss vs F.cross_entropy", twin_loss, builtin_loss)
        assert_close("cross_entropy.dlogits vs F.cross_entropy", twin_grads["logits"],
                     builtin_grads["logits"])
    else:
        assert np.isnan(builtin_loss), "F.cross_entropy over no weight was expected to be NaN"
        assert twin_loss == 0, f"cross-entropy over no weight is {twin_loss}, not 0"


@pytest.mark.parametrize("weight, smoothing", [(None, 0.0), (np.array([0.0, 0.0, 1.0]), 0.0),
                                               (np.array([0.0, 0.0, 1.0]), 0.1)])
def test_all_ignored_gives_zero_where_builtin_gives_nan(weight, smoothing):
    """Mean over zero tokens (or tokens of zero weight, even when smoothing gives the other
    classes weight): PyTorch divides by 0 and returns NaN; we return 0 and zero gradients, so a
    batch of padding cannot poison the optimiser (documented in both twins)."""
    logits = np.array([[1.0, 2.0, 3.0], [0.5, 0.5, -1.0]])
    targets = np.array([-100, -100]) if weight is None else np.array([0, 1])
    w_t = None if weight is None else to_torch(weight)
    assert torch.isnan(F.cross_entropy(to_torch(logits), to_torch(targets), w_t,
                                       label_smoothing=smoothing)), "built-in not NaN"
    loss, cache = cross_entropy_forward(logits, targets, ignore_index=-100, weight=weight,
                                        label_smoothing=smoothing)
    assert loss == 0, f"cross_entropy.loss over no tokens is {loss}"
    assert np.array_equal(cross_entropy_backward(np.array(1.5), cache), np.zeros_like(logits)), \
        "cross_entropy.dlogits over no tokens is not zero"
    twin = cross_entropy(to_torch(logits), to_torch(targets), ignore_index=-100, weight=w_t,
                         label_smoothing=smoothing)
    assert twin.item() == 0, f"twin cross_entropy over no tokens is {twin.item()}"


@pytest.mark.parametrize("ignore_index", [-100, -1, -7])
def test_probabilities_take_a_negative_ignore_index_as_builtin(ignore_index):
    """PyTorch's default ignore_index is -100, so F.cross_entropy(logits, probabilities) passes it
    with every call: a negative one matches no class, ignores nothing and is accepted; one >= 0
    is refused there (RuntimeError) and here (ValueError, tested in test_bad_input)."""
    logits, probs = S.ramp(2, 3) * 3, np.array([[0.2, 0.3, 0.5], [1.0, 0.0, 0.0]])
    builtin = F.cross_entropy(to_torch(logits), to_torch(probs), ignore_index=ignore_index).item()
    with pytest.raises(RuntimeError, match="ignore_index is not supported for floating point target"):
        F.cross_entropy(to_torch(logits), to_torch(probs), ignore_index=0)
    loss, _ = cross_entropy_forward(logits, probs, ignore_index=ignore_index)
    plain, _ = cross_entropy_forward(logits, probs)
    assert_close("cross_entropy.loss of probabilities with a negative ignore_index", loss, plain,
                 rtol=0, atol=0)
    assert_close("cross_entropy.loss of probabilities vs F.cross_entropy", loss, np.asarray(builtin))


def test_defaults_are_the_builtins():
    """Called with logits and targets alone, the loss is F.cross_entropy's with its defaults (a
    mean, no smoothing, no weight), for class targets and for probabilities."""
    logits = S.ramp(3, 4) * 3
    for targets in (np.array([0, 3, 1]), np.array([[0.1, 0.2, 0.3, 0.4]] * 3)):
        loss, _ = cross_entropy_forward(logits, targets)
        builtin = F.cross_entropy(to_torch(logits), to_torch(targets)).item()
        assert_close(f"cross_entropy.loss with defaults ({targets.dtype} targets)", loss, np.asarray(builtin))
        twin = cross_entropy(to_torch(logits), to_torch(targets)).item()
        assert_close(f"twin cross_entropy with defaults ({targets.dtype} targets)", np.asarray(twin),
                     np.asarray(builtin))


# -- properties ---------------------------------------------------------------------------------

@given(case=batches(soft=False, options=False), constant=st.floats(-10, 10))
def test_uniform_logits_give_log_V(case, constant):
    """Equal logits are a uniform prediction: every counted token costs log V."""
    logits, targets, kw, _ = case
    uniform = np.full_like(logits, constant)
    loss, _ = cross_entropy_forward(uniform, targets, **kw)
    counted = targets != kw["ignore_index"]
    expected = np.log(logits.shape[-1]) if counted.any() else 0.0
    assert_close("cross_entropy.loss of uniform logits", loss, np.asarray(expected, logits.dtype))


@given(case=batches())
def test_gradient_rows_sum_to_zero_and_ignored_rows_are_zero(case):
    """(sum(weight * q) * softmax - weight * q) sums to zero over V; ignored tokens contribute
    nothing; every token's loss is >= 0 (weights >= 0)."""
    logits, targets, kw, dloss = case
    loss, cache = cross_entropy_forward(logits, targets, **kw)
    dlogits = cross_entropy_backward(dloss, cache)
    assert np.all(loss >= 0), f"cross_entropy.loss {loss} is negative"
    assert_close("cross_entropy.dlogits row sums", dlogits.sum(axis=kw["axis"]),
                 np.zeros(dlogits.sum(axis=kw["axis"]).shape, logits.dtype),
                 atol=TOLERANCES[logits.dtype]["atol"] * max(1.0, float(np.abs(dlogits).max())))
    if kw["ignore_index"] is not None and not np.issubdtype(targets.dtype, np.floating):
        ignored = np.expand_dims(targets == kw["ignore_index"], kw["axis"])
        assert not (dlogits * ignored).any(), "an ignored token received a gradient"


@given(case=batches(soft=False))
def test_class_targets_equal_their_one_hot_probabilities(case):
    """Token by token (reduction="none"), a class index costs what its one-hot row of
    probabilities costs, with the same smoothing and weight; ignored tokens cost 0."""
    logits, targets, kw, _ = case
    V = logits.shape[kw["axis"]]
    kw = dict(kw, reduction="none")
    loss, _ = cross_entropy_forward(logits, targets, **kw)
    onehot = np.moveaxis(np.eye(V, dtype=logits.dtype)[targets % V], -1, kw["axis"])
    soft, _ = cross_entropy_forward(logits, onehot, **dict(kw, ignore_index=None))
    counted = np.ones(targets.shape, bool) if kw["ignore_index"] is None else targets != kw["ignore_index"]
    assert_close("cross_entropy.loss of class targets vs one-hot probabilities", loss,
                 np.where(counted, soft, 0).astype(logits.dtype))


@given(case=batches(options=False), s=st.floats(0, 1))
def test_label_smoothing_interpolates_towards_uniform_targets(case, s):
    """Summed, smoothing by s is (1 - s) times the plain loss plus s times the loss against the
    uniform distribution 1 / V (on the counted tokens)."""
    logits, targets, kw, _ = case
    kw = dict(kw, reduction="sum")
    plain, _ = cross_entropy_forward(logits, targets, **kw)
    smoothed, _ = cross_entropy_forward(logits, targets, **dict(kw, label_smoothing=s))
    uniform, _ = cross_entropy_forward(logits, targets, **dict(kw, label_smoothing=1.0))
    expected = ((1 - s) * plain.astype(np.float64) + s * uniform.astype(np.float64))
    # the sum of nonnegative terms of up to 2 * (20 + log V) each: atol relative to it
    tol = TOLERANCES[logits.dtype]
    assert_close("cross_entropy.loss smoothed vs interpolated", smoothed,
                 expected.astype(logits.dtype), rtol=tol["rtol"],
                 atol=tol["atol"] * max(1.0, float(uniform), float(plain)))


@given(case=batches())
def test_gradient_shares_no_memory(case):
    """dlogits is a fresh array (moved back to the class axis as a view of it): never logits,
    targets, dloss or an array of the cache."""
    logits, targets, kw, dloss = case
    _, cache = cross_entropy_forward(logits, targets, **kw)
    dlogits = cross_entropy_backward(dloss, cache)
    wq, p = cache[0], cache[4].y
    for name, a in (("logits", logits), ("targets", targets), ("dloss", dloss), ("cache wq", wq),
                    ("cache softmax", p)):
        assert not np.shares_memory(dlogits, a), f"cross_entropy.dlogits shares memory with {name}"


# -- finite differences (no torch) ----------------------------------------------------------------

@given(case=batches(dtype=np.float64))
@example(case=CLASS_AXIS_1)
@example(case=SOFT)
def test_backward_matches_finite_differences(case):
    logits, targets, kw, dloss = case
    _, cache = cross_entropy_forward(logits, targets, **kw)
    dlogits = cross_entropy_backward(dloss, cache)
    expected = numerical_grad(lambda z: cross_entropy_forward(z, targets, **kw)[0],
                              logits.copy(), dloss)
    assert_close("cross_entropy.dlogits vs finite differences", dlogits, expected, **FD_TOL)


# -- float16 and bfloat16: FlashAttention's error rule -------------------------------------------

LOW_TYPES = tuple(d.type for d, _ in LOW_DTYPES.values())


@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@given(case=batches(dtype=np.float64))
@example(case=REPEATED)
@example(case=CLASS_AXIS_1)
@example(case=SOFT)
def test_low_precision_meets_the_error_budget(dtype, case):
    """Ours and the twin against float64 truth, within twice the error of PyTorch's own
    low-precision F.cross_entropy (whose mean sums in the low dtype), for the loss and dlogits,
    every reduction, smoothing, weight and target kind drawn. A mean over zero weight is NaN in
    PyTorch and 0 here (test_all_ignored_gives_zero_where_builtin_gives_nan): no truth to hold to."""
    logits, targets, kw, dloss = case
    assume(kw["reduction"] != "mean" or _divisor(targets, kw, logits.shape[kw["axis"]]) != 0)
    # Every float input rounded, weight and probabilities included: every side sees the same.
    logits, dloss = round_to(logits, dtype), round_to(dloss, dtype)
    targets = round_to(targets, dtype) if np.issubdtype(targets.dtype, np.floating) else targets
    kw = dict(kw, weight=None if kw["weight"] is None else round_to(kw["weight"], dtype))
    loss, cache = cross_entropy_forward(logits, targets, **kw)
    dlogits = cross_entropy_backward(dloss, cache)
    twin_loss, twin_grads = autograd(_twin(targets, kw), {"logits": logits}, dloss)
    torch_loss, torch_grads = autograd(_builtin(targets, kw), {"logits": logits}, dloss)
    wide = lambda a: a if a is None or a.dtype.kind in "iu" else a.astype(np.float64)  # noqa: E731
    kw64 = dict(kw, weight=wide(kw["weight"]))
    truth_loss, truth_grads = autograd(_builtin(wide(targets), kw64), {"logits": wide(logits)}, wide(dloss))
    for who, (o, g) in {"numpy": (loss, dlogits), "twin": (twin_loss, twin_grads["logits"])}.items():
        assert_error_budget(f"cross_entropy[{who}]", dtype, {
            "loss": (o, torch_loss, truth_loss), "dlogits": (g, torch_grads["logits"], truth_grads["logits"])})


@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_low_precision_mix_is_refused(dtype):
    """Low-precision logits with float32 weight or probabilities (and the reverse) are refused,
    naming both dtypes, as a float32/float64 mix is; so is a float32 dloss for a low loss."""
    low = LOW_DTYPES[dtype][0]
    logits = np.zeros((2, 3), low)
    with pytest.raises(TypeError, match=f"^arrays must share one dtype: logits is {dtype}, weight is float32$"):
        cross_entropy_forward(logits, np.array([0, 1]), weight=np.ones(3, np.float32))
    with pytest.raises(TypeError, match=f"^arrays must share one dtype: logits is {dtype}, targets is float32$"):
        cross_entropy_forward(logits, np.full((2, 3), 1 / 3, np.float32))
    with pytest.raises(TypeError, match=f"^arrays must share one dtype: logits is float32, targets is {dtype}$"):
        cross_entropy_forward(logits.astype(np.float32), np.full((2, 3), 1 / 3, low))
    _, cache = cross_entropy_forward(logits, np.array([0, 1]))
    with pytest.raises(TypeError, match=f"dloss must have the dtype of the forward's output, {dtype}, got float32"):
        cross_entropy_backward(np.array(1.0, np.float32), cache)


# -- dtype preservation -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES + LOW_TYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_dtype_is_preserved(dtype, reduction):
    logits = np.array([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0]], dtype=dtype)
    weight = np.array([1.0, 0.5, 2.0], dtype)
    loss, cache = cross_entropy_forward(logits, np.array([2, 0], dtype=np.int32),
                                        reduction=reduction, label_smoothing=0.1, weight=weight)
    dlogits = cross_entropy_backward(np.full(loss.shape, 0.5, dtype), cache)
    assert loss.dtype == dtype, f"cross_entropy.loss dtype {loss.dtype}"
    assert dlogits.dtype == dtype, f"cross_entropy.dlogits dtype {dlogits.dtype}"
    if reduction != "none":
        # A dloss given as a NumPy float64 scalar must not upcast float32.
        dlogits = cross_entropy_backward(np.float64(0.5), cache)
    assert dlogits.dtype == dtype, f"cross_entropy.dlogits dtype {dlogits.dtype}"


# -- bad input --------------------------------------------------------------------------------------

def test_bad_input():
    logits = np.zeros((2, 5))
    with pytest.raises(ValueError, match=r"target 5 is out of range for V = 5 classes \(ignore_index = None\)"):
        cross_entropy_forward(logits, np.array([0, 5]))
    with pytest.raises(ValueError, match=r"^target -1 is out of range for V = 5 classes \(ignore_index = None\)$"):
        cross_entropy_forward(logits, np.array([-1, 2]))
    with pytest.raises(ValueError, match="target -100 is out of range for V = 5 classes \\(ignore_index = -1\\)"):
        cross_entropy_forward(logits, np.array([-100, -1]), ignore_index=-1)
    with pytest.raises(ValueError, match=r"^targets of shape \(3,\) must match logits \(2, 5\) without its "
                                         r"class axis 1: \(2,\)$"):
        cross_entropy_forward(logits, np.array([0, 1, 2]))
    with pytest.raises(ValueError, match=r"targets of shape \(2,\) must match logits \(2, 5\) "
                                         r"without its class axis 0: \(5,\)"):
        cross_entropy_forward(logits, np.array([0, 1]), axis=0)
    with pytest.raises(TypeError, match="targets must be integers, got dtype bool"):
        cross_entropy_forward(logits, np.array([True, False]))
    with pytest.raises(TypeError, match="targets must be a NumPy array, got list"):
        cross_entropy_forward(logits, [0, 1])
    with pytest.raises(TypeError, match="logits must be float16, bfloat16, float32 or float64, got dtype int64"):
        cross_entropy_forward(np.zeros((2, 5), dtype=np.int64), np.array([0, 1]))
    with pytest.raises(TypeError, match="logits must be a NumPy array, got list"):
        cross_entropy_forward([[0.0, 1.0]], np.array([0]))
    with pytest.raises(ValueError, match=r"logits must have a class axis \(\.\.\., V\), got a 0-d array"):
        cross_entropy_forward(np.array(1.0), np.array(0))
    # probability targets
    with pytest.raises(ValueError, match=r"probability targets of shape \(2,\) must have logits' shape \(2, 5\)"):
        cross_entropy_forward(logits, np.array([0.0, 1.0]))
    with pytest.raises(TypeError, match="logits is float64, targets is float32"):
        cross_entropy_forward(logits, np.zeros((2, 5), np.float32))
    for ignore_index in (0, 4, 7):    # PyTorch refuses an ignore_index >= 0 with probabilities
        with pytest.raises(ValueError, match=f"ignore_index = {ignore_index} applies to class targets only"):
            cross_entropy_forward(logits, np.zeros((2, 5)), ignore_index=ignore_index)
    for ignore_index in (1.0, True, "-100"):
        with pytest.raises(TypeError, match=f"ignore_index must be an integer or None, got "
                                            f"{type(ignore_index).__name__}"):
            cross_entropy_forward(logits, np.array([0, 1]), ignore_index=ignore_index)
    # options
    with pytest.raises(ValueError, match="reduction must be one of \\('none', 'mean', 'sum'\\), got 'avg'"):
        cross_entropy_forward(logits, np.array([0, 1]), reduction="avg")
    for s in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match=f"label_smoothing must lie in \\[0, 1\\], got {s}"):
            cross_entropy_forward(logits, np.array([0, 1]), label_smoothing=s)
    for shape in ((4,), (6,), (5, 1)):     # one per class: fewer, more, or another layout
        with pytest.raises(ValueError, match=rf"weight of shape {re.escape(str(shape))} must have shape \(5,\)"):
            cross_entropy_forward(logits, np.array([0, 1]), weight=np.ones(shape))
    with pytest.raises(TypeError, match="logits is float64, weight is float32"):
        cross_entropy_forward(logits, np.array([0, 1]), weight=np.ones(5, np.float32))
    with pytest.raises(TypeError, match="weight must be a NumPy array, got list"):
        cross_entropy_forward(logits, np.array([0, 1]), weight=[1.0] * 5)
    with pytest.raises(ValueError, match=r"axis 2 is out of range for logits of shape \(2, 5\)"):
        cross_entropy_forward(logits, np.array([0, 1]), axis=2)
    with pytest.raises(TypeError, match="axis must be an integer, got float"):
        cross_entropy_forward(logits, np.array([0, 1]), axis=1.0)
    # the backward's dloss: the loss's shape and dtype
    _, cache = cross_entropy_forward(logits, np.array([0, 1]), reduction="none")
    with pytest.raises(ValueError, match=r"cross_entropy_backward: dloss must have the shape .* \(2,\), got \(\)"):
        cross_entropy_backward(np.array(1.0), cache)
    with pytest.raises(TypeError, match="cross_entropy_backward: dloss must have the dtype .* float64, got float32"):
        cross_entropy_backward(np.ones(2, np.float32), cache)
    with pytest.raises(TypeError, match=r"^cross_entropy_backward: dloss must be a NumPy array of shape \(2,\) "
                                        r"and dtype float64, got list$"):
        cross_entropy_backward([1.0, 1.0], cache)
    with pytest.raises(ValueError, match=r"cross_entropy_backward: dloss must have the shape .* \(2,\), got \(\)"):
        cross_entropy_backward(1.0, cache)
    with pytest.raises(ValueError, match=r"logits of shape \(2, 5\) hold NaN or \+inf"):
        cross_entropy_forward(np.where(np.eye(2, 5, dtype=bool), np.nan, logits), np.array([0, 1]))


@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES + LOW_TYPES)
def test_loss_is_a_zero_d_array(dtype):
    """The loss is a 0-d NumPy array of the logits' dtype (not a NumPy scalar, not a Python float),
    with or without ignored tokens, so that loss.dtype, loss.shape and in-place use behave as for
    every other output."""
    logits = np.array([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0]], dtype=dtype)
    for targets, ignore_index in ((np.array([2, 0]), None), (np.array([-100, -100]), -100)):
        loss, _ = cross_entropy_forward(logits, targets, ignore_index)
        assert type(loss) is np.ndarray and loss.shape == () and loss.dtype == dtype, \
            f"cross_entropy.loss is {type(loss).__name__} {np.shape(loss)} {loss.dtype}"
