"""Cross-entropy of logits against integer targets, mean over tokens, with its backward.

    loss = -(1/n) * sum over counted tokens t of log_softmax(logits[t])[targets[t]]

n counts the tokens whose target is not ``ignore_index``. Built on numpy_attn.softmax's
log-softmax, so it is stable for any finite logits. Backward: dlogits = (softmax - onehot) * dloss / n
on counted tokens, zero on ignored ones. Follows ``torch.nn.functional.cross_entropy`` with
reduction="mean".

Every token ignored: PyTorch divides 0 by 0 and returns NaN, which would poison an optimiser's
state for the rest of training. Here the sum over no tokens is divided by max(n, 1), so the loss
is 0 and every gradient is 0 (the same choice as softmax's all-masked rows, DESIGN.md section 6).
"""

import numpy as np

from numpy_attn._checks import check_dout, check_float, check_integer
from numpy_attn.softmax import log_softmax_backward, log_softmax_forward


def cross_entropy_forward(logits, targets, ignore_index=None):
    """Mean cross-entropy: logits (..., V), integer targets (...) -> loss, a 0-d array.

    Targets equal to ``ignore_index`` (if given) are left out of the sum and of the count.
    Returns ``(loss, cache)``; the cache is ``(targets, counted, n, log_softmax cache)`` with
    ignored targets replaced by 0, so that the backward can scatter without checking them again.
    """
    targets = _check_cross_entropy(logits, targets, ignore_index)
    counted = np.ones(targets.shape, bool) if ignore_index is None else targets != ignore_index
    targets = np.where(counted, targets, 0)                            # (...), ignored -> class 0
    n = max(int(counted.sum()), 1)                                     # all ignored: 0 / 1, not 0 / 0
    logp, logp_cache = log_softmax_forward(logits)                     # (..., V)
    picked = np.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]   # (..., V) -> (...)
    loss = -np.where(counted, picked, 0).sum() / logits.dtype.type(n)  # (...) -> ()
    loss = np.asarray(loss, dtype=logits.dtype)
    cache = (targets, counted, n, logp_cache)
    return loss, cache


def cross_entropy_backward(dloss, cache):
    """Gradient of the mean cross-entropy: dloss () -> dlogits (..., V).

    dloss is a 0-d array of the loss's dtype, or a Python or NumPy float scalar (the 1 of
    ``loss.backward()``), which is cast to the loss's dtype; anything else is refused.
    """
    targets, counted, n, logp_cache = cache
    p, _ = logp_cache
    dloss = np.asarray(dloss, p.dtype) if isinstance(dloss, float | np.floating) else dloss
    check_dout("cross_entropy_backward", dloss, (), p.dtype, name="dloss")
    # Undoes loss = -sum(picked over counted tokens) / n.
    dpicked = np.where(counted, -dloss / p.dtype.type(n), 0).astype(p.dtype)   # (...)
    # Undoes picked = logp[..., targets]: each token's gradient goes to its target's column.
    dlogp = np.zeros_like(p)                                                     # (..., V)
    np.put_along_axis(dlogp, targets[..., None], dpicked[..., None], axis=-1)
    # Undoes logp = log_softmax(logits).
    dlogits = log_softmax_backward(dlogp, logp_cache)                            # (..., V)
    return dlogits


def _check_cross_entropy(logits, targets, ignore_index):
    """Return ``targets`` as an integer array; raise unless it matches ``logits`` (..., V) and
    every counted target is a class in [0, V)."""
    check_float("logits", logits)
    if not np.all(logits < np.inf):    # checked here, so that the message names logits
        raise ValueError(f"logits of shape {logits.shape} hold NaN or +inf; only -inf (a class "
                         f"that cannot occur) is allowed")
    targets = np.asarray(targets)
    check_integer("targets", targets)
    if logits.ndim < 1 or targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets of shape {targets.shape} must match logits {logits.shape} "
                         f"without its last axis")
    V = logits.shape[-1]
    counted = np.ones(targets.shape, bool) if ignore_index is None else targets != ignore_index
    outside = counted & ((targets < 0) | (targets >= V))
    if outside.any():
        raise ValueError(f"target {targets[outside][0]} is out of range for V = {V} classes "
                         f"(ignore_index = {ignore_index})")
    return targets
