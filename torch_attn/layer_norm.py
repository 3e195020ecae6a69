"""Layer normalisation over the last axis in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/layer_norm.py: biased variance, eps inside the square root, and the same
second centring that keeps near-constant rows accurate.
"""

import torch


def layer_norm(x, w, b, eps=1e-5):
    """Normalise each row of ``x`` (..., C), then scale by w (C,) and shift by b (C,) -> (..., C)."""
    mu = x.mean(dim=-1, keepdim=True)                      # (..., C) -> (..., 1)
    xc = x - mu                                            # (..., C)
    xc = xc - xc.mean(dim=-1, keepdim=True)                # removes mu's rounding error
    var = (xc * xc).mean(dim=-1, keepdim=True)             # (..., 1), biased
    rstd = 1 / torch.sqrt(var + eps)                       # (..., 1)
    xhat = xc * rstd                                       # (..., C), zero mean, unit variance
    out = xhat * w + b                                     # (..., C)
    return out


# Equals torch.nn.functional.layer_norm(x, (C,), w, b, eps).
