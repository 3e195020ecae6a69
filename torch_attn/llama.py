"""A Llama-style language model in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/llama.py: token embedding, blocks of x + attn(rms_norm(x)) (RoPE on q and k,
grouped-query heads, causal) and x + swiglu(rms_norm(x)), a final RMS norm and the output layer
(the token embedding, transposed, with tied weights), on the same nested parameter dict and the
same ``LlamaConfig``. ``positions``, ``attn_mask`` and ``kv_cache`` (llama_kv_cache,
torch_attn/kv_cache.py) as in the NumPy twin. The families built on it (torch_attn/qwen3.py,
olmo2.py) use its QK-norm (``qk_norm``) and ``decoder`` with their own blocks.
"""

import torch

from torch_attn._model import head
from torch_attn.attention import scaled_dot_product_attention
from torch_attn.embedding import embedding
from torch_attn.kv_cache import init_kv_cache, kv_cache_update
from torch_attn.linear import linear
from torch_attn.masks import causal_mask, sliding_window_mask
from torch_attn.rms_norm import rms_norm
from torch_attn.rope import rope as rotate
from torch_attn.softcap import logit_softcap
from torch_attn.swiglu import swiglu


def qk_norm(q, k, params, eps, offset=0.0, round_xhat=True):
    """RMS norm of q and of k over their last axis, each with its own weight -> (q, k)."""
    q = rms_norm(q, params["q_norm"]["w"], eps, offset, round_xhat)
    k = rms_norm(k, params["k_norm"]["w"], eps, offset, round_xhat)
    return q, k


def llama_attention(x, params, config, positions, *, attn_mask=None, kv_cache=None, window=None, rope=None):
    """Causal self-attention with RoPE: x (B, T, C), positions (T,) or (B, T) -> (B, T, C);
    with a ``kv_cache`` (this layer's) x holds only the new tokens; ``window`` and ``rope`` as in the NumPy twin."""
    B, T, C = x.shape
    nh, nkv, hs = config.n_head, config.n_kv_head, config.hs
    pos = positions if positions.ndim == 1 else positions[:, None, :]         # (B, T) -> (B, 1, T): all heads
    q = linear(x, **params["q"])                                              # (B, T, C) -> (B, T, nh*hs)
    k = linear(x, **params["k"])                                              # (B, T, C) -> (B, T, nkv*hs)
    v = linear(x, **params["v"])                                              # (B, T, C) -> (B, T, nkv*hs)
    if config.qk_norm == "projection":   # OLMo 2: q and k normed across all their heads at once
        q, k = qk_norm(q, k, params, config.rms_eps,
                       round_xhat=config.norm_round_xhat)                     # widths nh*hs, nkv*hs
    q = q.reshape(B, T, nh, hs).transpose(1, 2)                               # (B, T, nh*hs) -> (B, nh, T, hs)
    k = k.reshape(B, T, nkv, hs).transpose(1, 2)                              # (B, T, nkv*hs) -> (B, nkv, T, hs)
    v = v.reshape(B, T, nkv, hs).transpose(1, 2)                              # (B, T, nkv*hs) -> (B, nkv, T, hs)
    if config.qk_norm == "head":         # Qwen3: each head's q and k normed alone, before the rotation
        q, k = qk_norm(q, k, params, config.rms_eps, config.norm_offset)      # width hs
    rope = {"theta": config.rope_theta, "scaling": config.rope_scaling, **(rope or {}), "layout": config.rope_layout}
    q = rotate(q, pos, **rope)                                                # (B, nh, T, hs)
    k = rotate(k, pos, **rope)                                                # (B, nkv, T, hs)
    if kv_cache is not None:   # decoding: the past tokens' (rotated) keys and values come from the cache
        k, v = kv_cache_update(kv_cache, k, v)                                # (B, nkv, T, hs) -> (B, nkv, S, hs)
    is_causal = "bottom_right" if attn_mask is None else False   # query t sees keys 0..past+t
    if attn_mask is not None and window is not None:   # the caller's mask, and the window's
        attn_mask = attn_mask & sliding_window_mask(T, k.shape[2], window, "bottom_right", device=x.device)
        window = None
    y, _ = scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=config.score_scale,
                                        softcap=config.score_softcap, window=window,
                                        sinks=params.get("sinks"))            # (B, nh, T, hs)
    y = y.transpose(1, 2).reshape(B, T, nh * hs)                              # (B, nh, T, hs) -> (B, T, nh*hs)
    out = linear(y, **params["o"])                                            # (B, T, nh*hs) -> (B, T, C)
    return out


def llama_block(x, params, config, positions, *, attn_mask=None, kv_cache=None):
    """One block: x (B, T, C) -> (B, T, C); ``attn_mask`` and ``kv_cache`` go to attention."""
    # 1-3: x + attn(rms_norm(x))
    h = rms_norm(x, params["attn_norm"]["w"], config.rms_eps)                 # (B, T, C)
    a = llama_attention(h, params["attn"], config, positions, attn_mask=attn_mask,
                        kv_cache=kv_cache)                                    # (B, T, C)
    x = x + a
    # 4-6: x + swiglu(rms_norm(x))
    h = rms_norm(x, params["mlp_norm"]["w"], config.rms_eps)                  # (B, T, C)
    f = swiglu(h, params["mlp"])                                              # (B, T, C) via (B, T, H)
    out = x + f
    return out


def llama(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
          logits_to_keep=None):
    """Logits for integer ``ids`` (B, T) -> (B, T, V); ``positions``, ``attn_mask``, ``kv_cache``
    (llama_kv_cache) and ``logits_to_keep`` (-> (B, N, V)) as in the NumPy twin."""
    return decoder(ids, params, config, llama_block, positions=positions, attn_mask=attn_mask, kv_cache=kv_cache,
                   logits_to_keep=logits_to_keep)


def decoder(ids, params, config, block, *, positions, attn_mask, kv_cache, logits_to_keep=None):
    """llama for the families built on it: ``block`` (llama_block's arguments) makes each block."""
    B, T = ids.shape
    past = 0 if kv_cache is None else kv_cache.length                         # tokens already cached
    positions = torch.arange(past, past + T, device=ids.device) if positions is None else positions
    wte = params["wte"]
    # Causal, aligned bottom-right (the T new tokens follow the past ones); one mask with the caller's.
    attn_mask = None if attn_mask is None else attn_mask & causal_mask(T, past + T, "bottom_right", device=ids.device)
    # 1: token embedding (positions enter through RoPE inside attention)
    x = embedding(ids, wte)                                                   # (B, T) -> (B, T, C)
    if config.embed_scale is not None:   # Gemma: times sqrt(C), rounded to the model's dtype first
        x = x * torch.tensor(config.embed_scale, dtype=x.dtype)               # (B, T, C)
    # 2: the blocks, in order; each reads and appends to its own layer of the cache
    for i in range(config.n_layer):
        layer_cache = None if kv_cache is None else kv_cache.layer(i)
        x = block(x, params["blocks"][str(i)], config, positions,
                  attn_mask=attn_mask, kv_cache=layer_cache, **config.block_options(i))
    # 3: final RMS norm
    x = rms_norm(x, params["norm"]["w"], config.rms_eps, config.norm_offset,
                 config.norm_round_xhat)                                  # (B, T, C)
    # 4: the output layer
    logits = head(x, params, config.tie_weights, logits_to_keep)         # (B, T, C) -> (B, N, V)
    if config.logit_softcap is not None:   # Gemma 2: c * tanh(logits / c), on the kept logits
        logits = logit_softcap(logits, config.logit_softcap)                  # (B, N, V)
    return logits


def llama_kv_cache(config, B, dtype=torch.float32, max_len=None, device=None):
    """An empty key/value cache for decoding B sequences of up to ``max_len`` (default
    block_size) tokens with this model: one layer per block, the nkv key/value heads only."""
    max_len = config.block_size if max_len is None else max_len
    return init_kv_cache(config.n_layer, B, config.n_kv_head, max_len, config.hs, dtype, device)


# Equals Hugging Face's transformers.LlamaForCausalLM(...).logits holding the same weights
# (transposed into nn.Linear's (C_out, C_in)); parity_tests/test_llama.py checks it in float32 and
# float64, and parity_tests/test_hf.py through checkpoints saved by transformers.
