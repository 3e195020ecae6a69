"""GLM-5 (GLM-MoE-DSA) in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/glm_moe_dsa.py: torch_attn/deepseek_v32.py's blocks, the indexer's rope
interleaved (the config's INDEXER_ROPE_LAYOUT), a "shared" layer attending over the last full
layer's selection; its cache is deepseek_v32_kv_cache.
"""

from torch_attn import _model
from torch_attn.deepseek_v32 import deepseek_v32_kv_cache, dsa_layer_options
from torch_attn.llama import llama_block


def glm_moe_dsa(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
                logits_to_keep=None):
    """Logits for integer ``ids`` (B, T) -> (B, T, V); keywords as llama's, ``kv_cache`` from glm_moe_dsa_kv_cache."""
    return _model.decoder(ids, params, config, llama_block, positions=positions, attn_mask=attn_mask,
                          kv_cache=kv_cache, logits_to_keep=logits_to_keep, layer_options=dsa_layer_options(config))


glm_moe_dsa_kv_cache = deepseek_v32_kv_cache   # the latents and every layer's indexer keys


# Equals Hugging Face's transformers.GlmMoeDsaForCausalLM(...).logits holding the same weights;
# parity_tests/test_glm_moe_dsa.py checks it in float32 and float64, and through saved checkpoints.
