"""Qwen3-Next's language model: Qwen3.5's hybrid of Gated DeltaNet and gated attention, with fused
input projections and a mixture of experts, and its backward.

    x      = wte[ids]
    x      = x + mixer_i(rms_norm(x))        mixer_i: gated attention or Gated DeltaNet, by layer_types[i]
    x      = x + mlp_i(rms_norm(x))          mlp_i: the mixture of experts below, or a SwiGLU network
    x      = rms_norm(x)
    logits = x @ head.w

Qwen Team, Qwen3-Next (2025). Everything is numpy_attn/qwen3_5.py's (norms scaling by 1 + w, the
gated attention with partial rotary, Gated DeltaNet, the cache) except two things written here:

- Gated DeltaNet's four input projections come fused in two, grouped per key head:
  ``in_proj_qkvz`` (C, 2 nk dk + 2 nv dv) holds, for each key head h in turn, [q_h (dk) | k_h (dk) |
  v (r dv) | z (r dv)] of that head and the r = nv / nk value heads it serves; ``in_proj_ba``
  (C, 2 nv) holds per key head [b (r) | a (r)]. Picking columns is a permutation, so x @ W[:, cols]
  = (x @ W)[:, cols]: the sublayer gathers Qwen3.5's in_proj_qkv, in_proj_z, in_proj_b, in_proj_a
  from the fused weights, runs Qwen3.5's Gated DeltaNet, and scatters their gradients back.
- The network of block i is a mixture of experts when i is not in ``mlp_only_layers`` and
  (i + 1) is a multiple of ``decoder_sparse_step`` (and n_experts > 0), else Qwen3.5's SwiGLU:

    p       = softmax(x @ router.w)                    (C,) -> (E,), over every expert
    chosen  = the k largest p                          ties to the lower index
    weights = chosen / sum(chosen) if norm_topk_prob, else chosen
    out     = sum of weight_e * swiglu_e(x) + sigmoid(x @ shared_gate.w) * swiglu_shared(x)

  The shared expert (width shared_hidden) sees every token, scaled by its own sigmoid gate; the
  routed experts have width moe_hidden. As in numpy_attn/moe.py the choice has no gradient: it
  flows through the chosen experts and, via the softmax over all E logits, through the weights.

Parameters: Qwen3.5's, with ``blocks.i.attn`` on a linear layer holding in_proj_qkvz and
in_proj_ba in place of the four projections, and ``blocks.i.mlp`` on a mixture-of-experts layer
{"router": {"w": (C, E)}, "experts": {"gate", "up": {"w": (E, C, H)}, "down": {"w": (E, H, C)}},
"shared": a SwiGLU C -> shared_hidden -> C, "shared_gate": {"w": (C, 1)}}.

float16 and bfloat16 as the other families (Gated DeltaNet computes them in float32), float32, float64.
"""

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from numpy_attn import _model
from numpy_attn._checks import check_config, check_dout, check_rng
from numpy_attn._family import Family
from numpy_attn.linear import linear_backward, linear_forward
from numpy_attn.llama import llama_block_backward
from numpy_attn.moe import _check_k, experts_backward, experts_forward, top_k
from numpy_attn.qwen3_5 import (
    GATED_ATTENTION,
    Qwen3_5Config,
    hybrid_decoder_forward,
    init_qwen3_5_params,
    linear_attention_backward,
    linear_attention_forward,
    qwen3_5_kv_cache,
)
from numpy_attn.softmax import softmax_backward, softmax_forward
from numpy_attn.swiglu import sigmoid, swiglu_backward, swiglu_forward


@dataclass(frozen=True)
class Qwen3NextConfig(Qwen3_5Config):
    """Qwen3_5Config's fields and checks (``hidden`` the dense networks' width, intermediate_size),
    and the mixture of experts' (Hugging Face's names in the comments); a toy by default."""

    n_experts: int = 4                  # E (num_experts); 0: every network dense
    experts_per_token: int = 2          # k (num_experts_per_tok)
    moe_hidden: int = 16                # each routed expert's width (moe_intermediate_size)
    shared_hidden: int = 16             # the shared expert's width (shared_expert_intermediate_size)
    norm_topk_prob: bool = True         # the k weights renormalised to sum 1
    decoder_sparse_step: int = 1        # block i has experts when (i + 1) % step == 0 ...
    mlp_only_layers: tuple = ()         # ... and i is not listed here

    def __post_init__(self):
        super().__post_init__()
        for name, value in _check_qwen3_next_config(self).items():
            object.__setattr__(self, name, value)

    def is_moe(self, i):
        """Whether block i's network is the mixture of experts (else a SwiGLU network of width hidden)."""
        return self.n_experts > 0 and i not in self.mlp_only_layers and (i + 1) % self.decoder_sparse_step == 0


def init_qwen3_next_params(config, rng, dtype=np.float32):
    """init_qwen3_5_params' tree with Gated DeltaNet's fused projections (from N(0, 0.02^2)) and,
    on the mixture-of-experts layers, the router, experts, shared expert and its gate, every weight
    from N(0, 0.02^2) as Hugging Face's initializer_range."""
    check_rng(rng, "init_qwen3_next_params")
    params = init_qwen3_5_params(config, rng, dtype)
    C, E = config.n_embd, config.n_experts
    nk, nv, dk, dv = config.linear_k_heads, config.linear_v_heads, config.linear_k_dim, config.linear_v_dim

    def normal(*shape):
        return {"w": rng.normal(0, 0.02, shape).astype(dtype)}

    def swiglu(H):
        return {"gate": normal(C, H), "up": normal(C, H), "down": normal(H, C)}

    for i, block in params["blocks"].items():
        if not config.is_full(int(i)):
            attn = block["attn"]
            for name in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"):
                del attn[name]
            block["attn"] = {"in_proj_qkvz": normal(C, 2 * nk * dk + 2 * nv * dv),
                             "in_proj_ba": normal(C, 2 * nv), **attn}
        if config.is_moe(int(i)):
            H = config.moe_hidden
            block["mlp"] = {"router": normal(C, E),
                            "experts": {"gate": normal(E, C, H), "up": normal(E, C, H), "down": normal(E, H, C)},
                            "shared": swiglu(config.shared_hidden), "shared_gate": normal(C, 1)}
    return params


# -- Gated DeltaNet with fused projections: Qwen3.5's, its weights' columns gathered ----------------

def fused_columns(nk, nv, dk, dv):
    """Where Qwen3.5's projections sit in the fused weights: {"in_proj_qkv", "in_proj_z": columns of
    in_proj_qkvz; "in_proj_b", "in_proj_a": columns of in_proj_ba}, each an index array."""
    r = nv // nk
    qkvz = np.arange(nk)[:, None] * (2 * dk + 2 * r * dv)                    # (nk, 1): key head h's group
    ba = np.arange(nk)[:, None] * 2 * r

    def span(start, n):
        return (start + np.arange(n)).reshape(-1)
    q, k = span(qkvz, dk), span(qkvz + dk, dk)                                # (nk dk,)
    v, z = span(qkvz + 2 * dk, r * dv), span(qkvz + 2 * dk + r * dv, r * dv)  # (nv dv,)
    return {"in_proj_qkv": np.concatenate([q, k, v]), "in_proj_z": z, "in_proj_b": span(ba, r),
            "in_proj_a": span(ba + r, r)}


FUSED = {"in_proj_qkv": "in_proj_qkvz", "in_proj_z": "in_proj_qkvz", "in_proj_b": "in_proj_ba",
         "in_proj_a": "in_proj_ba"}


def unfused_params(params, config):
    """A linear layer's params in Qwen3.5's names: the four projections gathered from the fused two."""
    nk, nv, dk, dv = config.linear_k_heads, config.linear_v_heads, config.linear_k_dim, config.linear_v_dim
    for name, width in (("in_proj_qkvz", 2 * nk * dk + 2 * nv * dv), ("in_proj_ba", 2 * nv)):
        w = params.get(name, {}).get("w") if isinstance(params.get(name), dict) else None
        if np.ndim(w) != 2 or np.shape(w)[1] != width or set(params[name]) != {"w"}:
            raise ValueError(f"qwen3_next: params {name} must be {{'w': (C, {width})}} (a linear layer's "
                             f"Gated DeltaNet), got {params.get(name)!r:.80}")
    cols = fused_columns(nk, nv, dk, dv)
    rest = {name: value for name, value in params.items() if name not in ("in_proj_qkvz", "in_proj_ba")}
    return {name: {"w": params[fused]["w"][:, cols[name]]} for name, fused in FUSED.items()} | rest


def linear_attention_fused_forward(x, params, config, positions, *, attn_mask=None, kv_cache=None):
    """Qwen3.5's Gated DeltaNet sublayer on x (B, T, C) -> (B, T, C), from the fused projections."""
    return linear_attention_forward(x, unfused_params(params, config), config, positions, attn_mask=attn_mask,
                                    kv_cache=kv_cache)


def linear_attention_fused_backward(dout, cache):
    """Gradients: dout (B, T, C) -> (dx, dparams with in_proj_qkvz and in_proj_ba); each fused
    column gets the gradient of the one projection column gathered from it."""
    dx, grads = linear_attention_backward(dout, cache)
    nk, nv, dk, dv = cache.deltanet.sizes
    cols = fused_columns(nk, nv, dk, dv)
    C = dx.shape[-1]
    fused = {"in_proj_qkvz": {"w": np.zeros((C, 2 * nk * dk + 2 * nv * dv), dx.dtype)},
             "in_proj_ba": {"w": np.zeros((C, 2 * nv), dx.dtype)}}
    for name, target in FUSED.items():
        fused[target]["w"][:, cols[name]] = grads.pop(name)["w"]            # (C, n) into its columns
    return dx, fused | grads


LINEAR_ATTENTION_FUSED = _model.Sublayer(linear_attention_fused_forward, linear_attention_fused_backward)


# -- the mixture of experts: softmax router, SwiGLU experts, a sigmoid-gated shared expert ----------

class Qwen3NextRouterCache(NamedTuple):
    linear: tuple          # the router's linear cache
    softmax: tuple         # the softmax over every expert
    indices: np.ndarray    # (N, k) the chosen experts
    chosen: np.ndarray     # (N, k) their probabilities, before renormalising
    denominator: np.ndarray | None   # (N, 1) sum of chosen, None without norm_topk_prob


def qwen3_next_router_forward(x, router, k, norm_topk_prob=True):
    """Top-k of a softmax over every expert, renormalised if norm_topk_prob: x (N, C), router
    {"w": (C, E)} -> (weights (N, k), indices (N, k), cache). (With norm_topk_prob this equals a
    softmax over the k chosen logits, gpt-oss's router, but not without: the probabilities then
    keep the other experts' share, and their gradient reaches every logit.)"""
    logits, linear_cache = linear_forward(x, **router)                        # (N, C) -> (N, E)
    p, softmax_cache = softmax_forward(logits, axis=-1)                       # (N, E)
    indices = top_k(p, k)                                                     # (N, k)
    chosen = np.take_along_axis(p, indices, axis=-1)                          # (N, E) -> (N, k)
    weights, denominator = chosen, None
    if norm_topk_prob:
        denominator = chosen.sum(axis=-1, keepdims=True)                      # (N, 1), > 0
        weights = chosen / denominator
    return weights, indices, Qwen3NextRouterCache(linear_cache, softmax_cache, indices, chosen, denominator)


def qwen3_next_router_backward(dweights, cache):
    """Gradients: dweights (N, k) -> (dx (N, C), {"w"}); the choice itself has none."""
    dchosen = dweights
    if cache.denominator is not None:   # undoes chosen / sum(chosen): the sum is shared by the row
        weights = cache.chosen / cache.denominator
        dchosen = (dweights - (dweights * weights).sum(axis=-1, keepdims=True)) / cache.denominator
    # Undoes chosen = p[indices]: the others get no gradient here, but the softmax spreads it.
    dp = np.zeros(dchosen.shape[:-1] + cache.softmax[0].shape[-1:], dchosen.dtype)   # (N, E)
    np.put_along_axis(dp, cache.indices, dchosen, axis=-1)                    # k distinct experts per row
    dlogits = softmax_backward(dp, cache.softmax)                             # (N, E)
    return linear_backward(dlogits, cache.linear)                             # (N, E) -> (N, C)


class Qwen3NextMoECache(NamedTuple):
    x_shape: tuple
    router: Qwen3NextRouterCache
    experts: tuple         # moe.py's ExpertsCache
    shared: tuple          # the shared expert's SwiGLU cache
    shared_y: np.ndarray   # (N, C) its output, before the gate
    gate: tuple            # the shared gate's linear cache
    s: np.ndarray          # (N, 1) sigmoid of the shared gate


def qwen3_next_moe_forward(x, params, k, norm_topk_prob=True):
    """Qwen3-Next's mixture of experts on x (..., C), k routed experts per token -> (..., C).
    Returns ``(out, cache)``."""
    C = x.shape[-1]
    tokens = x.reshape(-1, C)                                                 # (..., C) -> (N, C)
    weights, indices, router_cache = qwen3_next_router_forward(tokens, params["router"], k, norm_topk_prob)
    routed, experts_cache = experts_forward(tokens, weights, indices, params["experts"], swiglu_forward)  # (N, C)
    shared, shared_cache = swiglu_forward(tokens, params["shared"])           # (N, C)
    g, gate_cache = linear_forward(tokens, **params["shared_gate"])           # (N, C) -> (N, 1)
    s = sigmoid(g)
    out = (routed + s * shared).reshape(x.shape)                              # (N, C) -> (..., C)
    return out, Qwen3NextMoECache(x.shape, router_cache, experts_cache, shared_cache, shared, gate_cache, s)


def qwen3_next_moe_backward(dout, cache):
    """Gradients: dout (..., C) -> (dx (..., C), {"router", "experts", "shared", "shared_gate"})."""
    check_dout("qwen3_next_moe", dout, cache.x_shape, cache.shared_y.dtype)
    dout = dout.reshape(cache.shared_y.shape)                                 # (..., C) -> (N, C)
    # Undoes out = routed + s * shared: to the shared expert, and to its gate (s' = s (1 - s)).
    dx, dshared = swiglu_backward(dout * cache.s, cache.shared)              # (N, C)
    dg = (dout * cache.shared_y).sum(axis=-1, keepdims=True) * cache.s * (1 - cache.s)   # (N, 1)
    dx_gate, dshared_gate = linear_backward(dg, cache.gate)                  # (N, 1) -> (N, C)
    dx_experts, dweights, dexperts = experts_backward(dout, cache.experts, swiglu_backward)   # (N, C), (N, k)
    dx_router, drouter = qwen3_next_router_backward(dweights, cache.router)  # (N, C)
    dx = (dx + dx_gate + dx_experts + dx_router).reshape(cache.x_shape)      # (N, C) -> (..., C)
    return dx, {"router": drouter, "experts": dexperts, "shared": dshared, "shared_gate": dshared_gate}


def qwen3_next_moe_mlp_forward(h, params, config):
    """The mixture of experts with the config's k and norm_topk_prob: h (B, T, C) -> (B, T, C)."""
    return qwen3_next_moe_forward(h, params, config.experts_per_token, config.norm_topk_prob)


QWEN3_NEXT_MOE = _model.Sublayer(qwen3_next_moe_mlp_forward, qwen3_next_moe_backward)


# -- the model -------------------------------------------------------------------------------------

def _layer_options(config):
    """Block i's options: its mixer, its network (experts or Llama's SwiGLU), norms scaling by 1 + w."""
    def options(i):
        mixer = GATED_ATTENTION if config.is_full(i) else LINEAR_ATTENTION_FUSED
        return {"attention": mixer, "norm_offset": 1.0} | ({"mlp": QWEN3_NEXT_MOE} if config.is_moe(i) else {})
    return options


def qwen3_next_forward(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
                       logits_to_keep=None, for_backward=True):
    """Logits for integer ``ids`` (B, T) -> (B, T, V), as qwen3_5_forward (same keywords; ``kv_cache``
    from qwen3_5_kv_cache, whose states fit this model's), with Qwen3-Next's fused projections on
    the linear layers and its experts on the MoE layers. Returns ``(logits, cache)``."""
    return hybrid_decoder_forward(ids, params, config, Qwen3NextConfig, _layer_options(config), positions=positions,
                                  attn_mask=attn_mask, kv_cache=kv_cache, rng=rng, logits_to_keep=logits_to_keep,
                                  for_backward=for_backward)


qwen3_next_backward = _model.decoder_backward_of("qwen3_next", llama_block_backward)


def _check_qwen3_next_config(config):
    """Return the new fields as Python values, or raise naming the field (numpy_attn/_checks.py)."""
    name = "Qwen3NextConfig"
    values = check_config(config, {
        "n_experts": (int, 0), "experts_per_token": (int, 1), "moe_hidden": (int, 1), "shared_hidden": (int, 1),
        "norm_topk_prob": (bool, None), "decoder_sparse_step": (int, 1)})
    if values["n_experts"]:
        _check_k(f"{name}.experts_per_token", values["experts_per_token"], 1, values["n_experts"],
                 f"n_experts = {values['n_experts']}")
    layers = config.mlp_only_layers
    if isinstance(layers, str) or not isinstance(layers, tuple | list):
        raise TypeError(f"{name}.mlp_only_layers must be a list of layer indices, got {layers!r}")
    for i in layers:
        if isinstance(i, bool) or not isinstance(i, int | np.integer) or not 0 <= i < config.n_layer:
            raise ValueError(f"{name}.mlp_only_layers must hold layer indices in [0, {config.n_layer}) "
                             f"(n_layer = {config.n_layer}), got {i!r}")
    values["mlp_only_layers"] = tuple(sorted({int(i) for i in layers}))
    return values


FAMILY = Family(name="qwen3_next", title="Qwen3-Next", architectures=("Qwen3NextForCausalLM",), config=Qwen3NextConfig,
                forward=qwen3_next_forward, backward=qwen3_next_backward, kv_cache=qwen3_5_kv_cache,
                init_params=init_qwen3_next_params)
