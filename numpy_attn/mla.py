"""Multi-head latent attention (MLA), its backward, and absorbed decoding from a latent cache.

    c_q      = rms_norm(x @ q_a.w)                    (B, T, rq)      the query's low-rank path
    q        = c_q @ q_b.w                            (B, nh, T, dn + dr)   (or x @ q.w without it)
    c_kv, kr = x @ kv_a.w                             (B, T, rkv), (B, T, dr)
    c_kv     = rms_norm(c_kv)                         the latent: all the absorbed cache keeps
    k_n, v   = c_kv @ kv_b.w                          (B, nh, T, dn), (B, nh, T, dv)
    q_r, k_r = rope(q[..., dn:]), rope(kr)            k_r has one head, shared by all nh
    k        = [k_n, k_r],   q = [q[..., :dn], q_r]
    out      = softmax(q k^T * scale + causal) v @ o.w     scale = mscale^2 / sqrt(dn + dr)

DeepSeek-AI, "DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts Language
Model" (2024), sections 2.1.2-2.1.3, in the form of Hugging Face's
``DeepseekV3Attention``: the query and the joint key/value are compressed to ranks rq
(``q_lora_rank``) and rkv (``kv_lora_rank``), each normed (RMS norm, numpy_attn/rms_norm.py);
the keys' rotary part of width dr (``qk_rope_head_dim``) is decoupled from the latent and shared
by every head (rope.py's interleaved pairs when ``rope_interleave``, else half-split). Biases,
with ``attn_bias``, sit on q_a, kv_a and o only, as in Hugging Face's model. The score scale is
``MLAConfig.softmax_scale``: YaRN's mscale enters it squared (``mla_softmax_scale``).

Absorbed decoding (``mla_absorbed_forward``). A key's k_n = c_kv W_uk (W_uk the k_n columns of
kv_b.w) only meets a query through q_n . k_n = (q_n W_uk^T) . c_kv, and the value up-projection
W_uv commutes with the weighted sum. So the cache keeps, per token, the normed latent c_kv (rkv)
and the rotated shared k_r (dr), never a key or value per head: attention becomes multi-query
attention over keys [c_kv, k_r] (rkv + dr) and values c_kv (rkv), with the query
[q_n W_uk^T, q_r], and W_uv applied to its output. ``mla_cache_bytes_per_token`` compares that
with the naive cache and with GQA and MHA of the same heads.

Naive cached decoding (``mla_forward(..., kv_cache=layer)``) caches what Hugging Face's model
attends over: each head's full key (dn + dr) and value (dv), in numpy_attn/kv_cache.py's cache
with values of their own width (``init_mla_kv_cache``). It is the reference the absorbed path is
checked against, and the cache it keeps is the one absorption saves.

float16 and bfloat16: MLA is a composition, so each operation (linear, rms_norm, rope,
attention) computes in float32 and rounds its own output once, as PyTorch's modules do
(docs/precision.md). The few steps written here follow the same rule: the absorbed path's two
matmuls with W_uk and W_uv, and the backward's sum of k_r's gradient over the heads, run in
float32 and round once; the caches (naive and latent) take the model's dtype, half the bytes per
token of float32.
"""

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from numpy_attn._checks import (
    FLOAT_DTYPES,
    check_config,
    check_dout,
    check_finite,
    check_float,
    check_no_past,
    check_positions,
    check_rng,
    upcast,
)
from numpy_attn.attention import (
    scaled_dot_product_attention_backward,
    scaled_dot_product_attention_forward,
)
from numpy_attn.kv_cache import LayerKVCache, init_kv_cache, kv_cache_update
from numpy_attn.linear import linear_backward, linear_forward
from numpy_attn.rms_norm import rms_norm_backward, rms_norm_forward
from numpy_attn.rope import rope_backward, rope_forward, rope_frequencies


def mla_softmax_scale(qk_head_dim, rope_scaling=None):
    """The score scale 1 / sqrt(qk_head_dim), times mscale^2 when ``rope_scaling`` (Hugging Face's
    ``rope_parameters``) is not the default and names ``mscale_all_dim``: YaRN's attention
    temperature mscale = 0.1 * mscale_all_dim * ln(factor) + 1 (1 for factor <= 1), which
    DeepSeek applies to the scores rather than to cos and sin, hence squared (q and k each)."""
    scale = 1 / math.sqrt(qk_head_dim)
    rope_type = "default" if rope_scaling is None else rope_scaling.get("rope_type", "default")
    mscale_all_dim = 0 if rope_scaling is None else rope_scaling.get("mscale_all_dim", 0)
    if rope_type != "default" and mscale_all_dim:
        factor = rope_scaling["factor"]
        mscale = 1.0 if factor <= 1 else 0.1 * mscale_all_dim * math.log(factor) + 1.0
        scale = scale * mscale * mscale
    return scale


@dataclass(frozen=True)
class MLAConfig:
    """MLA's sizes (Hugging Face's DeepseekV3Config names in the comments); a toy by default."""

    n_embd: int = 32                  # C (hidden_size)
    n_head: int = 4                   # nh (num_attention_heads)
    q_lora_rank: int | None = 12      # rq; None: one projection q (C, nh * (dn + dr))
    kv_lora_rank: int = 8             # rkv, the latent's width
    qk_nope_head_dim: int = 4         # dn, the part of q and k without positions
    qk_rope_head_dim: int = 4         # dr, the rotated part, one key head shared by all
    v_head_dim: int = 6               # dv
    rms_eps: float = 1e-6             # of the two latent norms (Hugging Face's are fixed at 1e-6)
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # rope_parameters; its mscale_all_dim enters softmax_scale
    rope_interleave: bool = True      # rotary pairs (2j, 2j+1) as DeepSeek's weights; else (j, j + dr/2)
    attn_bias: bool = False           # attention_bias: biases on q_a, kv_a and o

    def __post_init__(self):
        for name, value in _check_mla_config(self).items():
            object.__setattr__(self, name, value)     # NumPy scalars become Python int/float/bool

    @property
    def qk_head_dim(self):
        """dn + dr: the width of a query and of a key."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def softmax_scale(self):
        """The score scale, YaRN's mscale included (mla_softmax_scale)."""
        return mla_softmax_scale(self.qk_head_dim, self.rope_scaling)

    @property
    def rope_layout(self):
        """rope.py's layout of the rotated part."""
        return "interleaved" if self.rope_interleave else "half"


def init_mla_params(config, rng, dtype=np.float32):
    """{"q_a", "q_a_norm", "q_b"} (or {"q"} without q_lora_rank), "kv_a", "kv_a_norm", "kv_b", "o".

    Linear weights from N(0, 0.02^2) (Hugging Face's initializer_range), norms at 1, biases at 0.
    """
    check_rng(rng, "init_mla_params")
    C, nh, rkv = config.n_embd, config.n_head, config.kv_lora_rank
    dn, dr, dv = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim

    def linear(C_in, C_out, bias=False):
        layer = {"w": rng.normal(0, 0.02, (C_in, C_out)).astype(dtype)}
        if bias:
            layer["b"] = np.zeros(C_out, dtype)
        return layer

    if config.q_lora_rank is None:
        params = {"q": linear(C, nh * (dn + dr))}
    else:
        rq = config.q_lora_rank
        params = {"q_a": linear(C, rq, config.attn_bias), "q_a_norm": {"w": np.ones(rq, dtype)},
                  "q_b": linear(rq, nh * (dn + dr))}
    params["kv_a"] = linear(C, rkv + dr, config.attn_bias)
    params["kv_a_norm"] = {"w": np.ones(rkv, dtype)}
    params["kv_b"] = linear(rkv, nh * (dn + dv))
    params["o"] = linear(nh * dv, C, config.attn_bias)
    return params


# -- the query and the latent, shared by both paths -----------------------------------------------

def _query(x, params, config, pos):
    """x (B, T, C) -> q_n (B, nh, T, dn), rotated q_r (B, nh, T, dr), and the caches."""
    B, T, C = x.shape
    nh, dn, dr = config.n_head, config.qk_nope_head_dim, config.qk_rope_head_dim
    if config.q_lora_rank is None:   # one full-rank projection
        q, q_cache = linear_forward(x, **params["q"])                         # (B, T, C) -> (B, T, nh*(dn+dr))
        q_a_cache = q_a_norm_cache = None
    else:
        c_q, q_a_cache = linear_forward(x, **params["q_a"])                   # (B, T, C) -> (B, T, rq)
        c_q, q_a_norm_cache = rms_norm_forward(c_q, params["q_a_norm"]["w"], config.rms_eps)   # (B, T, rq)
        q, q_cache = linear_forward(c_q, **params["q_b"])                     # (B, T, rq) -> (B, T, nh*(dn+dr))
    q = q.reshape(B, T, nh, dn + dr).swapaxes(1, 2)                           # -> (B, nh, T, dn+dr)
    q_n, q_r = q[..., :dn], q[..., dn:]                                       # (B, nh, T, dn), (B, nh, T, dr)
    q_r, q_rope_cache = rope_forward(q_r, pos, config.rope_theta, config.rope_layout,
                                     config.rope_scaling)                     # (B, nh, T, dr)
    return q_n, q_r, (q_a_cache, q_a_norm_cache, q_cache, q_rope_cache)


def _latent(x, params, config, pos):
    """x (B, T, C) -> the normed latent c_kv (B, T, rkv), the rotated shared key k_r (B, 1, T, dr)."""
    B, T, C = x.shape
    rkv = config.kv_lora_rank
    kv, kv_a_cache = linear_forward(x, **params["kv_a"])                      # (B, T, C) -> (B, T, rkv+dr)
    c_kv, k_r = kv[..., :rkv], kv[..., rkv:]                                  # (B, T, rkv), (B, T, dr)
    c_kv, kv_a_norm_cache = rms_norm_forward(c_kv, params["kv_a_norm"]["w"], config.rms_eps)   # (B, T, rkv)
    k_r, k_rope_cache = rope_forward(k_r[:, None], pos, config.rope_theta, config.rope_layout,
                                     config.rope_scaling)                     # (B, T, dr) -> (B, 1, T, dr)
    return c_kv, k_r, (kv_a_cache, kv_a_norm_cache, k_rope_cache)


# -- naive MLA: keys and values per head ----------------------------------------------------------

class MLACache(NamedTuple):
    """The caches of the query path, the latent path, kv_b, attention and o, in forward order."""

    query: tuple             # (q_a, q_a_norm, q or q_b, q rope); q_a and q_a_norm None without q_lora_rank
    latent: tuple            # (kv_a, kv_a_norm, k rope)
    kv_b: tuple
    sdpa: tuple
    o: tuple
    config: MLAConfig
    past: int = 0            # keys read from a key/value cache (0 without one): no gradient reaches them


def mla_forward(x, params, config, positions=None, kv_cache=None, attn_mask=None):
    """Causal MLA: x (B, T, C), positions (T,) or (B, T) (default past..past+T-1) -> (B, T, C).
    ``attn_mask`` (bool, broadcast to (B, nh, T, S)), if given, replaces the causal mask (it must
    hold it: a model's shell joins the two).

    Returns ``(out, cache)``; the cache holds the sub-operations' caches (MLACache). With a
    ``kv_cache`` (this layer's, ``init_mla_kv_cache(...).layer(i)``) x holds only the T new tokens:
    their keys and values join the cached ones, S = past + T, the mask aligned bottom-right.
    """
    positions = _check_mla(x, params, config, positions, kv_cache=kv_cache)
    B, T, C = x.shape
    nh, dn, dr, dv = config.n_head, config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
    pos = positions if positions.ndim == 1 else positions[:, None, :]         # (B, T) -> (B, 1, T): all heads
    q_n, q_r, query_cache = _query(x, params, config, pos)                    # (B, nh, T, dn), (B, nh, T, dr)
    c_kv, k_r, latent_cache = _latent(x, params, config, pos)                 # (B, T, rkv), (B, 1, T, dr)
    kv, kv_b_cache = linear_forward(c_kv, **params["kv_b"])                   # (B, T, rkv) -> (B, T, nh*(dn+dv))
    kv = kv.reshape(B, T, nh, dn + dv).swapaxes(1, 2)                         # -> (B, nh, T, dn+dv)
    k_n, v = kv[..., :dn], kv[..., dn:]                                       # (B, nh, T, dn), (B, nh, T, dv)
    q = np.concatenate([q_n, q_r], axis=-1)                                   # (B, nh, T, dn+dr)
    k = np.concatenate([k_n, np.broadcast_to(k_r, (B, nh, T, dr))], axis=-1)  # (B, nh, T, dn+dr): k_r shared
    past = 0 if kv_cache is None else kv_cache.length                         # tokens already cached
    if kv_cache is not None:   # decoding: the past tokens' keys and values come from the cache
        k, v = kv_cache_update(kv_cache, k, v)                                # -> (B, nh, S, dn+dr), (B, nh, S, dv)
    y, sdpa_cache = scaled_dot_product_attention_forward(q, k, v, attn_mask, is_causal=_causal(attn_mask),
                                                         scale=config.softmax_scale)   # (B, nh, T, dv)
    y = y.swapaxes(1, 2).reshape(B, T, nh * dv)                               # (B, nh, T, dv) -> (B, T, nh*dv)
    out, o_cache = linear_forward(y, **params["o"])                           # (B, T, nh*dv) -> (B, T, C)
    cache = MLACache(query_cache, latent_cache, kv_b_cache, sdpa_cache, o_cache, config, past)
    return out, cache


def mla_backward(dout, cache):
    """Gradients: dout (B, T, C) -> (dx (B, T, C), dparams with the params' keys)."""
    config = cache.config
    nh, dn = config.n_head, config.qk_nope_head_dim
    y, w_o, _ = cache.o
    B, T = y.shape[:2]
    check_dout("mla", dout, (B, T, w_o.shape[1]), y.dtype)
    # Undoes out = y @ o.w (+ o.b).
    dy, do = linear_backward(dout, cache.o)                                   # (B, T, C) -> (B, T, nh*dv)
    # Undoes y = y.swapaxes(1, 2).reshape(...).
    dy = dy.reshape(B, T, nh, config.v_head_dim).swapaxes(1, 2)              # -> (B, nh, T, dv)
    # Undoes attention.
    dq, dk, dv = scaled_dot_product_attention_backward(dy, cache.sdpa)       # (B, nh, T, .)
    check_no_past("mla_backward", dk.shape[2], cache.past)   # cached past: inference only
    # Undoes k = [k_n, k_r broadcast to every head]: the shared k_r sums the gradients of all heads
    # (in float32 for float16 and bfloat16, rounded once).
    dk_r = upcast(dk[..., dn:]).sum(axis=1, keepdims=True).astype(dk.dtype, copy=False)   # (B, 1, T, dr)
    dk_n = dk[..., :dn]                                                       # (B, nh, T, dn)
    # Undoes q = [q_n, q_r].
    dq_n, dq_r = dq[..., :dn], dq[..., dn:]                                   # (B, nh, T, dn), (B, nh, T, dr)
    # Undoes k_n, v = kv[..., :dn], kv[..., dn:] and the reshape into heads.
    dkv = np.concatenate([dk_n, dv], axis=-1)                                 # (B, nh, T, dn+dv)
    dkv = dkv.swapaxes(1, 2).reshape(B, T, nh * dkv.shape[-1])                # -> (B, T, nh*(dn+dv))
    # Undoes kv = c_kv @ kv_b.w.
    dc_kv, dkv_b = linear_backward(dkv, cache.kv_b)                           # (B, T, rkv)
    dx_kv, dlatent = _latent_backward(dc_kv, dk_r, cache.latent)              # (B, T, C)
    dx_q, dquery = _query_backward(dq_n, dq_r, cache.query)                   # (B, T, C)
    # x fed both paths: their gradients add.
    dx = dx_q + dx_kv
    return dx, {**dquery, **dlatent, "kv_b": dkv_b, "o": do}


def _latent_backward(dc_kv, dk_r, latent_cache):
    """Undoes _latent: dc_kv (B, T, rkv), dk_r (B, 1, T, dr) -> (dx (B, T, C), {"kv_a", "kv_a_norm"})."""
    kv_a_cache, kv_a_norm_cache, k_rope_cache = latent_cache
    # Undoes k_r = rope(k_r[:, None]).
    dk_r = rope_backward(dk_r, k_rope_cache)[:, 0]                            # (B, 1, T, dr) -> (B, T, dr)
    # Undoes c_kv = rms_norm(c_kv).
    dc_kv, dkv_a_norm = rms_norm_backward(dc_kv, kv_a_norm_cache)             # (B, T, rkv)
    # Undoes c_kv, k_r = kv[..., :rkv], kv[..., rkv:].
    dkv = np.concatenate([dc_kv, dk_r], axis=-1)                              # (B, T, rkv+dr)
    # Undoes kv = x @ kv_a.w (+ kv_a.b).
    dx, dkv_a = linear_backward(dkv, kv_a_cache)                              # (B, T, C)
    return dx, {"kv_a": dkv_a, "kv_a_norm": dkv_a_norm}


def _query_backward(dq_n, dq_r, query_cache):
    """Undoes _query: dq_n (B, nh, T, dn), dq_r (B, nh, T, dr) -> (dx (B, T, C), the q params' grads)."""
    q_a_cache, q_a_norm_cache, q_cache, q_rope_cache = query_cache
    B, nh, T = dq_n.shape[:3]
    # Undoes q_r = rope(q_r).
    dq_r = rope_backward(dq_r, q_rope_cache)                                  # (B, nh, T, dr)
    # Undoes q_n, q_r = q[..., :dn], q[..., dn:] and the reshape into heads.
    dq = np.concatenate([dq_n, dq_r], axis=-1)                                # (B, nh, T, dn+dr)
    dq = dq.swapaxes(1, 2).reshape(B, T, nh * dq.shape[-1])                   # -> (B, T, nh*(dn+dr))
    if q_a_cache is None:   # one full-rank projection
        dx, dq_params = linear_backward(dq, q_cache)                          # (B, T, C)
        return dx, {"q": dq_params}
    # Undoes q = c_q @ q_b.w, c_q = rms_norm(c_q), c_q = x @ q_a.w (+ q_a.b).
    dc_q, dq_b = linear_backward(dq, q_cache)                                 # (B, T, rq)
    dc_q, dq_a_norm = rms_norm_backward(dc_q, q_a_norm_cache)                 # (B, T, rq)
    dx, dq_a = linear_backward(dc_q, q_a_cache)                               # (B, T, C)
    return dx, {"q_a": dq_a, "q_a_norm": dq_a_norm, "q_b": dq_b}


def init_mla_kv_cache(config, n_layer, B, max_len, dtype=np.float32):
    """An empty naive cache for ``n_layer`` MLA layers: per head a key of dn + dr numbers and a
    value of dv, as Hugging Face's model attends over (numpy_attn/kv_cache.py's KVCache)."""
    if not isinstance(config, MLAConfig):
        raise TypeError(f"config must be an MLAConfig, got {type(config).__name__}")
    return init_kv_cache(n_layer, B, config.n_head, max_len, config.qk_head_dim, dtype,
                         v_head_size=config.v_head_dim)


# -- absorbed MLA: decoding from a cache of latents ----------------------------------------------

@dataclass
class LatentCache:
    """The normed latents and rotated shared keys of ``length`` tokens, in arrays of max_len slots."""

    c_kv: np.ndarray       # (B, max_len, rkv)
    k_r: np.ndarray        # (B, max_len, dr)
    length: int = 0        # tokens stored: the position of the next token

    @property
    def bytes_per_token(self):
        """Bytes one token of one sequence takes: (rkv + dr) x itemsize."""
        return (self.c_kv.shape[-1] + self.k_r.shape[-1]) * self.c_kv.itemsize


def init_latent_cache(config, B, max_len, dtype=np.float32):
    """An empty latent cache of one MLA layer for B sequences of up to ``max_len`` tokens."""
    _check_latent_cache_sizes(B, max_len, dtype)
    # Zeros rather than np.empty: an accidental read of an empty slot gives the same answer every run.
    return LatentCache(np.zeros((B, max_len, config.kv_lora_rank), dtype),
                       np.zeros((B, max_len, config.qk_rope_head_dim), dtype))


def latent_cache_update(latent_cache, c_kv, k_r):
    """Append c_kv (B, T, rkv) and k_r (B, T, dr) of T new tokens; return all of them so far,
    (B, S, rkv) and (B, S, dr) with S = old length + T (views of the cache)."""
    start, end = latent_cache.length, latent_cache.length + c_kv.shape[1]
    latent_cache.c_kv[:, start:end] = c_kv                                    # (B, T, rkv) into its slots
    latent_cache.k_r[:, start:end] = k_r                                      # (B, T, dr)
    latent_cache.length = end
    return latent_cache.c_kv[:, :end], latent_cache.k_r[:, :end]             # (B, S, rkv), (B, S, dr)


def mla_absorbed_forward(x, params, config, latent_cache, positions=None, attn_mask=None):
    """MLA of the T new tokens x (B, T, C) over the cached ones and themselves -> (B, T, C);
    ``attn_mask`` as mla_forward's.

    ``latent_cache`` (init_latent_cache) holds the past tokens' latents and gains x's; positions
    default to past..past+T-1. Inference only: it returns the output alone, no backward cache.
    """
    positions = _check_mla(x, params, config, positions, latent_cache)
    B, T, C = x.shape
    nh, dn, dv, rkv = config.n_head, config.qk_nope_head_dim, config.v_head_dim, config.kv_lora_rank
    pos = positions if positions.ndim == 1 else positions[:, None, :]         # (B, T) -> (B, 1, T): all heads
    q_n, q_r, _ = _query(x, params, config, pos)                              # (B, nh, T, dn), (B, nh, T, dr)
    c_kv, k_r, _ = _latent(x, params, config, pos)                            # (B, T, rkv), (B, 1, T, dr)
    c_kv, k_r = latent_cache_update(latent_cache, c_kv, k_r[:, 0])            # (B, S, rkv), (B, S, dr)
    w_kv = params["kv_b"]["w"].reshape(rkv, nh, -1).swapaxes(0, 1)            # (rkv, nh*(dn+dv)) -> (nh, rkv, dn+dv)
    w_uk, w_uv = w_kv[..., :dn], w_kv[..., dn:]                               # (nh, rkv, dn), (nh, rkv, dv)
    # q_n . (c_kv W_uk) = (q_n W_uk^T) . c_kv: the key up-projection folded into the query.
    # In float32 for float16 and bfloat16, rounded once, as a matmul in PyTorch.
    q_c = (upcast(q_n) @ upcast(w_uk).swapaxes(-1, -2)).astype(x.dtype, copy=False)   # (B, nh, T, dn) -> (.., rkv)
    q = np.concatenate([q_c, q_r], axis=-1)                                   # (B, nh, T, rkv+dr)
    k = np.concatenate([c_kv, k_r], axis=-1)[:, None]                         # (B, 1, S, rkv+dr): one head for all
    # Multi-query attention over the latents: the one key/value head broadcasts to the nh queries.
    y_c, _ = scaled_dot_product_attention_forward(q, k, c_kv[:, None], attn_mask, is_causal=_causal(attn_mask),
                                                  scale=config.softmax_scale)   # (B, nh, T, rkv)
    # sum_s a_s (c_s W_uv) = (sum_s a_s c_s) W_uv: the value up-projection after the weighted sum.
    y = (upcast(y_c) @ upcast(w_uv)).astype(x.dtype, copy=False)              # (B, nh, T, rkv) -> (B, nh, T, dv)
    y = y.swapaxes(1, 2).reshape(B, T, nh * dv)                               # (B, nh, T, dv) -> (B, T, nh*dv)
    out, _ = linear_forward(y, **params["o"])                                 # (B, T, nh*dv) -> (B, T, C)
    return out


def _causal(attn_mask):
    """The causal mask aligned bottom-right, unless ``attn_mask`` (which holds it) is given."""
    return "bottom_right" if attn_mask is None else False


def mla_cache_bytes_per_token(config, dtype=np.float32, n_kv_head=None, head_size=None):
    """Cache bytes per token, sequence and layer: {"mla_absorbed", "mla_naive", "gqa", "mha"}.

    mla_absorbed keeps c_kv and k_r (rkv + dr numbers); mla_naive a key (dn + dr) and a value
    (dv) per head, as Hugging Face's model and mla_forward compute them. GQA and MHA have the same
    nh query heads, keys and values of ``head_size`` (default dv, the DeepSeek-V2 paper's d_h
    in its Table 1), MHA one key/value head per query head, GQA ``n_kv_head`` (default 8, capped
    at nh; it must divide nh).
    """
    nh, rkv = config.n_head, config.kv_lora_rank
    dn, dr, dv = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
    n_kv_head = min(8, nh) if n_kv_head is None else n_kv_head
    head_size = dv if head_size is None else head_size
    _check_bytes_per_token(config, dtype, n_kv_head, head_size)
    itemsize = np.dtype(dtype).itemsize
    return {"mla_absorbed": (rkv + dr) * itemsize,
            "mla_naive": nh * (dn + dr + dv) * itemsize,
            "gqa": 2 * n_kv_head * head_size * itemsize,
            "mha": 2 * nh * head_size * itemsize}


# -- checks ---------------------------------------------------------------------------------------

def _check_mla_config(config):
    """Return the fields as Python values, or raise naming the field (numpy_attn/_checks.py)."""
    values = check_config(config, {
        "n_embd": (int, 1), "n_head": (int, 1), "q_lora_rank": (int | None, 1), "kv_lora_rank": (int, 1),
        "qk_nope_head_dim": (int, 1), "qk_rope_head_dim": (int, 2), "v_head_dim": (int, 1),
        "rms_eps": (float, 0), "rope_interleave": (bool, None), "attn_bias": (bool, None)})
    if config.qk_rope_head_dim % 2:
        raise ValueError(f"MLAConfig.qk_rope_head_dim must be even (rotated pairs), got {config.qk_rope_head_dim}")
    rope_frequencies(config.qk_rope_head_dim, config.rope_theta, config.rope_scaling)   # theta, scaling
    return values


def mla_param_shapes(config):
    """{path: shape} of every parameter ``config`` asks for (``init_mla_params``'s)."""
    C, nh, rkv = config.n_embd, config.n_head, config.kv_lora_rank
    dn, dr, dv = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
    if config.q_lora_rank is None:
        shapes = {"q.w": (C, nh * (dn + dr))}
    else:
        rq = config.q_lora_rank
        shapes = {"q_a.w": (C, rq), "q_a_norm.w": (rq,), "q_b.w": (rq, nh * (dn + dr))}
    shapes.update({"kv_a.w": (C, rkv + dr), "kv_a_norm.w": (rkv,), "kv_b.w": (rkv, nh * (dn + dv)),
                   "o.w": (nh * dv, C)})
    if config.attn_bias:
        for name in ("q_a", "kv_a", "o") if config.q_lora_rank is not None else ("kv_a", "o"):
            shapes[f"{name}.b"] = (shapes[f"{name}.w"][1],)
    return shapes


def _check_mla(x, params, config, positions, latent_cache=None, kv_cache=None):
    """Return positions as an integer array (default past..past+T-1), or raise naming the argument."""
    if not isinstance(config, MLAConfig):
        raise TypeError(f"config must be an MLAConfig, got {type(config).__name__}")
    check_float("x", x)
    if x.ndim != 3 or x.shape[-1] != config.n_embd:
        raise ValueError(f"x must have shape (B, T, C) with C = n_embd = {config.n_embd}, got {x.shape}")
    check_finite("x", x)
    B, T, C = x.shape
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict (init_mla_params), got {type(params).__name__}")
    expected = mla_param_shapes(config)
    given = {f"{name}.{key}": a for name, layer in params.items() if isinstance(layer, dict)
             for key, a in layer.items()}
    if set(given) != set(expected):
        raise ValueError(f"params must hold {sorted(expected)} for this config, got {sorted(given)}")
    for path, shape in expected.items():
        check_float(path, given[path])
        if given[path].shape != shape:
            raise ValueError(f"{path} must have shape {shape} for this config, got {given[path].shape}")
        if given[path].dtype != x.dtype:
            raise TypeError(f"{path} has dtype {given[path].dtype}, x has {x.dtype}: use one dtype")
    past = 0
    if latent_cache is not None:
        past = _check_latent_cache(latent_cache, config, x)
    if kv_cache is not None:
        past = _check_mla_kv_cache(kv_cache, config, x)
    check_positions(positions, B, T)
    return np.arange(past, past + T) if positions is None else np.asarray(positions)


def _check_latent_cache(latent_cache, config, x):
    """Return the tokens ``latent_cache`` holds; raise unless it fits x and has room for its T."""
    if not isinstance(latent_cache, LatentCache):
        raise TypeError(f"latent_cache must be a LatentCache (init_latent_cache), got "
                        f"{type(latent_cache).__name__}")
    B, T, C = x.shape
    c_kv, k_r = latent_cache.c_kv, latent_cache.k_r
    if c_kv.dtype != x.dtype:
        raise TypeError(f"latent_cache holds {c_kv.dtype}, x is {x.dtype}")
    wanted = ((B, c_kv.shape[1], config.kv_lora_rank), (B, c_kv.shape[1], config.qk_rope_head_dim))
    if (c_kv.shape, k_r.shape) != wanted:
        raise ValueError(f"latent_cache arrays {c_kv.shape}, {k_r.shape} must be {wanted[0]}, {wanted[1]} "
                         f"for x {x.shape} and this config")
    if latent_cache.length + T > c_kv.shape[1]:
        raise ValueError(f"latent_cache overflow: it holds {latent_cache.length} tokens, appending {T} "
                         f"would make {latent_cache.length + T} > max_len = {c_kv.shape[1]}")
    return latent_cache.length


def _check_mla_kv_cache(kv_cache, config, x):
    """Return the tokens the layer ``kv_cache`` holds; raise unless its keys and values are MLA's
    per-head ones for x and this config, of x's dtype, with room for x's T."""
    if not isinstance(kv_cache, LayerKVCache):
        raise TypeError(f"kv_cache must be one layer of an MLA key/value cache (init_mla_kv_cache(...).layer(i)), "
                        f"got {type(kv_cache).__name__}")
    B, T, C = x.shape
    cache = kv_cache.cache
    if cache.buffer_k.dtype != x.dtype:
        raise TypeError(f"kv_cache holds {cache.buffer_k.dtype}, x is {x.dtype}")
    wanted = (B, config.n_head, config.qk_head_dim, config.v_head_dim)
    got = (cache.dims[0], cache.dims[1], cache.dims[3], cache.v_hs)
    if got != wanted or kv_cache.window is not None:
        raise ValueError(f"kv_cache (B, heads, key width, value width) = {got} must be {wanted} "
                         f"(x {x.shape}, n_head, dn + dr, dv), full (window None, got {kv_cache.window})")
    if kv_cache.length + T > cache.max_len:
        raise ValueError(f"kv_cache overflow: it holds {kv_cache.length} tokens, appending {T} "
                         f"would make {kv_cache.length + T} > max_len = {cache.max_len}")
    return kv_cache.length


def _check_latent_cache_sizes(B, max_len, dtype):
    for name, n in (("B", B), ("max_len", max_len)):
        if isinstance(n, bool) or not isinstance(n, int | np.integer):
            raise TypeError(f"{name} must be an integer, got {n!r}")
        if n < 1:
            raise ValueError(f"{name} must be >= 1, got {n}")
    _check_cache_dtype(dtype)


def _check_cache_dtype(dtype):
    """Raise TypeError unless ``dtype`` is one of the float dtypes every operation takes."""
    if np.dtype(dtype).name not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be float16, bfloat16, float32 or float64, got {np.dtype(dtype)}")


def _check_bytes_per_token(config, dtype, n_kv_head, head_size):
    if not isinstance(config, MLAConfig):
        raise TypeError(f"config must be an MLAConfig, got {type(config).__name__}")
    for name, n in (("n_kv_head", n_kv_head), ("head_size", head_size)):
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
            raise ValueError(f"{name} must be a positive integer, got {n!r}")
    if config.n_head % n_kv_head:
        raise ValueError(f"n_kv_head = {n_kv_head} must divide n_head = {config.n_head}")
    _check_cache_dtype(dtype)
