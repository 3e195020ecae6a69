"""Llama 4's text model: the Llama-style model (numpy_attn/llama.py) with chunked local attention
on its rotary layers, NoPE layers with a temperature on q, a weightless RMS norm on the rotated q
and k, and a mixture of experts with a shared expert on some layers.

    x      = wte[ids]
    x      = x + attn(rms_norm(x))           chunked and rotary, or global without positions (NoPE)
    x      = x + moe(rms_norm(x))            on the MoE layers; a SwiGLU network on the others
    x      = rms_norm(x)
    logits = x @ head.w

Meta, "The Llama 4 herd" (2025), in the form of transformers' ``Llama4ForCausalLM``:

- Rotary layers (``no_rope_layers[i]`` = 1; by default every layer but each
  ``no_rope_layer_interval``-th) rotate q and k with channel pairs (2j, 2j+1) ("interleaved",
  transformers' complex view of the head), then scale each head's q and k to unit root mean
  square (``use_qk_norm``: transformers' ``Llama4TextL2Norm``, which divides by the root *mean*
  square, so an RMS norm without weight, eps ``rms_eps``). Their attention is chunked: the
  tokens are cut into chunks of ``attention_chunk_size`` from position 0, and a query sees only
  the keys of its own chunk, causally (query p sees key s when s <= p and s // c == p // c).
- NoPE layers (``no_rope_layers[i]`` = 0) attend causally over every key without rotating, and
  with ``attn_temperature_tuning`` multiply each query at position p by
  1 + attn_scale * log(1 + floor((p + 1) / floor_scale)) (Nakanishi, "Scalable-Softmax Is Superior
  for Attention", 2025): a sharper softmax as the keys grow in number. p counts the tokens (past
  + t), not ``positions``, as transformers does.
- The MoE layers (``moe_layers``; by default layers s - 1, 2s - 1, ... for s =
  ``interleave_moe_layer_step``, every layer for s = 1) route each token to ``experts_per_token``
  of ``n_experts`` SwiGLU experts of width ``hidden`` by the top router logits, scale the token's
  *input* to each chosen expert by the sigmoid of its logit (not the expert's output, as
  DeepSeek-V3 does), and add a shared SwiGLU expert of width ``hidden`` that sees every token. The
  other layers have a SwiGLU network of width ``hidden_mlp`` (transformers' ``intermediate_size_mlp``).

``blocks.i.mlp`` of a MoE layer: {"router": {"w": (C, E)}, "experts": {"gate", "up": {"w": (E, C, H)},
"down": {"w": (E, H, C)}}, "shared": {"gate", "up", "down"}}; of a dense layer Llama's
{"gate", "up", "down"}. transformers keeps each expert's gate and up side by side in one
(E, C, 2H) ``gate_up_proj``, gate first.

Decoding: ``llama4_kv_cache`` keeps a chunked layer's last ``attention_chunk_size`` tokens only
(numpy_attn/kv_cache.py's sliding layers): a query needs at most the c - 1 keys before it in its
chunk. ``pad_token_id`` (transformers' embedding padding_idx): its embedding row gets no gradient.
An ``attn_mask`` (padding) restricts attention further; in a left-padded batch each sequence's
chunks count from its first real token (the keys no query sees at its start), as transformers'.
The rest (the keywords, the embedding, the head, the loop) is llama.py's and numpy_attn/_model.py's.
"""

import math
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import numpy as np

from numpy_attn import _model
from numpy_attn._checks import check_config, check_dout, check_rng, opmath, upcast
from numpy_attn._family import Family
from numpy_attn._tree import tree_map
from numpy_attn.linear import linear_backward, linear_forward
from numpy_attn.llama import SWIGLU_MLP, LlamaConfig, llama_block_backward, llama_block_forward
from numpy_attn.moe import _check_k, experts_backward, experts_forward, top_k
from numpy_attn.rms_norm import rms_norm_backward, rms_norm_forward
from numpy_attn.swiglu import sigmoid, swiglu_backward, swiglu_forward


@dataclass(frozen=True)
class Llama4Config(LlamaConfig):
    """LlamaConfig's fields and checks (``hidden`` is each expert's and the shared expert's width,
    intermediate_size), the rotary pairs adjacent, and Llama 4's own fields (Hugging Face's names
    in the comments); a toy by default."""

    rms_eps: float = 1e-5
    rope_theta: float = 500000.0
    rope_layout: str = "interleaved"   # transformers' complex view: pairs (2j, 2j+1)
    hidden_mlp: int = 48               # the dense layers' SwiGLU width (intermediate_size_mlp)
    n_experts: int = 4                 # E (num_local_experts)
    experts_per_token: int = 1         # k (num_experts_per_tok)
    moe_layers: tuple | None = None    # the MoE layers' indices; None: from interleave_moe_layer_step
    interleave_moe_layer_step: int = 1
    no_rope_layers: tuple | None = None   # per layer 1 (rotary, chunked) or 0 (NoPE); None: by the interval
    no_rope_layer_interval: int = 4    # without no_rope_layers, every interval-th layer is NoPE
    attention_chunk_size: int | None = 8   # c; None: the rotary layers attend causally over every key
    use_qk_norm: bool = True           # the weightless RMS norm of q and k on the rotary layers
    attn_temperature_tuning: bool = True
    floor_scale: int = 8192
    attn_scale: float = 0.1
    pad_token_id: int | None = None    # the embedding row that gets no gradient

    def __post_init__(self):
        super().__post_init__()
        for name, value in check_config(self, {
                "hidden_mlp": (int, 1), "n_experts": (int, 1), "experts_per_token": (int, 1),
                "interleave_moe_layer_step": (int, 1), "no_rope_layer_interval": (int, 1),
                "attention_chunk_size": (int | None, 1), "use_qk_norm": (bool, None),
                "attn_temperature_tuning": (bool, None), "floor_scale": (int, 1), "attn_scale": (float, None),
                "pad_token_id": (int | None, 0)}).items():
            object.__setattr__(self, name, value)
        name = type(self).__name__
        if not math.isfinite(self.attn_scale):
            raise ValueError(f"{name}.attn_scale must be a finite number, got {self.attn_scale!r}")
        _check_k(f"{name}.experts_per_token", self.experts_per_token, 1, self.n_experts,
                 f"n_experts = {self.n_experts}")
        if self.pad_token_id is not None and self.pad_token_id >= self.vocab_size:
            raise ValueError(f"{name}.pad_token_id = {self.pad_token_id} must be below vocab_size = {self.vocab_size}")
        L = self.n_layer
        step = self.interleave_moe_layer_step
        moe = tuple(range(step - 1, L, step)) if self.moe_layers is None else self.moe_layers
        object.__setattr__(self, "moe_layers", _layer_list(f"{name}.moe_layers", moe, L))
        interval = self.no_rope_layer_interval
        rope = tuple(int((i + 1) % interval != 0) for i in range(L)) if self.no_rope_layers is None \
            else self.no_rope_layers
        object.__setattr__(self, "no_rope_layers", _rope_flags(f"{name}.no_rope_layers", rope, L))

    def use_rope(self, i):
        """Whether layer i rotates q and k (and attends in chunks); a NoPE layer does neither."""
        return self.no_rope_layers[i] == 1

    def window(self, i):
        """Layer i's chunk size c on a chunked layer, None on a global one: the key/value cache's
        window (a query needs at most the c - 1 keys before it)."""
        return self.attention_chunk_size if self.use_rope(i) else None

    def is_moe(self, i):
        """Whether block i's network is the mixture of experts."""
        return i in self.moe_layers


def _layer_list(name, layers, n_layer):
    """``layers`` as a sorted tuple of distinct layer indices in [0, n_layer), or raise naming it."""
    if isinstance(layers, str) or not isinstance(layers, tuple | list):
        raise TypeError(f"{name} must be a list of layer indices, got {layers!r}")
    for i in layers:
        if isinstance(i, bool) or not isinstance(i, int | np.integer) or not 0 <= i < n_layer:
            raise ValueError(f"{name} must hold layer indices in [0, {n_layer}) (n_layer = {n_layer}), got {i!r}")
    if len(set(layers)) != len(layers):
        raise ValueError(f"{name} lists a layer twice: {list(layers)}")
    return tuple(sorted(int(i) for i in layers))


def _rope_flags(name, flags, n_layer):
    """``flags`` as a tuple of n_layer entries 0 or 1, or raise naming it."""
    if isinstance(flags, str) or not isinstance(flags, tuple | list) or len(flags) < n_layer:
        raise ValueError(f"{name} must list at least n_layer = {n_layer} entries (1 rotary, 0 NoPE), got {flags!r}")
    for f in flags:
        if isinstance(f, bool | np.bool_) or f not in (0, 1):
            raise ValueError(f"{name}: each entry must be 1 (rotary) or 0 (NoPE), got {f!r}")
    return tuple(int(f) for f in flags[:n_layer])


def init_llama4_params(config, rng, dtype=np.float32):
    """{"wte": (V, C), "blocks": {"0": {"attn_norm", "attn", "mlp_norm", "mlp"}, ...}, "norm",
    ["head"]}: attention Llama's {"q", "k", "v", "o"}, mlp a SwiGLU network of width hidden_mlp or
    the mixture of experts (module docstring); every weight drawn from N(0, 0.02^2) as Hugging
    Face's initializer_range (its experts too), norms at 1, biases at 0."""
    check_rng(rng, "init_llama4_params")
    C, hs, H, E = config.n_embd, config.hs, config.hidden, config.n_experts
    nh, nkv = config.n_head, config.n_kv_head

    normal = _model.normal_init(rng, dtype)                                   # shape -> N(0, 0.02^2) draws

    def linear(C_in, C_out, bias=False):
        return {"w": normal(C_in, C_out), **({"b": np.zeros(C_out, dtype)} if bias else {})}

    def swiglu(C, H):
        return {"gate": linear(C, H), "up": linear(C, H), "down": linear(H, C)}

    def init_block(i):
        b = config.attn_bias
        attn = {"q": linear(C, nh * hs, b), "k": linear(C, nkv * hs, b), "v": linear(C, nkv * hs, b),
                "o": linear(nh * hs, C, b)}
        if config.is_moe(i):
            mlp = {"router": linear(C, E), "experts": {"gate": {"w": normal(E, C, H)}, "up": {"w": normal(E, C, H)},
                                                        "down": {"w": normal(E, H, C)}},
                   "shared": swiglu(C, H)}
        else:
            mlp = swiglu(C, config.hidden_mlp)
        return {"attn_norm": {"w": np.ones(C, dtype)}, "attn": attn, "mlp_norm": {"w": np.ones(C, dtype)}, "mlp": mlp}

    return _model.init_decoder_params(config, rng, dtype, init_block)


# -- attention: chunked and rotary with normed q and k, or global and tempered (NoPE) ------------------

def chunked_causal_mask(T, S, chunk, first=0, left_padding=None):
    """(T, S) bool: key s (at position first + s) for query t (at first + S - T + t, the last T
    of the S, bottom-right), True where the key is not later and lies in the query's chunk of
    ``chunk`` positions counted from 0. ``first`` is where a cache's held keys begin.
    ``left_padding`` (B,): each sequence's chunks count from its first real token instead, as
    transformers counts them in a left-padded batch -> (B, 1, T, S)."""
    q_pos = first + S - T + np.arange(T)[:, None]                             # (T, 1)
    k_pos = first + np.arange(S)[None, :]                                     # (1, S)
    if left_padding is None:
        return (k_pos <= q_pos) & (k_pos // chunk == q_pos // chunk)          # (T, S)
    pad = np.asarray(left_padding)[:, None, None, None]                       # (B, 1, 1, 1)
    return (k_pos <= q_pos) & ((k_pos - pad) // chunk == (q_pos - pad) // chunk)   # (B, 1, T, S)


def leading_padding(attn_mask):
    """(B,) how many keys at the start of each sequence no query sees (its left padding, as
    transformers counts it from a padding mask), from a mask (..., T, S); None without a mask."""
    if attn_mask is None:
        return None
    mask = attn_mask.reshape((1,) * (4 - attn_mask.ndim) + attn_mask.shape)   # (B, nh, T, S)
    seen = mask.any(axis=(1, 2))                                              # (B, S): some query sees key s
    return np.where(seen.any(axis=-1), seen.argmax(axis=-1), seen.shape[-1])  # (B,)


def attention_temperature(past, T, floor_scale, attn_scale):
    """(T, 1) float64: 1 + attn_scale * log(1 + floor((p + 1) / floor_scale)) for the T tokens at
    p = past .. past + T - 1, one number per query."""
    p = np.arange(past, past + T, dtype=np.float64)
    return (np.log1p(np.floor((p + 1) / floor_scale)) * attn_scale + 1)[:, None]   # (T, 1)


class QKUnitRmsCache(NamedTuple):
    """The two norms' caches (rms_norm_forward's), as qk_norm.py's QKNormCache names them."""

    q: tuple
    k: tuple


def qk_unit_rms_forward(q, k, eps):
    """Each head's q (B, nh, T, hs) and k (B, nkv, T, hs) scaled to unit root mean square (RMS norm
    with weight 1, transformers' Llama4TextL2Norm) -> (q, k, cache)."""
    ones = np.ones(q.shape[-1], q.dtype)                                      # (hs,) the absent weight
    q, q_cache = rms_norm_forward(q, ones, eps)                               # (B, nh, T, hs)
    k, k_cache = rms_norm_forward(k, ones, eps)                               # (B, nkv, T, hs)
    return q, k, QKUnitRmsCache(q_cache, k_cache)


def qk_unit_rms_backward(dq, dk, cache):
    """Undoes the two norms -> (dq, dk); their weight is a constant, its gradient dropped."""
    q_cache, k_cache = cache
    return rms_norm_backward(dq, q_cache)[0], rms_norm_backward(dk, k_cache)[0]


class Llama4AttentionCache(NamedTuple):
    """The steps' caches in forward order; a step the layer does not take holds None."""

    qkv: tuple
    rope: tuple | None         # rotary layers
    qk_norm: tuple | None      # rotary layers with use_qk_norm
    temperature: np.ndarray | None   # (T, 1) NoPE layers with attn_temperature_tuning, in q's opmath dtype
    attend: tuple              # _model.AttendCache


def llama4_attention_forward(x, params, config, positions, *, attn_mask=None, kv_cache=None, rope=True, chunk=None):
    """Llama 4's attention: x (B, T, C) -> (B, T, C). With ``rope`` (a rotary layer) q and k are
    rotated, then normed (use_qk_norm); without (NoPE) q is multiplied by the temperature
    (attn_temperature_tuning). ``chunk`` c restricts each query to the keys of its chunk. Returns
    ``(out, cache)``."""
    T = x.shape[1]
    q, k, v, qkv_cache = _model.heads_forward(x, params, config.n_head, config.n_kv_head)   # (B, nh | nkv, T, hs)
    rope_cache = qk_norm_cache = temperature = None
    if rope:
        q, k, rope_cache = _model.rotate_forward(q, k, positions, config.rope_theta,
                                                 config.rope_scaling, config.rope_layout)
        if config.use_qk_norm:   # after the rotation, as transformers (a rotation keeps the root mean square)
            q, k, qk_norm_cache = qk_unit_rms_forward(q, k, config.rms_eps)
    elif config.attn_temperature_tuning:
        past = 0 if kv_cache is None else kv_cache.length
        temperature = attention_temperature(past, T, config.floor_scale, config.attn_scale)
        temperature = temperature.astype(opmath(q.dtype))                     # (T, 1) float32 for the low dtypes
        q = (upcast(q) * temperature).astype(q.dtype, copy=False)             # (B, nh, T, hs), rounded once
    if chunk is not None:   # only the keys of each query's chunk; a cache holds the last c tokens from `start`
        first, held = (0, 0) if kv_cache is None else (kv_cache.start, kv_cache.held)
        pad = leading_padding(attn_mask)                                      # (B,) or None
        local = chunked_causal_mask(T, held + T, chunk, first, pad)           # (T, S) or (B, 1, T, S)
        attn_mask = local if attn_mask is None else attn_mask & local
    out, attend_cache = _model.attend_forward(q, k, v, params["o"], kv_cache, attn_mask)   # (B, T, C)
    return out, Llama4AttentionCache(qkv_cache, rope_cache, qk_norm_cache, temperature, attend_cache)


def llama4_attention_backward(dout, cache):
    """Gradients: dout (B, T, C) -> (dx (B, T, C), {"q", "k", "v", "o"} like the params)."""
    dq, dk, dv, do = _model.attend_backward(dout, cache.attend)               # (B, nh, T, hs), (B, nkv, T, hs)
    if cache.temperature is not None:   # undoes q = q * temperature (a constant per query)
        dq = (upcast(dq) * cache.temperature).astype(dq.dtype, copy=False)
    if cache.qk_norm is not None:       # undoes the norms of the rotated q and k
        dq, dk = qk_unit_rms_backward(dq, dk, cache.qk_norm)
    if cache.rope is not None:          # undoes the rotation
        dq, dk = _model.rotate_backward(dq, dk, cache.rope)                   # (B, nh, T, hs), (B, nkv, T, hs)
    dx, dqkv = _model.heads_backward(dq, dk, dv, cache.qkv)                   # (B, T, C)
    return dx, {**dqkv, "o": do}


LLAMA4_ATTENTION = _model.Sublayer(llama4_attention_forward, llama4_attention_backward)


# -- the mixture of experts: sigmoid-scaled inputs to the top-k experts, and a shared expert ------------

class Llama4RouterCache(NamedTuple):
    linear: tuple          # the router's linear cache
    indices: np.ndarray    # (N, k) the chosen experts
    scores: np.ndarray     # (N, k) sigmoid of their logits
    E: int


def llama4_router_forward(x, router, k):
    """Top-k of the router's logits, each chosen logit through a sigmoid: x (N, C), router
    {"w": (C, E)} -> (scores (N, k), indices (N, k), cache)."""
    logits, linear_cache = linear_forward(x, **router)                        # (N, C) -> (N, E)
    indices = top_k(logits, k)                                                # (N, k)
    scores = sigmoid(np.take_along_axis(logits, indices, axis=-1))            # (N, k)
    return scores, indices, Llama4RouterCache(linear_cache, indices, scores, logits.shape[-1])


def llama4_router_backward(dscores, cache):
    """Gradients: dscores (N, k) -> (dx (N, C), {"w"}); the choice itself has none."""
    # Undoes scores = sigmoid(chosen).
    dchosen = dscores * cache.scores * (1 - cache.scores)                     # (N, k)
    # Undoes chosen = logits[indices]: the logits left out get no gradient.
    dlogits = np.zeros(dchosen.shape[:-1] + (cache.E,), dchosen.dtype)       # (N, E)
    np.put_along_axis(dlogits, cache.indices, dchosen, axis=-1)              # k distinct experts per row
    return linear_backward(dlogits, cache.linear)                             # (N, E) -> (N, C)


class Llama4MoECache(NamedTuple):
    x_shape: tuple
    tokens: np.ndarray     # (N, C) the inputs, for the scores' gradient
    router: Llama4RouterCache
    experts: tuple         # moe.py's ExpertsCache over the N * k scaled inputs
    shared: tuple          # the shared expert's SwiGLU cache
    x_dtype: np.dtype


def llama4_moe_forward(x, params, k):
    """Llama 4's mixture of experts on x (..., C), k experts per token -> (..., C). Each token
    goes to its k experts scaled by their scores (N * k rows, one chosen expert each, weight 1 in
    moe.py's experts_forward); their outputs and the shared expert's add. Returns ``(out, cache)``."""
    x_dtype = x.dtype
    x, params = upcast(x), tree_map(upcast, params)                           # float32 for float16 and bfloat16
    C = x.shape[-1]
    tokens = x.reshape(-1, C)                                                 # (..., C) -> (N, C)
    N = tokens.shape[0]
    scores, indices, router_cache = llama4_router_forward(tokens, params["router"], k)   # (N, k)
    routed_in = (tokens[:, None, :] * scores[..., None]).reshape(N * k, C)    # (N, k, C) -> (N k, C)
    ones = np.ones((N * k, 1), x.dtype)                                       # the inputs carry the scores
    routed, experts_cache = experts_forward(routed_in, ones, indices.reshape(N * k, 1), params["experts"],
                                            swiglu_forward)                   # (N k, C)
    shared, shared_cache = swiglu_forward(tokens, params["shared"])           # (N, C)
    out = (shared + routed.reshape(N, k, C).sum(axis=1)).reshape(x.shape)     # (N, C) -> (..., C)
    cache = Llama4MoECache(x.shape, tokens, router_cache, experts_cache, shared_cache, x_dtype)
    return out.astype(x_dtype, copy=False), cache                             # rounded once to x's dtype


def llama4_moe_backward(dout, cache):
    """Gradients: dout (..., C) -> (dx (..., C), {"router", "experts", "shared"} like the params)."""
    x_shape, tokens, router_cache, experts_cache, shared_cache, x_dtype = cache
    check_dout("llama4_moe", dout, x_shape, x_dtype)
    N, C = tokens.shape
    k = router_cache.indices.shape[-1]
    dout = upcast(dout).reshape(N, C)                                         # (..., C) -> (N, C)
    # Undoes out = shared + sum over the k slots of routed.
    dx, dshared = swiglu_backward(dout, shared_cache)                         # (N, C)
    drouted = np.repeat(dout, k, axis=0)                                      # (N, C) -> (N k, C), each slot
    drouted_in, _, dexperts = experts_backward(drouted, experts_cache, swiglu_backward)   # (N k, C); weights fixed at 1
    # Undoes routed_in = tokens * scores: the gradient reaches the tokens directly and through the scores.
    drouted_in = drouted_in.reshape(N, k, C)                                  # (N k, C) -> (N, k, C)
    dx = dx + (drouted_in * router_cache.scores[..., None]).sum(axis=1)       # (N, C)
    dscores = (drouted_in * tokens[:, None, :]).sum(axis=-1)                  # (N, k)
    dx_router, drouter = llama4_router_backward(dscores, router_cache)        # (N, C)
    dx = (dx + dx_router).reshape(x_shape)                                    # (N, C) -> (..., C)
    grads = {"router": drouter, "experts": dexperts, "shared": dshared}
    return dx.astype(x_dtype, copy=False), tree_map(lambda g: g.astype(x_dtype, copy=False), grads)


def llama4_moe_mlp_forward(h, params, config):
    """The mixture of experts with the config's k: h (B, T, C) -> (B, T, C)."""
    return llama4_moe_forward(h, params, config.experts_per_token)


LLAMA4_MOE = _model.Sublayer(llama4_moe_mlp_forward, llama4_moe_backward)


# -- the model: Llama's blocks with Llama 4's attention and networks ---------------------------------

llama4_kv_cache = _model.sliding_kv_cache   # a global layer holds every token, a chunked layer its last chunk


def llama4_block_forward(x, params, config, positions, *, attn_mask=None, kv_cache=None, moe=False, rope=True,
                         chunk=None):
    """One block: x (B, T, C) -> (B, T, C), Llama's with Llama 4's attention (``rope``, ``chunk``)
    and, where ``moe``, the mixture of experts. Returns ``(out, cache)``; llama_block_backward undoes it."""
    return llama_block_forward(x, params, config, positions, attn_mask=attn_mask, kv_cache=kv_cache,
                               attention=LLAMA4_ATTENTION, mlp=LLAMA4_MOE if moe else SWIGLU_MLP,
                               rope=rope, chunk=chunk)


def llama4_forward(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
                   logits_to_keep=None, for_backward=True):
    """Logits for integer ``ids`` (B, T) -> (B, T, V), as llama_forward (same keywords) with Llama 4's
    blocks; ``kv_cache`` from llama4_kv_cache (its chunked layers hold their last chunk only).
    Returns ``(logits, cache)``."""
    _model.check_mask_with_windows("llama4", attn_mask, kv_cache)
    return _model.decoder_forward(ids, params, config, Llama4Config, llama4_block_forward, positions=positions,
                                  attn_mask=attn_mask, kv_cache=kv_cache, rng=rng, logits_to_keep=logits_to_keep,
                                  for_backward=for_backward, layer_options=partial(_layer_options, config),
                                  padding_idx=getattr(config, "pad_token_id", None))   # another class: refused there


def _layer_options(config, i):
    """Block i's keywords: its network, whether it rotates, its chunk."""
    return {"moe": config.is_moe(i), "rope": config.use_rope(i), "chunk": config.window(i)}


llama4_backward = _model.decoder_backward_of("llama4", llama_block_backward)


FAMILY = Family(name="llama4", title="Llama 4", architectures=("Llama4ForCausalLM",), config=Llama4Config,
                forward=llama4_forward, backward=llama4_backward, kv_cache=llama4_kv_cache,
                init_params=init_llama4_params)
