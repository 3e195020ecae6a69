"""Cross-entropy of logits against class targets or class probabilities, with its backward.

    q[t]    = onehot(targets[t])  or the given probabilities,  then (1 - s) * q[t] + s / V
    loss[t] = -sum over classes c of weight[c] * q[t, c] * log_softmax(logits[t])[c]

s is ``label_smoothing``, weight the per-class ``weight`` (ones if not given). Tokens whose target
is ``ignore_index`` get q = 0, so they cost nothing. reduction="none" returns loss[t];
"sum" their sum; "mean" divides the sum by n, the summed weight[targets[t]] of the counted tokens
for class targets (their count without weights), the number of tokens for probabilities. Built on
numpy_attn.softmax's log-softmax, so it is stable for any finite logits. Backward:
dlogits[t] = (sum(weight * q[t]) * softmax(logits[t]) - weight * q[t]) * dloss / n. Follows
``torch.nn.functional.cross_entropy``, class axis included: ``axis=1`` takes its (N, V, d1, ...).

Where we differ. A mean over nothing (every token ignored, or n = 0 otherwise): PyTorch divides by
0 and returns NaN, which would poison an optimiser's state for the rest of training. Here the sum
is divided by inf instead, so the loss is 0 and every gradient is 0 (the same choice as softmax's
all-masked rows). With probability targets a negative ``ignore_index`` (PyTorch's default -100
included) matches no class and changes nothing, and one >= 0 is refused, both as in PyTorch.
A logit of -inf (a class that cannot occur) costs nothing where its target weight is 0.

float16 and bfloat16: logits, weight and probability targets are cast up and everything runs in
float32 (the log-softmax as PyTorch's kernel runs it, and the sum and mean over the tokens too),
the loss and dlogits rounded once to logits' dtype. PyTorch's nll_loss sums the tokens' losses in
the low dtype instead (docs/precision.md); the float32 sum is more accurate, by a margin that
grows with the number of tokens.
"""

import numpy as np

from numpy_attn._checks import (
    FLOAT_DTYPES,
    check_axis,
    check_dout,
    check_float,
    check_integer,
    check_same_dtype,
    upcast,
)
from numpy_attn.softmax import log_softmax_backward, log_softmax_forward

REDUCTIONS = ("none", "mean", "sum")


def cross_entropy_forward(logits, targets, ignore_index=None, reduction="mean", label_smoothing=0.0,
                          weight=None, axis=-1):
    """Cross-entropy: logits (..., V), targets (...) of class indices or (..., V) of class
    probabilities, weight (V,) or None -> loss, 0-d (or (...) for reduction="none").

    ``axis`` is the class axis of logits (and of probability targets); the math below runs with it
    last. Returns ``(loss, cache)``; the cache is ``(weight * q, n, reduction, axis, log_softmax
    cache, logits' dtype)``: the backward needs the weighted targets, the divisor and where the
    classes were, all in the dtype computed in (float32 for float16 and bfloat16 logits).
    """
    targets, weight, soft = _check_cross_entropy(logits, targets, ignore_index, reduction,
                                                 label_smoothing, weight, axis)
    dtype = logits.dtype                                               # the loss's and dlogits'
    logits = upcast(np.moveaxis(logits, axis, -1))                     # class axis last: (..., V)
    weight = upcast(weight)                                            # float32 for the low dtypes
    V = logits.shape[-1]
    if soft:                                                           # probabilities: (..., V)
        q = upcast(np.moveaxis(targets, axis, -1))                     # class axis last: (..., V)
        counted = np.ones(q.shape[:-1], bool)                          # (...)
        n = q[..., 0].size                                             # the number of tokens
    else:                                                              # class indices: (...)
        counted = np.ones(targets.shape, bool) if ignore_index is None else targets != ignore_index
        targets = np.where(counted, targets, 0)                        # (...), ignored -> class 0
        q = (targets[..., None] == np.arange(V)).astype(logits.dtype)  # (...) -> (..., V) one-hot
        n = weight[targets][counted].sum()                             # weight of the counted tokens
    q = (1 - label_smoothing) * q + label_smoothing / V                # (..., V), smoothed
    q = np.where(counted[..., None], q, 0).astype(logits.dtype)        # ignored tokens cost nothing
    wq = weight * q                                                    # (..., V)
    logp, logp_cache = log_softmax_forward(logits)                     # (..., V)
    terms = wq * np.where(wq == 0, 0, logp)                            # a -inf logit of weight 0: 0, not NaN
    loss = -terms.sum(axis=-1)                                         # (..., V) -> (...)
    n = 1 if reduction != "mean" else n if n != 0 else np.inf          # n = 0: 0 / inf, not 0 / 0
    if reduction != "none":
        loss = loss.sum() / logits.dtype.type(n)                       # (...) -> ()
    loss = np.asarray(loss, dtype=logits.dtype).astype(dtype, copy=False)   # rounded once
    cache = (wq, n, reduction, axis, logp_cache, dtype)
    return loss, cache


def cross_entropy_backward(dloss, cache):
    """Gradient of the cross-entropy: dloss () (or (...) for reduction="none") -> dlogits, the
    shape of the forward's logits.

    dloss is an array of the loss's shape and dtype or, for a 0-d loss, a Python or NumPy float
    scalar (the 1 of ``loss.backward()``), which is cast to the loss's dtype.
    """
    wq, n, reduction, axis, logp_cache, dtype = cache
    p = logp_cache.y                                                   # softmax(logits), computed in
    dloss = np.asarray(dloss, dtype) if isinstance(dloss, float | np.floating) else dloss
    check_dout("cross_entropy_backward", dloss, wq.shape[:-1] if reduction == "none" else (),
               dtype, name="dloss")
    # Undoes loss = sum(loss) / n (mean), sum(loss) (sum, n = 1) or nothing (none): every token
    # receives dloss / n.
    dtok = (upcast(dloss) / p.dtype.type(n))[..., None]                # () or (...) -> (..., 1)
    # Undoes loss = -sum(weight * q * logp) (terms of weight 0 had no gradient).
    dlogp = -wq * dtok                                                 # (..., V)
    # Undoes logp = log_softmax(logits).
    dlogits = log_softmax_backward(dlogp, logp_cache)                  # (..., V)
    dlogits = np.moveaxis(dlogits, -1, axis)                           # class axis back in place
    return dlogits.astype(dtype, copy=False)                           # rounded once to logits' dtype


def _check_cross_entropy(logits, targets, ignore_index, reduction, label_smoothing, weight, axis):
    """Return ``(targets, weight, soft)``: targets as an array, weight as a (V,) array (ones if
    None), soft True for probability targets. Raise unless targets are integers of logits' shape
    without the class axis, every counted one a class in [0, V), or floats of logits' shape and
    dtype; and unless the options are valid."""
    check_float("logits", logits)
    if logits.ndim < 1:
        raise ValueError(f"logits must have a class axis (..., V), got a 0-d array of shape {logits.shape}")
    if not isinstance(axis, int | np.integer):
        raise TypeError(f"axis must be an integer, got {type(axis).__name__}")
    axis = check_axis("logits", logits, axis)
    V = logits.shape[axis]
    if not np.all(logits < np.inf):    # checked here, so that the message names logits
        raise ValueError(f"logits of shape {logits.shape} hold NaN or +inf; only -inf (a class "
                         f"that cannot occur) is allowed")
    if ignore_index is not None and (isinstance(ignore_index, bool)
                                     or not isinstance(ignore_index, int | np.integer)):
        raise TypeError(f"ignore_index must be an integer or None, got "
                        f"{type(ignore_index).__name__} {ignore_index!r}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if not 0 <= label_smoothing <= 1:
        raise ValueError(f"label_smoothing must lie in [0, 1], got {label_smoothing}")
    if weight is None:
        weight = np.ones(V, logits.dtype)
    check_float("weight", weight)
    if weight.shape != (V,):
        raise ValueError(f"weight of shape {weight.shape} must have shape ({V},), one per class "
                         f"of logits {logits.shape} (class axis {axis})")
    check_same_dtype(logits=logits, weight=weight)
    if not isinstance(targets, np.ndarray):
        raise TypeError(f"targets must be a NumPy array, got {type(targets).__name__}")
    if targets.dtype.name in FLOAT_DTYPES:
        check_same_dtype(logits=logits, targets=targets)
        if targets.shape != logits.shape:
            raise ValueError(f"probability targets of shape {targets.shape} must have logits' "
                             f"shape {logits.shape}")
        if ignore_index is not None and ignore_index >= 0:     # a negative one matches no class
            raise ValueError(f"ignore_index = {ignore_index} applies to class targets only, not to "
                             f"probabilities (a negative one, such as PyTorch's default -100, is "
                             f"accepted and ignores nothing)")
        return targets, weight, True
    check_integer("targets", targets)
    class_shape = logits.shape[:axis] + logits.shape[axis + 1:]
    if targets.shape != class_shape:
        raise ValueError(f"targets of shape {targets.shape} must match logits {logits.shape} "
                         f"without its class axis {axis}: {class_shape}")
    counted = np.ones(targets.shape, bool) if ignore_index is None else targets != ignore_index
    outside = counted & ((targets < 0) | (targets >= V))
    if outside.any():
        raise ValueError(f"target {targets[outside][0]} is out of range for V = {V} classes "
                         f"(ignore_index = {ignore_index})")
    return targets, weight, False
