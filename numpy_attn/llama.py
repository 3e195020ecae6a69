"""A Llama-style language model, and its backward.

    x      = wte[ids]
    x      = x + attn(rms_norm(x))           causal, RoPE on q and k, grouped-query heads
    x      = x + swiglu(rms_norm(x))         (the two lines above once per block)
    x      = rms_norm(x)
    logits = x @ head.w                      head.w = wte^T with tied weights

Touvron et al., "LLaMA: Open and Efficient Foundation Language Models" (2023), section 2.2, and
"Llama 2" (2023) for grouped-query attention: GPT-2's pre-norm block with RMS norm in place of
layer norm (numpy_attn/rms_norm.py), rotary positions in place of a position table
(numpy_attn/rope.py), SwiGLU in place of the GELU network (numpy_attn/swiglu.py), and no biases
(``attn_bias`` and ``mlp_bias`` turn them on, as Hugging Face's ``attention_bias`` and
``mlp_bias``). With n_kv_head < n_head, the n_head / n_kv_head query heads of a group share one
key/value head; numpy_attn/attention.py does the sharing and sums their gradients.

Parameters are nested dicts: ``blocks.0.attn.q.w`` (C, nh * hs), ``blocks.0.attn.k.w``
(C, nkv * hs), ``blocks.0.attn.o.w`` (nh * hs, C), ``blocks.0.mlp.gate.w`` (C, H), norms
``{"w": (C,)}``. The head size hs need not be C / nh (``head_dim``, as in Hugging Face's config).

The optional arguments are gpt.py's: ``positions`` (default past..past+T-1, where RoPE rotates),
an ``attn_mask`` (bool) that restricts attention further (numpy_attn/masks.py's padding and
packing masks), a ``kv_cache`` (``llama_kv_cache``, numpy_attn/kv_cache.py) holding the past
tokens while ids hold only the new ones, and ``rng`` (unused: this model has no dropout). With a
cache, the causal mask aligns bottom-right and each layer stores its keys already rotated, for
its nkv key/value heads only. The backward refuses a forward that read past tokens from the cache:
it is for inference only.

The families built on this model reuse its pieces: a config class's ``qk_norm`` puts an RMS norm
on q and k (``qk_norm_forward``: per head for numpy_attn/qwen3.py, over the whole projection for
numpy_attn/olmo2.py), and ``decoder_forward`` / ``decoder_backward`` run the embedding, the
blocks, the final norm and the head around another block (OLMo 2's norms after). A config's
``embed_scale``, ``score_scale``, ``score_softcap``, ``logit_softcap``, ``norm_offset`` and
``block_options(i)`` (all off for Llama) are the points where Gemma 2 and 3 (numpy_attn/gemma2.py,
gemma3.py) differ.

float16 and bfloat16 (params from ``init_llama_params(..., dtype=)``, a cache from
``llama_kv_cache(..., dtype=)``): every operation computes in float32 and rounds its output once
to the params' dtype (docs/precision.md), so the residual stream, the keys and values a cache
holds and the logits are in that dtype, as in transformers' models run in bfloat16. The model's
own steps round as transformers' do: each residual add rounds its float32 sum once (NumPy's add
of two float16 or bfloat16 arrays, as PyTorch's add kernel), and Gemma's embedding scale is
sqrt(C) rounded to the params' dtype first, then multiplied and rounded once.
"""

from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import numpy as np

from numpy_attn._checks import (
    check_config,
    check_dout,
    check_model_attn_mask,
    check_model_kv_cache,
    check_no_past,
    check_positions,
    check_rng,
    check_token_ids,
)
from numpy_attn._model import (
    blocks_backward,
    check_for_backward,
    check_logits_to_keep,
    head_backward,
    head_forward,
    with_head,
)
from numpy_attn.attention import (
    scaled_dot_product_attention_backward,
    scaled_dot_product_attention_forward,
)
from numpy_attn.embedding import embedding_backward, embedding_forward
from numpy_attn.kv_cache import init_kv_cache, kv_cache_update
from numpy_attn.linear import linear_backward, linear_forward
from numpy_attn.masks import causal_mask, sliding_window_mask
from numpy_attn.rms_norm import rms_norm_backward, rms_norm_forward
from numpy_attn.rope import LAYOUTS, rope_backward, rope_forward, rope_frequencies
from numpy_attn.softcap import logit_softcap_backward, logit_softcap_forward
from numpy_attn.swiglu import swiglu_backward, swiglu_forward


@dataclass(frozen=True)
class LlamaConfig:
    """The model's sizes and switches; the defaults are a toy that runs in milliseconds."""

    vocab_size: int = 64          # V
    block_size: int = 32          # the longest context T (max_position_embeddings)
    n_layer: int = 2
    n_head: int = 4               # nh, query heads
    n_kv_head: int = 2            # nkv, key/value heads; nh must be a multiple
    n_embd: int = 32              # C
    head_dim: int | None = None   # hs; None means C // nh
    hidden: int = 64              # H, the SwiGLU width (Hugging Face's intermediate_size)
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None   # rope.py's scaling: None, linear or llama3
    rope_layout: str = "half"     # "half" (Hugging Face) or "interleaved" (Meta's original)
    attn_bias: bool = False
    mlp_bias: bool = False
    tie_weights: bool = False     # the output layer is the token embedding, transposed
    # Not a field: the families built on this one (numpy_attn/qwen3.py, olmo2.py) set it.
    qk_norm: ClassVar[str | None] = None   # RMS norm on q and k: None, per "head" or over the "projection"

    def __post_init__(self):
        for name, value in _check_llama_config(self).items():
            object.__setattr__(self, name, value)     # NumPy scalars become Python int/float/bool

    @property
    def hs(self):
        """The head size: head_dim, or n_embd // n_head."""
        return self.n_embd // self.n_head if self.head_dim is None else self.head_dim

    @property
    def qk_norm_widths(self):
        """The widths of the q and k norms' weights: (hs, hs) per head, (nh*hs, nkv*hs) over the
        projection; None without QK-norm."""
        if self.qk_norm is None:
            return None
        return (self.hs, self.hs) if self.qk_norm == "head" else (self.n_head * self.hs, self.n_kv_head * self.hs)

    # The points where Gemma 2 (numpy_attn/gemma2.py) differs; Llama's are all off.
    embed_scale = None       # the embedding is multiplied by this (Gemma: sqrt(C))
    score_scale = None       # attention's score scale; None is 1 / sqrt(hs)
    score_softcap = None     # c of c * tanh(scores / c) inside attention
    logit_softcap = None     # c of c * tanh(logits / c) on the output
    norm_offset = 0.0        # the final norm scales by offset + w (Gemma: 1)
    norm_round_xhat = True   # low dtypes: every norm rounds xhat before * w (OLMo 2, gpt-oss: the product once)

    def block_options(self, i):
        """Keywords for block i's forward beyond llama_block_forward's (Gemma 2: its window)."""
        return {}


def init_llama_params(config, rng, dtype=np.float32):
    """{"wte": (V, C), "blocks": {"0": ..., ...}, "norm": {"w": (C,)}, ["head": {"w": (C, V)}]}.

    Embeddings and linear weights are drawn from N(0, 0.02^2), as Hugging Face's Llama
    (initializer_range); norms start at 1, biases at 0; head only without tied weights; the
    attention's "q_norm" and "k_norm" {"w"} only with the config's qk_norm.
    """
    check_rng(rng, "init_llama_params")
    V, C, hs = config.vocab_size, config.n_embd, config.hs
    nh, nkv = config.n_head, config.n_kv_head

    def linear(C_in, C_out, bias):
        layer = {"w": rng.normal(0, 0.02, (C_in, C_out)).astype(dtype)}
        if bias:
            layer["b"] = np.zeros(C_out, dtype)
        return layer

    params = {"wte": rng.normal(0, 0.02, (V, C)).astype(dtype), "blocks": {}}          # (V, C)
    for i in range(config.n_layer):
        attn = {"q": linear(C, nh * hs, config.attn_bias), "k": linear(C, nkv * hs, config.attn_bias),
                "v": linear(C, nkv * hs, config.attn_bias), "o": linear(nh * hs, C, config.attn_bias)}
        if config.qk_norm is not None:   # Qwen3, OLMo 2: the q and k norms start at 1 as the others
            attn["q_norm"], attn["k_norm"] = ({"w": np.ones(width, dtype)} for width in config.qk_norm_widths)
        mlp = {"gate": linear(C, config.hidden, config.mlp_bias),
               "up": linear(C, config.hidden, config.mlp_bias),
               "down": linear(config.hidden, C, config.mlp_bias)}
        params["blocks"][str(i)] = {"attn_norm": {"w": np.ones(C, dtype)}, "attn": attn,
                                    "mlp_norm": {"w": np.ones(C, dtype)}, "mlp": mlp}
    params["norm"] = {"w": np.ones(C, dtype)}
    if not config.tie_weights:
        params["head"] = {"w": rng.normal(0, 0.02, (C, V)).astype(dtype)}               # (C, V)
    return params


# -- QK-norm: RMS norm on the queries and keys (Qwen3, OLMo 2) --------------------------------------

class QKNormCache(NamedTuple):
    """The two RMS norms' caches, and where they sat."""

    q: tuple
    k: tuple
    kind: str                # "head" or "projection"


def qk_norm_forward(q, k, params, eps, kind, offset=0.0, round_xhat=True):
    """RMS norm of q and of k over their last axis, each with its own weight: per head, q
    (B, nh, T, hs) and k (B, nkv, T, hs) with weights (hs,); over the projection, q (B, T, nh*hs)
    and k (B, T, nkv*hs) with weights (nh*hs,) and (nkv*hs,); ``offset`` and ``round_xhat`` as
    rms_norm_forward's (Gemma 3's 1 + w; OLMo 2's product rounded once). Returns ``(q, k, cache)``.

    Bounding each query and key bounds the scores q . k / sqrt(hs): no logit grows without limit
    while training (Dehghani et al., "Scaling Vision Transformers to 22 Billion Parameters", 2023).
    """
    q, q_cache = rms_norm_forward(q, params["q_norm"]["w"], eps, offset, round_xhat)
    k, k_cache = rms_norm_forward(k, params["k_norm"]["w"], eps, offset, round_xhat)
    return q, k, QKNormCache(q_cache, k_cache, kind)


def qk_norm_backward(dq, dk, cache):
    """Gradients: (dq, dk) of the normed q and k -> (dq, dk, {"q_norm": {"w"}, "k_norm": {"w"}})."""
    dk, dk_norm = rms_norm_backward(dk, cache.k)
    dq, dq_norm = rms_norm_backward(dq, cache.q)
    return dq, dk, {"q_norm": dq_norm, "k_norm": dk_norm}


# -- attention with rotary positions and grouped-query heads ------------------------------------

class LlamaAttentionCache(NamedTuple):
    """The caches of the four projections, the QK-norm (None without), the two rotations and
    attention, in forward order."""

    q: tuple
    k: tuple
    v: tuple
    qk_norm: QKNormCache | None
    q_rope: tuple
    k_rope: tuple
    sdpa: tuple
    o: tuple
    num_heads: int           # nh
    head_size: int           # hs
    past: int                # keys read from a key/value cache (0 without one): no gradient reaches them


def llama_attention_forward(x, params, config, positions, *, attn_mask=None, kv_cache=None, window=None,
                            rope=None):
    """Causal self-attention with RoPE: x (B, T, C), positions (T,) or (B, T) -> (B, T, C).

    Returns ``(out, cache)``. ``attn_mask`` (bool, broadcasting to (B, nh, T, S)) replaces the
    causal mask, so it must include causality. With a ``kv_cache`` (this layer's, KVCache.layer(i))
    x holds only the T new tokens: their rotated keys and values join the cached ones, S = past + T,
    and the new queries are the last T of the S. ``window`` (None, or w >= 1) lets each query see
    its last w keys only (a sliding layer; with a cache, that layer's view holds only those);
    ``rope`` ({"theta", "scaling"}, or None for the config's) rotates this layer its own way (Gemma 3's local layers).
    A ``params["sinks"]`` (nh,) goes to attention as its sink logits (gpt-oss, numpy_attn/gpt_oss.py).
    """
    B, T, C = x.shape
    nh, nkv, hs = config.n_head, config.n_kv_head, config.hs
    pos = positions if positions.ndim == 1 else positions[:, None, :]         # (B, T) -> (B, 1, T): all heads
    q, q_cache = linear_forward(x, **params["q"])                             # (B, T, C) -> (B, T, nh*hs)
    k, k_cache = linear_forward(x, **params["k"])                             # (B, T, C) -> (B, T, nkv*hs)
    v, v_cache = linear_forward(x, **params["v"])                             # (B, T, C) -> (B, T, nkv*hs)
    qk_norm_cache = None
    if config.qk_norm == "projection":   # OLMo 2: q and k normed across all their heads at once
        q, k, qk_norm_cache = qk_norm_forward(q, k, params, config.rms_eps, "projection",
                                              round_xhat=config.norm_round_xhat)   # widths nh*hs, nkv*hs
    q = q.reshape(B, T, nh, hs).swapaxes(1, 2)                                # (B, T, nh*hs) -> (B, nh, T, hs)
    k = k.reshape(B, T, nkv, hs).swapaxes(1, 2)                               # (B, T, nkv*hs) -> (B, nkv, T, hs)
    v = v.reshape(B, T, nkv, hs).swapaxes(1, 2)                               # (B, T, nkv*hs) -> (B, nkv, T, hs)
    if config.qk_norm == "head":         # Qwen3: each head's q and k normed alone, before the rotation
        q, k, qk_norm_cache = qk_norm_forward(q, k, params, config.rms_eps, "head", config.norm_offset)   # width hs
    rope = {"theta": config.rope_theta, "scaling": config.rope_scaling, **(rope or {}), "layout": config.rope_layout}
    q, q_rope_cache = rope_forward(q, pos, **rope)                            # (B, nh, T, hs)
    k, k_rope_cache = rope_forward(k, pos, **rope)                            # (B, nkv, T, hs)
    past = 0 if kv_cache is None else kv_cache.length                         # tokens already cached
    if kv_cache is not None:   # decoding: the past tokens' (rotated) keys and values come from the cache
        k, v = kv_cache_update(kv_cache, k, v)                                # (B, nkv, T, hs) -> (B, nkv, S, hs)
    is_causal = "bottom_right" if attn_mask is None else False   # query t sees keys 0..past+t
    if attn_mask is not None and window is not None:   # the caller's mask, and the window's
        attn_mask = attn_mask & sliding_window_mask(T, k.shape[2], window, "bottom_right")
        window = None
    y, sdpa_cache = scaled_dot_product_attention_forward(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                                         scale=config.score_scale, softcap=config.score_softcap,
                                                         window=window, sinks=params.get("sinks"))   # (B, nh, T, hs)
    y = y.swapaxes(1, 2).reshape(B, T, nh * hs)                               # (B, nh, T, hs) -> (B, T, nh*hs)
    out, o_cache = linear_forward(y, **params["o"])                           # (B, T, nh*hs) -> (B, T, C)
    cache = LlamaAttentionCache(q_cache, k_cache, v_cache, qk_norm_cache, q_rope_cache, k_rope_cache, sdpa_cache,
                                o_cache, nh, hs, past)
    return out, cache


def llama_attention_backward(dout, cache):
    """Gradients: dout (B, T, C) -> (dx (B, T, C), {"q", "k", "v", "o"[, "q_norm", "k_norm"][, "sinks"]}
    like the params)."""
    B, T, C = dout.shape
    # Undoes out = y @ o.w (+ o.b).
    dy, do = linear_backward(dout, cache.o)                                   # (B, T, C) -> (B, T, nh*hs)
    nh, hs = cache.num_heads, cache.head_size
    # Undoes y = y.swapaxes(1, 2).reshape(...).
    dy = dy.reshape(B, T, nh, hs).swapaxes(1, 2)                              # (B, T, nh*hs) -> (B, nh, T, hs)
    # Undoes attention; dk and dv come back with the nkv heads of k and v (and dsinks with gpt-oss's sinks).
    dq, dk, dv, *dsinks = scaled_dot_product_attention_backward(dy, cache.sdpa)
    check_no_past("llama_backward", dk.shape[2], cache.past)   # cached past: inference only
    # Undoes the two rotations.
    dk = rope_backward(dk, cache.k_rope)                                      # (B, nkv, T, hs)
    dq = rope_backward(dq, cache.q_rope)                                      # (B, nh, T, hs)
    dqk_norm = {}
    kind = None if cache.qk_norm is None else cache.qk_norm.kind
    if kind == "head":         # undoes the per-head QK-norm
        dq, dk, dqk_norm = qk_norm_backward(dq, dk, cache.qk_norm)            # (B, nh, T, hs), (B, nkv, T, hs)
    # Undoes the reshapes of q, k, v into heads.
    dv = dv.swapaxes(1, 2).reshape(B, T, -1)                                  # (B, nkv, T, hs) -> (B, T, nkv*hs)
    dk = dk.swapaxes(1, 2).reshape(B, T, -1)                                  # (B, nkv, T, hs) -> (B, T, nkv*hs)
    dq = dq.swapaxes(1, 2).reshape(B, T, -1)                                  # (B, nh, T, hs) -> (B, T, nh*hs)
    if kind == "projection":   # undoes the QK-norm over the projection
        dq, dk, dqk_norm = qk_norm_backward(dq, dk, cache.qk_norm)            # (B, T, nh*hs), (B, T, nkv*hs)
    # Undoes the three projections: x fed all of them, so their gradients add.
    dx_v, dv_params = linear_backward(dv, cache.v)                            # (B, T, C)
    dx_k, dk_params = linear_backward(dk, cache.k)                            # (B, T, C)
    dx_q, dq_params = linear_backward(dq, cache.q)                            # (B, T, C)
    dx = dx_q + dx_k + dx_v
    dsinks = {"sinks": dsinks[0]} if dsinks else {}
    return dx, {"q": dq_params, "k": dk_params, "v": dv_params, "o": do, **dqk_norm, **dsinks}


# -- the block ------------------------------------------------------------------------------------

class LlamaBlockCache(NamedTuple):
    """The four sub-caches, in forward order."""

    attn_norm: tuple
    attn: LlamaAttentionCache
    mlp_norm: tuple
    mlp: tuple


def llama_block_forward(x, params, config, positions, *, attn_mask=None, kv_cache=None):
    """One block: x (B, T, C) -> (B, T, C). Returns ``(out, cache)``, the four sub-caches;
    ``attn_mask`` and ``kv_cache`` (this block's layer) go to attention."""
    # 1-3: x + attn(rms_norm(x))
    h, attn_norm_cache = rms_norm_forward(x, params["attn_norm"]["w"], config.rms_eps)   # (B, T, C)
    a, attn_cache = llama_attention_forward(h, params["attn"], config, positions, attn_mask=attn_mask,
                                            kv_cache=kv_cache)                 # (B, T, C)
    x = x + a
    # 4-6: x + swiglu(rms_norm(x))
    h, mlp_norm_cache = rms_norm_forward(x, params["mlp_norm"]["w"], config.rms_eps)     # (B, T, C)
    f, mlp_cache = swiglu_forward(h, params["mlp"])                                    # (B, T, C) via (B, T, H)
    out = x + f
    cache = LlamaBlockCache(attn_norm_cache, attn_cache, mlp_norm_cache, mlp_cache)
    return out, cache


def llama_block_backward(dout, cache):
    """Gradients: dout (B, T, C) -> (dx (B, T, C), dparams like the block's params)."""
    # 6: undoes out = x + f: the skip hands dout to x, the branch to f.
    # 5: undoes f = swiglu(h).
    dh, dmlp = swiglu_backward(dout, cache.mlp)                               # (B, T, C)
    # 4: undoes h = rms_norm(x); x also fed the skip.
    dx_mlp, dmlp_norm = rms_norm_backward(dh, cache.mlp_norm)                 # (B, T, C)
    dx = dx_mlp + dout                                                        # branch + skip
    # 3: undoes x = x + a, as step 6.
    # 2: undoes a = attn(h).
    dh, dattn = llama_attention_backward(dx, cache.attn)                      # (B, T, C)
    # 1: undoes h = rms_norm(x).
    dx_attn, dattn_norm = rms_norm_backward(dh, cache.attn_norm)              # (B, T, C)
    dx = dx_attn + dx                                                         # branch + skip
    return dx, {"attn_norm": dattn_norm, "attn": dattn, "mlp_norm": dmlp_norm, "mlp": dmlp}


# -- the model ------------------------------------------------------------------------------------

class LlamaCache(NamedTuple):
    """The sub-caches in forward order."""

    wte: tuple
    blocks: list
    norm: tuple
    head: tuple              # numpy_attn/_model.py's HeadCache
    embed_scale: np.floating | None = None    # the embedding's multiplier (Gemma), in its dtype
    logit_softcap: tuple | None = None        # the cap on the logits' cache (Gemma 2)


def llama_forward(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
                  logits_to_keep=None, for_backward=True):
    """Logits for integer ``ids`` (B, T), T <= block_size -> (B, T, V). Returns ``(logits, cache)``.

    ``positions`` (T,) or (B, T), integers, default past..past+T-1: where each token sits (RoPE).
    ``attn_mask`` (bool, broadcasting to (B, nh, T, S), S = past + T) restricts attention beyond
    causality; ``kv_cache`` (llama_kv_cache) holds the past tokens, ids only the new ones; ``rng``
    is accepted for gpt_forward's vocabulary and unused (no dropout); ``logits_to_keep`` N > 0
    computes the last N positions' logits only, (B, N, V), as gpt_forward's; ``for_backward=False``
    keeps no activations and returns ``(logits, None)``, as gpt_forward's.
    """
    return decoder_forward(ids, params, config, LlamaConfig, llama_block_forward, positions=positions,
                           attn_mask=attn_mask, kv_cache=kv_cache, rng=rng,
                           logits_to_keep=logits_to_keep, for_backward=for_backward)


def decoder_forward(ids, params, config, config_class, block_forward, *, positions, attn_mask, kv_cache, rng,
                    logits_to_keep=None, for_backward=True):
    """llama_forward for the families built on it: ``config`` must be a ``config_class``, and
    ``block_forward`` (llama_block_forward's arguments) makes each block."""
    ids = _check_llama(ids, config, config_class, positions, attn_mask, kv_cache, rng, logits_to_keep)
    check_for_backward(for_backward)
    B, T = ids.shape
    past = 0 if kv_cache is None else kv_cache.length                         # tokens already cached
    positions = np.arange(past, past + T) if positions is None else np.asarray(positions)
    wte = params["wte"]
    # Causal, aligned bottom-right (the T new tokens follow the past ones); one mask with the caller's.
    attn_mask = None if attn_mask is None else attn_mask & causal_mask(T, past + T, "bottom_right")
    # 1: token embedding (positions enter through RoPE inside attention)
    x, wte_cache = embedding_forward(ids, wte)                                # (B, T) -> (B, T, C)
    embed_scale = None
    if config.embed_scale is not None:   # Gemma: times sqrt(C), rounded to the model's dtype first
        # In the model's dtype even for float16 and bfloat16, as transformers' Gemma normalizer; the
        # product of two such numbers is exact in float32, so the multiply rounds once.
        embed_scale = x.dtype.type(config.embed_scale)
        x = x * embed_scale                                                   # (B, T, C)
    # 2: the blocks, in order; each reads and appends to its own layer of the cache
    block_caches = []
    for i in range(config.n_layer):
        layer_cache = None if kv_cache is None else kv_cache.layer(i)
        x, block_cache = block_forward(x, params["blocks"][str(i)], config, positions,
                                       attn_mask=attn_mask, kv_cache=layer_cache, **config.block_options(i))
        if for_backward:
            block_caches.append(block_cache)                                  # x: (B, T, C)
        del block_cache   # without for_backward its activations are freed now, not after the next block
    # 3: final RMS norm
    x, norm_cache = rms_norm_forward(x, params["norm"]["w"], config.rms_eps, config.norm_offset,
                                   config.norm_round_xhat)                   # (B, T, C)
    # 4: the output layer
    logits, head_cache = head_forward(x, params, config.tie_weights, logits_to_keep)   # (B, T, C) -> (B, N, V)
    softcap_cache = None
    if config.logit_softcap is not None:   # Gemma 2: c * tanh(logits / c), on the kept logits
        logits, softcap_cache = logit_softcap_forward(logits, config.logit_softcap)   # (B, N, V)
    if not for_backward:
        return logits, None
    cache = LlamaCache(wte_cache, block_caches, norm_cache, head_cache, embed_scale, softcap_cache)
    return logits, cache


def llama_backward(dlogits, cache):
    """Gradients: dlogits (B, N, V) (N = T unless logits_to_keep) -> dparams, with the nesting of the params."""
    return decoder_backward("llama", dlogits, cache, llama_block_backward)


def decoder_backward(op, dlogits, cache, block_backward):
    """llama_backward for the families built on it: ``block_backward`` undoes each block; ``op``
    names the model in the message about a wrong dlogits."""
    if cache.logit_softcap is not None:   # undoes logits = c * tanh(logits / c)
        check_dout(op, dlogits, cache.head.shape, cache.head.dtype, name="dlogits")
        dlogits = logit_softcap_backward(dlogits, cache.logit_softcap)       # (B, N, V)
    # 4: undoes logits = x[:, -N:] @ head_w.
    dx, dhead = head_backward(op, dlogits, cache.head)                        # (B, N, V) -> (B, T, C)
    # 3: undoes x = rms_norm(x).
    dx, dnorm = rms_norm_backward(dx, cache.norm)                             # (B, T, C)
    # 2: undoes the blocks, the last one first.
    dx, dblocks = blocks_backward(dx, cache.blocks, block_backward)           # (B, T, C)
    if cache.embed_scale is not None:   # undoes x = x * embed_scale
        dx = dx * cache.embed_scale
    # 1: undoes x = wte[ids].
    dparams = {"wte": embedding_backward(dx, cache.wte), "blocks": dblocks, "norm": dnorm}
    return with_head(dparams, dhead, cache.head)


def llama_kv_cache(config, B, dtype=np.float32, max_len=None):
    """An empty key/value cache for decoding B sequences of up to ``max_len`` (default
    block_size) tokens with this model: one layer per block, the nkv key/value heads only."""
    max_len = config.block_size if max_len is None else max_len
    return init_kv_cache(config.n_layer, B, config.n_kv_head, max_len, config.hs, dtype)


def _check_llama_config(config):
    """Return the fields as Python values, or raise naming the field (numpy_attn/_checks.py)."""
    values = check_config(config, {
        "vocab_size": (int, 1), "block_size": (int, 1), "n_layer": (int, 0), "n_head": (int, 1),
        "n_kv_head": (int, 1), "n_embd": (int, 1), "head_dim": (int | None, 2), "hidden": (int, 1),
        "rms_eps": (float, 0), "rope_layout": (LAYOUTS, None), "attn_bias": (bool, None),
        "mlp_bias": (bool, None), "tie_weights": (bool, None)})
    hs = config.n_embd // config.n_head if config.head_dim is None else config.head_dim
    if hs % 2:
        raise ValueError(f"the head size must be even for rotary positions, got {hs} "
                         f"(head_dim = {config.head_dim}, n_embd = {config.n_embd}, n_head = {config.n_head})")
    if config.n_head % config.n_kv_head:
        raise ValueError(f"n_head = {config.n_head} must be a multiple of n_kv_head = {config.n_kv_head}")
    rope_frequencies(hs, config.rope_theta, config.rope_scaling)   # raises on bad theta, scaling
    return values


def _check_llama(ids, config, config_class, positions, attn_mask, kv_cache, rng, logits_to_keep):
    """Return ids as an integer (B, T) array, or raise naming the argument at fault."""
    if type(config) is not config_class:    # each family's params differ: a Qwen3Config is no LlamaConfig here
        raise TypeError(f"config must be a {config_class.__name__}, got {type(config).__name__}")
    ids = check_token_ids(ids, config.block_size)
    B, T = ids.shape
    past = check_model_kv_cache(kv_cache, config.n_layer, config.block_size, T, "llama_kv_cache")
    check_positions(positions, B, T)                  # no table: RoPE rotates to any position
    check_model_attn_mask(attn_mask, (B, config.n_head, T, past + T))
    check_logits_to_keep(logits_to_keep)
    if rng is not None:
        check_rng(rng, "llama_forward")
    return ids
