"""Gemma3ForCausalLM folders -> numpy_attn.gemma3's Gemma3Config: Gemma 2's reading, with q and k
norms per head and the local layers' own rope base."""

from attn_cli.hf.config import Reader
from attn_cli.hf.files import KINDS, CheckpointError, _short
from attn_cli.hf.gemma2 import KEYS as GEMMA2_KEYS
from attn_cli.hf.gemma2 import gemma2_config, gemma2_params
from numpy_attn.gemma3 import Gemma3Config

# Gemma 2's keys, and the local layers' rotary base in the older spelling.
KEYS = {**GEMMA2_KEYS, "rope_local_base_freq": ("number", 0, False)}


def gemma3_config(hf):
    """Gemma3Config from a Gemma 3 text config.json (dict): gemma2_config's reading, with the rope
    settings per layer type (transformers 5: rope_parameters {"full_attention": ..., "sliding_attention":
    ...}; before: rope_theta and rope_local_base_freq); the local layers' rope must be the default kind."""
    rope = hf.get("rope_parameters") or {}
    if "full_attention" in rope or "sliding_attention" in rope:
        local = rope.get("sliding_attention") or {}
        if not isinstance(local, dict) or local.get("rope_type", "default") != "default":
            raise CheckpointError(f"Gemma3 config.json: rope_parameters.sliding_attention must be of the default "
                                  f"rope_type, got {_short(local)}")
        local_theta = local.get("rope_theta", 10000.0)
        hf = {**hf, "rope_parameters": rope.get("full_attention")}
    else:
        local_theta = hf.get("rope_local_base_freq", 10000.0)
    if not KINDS["number"](local_theta) or local_theta <= 0:
        raise CheckpointError(f"Gemma3 config.json: the local layers' rope_theta must be a number > 0, "
                              f"got {_short(local_theta)}")
    return gemma2_config(hf, Gemma3Config, rope_local_theta=float(local_theta))


def gemma3_params(tensors, config):
    """Gemma 2's params with the q and k norms, one weight (hs,) shared by the heads."""
    return gemma2_params(tensors, config, qk_norm=(config.hs, config.hs))


READER = Reader(KEYS, gemma3_config, gemma3_params)
