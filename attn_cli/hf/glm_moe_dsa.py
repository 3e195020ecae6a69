"""GlmMoeDsaForCausalLM (GLM-5) folders -> numpy_attn.glm_moe_dsa's GlmMoeDsaConfig: DeepSeek-V3.2's
tensors (attn_cli/hf/deepseek_v32.py), an indexer on the "full" layers of indexer_types only."""

from attn_cli.hf.config import Reader
from attn_cli.hf.deepseek_v3 import deepseek_v3_parameter_count
from attn_cli.hf.deepseek_v32 import KEYS as DEEPSEEK_V32_KEYS
from attn_cli.hf.deepseek_v32 import deepseek_v32_config, deepseek_v32_params, first_dense
from attn_cli.hf.files import CheckpointError
from numpy_attn.glm_moe_dsa import GlmMoeDsaConfig

KEYS = dict(DEEPSEEK_V32_KEYS)
# transformers' GlmMoeDsaConfig defaults where they are not DeepSeek-V3.2's.
DEFAULTS = {"q_lora_rank": 2048, "n_group": 1, "topk_group": 1, "index_n_heads": 32}


def _indexer_types(hf):
    """indexer_types from config.json (every layer "full" where absent), checked."""
    types, L, kinds = hf.get("indexer_types"), hf["num_hidden_layers"], GlmMoeDsaConfig.INDEXER_TYPES
    if types is None:
        return ("full",) * L
    if not isinstance(types, list) or len(types) != L or any(t not in kinds for t in types) \
            or (types and types[0] != "full"):
        shown = repr(types) if len(repr(types)) <= 80 else repr(types)[:77] + "..."
        raise CheckpointError(f"GlmMoeDsa config.json: indexer_types must list num_hidden_layers = {L} entries of "
                              f"{kinds}, the first 'full', got {shown}")
    return tuple(types)


def glm_moe_dsa_config(hf):
    """GlmMoeDsaConfig from a GLM-5 config.json (dict)."""
    return deepseek_v32_config(hf, "GlmMoeDsa", GlmMoeDsaConfig, indexer_types=_indexer_types(hf))


def _glm_moe_dsa_params(tensors, config):
    """DeepSeek-V3.2's params with an indexer on the full layers only."""
    return deepseek_v32_params(tensors, config, [i for i, t in enumerate(config.indexer_types) if t == "full"])


def _glm_moe_dsa_parameter_count(hf):
    """A lower bound on the parameters: DeepSeek-V3's (the indexers, on the full layers only, left out)."""
    return deepseek_v3_parameter_count({**hf, "first_k_dense_replace": first_dense(hf, "GlmMoeDsa")})


READER = Reader(KEYS, glm_moe_dsa_config, _glm_moe_dsa_params, _glm_moe_dsa_parameter_count,
                aliases={"num_local_experts": "n_routed_experts"}, defaults=DEFAULTS)
