"""The SwiGLU feed-forward network of Llama in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/swiglu.py: out = (silu(x @ gate.w) * (x @ up.w)) @ down.w, biases optional,
weights stored (C_in, C_out); ``act="gelu_tanh"`` gates with the tanh GELU (GeGLU, Gemma).
"""

from functools import partial

import torch

from torch_attn.gelu import gelu
from torch_attn.linear import linear


def sigmoid(x):
    """1 / (1 + exp(-x)), from exp(-|x|) so that no exponential overflows."""
    e = torch.exp(-torch.abs(x))
    return torch.where(x >= 0, 1 / (1 + e), e / (1 + e))


def silu(x):
    """SiLU (swish) x * sigmoid(x): (...) -> (...)."""
    s = sigmoid(x)
    out = x * s
    return out


# The gate's activation: SiLU for SwiGLU (Llama), the tanh GELU for GeGLU (Gemma).
GATE_ACTIVATIONS = {
    "silu": silu,
    "gelu_tanh": partial(gelu, approximate="tanh"),
}


def swiglu(x, params, act="silu"):
    """SwiGLU network on x (..., C), params {"gate", "up", "down"}, act "silu" or "gelu_tanh" -> (..., C)."""
    g = linear(x, **params["gate"])                                   # (..., C) -> (..., H)
    u = linear(x, **params["up"])                                     # (..., C) -> (..., H)
    s = GATE_ACTIVATIONS[act](g)                                      # (..., H), silu(g) or gelu_tanh(g)
    a = s * u                                                         # (..., H)
    out = linear(a, **params["down"])                                 # (..., H) -> (..., C)
    return out


# silu equals torch.nn.functional.silu; swiglu equals Hugging Face's LlamaMLP (hidden_act="silu")
# holding gate_proj.weight = gate.w.T, up_proj.weight = up.w.T, down_proj.weight = down.w.T;
# with act="gelu_tanh", Gemma2MLP (hidden_activation="gelu_pytorch_tanh", no biases) holding the same.
