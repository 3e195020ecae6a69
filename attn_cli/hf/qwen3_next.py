"""Qwen3NextForCausalLM folders -> numpy_attn.qwen3_next's Qwen3NextConfig and params: Qwen3.5's
keys and reading (attn_cli/hf/qwen3_5.py), with Gated DeltaNet's fused projections and the
mixture of experts.

Experts: block i has them when i is not in ``mlp_only_layers`` and (i + 1) is a multiple of
``decoder_sparse_step``, as transformers builds them (num_experts 0: none). The router's weight
``mlp.gate.weight`` (E, C) is transposed; each expert e is stored as a SwiGLU network
``mlp.experts.e.{gate,up,down}_proj`` (the released checkpoints' layout, which save_pretrained
writes back from transformers' fused gate_up_proj), read and stacked to (E, C, H) and (E, H, C);
the shared expert is a SwiGLU network and ``shared_expert_gate.weight`` (1, C) its gate's weight.
"""

import numpy as np

from attn_cli.hf.config import Reader
from attn_cli.hf.files import CheckpointError, _short
from attn_cli.hf.llama import read_linear
from attn_cli.hf.qwen3_5 import KEYS as QWEN3_5_KEYS
from attn_cli.hf.qwen3_5 import qwen3_5_config, qwen3_5_parameter_count, qwen3_5_params, read_swiglu, swiglu_params
from numpy_attn.qwen3_next import Qwen3NextConfig

KEYS = {**QWEN3_5_KEYS, "num_experts": ("int", 0, False), "num_experts_per_tok": ("int", 1, False),
        "moe_intermediate_size": ("int", 1, False), "shared_expert_intermediate_size": ("int", 1, False),
        "decoder_sparse_step": ("int", 1, False), "norm_topk_prob": ("bool", None, False)}

# transformers' Qwen3NextConfig's values for keys left out, where they are not Llama's.
DEFAULTS = {"head_dim": 256, "num_key_value_heads": 2, "max_position_embeddings": 32768, "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128,
            "linear_num_key_heads": 16, "linear_num_value_heads": 32, "num_experts": 512, "num_experts_per_tok": 10,
            "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "decoder_sparse_step": 1,
            "norm_topk_prob": True}


def qwen3_next_config(hf):
    """Qwen3NextConfig from a Qwen3-Next config.json (dict)."""
    layers = hf.get("mlp_only_layers") or []
    if not isinstance(layers, list):
        raise CheckpointError(f"Qwen3-Next config.json: mlp_only_layers must be a list of layer indices, "
                              f"got {_short(layers)}")
    return qwen3_5_config(hf, "Qwen3-Next", Qwen3NextConfig, n_experts=hf["num_experts"],
                          experts_per_token=hf["num_experts_per_tok"], moe_hidden=hf["moe_intermediate_size"],
                          shared_hidden=hf["shared_expert_intermediate_size"],
                          norm_topk_prob=bool(hf["norm_topk_prob"]), decoder_sparse_step=hf["decoder_sparse_step"],
                          mlp_only_layers=tuple(layers))


def fused_projections(tensors, a, config):
    """Gated DeltaNet's fused input projections under ``a`` (model.layers.i.linear_attn.)."""
    C, nk, nv = config.n_embd, config.linear_k_heads, config.linear_v_heads
    width = 2 * nk * config.linear_k_dim + 2 * nv * config.linear_v_dim
    return {"in_proj_qkvz": read_linear(tensors, a + "in_proj_qkvz", C, width),
            "in_proj_ba": read_linear(tensors, a + "in_proj_ba", C, 2 * nv)}


def mlp_params(tensors, p, config, i):
    """Block i's network under ``p`` (model.layers.i.): the mixture of experts (module docstring),
    or Qwen3.5's SwiGLU network."""
    if not config.is_moe(i):
        return swiglu_params(tensors, p, config, i)
    C, E = config.n_embd, config.n_experts
    experts = [read_swiglu(tensors, f"{p}mlp.experts.{e}", C, config.moe_hidden) for e in range(E)]
    return {"router": read_linear(tensors, p + "mlp.gate", C, E),
            "experts": {name: {"w": np.stack([x[name]["w"] for x in experts])} for name in experts[0]},  # (E, ...)
            "shared": read_swiglu(tensors, p + "mlp.shared_expert", C, config.shared_hidden),
            "shared_gate": read_linear(tensors, p + "mlp.shared_expert_gate", C, 1)}


def qwen3_next_params(tensors, config):
    """Qwen3.5's params from the tensors, with the fused projections and the experts."""
    return qwen3_5_params(tensors, config, fused_projections, mlp_params)


def qwen3_next_parameter_count(hf):
    """A lower bound on the parameters config.json implies: Qwen3.5's, each network counted at the
    narrower of the dense width and the experts' summed widths (a mixture of experts holds at least
    3 C (E H_moe + H_shared) weights)."""
    hf = {**DEFAULTS, **hf}
    moe = hf["num_experts"] * hf["moe_intermediate_size"] + hf["shared_expert_intermediate_size"]
    return qwen3_5_parameter_count({**hf, "intermediate_size": min(hf["intermediate_size"], moe)})


READER = Reader(KEYS, qwen3_next_config, qwen3_next_params, parameter_count=qwen3_next_parameter_count,
                defaults=DEFAULTS)
