"""The gated RMS norm after the delta rule: an RMS norm of each head's output, then a gate from the
input, and its backward.

    n   = rms_norm(x) * w             over the last axis (numpy_attn/rms_norm.py)
    out = n * act(z)                  act = silu (Qwen3.5, Qwen3-Next, OLMo Hybrid) or sigmoid (Kimi Linear)

Yang, Kautz and Hatamizadeh, "Gated Delta Networks" (2024): the delta rule's output o (per head,
(..., hv)) is normed and then gated by z, a projection of the block's input (norm before gate).
Hugging Face's ``Qwen3_5RMSNormGated`` gates with SiLU, ``KimiLinearRMSNormGated`` with the sigmoid;
both norm with the weight w stored as itself (it starts at 1) and eps inside the square root.

Backward: the product rule gives dn = dout * act(z) and dact = dout * n; act's backward turns the
second into dz; rms_norm's backward turns the first into dx and dw.

Precision. For float32 and float64 the two modules' orders agree with ours, but both compute in
float32 whatever x's dtype: in float64 they keep float32's digits only, which we do not.
float16 and bfloat16 (x and z cast up to float32, the gate in float32, the result rounded once to
x's dtype, as both modules do; they differ in the norm). ``Qwen3_5RMSNormGated`` normalises in
float32, rounds xhat to x's dtype, multiplies by w in that dtype (rounded again), and only then
multiplies by the float32 gate: ``round_norm=True``, rms_norm_forward in x's dtype (Llama's order).
``KimiLinearRMSNormGated`` casts w up too and keeps n in float32 to the end: ``round_norm=False``,
rms_norm_forward on the float32 casts. The backward follows: with ``round_norm`` dn is rounded to
x's dtype before rms_norm's backward, as autograd rounds the gradient of a cast.
"""

from typing import NamedTuple

from numpy_attn._checks import check_dout, check_float, check_same_dtype, upcast
from numpy_attn.rms_norm import rms_norm_backward, rms_norm_forward
from numpy_attn.swiglu import sigmoid, silu_backward, silu_forward


class GatedRMSNormCache(NamedTuple):
    """The RMS norm's cache, the gate's, n and act(z) in the dtype computed in (each is the other's
    factor in the product's gradient), the gate's name, whether n was rounded, and x's dtype."""

    norm: tuple
    gate: tuple
    n: object
    g: object
    act: str
    round_norm: bool
    x_dtype: object


def _sigmoid_forward(z):
    """sigmoid(z), cached for its backward: (...) -> (...)."""
    s = sigmoid(z)
    return s, s


def _sigmoid_backward(dout, s):
    """sigmoid' = s (1 - s): dout (...) -> dz (...)."""
    return dout * s * (1 - s)


# The gate's activation, forward and backward: SiLU for Qwen3.5, the sigmoid for Kimi Linear.
GATES = {
    "silu": (silu_forward, silu_backward),
    "sigmoid": (_sigmoid_forward, _sigmoid_backward),
}


def gated_rms_norm_forward(x, z, w, eps=1e-6, act="silu", round_norm=True):
    """rms_norm(x) * w * act(z) over the last axis of x and z (..., C), w (C,) -> (..., C).

    ``act`` "silu" (Qwen3.5) or "sigmoid" (Kimi Linear); ``round_norm=False`` keeps rms_norm(x) * w
    in float32 for float16 and bfloat16 x, as Kimi Linear does (no effect on float32 and float64).
    Returns ``(out, cache)``.
    """
    _check_gated_rms_norm(x, z, w, act, round_norm)
    x_dtype = x.dtype
    # Qwen3.5 rounds the norm to x's dtype before the gate, Kimi Linear does not (a no-op for float32 and float64).
    n, norm_cache = rms_norm_forward(x, w, eps) if round_norm else rms_norm_forward(upcast(x), upcast(w), eps)
    n = upcast(n)                                         # (..., C) float32 for float16 and bfloat16
    g, gate_cache = GATES[act][0](upcast(z))              # (..., C), silu(z) or sigmoid(z)
    out = n * g                                           # (..., C), norm before gate
    cache = GatedRMSNormCache(norm_cache, gate_cache, n, g, act, round_norm, x_dtype)
    return out.astype(x_dtype, copy=False), cache         # rounded once to x's dtype


def gated_rms_norm_backward(dout, cache):
    """Gradients: dout (..., C) -> (dx (..., C), dz (..., C), {"w": dw (C,)})."""
    norm_cache, gate_cache, n, g, act, round_norm, x_dtype = cache
    check_dout("gated_rms_norm", dout, n.shape, x_dtype)
    dout = upcast(dout)                                   # float32 for float16 and bfloat16
    # Undoes out = n * g.
    dn = dout * g                                         # (..., C)
    dg = dout * n                                         # (..., C)
    # Undoes g = act(z).
    dz = GATES[act][1](dg, gate_cache)                    # (..., C)
    # Undoes n = rms_norm(x) * w; with round_norm, n was rounded to x's dtype, and so is dn.
    dx, dparams = rms_norm_backward(dn.astype(x_dtype, copy=False) if round_norm else dn, norm_cache)
    # Each gradient rounded once to x's dtype (no copy for float32 and float64).
    return dx.astype(x_dtype, copy=False), dz.astype(x_dtype, copy=False), \
        {"w": dparams["w"].astype(x_dtype, copy=False)}


def _check_gated_rms_norm(x, z, w, act, round_norm):
    """Raise on a z unlike x or an unknown gate (rms_norm_forward checks x, w and eps)."""
    check_float("x", x)
    check_float("z", z)
    check_float("w", w)
    if z.shape != x.shape:
        raise ValueError(f"z must have x's shape {x.shape}, got {z.shape}")
    # Checked before the casts up (Kimi Linear's order would hide a float32 w beside a bfloat16 x).
    check_same_dtype(x=x, z=z, w=w)
    if not isinstance(act, str) or act not in GATES:
        raise ValueError(f"act must be one of {sorted(GATES)}, got {act!r}")
    if not isinstance(round_norm, bool):
        raise TypeError(f"round_norm must be a bool, got {type(round_norm).__name__} {round_norm!r}")
