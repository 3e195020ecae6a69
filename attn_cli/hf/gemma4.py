"""Gemma4ForCausalLM folders (the text model, model_type gemma4_text) -> numpy_attn.gemma4's
Gemma4Config: Gemma 2's keys without the score scale and caps on the scores, the global layers'
head size (and with keys as values their key/value heads) from per_layer_config, RoPE per layer
type, shared key/value layers, each layer's scalar, the per-layer inputs, keys as values, the
shared layers' double-wide MLP and the experts beside the MLP.
What numpy_attn.gemma4 leaves off is refused naming its key."""

from attn_cli.hf.config import Reader
from attn_cli.hf.files import CheckpointError, _short
from attn_cli.hf.gemma2 import KEYS as GEMMA2_KEYS
from attn_cli.hf.llama import llama_config, read_linear, with_norm_and_head
from numpy_attn.gemma4 import Gemma4Config

SCORE_KEYS = ("query_pre_attn_scalar", "attn_logit_softcapping")
KEYS = {**{key: rule for key, rule in GEMMA2_KEYS.items() if key not in SCORE_KEYS},
        "num_kv_shared_layers": ("int", 0, False), "hidden_size_per_layer_input": ("int or null", 0, False),
        "vocab_size_per_layer_input": ("int", 1, False), "num_experts": ("int or null", 1, False),
        "top_k_experts": ("int or null", 1, False), "moe_intermediate_size": ("int or null", 1, False),
        "num_global_key_value_heads": ("int or null", 1, False),
        "attention_k_eq_v": ("bool", None, False), "enable_moe_block": ("bool", None, False),
        "use_double_wide_mlp": ("bool", None, False), "per_layer_config": ("object or null", None, False),
        "pad_token_id": ("int or null", 0, False), "global_head_dim": ("int", 1, False),
        "use_bidirectional_attention": ("str or null", None, False)}
# transformers' Gemma4TextConfig's values for keys left out, where they are not Llama's.
DEFAULTS = {"head_dim": 256, "num_key_value_heads": 4, "max_position_embeddings": 131072, "tie_word_embeddings": True,
            "rms_norm_eps": 1e-6, "sliding_window": 512, "final_logit_softcapping": None, "pad_token_id": 0,
            "hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": 262144, "num_hidden_layers": 30}
# Each switch transformers has and numpy_attn.gemma4 leaves off: key -> the values read ("vision"
# makes only image tokens see each other: text alone stays causal).
OFF = {"use_bidirectional_attention": (None, "vision")}
ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}}


def gemma4_config(hf):
    """Gemma4Config from a Gemma 4 text config.json (dict): llama_config's sizes, the window, logit cap
    and layer types (default: five sliding, one global, the last global), and

    - the global layers' head size and key/value heads from ``per_layer_config`` (save_pretrained
      writes each global layer's {"head_dim"[, "num_key_value_heads"]}, none where they are the
      base ones; any other per-layer setting is refused), or without it global_head_dim (default
      512) and, with attention_k_eq_v only, num_global_key_value_heads, as transformers builds them;
    - ``rope_parameters`` per layer type: the sliding layers' of the default kind, the global
      layers' default or proportional (its partial_rotary_factor), neither scaled;
    - num_kv_shared_layers and pad_token_id; hidden_size_per_layer_input (0 or null: none) and
      vocab_size_per_layer_input; attention_k_eq_v; use_double_wide_mlp; enable_moe_block with
      num_experts, top_k_experts and moe_intermediate_size; the switches of OFF refused unless off."""
    hf = {**DEFAULTS, **hf}
    for key, allowed in OFF.items():
        if hf.get(key, allowed[0]) not in allowed:
            raise CheckpointError(f"Gemma4 config.json: {key} = {_short(hf[key])} is not supported (numpy_attn's "
                                  f"Gemma 4 reads {' or '.join(map(repr, allowed))} only)")
    if hf.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise CheckpointError(f"Gemma4 config.json: hidden_activation {_short(hf['hidden_activation'])} is not "
                              "supported (only 'gelu_pytorch_tanh')")
    n_layer = hf["num_hidden_layers"]
    layer_types = hf.get("layer_types") or [
        "full_attention" if (i + 1) % 6 == 0 or i == n_layer - 1 else "sliding_attention" for i in range(n_layer)]
    rope = {**ROPE, **(hf.get("rope_parameters") or {})}
    settings = {}
    for kind, allowed in (("sliding_attention", ("default",)), ("full_attention", ("default", "proportional"))):
        entry = rope.get(kind)
        if not isinstance(entry, dict) or entry.get("rope_type", "default") not in allowed \
                or entry.get("factor", 1.0) != 1.0:
            raise CheckpointError(f"Gemma4 config.json: rope_parameters.{kind} must be an unscaled rope of kind "
                                  f"{' or '.join(allowed)}, got {_short(entry)}")
        settings[kind] = entry
    full = settings["full_attention"]
    partial = full.get("partial_rotary_factor", 1.0) if full.get("rope_type") == "proportional" else 1.0
    # transformers builds per_layer_config from global_head_dim (default 512) where config.json has
    # none; one that has it (save_pretrained writes it, {} where the sizes agree) is read as it stands.
    if hf.get("per_layer_config") is None:
        global_hs = hf.get("global_head_dim", 512)
        global_nkv = hf.get("num_global_key_value_heads") if hf.get("attention_k_eq_v") else None
    else:
        global_hs, global_nkv = base_hs(hf), None
    for index, override in (hf.get("per_layer_config") or {}).items():
        if not isinstance(override, dict) or set(override) - {"head_dim", "num_key_value_heads"} \
                or not str(index).isdigit() or int(index) >= n_layer or layer_types[int(index)] != "full_attention":
            raise CheckpointError(f"Gemma4 config.json: per_layer_config may set only a global layer's head_dim and "
                                  f"num_key_value_heads, got {_short({index: override})}")
        global_hs = override.get("head_dim", global_hs)
        global_nkv = override.get("num_key_value_heads", global_nkv)
    for key in ("head_dim", "num_key_value_heads"):
        if hf.get("per_layer_config") and len({v.get(key) for v in hf["per_layer_config"].values()}) > 1:
            raise CheckpointError(f"Gemma4 config.json: per_layer_config gives the global layers different {key}, "
                                  f"got {_short(hf['per_layer_config'])}")
    base = llama_config({**hf, "hidden_act": "silu", "rope_parameters": None, "rope_scaling": None}, Gemma4Config)
    cap = hf.get("final_logit_softcapping")
    per_layer = hf["hidden_size_per_layer_input"] or 0
    return Gemma4Config(**{
        **{key: getattr(base, key) for key in ("vocab_size", "block_size", "n_layer", "n_head", "n_kv_head",
                                               "n_embd", "head_dim", "hidden", "rms_eps", "tie_weights")},
        "final_logit_softcap": None if cap is None else float(cap), "sliding_window": hf["sliding_window"],
        "layer_types": tuple(layer_types) if isinstance(layer_types, list) else layer_types,
        "rope_theta": float(full.get("rope_theta", 1e6)),
        "rope_local_theta": float(settings["sliding_attention"].get("rope_theta", 1e4)),
        "partial_rotary_factor": float(partial), "global_head_dim": global_hs,
        "n_kv_shared_layers": hf.get("num_kv_shared_layers", 0), "pad_token_id": hf.get("pad_token_id"),
        "per_layer_input_size": per_layer,
        "per_layer_vocab_size": hf["vocab_size_per_layer_input"] if per_layer else None,
        "attention_k_eq_v": bool(hf.get("attention_k_eq_v", False)),
        "global_n_kv_head": None if global_nkv == base.n_kv_head else global_nkv,
        "double_wide_mlp": bool(hf.get("use_double_wide_mlp", False)),
        "enable_moe": bool(hf.get("enable_moe_block", False)),
        **({"n_experts": hf.get("num_experts"), "experts_per_token": hf.get("top_k_experts"),
            "moe_hidden": hf.get("moe_intermediate_size")} if hf.get("enable_moe_block") else {})})


def base_hs(hf):
    """config.json's head_dim, or hidden_size // num_attention_heads."""
    return hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]


def gemma4_params(tensors, config):
    """Each block's four norms, q, o and q-norm, k, v and k-norm on a layer that makes its keys
    (a shared layer's, where the file holds them, dropped: transformers ignores them too), GeGLU,
    the per-layer inputs' gate, projection and norm where it has them, and layer_scalar (1,); the
    model's per-layer embedding, projection and norm; every linear weight transposed to (in, out)."""
    C, nh = config.n_embd, config.n_head
    L, P = config.n_layer, config.per_layer_input_size
    norms = {"attn_norm": "input_layernorm", "attn_post_norm": "post_attention_layernorm",
             "mlp_norm": "pre_feedforward_layernorm", "mlp_post_norm": "post_feedforward_layernorm"}
    params = {"wte": tensors.take("model.embed_tokens.weight", (config.vocab_size, C)), "blocks": {}}
    for i in range(config.n_layer):
        p, hs, nkv = f"model.layers.{i}.", config.layer_hs(i), config.layer_nkv(i)
        attn = {"q": read_linear(tensors, p + "self_attn.q_proj", C, nh * hs)}
        if config.kv_source(i) == i:
            attn["k"] = read_linear(tensors, p + "self_attn.k_proj", C, nkv * hs)
            if not config.k_eq_v(i):   # where the values are the keys, transformers has no v_proj
                attn["v"] = read_linear(tensors, p + "self_attn.v_proj", C, nkv * hs)
        else:
            for name in ("k_proj.weight", "v_proj.weight", "k_norm.weight", "v_norm.weight"):
                tensors.drop(p + "self_attn." + name)
        attn["o"] = read_linear(tensors, p + "self_attn.o_proj", nh * hs, C)
        attn["q_norm"] = {"w": tensors.take(p + "self_attn.q_norm.weight", (hs,))}
        if config.kv_source(i) == i:
            attn["k_norm"] = {"w": tensors.take(p + "self_attn.k_norm.weight", (hs,))}
        block = {ours: {"w": tensors.take(f"{p}{theirs}.weight", (C,))} for ours, theirs in norms.items()}
        block["attn"] = attn
        H = config.layer_hidden(i)   # twice hidden on a shared layer with use_double_wide_mlp
        block["mlp"] = {"gate": read_linear(tensors, p + "mlp.gate_proj", C, H),
                        "up": read_linear(tensors, p + "mlp.up_proj", C, H),
                        "down": read_linear(tensors, p + "mlp.down_proj", H, C)}
        if config.enable_moe:
            block["moe"] = read_moe(tensors, p, config)
        if P:
            block["per_layer"] = {"gate": read_linear(tensors, p + "per_layer_input_gate", C, P),
                                  "proj": read_linear(tensors, p + "per_layer_projection", P, C),
                                  "norm": {"w": tensors.take(p + "post_per_layer_input_norm.weight", (C,))}}
        block["layer_scalar"] = {"w": tensors.take(p + "layer_scalar", (1,))}
        params["blocks"][str(i)] = block
    if P:
        params["per_layer"] = {"wte": tensors.take("model.embed_tokens_per_layer.weight",
                                                   (config.per_layer_vocab_size, L * P)),
                               "proj": read_linear(tensors, "model.per_layer_model_projection", C, L * P),
                               "norm": {"w": tensors.take("model.per_layer_projection_norm.weight", (P,))}}
    return with_norm_and_head(params, tensors, config)


def read_moe(tensors, p, config):
    """Layer ``p``'s router (proj transposed, scale, per_expert_scale), experts (the (E, 2h, C)
    gate_up_proj split into gate and up and, as down_proj, each expert's weight turned to (in, out))
    and the three norms around them."""
    C, E, h = config.n_embd, config.n_experts, config.moe_hidden
    gate_up = tensors.take(p + "experts.gate_up_proj", (E, 2 * h, C))
    down = tensors.take(p + "experts.down_proj", (E, C, h))
    norms = {"dense_post_norm": "post_feedforward_layernorm_1", "norm": "pre_feedforward_layernorm_2",
             "post_norm": "post_feedforward_layernorm_2"}
    return {"router": {"w": read_linear(tensors, p + "router.proj", C, E)["w"],
                       "scale": tensors.take(p + "router.scale", (C,)),
                       "expert_scale": tensors.take(p + "router.per_expert_scale", (E,))},
            "experts": {"gate": {"w": gate_up[:, :h].transpose(0, 2, 1).copy()},      # (E, C, h)
                        "up": {"w": gate_up[:, h:].transpose(0, 2, 1).copy()},        # (E, C, h)
                        "down": {"w": down.transpose(0, 2, 1).copy()}},               # (E, h, C)
            **{ours: {"w": tensors.take(f"{p}{theirs}.weight", (C,))} for ours, theirs in norms.items()}}


def gemma4_parameter_count(hf):
    """A lower bound on the parameters config.json implies: the embedding, each layer's MLP and
    norms, and the per-layer inputs' embedding (of DEFAULTS' sizes where config.json has none)."""
    hf = {**DEFAULTS, **hf}
    C, L, P = hf["hidden_size"], hf["num_hidden_layers"], hf["hidden_size_per_layer_input"] or 0
    return hf["vocab_size"] * C + L * (3 * C * hf["intermediate_size"] + 4 * C) + C \
        + hf["vocab_size_per_layer_input"] * L * P


READER = Reader(KEYS, gemma4_config, gemma4_params, gemma4_parameter_count, defaults=DEFAULTS)
