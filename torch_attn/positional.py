"""Sinusoidal position encoding in plain PyTorch.

Twin of numpy_attn/positional.py: sin on even channels, cos on odd channels, computed in float64
and rounded once to ``dtype`` (float16 and bfloat16 too). Learned positions are ``embedding(torch.arange(T), wpe)``.
"""

import torch


def sinusoidal_encoding(T, C, base=10000.0, dtype=torch.float32):
    """The (T, C) sinusoidal table for positions 0..T-1."""
    t = torch.arange(T, dtype=torch.float64)[:, None]            # (T, 1)
    i2 = torch.arange(0, C, 2, dtype=torch.float64)              # (ceil(C/2),)
    inv_freq = base ** (-i2 / C)                                 # (ceil(C/2),)
    angle = t * inv_freq                                         # (T, ceil(C/2))
    pe = torch.zeros((T, C), dtype=torch.float64)                # (T, C)
    pe[:, 0::2] = torch.sin(angle)                               # even channels
    pe[:, 1::2] = torch.cos(angle[:, : C // 2])                  # odd channels
    return pe.to(dtype)


# PyTorch has no built-in; parity_tests/test_positional.py checks an element-by-element closed form.
