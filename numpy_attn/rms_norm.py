"""Root-mean-square layer normalisation over the last axis, and its backward.

    rstd = 1 / sqrt(mean(x^2) + eps),   xhat = x * rstd,   out = xhat * w

Zhang and Sennrich, "Root Mean Square Layer Normalization" (2019): layer norm without the centring
and without the bias, as in Llama, T5 and ``torch.nn.RMSNorm``. Backward, with dxhat = dout * w:
dx = rstd * (dxhat - xhat * mean(dxhat * xhat)), dw = sum of dout * xhat over all rows.

Gemma's norm (``offset=1.0``) scales by (1 + w) instead, its weights stored minus one (they start
at 0). We form 1 + w first and multiply xhat by it, in x's dtype, as Hugging Face's
``Gemma2RMSNorm`` and ``Gemma3RMSNorm`` do in float32 before casting back: for bfloat16 that
order matters (Llama rounds xhat to bfloat16 and then multiplies by w, Gemma rounds the product
once), and 1 + w rounds w to the ulp of 1 where xhat * w + xhat would not. ``Olmo2RMSNorm`` and
``GptOssRMSNorm`` scale by w itself but in Gemma's order, the product rounded once
(``round_xhat=False``). The backward only
swaps w for 1 + w in dxhat; dw is unchanged.

Precision. float32 stays float32 and float64 stays float64. Hugging Face's ``LlamaRMSNorm`` casts
x to float32, normalises, casts back and then scales by w; for float32 input that is exactly our
computation (the casts do nothing), and for float64 it throws away half of the digits, which we
do not.

float16 and bfloat16: x and w are cast up to float32 and the mean square, rstd and xhat are
computed there (PyTorch's opmath, as ``F.rms_norm`` and both Hugging Face norms do,
docs/precision.md). Then the two orders above: without an offset xhat is rounded to x's dtype
and multiplied by w, the product rounded again (``LlamaRMSNorm`` and ``F.rms_norm``); with one, or
with ``round_xhat=False``, xhat * (offset + w) is formed in float32 and rounded once
(``Gemma2RMSNorm``, ``Olmo2RMSNorm``, ``GptOssRMSNorm``). The backward runs
in float32 from the float32 xhat and rounds dx and dw once each.
"""

import numpy as np

from numpy_attn._checks import check_dout, check_float, check_in_dtype, check_same_dtype, upcast


def rms_norm_forward(x, w, eps=1e-6, offset=0.0, round_xhat=True):
    """Normalise each row of ``x`` (..., C) by its root mean square, then scale by w (C,) -> (..., C).

    ``offset=1.0`` scales by 1 + w instead (Gemma). ``round_xhat=False`` rounds only the product
    xhat * w, as OLMo 2's and gpt-oss's norms do (it changes nothing for float32 and float64).
    Returns ``(out, cache)``; the cache is
    ``(xhat, rstd, scale, x's dtype)``: the normalised rows, their reciprocal root mean squares and
    the scale (w, or offset + w), in the dtype computed in (float32 for float16 and bfloat16); the
    backward recomputes nothing.
    """
    _check_rms_norm(x, w, eps, offset)
    xf, wf = upcast(x), upcast(w)                          # float32 for float16 and bfloat16
    ms = (xf * xf).mean(axis=-1, keepdims=True)            # (..., C) -> (..., 1)
    rstd = 1 / np.sqrt(ms + xf.dtype.type(eps))            # (..., 1)
    xhat = xf * rstd                                       # (..., C), unit root mean square
    scale = wf + wf.dtype.type(offset) if offset else wf   # (C,), Gemma's 1 + w formed first
    # Llama rounds xhat to x's dtype before * w; Gemma, OLMo 2 and gpt-oss do not (a no-op for float32 and float64).
    xhat_scaled = upcast(xhat.astype(x.dtype, copy=False)) if round_xhat and not offset else xhat
    out = xhat_scaled * scale                              # (..., C)
    cache = (xhat, rstd, scale, x.dtype)
    return out.astype(x.dtype, copy=False), cache          # rounded once to x's dtype


def rms_norm_backward(dout, cache):
    """Gradients of RMS norm: dout (..., C) -> (dx (..., C), {"w": dw (C,)})."""
    xhat, rstd, scale, x_dtype = cache
    check_dout("rms_norm", dout, xhat.shape, x_dtype)
    dout = upcast(dout)                                    # float32 for float16 and bfloat16
    C = scale.shape[0]
    # Undoes out = xhat * scale: scale = w (+ offset) scaled every row; the offset has no gradient.
    dw = (dout * xhat).reshape(-1, C).sum(axis=0)          # (..., C) -> (C,)
    dxhat = dout * scale                                   # (..., C)
    # Undoes xhat = x * rstd and rstd = 1 / sqrt(mean(x^2) + eps) together: the Jacobian is
    # rstd * (I - xhat xhat^T / C), applied without forming it.
    dx = rstd * (dxhat - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx.astype(x_dtype, copy=False), {"w": dw.astype(x_dtype, copy=False)}   # each rounded once


def _check_rms_norm(x, w, eps, offset=0.0):
    check_float("x", x)
    check_float("w", w)
    if x.ndim < 1:
        raise ValueError(f"x must have at least one dimension (..., C), got shape {x.shape}")
    if w.shape != x.shape[-1:]:
        raise ValueError(f"w must have shape ({x.shape[-1]},) to match x {x.shape}, got {w.shape}")
    check_same_dtype(x=x, w=w)
    if isinstance(eps, bool) or not isinstance(eps, int | float | np.floating) or not eps >= 0:
        raise ValueError(f"eps must be a number >= 0, got {eps!r}")
    check_in_dtype("eps", eps, x.dtype)                  # inf, or lost in float32: 1e300, 1e-50
    if isinstance(offset, bool) or not isinstance(offset, int | float | np.floating):
        raise TypeError(f"offset must be a number (1.0 for Gemma's 1 + w), got {type(offset).__name__} {offset!r}")
    if not np.isfinite(offset):
        raise ValueError(f"offset must be finite, got {offset!r}")
