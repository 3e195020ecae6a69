"""Qwen3ForCausalLM folders -> numpy_attn.qwen3's Qwen3Config: Llama's layout, with q and k norms
per head (hs,)."""

from attn_cli.hf.config import Reader, read_layer_types
from attn_cli.hf.files import CheckpointError, _short
from attn_cli.hf.llama import LAYOUT_KEYS, llama_config, llama_params
from numpy_attn.qwen3 import Qwen3Config

# Llama's keys, and the sliding-window keys, read to be checked (qwen3_config refuses the window,
# which is not implemented).
KEYS = {**LAYOUT_KEYS, "use_sliding_window": ("bool", None, False), "sliding_window": ("int or null", 1, False),
        "max_window_layers": ("int", 0, False)}

# transformers' Qwen3Config's values for keys left out, where they are not Llama's (128 whatever
# hidden_size says; 32 key/value heads).
DEFAULTS = {"head_dim": 128, "num_key_value_heads": 32, "max_position_embeddings": 32768}


def qwen3_config(hf):
    """Qwen3Config from a Qwen3 config.json (dict): llama_config's reading, and the sliding window
    (``use_sliding_window``, off in the released models) refused, as it is not implemented here."""
    if hf.get("use_sliding_window", False):
        raise CheckpointError("Qwen3 config.json: use_sliding_window = True is not supported (sliding-window "
                              "layers are not implemented for Qwen3; only full attention)")
    layer_types = hf.get("layer_types")
    if layer_types is not None and (not isinstance(layer_types, list)
                                    or any(t not in ("full_attention", "attention") for t in layer_types)):
        raise CheckpointError(f"Qwen3 config.json: layer_types must list only 'full_attention' (sliding-window "
                              f"layers are not implemented for Qwen3), got {_short(layer_types)}")
    read_layer_types(hf, "Qwen3")                                          # one per layer
    return llama_config({**DEFAULTS, **hf}, Qwen3Config)


def qwen3_params(tensors, config):
    """Llama's params with the q and k norms, one weight (hs,) shared by the heads."""
    return llama_params(tensors, config, qk_norm=(config.hs, config.hs))


READER = Reader(KEYS, qwen3_config, qwen3_params, defaults=DEFAULTS)
