"""GptOssForCausalLM folders -> numpy_attn.gpt_oss's GptOssConfig: Llama's attention with biases
and sinks, sliding and full layers, YaRN, a mixture of experts for its MLP."""

import dataclasses

from attn_cli.hf.config import Reader, check_rope_object, context_length, read_layer_types
from attn_cli.hf.files import CheckpointError, _short
from attn_cli.hf.llama import LAYOUT_KEYS, llama_config, llama_params
from numpy_attn.gpt_oss import GptOssConfig
from numpy_attn.rope import SCALING_KEYS

# Llama's keys but its activation (the experts' clamped GLU is fixed, whatever hidden_act says), the
# experts, the GLU's alpha and limit, the window, and quantization_config (refused: MXFP4 is not
# read); layer_types is checked by gpt_oss_config and GptOssConfig.
KEYS = {
    **{key: rule for key, rule in LAYOUT_KEYS.items() if key != "hidden_act"},
    "num_local_experts": ("int", 1, True), "num_experts_per_tok": ("int", 1, True),
    "swiglu_alpha": ("number", None, False), "swiglu_limit": ("number", 0, False),
    "sliding_window": ("int or null", 1, False), "quantization_config": ("object or null", None, False)}
# The rope_parameters (or rope_scaling) keys of YaRN that numpy_attn/rope.py reads.
GPT_OSS_YARN_KEYS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "truncate",
                     "attention_factor", "mscale", "mscale_all_dim")

# transformers' GptOssConfig's values for keys left out, where they are not Llama's, and its rope
# where config.json gives no rope_parameters: YaRN stretching 4096 positions 32 times.
DEFAULTS = {"head_dim": 64, "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
            "rope_theta": 150000.0}
DEFAULT_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}


def gpt_oss_config(hf):
    """GptOssConfig from a gpt-oss config.json (dict): llama_config's reading (attention biases on by
    default), the rope as rope_parameters (transformers 5) or rope_theta and rope_scaling says, of any
    type numpy_attn/rope.py implements (a key it does not read for that type refused), the experts,
    the window and the layer types; quantised experts refused."""
    if hf.get("quantization_config") is not None:
        raise CheckpointError(f"gpt-oss config.json: quantization_config {_short(hf['quantization_config'])} is not "
                              "supported (MXFP4 experts are not read here); save the model dequantised")
    if hf["num_experts_per_tok"] > hf["num_local_experts"]:
        raise CheckpointError(f"gpt-oss config.json: num_experts_per_tok = {hf['num_experts_per_tok']} must be at "
                              f"most num_local_experts = {hf['num_local_experts']}")
    hf = {**DEFAULTS, **hf}
    # transformers' GptOssConfig: rope_parameters absent (null) is its YaRN; a non-empty rope_scaling
    # wins over either, whole (config.rope_settings says how).
    parameters = DEFAULT_ROPE if hf.get("rope_parameters") is None else hf["rope_parameters"]
    rope = dict(hf.get("rope_scaling") or parameters)
    check_rope_object(rope, hf, "gpt-oss")
    theta = rope.pop("rope_theta", hf["rope_theta"])
    rope_type = rope.pop("rope_type", rope.pop("type", "default"))
    if not isinstance(rope_type, str) or rope_type not in SCALING_KEYS:
        raise CheckpointError(f"gpt-oss config.json: rope_type {_short(rope_type)} is not supported "
                              f"(one of {sorted(SCALING_KEYS)})")
    # dynamic NTK's original context is max_position_embeddings, where transformers reads it.
    read = {"yarn": GPT_OSS_YARN_KEYS, "dynamic": ("factor",)}.get(rope_type, SCALING_KEYS[rope_type])
    unknown = sorted(set(rope) - set(read))
    if unknown:
        raise CheckpointError(f"gpt-oss config.json: rope_parameters key {unknown[0]!r} is not read for rope_type "
                              f"{rope_type!r} (read: {', '.join(read) or 'none besides rope_theta'})")
    layer_types = read_layer_types(hf, "gpt-oss")     # one per layer; GptOssConfig checks the entries
    sliding = layer_types is None or "sliding_attention" in layer_types
    if sliding and hf.get("sliding_window", 128) is None:
        raise CheckpointError("gpt-oss config.json: sliding_window = null with sliding_attention layers "
                              "(give the window, or make every layer full_attention)")
    base = llama_config({**hf, "hidden_act": "silu", "rope_parameters": {"rope_theta": theta}, "rope_scaling": None,
                         "attention_bias": hf.get("attention_bias", True)}, GptOssConfig)
    if rope_type == "dynamic":
        rope["original_max_position_embeddings"] = hf["max_position_embeddings"]
    elif rope_type in ("llama3", "yarn"):
        rope.setdefault("original_max_position_embeddings", hf["max_position_embeddings"])
    scaling = None if rope_type == "default" else {"rope_type": rope_type, **rope}
    return dataclasses.replace(
        base, rope_scaling=scaling, block_size=context_length(hf, scaling),
        n_experts=hf["num_local_experts"], experts_per_token=hf["num_experts_per_tok"],
        swiglu_alpha=float(hf.get("swiglu_alpha", 1.702)), swiglu_limit=float(hf.get("swiglu_limit", 7.0)),
        sliding_window=hf.get("sliding_window") or 128, layer_types=layer_types)


def _gpt_oss_moe_params(tensors, prefix, config):
    """A block's mixture of experts: the router (E, C) transposed, and the experts' stacked weights,
    already (E, C_in, C_out); gate_up_proj (E, C, 2H) holds gate in its even columns and up in its odd
    ones (transformers' GptOssExperts: gate_up[..., ::2], gate_up[..., 1::2]), its bias likewise."""
    C, H, E = config.n_embd, config.hidden, config.n_experts
    gate_up = tensors.take(prefix + "experts.gate_up_proj", (E, C, 2 * H))             # (E, C, 2H)
    gate_up_b = tensors.take(prefix + "experts.gate_up_proj_bias", (E, 2 * H))         # (E, 2H)
    return {"router": {"w": tensors.take(prefix + "router.weight", (E, C)).T.copy(),   # (E, C) -> (C, E)
                       "b": tensors.take(prefix + "router.bias", (E,))},
            "experts": {"gate": {"w": gate_up[..., 0::2].copy(), "b": gate_up_b[..., 0::2].copy()},   # (E, C, H)
                        "up": {"w": gate_up[..., 1::2].copy(), "b": gate_up_b[..., 1::2].copy()},     # (E, C, H)
                        "down": {"w": tensors.take(prefix + "experts.down_proj", (E, H, C)),
                                 "b": tensors.take(prefix + "experts.down_proj_bias", (E, C))}}}


def _gpt_oss_params(tensors, config):
    """Llama's params with the experts as each block's "mlp" and each attention's sinks (nh,)."""
    params = llama_params(tensors, config, mlp=_gpt_oss_moe_params)
    for i, block in params["blocks"].items():
        block["attn"]["sinks"] = tensors.take(f"model.layers.{i}.self_attn.sinks", (config.n_head,))
    return params


READER = Reader(KEYS, gpt_oss_config, _gpt_oss_params, aliases={"num_experts": "num_local_experts"},
                defaults=DEFAULTS)
