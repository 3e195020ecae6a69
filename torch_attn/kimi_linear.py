"""Kimi Linear's language model in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/kimi_linear.py: torch_attn/llama.py's blocks, each layer's mixer either MLA with
every position 0 (no positions: rope is the identity there; full layers) or Kimi Delta Attention
(torch_attn/kimi_delta_attention.py, linear layers), each network SwiGLU or DeepSeek's mixture of
experts; its cache keeps MLA's latents on the full layers and KDA's state on the linear ones.
"""

from dataclasses import dataclass

import torch

from torch_attn import _model
from torch_attn.deepseek_v3 import LatentKVCache, _absorbed_attention, deepseek_moe_mlp
from torch_attn.kimi_delta_attention import kimi_delta_attention
from torch_attn.kv_cache import init_kv_cache
from torch_attn.llama import llama_block, swiglu_mlp
from torch_attn.mla import mla
from torch_attn.qwen3_5 import Qwen3_5Cache, state_sublayer

# -- the mixers ------------------------------------------------------------------------------------

def kimi_attention(h, params, config, positions, *, attn_mask=None, kv_cache=None):
    """MLA without positions: mla with every position 0, absorbed from this layer's latents when decoding."""
    nope = torch.zeros_like(positions)
    if kv_cache is not None:
        return _absorbed_attention(h, params, config.mla, nope, kv_cache, attn_mask)
    return mla(h, params, config.mla, nope, attn_mask=attn_mask)              # (B, T, C)


def _kda(x, params, config, state, mask):
    """Kimi Delta Attention with the config's sizes."""
    return kimi_delta_attention(x, params, config.linear_num_heads, config.linear_head_dim, config.rms_eps,
                                state=state, mask=mask)


kimi_delta_attention_layer = state_sublayer(_kda)


# -- the model -------------------------------------------------------------------------------------

def _layer_options(config):
    """Block i's options: its mixer and its network."""
    return lambda i: {"attention": kimi_attention if config.is_full(i) else kimi_delta_attention_layer,
                      "mlp": deepseek_moe_mlp if config.is_moe(i) else swiglu_mlp}


def kimi_linear(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
                logits_to_keep=None):
    """Logits for integer ``ids`` (B, T) -> (B, T, V); keywords as llama's, ``kv_cache`` from kimi_linear_kv_cache."""
    return _model.decoder(ids, params, config, llama_block, positions=positions, attn_mask=attn_mask,
                          kv_cache=kv_cache, logits_to_keep=logits_to_keep, layer_options=_layer_options(config),
                          padding_idx=config.pad_token_id)


# -- decoding: latents on the MLA layers, KDA's state on the linear ones ----------------------------

@dataclass
class KimiLinearCache(Qwen3_5Cache, LatentKVCache):
    """Qwen3_5Cache's hybrid layout whose full layers keep MLA's latents (keys c_kv, values k_r)."""


def kimi_linear_kv_cache(config, B, dtype=torch.float32, max_len=None, device=None):
    """An empty cache: the full layers' latents, each linear layer's state at zeros."""
    max_len = config.block_size if max_len is None else max_len
    full = [i for i in range(config.n_layer) if config.is_full(i)]
    kv = init_kv_cache(len(full), B, 1, max_len, config.kv_lora_rank, dtype, device,
                       v_head_size=config.qk_rope_head_dim)
    nh, d, K = config.linear_num_heads, config.linear_head_dim, config.conv_kernel
    states = [None if config.is_full(i) else
              {"conv": torch.zeros(B, 3 * nh * d, K - 1, dtype=dtype, device=device),
               "recurrent": torch.zeros(B, nh, d, d, dtype=dtype, device=device)}
              for i in range(config.n_layer)]
    full_index = tuple(full.index(i) if i in full else None for i in range(config.n_layer))
    return KimiLinearCache(kv.buffer_k, kv.buffer_v, kv.lengths, kv.windows, kv.dims, kv.v_head_size,
                           tuple(config.layer_types), full_index, states, [0] * config.n_layer)


# Equals Hugging Face's transformers.KimiLinearForCausalLM(...).logits holding the same weights;
# parity_tests/test_kimi_linear.py checks it in float64.
