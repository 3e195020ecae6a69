"""Layer normalisation over the last axis, with its backward.

    mu = mean(x),  var = mean((x - mu)^2),  xhat = (x - mu) / sqrt(var + eps),  out = xhat * w + b

The variance is the biased one (divide by C) and eps sits inside the square root, as in
``torch.nn.LayerNorm`` (Ba, Kiros and Hinton, "Layer Normalization", 2016). Backward, the
standard closed form: dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)),
dxhat = dout * w, with rstd = 1 / sqrt(var + eps).

Near-constant rows. Centring first (never mean(x^2) - mu^2, which cancels catastrophically and can
even go negative) is not enough on its own: the rounding error of mu itself, up to a few ulps of
the row's offset, survives in x - mu and is amplified by rstd. Subtracting the mean of x - mu a
second time removes it. For float32 rows of 1e4 + U(-1, 1) this keeps the error near 1e-7 where
one centring (and ``F.layer_norm``) lose 1e-3; ``test_near_constant_rows_stay_accurate`` checks.
"""

import numpy as np

from numpy_attn._checks import check_float, check_same_dtype


def layer_norm_forward(x, w, b, eps=1e-5):
    """Normalise each row of ``x`` (..., C), then scale by w (C,) and shift by b (C,) -> (..., C).

    Returns ``(out, cache)``; the cache is ``(xhat, rstd, w)``: the backward needs the normalised
    rows, their reciprocal standard deviations and the scale, and recomputes nothing.
    """
    _check_layer_norm(x, w, b, eps)
    mu = x.mean(axis=-1, keepdims=True)                    # (..., C) -> (..., 1)
    xc = x - mu                                            # (..., C)
    xc = xc - xc.mean(axis=-1, keepdims=True)              # removes mu's rounding error (see above)
    var = (xc * xc).mean(axis=-1, keepdims=True)           # (..., 1), biased
    rstd = 1 / np.sqrt(var + x.dtype.type(eps))            # (..., 1)
    xhat = xc * rstd                                       # (..., C), zero mean, unit variance
    out = xhat * w + b                                     # (..., C)
    cache = (xhat, rstd, w)
    return out, cache


def layer_norm_backward(dout, cache):
    """Gradients of layer norm: dout (..., C) -> (dx (..., C), {"w": dw (C,), "b": db (C,)})."""
    xhat, rstd, w = cache
    C = w.shape[0]
    # Undoes out = xhat * w + b: w and b were applied to every row.
    db = dout.reshape(-1, C).sum(axis=0)                   # (..., C) -> (C,)
    dw = (dout * xhat).reshape(-1, C).sum(axis=0)          # (C,)
    dxhat = dout * w                                       # (..., C)
    # Undoes xhat = xc * rstd, var = mean(xc^2) and both centrings together: the Jacobian of
    # row normalisation is rstd * (I - 1/C - xhat xhat^T / C), applied without forming it.
    dx = rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True)
                 - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, {"w": dw, "b": db}


def _check_layer_norm(x, w, b, eps):
    """Raise unless x (..., C), w (C,) and b (C,) are float arrays of one dtype and eps >= 0."""
    check_float("x", x)
    check_float("w", w)
    check_float("b", b)
    if x.ndim < 1:
        raise ValueError(f"x must have at least one dimension (..., C), got shape {x.shape}")
    C = x.shape[-1]
    if w.shape != (C,) or b.shape != (C,):
        raise ValueError(f"w {w.shape} and b {b.shape} must both have shape ({C},) to match x {x.shape}")
    check_same_dtype(x=x, w=w, b=b)
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
