"""GLM-5 (GLM-MoE-DSA): DeepSeek-V3.2 (numpy_attn/deepseek_v32.py) whose indexer pairs its rotary
channels interleaved, and whose "shared" layers have no indexer: they attend over the keys the
last "full" layer before them selected.

    selected_i = indexer_i(h, c_q)       on a "full" layer (indexer_types[i])
    selected_i = selected_j              on a "shared" one, j the last full layer before i
    x          = x + mla(h, mask = selected_i)      then DeepSeek-V3's networks

Z.ai's GLM-5 in the form of Hugging Face's ``GlmMoeDsaForCausalLM``: its indexer is
``GlmMoeDsaIndexer``, DeepSeek-V3.2's with interleaved rope (lightning_indexer.py's
``rope_layout="interleaved"``), and ``indexer_types`` lists each layer's mode (every layer "full"
by default, as transformers' default schedule gives); layer 0 must be full. Decoding keeps
DeepSeek-V3.2's cache (a shared layer's indexer keys stay unused).
"""

from dataclasses import dataclass

import numpy as np

from numpy_attn import _model
from numpy_attn._checks import check_rng
from numpy_attn._family import Family
from numpy_attn.deepseek_v32 import (
    DeepseekV32Config,
    deepseek_v32_kv_cache,
    dsa_decoder_forward,
    init_deepseek_v32_params,
)
from numpy_attn.llama import llama_block_backward


@dataclass(frozen=True)
class GlmMoeDsaConfig(DeepseekV32Config):
    """DeepseekV32Config's fields and checks, and each layer's indexer mode."""

    INDEXER_ROPE_LAYOUT = "interleaved"  # GLM-5's indexer pairs its rotary channels (2j, 2j+1)
    INDEXER_TYPES = ("full", "shared")   # its own indexer, or the last full layer's selection
    indexer_types: tuple | None = None   # n_layer of "full", "shared"; None: every layer full

    def __post_init__(self):
        super().__post_init__()
        types = ("full",) * self.n_layer if self.indexer_types is None else self.indexer_types
        if isinstance(types, str) or not isinstance(types, tuple | list) or len(types) != self.n_layer \
                or any(t not in self.INDEXER_TYPES for t in types):
            raise ValueError(f"GlmMoeDsaConfig.indexer_types must list n_layer = {self.n_layer} entries of "
                             f"{self.INDEXER_TYPES}, got {types!r}")
        if types and types[0] != "full":
            raise ValueError("GlmMoeDsaConfig.indexer_types[0] must be 'full': a shared layer reuses an earlier "
                             "layer's selection")
        object.__setattr__(self, "indexer_types", tuple(types))


def init_glm_moe_dsa_params(config, rng, dtype=np.float32):
    """init_deepseek_v32_params' tree without an indexer on the shared layers."""
    check_rng(rng, "init_glm_moe_dsa_params")
    params = init_deepseek_v32_params(config, rng, dtype)
    for i, block in params["blocks"].items():
        if config.indexer_types[int(i)] == "shared":
            del block["attn"]["indexer"]
    return params


def glm_moe_dsa_forward(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
                        logits_to_keep=None, for_backward=True):
    """Logits for integer ``ids`` (B, T) -> (B, T, V), as deepseek_v32_forward (same keywords,
    ``kv_cache`` from glm_moe_dsa_kv_cache). Returns ``(logits, cache)``."""
    return dsa_decoder_forward("glm_moe_dsa_forward", GlmMoeDsaConfig, ids, params, config, positions=positions,
                               attn_mask=attn_mask, kv_cache=kv_cache, rng=rng, logits_to_keep=logits_to_keep,
                               for_backward=for_backward)


def glm_moe_dsa_backward(dlogits, cache):
    """Gradients: dlogits (B, T, V) -> dparams, with the nesting of the params (the indexers' zeros)."""
    return _model.decoder_backward("glm_moe_dsa", dlogits, cache, llama_block_backward)


glm_moe_dsa_kv_cache = deepseek_v32_kv_cache   # the latents and every layer's indexer keys


FAMILY = Family(name="glm_moe_dsa", title="GLM-5", architectures=("GlmMoeDsaForCausalLM",), config=GlmMoeDsaConfig,
                forward=glm_moe_dsa_forward, backward=glm_moe_dsa_backward, kv_cache=glm_moe_dsa_kv_cache,
                init_params=init_glm_moe_dsa_params)
