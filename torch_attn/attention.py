"""Scaled dot-product attention in plain PyTorch; autograd supplies the backward.

out = dropout(softmax((q * scale) @ k^T + attn_mask)) @ v. Twin of numpy_attn/attention.py, with
the same arguments, except that instead of ``rng`` it takes ``keep``, the NumPy twin's
``cache.keep``, so that both drop exactly the same weights. Returns ``(out, weights)``, the weights
after softmax and before dropout, as ``cache.weights``; with ``return_lse=True`` also each row's
log-sum-exp, as ``cache.lse``. float16 and bfloat16 compute in float32 and round out and the
weights once, as the NumPy twin does.
"""

import math

import torch

from torch_attn._opmath import upcast
from torch_attn.dropout import dropout
from torch_attn.masks import causal_mask
from torch_attn.softmax import softmax


def scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=False, scale=None,
                                 dropout_p=0.0, keep=None, return_lse=False):
    """out = dropout(softmax((q * scale) @ k^T + attn_mask)) @ v: q (..., T, hs), k (..., S, hs),
    v (..., S, hv) -> (out (..., T, hv), weights (..., T, S)[, lse (..., T)])."""
    T, hs = q.shape[-2:]
    S, hv = v.shape[-2:]
    dtype = q.dtype                                               # out's: float16 and bfloat16 compute in float32
    q, k, v = upcast(q), upcast(k), upcast(v)                     # float32 copies for float16 and bfloat16
    scale = 1 / math.sqrt(hs) if scale is None else scale
    # g query heads per key/value head: more than one with grouped-query heads
    g = q.shape[-3] // k.shape[-3] if min(q.ndim, k.ndim) >= 3 and q.shape[-3] > k.shape[-3] > 1 else 1
    if g > 1:   # grouped-query: repeat key/value head j for its query heads j*g .. j*g+g-1
        # (..., nkv, S, .) -> (..., nh, S, .)
        k, v = torch.repeat_interleave(k, g, dim=-3), torch.repeat_interleave(v, g, dim=-3)
    if is_causal:   # (T, S): query t sees keys 0..t, or 0..S-T+t aligned bottom-right
        attn_mask = causal_mask(T, S, "bottom_right" if is_causal == "bottom_right" else "top_left", device=q.device)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.where(attn_mask, 0, -torch.inf).to(q.dtype)   # False -> a score of -inf
    attn_mask = upcast(attn_mask)                                 # a float16/bfloat16 mask in float32: -inf stays -inf
    q_scaled = q * scale                                          # (..., nh, T, hs)
    scores = q_scaled @ k.transpose(-1, -2)                       # (..., nh, T, S)
    if attn_mask is not None:
        scores = scores + attn_mask
    weights = softmax(scores)                                     # (..., nh, T, S); all -inf row -> 0
    dropped = dropout(weights, dropout_p, mask=keep)              # (..., nh, T, S)
    out = dropped @ v                                             # (..., nh, T, hv)
    lse = _logsumexp(scores)                                      # (..., nh, T)
    if return_lse:
        return out.to(dtype), weights.to(dtype), lse              # lse stays float32, as cache.lse
    return out.to(dtype), weights.to(dtype)                       # rounded once to q's dtype


def _logsumexp(scores):
    """log sum exp of each row of scores (..., S) -> (...): -inf for a fully masked row, whose
    gradient is then 0 (torch.logsumexp's would be NaN there)."""
    empty = torch.isneginf(scores).all(dim=-1)                    # (...)
    return torch.where(empty, -torch.inf, torch.logsumexp(scores.masked_fill(empty[..., None], 0), dim=-1))


# Equals torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal,
# scale=scale, enable_gqa=True) (its output; enable_gqa only where k, v have fewer heads than q;
# with dropout only in distribution, as the built-in draws its own mask). Gemma 2's cap on the
# scores is a score modifier: flex_attention with soft_cap (torch_attn/flex_attention.py).
