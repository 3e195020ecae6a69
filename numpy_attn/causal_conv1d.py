"""The short causal depthwise convolution over time, and its backward: the mixing of a few
neighbouring tokens that Gated DeltaNet and Kimi Delta Attention put on q, k and v before the
delta rule.

    y[b, t, c]   = bias[c] + sum over k = 0 .. K-1 of  w[c, k] * x[b, t - (K-1) + k, c]
    out[b, t, c] = silu(y[b, t, c])                     (or y itself without an activation)

Each channel c has its own K taps (depthwise: no channel sees another), and tap k reads the input
K-1-k steps back, so no output sees a later input (causal). Inputs before the first step are the
``state``: the last K-1 inputs of the text before x, or zeros at the start of a sequence. The
forward hands on the last K-1 inputs it saw as the next state, so that a prefill followed by one
token at a time gives the full forward's outputs (as the key/value cache does for attention).
Yang, Kautz and Hatamizadeh, "Gated Delta Networks" (2024), after Mamba's short convolution
(Gu and Dao, "Mamba", 2023); K = 4 in Qwen3.5, Qwen3-Next, OLMo Hybrid and Kimi Linear.

Layout. x and out are (B, T, C) as everywhere here and the weight (C, K), as Hugging Face's
``causal_conv1d_fn`` and ``causal_conv1d_update`` take it (``conv1d.weight.squeeze(1)``); those take
x as (B, C, T), the layout of ``nn.Conv1d``. The state is (B, C, K-1), theirs (B, C, K) in the
model's cache, whose first column no output reads. The sum runs over the K taps one shifted slice
at a time: K is 4, and C and T stay whole in every product.

Backward. Tap k multiplied the slice xp[:, k:k+T] by w[:, k], so it sends dy * w[:, k] back to
that slice and sum(dy * xp[:, k:k+T]) to w[:, k]; the slices overlap, and the gradient of each
input is the sum over the taps that read it. The padded rows' gradient is the state's. The
backward takes the gradient of out only: the state handed on is for decoding.

float16 and bfloat16: the inputs are cast up to float32, the convolution and SiLU run there, and
out, the state and each gradient are rounded once (Hugging Face's fallback rounds after the
convolution and again after SiLU).
"""

from typing import NamedTuple

import numpy as np

from numpy_attn._checks import check_dout, check_float, check_same_dtype, upcast
from numpy_attn.swiglu import silu_backward, silu_forward


class CausalConv1dCache(NamedTuple):
    """The padded input and the weight (each tap's gradient needs the other), SiLU's cache (None
    without the activation), whether a bias and a state were given, and x's dtype."""

    xp: np.ndarray
    w: np.ndarray
    silu: tuple | None
    has_bias: bool
    has_state: bool
    x_dtype: np.dtype


def causal_conv1d_forward(x, w, b=None, state=None, activation=None):
    """Causal depthwise convolution of x (B, T, C) with w (C, K), bias b (C,), past inputs
    ``state`` (B, C, K-1) (None: zeros, the start of a sequence) and ``activation`` None or "silu".

    Returns ``(out (B, T, C), new_state (B, C, K-1), cache)``: new_state holds the last K-1
    inputs, the state of the next call.
    """
    _check_causal_conv1d(x, w, b, state, activation)
    x_dtype = x.dtype
    x, w, b, state = upcast(x), upcast(w), upcast(b), upcast(state)    # float32 for float16 and bfloat16
    B, T, C = x.shape
    K = w.shape[1]
    # The K-1 inputs before x: the state, or zeros at the start of a sequence.
    past = np.zeros((B, K - 1, C), x.dtype) if state is None else state.swapaxes(1, 2)   # (B, C, K-1) -> (B, K-1, C)
    xp = np.concatenate([past, x], axis=1)                   # (B, K-1+T, C): input t at row K-1+t
    # Tap k reads the input K-1-k steps back: the slice of T rows starting at row k.
    y = sum(xp[:, k:k + T, :] * w[:, k] for k in range(K))   # (B, T, C) * (C,), summed over the taps
    if b is not None:
        y = y + b                                            # (B, T, C) + (C,)
    out, silu_cache = silu_forward(y) if activation == "silu" else (y, None)
    new_state = xp[:, T:, :].swapaxes(1, 2)                  # (B, K-1, C) -> (B, C, K-1), the last K-1 inputs
    cache = CausalConv1dCache(xp, w, silu_cache, b is not None, state is not None, x_dtype)
    # Each rounded once to x's dtype; the state a copy, so that the caller's changes miss the cache.
    return out.astype(x_dtype, copy=False), new_state.astype(x_dtype), cache


def causal_conv1d_backward(dout, cache):
    """Gradients: dout (B, T, C) -> (dx (B, T, C), {"w": dw (C, K), "b": db (C,)}, dstate (B, C, K-1)).

    The dict has a "b" only if the forward had a bias; dstate is None if it had no state.
    """
    xp, w, silu_cache, has_bias, has_state, x_dtype = cache
    C, K = w.shape
    B, T = xp.shape[0], xp.shape[1] - (K - 1)
    check_dout("causal_conv1d", dout, (B, T, C), x_dtype)
    dout = upcast(dout)                                      # float32 for float16 and bfloat16
    # Undoes out = silu(y).
    dy = silu_backward(dout, silu_cache) if silu_cache is not None else dout
    # Undoes y = y + b: every step added the same b.
    db = dy.sum(axis=(0, 1)) if has_bias else None           # (B, T, C) -> (C,)
    # Undoes y = sum of xp[:, k:k+T] * w[:, k]: tap k's weight gathers dy times the slice it read,
    # and the slice gets dy * w[:, k] back at its own rows (padded to xp's K-1+T rows).
    dw = np.stack([(dy * xp[:, k:k + T, :]).sum(axis=(0, 1)) for k in range(K)], axis=1)   # (C, K)
    dxp = sum(np.pad(dy * w[:, k], ((0, 0), (k, K - 1 - k), (0, 0))) for k in range(K))     # (B, K-1+T, C)
    # Undoes xp = concatenate([past, x]): the first K-1 rows were the state's.
    dx = dxp[:, K - 1:, :]                                   # (B, T, C)
    dstate = dxp[:, :K - 1, :].swapaxes(1, 2) if has_state else None   # (B, K-1, C) -> (B, C, K-1)
    grads = {"w": dw} if db is None else {"w": dw, "b": db}
    # Each gradient rounded once to the inputs' dtype (one dtype for all).
    rounded = {name: g.astype(x_dtype, copy=False) for name, g in grads.items()}
    return dx.astype(x_dtype, copy=False), rounded, None if dstate is None else dstate.astype(x_dtype)


def _check_causal_conv1d(x, w, b, state, activation):
    check_float("x", x)
    check_float("w", w)
    if x.ndim != 3:
        raise ValueError(f"x must have shape (B, T, C), got {x.shape}")
    C = x.shape[2]
    if w.ndim != 2 or w.shape[0] != C or w.shape[1] < 1:
        raise ValueError(f"w must have shape (C, K) = ({C}, K) with K >= 1 to match x {x.shape}, got {w.shape}")
    K = w.shape[1]
    if b is not None:
        check_float("b", b)
        if b.shape != (C,):
            raise ValueError(f"b must have shape ({C},) to match x {x.shape}, got {b.shape}")
    if state is not None:
        check_float("state", state)
        if state.shape != (x.shape[0], C, K - 1):
            raise ValueError(f"state must have shape (B, C, K-1) = {(x.shape[0], C, K - 1)} to match x "
                             f"{x.shape} and w {w.shape}, got {state.shape}")
    check_same_dtype(x=x, w=w, b=b, state=state)
    if activation is not None and activation != "silu":
        raise ValueError(f"activation must be None or 'silu', got {activation!r}")
