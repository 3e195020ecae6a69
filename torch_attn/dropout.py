"""Inverted dropout in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/dropout.py: out = x * keep / (1 - p). Pass the NumPy side's keep-mask as
``mask`` for exact parity; without one the mask is drawn from ``rng``, a ``torch.Generator``
(keep where a uniform draw is < 1 - p; at p = 1 nothing is drawn), so the twin is usable on its own.
float16 and bfloat16: the draw and the products in float32, rounded once, as there.
"""

import torch

from torch_attn._opmath import opmath, upcast


def dropout(x, p, rng=None, training=True, mask=None):
    """Zero each entry of ``x`` (...) with probability p and scale the rest by 1 / (1 - p) -> (...)."""
    if not training or p == 0:
        return x
    if mask is None and p == 1:
        mask = torch.zeros(x.shape, dtype=torch.bool, device=x.device)    # (...), keeps nothing: nothing to draw
    elif mask is None:
        mask = torch.rand(x.shape, generator=rng, dtype=opmath(x.dtype)) < 1 - p  # (...), True w.p. 1 - p
    xf = upcast(x)                                         # (...) float32 for float16 and bfloat16
    scale = 0.0 if p == 1 else 1 / (1 - p)                 # p = 1 keeps nothing: 0, not 1 / 0
    out = xf * mask * scale
    return out.to(x.dtype)                                 # rounded once to x's dtype


# Equals torch.nn.functional.dropout(x, p, training) for the same keep-mask: x * mask / (1 - p).
