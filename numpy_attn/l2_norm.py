"""L2 normalisation over the last axis, and its backward: the q and k normalisation of the delta rule.

    rnorm = 1 / sqrt(sum(x^2) + eps),   out = x * rnorm

Yang, Kautz and Hatamizadeh, "Gated Delta Networks" (2024), and Yang et al., "Parallelizing Linear
Transformers with the Delta Rule over Sequence Length" (2024): the delta rule multiplies its state
by I - beta k k^T at each step, whose eigenvalue along k is 1 - beta |k|^2; with |k| = 1 and beta in
(0, 1) it stays in [0, 1) and the state cannot grow, so q and k are normalised per head before the
rule (Qwen3.5, Qwen3-Next, OLMo Hybrid, Kimi Linear). Unlike RMS norm
(numpy_attn/rms_norm.py) the sum is not divided by the width and there is no weight: each row
comes out of unit length, not of unit root mean square.

Hugging Face writes it two ways: Qwen3.5's and Qwen3-Next's ``l2norm`` multiply by
``rsqrt(sum + eps)`` as here, Kimi Linear's divides by ``sqrt(sum + eps)``. They are the same
function, rounded differently (a few ulps). Both put eps inside the square root, so a row of zeros
gives zeros (F.normalize takes max(|x|, eps) instead).

Backward, with rnorm and out cached: the Jacobian of x -> x * rnorm is rnorm (I - out out^T), so
dx = rnorm * (dout - out * sum(dout * out)).

float16 and bfloat16: x is cast up to float32, the sum, rnorm and out are formed there and out is
rounded once; the backward runs in float32 and rounds dx once. (Hugging Face's l2norm run in
float16 rounds each op, and its backward forms rsqrt's slope (sum + eps)^(-3/2) in float16, which
overflows for rows with sum + eps below 6.1e-4: an inf or NaN gradient that float32 avoids.)
"""

import numpy as np

from numpy_attn._checks import check_dout, check_float, upcast


def l2_norm_forward(x, eps=1e-6):
    """Scale each row of ``x`` (..., d) to unit length -> (..., d).

    Returns ``(out, cache)``; the cache is ``(out, rnorm, x's dtype)``, out and the reciprocal
    norms (..., 1) in the dtype computed in (float32 for float16 and bfloat16): the backward
    needs nothing else and recomputes nothing.
    """
    _check_l2_norm(x, eps)
    xf = upcast(x)                                         # float32 for float16 and bfloat16
    ss = (xf * xf).sum(axis=-1, keepdims=True)             # (..., d) -> (..., 1)
    rnorm = 1 / np.sqrt(ss + xf.dtype.type(eps))           # (..., 1), eps keeps a row of zeros finite
    out = xf * rnorm                                       # (..., d), unit length
    cache = (out, rnorm, x.dtype)
    return out.astype(x.dtype, copy=False), cache          # rounded once to x's dtype


def l2_norm_backward(dout, cache):
    """Gradient of L2 normalisation: dout (..., d) -> dx (..., d)."""
    out, rnorm, x_dtype = cache
    check_dout("l2_norm", dout, out.shape, x_dtype)
    dout = upcast(dout)                                    # float32 for float16 and bfloat16
    # Undoes out = x * rnorm and rnorm = 1 / sqrt(sum(x^2) + eps) together: the Jacobian is
    # rnorm * (I - out out^T), applied without forming it.
    dx = rnorm * (dout - out * (dout * out).sum(axis=-1, keepdims=True))
    return dx.astype(x_dtype, copy=False)                  # rounded once to x's dtype


def _check_l2_norm(x, eps):
    check_float("x", x)
    if x.ndim < 1:
        raise ValueError(f"x must have at least one dimension (..., d), got shape {x.shape}")
    if isinstance(eps, bool) or not isinstance(eps, int | float | np.floating) or not eps >= 0:
        raise ValueError(f"eps must be a number >= 0, got {eps!r}")
