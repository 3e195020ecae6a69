"""Scaled dot-product attention in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/attention.py: scores = (q * scale) @ k^T + mask, weights = softmax(scores),
out = dropout(weights) @ v, with the same masks (bool True = may attend, float added, is_causal
top-left aligned), grouped-query heads and fully masked rows giving zeros. Instead of ``rng`` it
takes ``keep``, the NumPy twin's ``cache.keep``, so that both drop exactly the same weights.
Returns ``(out, weights)``, the weights after softmax and before dropout, as ``cache.weights``.
"""

import math

import torch

from torch_attn.softmax import softmax


def scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=False, scale=None,
                                 dropout_p=0.0, keep=None):
    """Attention of q (..., T, hs) over k (..., S, hs), v (..., S, hv) -> (out (..., T, hv), weights (..., T, S))."""
    T, hs = q.shape[-2:]
    S, hv = v.shape[-2:]
    g = q.shape[-3] // k.shape[-3] if q.shape[:-2] != k.shape[:-2] else 1   # query heads per key head
    scale = 1 / math.sqrt(hs) if scale is None else scale
    q_scaled = (q * scale).reshape(k.shape[:-2] + (g * T, hs))   # (..., nh, T, hs) -> (..., nkv, g*T, hs)
    scores = q_scaled @ k.transpose(-1, -2)                       # (..., nkv, g*T, S)
    scores = scores.reshape(q.shape[:-1] + (S,))                  # (..., nkv, g*T, S) -> (..., nh, T, S)
    if is_causal:
        attn_mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril()   # (T, S): query t sees keys 0..t
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attn_mask, -torch.inf)
    elif attn_mask is not None:
        scores = scores + attn_mask
    weights = softmax(scores)                                     # (..., nh, T, S); all -inf row -> 0
    keep_scale = 1 / (1 - dropout_p)
    dropped = weights
    if dropout_p > 0:
        dropped = weights * keep * keep_scale                     # keep: the NumPy twin's keep-mask
    out = dropped.reshape(k.shape[:-2] + (g * T, S)) @ v          # (..., nh, T, S) -> (..., nkv, g*T, hv)
    out = out.reshape(q.shape[:-1] + (hv,))                       # (..., nkv, g*T, hv) -> (..., nh, T, hv)
    return out, weights


# Equals torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal,
# scale=scale, enable_gqa=True) (its output; enable_gqa only where k, v have fewer heads than q;
# with dropout only in distribution, as the built-in draws its own mask).
