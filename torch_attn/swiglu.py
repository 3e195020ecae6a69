"""The SwiGLU feed-forward network of Llama in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/swiglu.py: out = (silu(x @ gate.w) * (x @ up.w)) @ down.w, biases optional,
weights stored (C_in, C_out); ``act="gelu_tanh"`` gates with the tanh GELU (GeGLU, Gemma).
float16 and bfloat16 computed in float32 and rounded once, as there.
"""

from functools import partial

import torch

from numpy_attn._tree import tree_map  # plain Python: walks the nested dicts
from torch_attn._opmath import upcast
from torch_attn.gelu import gelu
from torch_attn.linear import linear


def sigmoid(x):
    """1 / (1 + exp(-x)), from exp(-|x|) so that no exponential overflows."""
    e = torch.exp(-torch.abs(x))
    return torch.where(x >= 0, 1 / (1 + e), e / (1 + e))


def silu(x):
    """SiLU (swish) x * sigmoid(x): (...) -> (...)."""
    xf = upcast(x)                                   # (...) float32 for float16 and bfloat16
    s = sigmoid(xf)
    out = xf * s
    return out.to(x.dtype)                           # rounded once to x's dtype


# The gate's activation: SiLU for SwiGLU (Llama), the tanh GELU for GeGLU (Gemma).
GATE_ACTIVATIONS = {
    "silu": silu,
    "gelu_tanh": partial(gelu, approximate="tanh"),
}


def swiglu(x, params, act="silu"):
    """SwiGLU network on x (..., C), params {"gate", "up", "down"}, act "silu" or "gelu_tanh" -> (..., C)."""
    x_dtype = x.dtype
    x, params = upcast(x), tree_map(upcast, params)                   # float32 for float16 and bfloat16
    g = linear(x, **params["gate"])                                   # (..., C) -> (..., H)
    u = linear(x, **params["up"])                                    # (..., C) -> (..., H)
    s = GATE_ACTIVATIONS[act](g)                                      # (..., H), silu(g) or gelu_tanh(g)
    a = s * u                                                         # (..., H)
    out = linear(a, **params["down"])                                 # (..., H) -> (..., C)
    return out.to(x_dtype)                                            # rounded once to x's dtype


# silu equals torch.nn.functional.silu; swiglu equals Hugging Face's LlamaMLP (hidden_act="silu")
# holding gate_proj.weight = gate.w.T, up_proj.weight = up.w.T, down_proj.weight = down.w.T;
# with act="gelu_tanh", Gemma2MLP (hidden_activation="gelu_pytorch_tanh", no biases) holding the same.
