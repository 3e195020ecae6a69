"""L2 normalisation over the last axis in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/l2_norm.py: out = x / sqrt(sum(x^2) + eps), eps inside the square root (the
q and k normalisation of the delta rule); float16 and bfloat16 computed in float32 and rounded
once, as there.
"""

import torch

from torch_attn._opmath import upcast


def l2_norm(x, eps=1e-6):
    """Scale each row of ``x`` (..., d) to unit length -> (..., d)."""
    xf = upcast(x)                                         # float32 for float16 and bfloat16
    ss = (xf * xf).sum(dim=-1, keepdim=True)               # (..., d) -> (..., 1)
    rnorm = 1 / torch.sqrt(ss + eps)                       # (..., 1), eps keeps a row of zeros finite
    out = xf * rnorm                                       # (..., d), unit length
    return out.to(x.dtype)                                 # rounded once to x's dtype


# Equals Hugging Face's l2norm of Qwen3.5 and Qwen3-Next (x * rsqrt(sum + eps)) and of Kimi Linear
# (x / sqrt(sum + eps)), and F.normalize(x, dim=-1) where |x| is well above eps;
# parity_tests/test_l2_norm.py checks it.
