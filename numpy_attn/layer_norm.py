"""Layer normalisation over the last axis (or the last few), with its backward.

    mu = mean(x),  var = mean((x - mu)^2),  xhat = (x - mu) / sqrt(var + eps),  out = xhat * w + b

The means run over the trailing axes of ``normalized_shape`` (the last axis by default), C being
the number of elements they hold. The variance is the biased one (divide by C) and eps sits
inside the square root, as in ``torch.nn.LayerNorm`` (Ba, Kiros and Hinton, "Layer
Normalization", 2016). w and b have ``normalized_shape``; either may be None, as with
``nn.LayerNorm(elementwise_affine=False)`` (neither) or ``nn.LayerNorm(bias=False)`` (no b).
Backward, the standard closed form: dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)),
dxhat = dout * w, with rstd = 1 / sqrt(var + eps).

Near-constant rows. Centring first (never mean(x^2) - mu^2, which cancels catastrophically and can
even go negative) is not enough on its own: the rounding error of mu itself, up to a few ulps of
the row's offset, survives in x - mu and is amplified by rstd. Subtracting the mean of x - mu a
second time removes it. For float32 rows of 1e4 + U(-1, 1) this keeps the error near 1e-7 where
one centring (and ``F.layer_norm``) lose 1e-3; ``test_near_constant_rows_stay_accurate`` checks.

float16 and bfloat16: x, w and b are cast up to float32 and everything (the moments, xhat, the
affine step, and in the backward dx, dw and db) is computed there, each result rounded once to x's
dtype, as PyTorch's CPU kernel computes its moments in float32 (its opmath type, docs/precision.md).
PyTorch sums db in the low dtype itself; summing it in float32 and rounding once is more accurate.
"""

import numbers

import numpy as np

from numpy_attn._checks import check_dout, check_float, check_in_dtype, check_same_dtype, upcast


def layer_norm_forward(x, w=None, b=None, eps=1e-5, normalized_shape=None):
    """Normalise x (..., *S) over its trailing axes S = ``normalized_shape`` (default: the last
    axis, S = (C,)), then scale by w S and shift by b S, each optional -> (..., *S).

    Returns ``(out, cache)``; the cache is ``(xhat, rstd, w, has_b, axes, x's dtype)``: the backward
    needs the normalised rows, their reciprocal standard deviations, the scale, whether there was a
    shift and which axes were normalised; it recomputes nothing. xhat, rstd and w are kept in the
    dtype computed in (float32 for float16 and bfloat16), so the backward does not round them again.
    """
    normalized_shape = _check_layer_norm(x, w, b, eps, normalized_shape)
    axes = tuple(range(-len(normalized_shape), 0))         # the normalised trailing axes
    xf, wf, bf = upcast(x), upcast(w), upcast(b)           # float32 for float16 and bfloat16
    mu = xf.mean(axis=axes, keepdims=True)                 # (..., *S) -> (..., 1, ..., 1)
    xc = xf - mu                                           # (..., *S)
    xc = xc - xc.mean(axis=axes, keepdims=True)            # removes mu's rounding error (see above)
    var = (xc * xc).mean(axis=axes, keepdims=True)         # (..., 1, ..., 1), biased
    rstd = 1 / np.sqrt(var + xf.dtype.type(eps))           # (..., 1, ..., 1)
    xhat = xc * rstd                                       # (..., *S), zero mean, unit variance
    out = xhat if wf is None else xhat * wf                # no w: elementwise_affine=False
    out = out if bf is None else out + bf                  # no b: bias=False
    cache = (xhat, rstd, wf, b is not None, axes, x.dtype)
    return out.astype(x.dtype, copy=False), cache          # rounded once to x's dtype


def layer_norm_backward(dout, cache):
    """Gradients of layer norm: dout (..., *S) -> (dx (..., *S), {"w": dw S, "b": db S}), with
    only the parameters the forward was given."""
    xhat, rstd, w, has_b, axes, x_dtype = cache
    check_dout("layer_norm_backward", dout, xhat.shape, x_dtype)
    S = xhat.shape[len(xhat.shape) - len(axes):]
    dout = upcast(dout)                                                    # float32 for the low dtypes
    dparams = {}
    # Undoes out = xhat * w + b: w and b were applied to every row.
    if w is not None:
        dparams["w"] = (dout * xhat).reshape((-1,) + S).sum(axis=0)        # (..., *S) -> S
    if has_b:
        dparams["b"] = dout.reshape((-1,) + S).sum(axis=0)                 # (..., *S) -> S
    dxhat = dout if w is None else dout * w                                # (..., *S)
    # Undoes xhat = xc * rstd, var = mean(xc^2) and both centrings together: the Jacobian of
    # row normalisation is rstd * (I - 1/C - xhat xhat^T / C), applied without forming it.
    dx = rstd * (dxhat - dxhat.mean(axis=axes, keepdims=True)
                 - xhat * (dxhat * xhat).mean(axis=axes, keepdims=True))
    # Each gradient rounded once to the inputs' dtype (no copy for float32 and float64).
    return dx.astype(x_dtype, copy=False), {k: v.astype(x_dtype, copy=False) for k, v in dparams.items()}


def _check_layer_norm(x, w, b, eps, normalized_shape):
    """Return normalized_shape as a tuple (x's last axis if None); raise unless x (..., *S) is a
    float array that ends in it, w and b (each optional) are float arrays of shape S, all of one
    dtype, and eps >= 0."""
    check_float("x", x)
    if x.ndim < 1:
        raise ValueError(f"x must have at least one dimension (..., C), got shape {x.shape}")
    if normalized_shape is None:
        normalized_shape = x.shape[-1:]
    normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not 1 <= len(normalized_shape) <= x.ndim or x.shape[x.ndim - len(normalized_shape):] != normalized_shape:
        raise ValueError(f"normalized_shape {normalized_shape} must be a non-empty tail of x's "
                         f"shape {x.shape}")
    for name, p in (("w", w), ("b", b)):
        if p is not None:
            check_float(name, p)
            if p.shape != normalized_shape:
                raise ValueError(f"{name} {p.shape} must have shape {normalized_shape} to match "
                                 f"x {x.shape} (w {np.shape(w)}, b {np.shape(b)})")
    check_same_dtype(x=x, w=w, b=b)
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not eps >= 0:   # as rms_norm's eps
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    check_in_dtype("eps", eps, x.dtype)                  # inf, or lost in float32: 1e300, 1e-50
    return normalized_shape
