"""GELU, exact (erf) and tanh-approximated, in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/gelu.py: out = x * cdf, with cdf = Phi(x) = (1 + erf(x / sqrt(2))) / 2 or its
tanh approximation (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))) / 2, computed as sigmoid(2 inner),
the same number without 1 + tanh's cancellation where inner << 0. ``torch.erf`` stands in for
the NumPy erf. Python float constants keep the tensor's dtype. float16 and bfloat16 computed in
float32 and rounded once, as there.
"""

import math

import torch

from torch_attn._opmath import upcast

_KAPPA = 0.044715                        # the cubic coefficient of the tanh approximation


def gelu(x, approximate="none"):
    """GELU of ``x`` elementwise: (...) -> (...), exact (erf) or ``approximate="tanh"``."""
    xf = upcast(x)                                 # (...) float32 for float16 and bfloat16
    half, one = 0.5, 1.0
    if approximate == "none":
        cdf = half * (one + torch.erf(xf * math.sqrt(0.5)))         # Phi(x), the normal CDF
    else:
        x_cube = xf * xf * xf
        inner = math.sqrt(2 / math.pi) * (xf + _KAPPA * x_cube)
        cdf = torch.sigmoid(2 * inner)                # (1 + tanh(inner)) / 2
    out = xf * cdf
    return out.to(x.dtype)                         # rounded once to x's dtype


# Equals torch.nn.functional.gelu(x, approximate=approximate).
