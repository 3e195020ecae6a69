"""Inverted dropout in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/dropout.py: out = x * keep / (1 - p). Pass the NumPy side's keep-mask as
``mask`` for exact parity; without one the mask is drawn from ``rng``, a ``torch.Generator``
(keep where a uniform draw is < 1 - p; at p = 1 nothing is drawn), so the twin is usable on its own.
"""

import torch


def dropout(x, p, rng=None, training=True, mask=None):
    """Zero each entry of ``x`` (...) with probability p and scale the rest by 1 / (1 - p) -> (...)."""
    if not training or p == 0:
        return x
    if mask is None and p == 1:
        mask = torch.zeros(x.shape, dtype=torch.bool, device=x.device)    # (...), keeps nothing: nothing to draw
    elif mask is None:
        mask = torch.rand(x.shape, generator=rng, dtype=x.dtype) < 1 - p  # (...), True w.p. 1 - p
    scale = 0.0 if p == 1 else 1 / (1 - p)                 # p = 1 keeps nothing: 0, not 1 / 0
    out = x * mask * scale
    return out


# Equals torch.nn.functional.dropout(x, p, training) for the same keep-mask: x * mask / (1 - p).
