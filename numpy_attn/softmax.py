"""Softmax and log-softmax along one axis, with hand-written backward passes.

    softmax(x)_i     = exp(x_i - m) / sum_j exp(x_j - m),   m = max_j x_j
    log_softmax(x)_i = x_i - m - log(sum_j exp(x_j - m))

Subtracting the row maximum m changes nothing mathematically and keeps exp from overflowing
(logits of +-1e4 in float32, +-1e300 in float64). ``-inf`` entries are masked positions: they get
probability 0. A row that is entirely ``-inf`` has no valid entry; softmax returns zeros there and
log-softmax ``-inf`` (the log of those zeros), and both pass back zero gradient, where PyTorch
returns NaN (docs/design.md). Backward: dx = y * (dy - sum(dy * y)) for softmax,
dx = dy - softmax(x) * sum(dy) for log-softmax.
"""

import numpy as np

from numpy_attn._checks import check_axis, check_float


def _row_max(x, axis):
    """Row maximum, with 0 in place of -inf for rows that are entirely -inf.

    Without the swap, x - m would be -inf - (-inf) = NaN on such rows. ``initial`` lets an
    empty axis through (its softmax is empty, as in torch.softmax).
    """
    m = x.max(axis=axis, keepdims=True, initial=-np.inf)
    return np.where(np.isneginf(m), np.zeros_like(m), m)


def softmax_forward(x, axis=-1):
    """Softmax of ``x`` along ``axis``: (..., n) -> (..., n), rows sum to one (or are all zero).

    Returns ``(y, cache)``; the cache is ``(y, axis)``: the backward needs only the output.
    """
    axis = _check_softmax(x, axis)
    m = _row_max(x, axis)                          # (..., 1)
    e = np.exp(x - m)                              # (..., n), entries in [0, 1]
    s = e.sum(axis=axis, keepdims=True)            # (..., 1), >= 1 unless the row is all -inf
    y = e / np.where(s == 0, np.ones_like(s), s)   # all -inf row: 0 / 1 = 0, not 0 / 0 = NaN
    cache = (y, axis)
    return y, cache


def softmax_backward(dy, cache):
    """Gradient of softmax: dy (..., n) -> dx (..., n)."""
    y, axis = cache
    # Undoes y = e / s: the Jacobian diag(y) - y y^T applied to dy without forming it.
    dx = y * (dy - (dy * y).sum(axis=axis, keepdims=True))
    return dx


def log_softmax_forward(x, axis=-1):
    """Log-softmax of ``x`` along ``axis``: (..., n) -> (..., n).

    Returns ``(y, cache)``; the cache is ``(p, axis)`` with p = softmax(x), which the backward needs.
    """
    axis = _check_softmax(x, axis)
    m = _row_max(x, axis)                          # (..., 1)
    shifted = x - m                                # (..., n), max entry 0
    e = np.exp(shifted)                            # (..., n)
    s = e.sum(axis=axis, keepdims=True)            # (..., 1)
    empty = s == 0                                 # rows that are entirely -inf
    log_s = np.log(np.where(empty, np.ones_like(s), s))
    y = np.where(empty, -np.inf, shifted - log_s).astype(x.dtype, copy=False)
    p = e / np.where(empty, np.ones_like(s), s)    # softmax, zeros on all -inf rows
    cache = (p, axis)
    return y, cache


def log_softmax_backward(dy, cache):
    """Gradient of log-softmax: dy (..., n) -> dx (..., n)."""
    p, axis = cache
    # Undoes y = x - m - log(s): d/dx of log(s) is p, so dx = dy - p * sum(dy).
    dx = dy - p * dy.sum(axis=axis, keepdims=True)
    # An all -inf row has p = 0 and would pass dy straight through; no gradient flows there.
    empty = ~p.any(axis=axis, keepdims=True)
    dx = np.where(empty, np.zeros_like(dx), dx)
    return dx


def _check_softmax(x, axis):
    """Return ``axis`` made non-negative; raise unless x is a float array with ``axis`` in range
    and no NaN or +inf (they have no meaningful softmax; -inf means masked)."""
    check_float("x", x)
    axis = check_axis("x", x, axis)
    if not np.all(x < np.inf):
        raise ValueError(f"x of shape {x.shape} holds NaN or +inf; only -inf (masked) is allowed")
    return axis
