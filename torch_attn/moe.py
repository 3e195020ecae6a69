"""Mixture-of-experts layers of gpt-oss and DeepSeek-V3 in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/moe.py: a router picks k of E experts per token (gpt-oss: softmax over the k
largest logits; DeepSeek-V3: sigmoid scores, a selection bias, group-limited top-k, normalised
and scaled weights, plus a shared expert), and a loop over the experts adds up their weighted
outputs. The choice is piecewise constant: autograd sees only the chosen experts and the weights.
float16 and bfloat16 computed in float32 (the choice included) and rounded once, as there.
"""

import functools

import torch

from numpy_attn._tree import tree_map  # plain Python: walks the nested dicts
from torch_attn._opmath import upcast
from torch_attn.linear import linear
from torch_attn.softmax import softmax
from torch_attn.swiglu import swiglu


def top_k(scores, k):
    """Indices (..., k) of the k largest scores (..., E), largest first; ties go to the lower index."""
    indices = torch.argsort(-scores, dim=-1, stable=True)[..., :k]     # (..., E) -> (..., k)
    return indices


# -- gpt-oss's expert: the clamped gated linear unit -------------------------------------------------

def clamped_glu(g, u, alpha=1.702, limit=7.0):
    """gpt-oss's gated unit (up + 1) * gate * sigmoid(alpha * gate): g, u (..., H) -> (..., H)."""
    gate = torch.clamp(g, None, limit)                                # clamped above only
    up = torch.clamp(u, -limit, limit)
    s = torch.sigmoid(alpha * gate)                                   # see deepseek_router
    glu = gate * s
    out = (up + 1) * glu
    return out


def gpt_oss_expert(x, params, alpha=1.702, limit=7.0):
    """One gpt-oss expert on x (n, C), params {"gate", "up", "down"} each {"w", "b"} -> (n, C)."""
    g = linear(x, **params["gate"])                                   # (n, C) -> (n, H)
    u = linear(x, **params["up"])                                     # (n, C) -> (n, H)
    a = clamped_glu(g, u, alpha, limit)                               # (n, H)
    y = linear(a, **params["down"])                                   # (n, H) -> (n, C)
    return y


# -- the loop over experts, shared by both layers ------------------------------------------------------

def expert_params(experts, e):
    """Expert e's parameters, {"gate": {"w": (C, H), ...}, ...}, from the stacked (E, ...) ones."""
    return tree_map(lambda p: p[e], experts)


def experts(x, weights, indices, experts, expert):
    """sum over each token's k experts of weight * expert(token): x (N, C), weights and indices (N, k),
    experts a tree of stacked (E, ...) parameters, ``expert(x, params) -> y`` -> (N, C)."""
    N, C = x.shape
    n_experts = experts["down"]["w"].shape[0]
    out = torch.zeros_like(x)                                         # (N, C)
    for e in range(n_experts):
        rows, slots = torch.where(indices == e)                       # (n_e,) tokens and their slot
        y = expert(x[rows], expert_params(experts, e))        # (n_e, C)
        out[rows] += weights[rows, slots, None] * y                   # a token picks e at most once
    return out


# -- gpt-oss -------------------------------------------------------------------------------------------

def gpt_oss_router(x, router, k):
    """Top-k router with a softmax over the chosen logits: x (N, C), router {"w": (C, E), "b": (E,)}
    -> (weights (N, k), indices (N, k))."""
    logits = linear(x, **router)                                      # (N, C) -> (N, E)
    indices = top_k(logits, k)                                        # (N, k)
    chosen = torch.take_along_dim(logits, indices, dim=-1)            # (N, E) -> (N, k)
    weights = softmax(chosen, dim=-1)                                 # (N, k)
    return weights, indices


def gpt_oss_moe(x, params, k, alpha=1.702, limit=7.0):
    """gpt-oss's mixture of experts on x (..., C), params {"router", "experts"}, k experts per token
    -> (..., C)."""
    x_dtype = x.dtype
    x, params = upcast(x), tree_map(upcast, params)                   # float32 for float16 and bfloat16
    C = x.shape[-1]
    tokens = x.reshape(-1, C)                                         # (..., C) -> (N, C)
    weights, indices = gpt_oss_router(tokens, params["router"], k)    # (N, k)
    expert = functools.partial(gpt_oss_expert, alpha=alpha, limit=limit)
    out = experts(tokens, weights, indices, params["experts"], expert)   # (N, C)
    out = out.reshape(x.shape)                                        # (N, C) -> (..., C)
    return out.to(x_dtype)                                            # rounded once to x's dtype


# -- DeepSeek-V3 ---------------------------------------------------------------------------------------

def deepseek_router(x, router, selection_bias, k, n_group=1, topk_group=1, norm_topk_prob=True,
                    routed_scaling_factor=1.0):
    """Sigmoid router with group-limited top-k: x (N, C), router {"w": (C, E)}, selection_bias (E,)
    -> (weights (N, k), indices (N, k))."""
    N, C = x.shape
    logits = linear(x, **router)                                      # (N, C) -> (N, E)
    E = logits.shape[-1]
    # torch.sigmoid, not torch_attn.swiglu's exp(-|x|) form: autograd through abs gives that one
    # slope 0 at exactly 0 (silu multiplies it by 0 there; a router score would keep the error).
    s = torch.sigmoid(logits)                                         # (N, E)
    choice = s + selection_bias                                       # (N, E), only to choose
    grouped = choice.reshape(N, n_group, E // n_group)                # (N, E) -> (N, G, E / G)
    group_scores = torch.sort(grouped, dim=-1).values[..., -2:].sum(dim=-1)   # (N, G) each group's best 2
    groups = top_k(group_scores, topk_group)                          # (N, topk_group)
    group_mask = (groups[..., None] == torch.arange(n_group)).any(dim=-2)   # (N, G)
    expert_mask = torch.repeat_interleave(group_mask, E // n_group, dim=-1)   # (N, G) -> (N, E)
    indices = top_k(torch.where(expert_mask, choice, -torch.inf), k)  # (N, k)
    chosen = torch.take_along_dim(s, indices, dim=-1)                 # (N, E) -> (N, k)
    weights = chosen
    if norm_topk_prob:
        denominator = chosen.sum(dim=-1, keepdim=True) + 1e-20        # (N, 1)
        weights = chosen / denominator                                # (N, k)
    weights = weights * routed_scaling_factor
    return weights, indices


def deepseek_moe(x, params, k, n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0):
    """DeepSeek-V3's mixture of experts on x (..., C), params {"router", "selection_bias", "experts",
    "shared"}, k routed experts per token out of topk_group of n_group groups -> (..., C)."""
    x_dtype = x.dtype
    x, params = upcast(x), tree_map(upcast, params)                   # float32 for float16 and bfloat16
    C = x.shape[-1]
    tokens = x.reshape(-1, C)                                         # (..., C) -> (N, C)
    weights, indices = deepseek_router(
        tokens, params["router"], params["selection_bias"], k, n_group, topk_group, norm_topk_prob,
        routed_scaling_factor)                                        # (N, k)
    routed = experts(tokens, weights, indices, params["experts"], swiglu)
    shared = swiglu(tokens, params["shared"])                         # (N, C)
    out = (routed + shared).reshape(x.shape)                          # (N, C) -> (..., C)
    return out.to(x_dtype)                                            # rounded once to x's dtype


# gpt_oss_moe equals transformers' GptOssMLP (its output, not its router scores) holding
# router.weight = router.w.T, router.bias = router.b, experts.gate_up_proj[..., 0::2] = gate.w,
# [..., 1::2] = up.w (the same interleaving for gate_up_proj_bias), down_proj = down.w. deepseek_moe
# equals DeepseekV3MoE holding gate.weight = router.w.T, gate.e_score_correction_bias = selection_bias,
# experts.gate_up_proj = concat(gate.w, up.w, axis=-1) transposed to (E, 2H, C), experts.down_proj =
# down.w transposed to (E, C, H), shared_experts like swiglu. top_k equals torch.topk's indices.
