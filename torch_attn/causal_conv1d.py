"""The short causal depthwise convolution over time in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/causal_conv1d.py: y[t] = b + sum over the K taps of w[:, k] * x[t - (K-1) + k],
per channel, the inputs before x taken from ``state`` (B, C, K-1) or zeros, then SiLU if asked;
returns the output and the last K-1 inputs, the next state. float16 and bfloat16 computed in
float32 and rounded once, as there.
"""

import torch

from torch_attn._opmath import upcast
from torch_attn.swiglu import silu


def causal_conv1d(x, w, b=None, state=None, activation=None):
    """Causal depthwise convolution of x (B, T, C) with w (C, K) -> (out (B, T, C), new_state (B, C, K-1))."""
    x_dtype = x.dtype
    x, w, b, state = upcast(x), upcast(w), upcast(b), upcast(state)    # float32 for float16 and bfloat16
    B, T, C = x.shape
    K = w.shape[1]
    # The K-1 inputs before x: the state, or zeros at the start of a sequence.
    past = x.new_zeros((B, K - 1, C)) if state is None else state.transpose(1, 2)   # (B, C, K-1) -> (B, K-1, C)
    xp = torch.cat([past, x], dim=1)                         # (B, K-1+T, C): input t at row K-1+t
    # Tap k reads the input K-1-k steps back: the slice of T rows starting at row k.
    y = sum(xp[:, k:k + T, :] * w[:, k] for k in range(K))   # (B, T, C) * (C,), summed over the taps
    if b is not None:
        y = y + b                                            # (B, T, C) + (C,)
    out = silu(y) if activation == "silu" else y
    new_state = xp[:, T:, :].transpose(1, 2)                 # (B, K-1, C) -> (B, C, K-1), the last K-1 inputs
    return out.to(x_dtype), new_state.to(x_dtype)            # each rounded once to x's dtype


# Equals F.conv1d(x.transpose(1, 2), w.unsqueeze(1), b, padding=K-1, groups=C)[..., :T] transposed
# back (without a state), and Hugging Face's causal_conv1d_fn and causal_conv1d_update of Qwen3.5
# and Kimi Linear (x as (B, C, T)); parity_tests/test_causal_conv1d.py checks it.
