"""Mixture-of-experts feed-forward layers of gpt-oss and DeepSeek-V3, and their backward.

Each token x (C,) goes to k of E experts chosen by a router; their outputs are added up, weighted
by the router:  out = sum over the k chosen experts e of  weight_e * expert_e(x).

gpt-oss (transformers' ``GptOssTopKRouter`` and ``GptOssExperts``):

    logits  = x @ router.w + router.b                     (C,) -> (E,)
    weights = softmax over the k largest logits           (k,)
    expert: g = x @ gate.w + gate.b,  u = x @ up.w + up.b  (C,) -> (H,)
            gate = min(g, limit),  up = clip(u, -limit, limit)
            a = (up + 1) * gate * sigmoid(alpha * gate)   alpha = 1.702, limit = 7
            y = a @ down.w + down.b                       (H,) -> (C,)

transformers keeps gate and up in one (E, C, 2H) matrix ``gate_up_proj``, gate in the even columns
and up in the odd ones; here they are two matrices, as in a SwiGLU network.

DeepSeek-V3 (DeepSeek-V3 technical report, section 2.1.2; transformers' ``DeepseekV3TopkRouter``
and ``DeepseekV3MoE``):

    scores  = sigmoid(x @ router.w)                       (C,) -> (E,), no router bias
    choice  = scores + selection_bias                     chooses the experts, never weights them
    groups  = the topk_group of n_group groups (E / n_group experts each) whose two best choice
              values sum highest; chosen = the k best choice values inside those groups
    weights = chosen scores / (their sum + 1e-20) if norm_topk_prob, times routed_scaling_factor
    out     = sum of weight_e * swiglu_e(x) + shared(x)   the shared SwiGLU expert sees every token

The choice is piecewise constant in x and in the router's weights: a small enough change moves no
expert in or out of the top k. So the gradient flows through the chosen experts and through the
routing weights only, and the selection bias (moved by DeepSeek's load balancing, not by gradient
descent) gets a zero gradient. At a tie the layer is not differentiable; ties go to the lower
expert index. The experts run in a plain loop; an expert that no token chose gets gradient zero.

float16 and bfloat16: x and every parameter are cast up to float32 at the top, so the router's
logits, its softmax or sigmoid, the top-k choice and the experts all run in float32 as for float32
input, and out and each gradient are rounded once to x's dtype. The choice is then made on float32
logits: where PyTorch in bfloat16 rounds the logits first (transformers' GptOssTopKRouter), two
logits within a bfloat16 ulp of each other tie there, while ours keeps their float32 order, that of
the exact logits unless they are within float32's rounding (docs/precision.md).
"""

import functools
from typing import NamedTuple

import numpy as np

from numpy_attn._checks import check_dout, check_finite, check_float, check_in_dtype, check_same_dtype, upcast
from numpy_attn._tree import flatten, tree_map, unflatten
from numpy_attn.linear import linear_backward, linear_forward
from numpy_attn.softmax import softmax_backward, softmax_forward
from numpy_attn.swiglu import sigmoid, swiglu_backward, swiglu_forward


def init_gpt_oss_moe_params(C, H, n_experts, rng, dtype=np.float32):
    """{"router": {"w": (C, E), "b": (E,)}, "experts": {"gate", "up": {"w": (E, C, H), "b": (E, H)},
    "down": {"w": (E, H, C), "b": (E, C)}}}, drawn like ``torch.nn.Linear``: U(+-1/sqrt(C_in))."""
    E = n_experts
    return _init_uniform({"router.w": (C, E), "router.b": (E,),
                          "experts.gate.w": (E, C, H), "experts.gate.b": (E, H),
                          "experts.up.w": (E, C, H), "experts.up.b": (E, H),
                          "experts.down.w": (E, H, C), "experts.down.b": (E, C)},
                         {"router": C, "gate": C, "up": C, "down": H}, rng, dtype)


def init_deepseek_moe_params(C, H, n_experts, rng, n_shared=1, dtype=np.float32):
    """{"router": {"w": (C, E)}, "selection_bias": (E,) zeros, "experts": {"gate", "up": {"w": (E, C, H)},
    "down": {"w": (E, H, C)}}, "shared": a SwiGLU C -> n_shared * H -> C}, drawn U(+-1/sqrt(C_in))."""
    E, Hs = n_experts, n_shared * H
    params = _init_uniform({"router.w": (C, E), "experts.gate.w": (E, C, H), "experts.up.w": (E, C, H),
                            "experts.down.w": (E, H, C), "shared.gate.w": (C, Hs), "shared.up.w": (C, Hs),
                            "shared.down.w": (Hs, C)},
                           {"router": C, "gate": C, "up": C, "down": H}, rng, dtype)
    params["selection_bias"] = np.zeros(E, dtype)
    return params


def _init_uniform(shapes, fan_in, rng, dtype):
    """The tree of {dotted path: shape}, each leaf U(-1/sqrt(C_in), 1/sqrt(C_in)), C_in by layer name."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a np.random.Generator, got {type(rng).__name__}")
    flat = {}
    for path, shape in shapes.items():
        bound = 1 / np.sqrt(fan_in[path.split(".")[-2]])
        flat[path] = rng.uniform(-bound, bound, shape).astype(dtype)
    return unflatten(flat)


def top_k(scores, k):
    """Indices (..., k) of the k largest scores (..., E), largest first; ties go to the lower index."""
    _check_top_k(scores, k)
    indices = np.argsort(-scores, axis=-1, kind="stable")[..., :k]     # (..., E) -> (..., k)
    return indices


# -- gpt-oss's expert: the clamped gated linear unit -------------------------------------------------

class ClampedGluCache(NamedTuple):
    g: np.ndarray          # (n, H) the gate before clamping: the clamp's gradient needs it
    u: np.ndarray          # (n, H) the up projection before clamping
    gate: np.ndarray       # (n, H) min(g, limit)
    up: np.ndarray         # (n, H) clip(u, -limit, limit)
    s: np.ndarray          # (n, H) sigmoid(alpha * gate)
    glu: np.ndarray        # (n, H) gate * s
    alpha: float
    limit: float


def clamped_glu_forward(g, u, alpha=1.702, limit=7.0):
    """gpt-oss's gated unit (up + 1) * gate * sigmoid(alpha * gate): g, u (..., H) -> (..., H)."""
    gate = np.clip(g, None, limit)                                    # clamped above only
    up = np.clip(u, -limit, limit)
    s = sigmoid(alpha * gate)
    glu = gate * s
    out = (up + 1) * glu
    cache = ClampedGluCache(g, u, gate, up, s, glu, alpha, limit)
    return out, cache


def clamped_glu_backward(dout, cache):
    """Gradients of the gated unit: dout (..., H) -> (dg, du), each (..., H)."""
    g, u, gate, up, s, glu, alpha, limit = cache
    check_dout("clamped_glu", dout, g.shape, g.dtype)
    # Undoes out = (up + 1) * glu.
    dup = dout * glu
    dglu = dout * (up + 1)
    # Undoes glu = gate * sigmoid(alpha * gate): the product rule, with sigmoid' = s (1 - s).
    dgate = dglu * s * (1 + alpha * gate * (1 - s))
    # Undoes the clamps: the gradient passes where the value was inside the bounds (bounds
    # included, as torch.clamp's gradient).
    du = dup * (np.abs(u) <= limit)
    dg = dgate * (g <= limit)
    return dg, du


class GptOssExpertCache(NamedTuple):
    gate: tuple            # linear caches of the three projections
    up: tuple
    glu: ClampedGluCache
    down: tuple


def gpt_oss_expert_forward(x, params, alpha=1.702, limit=7.0):
    """One gpt-oss expert on x (n, C), params {"gate", "up", "down"} each {"w", "b"} -> (n, C)."""
    g, gate_cache = linear_forward(x, **params["gate"])               # (n, C) -> (n, H)
    u, up_cache = linear_forward(x, **params["up"])                   # (n, C) -> (n, H)
    a, glu_cache = clamped_glu_forward(g, u, alpha, limit)            # (n, H)
    y, down_cache = linear_forward(a, **params["down"])               # (n, H) -> (n, C)
    cache = GptOssExpertCache(gate_cache, up_cache, glu_cache, down_cache)
    return y, cache


def gpt_oss_expert_backward(dy, cache):
    """Gradients: dy (n, C) -> (dx (n, C), {"gate", "up", "down"} like the params)."""
    # Undoes y = a @ down.w + down.b.
    da, ddown = linear_backward(dy, cache.down)                       # (n, C) -> (n, H)
    # Undoes a = clamped_glu(g, u).
    dg, du = clamped_glu_backward(da, cache.glu)                      # (n, H)
    # Undoes u = x @ up.w + up.b and g = x @ gate.w + gate.b: x fed both, so the two gradients add.
    dx_up, dup = linear_backward(du, cache.up)                        # (n, H) -> (n, C)
    dx_gate, dgate = linear_backward(dg, cache.gate)                  # (n, H) -> (n, C)
    dx = dx_gate + dx_up
    return dx, {"gate": dgate, "up": dup, "down": ddown}


# -- the loop over experts, shared by both layers ------------------------------------------------------

class ExpertsCache(NamedTuple):
    weights: np.ndarray    # (N, k) routing weights
    rows: list             # per expert: the tokens routed to it (n_e,)
    slots: list            # per expert: which of those tokens' k choices it is (n_e,)
    outputs: list          # per expert: its output (n_e, C) before weighting, for dweights
    expert_caches: list    # per expert: its own cache


def expert_params(experts, e):
    """Expert e's parameters, {"gate": {"w": (C, H), ...}, ...}, from the stacked (E, ...) ones."""
    return tree_map(lambda p: p[e], experts)


def experts_forward(x, weights, indices, experts, expert_forward):
    """sum over each token's k experts of weight * expert(token): x (N, C), weights and indices (N, k),
    experts a tree of stacked (E, ...) parameters, ``expert_forward(x, params) -> (y, cache)`` -> (N, C)."""
    N, C = x.shape
    n_experts = experts["down"]["w"].shape[0]
    out = np.zeros_like(x)                                            # (N, C)
    rows_of, slots_of, outputs, expert_caches = [], [], [], []
    for e in range(n_experts):
        rows, slots = np.where(indices == e)                          # (n_e,) tokens and their slot
        y, expert_cache = expert_forward(x[rows], expert_params(experts, e))   # (n_e, C)
        out[rows] += weights[rows, slots, None] * y                   # a token picks e at most once
        rows_of.append(rows)
        slots_of.append(slots)
        outputs.append(y)
        expert_caches.append(expert_cache)
    cache = ExpertsCache(weights, rows_of, slots_of, outputs, expert_caches)
    return out, cache


def experts_backward(dout, cache, expert_backward):
    """Gradients: dout (N, C) -> (dx (N, C), dweights (N, k), stacked expert gradients (E, ...))."""
    weights, rows_of, slots_of, outputs, expert_caches = cache
    dx = np.zeros_like(dout)                                          # (N, C)
    dweights = np.zeros_like(weights)                                 # (N, k)
    expert_grads = []
    for rows, slots, y, expert_cache in zip(rows_of, slots_of, outputs, expert_caches, strict=True):
        # Undoes out[rows] += weights[rows, slots, None] * y.
        dweights[rows, slots] = (dout[rows] * y).sum(axis=-1)         # (n_e, C) -> (n_e,)
        dy = dout[rows] * weights[rows, slots, None]                  # (n_e, C)
        dx_e, grads = expert_backward(dy, expert_cache)               # (n_e, C)
        dx[rows] += dx_e                  # from each of a token's k experts; rows distinct within one
        expert_grads.append(grads)
    dexperts = tree_map(lambda *g: np.stack(g), *expert_grads)        # E x (...) -> (E, ...)
    return dx, dweights, dexperts


# -- gpt-oss -------------------------------------------------------------------------------------------

class GptOssRouterCache(NamedTuple):
    linear: tuple          # the router's linear cache
    indices: np.ndarray    # (N, k) the chosen experts
    softmax: tuple         # the softmax cache over the chosen logits
    E: int


def gpt_oss_router_forward(x, router, k):
    """Top-k router with a softmax over the chosen logits: x (N, C), router {"w": (C, E), "b": (E,)}
    -> (weights (N, k), indices (N, k), cache)."""
    _check_router(router, k)
    logits, linear_cache = linear_forward(x, **router)                # (N, C) -> (N, E)
    indices = top_k(logits, k)                                        # (N, k)
    chosen = np.take_along_axis(logits, indices, axis=-1)             # (N, E) -> (N, k)
    weights, softmax_cache = softmax_forward(chosen, axis=-1)         # (N, k)
    cache = GptOssRouterCache(linear_cache, indices, softmax_cache, logits.shape[-1])
    return weights, indices, cache


def gpt_oss_router_backward(dweights, cache):
    """Gradients: dweights (N, k) -> (dx (N, C), {"w", "b"}); the choice itself has none."""
    # Undoes weights = softmax(chosen).
    dchosen = softmax_backward(dweights, cache.softmax)               # (N, k)
    # Undoes chosen = logits[indices]: the logits left out get no gradient.
    dlogits = np.zeros(dchosen.shape[:-1] + (cache.E,), dchosen.dtype)   # (N, E)
    np.put_along_axis(dlogits, cache.indices, dchosen, axis=-1)       # k distinct experts per row
    # Undoes logits = x @ router.w + router.b.
    dx, drouter = linear_backward(dlogits, cache.linear)              # (N, E) -> (N, C)
    return dx, drouter


class GptOssMoECache(NamedTuple):
    x_shape: tuple
    router: GptOssRouterCache
    experts: ExpertsCache
    x_dtype: np.dtype      # what out and the gradients are rounded to (the rest is in float32 for the low ones)


def gpt_oss_moe_forward(x, params, k, alpha=1.702, limit=7.0):
    """gpt-oss's mixture of experts on x (..., C), params as from init_gpt_oss_moe_params, k experts
    per token -> (..., C). Returns ``(out, cache)``."""
    _check_gpt_oss_moe(x, params, k, alpha, limit)
    alpha, limit = float(alpha), float(limit)                         # a np.float64 would promote float32
    x_dtype = x.dtype
    x, params = upcast(x), tree_map(upcast, params)                   # float32 for float16 and bfloat16
    C = x.shape[-1]
    tokens = x.reshape(-1, C)                                         # (..., C) -> (N, C)
    weights, indices, router_cache = gpt_oss_router_forward(tokens, params["router"], k)   # (N, k)
    expert = functools.partial(gpt_oss_expert_forward, alpha=alpha, limit=limit)
    out, experts_cache = experts_forward(tokens, weights, indices, params["experts"], expert)  # (N, C)
    out = out.reshape(x.shape)                                        # (N, C) -> (..., C)
    cache = GptOssMoECache(x.shape, router_cache, experts_cache, x_dtype)
    return out.astype(x_dtype, copy=False), cache                     # rounded once to x's dtype


def gpt_oss_moe_backward(dout, cache):
    """Gradients: dout (..., C) -> (dx (..., C), {"router", "experts"} like the params)."""
    x_shape, router_cache, experts_cache, x_dtype = cache
    check_dout("gpt_oss_moe", dout, x_shape, x_dtype)
    dout = upcast(dout)                                               # float32 for float16 and bfloat16
    # Undoes out = sum of weights * expert(tokens): the gradient reaches the tokens twice,
    # through the experts and through the router's weights.
    dtokens_experts, dweights, dexperts = experts_backward(
        dout.reshape(-1, x_shape[-1]), experts_cache, gpt_oss_expert_backward)   # (N, C), (N, k)
    dtokens_router, drouter = gpt_oss_router_backward(dweights, router_cache)   # (N, C)
    dx = (dtokens_experts + dtokens_router).reshape(x_shape)         # (N, C) -> (..., C)
    return _rounded(x_dtype, dx, {"router": drouter, "experts": dexperts})


# -- DeepSeek-V3 ---------------------------------------------------------------------------------------

class DeepSeekRouterCache(NamedTuple):
    linear: tuple          # the router's linear cache
    s: np.ndarray          # (N, E) sigmoid scores: the sigmoid's gradient is s (1 - s)
    indices: np.ndarray    # (N, k) the chosen experts
    chosen: np.ndarray     # (N, k) their scores, before normalising
    denominator: np.ndarray | None   # (N, 1) sum of chosen + 1e-20, None without norm_topk_prob;
    routed_scaling_factor: float     # the normalised weights are recomputed from these two


def deepseek_router_forward(x, router, selection_bias, k, n_group=1, topk_group=1, norm_topk_prob=True,
                            routed_scaling_factor=1.0):
    """Sigmoid router with group-limited top-k: x (N, C), router {"w": (C, E)}, selection_bias (E,)
    -> (weights (N, k), indices (N, k), cache)."""
    _check_deepseek_router(router, selection_bias, k, n_group, topk_group, norm_topk_prob, routed_scaling_factor)
    N, C = x.shape
    logits, linear_cache = linear_forward(x, **router)                # (N, C) -> (N, E)
    E = logits.shape[-1]
    s = sigmoid(logits)                                               # (N, E)
    choice = s + selection_bias                                       # (N, E), only to choose
    grouped = choice.reshape(N, n_group, E // n_group)                # (N, E) -> (N, G, E / G)
    group_scores = np.sort(grouped, axis=-1)[..., -2:].sum(axis=-1)   # (N, G) sum of each group's best 2
    groups = top_k(group_scores, topk_group)                          # (N, topk_group)
    group_mask = (groups[..., None] == np.arange(n_group)).any(axis=-2)   # (N, G)
    expert_mask = np.repeat(group_mask, E // n_group, axis=-1)        # (N, G) -> (N, E)
    indices = top_k(np.where(expert_mask, choice, -np.inf), k)        # (N, k)
    chosen = np.take_along_axis(s, indices, axis=-1)                  # (N, E) -> (N, k)
    weights, denominator = chosen, None
    if norm_topk_prob:
        denominator = chosen.sum(axis=-1, keepdims=True) + 1e-20      # (N, 1)
        weights = chosen / denominator                                # (N, k)
    weights = weights * routed_scaling_factor
    cache = DeepSeekRouterCache(linear_cache, s, indices, chosen, denominator, routed_scaling_factor)
    return weights, indices, cache


def deepseek_router_backward(dweights, cache):
    """Gradients: dweights (N, k) -> (dx (N, C), {"w"}); the choice (and selection_bias) has none."""
    linear_cache, s, indices, chosen, denominator, routed_scaling_factor = cache
    # Undoes weights = weights * routed_scaling_factor.
    dweights = dweights * routed_scaling_factor                       # (N, k)
    # Undoes weights = chosen / (sum of chosen + 1e-20): the quotient rule, the sum shared by the row.
    dchosen = dweights
    if denominator is not None:
        weights = chosen / denominator
        dchosen = (dweights - (dweights * weights).sum(axis=-1, keepdims=True)) / denominator
    # Undoes chosen = s[indices]: the scores left out get no gradient.
    ds = np.zeros_like(s)                                             # (N, E)
    np.put_along_axis(ds, indices, dchosen, axis=-1)                  # k distinct experts per row
    # Undoes s = sigmoid(logits).
    dlogits = ds * s * (1 - s)                                        # (N, E)
    # Undoes logits = x @ router.w.
    dx, drouter = linear_backward(dlogits, linear_cache)              # (N, E) -> (N, C)
    return dx, drouter


class DeepSeekMoECache(NamedTuple):
    x_shape: tuple
    router: DeepSeekRouterCache
    experts: ExpertsCache
    shared: tuple          # the shared expert's SwiGLU cache
    x_dtype: np.dtype      # what out and the gradients are rounded to (the rest is in float32 for the low ones)


def deepseek_moe_forward(x, params, k, n_group=1, topk_group=1, norm_topk_prob=True,
                         routed_scaling_factor=1.0):
    """DeepSeek-V3's mixture of experts on x (..., C), params as from init_deepseek_moe_params, k
    routed experts per token out of topk_group of n_group groups -> (..., C). Returns ``(out, cache)``."""
    _check_deepseek_moe(x, params, k, n_group, topk_group, norm_topk_prob, routed_scaling_factor)
    routed_scaling_factor = float(routed_scaling_factor)             # a np.float64 would promote float32
    x_dtype = x.dtype
    x, params = upcast(x), tree_map(upcast, params)                   # float32 for float16 and bfloat16
    C = x.shape[-1]
    tokens = x.reshape(-1, C)                                         # (..., C) -> (N, C)
    weights, indices, router_cache = deepseek_router_forward(
        tokens, params["router"], params["selection_bias"], k, n_group, topk_group, norm_topk_prob,
        routed_scaling_factor)                                        # (N, k)
    routed, experts_cache = experts_forward(tokens, weights, indices, params["experts"], swiglu_forward)
    shared, shared_cache = swiglu_forward(tokens, params["shared"])   # (N, C)
    out = (routed + shared).reshape(x.shape)                          # (N, C) -> (..., C)
    cache = DeepSeekMoECache(x.shape, router_cache, experts_cache, shared_cache, x_dtype)
    return out.astype(x_dtype, copy=False), cache                     # rounded once to x's dtype


def deepseek_moe_backward(dout, cache):
    """Gradients: dout (..., C) -> (dx (..., C), {"router", "selection_bias" (zeros), "experts",
    "shared"} like the params)."""
    x_shape, router_cache, experts_cache, shared_cache, x_dtype = cache
    check_dout("deepseek_moe", dout, x_shape, x_dtype)
    dout = upcast(dout).reshape(-1, x_shape[-1])                      # (..., C) -> (N, C), float32 for the low dtypes
    # Undoes out = routed + shared.
    dtokens_shared, dshared = swiglu_backward(dout, shared_cache)     # (N, C)
    dtokens_experts, dweights, dexperts = experts_backward(dout, experts_cache, swiglu_backward)
    dtokens_router, drouter = deepseek_router_backward(dweights, router_cache)   # (N, C)
    dx = (dtokens_shared + dtokens_experts + dtokens_router).reshape(x_shape)   # (N, C) -> (..., C)
    dselection_bias = np.zeros_like(router_cache.s[0])               # (E,) it chooses, never weights
    return _rounded(x_dtype, dx, {"router": drouter, "selection_bias": dselection_bias, "experts": dexperts,
                                  "shared": dshared})


def _rounded(x_dtype, dx, grads):
    """dx and every gradient rounded once to the inputs' dtype (no copy for float32 and float64)."""
    return dx.astype(x_dtype, copy=False), tree_map(lambda g: g.astype(x_dtype, copy=False), grads)


# -- input checks --------------------------------------------------------------------------------------

def _check_gpt_oss_moe(x, params, k, alpha, limit):
    C, E, H = _check_tokens_and_router(x, params)
    _check_params(x, params, {"router.w": (C, E), "router.b": (E,),
                              "experts.gate.w": (E, C, H), "experts.gate.b": (E, H),
                              "experts.up.w": (E, C, H), "experts.up.b": (E, H),
                              "experts.down.w": (E, H, C), "experts.down.b": (E, C)})
    _check_router(params["router"], k)
    for name, value in (("alpha", alpha), ("limit", limit)):
        if isinstance(value, bool) or not isinstance(value, int | float | np.floating) or not np.isfinite(value):
            raise TypeError(f"{name} must be a finite real number, got {type(value).__name__} {value!r}")
        check_in_dtype(name, value, x.dtype)                          # 1e300 is inf in float32
    if not limit > 0:
        raise ValueError(f"limit must be > 0, got {limit!r}")


def _check_deepseek_moe(x, params, k, n_group, topk_group, norm_topk_prob, routed_scaling_factor):
    C, E, H = _check_tokens_and_router(x, params)
    shared = flatten(params).get("shared.gate.w")
    Hs = shared.shape[-1] if _is_array(shared) and shared.ndim == 2 else None   # the shared expert's width
    _check_params(x, params, {"router.w": (C, E), "selection_bias": (E,),
                              "experts.gate.w": (E, C, H), "experts.up.w": (E, C, H),
                              "experts.down.w": (E, H, C),
                              "shared.gate.w": (C, Hs), "shared.up.w": (C, Hs), "shared.down.w": (Hs, C)})
    _check_deepseek_router(params["router"], params["selection_bias"], k, n_group, topk_group, norm_topk_prob,
                           routed_scaling_factor)


def _check_top_k(scores, k):
    """Raise unless k lies in [1, E] (torch.topk refuses a larger k too) and no score is NaN or +inf:
    argsort puts NaN last, so a router weight of NaN would quietly never choose its expert."""
    E = scores.shape[-1]
    _check_k("k", k, 1, E, f"E = {E} scores along the last axis (scores {scores.shape})")
    if np.isnan(scores).any() or np.isposinf(scores).any():
        raise ValueError(f"scores of shape {scores.shape} hold NaN or +inf: there is no top k to choose")


def _check_router(router, k):
    """Raise unless the router's arrays are finite and k lies in [1, E] (E = router.w's columns)."""
    for key, a in router.items():
        check_finite(f"router.{key}", a)
    E = router["w"].shape[-1]
    _check_k("k", k, 1, E, f"n_experts = {E} (router.w {router['w'].shape})")


def _check_deepseek_router(router, selection_bias, k, n_group, topk_group, norm_topk_prob, routed_scaling_factor):
    """Raise unless the router and selection_bias are finite and the routing numbers fit E experts."""
    check_finite("selection_bias", selection_bias)
    E = router["w"].shape[-1]
    _check_k("n_group", n_group, 1, E, f"n_experts = {E}")
    if E % n_group:
        raise ValueError(f"n_experts = {E} is not divisible by n_group = {n_group}")
    if E // n_group < 2:
        raise ValueError(f"n_group = {n_group} leaves {E // n_group} expert per group of n_experts = {E}; "
                         "a group's score is the sum of its best 2")
    _check_k("topk_group", topk_group, 1, n_group, f"n_group = {n_group}")
    _check_router(router, k)
    _check_k("k", k, 1, topk_group * (E // n_group),
             f"the {topk_group * (E // n_group)} experts in topk_group = {topk_group} groups of {E // n_group}")
    if not isinstance(norm_topk_prob, bool | np.bool_):
        raise TypeError(f"norm_topk_prob must be a bool, got {type(norm_topk_prob).__name__} {norm_topk_prob!r}")
    if (isinstance(routed_scaling_factor, bool) or not isinstance(routed_scaling_factor, int | float | np.floating)
            or not np.isfinite(routed_scaling_factor)):
        raise TypeError(f"routed_scaling_factor must be a finite real number, got "
                        f"{type(routed_scaling_factor).__name__} {routed_scaling_factor!r}")
    check_in_dtype("routed_scaling_factor", routed_scaling_factor, router["w"].dtype)   # 1e300: inf in float32


def _is_array(a):
    return isinstance(a, np.ndarray)


def _check_tokens_and_router(x, params):
    """Check x (..., C), finite, and that params holds router.w (C, E) and experts.gate.w (E, C, H);
    return (C, E, H)."""
    check_float("x", x)
    if x.ndim < 1:
        raise ValueError(f"x must have shape (..., C), got {x.shape}")
    check_finite("x", x)
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict, got {type(params).__name__}")
    flat = flatten(params)
    w, gate = flat.get("router.w"), flat.get("experts.gate.w")
    if not _is_array(w) or w.ndim != 2:
        raise ValueError(f"router.w must have shape (C, E) = ({x.shape[-1]}, n_experts), got "
                         f"{w.shape if _is_array(w) else type(w).__name__}")
    H = gate.shape[-1] if _is_array(gate) and gate.ndim == 3 else None
    return x.shape[-1], w.shape[1], H


def _check_params(x, params, expected):
    """Raise unless params holds exactly the dotted paths of ``expected``, float arrays of those shapes
    and of x's dtype."""
    flat = flatten(params)
    if set(flat) != set(expected):
        raise ValueError(f"params must hold {sorted(expected)}, got {sorted(flat)}")
    for path, shape in expected.items():
        a = flat[path]
        if not _is_array(a) or a.shape != shape:
            got = a.shape if _is_array(a) else type(a).__name__
            raise ValueError(f"{path} must have shape {shape} for x {x.shape}, got {got}")
        check_float(path, a)
        check_same_dtype(x=x, **{path: a})


def _check_k(name, value, low, high, what):
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} = {value} must lie in [{low}, {high}]: {what}")
