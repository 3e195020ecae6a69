"""Multi-head attention in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/multi_head.py: project x (and kv for cross-attention) with the same parameter
dicts, split into heads, attend with torch_attn.attention, merge the heads, project back. Takes
``keep`` (the NumPy twin's ``cache.attention.keep``) instead of ``rng``. Returns ``(out, weights)``
like ``torch.nn.MultiheadAttention``, the weights (B, nh, T, S) as ``cache.weights``. Grouped-query
heads come from k and v weights of nkv * hs columns; ``kv_cache`` (one layer's view of
torch_attn/kv_cache.py's cache) holds past tokens' keys and values for decoding.
"""

from torch_attn.attention import scaled_dot_product_attention
from torch_attn.kv_cache import kv_cache_update
from torch_attn.linear import linear


def split_heads(x, num_heads):
    """(B, T, C) -> (B, nh, T, hs)."""
    B, T, C = x.shape
    x = x.reshape(B, T, num_heads, C // num_heads)               # (B, T, C) -> (B, T, nh, hs)
    return x.transpose(1, 2)                                      # (B, T, nh, hs) -> (B, nh, T, hs)


def merge_heads(x):
    """(B, nh, T, hs) -> (B, T, C)."""
    B, nh, T, hs = x.shape
    x = x.transpose(1, 2)                                         # (B, nh, T, hs) -> (B, T, nh, hs)
    return x.reshape(B, T, nh * hs)                               # (B, T, nh, hs) -> (B, T, C)


def multi_head_attention(x, params, num_heads, *, attn_mask=None, is_causal=False, dropout_p=0.0,
                         keep=None, kv=None, kv_cache=None):
    """Multi-head attention of x (B, T, C) over itself or kv (B, S, C) -> (out (B, T, C), weights (B, nh, T, S))."""
    B, T, C = x.shape
    src = x if kv is None else kv                                 # (B, S, C), S = T for self-attention
    q = linear(x, **params["q"])                                  # (B, T, C)
    k = linear(src, **params["k"])                                # (B, S, C)
    v = linear(src, **params["v"])                                # (B, S, C)
    q = split_heads(q, num_heads)                                 # (B, T, C) -> (B, nh, T, hs)
    num_kv_heads = k.shape[-1] // (C // num_heads)   # fewer than num_heads: grouped-query heads
    k = split_heads(k, num_kv_heads)                              # (B, S, nkv*hs) -> (B, nkv, S, hs)
    v = split_heads(v, num_kv_heads)                              # (B, S, nkv*hs) -> (B, nkv, S, hs)
    if kv_cache is not None:   # decoding: the past tokens' keys and values come from the cache
        k, v = kv_cache_update(kv_cache, k, v)                    # (B, nkv, T, hs) -> (B, nkv, past + T, hs)
    y, weights = scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p, keep=keep)   # (B, nh, T, hs)
    y = merge_heads(y)                                            # (B, nh, T, hs) -> (B, T, C)
    out = linear(y, **params["o"])                                # (B, T, C)
    return out, weights


# Equals torch.nn.MultiheadAttention(C, num_heads, bias=..., batch_first=True) with in_proj_weight
# = cat([Wq.T, Wk.T, Wv.T]) and out_proj.weight = Wo.T, called (x, kv, kv) with attn_mask = ~ours
# and average_attn_weights=False (its weights; the average over heads with True).
