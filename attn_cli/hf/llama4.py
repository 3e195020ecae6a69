"""Llama4ForCausalLM folders (the text model) -> numpy_attn.llama4's Llama4Config: Llama's
attention projections, the chunked, NoPE and MoE layers, the experts' stacked weights, the router
and the shared expert under ``feed_forward``."""

from attn_cli.hf.config import Reader, context_length, layout_parameter_count, read_layer_types, rope_settings
from attn_cli.hf.files import CheckpointError, _short
from attn_cli.hf.llama import LAYOUT_KEYS, llama_params
from numpy_attn.llama4 import Llama4Config

# Llama's keys, and Llama 4's own (moe_layers, no_rope_layers and layer_types are lists, checked by
# llama4_config and Llama4Config).
KEYS = {
    **LAYOUT_KEYS,
    "intermediate_size_mlp": ("int", 1, False), "num_local_experts": ("int", 1, False),
    "num_experts_per_tok": ("int", 1, False), "interleave_moe_layer_step": ("int", 1, False),
    "no_rope_layer_interval": ("int", 1, False), "attention_chunk_size": ("int or null", 1, False),
    "use_qk_norm": ("bool", None, False), "attn_temperature_tuning": ("bool", None, False),
    "floor_scale": ("int", 1, False), "attn_scale": ("number", None, False), "pad_token_id": ("int or null", 0, False)}

# transformers' Llama4TextConfig's values for keys left out, where they are not Llama's.
DEFAULTS = {"head_dim": 128, "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
            "intermediate_size_mlp": 16384, "num_local_experts": 16, "num_experts_per_tok": 1,
            "attention_chunk_size": 8192, "floor_scale": 8192, "attn_scale": 0.1}


def llama4_config(hf):
    """Llama4Config from a Llama 4 text config.json (dict): Llama's sizes and rope (transformers'
    rotary base 500000 by default), the rotary pairs adjacent, the experts and layers;
    ``layer_types`` must say what no_rope_layers and attention_chunk_size imply (transformers
    masks by it, rotates by no_rope_layers)."""
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"Llama4 config.json: hidden_act {_short(hf['hidden_act'])} is not supported "
                              "(only 'silu')")
    for key in ("moe_layers", "no_rope_layers"):
        if hf.get(key) is not None and not isinstance(hf[key], list):
            raise CheckpointError(f"Llama4 config.json: {key} must be a list or null, got {_short(hf[key])}")
    theta, scaling = rope_settings(hf, "Llama4", theta=500000.0, context=DEFAULTS["max_position_embeddings"])
    n_head = hf["num_attention_heads"]
    config = Llama4Config(
        vocab_size=hf["vocab_size"], block_size=context_length(hf, scaling), n_layer=hf["num_hidden_layers"],
        n_head=n_head, n_kv_head=hf.get("num_key_value_heads") or n_head, n_embd=hf["hidden_size"],
        head_dim=hf.get("head_dim") or hf["hidden_size"] // n_head, hidden=hf["intermediate_size"],
        rms_eps=float(hf["rms_norm_eps"]), rope_theta=float(theta), rope_scaling=scaling,
        attn_bias=hf.get("attention_bias", False), tie_weights=hf.get("tie_word_embeddings", False),
        hidden_mlp=hf["intermediate_size_mlp"], n_experts=hf["num_local_experts"],
        experts_per_token=hf["num_experts_per_tok"], moe_layers=_tuple(hf.get("moe_layers")),
        interleave_moe_layer_step=hf.get("interleave_moe_layer_step", 1),
        no_rope_layers=_tuple(hf.get("no_rope_layers")) or None,      # transformers: empty means the default
        no_rope_layer_interval=hf.get("no_rope_layer_interval", 4), attention_chunk_size=hf["attention_chunk_size"],
        use_qk_norm=hf.get("use_qk_norm", True), attn_temperature_tuning=hf.get("attn_temperature_tuning", True),
        floor_scale=hf["floor_scale"], attn_scale=float(hf["attn_scale"]), pad_token_id=hf.get("pad_token_id"))
    layer_types = read_layer_types(hf, "Llama4")
    implied = tuple("chunked_attention" if config.window(i) else "full_attention" for i in range(config.n_layer))
    if layer_types is not None and layer_types != implied:
        raise CheckpointError(f"Llama4 config.json: layer_types {_short(list(layer_types))} differs from "
                              f"{list(implied)}, what no_rope_layers and attention_chunk_size imply (chunked "
                              "attention on the rotary layers only); remove layer_types or make it agree")
    return config


def _tuple(value):
    return None if value is None else tuple(value)


def _llama4_parameter_count(hf):
    """A lower bound on the parameters: Llama's layout with each layer's network the narrower of
    the dense one (intermediate_size_mlp) and one expert (intermediate_size)."""
    H_mlp = hf.get("intermediate_size_mlp", DEFAULTS["intermediate_size_mlp"])
    return layout_parameter_count({**hf, "intermediate_size": min(hf["intermediate_size"], H_mlp)})


def _feed_forward_params(tensors, prefix, config, i):
    """Block i's network under ``prefix`` (model.layers.i.feed_forward.): a SwiGLU network, or the
    router (E, C) transposed, the experts' stacked weights, already (E, C_in, C_out), gate_up_proj
    (E, C, 2H) holding gate in its first H columns and up in its last (transformers'
    Llama4TextExperts: gate_up.chunk(2)), and the shared expert."""
    C, H, E = config.n_embd, config.hidden, config.n_experts

    def swiglu(prefix, H):
        return {name: {"w": tensors.take(f"{prefix}{name}_proj.weight", (H, C) if name != "down" else (C, H)).T.copy()}
                for name in ("gate", "up", "down")}                                    # (C_out, C_in) -> (C_in, C_out)

    if not config.is_moe(i):
        return swiglu(prefix, config.hidden_mlp)
    gate_up = tensors.take(prefix + "experts.gate_up_proj", (E, C, 2 * H))               # (E, C, 2H)
    return {"router": {"w": tensors.take(prefix + "router.weight", (E, C)).T.copy()},   # (E, C) -> (C, E)
            "experts": {"gate": {"w": gate_up[..., :H].copy()}, "up": {"w": gate_up[..., H:].copy()},   # (E, C, H)
                        "down": {"w": tensors.take(prefix + "experts.down_proj", (E, H, C))}},
            "shared": swiglu(prefix + "shared_expert.", H)}


def llama4_params(tensors, config):
    """Llama's params (attention, norms, embedding, head) with each block's "mlp" read from its
    feed_forward tensors."""
    params = llama_params(tensors, config, mlp=lambda tensors, prefix, config: None)   # no mlp. tensors
    for i, block in params["blocks"].items():
        block["mlp"] = _feed_forward_params(tensors, f"model.layers.{i}.feed_forward.", config, int(i))
    return params


READER = Reader(KEYS, llama4_config, llama4_params, parameter_count=_llama4_parameter_count, defaults=DEFAULTS)
