"""DeepseekV32ForCausalLM folders -> numpy_attn.deepseek_v32's DeepseekV32Config: DeepSeek-V3's
tensors (attn_cli/hf/deepseek_v3.py) and each layer's lightning indexer under self_attn.indexer."""

from attn_cli.hf.config import Reader
from attn_cli.hf.deepseek_v3 import KEYS as DEEPSEEK_V3_KEYS
from attn_cli.hf.deepseek_v3 import deepseek_v3_config, deepseek_v3_parameter_count, deepseek_v3_params
from attn_cli.hf.files import CheckpointError
from numpy_attn.deepseek_v32 import DeepseekV32Config

# DeepSeek-V3's keys without rope_interleave (transformers' DeepSeek-V3.2 always interleaves), the
# low-rank query required (the indexer reads its latent), and the indexer's sizes.
KEYS = {**{key: rule for key, rule in DEEPSEEK_V3_KEYS.items() if key != "rope_interleave"},
        "q_lora_rank": ("int", 1, False), "index_topk": ("int", 1, False), "index_head_dim": ("int", 1, False),
        "index_n_heads": ("int", 1, False)}
# transformers' defaults for the indexer's keys.
INDEX_DEFAULTS = {"index_topk": 2048, "index_head_dim": 128, "index_n_heads": 64}


def first_dense(hf, name="DeepseekV32"):
    """The dense blocks at the start: mlp_layer_types (which transformers' layers read) when given,
    as first_k_dense_replace dense then sparse; else first_k_dense_replace (default 3)."""
    types, L = hf.get("mlp_layer_types"), hf["num_hidden_layers"]
    if types is None:
        return hf.get("first_k_dense_replace", 3)
    k = sum(t == "dense" for t in types) if isinstance(types, list) else -1
    if not isinstance(types, list) or types != ["dense"] * k + ["sparse"] * (L - k):
        shown = repr(types) if len(repr(types)) <= 80 else repr(types)[:77] + "..."
        raise CheckpointError(f"{name} config.json: mlp_layer_types must list num_hidden_layers = {L} "
                              f"entries, 'dense' ones then 'sparse' ones, got {shown}")
    return k


def deepseek_v32_config(hf, name="DeepseekV32", config_class=DeepseekV32Config, **fields):
    """DeepseekV32Config from a DeepSeek-V3.2 config.json (dict), with transformers' defaults; a
    family built on it passes its ``name``, ``config_class`` and own ``fields``."""
    return deepseek_v3_config(hf, name, config_class, rope_interleave=True,
                              first_k_dense_replace=first_dense(hf, name),
                              **{key: hf.get(key, value) for key, value in INDEX_DEFAULTS.items()}, **fields)


def deepseek_v32_parameter_count(hf):
    """DeepSeek-V3's lower bound and each layer's indexer (wq_b, wk, k_norm, weights_proj)."""
    C, rq = hf["hidden_size"], hf.get("q_lora_rank", 1536)
    nh, D = (hf.get(key, INDEX_DEFAULTS[key]) for key in ("index_n_heads", "index_head_dim"))
    dense = {"first_k_dense_replace": first_dense(hf)}                   # mlp_layer_types' when given
    indexer = rq * nh * D + C * D + 2 * D + C * nh
    return deepseek_v3_parameter_count({**hf, **dense}) + hf["num_hidden_layers"] * indexer


def deepseek_v32_params(tensors, config, indexed=None):
    """DeepSeek-V3's params, and each layer's indexer under attn.indexer (the layers ``indexed``
    lists, by default every one)."""
    params = deepseek_v3_params(tensors, config)
    C, rq, nh, D = config.n_embd, config.q_lora_rank, config.index_n_heads, config.index_head_dim
    def linear(name, C_in, C_out):
        return {"w": tensors.take(f"{name}.weight", (C_out, C_in)).T.copy()}   # (C_out, C_in) -> (C_in, C_out)

    for i, block in params["blocks"].items():
        if indexed is not None and int(i) not in indexed:
            continue
        p = f"model.layers.{i}.self_attn.indexer."
        block["attn"]["indexer"] = {
            "wq_b": linear(p + "wq_b", rq, nh * D), "wk": linear(p + "wk", C, D),
            "k_norm": {"w": tensors.take(p + "k_norm.weight", (D,)), "b": tensors.take(p + "k_norm.bias", (D,))},
            "weights_proj": linear(p + "weights_proj", C, nh)}
    return params


READER = Reader(KEYS, deepseek_v32_config, deepseek_v32_params, deepseek_v32_parameter_count,
                aliases={"num_local_experts": "n_routed_experts"})
