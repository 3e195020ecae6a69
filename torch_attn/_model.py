"""The decoder shell every language model here shares, and the steps of its attention, in plain
PyTorch; autograd supplies the backward (numpy_attn/_model.py; autograd adds wte's two uses itself).

``decoder`` runs embedding, blocks, final norm and head around a family's block and takes what
differs as arguments, as the NumPy twin's ``decoder_forward``.
"""

from collections.abc import Callable
from typing import NamedTuple

import torch

from torch_attn import softcap
from torch_attn.attention import scaled_dot_product_attention
from torch_attn.attention_sinks import attention_sinks
from torch_attn.embedding import embedding
from torch_attn.flex_attention import flex_attention, soft_cap
from torch_attn.kv_cache import init_kv_cache, kv_cache_update
from torch_attn.linear import linear
from torch_attn.masks import causal_mask, sliding_window_mask
from torch_attn.multi_head import merge_heads, split_heads
from torch_attn.rms_norm import rms_norm
from torch_attn.rope import rope

# -- the decoder shell ----------------------------------------------------------------------------

def decoder(ids, params, config, block, *, positions, attn_mask, kv_cache, logits_to_keep=None,
            embed_scale=None, norm_offset=0.0, norm_round_xhat=True, logit_softcap=None, layer_options=None,
            padding_idx=None):
    """Logits for integer ``ids`` (B, T) -> (B, N, V); ``block(x, params, config, positions, *,
    attn_mask, kv_cache, **layer_options(i))`` makes block i; the rest as decoder_forward's."""
    B, T = ids.shape
    past = 0 if kv_cache is None else kv_cache.length                         # tokens already cached
    positions = torch.arange(past, past + T, device=ids.device) if positions is None else positions
    wte = params["wte"]
    # Causal, aligned bottom-right (the T new tokens follow the past ones); one mask with the caller's.
    attn_mask = None if attn_mask is None else attn_mask & causal_mask(T, past + T, "bottom_right", device=ids.device)
    # 1: token embedding (positions enter through RoPE inside attention)
    x = embedding(ids, wte, padding_idx)                                      # (B, T) -> (B, T, C)
    if embed_scale is not None:   # Gemma: times sqrt(C), rounded to the model's dtype first
        x = x * torch.tensor(embed_scale, dtype=x.dtype)                      # (B, T, C)
    # 2: the blocks, in order; each reads and appends to its own layer of the cache
    for i in range(config.n_layer):
        layer_cache = None if kv_cache is None else kv_cache.layer(i)
        options = {} if layer_options is None else layer_options(i)
        x = block(x, params["blocks"][str(i)], config, positions,
                  attn_mask=attn_mask, kv_cache=layer_cache, **options)
    # 3: final RMS norm
    x = rms_norm(x, params["norm"]["w"], config.rms_eps, norm_offset,
                 norm_round_xhat)                                             # (B, T, C)
    # 4: the output layer
    logits = head(x, params, config.tie_weights, logits_to_keep)             # (B, T, C) -> (B, N, V)
    if logit_softcap is not None:   # Gemma 2: c * tanh(logits / c), on the kept logits
        logits = softcap.logit_softcap(logits, logit_softcap)                 # (B, N, V)
    return logits


# -- the steps of a decoder's attention -----------------------------------------------------------

def qkv(x, params):
    """The three projections: x (B, T, C) -> (q (B, T, nh*hs), k, v (B, T, nkv*hs))."""
    q = linear(x, **params["q"])                                              # (B, T, C) -> (B, T, nh*hs)
    k = linear(x, **params["k"])                                              # (B, T, C) -> (B, T, nkv*hs)
    v = linear(x, **params["v"])                                              # (B, T, C) -> (B, T, nkv*hs)
    return q, k, v


def heads(x, params, nh, nkv):
    """The three projections, split into heads: x (B, T, C) -> (q (B, nh, T, hs), k, v (B, nkv, T, hs))."""
    q, k, v = qkv(x, params)                                                  # (B, T, C) -> (B, T, nh*hs | nkv*hs)
    return split_heads(q, nh), split_heads(k, nkv), split_heads(v, nkv)       # (B, nh | nkv, T, hs)


def rotate(q, k, positions, theta, scaling, layout, rotary_dim=None):
    """RoPE on q (B, nh, T, hs) and k (B, nkv, T, hs) at ``positions`` (T,) or (B, T) -> (q, k);
    ``rotary_dim`` r rotates only the first r channels of each head (None: all hs)."""
    r = q.shape[-1] if rotary_dim is None else rotary_dim
    pos = positions if positions.ndim == 1 else positions[:, None, :]         # (B, T) -> (B, 1, T): all heads
    q = torch.cat([rope(q[..., :r], pos, theta, layout, scaling), q[..., r:]], dim=-1)   # (B, nh, T, hs)
    k = torch.cat([rope(k[..., :r], pos, theta, layout, scaling), k[..., r:]], dim=-1)   # (B, nkv, T, hs)
    return q, k


def cached_attention(q, k, v, kv_cache, attn_mask, *, window=None, sinks=None, softcap=None, **attention):
    """Causal attention of the T new queries over the cached and the new keys and values
    -> (B, nh, T, hs); ``window``, ``attn_mask``, ``sinks``, ``softcap`` and ``attention`` as
    cached_attention_forward's."""
    T = q.shape[2]
    if kv_cache is not None:   # decoding: the past tokens' (rotated) keys and values come from the cache
        k, v = kv_cache_update(kv_cache, k, v)                                # (B, nkv, T, hs) -> (B, nkv, S, hs)
    S = k.shape[2]
    causal = (causal_mask(T, S, "bottom_right", device=q.device) if window is None
              else sliding_window_mask(T, S, window, "bottom_right", device=q.device))
    mask = causal if attn_mask is None else attn_mask & causal               # (T, S) or (B, nh, T, S)
    if softcap is None:
        y, _, lse = scaled_dot_product_attention(q, k, v, attn_mask=mask, return_lse=True,
                                                 **attention)                # (B, nh, T, hs)
    else:   # Gemma 2: c * tanh(s / c) modifies each score, the mask then drops some
        block_mask = mask_block_mask(mask, *q.shape[:2])
        y, lse = flex_attention(q, k, v, score_mod=soft_cap(softcap), block_mask=block_mask,
                                enable_gqa=True, return_lse=True, **attention)
    if sinks is not None:   # gpt-oss: y * sigmoid(lse - s_h), the share of each row its sink leaves
        y = attention_sinks(y, lse, sinks)                                    # (B, nh, T, hs)
    return y


class MaskBlocks(NamedTuple):
    """What flex_attention reads of a block mask: its mask_mod (it applies it everywhere)."""

    mask_mod: Callable


def mask_block_mask(mask, B, nh):
    """flex attention's block mask of a bool ``mask`` (T, S) or (B, nh, T, S), True where a query
    may attend: its mask_mod reads the mask."""
    T, S = mask.shape[-2:]
    if mask.ndim == 2:   # the same for every sequence and head
        return MaskBlocks(lambda b, h, q_idx, kv_idx: mask[q_idx, kv_idx])
    mask = mask.expand(B, nh, T, S)                                           # (B, nh, T, S)
    return MaskBlocks(lambda b, h, q_idx, kv_idx: mask[b, h, q_idx, kv_idx])


def attend(q, k, v, o, kv_cache, attn_mask, **attention):
    """Attention with the cache, the heads merged, the output projection ``o``: q (B, nh, T, hs),
    k, v (B, nkv, T, hs) -> (B, T, C); the rest as attend_forward's."""
    y = cached_attention(q, k, v, kv_cache, attn_mask, **attention)           # (B, nh, T, hs)
    out = linear(merge_heads(y), **o)                                         # (B, nh, T, hs) -> (B, T, C)
    return out


# -- the output layer -----------------------------------------------------------------------------

def head(x, params, tie_weights, logits_to_keep=None):
    """The output layer: x (B, T, C) -> logits (B, N, V), N = min(logits_to_keep, T), or T when
    logits_to_keep is None or 0 (transformers' keyword)."""
    # The last N positions only (generation reads the last): the head's V-wide rows skip the rest.
    x = x[:, -logits_to_keep:] if logits_to_keep else x                  # (B, T, C) -> (B, N, C)
    head_w = params["wte"].T if tie_weights else params["head"]["w"]      # (C, V)
    logits = linear(x, head_w)                                            # (B, N, C) -> (B, N, V)
    return logits


# -- sliding and full layers (Gemma 2 and 3, gpt-oss) ------------------------------------------------

def sliding_kv_cache(config, B, dtype=torch.float32, max_len=None, device=None):
    """An empty key/value cache: a full layer holds every token, a sliding layer only its last window."""
    max_len = config.block_size if max_len is None else max_len
    windows = [config.window(i) for i in range(config.n_layer)]
    return init_kv_cache(config.n_layer, B, config.n_kv_head, max_len, config.hs, dtype, device, windows=windows)
