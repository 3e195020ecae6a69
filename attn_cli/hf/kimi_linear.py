"""KimiLinearForCausalLM folders -> numpy_attn.kimi_linear's KimiLinearConfig and params: the layer
types, KDA's sizes, MLA's ranks and widths, the experts and their routing.

transformers saves Kimi Linear in the layout of the released checkpoints, not its modules': each
layer's network under ``block_sparse_moe`` (the dense ones too), each expert's three projections
``w1`` (gate), ``w3`` (up), ``w2`` (down), and KDA's convolution as three, ``q_conv1d``,
``k_conv1d``, ``v_conv1d`` (nh d, 1, K) each, which are stacked into our one (3 nh d, K). Its
config.json spells the experts' keys as the released config does (``num_experts``,
``num_experts_per_token``, ``num_expert_group``, ``num_shared_experts``, ``moe_renormalize``,
``model_max_length``); transformers' attribute names for them are read as aliases.
"""

import numpy as np

from attn_cli.hf.config import Reader, read_layer_types
from attn_cli.hf.files import CheckpointError, _short
from attn_cli.hf.llama import LAYOUT_KEYS, read_linear, with_norm_and_head
from numpy_attn.kimi_linear import MLP_TYPES, KimiLinearConfig
from numpy_attn.mla import mla_param_shapes
from numpy_attn.qwen3_5 import LAYER_TYPES

KEYS = {
    **{key: rule for key, rule in LAYOUT_KEYS.items()
       if key not in ("head_dim", "max_position_embeddings", "rope_theta", "rope_parameters", "rope_scaling")},
    "model_max_length": ("int", 1, False), "moe_intermediate_size": ("int", 1, False),
    "num_experts": ("int", 1, False), "num_shared_experts": ("int", 1, False),
    "num_experts_per_token": ("int", 1, False), "num_expert_group": ("int", 1, False), "topk_group": ("int", 1, False),
    "moe_renormalize": ("bool", None, False), "routed_scaling_factor": ("number", 0, False),
    "q_lora_rank": ("int or null", 1, False), "kv_lora_rank": ("int", 1, False),
    "qk_nope_head_dim": ("int", 1, False), "qk_rope_head_dim": ("int", 1, False), "v_head_dim": ("int", 1, False),
    "linear_num_heads": ("int", 1, False), "linear_head_dim": ("int", 1, False),
    "linear_conv_kernel_dim": ("int", 1, False), "pad_token_id": ("int or null", 0, False)}
# transformers' KimiLinearConfig's values for keys left out.
DEFAULTS = {"model_max_length": 1048576, "moe_intermediate_size": 1024, "num_experts": 256, "num_shared_experts": 1,
            "num_experts_per_token": 8, "num_expert_group": 1, "topk_group": 1, "moe_renormalize": True,
            "routed_scaling_factor": 2.446, "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64, "v_head_dim": 128, "linear_num_heads": 32, "linear_head_dim": 128,
            "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-5}
# MLA's projections: ours -> transformers' names under self_attn.
MLA_NAMES = {"q": "q_proj", "q_a": "q_a_proj", "q_a_norm": "q_a_layernorm", "q_b": "q_b_proj",
             "kv_a": "kv_a_proj_with_mqa", "kv_a_norm": "kv_a_layernorm", "kv_b": "kv_b_proj", "o": "o_proj"}


def _types(hf, key, allowed, default):
    """A list of layer types from config.json (``default`` where absent), each one of ``allowed``."""
    types = read_layer_types(hf, "Kimi Linear") if key == "layer_types" else hf.get(key)
    if types is None:
        return default
    if not isinstance(types, list | tuple) or len(types) != hf["num_hidden_layers"]:
        raise CheckpointError(f"Kimi Linear config.json: {key} must list num_hidden_layers entries, "
                              f"got {_short(types)}")
    bad = [t for t in types if t not in allowed]
    if bad:
        raise CheckpointError(f"Kimi Linear config.json: {key} must list only {allowed}, got {_short(bad[0])}")
    return tuple(types)


def kimi_linear_config(hf):
    """KimiLinearConfig from a Kimi Linear config.json (dict)."""
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"Kimi Linear config.json: hidden_act {hf['hidden_act']!r} is not supported "
                              "(only 'silu')")
    n_head, L = hf["num_attention_heads"], hf["num_hidden_layers"]
    if hf.get("num_key_value_heads") not in (None, n_head):
        raise CheckpointError(f"Kimi Linear config.json: num_key_value_heads = {hf['num_key_value_heads']} must be "
                              f"num_attention_heads = {n_head} (MLA has one key and value per query head)")
    layer_types = _types(hf, "layer_types", LAYER_TYPES,
                         tuple(LAYER_TYPES[bool(i and i % 4 == 0)] for i in range(L)))
    mlp_types = _types(hf, "mlp_layer_types", MLP_TYPES, tuple(MLP_TYPES[i >= 1] for i in range(L)))
    E, G = hf["num_experts"], hf["num_expert_group"]
    return KimiLinearConfig(
        vocab_size=hf["vocab_size"], block_size=hf["model_max_length"], n_layer=L, n_head=n_head, n_kv_head=n_head,
        n_embd=hf["hidden_size"], hidden=hf["intermediate_size"], rms_eps=float(hf["rms_norm_eps"]),
        attn_bias=hf.get("attention_bias", False), tie_weights=hf.get("tie_word_embeddings", False),
        q_lora_rank=hf["q_lora_rank"], kv_lora_rank=hf["kv_lora_rank"], qk_nope_head_dim=hf["qk_nope_head_dim"],
        qk_rope_head_dim=hf["qk_rope_head_dim"], v_head_dim=hf["v_head_dim"], moe_hidden=hf["moe_intermediate_size"],
        n_routed_experts=E, n_shared_experts=hf["num_shared_experts"],
        num_experts_per_tok=hf["num_experts_per_token"], n_group=G, topk_group=hf["topk_group"],
        norm_topk_prob=hf["moe_renormalize"], routed_scaling_factor=float(hf["routed_scaling_factor"]),
        layer_types=layer_types, mlp_layer_types=mlp_types, linear_num_heads=hf["linear_num_heads"],
        linear_head_dim=hf["linear_head_dim"], conv_kernel=hf["linear_conv_kernel_dim"],
        pad_token_id=hf.get("pad_token_id"))


def kimi_linear_params(tensors, config):
    """The params from the tensors, in the released checkpoints' layout (the module docstring)."""
    V, C = config.vocab_size, config.n_embd
    nh, d, K = config.linear_num_heads, config.linear_head_dim, config.conv_kernel

    def swiglu(name, H, names=("gate_proj", "up_proj", "down_proj")):
        return {"gate": read_linear(tensors, f"{name}.{names[0]}", C, H),
                "up": read_linear(tensors, f"{name}.{names[1]}", C, H),
                "down": read_linear(tensors, f"{name}.{names[2]}", H, C)}

    params = {"wte": tensors.take("model.embed_tokens.weight", (V, C)), "blocks": {}}
    for i in range(config.n_layer):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        if config.is_full(i):
            attn = {}
            for path, shape in mla_param_shapes(config.mla).items():      # "q_a.w" (C, rq), "kv_a_norm.w" (rkv,) ...
                name, key = path.split(".")
                hf_name = f"{a}{MLA_NAMES[name]}.{'bias' if key == 'b' else 'weight'}"
                attn.setdefault(name, {})[key] = tensors.take(hf_name, shape[::-1]).T.copy()
        else:
            attn = {name: read_linear(tensors, a + name, c_in, c_out) for name, c_in, c_out in (
                ("q_proj", C, nh * d), ("k_proj", C, nh * d), ("v_proj", C, nh * d), ("f_a_proj", C, d),
                ("f_b_proj", d, nh * d), ("b_proj", C, nh), ("g_a_proj", C, d), ("g_b_proj", d, nh * d),
                ("o_proj", nh * d, C))}
            attn["conv1d"] = {"w": np.concatenate([tensors.take(f"{a}{x}_conv1d.weight", (nh * d, 1, K))[:, 0]
                                                   for x in "qkv"])}          # (3 nh d, K)
            attn["dt_bias"] = tensors.take(a + "dt_bias", (nh * d,))
            attn["A_log"] = tensors.take(a + "A_log", (1, 1, nh, 1)).reshape(nh)
            attn["o_norm"] = {"w": tensors.take(a + "o_norm.weight", (d,))}
        m = p + "block_sparse_moe."
        if config.is_moe(i):
            E, Hm = config.n_routed_experts, config.moe_hidden
            experts = [swiglu(f"{m}experts.{e}", Hm, ("w1", "w3", "w2")) for e in range(E)]
            mlp = {"router": read_linear(tensors, m + "gate", C, E),
                   "selection_bias": tensors.take(m + "gate.e_score_correction_bias", (E,)),
                   "experts": {name: {"w": np.stack([x[name]["w"] for x in experts])} for name in experts[0]},
                   "shared": swiglu(m + "shared_experts", config.n_shared_experts * Hm)}
        else:
            mlp = swiglu(m[:-1], config.hidden)
        params["blocks"][str(i)] = {
            "attn_norm": {"w": tensors.take(p + "input_layernorm.weight", (C,))}, "attn": attn,
            "mlp_norm": {"w": tensors.take(p + "post_attention_layernorm.weight", (C,))}, "mlp": mlp}
    return with_norm_and_head(params, tensors, config)


def _kimi_linear_parameter_count(hf):
    """A lower bound on the parameters config.json implies: the embedding and per layer its two
    norms (each mixer and network holds more)."""
    return hf["vocab_size"] * hf["hidden_size"] + hf["num_hidden_layers"] * 2 * hf["hidden_size"]


READER = Reader(KEYS, kimi_linear_config, kimi_linear_params, _kimi_linear_parameter_count, defaults=DEFAULTS,
                aliases={"num_local_experts": "num_experts", "norm_topk_prob": "moe_renormalize",
                         "n_group": "num_expert_group", "num_experts_per_tok": "num_experts_per_token",
                         "n_shared_experts": "num_shared_experts", "max_position_embeddings": "model_max_length"})
