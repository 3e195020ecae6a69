"""The model of "Attention Is All You Need" at its smallest, and its backward: start reading here.

    x      = wte[ids] + PE[0..T-1]          PE: the sinusoidal table (numpy_attn/positional.py)
    x      = attn(x)                        one causal multi-head self-attention
    logits = x @ head.w + head.b            a linear layer to the vocabulary

No blocks, no layer norm, no dropout: token embedding, position encoding and attention are all
there is (Vaswani et al., 2017, sections 3.2 to 3.5). Its config is a ``GPTConfig``
(numpy_attn/gpt.py), of which it uses vocab_size, block_size, n_head, n_embd and bias; the full
model with blocks is numpy_attn/gpt.py.

float16 and bfloat16 (``init_small_gpt_params(..., dtype=)``): embedding, attention and the head
compute in float32 and round once to the params' dtype (docs/precision.md); the encoding table is
rounded to that dtype, and tok + encoding rounds each float32 sum once, as PyTorch's add.
"""

from typing import NamedTuple

import numpy as np

from numpy_attn._checks import check_dout, check_rng, check_token_ids
from numpy_attn.embedding import embedding_backward, embedding_forward
from numpy_attn.linear import linear_backward, linear_forward
from numpy_attn.multi_head import (
    init_multi_head_params,
    multi_head_attention_backward,
    multi_head_attention_forward,
)
from numpy_attn.positional import sinusoidal_encoding


def init_small_gpt_params(config, rng, dtype=np.float32):
    """{"wte": (V, C), "attn": {"q", "k", "v", "o"}, "head": {"w": (C, V), "b": (V,)}} (no "b"
    without config.bias). Uses vocab_size, n_embd and bias of the config."""
    check_rng(rng, "init_small_gpt_params")
    V, C = config.vocab_size, config.n_embd
    params = {"wte": rng.normal(0, 0.02, (V, C)).astype(dtype),                           # (V, C)
              "attn": init_multi_head_params(C, rng, bias=config.bias, dtype=dtype),
              "head": {"w": rng.normal(0, 0.02, (C, V)).astype(dtype)}}                   # (C, V)
    if config.bias:
        params["head"]["b"] = np.zeros(V, dtype)                                          # (V,)
    return params


class SmallGPTCache(NamedTuple):
    """The three sub-caches (the encoding has no parameters) and the logits' shape and dtype."""

    wte: tuple
    attn: tuple
    head: tuple
    shape: tuple             # (B, T, V)
    dtype: np.dtype


def small_gpt_forward(ids, params, config):
    """Logits of the small model: ids (B, T) -> (B, T, V). Returns ``(logits, cache)``."""
    ids = check_token_ids(ids, config.block_size)
    B, T = ids.shape
    wte = params["wte"]
    tok, wte_cache = embedding_forward(ids, wte)                          # (B, T) -> (B, T, C)
    x = tok + sinusoidal_encoding(T, wte.shape[1], dtype=wte.dtype)       # (B, T, C)
    x, attn_cache = multi_head_attention_forward(x, params["attn"], config.n_head, is_causal=True)
    logits, head_cache = linear_forward(x, **params["head"])              # (B, T, C) -> (B, T, V)
    cache = SmallGPTCache(wte_cache, attn_cache, head_cache, logits.shape, logits.dtype)
    return logits, cache


def small_gpt_backward(dlogits, cache):
    """Gradients of the small model: dlogits (B, T, V) -> {"wte", "attn", "head"}."""
    check_dout("small_gpt_backward", dlogits, cache.shape, cache.dtype, name="dlogits")
    # Undoes logits = x @ head.w + head.b.
    dx, dhead = linear_backward(dlogits, cache.head)                      # (B, T, V) -> (B, T, C)
    # Undoes x = attn(x).
    dx, dattn = multi_head_attention_backward(dx, cache.attn)             # (B, T, C)
    # Undoes x = tok + encoding: the encoding is constant, the whole gradient goes to tok.
    dwte = embedding_backward(dx, cache.wte)                              # (V, C)
    return {"wte": dwte, "attn": dattn, "head": dhead}
