"""Scaled dot-product attention in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/attention.py: scores = (q * scale) @ k^T + mask, weights = softmax(scores),
out = dropout(weights) @ v, with an optional softcap c * tanh(scores / c) before the mask, the
same masks (bool True = may attend, float added, is_causal top-left aligned, or bottom-right with
is_causal="bottom_right", a sliding ``window`` of keys), grouped-query heads repeated at the
edge, batch axes that broadcast, fully masked rows giving zeros, and learned ``sinks`` (nh,): one
more softmax column per query head, dropped after the softmax.
Instead of ``rng`` it takes ``keep``, the NumPy twin's ``cache.keep``, so that both drop exactly
the same weights. Returns ``(out, weights)``, the weights after softmax and before dropout, as
``cache.weights``.
float16 and bfloat16 are cast up to float32 at the top and out and the weights rounded once at the
end, as the NumPy twin does; autograd then computes the backward in float32 and rounds each
gradient once at the cast.
"""

import math

import torch

from torch_attn._opmath import upcast
from torch_attn.dropout import dropout
from torch_attn.masks import causal_mask, sliding_window_mask
from torch_attn.softcap import logit_softcap
from torch_attn.softmax import softmax


def scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=False, scale=None,
                                 dropout_p=0.0, keep=None, softcap=None, window=None, sinks=None):
    """Attention of q (..., T, hs) over k (..., S, hs), v (..., S, hv) -> (out (..., T, hv), weights (..., T, S))."""
    T, hs = q.shape[-2:]
    S, hv = v.shape[-2:]
    dtype = q.dtype                                               # out's: float16 and bfloat16 compute in float32
    q, k, v, sinks = upcast(q), upcast(k), upcast(v), upcast(sinks)   # float32 copies for float16 and bfloat16
    scale = 1 / math.sqrt(hs) if scale is None else scale
    # g query heads per key/value head: more than one with grouped-query heads
    g = q.shape[-3] // k.shape[-3] if min(q.ndim, k.ndim) >= 3 and q.shape[-3] > k.shape[-3] > 1 else 1
    if g > 1:   # grouped-query: repeat key/value head j for its query heads j*g .. j*g+g-1
        # (..., nkv, S, .) -> (..., nh, S, .)
        k, v = torch.repeat_interleave(k, g, dim=-3), torch.repeat_interleave(v, g, dim=-3)
    if is_causal:   # (T, S): query t sees keys 0..t, or 0..S-T+t aligned bottom-right; a window keeps the last w
        align = "bottom_right" if is_causal == "bottom_right" else "top_left"
        attn_mask = (causal_mask(T, S, align, device=q.device) if window is None
                     else sliding_window_mask(T, S, window, align, device=q.device))
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.where(attn_mask, 0, -torch.inf).to(q.dtype)   # False -> a score of -inf
    attn_mask = upcast(attn_mask)                                 # a float16/bfloat16 mask in float32: -inf stays -inf
    q_scaled = q * scale                                          # (..., nh, T, hs)
    scores = q_scaled @ k.transpose(-1, -2)                       # (..., nh, T, S)
    if softcap is not None:   # Gemma 2: c * tanh(scores / c), before the mask (-inf stays -inf)
        scores = logit_softcap(scores, softcap)                   # (..., nh, T, S)
    if attn_mask is not None:
        scores = scores + attn_mask
    if sinks is not None:   # gpt-oss: head h's sink logit joins every row of its scores as column S
        sink_column = sinks[:, None, None].expand(scores.shape[:-1] + (1,))   # (nh,) -> (..., nh, T, 1)
        scores = torch.cat([scores, sink_column], dim=-1)         # (..., nh, T, S + 1)
    weights = softmax(scores)                                     # (..., nh, T, S[ + 1]); all -inf row -> 0
    if sinks is not None:   # the sink's weight is dropped: it takes a share of the row but has no value
        weights = weights[..., :-1]                               # (..., nh, T, S + 1) -> (..., nh, T, S)
    dropped = dropout(weights, dropout_p, mask=keep)              # (..., nh, T, S)
    out = dropped @ v                                             # (..., nh, T, hv)
    return out.to(dtype), weights.to(dtype)                       # rounded once to q's dtype


# Equals torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal,
# scale=scale, enable_gqa=True) (its output; enable_gqa only where k, v have fewer heads than q;
# with dropout only in distribution, as the built-in draws its own mask). With a softcap it equals
# torch.nn.attention.flex_attention.flex_attention with score_mod = c * tanh(score / c); with a
# window, F.scaled_dot_product_attention with transformers' sliding-window causal mask. With sinks
# it equals transformers' gpt-oss eager_attention_forward (its module.sinks), which has no built-in.
