"""The SwiGLU feed-forward network of Llama, and its backward.

    g   = x @ gate.w          (..., C) -> (..., H)
    u   = x @ up.w            (..., C) -> (..., H)
    a   = silu(g) * u         silu(g) = g * sigmoid(g), the gate
    out = a @ down.w          (..., H) -> (..., C)

Shazeer, "GLU Variants Improve Transformer" (2020), FFN_SwiGLU; Llama uses it without biases and
with H about 8C/3 (the three matrices then hold as many numbers as GPT's two of 4C). Weights are
stored (C_in, C_out) as everywhere here; Hugging Face's ``LlamaMLP`` stores their transposes in
``gate_proj``, ``up_proj`` and ``down_proj``. Biases are optional (``mlp_bias``).

SiLU's derivative: silu'(g) = s + g s (1 - s) = s (1 + g (1 - s)) with s = sigmoid(g). The sigmoid
is evaluated from exp(-|g|), which never overflows.

``act="gelu_tanh"`` gates with the tanh-approximated GELU of numpy_attn/gelu.py instead: GeGLU
(the same paper's FFN_GEGLU), Gemma's MLP down(gelu_tanh(gate(x)) * up(x)), which Hugging Face's
``Gemma2MLP`` computes with ``hidden_activation="gelu_pytorch_tanh"``. Only the gate's
activation and its derivative change.

float16 and bfloat16: x and every weight and bias are cast up to float32 at the top, the whole
network (the three matmuls, the gate, the product) and its backward run there as for float32, and
out and each gradient are rounded once to x's dtype. PyTorch's LlamaMLP in bfloat16 rounds after
each of its five ops (each one computing in float32 inside, docs/precision.md); rounding once is
at least as accurate, and the float32 cache costs the (..., H) activations twice their bytes.
SiLU on its own computes in float32 and rounds once, as F.silu does.
"""

from functools import partial

import numpy as np

from numpy_attn._checks import check_dout, check_float, check_rng, check_same_dtype, upcast
from numpy_attn._tree import tree_map
from numpy_attn.gelu import gelu_backward, gelu_forward
from numpy_attn.linear import linear_backward, linear_forward


def init_swiglu_params(C, H, rng, bias=False, dtype=np.float32):
    """{"gate": {"w": (C, H)}, "up": {"w": (C, H)}, "down": {"w": (H, C)}}, with "b" each if ``bias``.

    Drawn like ``torch.nn.Linear``'s default: every entry U(-1/sqrt(C_in), 1/sqrt(C_in)).
    """
    check_rng(rng, "init_swiglu_params")
    params = {}
    for name, C_in, C_out in (("gate", C, H), ("up", C, H), ("down", H, C)):
        bound = 1 / np.sqrt(C_in)
        params[name] = {"w": rng.uniform(-bound, bound, (C_in, C_out)).astype(dtype)}
        if bias:
            params[name]["b"] = rng.uniform(-bound, bound, (C_out,)).astype(dtype)
    return params


def sigmoid(x):
    """1 / (1 + exp(-x)), from exp(-|x|) so that no exponential overflows."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def silu_forward(x):
    """SiLU (swish) x * sigmoid(x): (...) -> (...). The cache is ``(x, sigmoid(x), x's dtype)``, x
    and sigmoid(x) in the dtype computed in (float32 for float16 and bfloat16)."""
    check_float("x", x)
    xf = upcast(x)                                   # (...) float32 for float16 and bfloat16
    s = sigmoid(xf)
    out = xf * s
    cache = (xf, s, x.dtype)
    return out.astype(x.dtype, copy=False), cache   # rounded once to x's dtype


def silu_backward(dout, cache):
    """Gradient of SiLU: dout (...) -> dx (...)."""
    x, s, x_dtype = cache
    check_dout("silu", dout, x.shape, x_dtype)
    # Undoes out = x * s(x): the product rule, with s' = s (1 - s).
    dx = upcast(dout) * s * (1 + x * (1 - s))
    return dx.astype(x_dtype, copy=False)           # rounded once to x's dtype


# The gate's activation, forward and backward: SiLU for SwiGLU (Llama), the tanh GELU for GeGLU (Gemma).
GATE_ACTIVATIONS = {
    "silu": (silu_forward, silu_backward),
    "gelu_tanh": (partial(gelu_forward, approximate="tanh"), gelu_backward),
}


def swiglu_forward(x, params, act="silu"):
    """SwiGLU network on x (..., C), params as from init_swiglu_params -> (..., C).

    ``act`` is the gate's activation: "silu" (SwiGLU) or "gelu_tanh" (GeGLU). Returns
    ``(out, cache)``; the cache holds the three linear caches, the activation's, g's activation
    s and u (the backward multiplies each by the other's gradient), ``act`` and x's dtype.
    """
    _check_swiglu(x, params, act)
    x_dtype = x.dtype
    x, params = upcast(x), tree_map(upcast, params)                   # float32 for float16 and bfloat16
    g, gate_cache = linear_forward(x, **params["gate"])               # (..., C) -> (..., H)
    u, up_cache = linear_forward(x, **params["up"])                   # (..., C) -> (..., H)
    s, silu_cache = GATE_ACTIVATIONS[act][0](g)                       # (..., H), silu(g) or gelu_tanh(g)
    a = s * u                                                         # (..., H)
    out, down_cache = linear_forward(a, **params["down"])             # (..., H) -> (..., C)
    cache = (gate_cache, up_cache, silu_cache, s, u, down_cache, act, x_dtype)
    return out.astype(x_dtype, copy=False), cache                     # rounded once to x's dtype


def swiglu_backward(dout, cache):
    """Gradients: dout (..., C) -> (dx (..., C), {"gate", "up", "down"} like the params)."""
    gate_cache, up_cache, silu_cache, s, u, down_cache, act, x_dtype = cache
    check_dout("swiglu", dout, s.shape[:-1] + down_cache.w.shape[1:], x_dtype)
    dout = upcast(dout)                                               # float32 for float16 and bfloat16
    # Undoes out = a @ down.w.
    da, ddown = linear_backward(dout, down_cache)                     # (..., C) -> (..., H)
    # Undoes a = s * u.
    ds = da * u                                                       # (..., H)
    du = da * s                                                       # (..., H)
    # Undoes s = silu(g) (or gelu_tanh(g)).
    dg = GATE_ACTIVATIONS[act][1](ds, silu_cache)                     # (..., H)
    # Undoes u = x @ up.w and g = x @ gate.w: x fed both, so the two gradients add.
    dx_up, dup = linear_backward(du, up_cache)                        # (..., H) -> (..., C)
    dx_gate, dgate = linear_backward(dg, gate_cache)                  # (..., H) -> (..., C)
    dx = dx_gate + dx_up
    grads = {"gate": dgate, "up": dup, "down": ddown}
    # Each gradient rounded once to the inputs' dtype (no copy for float32 and float64).
    return dx.astype(x_dtype, copy=False), tree_map(lambda g: g.astype(x_dtype, copy=False), grads)


def _check_swiglu(x, params, act="silu"):
    check_float("x", x)
    if not isinstance(act, str) or act not in GATE_ACTIVATIONS:
        raise ValueError(f"act must be one of {sorted(GATE_ACTIVATIONS)}, got {act!r}")
    if not isinstance(params, dict) or set(params) != {"gate", "up", "down"}:
        got = sorted(params) if isinstance(params, dict) else type(params).__name__
        raise ValueError(f"params must be a dict with keys 'gate', 'up', 'down', got {got}")
    weights = {name: p.get("w") if isinstance(p, dict) else p for name, p in params.items()}
    for name, w in weights.items():
        check_float(f"{name}.w", w)
    C = x.shape[-1] if x.ndim else None
    H = weights["gate"].shape[-1] if weights["gate"].ndim else None
    expected = {"gate": (C, H), "up": (C, H), "down": (H, C)}
    for name, shape in expected.items():
        if weights[name].shape != shape:
            raise ValueError(f"{name}.w must have shape {shape} for x {x.shape}, got {weights[name].shape}")
    # Refused here, as linear would (the same message), for the forward casts up before linear sees them.
    for p in params.values():
        check_same_dtype(x=x, w=p["w"], b=p.get("b"))
