"""Inverted dropout with an explicit random generator, and its backward.

    keep ~ Bernoulli(1 - p) elementwise,   out = x * keep / (1 - p),   dx = dout * keep / (1 - p)

Scaling the kept entries by 1 / (1 - p) during training keeps E[out] = x, so evaluation is the
identity (Srivastava et al., "Dropout", 2014; the "inverted" form of ``torch.nn.functional.dropout``).
The keep-mask is drawn from an explicit ``np.random.Generator`` (keep where a uniform draw u in
[0, 1) is < 1 - p, PyTorch's Bernoulli(1 - p) rule, also numpy_attn/attention.py's), or passed in
as ``mask``; either way it is kept in the cache, and the torch twin accepts the same mask, so the
two agree exactly. p = 1 drops everything (zeros, as F.dropout; the scale is 0, not 1 / 0)
and draws nothing, so it needs no rng, as F.dropout(x, 1.0) draws nothing.
``training=False`` (any p) and p = 0 are the identity: the output is x itself when x is read-only
(as F.dropout; softmax's read-only weights in attention pass through uncopied), else a copy, so that
changing the output in place cannot change x; the backward returns a fresh copy of dout, never dout itself.

float16 and bfloat16: the mask's uniform draw is float32 (a bfloat16 uniform has 8 bits: its keep
probability would be 1 - p only to within 1/256; Generator.random has no low dtype anyway), and
x * keep * scale is formed in float32 with the scale in float32, rounded once, as PyTorch's
multiplication by a Python scale rounds once (docs/precision.md); the backward the same.
"""

from typing import NamedTuple

import numpy as np

from numpy_attn._checks import check_dout, check_float, check_rng, opmath, upcast


class DropoutCache(NamedTuple):
    mask: np.ndarray | None     # (...) bool keep-mask, True = kept; None for the identity
    scale: np.floating | None   # 1 / (1 - p) in x's opmath dtype (0 at p = 1); None for the identity
    shape: tuple                # x's shape and dtype, for checking dout
    dtype: np.dtype


def dropout_forward(x, p, rng=None, training=True, mask=None):
    """Zero each entry of ``x`` (...) with probability p in [0, 1] and scale the rest by
    1 / (1 - p) -> (...).

    The keep-mask (boolean, True = kept) is ``mask`` if given, else drawn from ``rng`` (at p = 1
    it keeps nothing and is not drawn). With ``training=False`` or p = 0 the output is x itself if
    x is read-only, else a copy of x; nothing is drawn and any mask is ignored.
    Returns ``(out, cache)``; the cache is a DropoutCache ``(mask, scale, shape, dtype)``, mask and scale None for
    the identity (shape and dtype are x's, for checking dout).
    """
    _check_dropout(x, p, rng, training, mask)
    if not training or p == 0:
        # Changing out in place must not change x: a read-only x cannot be changed through out, else a copy.
        out = x if not x.flags.writeable else x.copy()
        return out, DropoutCache(None, None, x.shape, x.dtype)
    if mask is None and p == 1:
        mask = np.zeros(x.shape, bool)                     # (...), keeps nothing: nothing to draw
    elif mask is None:
        mask = rng.random(x.shape, dtype=opmath(x.dtype)) < 1 - p   # (...), True with probability 1 - p
    xf = upcast(x)                                         # (...) float32 for float16 and bfloat16
    scale = xf.dtype.type(0 if p == 1 else 1 / (1 - p))    # p = 1 keeps nothing: 0, not 1 / 0
    out = xf * mask * scale
    cache = DropoutCache(mask, scale, x.shape, x.dtype)
    return out.astype(x.dtype, copy=False), cache          # rounded once to x's dtype


def dropout_backward(dout, cache):
    """Gradient of dropout: dout (...) -> dx (...), zero where the entry was dropped."""
    mask, scale, shape, dtype = cache
    check_dout("dropout_backward", dout, shape, dtype)
    if mask is None:
        return dout.copy()                                 # undoes the identity
    # Undoes out = x * mask * scale.
    dx = upcast(dout) * mask * scale                       # (...) float32 for the low dtypes
    return dx.astype(dtype, copy=False)                    # rounded once to x's dtype


def _check_dropout(x, p, rng, training, mask):
    """Raise unless x is a float array and p lies in [0, 1]; when a mask is needed, unless
    ``mask`` is a boolean array of x's shape or, without one and p < 1, ``rng`` is a Generator."""
    check_float("x", x)
    if not 0 <= p <= 1:
        raise ValueError(f"dropout probability p must lie in [0, 1], got {p}")
    if not training or p == 0:
        return
    if mask is None and p < 1:
        check_rng(rng, f"dropout with p = {p} in training (and no mask)")
    elif mask is None:
        return
    elif not isinstance(mask, np.ndarray) or mask.dtype != np.bool_:
        raise TypeError(f"mask must be boolean of x's shape {x.shape}, got "
                        f"{getattr(mask, 'dtype', type(mask).__name__)} {np.shape(mask)}")
    elif mask.shape != x.shape:
        raise ValueError(f"mask must be boolean of x's shape {x.shape}, got {mask.dtype} {mask.shape}")
