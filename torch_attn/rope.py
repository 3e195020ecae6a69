"""Rotary position embedding (RoPE) in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/rope.py: channel pair j turned by the angle p * f_j at position p, the pairs
chosen by ``layout`` ("half": j and j + hs/2, as Hugging Face's ``rotate_half``; "interleaved":
2j and 2j + 1, as Meta's original code), the frequencies scaled by ``scaling`` (None, linear,
llama3, yarn or dynamic, in the form of Hugging Face's ``rope_parameters``), cos and sin
multiplied by YaRN's attention factor. Angles in float64, cos and sin rounded once to x's dtype;
for float16 and bfloat16 to float32, the rotation computed there and rounded once, as there.
"""

import math

import torch

from torch_attn._opmath import opmath, upcast


def rope_frequencies(hs, theta=10000.0, scaling=None, seq_len=None):
    """The inverse frequencies f_j (hs/2,) in float64, scaled as ``scaling`` says."""
    inv_freq = 1.0 / theta ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs)   # (hs/2,)
    rope_type = "default" if scaling is None else scaling.get("rope_type", "default")
    if rope_type == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif rope_type == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        L = scaling["original_max_position_embeddings"]
        wavelength = 2 * math.pi / inv_freq                         # (hs/2,)
        blend = torch.clip((L / wavelength - low) / (high - low), 0.0, 1.0)
        inv_freq = (1 - blend) * inv_freq / factor + blend * inv_freq
    elif rope_type == "yarn":
        factor, L = scaling["factor"], scaling["original_max_position_embeddings"]
        beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1
        low, high = (hs * math.log(L / (2 * math.pi * r)) / (2 * math.log(theta)) for r in (beta_fast, beta_slow))
        if scaling.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, hs - 1)
        high = high + 0.001 if high == low else high
        ramp = torch.clip((torch.arange(hs // 2, dtype=torch.float64) - low) / (high - low), 0.0, 1.0)   # (hs/2,)
        inv_freq = (1 - ramp) * inv_freq + ramp * inv_freq / factor
    elif rope_type == "dynamic":
        factor, L = scaling["factor"], scaling["original_max_position_embeddings"]
        seq_len = L if seq_len is None else max(seq_len, L)
        base = theta * (factor * seq_len / L - (factor - 1)) ** (hs / (hs - 2))
        inv_freq = 1.0 / base ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs)   # (hs/2,)
    return inv_freq


def rope_attention_factor(scaling=None):
    """The number cos and sin are multiplied by: YaRN's attention factor, 1.0 for the other kinds."""
    if scaling is None or scaling.get("rope_type", "default") != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor, mscale, mscale_all_dim = scaling["factor"], scaling.get("mscale"), scaling.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
    return _yarn_mscale(factor, 1.0)


def _yarn_mscale(factor, mscale):
    """YaRN's sqrt(1 / t) = 0.1 mscale ln(factor) + 1; 1 when the context is not stretched."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _pairs(x, layout):
    """The two halves (x_a, x_b) of every rotated pair: x (..., hs) -> two (..., hs/2)."""
    if layout == "half":
        hs = x.shape[-1]
        return x[..., : hs // 2], x[..., hs // 2:]
    return x[..., 0::2], x[..., 1::2]


def _join(a, b, layout):
    """The inverse of _pairs: two (..., hs/2) -> (..., hs)."""
    if layout == "half":
        return torch.cat([a, b], dim=-1)                            # (..., hs/2) x 2 -> (..., hs)
    return torch.stack([a, b], dim=-1).reshape(a.shape[:-1] + (2 * a.shape[-1],))   # a0 b0 a1 b1 ...


def rope(x, positions, theta=10000.0, layout="half", scaling=None, seq_len=None):
    """Rotate x (..., T, hs) by its integer ``positions`` (T,) or (..., T) -> (..., T, hs)."""
    T, hs = x.shape[-2:]
    if seq_len is None:                                             # only "dynamic" reads it
        seq_len = int(positions.max().clamp(min=0)) + 1
    inv_freq = rope_frequencies(hs, theta, scaling, seq_len).to(x.device)   # (hs/2,)
    attention_factor = rope_attention_factor(scaling)
    angles = positions[..., None] * inv_freq                        # (..., T) -> (..., T, hs/2), float64
    cos = (torch.cos(angles) * attention_factor).to(opmath(x.dtype))   # (..., T, hs/2), float32 for low x
    sin = (torch.sin(angles) * attention_factor).to(opmath(x.dtype))   # (..., T, hs/2)
    x_a, x_b = _pairs(upcast(x), layout)                                   # (..., T, hs) -> 2 x (..., T, hs/2)
    out_a = x_a * cos - x_b * sin
    out_b = x_b * cos + x_a * sin
    out = _join(out_a, out_b, layout)                               # 2 x (..., T, hs/2) -> (..., T, hs)
    return out.to(x.dtype)                                          # rounded once to x's dtype


# No PyTorch built-in. With layout="half" it equals Hugging Face's
# transformers.models.llama.modeling_llama.apply_rotary_pos_emb with cos, sin = cat(cos, cos),
# cat(sin, sin); parity_tests/test_rope.py checks that and LlamaRotaryEmbedding's frequencies, and
# the yarn and dynamic frequencies against transformers' ROPE_INIT_FUNCTIONS.
