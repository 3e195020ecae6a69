"""Root-mean-square layer normalisation over the last axis in plain PyTorch; autograd supplies
the backward.

Twin of numpy_attn/rms_norm.py: out = x / sqrt(mean(x^2) + eps) * w, computed in x's dtype
(Llama's LlamaRMSNorm computes in float32 whatever x's dtype; see the NumPy file).
"""

import torch


def rms_norm(x, w, eps=1e-6):
    """Normalise each row of ``x`` (..., C) by its root mean square, then scale by w (C,) -> (..., C)."""
    ms = (x * x).mean(dim=-1, keepdim=True)                # (..., C) -> (..., 1)
    rstd = 1 / torch.sqrt(ms + eps)                        # (..., 1)
    xhat = x * rstd                                        # (..., C), unit root mean square
    out = xhat * w                                         # (..., C)
    return out


# Equals torch.nn.functional.rms_norm(x, (C,), w, eps) and torch.nn.RMSNorm(C, eps) holding w.
