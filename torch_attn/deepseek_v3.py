"""DeepSeek-V3 in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/deepseek_v3.py: torch_attn/_model.py's ``decoder`` with blocks x + mla(rms_norm(x))
(torch_attn/mla.py) and x + swiglu(rms_norm(x)) in the first first_k_dense_replace blocks, x +
moe(rms_norm(x)) (torch_attn/moe.py's DeepSeek-V3 routing) after; its cache is deepseek_v3_kv_cache,
absorbed (latents and shared rotary keys) by default, naive (every head's keys and values) without.
"""

from dataclasses import dataclass

import torch

from torch_attn import _model
from torch_attn.kv_cache import KVCache, init_kv_cache
from torch_attn.llama import llama_block, swiglu_mlp
from torch_attn.mla import LatentCache, init_mla_kv_cache, mla, mla_absorbed
from torch_attn.moe import deepseek_moe

# -- the block: Llama's, with MLA and a dense or a mixture-of-experts network ----------------------

def deepseek_v3_attention(h, params, config, positions, *, attn_mask=None, kv_cache=None):
    """MLA: h (B, T, C) -> (B, T, C), absorbed decoding from a latent cache, mla otherwise."""
    if attn_mask is not None:
        raise ValueError("deepseek_v3_attention: attn_mask is not supported (MLA attends causally)")
    if kv_cache is not None and isinstance(kv_cache.cache, LatentKVCache):   # absorbed decoding
        return _absorbed_attention(h, params, config.mla, positions, kv_cache)
    return mla(h, params, config.mla, positions, kv_cache=kv_cache)           # (B, T, C)


def _absorbed_attention(h, params, mla_config, positions, layer_cache, attn_mask=None):
    """mla_absorbed over this layer's slots of a LatentKVCache (keys: latents, values: shared k_r)."""
    latent = LatentCache(layer_cache.k[:, 0], layer_cache.v[:, 0], layer_cache.length)   # views of the slots
    a = mla_absorbed(h, params, mla_config, latent, positions, attn_mask)     # (B, T, C)
    layer_cache.cache.lengths[layer_cache.index] = latent.length             # the tokens it appended
    return a


def deepseek_moe_mlp(h, params, config):
    """The mixture of experts with the config's routing: h (B, T, C) -> (B, T, C)."""
    return deepseek_moe(h, params, **config.routing)


def deepseek_v3_block(x, params, config, positions, *, attn_mask=None, kv_cache=None, moe=False):
    """One block: x (B, T, C) -> (B, T, C), Llama's with MLA and, where ``moe``, the mixture of
    experts in place of the SwiGLU network."""
    return llama_block(x, params, config, positions, attn_mask=attn_mask, kv_cache=kv_cache,
                       attention=deepseek_v3_attention, mlp=deepseek_moe_mlp if moe else swiglu_mlp)


# -- the model ------------------------------------------------------------------------------------

def deepseek_v3(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
                logits_to_keep=None):
    """Logits for integer ``ids`` (B, T) -> (B, T, V); keywords as llama's, ``kv_cache`` from deepseek_v3_kv_cache."""
    return _model.decoder(ids, params, config, deepseek_v3_block, positions=positions, attn_mask=attn_mask,
                          kv_cache=kv_cache, logits_to_keep=logits_to_keep,
                          layer_options=lambda i: {"moe": config.is_moe(i)})


@dataclass
class LatentKVCache(KVCache):
    """Every layer's absorbed-MLA cache in KVCache's layout: keys the latents c_kv, values the k_r."""


def deepseek_v3_kv_cache(config, B, dtype=torch.float32, max_len=None, device=None, absorb=True):
    """An empty cache: with ``absorb`` each layer's latents and shared rotary keys, without every
    head's keys and values."""
    max_len = config.block_size if max_len is None else max_len
    if not absorb:
        return init_mla_kv_cache(config.mla, config.n_layer, B, max_len, dtype, device)
    cache = init_kv_cache(config.n_layer, B, 1, max_len, config.kv_lora_rank, dtype, device,
                          v_head_size=config.qk_rope_head_dim)
    return LatentKVCache(cache.buffer_k, cache.buffer_v, cache.lengths, cache.windows, cache.dims, cache.v_head_size)


# Equals Hugging Face's transformers.DeepseekV3ForCausalLM(...).logits holding the same weights;
# parity_tests/test_deepseek_v3.py checks it in float32 and float64, and through saved checkpoints.
