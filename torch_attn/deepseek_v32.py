"""DeepSeek-V3.2 in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/deepseek_v32.py: torch_attn/deepseek_v3.py's blocks whose MLA attends over the
keys each query's lightning indexer (torch_attn/lightning_indexer.py) selects, the indexer run on
the block's normed input and MLA's query latent without gradient (transformers' no_grad); its
cache is deepseek_v3's absorbed latents with each layer's indexer keys beside them.
"""

from dataclasses import dataclass

import torch

from torch_attn import _model
from torch_attn._opmath import opmath
from torch_attn.deepseek_v3 import LatentKVCache, _absorbed_attention, deepseek_moe_mlp, deepseek_v3_kv_cache
from torch_attn.lightning_indexer import indexer_keys, lightning_indexer
from torch_attn.linear import linear
from torch_attn.llama import llama_block, swiglu_mlp
from torch_attn.mla import mla
from torch_attn.rms_norm import rms_norm

# -- the attention: MLA over the indexer's selection -----------------------------------------------

@torch.no_grad()
def _select(h, params, config, positions, past_keys=None):
    """The indexer on h (B, T, C) and MLA's query latent: selected (B, T, S) and the new tokens'
    keys (B, T, D), in float32 for a float16 or bfloat16 h; no gradient."""
    dt = opmath(h.dtype)
    def cast(layer):
        return {key: a.to(dt) for key, a in layer.items()}
    x = h.to(dt)
    # MLA's own query latent, recomputed: the indexer is detached, so nothing flows back through it.
    c_q = linear(x, **cast(params["q_a"]))                                    # (B, T, C) -> (B, T, rq)
    c_q = rms_norm(c_q, cast(params["q_a_norm"])["w"], config.mla.rms_eps)    # (B, T, rq)
    indexer = {name: cast(layer) for name, layer in params["indexer"].items()}
    _, selected = lightning_indexer(x, c_q, indexer, positions=positions, past_keys=past_keys, **config.indexer)
    keys = indexer_keys(x, indexer, config.qk_rope_head_dim, positions, config.rope_theta, config.rope_scaling,
                        config.INDEXER_ROPE_LAYOUT)
    return selected, keys


def deepseek_v32_attention(h, params, config, positions, *, attn_mask=None, kv_cache=None, selection=None):
    """MLA over each query's selected keys: h (B, T, C) -> (B, T, C), absorbed decoding from a
    deepseek_v32_kv_cache's layer; a block without an indexer attends over ``selection``'s."""
    if attn_mask is not None:
        raise ValueError("deepseek_v32_attention: attn_mask is not supported (the model attends causally)")
    mla_params = {name: layer for name, layer in params.items() if name != "indexer"}
    if "indexer" in params:
        P, T = (0 if kv_cache is None else kv_cache.length), h.shape[1]
        keys = None if kv_cache is None else kv_cache.cache.index_keys[kv_cache.index]   # (B, max_len, D) its slots
        selected, new_keys = _select(h, params, config, positions, None if keys is None else keys[:, :P])
        if keys is not None:   # decoding: the new tokens' keys join the cached ones
            keys[:, P:P + T] = new_keys
        if selection is not None:
            selection["selected"] = selected
    else:
        selected = selection["selected"]                                      # (B, T, S) an earlier block's
    if kv_cache is not None:   # decoding: MLA absorbed over the latents
        return _absorbed_attention(h, mla_params, config.mla, positions, kv_cache, selected[:, None])
    return mla(h, mla_params, config.mla, positions, attn_mask=selected[:, None])   # (B, T, C)


# -- the model ------------------------------------------------------------------------------------

def dsa_layer_options(config):
    """Block i's options: DSA, sharing one forward's selection between the blocks, and a dense or a
    mixture-of-experts network."""
    selection = {}
    return lambda i: {"attention": deepseek_v32_attention, "selection": selection,
                      "mlp": deepseek_moe_mlp if config.is_moe(i) else swiglu_mlp}


def deepseek_v32(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
                 logits_to_keep=None):
    """Logits for integer ``ids`` (B, T) -> (B, T, V); keywords as llama's, ``kv_cache`` from deepseek_v32_kv_cache."""
    return _model.decoder(ids, params, config, llama_block, positions=positions, attn_mask=attn_mask,
                          kv_cache=kv_cache, logits_to_keep=logits_to_keep, layer_options=dsa_layer_options(config))


@dataclass
class DeepseekV32Cache(LatentKVCache):
    """deepseek_v3's absorbed latent cache, and each layer's rotated indexer keys beside it."""

    index_keys: torch.Tensor | None = None   # (L, B, max_len, D)


def deepseek_v32_kv_cache(config, B, dtype=torch.float32, max_len=None, device=None):
    """An empty cache: each layer's latents and shared rotary keys, and its indexer keys (float32
    for a float16 or bfloat16 model)."""
    latent = deepseek_v3_kv_cache(config, B, dtype, max_len, device)
    keys = torch.zeros(config.n_layer, B, latent.max_len, config.index_head_dim, dtype=opmath(dtype), device=device)
    return DeepseekV32Cache(latent.buffer_k, latent.buffer_v, latent.lengths, latent.windows, latent.dims,
                            latent.v_head_size, keys)


# Equals Hugging Face's transformers.DeepseekV32ForCausalLM(...).logits holding the same weights;
# parity_tests/test_deepseek_v32.py checks it in float32 and float64, and through saved checkpoints.
