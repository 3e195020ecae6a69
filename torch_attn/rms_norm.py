"""Root-mean-square layer normalisation over the last axis in plain PyTorch; autograd supplies
the backward.

Twin of numpy_attn/rms_norm.py: out = x / sqrt(mean(x^2) + eps) * w, or * (1 + w) with
``offset=1.0`` (Gemma), computed in x's dtype (Llama's LlamaRMSNorm and Gemma's Gemma2RMSNorm
compute in float32 whatever x's dtype; see the NumPy file).
"""

import torch


def rms_norm(x, w, eps=1e-6, offset=0.0):
    """Normalise each row of ``x`` (..., C) by its root mean square, then scale by w (C,) -> (..., C)."""
    ms = (x * x).mean(dim=-1, keepdim=True)                # (..., C) -> (..., 1)
    rstd = 1 / torch.sqrt(ms + eps)                        # (..., 1)
    xhat = x * rstd                                        # (..., C), unit root mean square
    scale = w + offset if offset else w                    # (C,), Gemma's 1 + w formed first
    out = xhat * scale                                     # (..., C)
    return out


# Equals torch.nn.functional.rms_norm(x, (C,), w, eps) and torch.nn.RMSNorm(C, eps) holding w;
# with offset=1.0, Hugging Face's Gemma2RMSNorm / Gemma3RMSNorm holding w (for float32 x).
