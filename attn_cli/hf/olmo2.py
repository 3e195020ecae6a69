"""Olmo2ForCausalLM folders -> numpy_attn.olmo2's Olmo2Config: Llama's layout with the block's
norms after the attention and the MLP, and q and k norms over the whole projections."""

from attn_cli.hf.config import Reader
from attn_cli.hf.llama import LAYOUT_KEYS, llama_config, llama_params
from numpy_attn.olmo2 import Olmo2Config

# transformers' Olmo2Config's values for keys left out, where they are not Llama's.
DEFAULTS = {"rms_norm_eps": 1e-5}


def olmo2_config(hf):
    """Olmo2Config from an OLMo 2 config.json (dict), read as llama_config reads Llama's."""
    return llama_config({**DEFAULTS, **hf}, Olmo2Config)


def _olmo2_params(tensors, config):
    """Llama's params, the block's norms read from their places after attention and the MLP, and
    the q and k norms of the projections' widths (nh hs,) and (nkv hs,)."""
    return llama_params(tensors, config, norms=("post_attention_layernorm", "post_feedforward_layernorm"),
                        qk_norm=(config.n_head * config.hs, config.n_kv_head * config.hs))


READER = Reader(dict(LAYOUT_KEYS), olmo2_config, _olmo2_params, defaults=DEFAULTS)
