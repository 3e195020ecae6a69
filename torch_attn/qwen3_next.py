"""Qwen3-Next's language model in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/qwen3_next.py: torch_attn/qwen3_5.py's model with Gated DeltaNet's projections
gathered from the fused in_proj_qkvz and in_proj_ba, and on the mixture-of-experts layers a softmax
router over every expert (top k, renormalised), SwiGLU experts and a sigmoid-gated shared expert.
"""

import torch

from torch_attn.linear import linear
from torch_attn.moe import experts, top_k
from torch_attn.qwen3_5 import gated_attention, hybrid_decoder, linear_attention
from torch_attn.softmax import softmax
from torch_attn.swiglu import sigmoid, swiglu

# -- Gated DeltaNet with fused projections: Qwen3.5's, its weights' columns gathered ----------------

def fused_columns(nk, nv, dk, dv, device=None):
    """Where Qwen3.5's projections sit in the fused weights: {"in_proj_qkv", "in_proj_z": columns of
    in_proj_qkvz; "in_proj_b", "in_proj_a": columns of in_proj_ba}, each an index tensor."""
    r = nv // nk
    qkvz = torch.arange(nk, device=device)[:, None] * (2 * dk + 2 * r * dv)   # (nk, 1): key head h's group
    ba = torch.arange(nk, device=device)[:, None] * 2 * r

    def span(start, n):
        return (start + torch.arange(n, device=device)).reshape(-1)
    q, k = span(qkvz, dk), span(qkvz + dk, dk)                                # (nk dk,)
    v, z = span(qkvz + 2 * dk, r * dv), span(qkvz + 2 * dk + r * dv, r * dv)  # (nv dv,)
    return {"in_proj_qkv": torch.cat([q, k, v]), "in_proj_z": z, "in_proj_b": span(ba, r), "in_proj_a": span(ba + r, r)}


FUSED = {"in_proj_qkv": "in_proj_qkvz", "in_proj_z": "in_proj_qkvz", "in_proj_b": "in_proj_ba",
         "in_proj_a": "in_proj_ba"}


def unfused_params(params, config):
    """A linear layer's params in Qwen3.5's names: the four projections gathered from the fused two."""
    cols = fused_columns(config.linear_k_heads, config.linear_v_heads, config.linear_k_dim, config.linear_v_dim,
                         params["in_proj_ba"]["w"].device)
    rest = {name: value for name, value in params.items() if name not in ("in_proj_qkvz", "in_proj_ba")}
    return {name: {"w": params[fused]["w"][:, cols[name]]} for name, fused in FUSED.items()} | rest


def linear_attention_fused(x, params, config, positions, *, attn_mask=None, kv_cache=None):
    """Qwen3.5's Gated DeltaNet sublayer on x (B, T, C) -> (B, T, C), from the fused projections."""
    return linear_attention(x, unfused_params(params, config), config, positions, attn_mask=attn_mask,
                            kv_cache=kv_cache)


# -- the mixture of experts: softmax router, SwiGLU experts, a sigmoid-gated shared expert ----------

def qwen3_next_router(x, router, k, norm_topk_prob=True):
    """Top-k of a softmax over every expert, renormalised if norm_topk_prob: x (N, C) -> (weights, indices)."""
    p = softmax(linear(x, **router), dim=-1)                                  # (N, E)
    indices = top_k(p, k)                                                     # (N, k)
    weights = torch.gather(p, -1, indices)                                    # (N, k)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, indices


def qwen3_next_moe(x, params, k, norm_topk_prob=True):
    """Qwen3-Next's mixture of experts on x (..., C), k routed experts per token -> (..., C)."""
    C = x.shape[-1]
    tokens = x.reshape(-1, C)                                                 # (..., C) -> (N, C)
    weights, indices = qwen3_next_router(tokens, params["router"], k, norm_topk_prob)   # (N, k)
    routed = experts(tokens, weights, indices, params["experts"], swiglu)    # (N, C)
    shared = swiglu(tokens, params["shared"])                                 # (N, C)
    s = sigmoid(linear(tokens, **params["shared_gate"]))                      # (N, 1)
    return (routed + s * shared).reshape(x.shape)                             # (N, C) -> (..., C)


def qwen3_next_moe_mlp(h, params, config):
    """The mixture of experts with the config's k and norm_topk_prob: h (B, T, C) -> (B, T, C)."""
    return qwen3_next_moe(h, params, config.experts_per_token, config.norm_topk_prob)


# -- the model -------------------------------------------------------------------------------------

def _layer_options(config):
    """Block i's options: its mixer, its network (experts or Llama's SwiGLU), norms scaling by 1 + w."""
    def options(i):
        mixer = gated_attention if config.is_full(i) else linear_attention_fused
        return {"attention": mixer, "norm_offset": 1.0} | ({"mlp": qwen3_next_moe_mlp} if config.is_moe(i) else {})
    return options


def qwen3_next(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
               logits_to_keep=None):
    """Logits for integer ``ids`` (B, T) -> (B, T, V); keywords as qwen3_5's, ``kv_cache`` from qwen3_5_kv_cache."""
    return hybrid_decoder(ids, params, config, _layer_options(config), positions=positions, attn_mask=attn_mask,
                          kv_cache=kv_cache, logits_to_keep=logits_to_keep)


# Equals Hugging Face's transformers Qwen3NextForCausalLM(...).logits holding the same weights;
# parity_tests/test_qwen3_next.py checks it in float64.
