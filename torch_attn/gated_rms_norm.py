"""The gated RMS norm after the delta rule in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/gated_rms_norm.py: out = rms_norm(x) * w * act(z) over the last axis, act SiLU
(Qwen3.5) or the sigmoid (Kimi Linear); float16 and bfloat16 gated in float32 and rounded once,
the norm rounded to x's dtype first with ``round_norm`` (Qwen3.5), kept in float32 without (Kimi).
"""

from torch import sigmoid

from torch_attn._opmath import upcast
from torch_attn.rms_norm import rms_norm
from torch_attn.swiglu import silu

# The gate's activation: SiLU for Qwen3.5, the sigmoid for Kimi Linear: torch's sigmoid, not
# swiglu.py's: autograd through that one's exp(-|z|) takes abs's slope 0 at z = 0, and sigmoid'(0)
# would come out 0 instead of 1/4 (SiLU's z * sigmoid(z) multiplies that slope by z = 0).
GATES = {
    "silu": silu,
    "sigmoid": sigmoid,
}


def gated_rms_norm(x, z, w, eps=1e-6, act="silu", round_norm=True):
    """rms_norm(x) * w * act(z) over the last axis of x and z (..., C), w (C,) -> (..., C)."""
    x_dtype = x.dtype
    # Qwen3.5 rounds the norm to x's dtype before the gate, Kimi Linear does not (a no-op for float32 and float64).
    n = rms_norm(x, w, eps) if round_norm else rms_norm(upcast(x), upcast(w), eps)
    n = upcast(n)                                         # (..., C) float32 for float16 and bfloat16
    g = GATES[act](upcast(z))                             # (..., C), silu(z) or sigmoid(z)
    out = n * g                                           # (..., C), norm before gate
    return out.to(x_dtype)                                # rounded once to x's dtype


# Equals Hugging Face's Qwen3_5RMSNormGated (act="silu") and KimiLinearRMSNormGated (act="sigmoid",
# round_norm=False) holding w, for float32 x (both compute in float32 whatever x's dtype), and
# F.rms_norm(x, (C,), w, eps) * F.silu(z) or * torch.sigmoid(z); parity_tests/test_gated_rms_norm.py
# checks it.
