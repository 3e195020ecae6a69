"""Root-mean-square layer normalisation over the last axis in plain PyTorch; autograd supplies
the backward.

Twin of numpy_attn/rms_norm.py: out = x / sqrt(mean(x^2) + eps) * w, or * (1 + w) with
``offset=1.0`` (Gemma), computed in x's dtype (Llama's LlamaRMSNorm and Gemma's Gemma2RMSNorm
compute in float32 whatever x's dtype; see the NumPy file); float16 and bfloat16 computed in
float32, xhat rounded before * w without an offset (Llama) and only the product with one (Gemma)
or with ``round_xhat=False`` (OLMo 2, gpt-oss).
"""

import torch

from torch_attn._opmath import upcast


def rms_norm(x, w, eps=1e-6, offset=0.0, round_xhat=True):
    """Normalise each row of ``x`` (..., C) by its root mean square, then scale by w (C,) -> (..., C)."""
    xf, wf = upcast(x), upcast(w)                          # float32 for float16 and bfloat16
    ms = (xf * xf).mean(dim=-1, keepdim=True)              # (..., C) -> (..., 1)
    rstd = 1 / torch.sqrt(ms + eps)                        # (..., 1)
    xhat = xf * rstd                                       # (..., C), unit root mean square
    scale = wf + offset if offset else wf                  # (C,), Gemma's 1 + w formed first
    # Llama rounds xhat to x's dtype before * w; Gemma, OLMo 2 and gpt-oss do not (a no-op for float32 and float64).
    xhat_scaled = upcast(xhat.to(x.dtype)) if round_xhat and not offset else xhat
    out = xhat_scaled * scale                              # (..., C)
    return out.to(x.dtype)                                 # rounded once to x's dtype


# Equals torch.nn.functional.rms_norm(x, (C,), w, eps) and torch.nn.RMSNorm(C, eps) holding w;
# with offset=1.0, Hugging Face's Gemma2RMSNorm / Gemma3RMSNorm holding w (for float32 x); with
# round_xhat=False, Olmo2RMSNorm and GptOssRMSNorm holding w (for x below float64).
