"""The pre-LayerNorm Transformer block (GPT-2), causal, and its backward.

    x = x + dropout(attn(ln1(x)))       attn: causal multi-head self-attention
    x = x + dropout(ffn(ln2(x)))        ffn: linear C -> 4C, GELU, linear 4C -> C

Radford et al., "Language Models are Unsupervised Multitask Learners" (2019), section 2.3: the
layer norm moved to the input of each sub-block, so the residual stream x is never normalised and
gradients reach the bottom of a deep stack through the skips unchanged. Dropout (inverted, with an
explicit ``rng``) acts on the two residual branches, not on the attention weights. The forward is
a numbered list of steps; the backward undoes them in reverse, one step per forward step, and
writes each residual sum out: ``dx = dx_attn + dx_skip``. Layer norms always have a bias; ``bias``
applies to the linear layers, as ``torch.nn.TransformerEncoderLayer``'s.

float16 and bfloat16 (``init_block_params(..., dtype=)``): each sub-operation computes in float32
and rounds once to x's dtype (docs/precision.md); the two residual adds, and their gradients'
sums in the backward, add two arrays of that dtype, each float32 sum rounded once, as PyTorch's add.
"""

from typing import NamedTuple

import numpy as np

from numpy_attn._checks import check_dout, check_float, check_ndim, check_rng
from numpy_attn.dropout import dropout_backward, dropout_forward
from numpy_attn.feed_forward import (
    feed_forward_backward,
    feed_forward_forward,
    init_feed_forward_params,
)
from numpy_attn.layer_norm import layer_norm_backward, layer_norm_forward
from numpy_attn.multi_head import (
    init_multi_head_params,
    multi_head_attention_backward,
    multi_head_attention_forward,
)


def init_block_params(C, rng, bias=True, dtype=np.float32, kv_width=None):
    """{"ln1": {"w", "b"}, "attn": {"q", "k", "v", "o"}, "ln2": {"w", "b"}, "ffn": {"fc", "proj"}}.

    Layer norms start as the identity (w = 1, b = 0); attention and feed-forward are drawn by
    their own init functions, in that order, from ``rng``.
    """
    check_rng(rng, "init_block_params")
    return {
        "ln1": {"w": np.ones(C, dtype), "b": np.zeros(C, dtype)},
        "attn": init_multi_head_params(C, rng, bias=bias, dtype=dtype, kv_width=kv_width),
        "ln2": {"w": np.ones(C, dtype), "b": np.zeros(C, dtype)},
        "ffn": init_feed_forward_params(C, rng, dtype=dtype, bias=bias),
    }


class BlockCache(NamedTuple):
    """The sub-caches of the forward steps that have a backward, in forward order."""

    ln1: tuple
    attn: tuple
    drop_attn: tuple         # (keep-mask or None, scale, shape, dtype)
    ln2: tuple
    ffn: tuple
    drop_ffn: tuple
    shape: tuple             # (B, T, C) of x and of out
    dtype: np.dtype

    @property
    def masks(self):
        """The two dropout keep-masks (B, T, C), None without dropout, for the torch twin."""
        return {"attn": self.drop_attn[0], "ffn": self.drop_ffn[0]}


def block_forward(x, params, num_heads, *, dropout_p=0.0, rng=None, masks=None, attn_mask=None,
                  kv_cache=None, ln_eps=1e-5, gelu="none"):
    """One causal pre-LN block: x (B, T, C) -> out (B, T, C), params as from init_block_params.

    Dropout with ``dropout_p`` > 0 draws its keep-masks from ``rng``, or takes them from
    ``masks`` ({"attn": (B, T, C) bool, "ffn": (B, T, C) bool}). Returns ``(out, cache)``.
    ``attn_mask`` (bool, broadcasting to (B, nh, T, S)) replaces the causal mask, so it must
    include causality (numpy_attn/masks.py builds one with padding or packing); ``kv_cache`` is
    this block's layer of the cache, for decoding. ``ln_eps`` and ``gelu`` ("none": exact, or
    "tanh") are the layer norms' eps and the feed-forward's GELU (GPT-2's checkpoints: tanh).
    """
    _check_block(x, num_heads, dropout_p, rng, masks)
    B, T, C = x.shape
    masks = {"attn": None, "ffn": None} if masks is None else masks
    # Causal, aligned bottom-right: with a cache the T new queries are the last T of the keys.
    is_causal = "bottom_right" if attn_mask is None else False
    # 1-4: x + dropout(attn(ln1(x))), one step a line
    h, ln1_cache = layer_norm_forward(x, **params["ln1"], eps=ln_eps)                  # (B, T, C)
    a, attn_cache = multi_head_attention_forward(h, params["attn"], num_heads, attn_mask=attn_mask,
                                                 is_causal=is_causal, kv_cache=kv_cache)   # (B, T, C)
    a, drop_attn_cache = dropout_forward(a, dropout_p, rng, mask=masks["attn"])        # (B, T, C)
    x = x + a
    # 5-8: x + dropout(ffn(ln2(x))), one step a line
    h, ln2_cache = layer_norm_forward(x, **params["ln2"], eps=ln_eps)                  # (B, T, C)
    f, ffn_cache = feed_forward_forward(h, params["ffn"], gelu)                        # (B, T, C) via (B, T, 4C)
    f, drop_ffn_cache = dropout_forward(f, dropout_p, rng, mask=masks["ffn"])          # (B, T, C)
    out = x + f
    cache = BlockCache(ln1_cache, attn_cache, drop_attn_cache, ln2_cache, ffn_cache, drop_ffn_cache,
                       out.shape, out.dtype)
    return out, cache


def block_backward(dout, cache):
    """Gradients: dout (B, T, C) -> (dx (B, T, C), dparams with the nesting of params)."""
    check_dout("block_backward", dout, cache.shape, cache.dtype)
    # 8: undoes out = x + f: the skip hands dout to x unchanged, the branch hands it to f.
    # 7: undoes f = dropout(f).
    df = dropout_backward(dout, cache.drop_ffn)                                    # (B, T, C)
    # 6: undoes f = ffn(h).
    dh, dffn = feed_forward_backward(df, cache.ffn)                                # (B, T, C)
    # 5: undoes h = ln2(x); x also fed the skip, so the two gradients add.
    dx_ffn, dln2 = layer_norm_backward(dh, cache.ln2)                              # (B, T, C)
    dx = dx_ffn + dout                                                             # branch + skip
    # 4: undoes x = x + a, in the same way as step 8.
    # 3: undoes a = dropout(a).
    da = dropout_backward(dx, cache.drop_attn)                                     # (B, T, C)
    # 2: undoes a = attn(h).
    dh, dattn = multi_head_attention_backward(da, cache.attn)                      # (B, T, C)
    # 1: undoes h = ln1(x).
    dx_attn, dln1 = layer_norm_backward(dh, cache.ln1)                             # (B, T, C)
    dx = dx_attn + dx                                                              # branch + skip
    dparams = {"ln1": dln1, "attn": dattn, "ln2": dln2, "ffn": dffn}
    return dx, dparams


def _check_block(x, num_heads, dropout_p, rng, masks):
    """Raise unless x is a float (B, T, C) array and, with dropout, an rng or both masks are given
    (the sub-operations check the parameters and num_heads against x)."""
    check_float("x", x)
    check_ndim("x", x, 3)
    if not 0 <= dropout_p < 1:
        raise ValueError(f"dropout_p must lie in [0, 1), got {dropout_p}")
    if dropout_p > 0 and (masks is None or masks.get("attn") is None or masks.get("ffn") is None):
        check_rng(rng, f"block_forward with dropout_p = {dropout_p} (and no masks)")
