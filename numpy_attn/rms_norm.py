"""Root-mean-square layer normalisation over the last axis, and its backward.

    rstd = 1 / sqrt(mean(x^2) + eps),   xhat = x * rstd,   out = xhat * w

Zhang and Sennrich, "Root Mean Square Layer Normalization" (2019): layer norm without the centring
and without the bias, as in Llama, T5 and ``torch.nn.RMSNorm``. Backward, with dxhat = dout * w:
dx = rstd * (dxhat - xhat * mean(dxhat * xhat)), dw = sum of dout * xhat over all rows.

Precision. We compute in x's dtype: float32 stays float32 and float64 stays float64. Hugging
Face's ``LlamaRMSNorm`` casts x to float32, normalises, casts back and then scales by w; for
float32 input that is exactly our computation (the casts do nothing), for bfloat16 it is more
accurate than bfloat16 arithmetic, and for float64 it throws away half of the digits, which we
do not.
"""

import numpy as np

from numpy_attn._checks import check_dout, check_float, check_same_dtype


def rms_norm_forward(x, w, eps=1e-6):
    """Normalise each row of ``x`` (..., C) by its root mean square, then scale by w (C,) -> (..., C).

    Returns ``(out, cache)``; the cache is ``(xhat, rstd, w)``: the normalised rows, their
    reciprocal root mean squares and the scale; the backward recomputes nothing.
    """
    _check_rms_norm(x, w, eps)
    ms = (x * x).mean(axis=-1, keepdims=True)              # (..., C) -> (..., 1)
    rstd = 1 / np.sqrt(ms + x.dtype.type(eps))             # (..., 1)
    xhat = x * rstd                                        # (..., C), unit root mean square
    out = xhat * w                                         # (..., C)
    cache = (xhat, rstd, w)
    return out, cache


def rms_norm_backward(dout, cache):
    """Gradients of RMS norm: dout (..., C) -> (dx (..., C), {"w": dw (C,)})."""
    xhat, rstd, w = cache
    check_dout("rms_norm", dout, xhat.shape, xhat.dtype)
    C = w.shape[0]
    # Undoes out = xhat * w: w scaled every row.
    dw = (dout * xhat).reshape(-1, C).sum(axis=0)          # (..., C) -> (C,)
    dxhat = dout * w                                       # (..., C)
    # Undoes xhat = x * rstd and rstd = 1 / sqrt(mean(x^2) + eps) together: the Jacobian is
    # rstd * (I - xhat xhat^T / C), applied without forming it.
    dx = rstd * (dxhat - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, {"w": dw}


def _check_rms_norm(x, w, eps):
    check_float("x", x)
    check_float("w", w)
    if x.ndim < 1:
        raise ValueError(f"x must have at least one dimension (..., C), got shape {x.shape}")
    if w.shape != x.shape[-1:]:
        raise ValueError(f"w must have shape ({x.shape[-1]},) to match x {x.shape}, got {w.shape}")
    check_same_dtype(x=x, w=w)
    if isinstance(eps, bool) or not isinstance(eps, int | float | np.floating) or not eps >= 0:
        raise ValueError(f"eps must be a number >= 0, got {eps!r}")
