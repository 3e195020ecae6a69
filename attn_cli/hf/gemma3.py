"""Gemma3ForCausalLM folders -> numpy_attn.gemma3's Gemma3Config: Gemma 2's reading, with q and k
norms per head and the local layers' own rope base."""

from attn_cli.hf.config import Reader, check_rope_object
from attn_cli.hf.files import KINDS, CheckpointError, _short
from attn_cli.hf.gemma2 import KEYS as GEMMA2_KEYS
from attn_cli.hf.gemma2 import gemma2_config, gemma2_params
from numpy_attn._model import LAYER_TYPES
from numpy_attn.gemma3 import Gemma3Config

# Gemma 2's keys, the local layers' rotary base and the layers' pattern in transformers 4's spelling.
KEYS = {**GEMMA2_KEYS, "rope_local_base_freq": ("number", 0, False), "sliding_window_pattern": ("int", 1, False)}
# transformers' Gemma3TextConfig's values for keys left out, where they are not Llama's (the
# global layers' rope_theta is 10^6; the local layers' 10^4, as Llama's).
DEFAULTS = {"head_dim": 256, "num_key_value_heads": 4, "max_position_embeddings": 131072, "tie_word_embeddings": True,
            "rope_theta": 1_000_000.0, "sliding_window_pattern": 6}
ROPE_LAYERS = ("full_attention", "sliding_attention")


def gemma3_config(hf):
    """Gemma3Config from a Gemma 3 text config.json (dict): gemma2_config's reading, with

    - the rope settings per layer type (transformers 5: rope_parameters {"full_attention": ...,
      "sliding_attention": ...}; before: rope_theta and rope_local_base_freq); rope_scaling, where
      given, updates the global layers' settings, key by key, as transformers' Gemma3TextConfig
      does; the local layers' rope must be the default kind;
    - layer_types, where absent, from transformers 4's sliding_window_pattern p (default 6): layer
      i is global where (i + 1) is a multiple of p, as transformers derives them;
    - no cap on the scores: transformers' Gemma 3 attention does not apply attn_logit_softcapping,
      so the key is read as absent (final_logit_softcapping is applied, as there)."""
    hf = {**DEFAULTS, **hf}
    rope = hf.get("rope_parameters") or {}
    flat = sorted(set(rope) - set(ROPE_LAYERS))
    if flat:           # transformers keeps its defaults per layer type beside such keys, and reads none of them
        raise CheckpointError(f"Gemma3 config.json: rope_parameters must hold the settings per layer type "
                              f"({', '.join(ROPE_LAYERS)}); the key {flat[0]!r} at its top is not read by "
                              "transformers' Gemma 3: move it into full_attention")
    full, local = rope.get("full_attention") or {"rope_type": "default"}, rope.get("sliding_attention") or {}
    if not isinstance(full, dict) or not isinstance(local, dict):
        raise CheckpointError(f"Gemma3 config.json: rope_parameters' entries must be objects, got {_short(rope)}")
    full = {**full, **(hf.get("rope_scaling") or {})}
    check_rope_object(local, hf, "Gemma3")      # the global layers' by gemma2_config's rope_settings
    if local.get("rope_type", local.get("type", "default")) != "default":
        raise CheckpointError(f"Gemma3 config.json: rope_parameters.sliding_attention must be of the default "
                              f"rope_type, got {_short(local)}")
    local_theta = local.get("rope_theta", hf.get("rope_local_base_freq", 10000.0))
    if not KINDS["number"](local_theta) or local_theta <= 0:
        raise CheckpointError(f"Gemma3 config.json: the local layers' rope_theta must be a number > 0, "
                              f"got {_short(local_theta)}")
    layer_types = hf.get("layer_types")
    if layer_types is None:
        pattern = hf["sliding_window_pattern"]
        layer_types = [LAYER_TYPES[(i + 1) % pattern == 0] for i in range(hf["num_hidden_layers"])]
    hf = {**hf, "rope_parameters": full, "rope_scaling": None, "layer_types": layer_types,
          "attn_logit_softcapping": None}
    return gemma2_config(hf, Gemma3Config, rope_local_theta=float(local_theta))


def gemma3_params(tensors, config):
    """Gemma 2's params with the q and k norms, one weight (hs,) shared by the heads."""
    return gemma2_params(tensors, config, qk_norm=(config.hs, config.hs))


READER = Reader(KEYS, gemma3_config, gemma3_params, defaults=DEFAULTS)
