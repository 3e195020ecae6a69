"""Softmax and log-softmax along one axis, with hand-written backward passes.

    softmax(x)_i     = exp(x_i - m) / sum_j exp(x_j - m),   m = max_j x_j
    log_softmax(x)_i = x_i - m - log(sum_j exp(x_j - m))

Subtracting the row maximum m changes nothing mathematically and keeps exp from overflowing
(logits of +-1e4 in float32, +-1e300 in float64). ``-inf`` entries are masked positions: they get
probability 0. A row that is entirely ``-inf`` has no valid entry; softmax returns zeros there and
log-softmax ``-inf`` (the log of those zeros), and both pass back zero gradient, where PyTorch
returns NaN (docs/design.md). Backward: dx = y * (dy - sum(dy * y)) for softmax,
dx = dy - softmax(x) * sum(dy) for log-softmax.

As ``torch.softmax``: ``dtype`` (float16, bfloat16, float32 or float64) casts x first, so the
output has that dtype (integer and bool x are accepted then) and the gradient, computed for that
dtype, comes back in x's dtype; a 0-d x is one row of one entry along axis 0 or -1 (softmax 1,
log-softmax 0).

float16 and bfloat16: the max, exp, sum, log and division run in float32 and the output is rounded
once, as PyTorch's softmax kernels compute in float32 (docs/precision.md). softmax's backward
reads the rounded output it handed out, as PyTorch's does (attention's (T, S) weights are that
output: a float32 copy would triple their memory), and computes in float32, rounded once.
log_softmax keeps its softmax p in float32: it is no output (nothing to share), and the loss, which
runs it on float32 logits, needs p in float32 anyway.
"""

from typing import NamedTuple

import numpy as np

from numpy_attn._checks import FLOAT_DTYPES, check_axis, check_dout, check_float, upcast


class SoftmaxCache(NamedTuple):
    y: np.ndarray           # (..., n) softmax's output, for its backward; log_softmax's p = softmax(x)
                            # in the dtype it computed in (float32 for the low dtypes)
    axis: int | None        # the axis normalised over (None for a 0-d x)
    x_dtype: np.dtype       # x's dtype: the gradient goes back in it (dtype= may have cast x)
    y_dtype: np.dtype       # the output's dtype (dy's): x's after dtype='s cast


def _row_max(x, axis):
    """Row maximum, with 0 in place of -inf for rows that are entirely -inf; raise if x holds NaN
    or +inf (they have no meaningful softmax; -inf means masked).

    The check reads the (..., 1) maxima instead of making a pass over x of its own: np.max
    propagates NaN (a row holding one has the maximum NaN) and a row holding +inf has the maximum
    +inf, so a row holds NaN or +inf exactly when its maximum is not below +inf.
    Without the swap, x - m would be -inf - (-inf) = NaN on such rows. ``initial`` lets an
    empty axis through (its softmax is empty, as in torch.softmax).
    """
    m = x.max(axis=axis, keepdims=True, initial=-np.inf)
    if not np.all(m < np.inf):
        raise ValueError(f"x of shape {x.shape} holds NaN or +inf; only -inf (masked) is allowed")
    return np.where(np.isneginf(m), np.zeros_like(m), m)


# Logits spanning more than the float range (x = -max, m = +max) make x - m overflow to -inf,
# whose exp is the 0 it should be: that overflow is the right answer, not an error to report.
@np.errstate(over="ignore")
def softmax_forward(x, axis=-1, dtype=None):
    """Softmax of ``x`` along ``axis``: (..., n) -> (..., n), rows sum to one (or are all zero).

    Returns ``(y, cache)``; the cache is a SoftmaxCache ``(y, axis, x's dtype, y's dtype)``: the backward
    needs only the output. y is read-only, so that changing it in place is an error instead of a change
    to the gradient.
    """
    x, axis, x_dtype = _check_softmax(x, axis, dtype)   # x cast to dtype; axis None for a 0-d x
    y_dtype = x.dtype                              # the output's dtype: x's after dtype='s cast
    x = upcast(x)                                  # (..., n) float32 for float16 and bfloat16
    m = _row_max(x, axis)                          # (..., 1); raises on NaN or +inf
    e = np.exp(x - m)                              # (..., n), entries in [0, 1]
    s = e.sum(axis=axis, keepdims=True)            # (..., 1), >= 1 unless the row is all -inf
    y = e / np.where(s == 0, np.ones_like(s), s)   # all -inf row: 0 / 1 = 0, not 0 / 0 = NaN
    y = np.asarray(y).astype(y_dtype, copy=False)  # rounded once; a 0-d x gives a 0-d array, not a scalar
    y.flags.writeable = False                      # handed to the caller and cached: read-only, not copied
    cache = SoftmaxCache(y, axis, x_dtype, y_dtype)
    return y, cache


def softmax_backward(dy, cache):
    """Gradient of softmax: dy (..., n) -> dx (..., n)."""
    y, axis, x_dtype, y_dtype = cache
    _check_softmax_dy("softmax_backward", dy, y, x_dtype, y_dtype)
    y, dy = upcast(y), upcast(dy)                  # (..., n) float32 for float16 and bfloat16
    # Undoes y = e / s: the Jacobian diag(y) - y y^T applied to dy without forming it.
    dx = y * (dy - (dy * y).sum(axis=axis, keepdims=True))
    return _to_x_dtype(dx, y_dtype, x_dtype)


@np.errstate(over="ignore")                        # x - m may overflow to -inf, as in softmax_forward
def log_softmax_forward(x, axis=-1, dtype=None):
    """Log-softmax of ``x`` along ``axis``: (..., n) -> (..., n).

    Returns ``(y, cache)``; the cache is a SoftmaxCache ``(p, axis, x's dtype, y's dtype)`` with
    p = softmax(x) (float32 for a float16 or bfloat16 x), which the backward needs.
    """
    x, axis, x_dtype = _check_softmax(x, axis, dtype)   # x cast to dtype; axis None for a 0-d x
    y_dtype = x.dtype                              # the output's dtype: x's after dtype='s cast
    x = upcast(x)                                  # (..., n) float32 for float16 and bfloat16
    m = _row_max(x, axis)                          # (..., 1); raises on NaN or +inf
    shifted = x - m                                # (..., n), max entry 0
    e = np.exp(shifted)                            # (..., n)
    s = e.sum(axis=axis, keepdims=True)            # (..., 1)
    empty = s == 0                                 # rows that are entirely -inf
    log_s = np.log(np.where(empty, np.ones_like(s), s))
    y = np.where(empty, -np.inf, shifted - log_s).astype(y_dtype, copy=False)   # rounded once
    p = e / np.where(empty, np.ones_like(s), s)    # softmax, zeros on all -inf rows
    cache = SoftmaxCache(p, axis, x_dtype, y_dtype)
    return y, cache


def log_softmax_backward(dy, cache):
    """Gradient of log-softmax: dy (..., n) -> dx (..., n)."""
    p, axis, x_dtype, y_dtype = cache
    _check_softmax_dy("log_softmax_backward", dy, p, x_dtype, y_dtype)
    dy = upcast(dy)                                # (..., n) in y's dtype, float32 for the low ones
    # Undoes y = x - m - log(s): d/dx of log(s) is p, so dx = dy - p * sum(dy).
    dx = dy - p * dy.sum(axis=axis, keepdims=True)
    # An all -inf row has p = 0 and would pass dy straight through; no gradient flows there.
    empty = ~p.any(axis=axis, keepdims=True)
    dx = np.where(empty, np.zeros_like(dx), dx)
    return _to_x_dtype(dx, y_dtype, x_dtype)


def _to_x_dtype(dx, y_dtype, x_dtype):
    """dx rounded once to y's dtype (the gradient of the cast x, as autograd's), then undoing
    dtype='s cast back to x's dtype; a 0-d dx stays an array."""
    return np.asarray(dx).astype(y_dtype, copy=False).astype(x_dtype, copy=False)


def _check_softmax(x, axis, dtype):
    """Return ``(x, axis, x's dtype)``: x cast to ``dtype`` if given, axis made non-negative (None
    for a 0-d x, whose reductions then run over its one entry). Raise unless x is a float array
    (or, with a float ``dtype``, a bool, integer or float one), ``axis`` is an integer
    in range (0 or -1 for a 0-d x, as torch). NaN and +inf are refused by _row_max."""
    x_dtype = getattr(x, "dtype", None)
    if dtype is not None:
        try:
            dtype = np.dtype(dtype)
        except TypeError:
            raise TypeError(f"dtype must be float16, bfloat16, float32 or float64 (or None), got {dtype!r}") from None
        if dtype.name not in FLOAT_DTYPES:
            raise TypeError(f"dtype must be float16, bfloat16, float32 or float64 (or None), got {dtype}")
        if not isinstance(x, np.ndarray) or not (x.dtype.kind in "buif" or x.dtype.name in FLOAT_DTYPES):
            raise TypeError(f"x must be a NumPy array of bools, integers or floats to cast to "
                            f"dtype {dtype}, got {getattr(x, 'dtype', type(x).__name__)}")
        x = x.astype(dtype, copy=False)
    check_float("x", x)
    if isinstance(axis, bool) or not isinstance(axis, int | np.integer):
        raise TypeError(f"axis must be an integer, got {type(axis).__name__} {axis!r}")
    axis = None if x.ndim == 0 and axis in (0, -1) else check_axis("x", x, axis)
    return x, axis, x_dtype


def _check_softmax_dy(op, dy, y, x_dtype, y_dtype):
    """Raise unless dy matches the forward's output (y's shape, y_dtype), and x had a gradient (a
    float dtype)."""
    check_dout(op, dy, y.shape, y_dtype, name="dy")
    if x_dtype.name not in FLOAT_DTYPES:
        raise TypeError(f"{op}: the forward's x was {x_dtype}, cast to {y_dtype} by dtype=, and "
                        f"{x_dtype} has no gradient")
