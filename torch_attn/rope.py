"""Rotary position embedding (RoPE) in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/rope.py: channel pair j turned by the angle p * f_j at position p, the pairs
chosen by ``layout`` ("half": j and j + hs/2, as Hugging Face's ``rotate_half``; "interleaved":
2j and 2j + 1, as Meta's original code), the frequencies scaled by ``scaling`` (None, linear or
llama3, in the form of Hugging Face's ``rope_parameters``). Angles in float64, cos and sin
rounded once to x's dtype.
"""

import math

import torch


def rope_frequencies(hs, theta=10000.0, scaling=None):
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
    return inv_freq


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


def rope(x, positions, theta=10000.0, layout="half", scaling=None):
    """Rotate x (..., T, hs) by its integer ``positions`` (T,) or (..., T) -> (..., T, hs)."""
    T, hs = x.shape[-2:]
    inv_freq = rope_frequencies(hs, theta, scaling).to(x.device)    # (hs/2,)
    angles = positions[..., None] * inv_freq                        # (..., T) -> (..., T, hs/2), float64
    cos = torch.cos(angles).to(x.dtype)                             # (..., T, hs/2)
    sin = torch.sin(angles).to(x.dtype)                             # (..., T, hs/2)
    x_a, x_b = _pairs(x, layout)                                    # (..., T, hs) -> 2 x (..., T, hs/2)
    out_a = x_a * cos - x_b * sin
    out_b = x_b * cos + x_a * sin
    out = _join(out_a, out_b, layout)                               # 2 x (..., T, hs/2) -> (..., T, hs)
    return out


# No PyTorch built-in. With layout="half" it equals Hugging Face's
# transformers.models.llama.modeling_llama.apply_rotary_pos_emb with cos, sin = cat(cos, cos),
# cat(sin, sin); parity_tests/test_rope.py checks that and LlamaRotaryEmbedding's frequencies.
