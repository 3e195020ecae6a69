"""Gemma 2 in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/gemma2.py: torch_attn/llama.py's model (its ``decoder`` reads the config's
scaled embedding, score scale, caps and windows) with blocks x + rms_norm(attn(rms_norm(x))) and
x + rms_norm(geglu(rms_norm(x))), every norm scaling by 1 + w; its cache is gemma2_kv_cache.
"""

import torch

from torch_attn.kv_cache import init_kv_cache
from torch_attn.llama import decoder, llama_attention
from torch_attn.rms_norm import rms_norm
from torch_attn.swiglu import swiglu

# -- the block: a norm before and after each sublayer -----------------------------------------------

def gemma2_block(x, params, config, positions, *, attn_mask=None, kv_cache=None, window=None, rope=None):
    """One block: x (B, T, C) -> (B, T, C); ``attn_mask``, ``kv_cache``, ``window`` and ``rope`` go to attention."""
    eps, one = config.rms_eps, config.norm_offset
    # 1-4: x + rms_norm(attn(rms_norm(x)))
    h = rms_norm(x, params["attn_norm"]["w"], eps, one)                       # (B, T, C)
    a = llama_attention(h, params["attn"], config, positions, attn_mask=attn_mask,
                        kv_cache=kv_cache, window=window, rope=rope)          # (B, T, C)
    a = rms_norm(a, params["attn_post_norm"]["w"], eps, one)                  # (B, T, C)
    x = x + a
    # 5-8: x + rms_norm(geglu(rms_norm(x)))
    h = rms_norm(x, params["mlp_norm"]["w"], eps, one)                        # (B, T, C)
    f = swiglu(h, params["mlp"], act="gelu_tanh")                             # (B, T, C) via (B, T, H)
    f = rms_norm(f, params["mlp_post_norm"]["w"], eps, one)                   # (B, T, C)
    out = x + f
    return out


# -- the model ------------------------------------------------------------------------------------

def gemma2(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
           logits_to_keep=None):
    """Logits for integer ``ids`` (B, T) -> (B, T, V); keywords as llama's, ``kv_cache`` from gemma2_kv_cache."""
    return decoder(ids, params, config, gemma2_block, positions=positions,
                   attn_mask=attn_mask, kv_cache=kv_cache, logits_to_keep=logits_to_keep)


def gemma2_kv_cache(config, B, dtype=torch.float32, max_len=None, device=None):
    """An empty key/value cache for decoding B sequences of up to ``max_len`` (default block_size)
    tokens: a global layer holds them all, a sliding layer only its last sliding_window."""
    max_len = config.block_size if max_len is None else max_len
    windows = [config.window(i) for i in range(config.n_layer)]
    return init_kv_cache(config.n_layer, B, config.n_kv_head, max_len, config.hs, dtype, device, windows=windows)


# Equals Hugging Face's transformers.Gemma2ForCausalLM(...).logits holding the same weights;
# parity_tests/test_gemma2.py checks it in float32 and float64, and through saved checkpoints.
