"""DeepseekV3ForCausalLM folders -> numpy_attn.deepseek_v3's DeepseekV3Config: multi-head latent
attention's projections, dense then mixture-of-experts blocks (each expert's three projections,
the router and its selection bias, the shared expert)."""

import numpy as np

from attn_cli.hf.config import YARN_OPTIONAL, Reader, context_length, rope_settings
from attn_cli.hf.files import CheckpointError
from attn_cli.hf.llama import LAYOUT_KEYS, with_norm_and_head
from numpy_attn.deepseek_v3 import DeepseekV3Config
from numpy_attn.mla import mla_param_shapes

# MLA's ranks and widths, the experts and their routing (absent keys take transformers' defaults;
# num_key_value_heads, which MLA does not use, must be num_attention_heads, as transformers needs).
KEYS = {
    **{key: rule for key, rule in LAYOUT_KEYS.items() if key != "head_dim"},
    "moe_intermediate_size": ("int", 1, True), "n_routed_experts": ("int", 1, True),
    "n_shared_experts": ("int", 1, False), "num_experts_per_tok": ("int", 1, False), "n_group": ("int", 1, False),
    "topk_group": ("int", 1, False), "norm_topk_prob": ("bool", None, False),
    "routed_scaling_factor": ("number", 0, False), "first_k_dense_replace": ("int", 0, False),
    "q_lora_rank": ("int or null", 1, False), "kv_lora_rank": ("int", 1, True),
    "qk_nope_head_dim": ("int", 1, True), "qk_rope_head_dim": ("int", 1, True), "v_head_dim": ("int", 1, True),
    "rope_interleave": ("bool", None, False)}
# MLA's projections: ours -> transformers' names under self_attn.
MLA_NAMES = {"q": "q_proj", "q_a": "q_a_proj", "q_a_norm": "q_a_layernorm", "q_b": "q_b_proj",
             "kv_a": "kv_a_proj_with_mqa", "kv_a_norm": "kv_a_layernorm", "kv_b": "kv_b_proj", "o": "o_proj"}


def deepseek_v3_config(hf, name="DeepseekV3", config_class=DeepseekV3Config, **fields):
    """DeepseekV3Config from a DeepSeek-V3 config.json (dict), with transformers' defaults for the
    keys it leaves out; what is not implemented is refused naming the key. A family built on it
    passes its ``name`` (in messages), ``config_class`` and its own ``fields``."""
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{name} config.json: hidden_act {hf['hidden_act']!r} is not supported (only 'silu')")
    n_head = hf["num_attention_heads"]
    if hf.get("num_key_value_heads") not in (None, n_head):
        raise CheckpointError(f"{name} config.json: num_key_value_heads = {hf['num_key_value_heads']} must be "
                              f"num_attention_heads = {n_head} (MLA has one key and value per query head)")
    theta, scaling = rope_settings(hf, name, YARN_OPTIONAL, context=4096)
    fields = {"rope_interleave": hf.get("rope_interleave", True),
              "first_k_dense_replace": hf.get("first_k_dense_replace", 3), **fields}
    return config_class(
        vocab_size=hf["vocab_size"], block_size=context_length(hf, scaling, 4096),
        n_layer=hf["num_hidden_layers"], n_head=n_head, n_kv_head=n_head, n_embd=hf["hidden_size"],
        head_dim=hf["qk_rope_head_dim"], hidden=hf["intermediate_size"], rms_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta), rope_scaling=scaling, attn_bias=hf.get("attention_bias", False),
        tie_weights=hf.get("tie_word_embeddings", False), q_lora_rank=hf.get("q_lora_rank", 1536),
        kv_lora_rank=hf["kv_lora_rank"], qk_nope_head_dim=hf["qk_nope_head_dim"],
        qk_rope_head_dim=hf["qk_rope_head_dim"], v_head_dim=hf["v_head_dim"],
        moe_hidden=hf["moe_intermediate_size"],
        n_routed_experts=hf["n_routed_experts"], n_shared_experts=hf.get("n_shared_experts", 1),
        num_experts_per_tok=hf.get("num_experts_per_tok", 8), n_group=hf.get("n_group", 8),
        topk_group=hf.get("topk_group", 4), norm_topk_prob=hf.get("norm_topk_prob", True),
        routed_scaling_factor=float(hf.get("routed_scaling_factor", 2.5)), **fields)


def deepseek_v3_parameter_count(hf):
    """A lower bound on the parameters a DeepSeek-V3 config.json implies (its matrices and norms;
    transformers' defaults for absent keys), in Python integers."""
    C, L, V, nh = hf["hidden_size"], hf["num_hidden_layers"], hf["vocab_size"], hf["num_attention_heads"]
    rq, rkv = hf.get("q_lora_rank", 1536), hf["kv_lora_rank"]
    dn, dr, dv = hf["qk_nope_head_dim"], hf["qk_rope_head_dim"], hf["v_head_dim"]
    E, Hm, H = hf["n_routed_experts"], hf["moe_intermediate_size"], hf["intermediate_size"]
    query = C * nh * (dn + dr) if rq is None else C * rq + rq * nh * (dn + dr)
    attention = query + C * (rkv + dr) + rkv * nh * (dn + dv) + nh * dv * C
    dense = min(L, hf.get("first_k_dense_replace", 3))
    moe = 3 * C * Hm * (E + hf.get("n_shared_experts", 1)) + C * E          # the experts, the shared one, the router
    return 2 * V * C + L * (attention + 2 * C) + dense * 3 * C * H + (L - dense) * moe + C


def deepseek_v3_params(tensors, config):
    """The params of a DeepSeek-V3 from its tensors: MLA's under self_attn, a dense SwiGLU or the
    experts (each expert's three projections, stacked (E, ...)), the router (mlp.gate) and its
    selection bias (e_score_correction_bias), and the shared expert."""
    V, C = config.vocab_size, config.n_embd
    E, Hm = config.n_routed_experts, config.moe_hidden
    shapes = {path: shape for path, shape in mla_param_shapes(config.mla).items()}

    def linear(name, C_in, C_out):
        return {"w": tensors.take(f"{name}.weight", (C_out, C_in)).T.copy()}   # (C_out, C_in) -> (C_in, C_out)

    def swiglu(name, H):
        return {"gate": linear(f"{name}.gate_proj", C, H), "up": linear(f"{name}.up_proj", C, H),
                "down": linear(f"{name}.down_proj", H, C)}

    params = {"wte": tensors.take("model.embed_tokens.weight", (V, C)), "blocks": {}}
    for i in range(config.n_layer):
        p = f"model.layers.{i}."
        attn = {}
        for path, shape in shapes.items():                 # "q_a.w" (C, rq), "kv_a_norm.w" (rkv,), "o.b" (C,) ...
            name, key = path.split(".")
            hf_name = f"{p}self_attn.{MLA_NAMES[name]}.{'bias' if key == 'b' else 'weight'}"
            attn.setdefault(name, {})[key] = tensors.take(hf_name, shape[::-1]).T.copy()
        if config.is_moe(i):
            experts = [swiglu(f"{p}mlp.experts.{e}", Hm) for e in range(E)]
            mlp = {"router": linear(p + "mlp.gate", C, E),
                   "selection_bias": tensors.take(p + "mlp.gate.e_score_correction_bias", (E,)),
                   "experts": {name: {"w": np.stack([x[name]["w"] for x in experts])} for name in experts[0]},
                   "shared": swiglu(p + "mlp.shared_experts", config.n_shared_experts * Hm)}
        else:
            mlp = swiglu(p + "mlp", config.hidden)
        params["blocks"][str(i)] = {
            "attn_norm": {"w": tensors.take(p + "input_layernorm.weight", (C,))}, "attn": attn,
            "mlp_norm": {"w": tensors.take(p + "post_attention_layernorm.weight", (C,))}, "mlp": mlp}
    return with_norm_and_head(params, tensors, config)


READER = Reader(KEYS, deepseek_v3_config, deepseek_v3_params, deepseek_v3_parameter_count,
                aliases={"num_local_experts": "n_routed_experts"})
