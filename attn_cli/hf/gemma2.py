"""Gemma2ForCausalLM folders -> numpy_attn.gemma2's Gemma2Config: four norms per block, capped
scores and logits, sliding layers; Llama's layout otherwise."""

import dataclasses

from attn_cli.hf.config import Reader, read_layer_types
from attn_cli.hf.files import CheckpointError, _short
from attn_cli.hf.llama import LAYOUT_KEYS, llama_config, llama_params
from numpy_attn._model import LAYER_TYPES
from numpy_attn.gemma2 import Gemma2Config

# Gemma 2 names its activation hidden_activation; the rest are its score scale, caps and window.
KEYS = {
    **{key: rule for key, rule in LAYOUT_KEYS.items() if key != "hidden_act"},
    "hidden_activation": ("str", None, False), "query_pre_attn_scalar": ("number", 0, False),
    "attn_logit_softcapping": ("number or null", 0, False), "final_logit_softcapping": ("number or null", 0, False),
    "sliding_window": ("int", 1, False), "use_bidirectional_attention": ("bool or null", None, False)}

# transformers' Gemma2Config's values for keys left out, where they are not Llama's.
DEFAULTS = {"head_dim": 256, "num_key_value_heads": 4, "max_position_embeddings": 8192, "tie_word_embeddings": True}


def gemma2_config(hf, config_class=Gemma2Config, **extra):
    """Gemma2Config (or Gemma3Config, with ``extra`` fields) from a Gemma 2 config.json (dict):
    llama_config's reading (tied weights by default), and the activation, score scale, caps,
    window and layer types checked and read."""
    family = config_class.__name__.removesuffix("Config")         # "Gemma2", "Gemma3"
    hf = {**DEFAULTS, **hf}
    if hf.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise CheckpointError(f"{family} config.json: hidden_activation {hf['hidden_activation']!r} is not "
                              "supported (only 'gelu_pytorch_tanh')")
    if hf.get("use_bidirectional_attention"):
        raise CheckpointError(f"{family} config.json: use_bidirectional_attention = True is not supported "
                              "(causal only)")
    n_layer = hf["num_hidden_layers"]
    layer_types = hf.get("layer_types")
    if isinstance(layer_types, list):            # one per layer (else refused naming both numbers), as a tuple
        layer_types = read_layer_types(hf, family)
    if layer_types is not None and (not isinstance(layer_types, tuple)
                                    or any(t not in LAYER_TYPES for t in layer_types)):
        raise CheckpointError(f"{family} config.json: layer_types must list num_hidden_layers = {n_layer} entries, "
                              f"each 'sliding_attention' or 'full_attention', got {_short(hf['layer_types'])}")
    base = llama_config({**hf, "hidden_act": "silu"}, config_class)
    defaults = {"attn_logit_softcapping": base.attn_logit_softcap, "final_logit_softcapping": base.final_logit_softcap}
    caps = {key: None if hf.get(key, default) is None else float(hf.get(key, default))
            for key, default in defaults.items()}
    return dataclasses.replace(
        base, query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar", 256)),
        attn_logit_softcap=caps["attn_logit_softcapping"], final_logit_softcap=caps["final_logit_softcapping"],
        sliding_window=hf.get("sliding_window", 4096), layer_types=layer_types, **extra)


def gemma2_params(tensors, config, qk_norm=None):
    """Llama's params with the norms before the sublayers as attn_norm and mlp_norm, and the two
    after them (post-attention, post-feedforward) as attn_post_norm and mlp_post_norm; ``qk_norm``
    as llama_params reads it (Gemma 3)."""
    params = llama_params(tensors, config, norms=("input_layernorm", "pre_feedforward_layernorm"), qk_norm=qk_norm)
    C = config.n_embd
    for i, block in params["blocks"].items():
        p = f"model.layers.{i}."
        block["attn_post_norm"] = {"w": tensors.take(p + "post_attention_layernorm.weight", (C,))}
        block["mlp_post_norm"] = {"w": tensors.take(p + "post_feedforward_layernorm.weight", (C,))}
    return params


READER = Reader(KEYS, gemma2_config, gemma2_params, defaults=DEFAULTS)
