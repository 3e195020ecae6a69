"""Gemma 4 (text): Gemma 3's model (numpy_attn/gemma3.py) with norms that scale by w, values
RMS-normed too, scores unscaled, wider heads and a partial rotation on the global layers, a
learned scalar per layer, and the last layers reading the keys and values of an earlier one.

    x      = wte[ids] * sqrt(C)                   the pad row gets no gradient from the embedding
    a      = attn(rms_norm(x))                    q, k = rms_norm(q), rms_norm(k) per head, scaling by w;
                                                  v = rms_norm(v) per head, no weight; scores q.k, unscaled
    x      = x + rms_norm(a)
    x      = x + rms_norm(geglu(rms_norm(x)))
    x      = x + rms_norm((gelu(x @ g) * e_i) @ p)   with per-layer inputs only: e_i layer i's (below)
    x      = x * s                                s: the layer's scalar
    logits = x @ wte^T                            (capped at final_logit_softcap, None by default)

Per-layer inputs (``per_layer_input_size`` P > 0, Hugging Face's hidden_size_per_layer_input: the
small released models E2B and E4B): every token gets, besides its embedding x0 = wte[ids] * sqrt(C),
an input of size P for each layer i,

    e      = (rms_norm(x0 @ m / sqrt(C)) + wte_pl[ids] * sqrt(P)) / sqrt(2)     (B, T, L, P): the L P
                                                  columns read as L groups of P, normed per group

which the block adds after its MLP through a P-wide gate (the sublayer above, g (C, P), p (P, C)).
wte_pl is an embedding of its own, (per_layer_vocab_size, L P), its pad row frozen as wte's. x0
reaches the logits through the blocks and through e, so wte's gradient adds both; each block
leaves its de_i with the forward's PerLayerInputs, and the model undoes e once, after the blocks.

What differs from Gemma 3, transformers' Gemma4TextModel read against Gemma3TextModel:

- every RMS norm (the block's four, q's, k's, the final one) scales by w, not 1 + w: the weights
  start at 1 (rms_norm.py's offset 0);
- the values are RMS-normed per head as the keys are, with no weight (Hugging Face's v_norm);
- the scores are not scaled (scaling 1.0): the QK-norms set their size, query_pre_attn_scalar is gone;
- a global layer's heads have their own size, ``global_head_dim`` (512 against 256 in the released
  models): its q, k, v, o and q/k-norm weights are that much wider;
- RoPE per layer type: a sliding layer rotates every channel pair with base rope_local_theta; a
  global one, base rope_theta, rotates only the first ``partial_rotary_factor`` of its pairs
  (Hugging Face's "proportional" RoPE): pair j (channels j and j + hs/2) turns by p * theta^(-2j/hs)
  for j < partial_rotary_factor * hs / 2 and stays put past it. That is the default RoPE of a head
  of those 2r channels with base theta^(2r/hs), which is how ``gemma4_rotate_forward`` runs it;
- shared keys and values (``n_kv_shared_layers``, Hugging Face's num_kv_shared_layers): the last
  that many layers have no k, v projections or k-norm; each attends over the keys and values of
  the last non-shared layer of its own type (sliding or global), its ``kv_source``. That layer's
  k and v then feed two or more attentions, so the backward adds the shared layers' dk and dv into
  the ones of the layer that made them (the shared layers are undone first, being later);
- each block ends multiplying by its ``layer_scalar`` (a (1,) weight; a buffer at 1 in
  transformers' modules that checkpoints set, a parameter here, with its gradient);
- the embedding's ``pad_token_id`` row gets no gradient from the embedding (nn.Embedding's
  padding_idx), its gradient from the tied head still reaching it;
- the last layer must be a global one (transformers forces it with a warning; refused here).

Decoding: ``gemma4_kv_cache`` holds the keys and values of the layers that make them, once; a
shared layer holds none and attends over what its source returned this step, the held tokens and
the new ones (a sliding source's last window, as transformers' shared layers read it). With two
shared layers of six (Gemma 3's sizes otherwise), two global layers' keys are held a token instead
of three. A global_head_dim of its own (512 against 256 in the released models), or global_n_kv_head,
puts the layers of each head size and count in a KVCache of their own (one allocation holds one):
those of layer 0's in the Gemma4Cache itself, the others in its ``wide``.

Keys as values (``attention_k_eq_v``): a global layer has no v
projection; its values are its keys as projected, before the k-norm and the rotation, RMS-normed
without weight as values are, so k's projection gets the gradients of both uses. With it the global
layers may have a key/value head count of their own (``global_n_kv_head``, Hugging Face's
num_global_key_value_heads, which transformers reads only then), which the cache's ``wide`` holds.

A double-wide MLP (``double_wide_mlp``, Hugging Face's use_double_wide_mlp): the GeGLU of the
shared layers (those reading another layer's keys) is 2 H wide, the others' H.

A mixture of experts beside the MLP (``enable_moe``, Hugging Face's enable_moe_block): the block's
dense GeGLU output f and the experts' output on the same x add before the MLP's post-norm, each
normed by a norm of its own (dense_post_norm, post_norm; norm before the experts):

    f      = rms_norm(f) + rms_norm(experts(rms_norm(x)))
    router: p = softmax(rms_norm(x) * scale / sqrt(C) @ w)           over all E experts, no weight in the norm
            the k largest p, divided by their sum, each times its expert's expert_scale
    expert: (gelu_tanh(x @ gate) * (x @ up)) @ down                  moe_hidden wide

numpy_attn/moe.py's loop over the experts runs them; the choice has no gradient, the weights do.

Off here, refused by attn_cli's reader (transformers has a switch, and the test keeps it off):
bidirectional attention. Attention has no soft cap; the logits' cap stays optional as in Gemma 3.
"""

from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import numpy as np

from numpy_attn import _model
from numpy_attn._checks import POSITIVE, check_config, check_rng
from numpy_attn._family import Family
from numpy_attn.embedding import embedding_backward, embedding_forward
from numpy_attn.gelu import gelu_backward, gelu_forward
from numpy_attn.kv_cache import KVCache, init_kv_cache, kv_cache_update
from numpy_attn.linear import linear_backward, linear_forward
from numpy_attn.llama import LlamaConfig
from numpy_attn.moe import experts_backward, experts_forward, top_k
from numpy_attn.multi_head import merge_heads, split_heads
from numpy_attn.rms_norm import rms_norm_backward, rms_norm_forward
from numpy_attn.rope import rope_backward, rope_forward
from numpy_attn.softmax import softmax_backward, softmax_forward
from numpy_attn.swiglu import swiglu_backward, swiglu_forward


@dataclass(frozen=True)
class Gemma4Config(LlamaConfig):
    """LlamaConfig's sizes and checks (head_dim the sliding layers' hs) and Gemma 4's own fields."""

    tie_weights: bool = True
    rope_theta: float = 1000000.0             # the global layers' base
    rope_local_theta: float = 10000.0         # the sliding layers' base
    partial_rotary_factor: float = 0.25       # share of a global layer's channel pairs that rotate
    global_head_dim: int | None = None        # a global layer's hs; None: head_dim's
    final_logit_softcap: float | None = None  # c on the logits; None: no cap
    sliding_window: int = 4                   # w of the sliding layers: query i sees keys i - w < j <= i
    layer_types: tuple | None = None          # per layer; None: five sliding, one global, the last global
    n_kv_shared_layers: int = 0               # the last layers that reuse an earlier layer's k and v
    pad_token_id: int | None = None           # the embedding row that gets no gradient
    per_layer_input_size: int = 0             # P of each layer's own input per token; 0: none
    per_layer_vocab_size: int | None = None   # rows of their embedding; None: vocab_size
    attention_k_eq_v: bool = False            # a global layer's values are its keys before their norm
    global_n_kv_head: int | None = None       # a global layer's key/value heads; None: n_kv_head's
    double_wide_mlp: bool = False             # the shared layers' MLP of width 2 * hidden
    enable_moe: bool = False                  # a mixture of experts beside each block's MLP
    n_experts: int | None = None              # E, with enable_moe
    experts_per_token: int | None = None      # k of them per token
    moe_hidden: int | None = None             # each expert's GeGLU width
    sliding_pattern = 6

    def __post_init__(self):
        super().__post_init__()
        cls = type(self).__name__
        for name, value in check_config(self, {
                "rope_local_theta": (float, POSITIVE), "partial_rotary_factor": (float, 0.0),
                "global_head_dim": (int | None, 1), "final_logit_softcap": (float | None, POSITIVE),
                "sliding_window": (int, 1), "n_kv_shared_layers": (int, 0),
                "pad_token_id": (int | None, 0), "per_layer_input_size": (int, 0),
                "per_layer_vocab_size": (int | None, 1), "attention_k_eq_v": (bool, None),
                "global_n_kv_head": (int | None, 1), "double_wide_mlp": (bool, None), "enable_moe": (bool, None),
                "n_experts": (int | None, 1), "experts_per_token": (int | None, 1),
                "moe_hidden": (int | None, 1)}).items():
            object.__setattr__(self, name, value)
        if self.partial_rotary_factor > 1:
            raise ValueError(f"{cls}.partial_rotary_factor must be in [0, 1], got {self.partial_rotary_factor!r}")
        if self.rope_scaling is not None:
            raise ValueError(f"{cls}.rope_scaling must be None (Gemma 4's rotations are unscaled), "
                             f"got {self.rope_scaling!r}")
        if self.global_hs % 2:
            raise ValueError(f"{cls}.global_head_dim must be even (RoPE turns pairs), got {self.global_hs}")
        if self.pad_token_id is not None and self.pad_token_id >= self.vocab_size:
            raise ValueError(f"{cls}.pad_token_id = {self.pad_token_id} must be below vocab_size = {self.vocab_size}")
        if self.n_head % self.global_nkv:
            raise ValueError(f"{cls}.n_head = {self.n_head} must be a multiple of global_n_kv_head = "
                             f"{self.global_n_kv_head} (each key/value head serves a group of queries)")
        if self.enable_moe and None in (self.n_experts, self.experts_per_token, self.moe_hidden):
            raise ValueError(f"{cls}.enable_moe needs n_experts, experts_per_token and moe_hidden, got "
                             f"{self.n_experts!r}, {self.experts_per_token!r}, {self.moe_hidden!r}")
        if self.enable_moe and self.experts_per_token > self.n_experts:
            raise ValueError(f"{cls}.experts_per_token = {self.experts_per_token} must be at most n_experts = "
                             f"{self.n_experts}")
        if self.per_layer_vocab_size is None:
            object.__setattr__(self, "per_layer_vocab_size", self.vocab_size)
        if self.per_layer_vocab_size < self.vocab_size:
            raise ValueError(f"{cls}.per_layer_vocab_size = {self.per_layer_vocab_size} must be at least vocab_size = "
                             f"{self.vocab_size} (every id reads a row of the per-layer embedding)")
        if self.n_kv_shared_layers >= self.n_layer:
            raise ValueError(f"{cls}.n_kv_shared_layers must be below n_layer = {self.n_layer} (a shared layer "
                             f"reads an earlier layer's keys), got {self.n_kv_shared_layers}")
        types = self.layer_types
        if types is None:
            types = _model.layer_types(self, self.sliding_pattern)[:-1] + ("full_attention",)
        object.__setattr__(self, "layer_types", types)
        object.__setattr__(self, "layer_types", _model.layer_types(self, self.sliding_pattern))
        if self.layer_types[-1] != "full_attention":
            raise ValueError(f"{cls}.layer_types must end with 'full_attention' (Gemma 4's last layer is global), "
                             f"got {self.layer_types!r}")
        for i in range(self.n_layer):
            self.kv_source(i)   # raises for a shared layer with no layer of its type before the shared ones

    @property
    def global_hs(self):
        """A global layer's head size: global_head_dim, or hs."""
        return self.hs if self.global_head_dim is None else self.global_head_dim

    @property
    def global_nkv(self):
        """A global layer's key/value heads: global_n_kv_head, or n_kv_head."""
        return self.n_kv_head if self.global_n_kv_head is None else self.global_n_kv_head

    def layer_nkv(self, i):
        """Layer i's key/value heads: n_kv_head on a sliding layer, global_nkv on a global one."""
        return self.n_kv_head if self.layer_types[i] == "sliding_attention" else self.global_nkv

    def k_eq_v(self, i):
        """Whether layer i's values are its keys (attention_k_eq_v, on a global layer)."""
        return self.attention_k_eq_v and self.layer_types[i] == "full_attention"

    def layer_hidden(self, i):
        """Layer i's MLP width: hidden, twice that on a shared layer with double_wide_mlp."""
        return 2 * self.hidden if self.double_wide_mlp and self.kv_source(i) != i else self.hidden

    def window(self, i):
        """Layer i's window: sliding_window for a sliding layer, None for a global one."""
        return self.sliding_window if self.layer_types[i] == "sliding_attention" else None

    def layer_hs(self, i):
        """Layer i's head size: hs on a sliding layer, global_hs on a global one."""
        return self.hs if self.layer_types[i] == "sliding_attention" else self.global_hs

    def kv_source(self, i):
        """The layer whose keys and values layer i attends over: i itself, or for one of the last
        n_kv_shared_layers, the last non-shared layer of its type."""
        first_shared = self.n_layer - self.n_kv_shared_layers
        if i < first_shared:
            return i
        for j in reversed(range(first_shared)):
            if self.layer_types[j] == self.layer_types[i]:
                return j
        raise ValueError(f"{type(self).__name__}: shared layer {i} is {self.layer_types[i]!r}, and no layer before "
                         f"the n_kv_shared_layers = {self.n_kv_shared_layers} shared ones is (layer_types "
                         f"{self.layer_types!r})")


def init_gemma4_params(config, rng, dtype=np.float32):
    """{"wte", "blocks", "norm"}: each block's four norms, attention {"q", "o", "q_norm"} and, on a
    layer that makes its own keys, {"k", "v", "k_norm"} (no "v" where its values are its keys),
    GeGLU "mlp" (config.layer_hidden(i) wide), with enable_moe "moe" {"router" {"w" (C, E), "scale"
    (C,), "expert_scale" (E,)}, "experts" {"gate", "up" (E, C, h), "down" (E, h, C)}, "dense_post_norm",
    "norm", "post_norm"}, and "layer_scalar" {"w": (1,)}; with per-layer
    inputs each block's "per_layer" {"gate" (C, P), "proj" (P, C), "norm" (C,)} and the model's
    "per_layer" {"wte" (per_layer_vocab_size, L*P), "proj" (C, L*P), "norm" (P,)}, drawn after
    the rest. Linear
    weights and embeddings from N(0, 0.02^2), every norm and the scalar at 1 (they scale by w)."""
    check_rng(rng, "init_gemma4_params")
    C, nh = config.n_embd, config.n_head

    def linear(C_in, C_out):
        return {"w": rng.normal(0, 0.02, (C_in, C_out)).astype(dtype)}

    def init_block(i):
        hs, nkv = config.layer_hs(i), config.layer_nkv(i)
        attn = {"q": linear(C, nh * hs)}
        if config.kv_source(i) == i:
            attn["k"] = linear(C, nkv * hs)
            if not config.k_eq_v(i):
                attn["v"] = linear(C, nkv * hs)
        attn["o"] = linear(nh * hs, C)
        attn["q_norm"] = {"w": np.ones(hs, dtype)}                                      # (hs,)
        if config.kv_source(i) == i:
            attn["k_norm"] = {"w": np.ones(hs, dtype)}                                  # (hs,)
        H = config.layer_hidden(i)
        mlp = {"gate": linear(C, H), "up": linear(C, H), "down": linear(H, C)}
        norms = {name: {"w": np.ones(C, dtype)} for name in
                 ("attn_norm", "attn_post_norm", "mlp_norm", "mlp_post_norm")}
        block = {**norms, "attn": attn, "mlp": mlp}
        if config.enable_moe:
            E, h = config.n_experts, config.moe_hidden
            block["moe"] = {"router": {"w": rng.normal(0, 0.02, (C, E)).astype(dtype), "scale": np.ones(C, dtype),
                                       "expert_scale": np.ones(E, dtype)},
                            "experts": {"gate": {"w": rng.normal(0, 0.02, (E, C, h)).astype(dtype)},
                                        "up": {"w": rng.normal(0, 0.02, (E, C, h)).astype(dtype)},
                                        "down": {"w": rng.normal(0, 0.02, (E, h, C)).astype(dtype)}},
                            **{name: {"w": np.ones(C, dtype)} for name in ("dense_post_norm", "norm", "post_norm")}}
        return {**block, "layer_scalar": {"w": np.ones(1, dtype)}}

    params = _model.init_decoder_params(config, rng, dtype, init_block)
    P, L = config.per_layer_input_size, config.n_layer
    if P:   # drawn last, so that a model without them draws what it drew before they existed
        for i in range(L):
            params["blocks"][str(i)]["per_layer"] = {"gate": linear(C, P), "proj": linear(P, C),
                                                     "norm": {"w": np.ones(C, dtype)}}
        params["per_layer"] = {"wte": rng.normal(0, 0.02, (config.per_layer_vocab_size, L * P)).astype(dtype),
                               "proj": linear(C, L * P), "norm": {"w": np.ones(P, dtype)}}
    return params


# -- RoPE per layer type ----------------------------------------------------------------------------

def gemma4_rotate_forward(x, positions, config, window):
    """Rotate x (B, n, T, hs): a sliding layer (``window`` not None) every pair with rope_local_theta,
    a global one its first r = int(partial_rotary_factor * hs / 2) pairs (channels j and j + hs/2)
    at theta^(-2j/hs), the default RoPE of those 2r channels with base theta^(2r/hs). Returns
    ``(out, cache)``."""
    hs = x.shape[-1]
    pos = positions if positions.ndim == 1 else positions[:, None, :]         # (B, T) -> (B, 1, T): all heads
    if window is not None:
        out, cache = rope_forward(x, pos, config.rope_local_theta, "half")    # (B, n, T, hs)
        return out, (cache, None)
    r = int(config.partial_rotary_factor * hs // 2)
    pairs = np.r_[0:r, hs // 2:hs // 2 + r]                                   # the 2r channels that turn
    rotated, cache = rope_forward(x[..., pairs], pos, config.rope_theta ** (2 * r / hs), "half")
    out = x.copy()
    out[..., pairs] = rotated                                                 # (B, n, T, hs)
    return out, (cache, pairs)


def gemma4_rotate_backward(dout, cache):
    """Undoes gemma4_rotate_forward: dout (B, n, T, hs) -> dx; the channels left alone pass theirs."""
    rope_cache, pairs = cache
    if pairs is None:
        return rope_backward(dout, rope_cache)
    dx = dout.copy()
    dx[..., pairs] = rope_backward(dout[..., pairs], rope_cache)
    return dx


# -- attention: QK- and V-norm, scores unscaled, keys and values maybe another layer's -------------

class SharedKV(NamedTuple):
    """One forward's keys and values per producing layer, and the gradients the shared layers send back."""

    kv: dict                 # {layer: (k, v)}, each (B, nkv, S, hs)
    grads: dict              # {layer: (dk, dv)}: the sum of the shared layers' dk, dv, until undone


class Gemma4AttentionCache(NamedTuple):
    """The steps' caches in forward order (None for the steps a shared layer skips)."""

    q: tuple
    k: tuple | None
    v: tuple | None
    q_norm: tuple
    k_norm: tuple | None
    v_norm: tuple | None
    q_rope: tuple
    k_rope: tuple | None
    attn: tuple
    o: tuple
    num_heads: int
    layer: int               # this layer
    source: int              # the layer whose keys and values it read (itself unless shared)
    shared: SharedKV


def gemma4_attention_forward(x, params, config, positions, *, attn_mask=None, kv_cache=None, window=None,
                             layer=0, shared=None):
    """x (B, T, C) -> (B, T, C): q RMS-normed per head (w) and rotated; k, v made here (k normed
    and rotated, v normed without weight; v the projected k where the layer's values are its keys)
    and kept in ``shared`` for the layers that reuse them, or on a shared layer read from
    ``shared``; attention with scale 1. Returns ``(out, cache)``."""
    nh, nkv, eps = config.n_head, config.layer_nkv(layer), config.rms_eps
    source = config.kv_source(layer)
    q, q_cache = linear_forward(x, **params["q"])                             # (B, T, C) -> (B, T, nh*hs)
    q = split_heads(q, nh)                                                    # (B, nh, T, hs)
    q, q_norm_cache = rms_norm_forward(q, params["q_norm"]["w"], eps)         # each head alone, scaled by w
    q, q_rope_cache = gemma4_rotate_forward(q, positions, config, window)
    k_cache = v_cache = k_norm_cache = v_norm_cache = k_rope_cache = None
    if source == layer:
        k, k_cache = linear_forward(x, **params["k"])                         # (B, T, C) -> (B, T, nkv*hs)
        if config.k_eq_v(layer):   # the values are the keys as projected (v_cache None: no v weight)
            v = k
        else:
            v, v_cache = linear_forward(x, **params["v"])                     # (B, T, C) -> (B, T, nkv*hs)
        k, v = split_heads(k, nkv), split_heads(v, nkv)                       # (B, nkv, T, hs)
        k, k_norm_cache = rms_norm_forward(k, params["k_norm"]["w"], eps)
        v, v_norm_cache = rms_norm_forward(v, np.ones(v.shape[-1], v.dtype), eps)   # no weight: scale 1
        k, k_rope_cache = gemma4_rotate_forward(k, positions, config, window)
        if kv_cache is not None:   # decoding: the held tokens' keys and values, then the new ones
            k, v = kv_cache_update(kv_cache, k, v)                            # (B, nkv, S, hs)
        shared.kv[layer] = (k, v)
    else:   # made by an earlier layer, the cached ones included: this layer holds none
        k, v = shared.kv[source]                                              # (B, nkv, S, hs)
    # The T queries are the last of the S keys (causal and window masks aligned bottom-right).
    y, attn_cache = _model.cached_attention_forward(q, k, v, None, attn_mask, window=window,
                                                    scale=1.0)                # (B, nh, T, hs)
    # Keys read from a cache get no gradient: the backward refuses such a forward (inference only).
    attn_cache = attn_cache._replace(past=k.shape[2] - q.shape[2])
    out, o_cache = linear_forward(merge_heads(y), **params["o"])              # (B, nh, T, hs) -> (B, T, C)
    return out, Gemma4AttentionCache(q_cache, k_cache, v_cache, q_norm_cache, k_norm_cache, v_norm_cache,
                                     q_rope_cache, k_rope_cache, attn_cache, o_cache, nh, layer, source, shared)


def gemma4_attention_backward(dout, cache):
    """Gradients: dout (B, T, C) -> (dx (B, T, C), dparams). A shared layer leaves its dk, dv in
    the forward's SharedKV; the layer that made those keys adds them to its own."""
    dy, do = linear_backward(dout, cache.o)                                   # (B, T, nh*hs)
    dq, dk, dv = _model.cached_attention_backward(split_heads(dy, cache.num_heads), cache.attn)
    if cache.source != cache.layer:   # k and v were another layer's: their gradients go back to it
        old = cache.shared.grads.get(cache.source)
        cache.shared.grads[cache.source] = (dk, dv) if old is None else (old[0] + dk, old[1] + dv)
    dq = gemma4_rotate_backward(dq, cache.q_rope)
    dq, dq_norm = rms_norm_backward(dq, cache.q_norm)
    dx, dq_params = linear_backward(merge_heads(dq), cache.q)                 # (B, T, C)
    dparams = {"q": dq_params, "o": do, "q_norm": dq_norm}
    if cache.source == cache.layer:
        later = cache.shared.grads.pop(cache.layer, None)
        if later is not None:   # k and v also fed the shared layers: the uses add
            dk, dv = dk + later[0], dv + later[1]
        dk = gemma4_rotate_backward(dk, cache.k_rope)
        dk, dk_norm = rms_norm_backward(dk, cache.k_norm)
        dv, _ = rms_norm_backward(dv, cache.v_norm)                           # its weight is no parameter
        if cache.v is None:   # the values were the projected keys: both uses' gradients add
            dk, dv = dk + dv, None
        dx_k, dparams["k"] = linear_backward(merge_heads(dk), cache.k)
        dx = dx + dx_k                                                        # x fed q and k
        if dv is not None:
            dx_v, dparams["v"] = linear_backward(merge_heads(dv), cache.v)
            dx = dx + dx_v                                                    # and v
        dparams["k_norm"] = dk_norm
    return dx, dparams


# -- per-layer inputs: each token's own input to every layer ---------------------------------------

class PerLayerInputs(NamedTuple):
    """One forward's per-layer inputs, their cache, and the gradients the blocks send back."""

    value: np.ndarray        # (B, T, L, P): layer i reads value[:, :, i]
    cache: tuple             # gemma4_per_layer_inputs_forward's
    grads: dict              # {layer: de_i (B, T, P)}, until undone


def gemma4_per_layer_inputs_forward(ids, params, config):
    """e (B, T, L, P) for ``ids`` (B, T): (rms_norm(x0 @ m / sqrt(C)) + wte_pl[ids] * sqrt(P)) / sqrt(2),
    x0 = wte[ids] * sqrt(C) the blocks' input. Returns ``(e, cache)``."""
    C, L, P, eps = config.n_embd, config.n_layer, config.per_layer_input_size, config.rms_eps
    pad, p = config.pad_token_id, params["per_layer"]
    x, x_cache = embedding_forward(ids, params["wte"], pad)                  # (B, T) -> (B, T, C)
    scales = tuple(x.dtype.type(c) for c in (C ** 0.5, P ** 0.5, C ** -0.5, 2 ** -0.5))   # each in the model's dtype
    x = x * scales[0]                                                        # x0, as the first block gets it
    t, t_cache = embedding_forward(ids, p["wte"], pad)                       # (B, T) -> (B, T, L*P)
    t = (t * scales[1]).reshape(*ids.shape, L, P)                            # (B, T, L, P)
    m, m_cache = linear_forward(x, **p["proj"])                              # (B, T, C) -> (B, T, L*P)
    m, norm_cache = rms_norm_forward((m * scales[2]).reshape(*ids.shape, L, P), p["norm"]["w"], eps)   # per group
    return (m + t) * scales[3], (x_cache, t_cache, m_cache, norm_cache, scales)


def gemma4_per_layer_inputs_backward(de, cache):
    """Undoes gemma4_per_layer_inputs_forward: de (B, T, L, P) -> (dwte (V, C), {"wte", "proj", "norm"})."""
    x_cache, t_cache, m_cache, norm_cache, scales = cache
    de = de * scales[3]                                                      # both terms' gradient
    dt = (de * scales[1]).reshape(*de.shape[:2], -1)                         # (B, T, L*P)
    dm, dnorm = rms_norm_backward(de, norm_cache)                            # (B, T, L, P)
    dx, dproj = linear_backward((dm * scales[2]).reshape(dt.shape), m_cache)   # (B, T, C)
    dwte = embedding_backward(dx * scales[0], x_cache)                       # x0's share of wte's gradient
    return dwte, {"wte": embedding_backward(dt, t_cache), "proj": dproj, "norm": dnorm}


def gemma4_per_layer_forward(x, params, e, eps):
    """The block's last sublayer: x (B, T, C), e (B, T, P) -> rms_norm((gelu(x @ g) * e) @ p) (B, T, C).
    Returns ``(out, cache)``."""
    g, gate_cache = linear_forward(x, **params["gate"])                      # (B, T, C) -> (B, T, P)
    a, gelu_cache = gelu_forward(g, "tanh")                                  # (B, T, P)
    out, proj_cache = linear_forward(a * e, **params["proj"])                # (B, T, P) -> (B, T, C)
    out, norm_cache = rms_norm_forward(out, params["norm"]["w"], eps)        # (B, T, C)
    return out, (gate_cache, gelu_cache, a, e, proj_cache, norm_cache)


def gemma4_per_layer_backward(dout, cache):
    """Gradients: dout (B, T, C) -> (dx (B, T, C), dparams {"gate", "proj", "norm"}, de (B, T, P))."""
    gate_cache, gelu_cache, a, e, proj_cache, norm_cache = cache
    dh, dnorm = rms_norm_backward(dout, norm_cache)                          # (B, T, C)
    dae, dproj = linear_backward(dh, proj_cache)                             # (B, T, P)
    dg = gelu_backward(dae * e, gelu_cache)                                  # (B, T, P)
    dx, dgate = linear_backward(dg, gate_cache)                              # (B, T, C)
    return dx, {"gate": dgate, "proj": dproj, "norm": dnorm}, dae * a


# -- the mixture of experts beside the MLP --------------------------------------------------------

class Gemma4RouterCache(NamedTuple):
    """The router's steps in forward order, and what the weights' backward needs."""

    norm: tuple
    linear: tuple
    softmax: tuple
    indices: np.ndarray      # (N, k) the chosen experts
    shares: np.ndarray       # (N, k) their probabilities divided by their sum
    total: np.ndarray        # (N, 1) that sum
    scales: np.ndarray       # (N, k) their expert_scale
    E: int


def gemma4_router_forward(x, router, k, eps):
    """x (N, C) -> (weights (N, k), indices (N, k), cache): p = softmax(rms_norm(x) * scale / sqrt(C)
    @ w) over all E; the k largest p divided by their sum, times their experts' expert_scale."""
    C = x.shape[-1]
    n, norm_cache = rms_norm_forward(x, router["scale"] * x.dtype.type(C ** -0.5), eps)   # (N, C)
    scores, linear_cache = linear_forward(n, router["w"])                    # (N, C) -> (N, E)
    p, softmax_cache = softmax_forward(scores, axis=-1)                      # (N, E)
    indices = top_k(p, k)                                                    # (N, k)
    chosen = np.take_along_axis(p, indices, axis=-1)                         # (N, k)
    total = chosen.sum(axis=-1, keepdims=True)                               # (N, 1)
    shares = chosen / total                                                  # (N, k), summing to 1
    scales = router["expert_scale"][indices]                                 # (N, k)
    return shares * scales, indices, Gemma4RouterCache(norm_cache, linear_cache, softmax_cache, indices, shares,
                                                       total, scales, p.shape[-1])


def gemma4_router_backward(dweights, cache):
    """Gradients: dweights (N, k) -> (dx (N, C), {"w", "scale", "expert_scale"}); the choice has none."""
    dexpert_scale = np.zeros(cache.E, dweights.dtype)                        # (E,)
    np.add.at(dexpert_scale, cache.indices, dweights * cache.shares)         # an expert's uses add
    dshares = dweights * cache.scales                                        # (N, k)
    # Undoes shares = chosen / total, total their sum: each chosen p moves every share.
    dchosen = (dshares - (dshares * cache.shares).sum(axis=-1, keepdims=True)) / cache.total
    dp = np.zeros(dchosen.shape[:-1] + (cache.E,), dchosen.dtype)            # (N, E): the others get none
    np.put_along_axis(dp, cache.indices, dchosen, axis=-1)
    dscores = softmax_backward(dp, cache.softmax)                            # (N, E)
    dn, dlinear = linear_backward(dscores, cache.linear)                     # (N, C)
    dx, dnorm = rms_norm_backward(dn, cache.norm)                            # its weight: scale / sqrt(C)
    C = dx.shape[-1]
    return dx, {"w": dlinear["w"], "scale": dnorm["w"] * dx.dtype.type(C ** -0.5), "expert_scale": dexpert_scale}


def gemma4_moe_forward(x, f, params, config):
    """The MLP's output f (B, T, C) and the experts' on the block's x (B, T, C), each normed, added
    -> (B, T, C). Returns ``(out, cache)``."""
    eps, C = config.rms_eps, config.n_embd
    f, dense_cache = rms_norm_forward(f, params["dense_post_norm"]["w"], eps)           # (B, T, C)
    flat = x.reshape(-1, C)                                                             # (N, C), N = B T
    weights, indices, router_cache = gemma4_router_forward(flat, params["router"], config.experts_per_token, eps)
    h, norm_cache = rms_norm_forward(flat, params["norm"]["w"], eps)                    # (N, C)
    h, experts_cache = experts_forward(h, weights, indices, params["experts"],
                                       partial(swiglu_forward, act="gelu_tanh"))   # (N, C)
    h, post_norm_cache = rms_norm_forward(h.reshape(x.shape), params["post_norm"]["w"], eps)   # (B, T, C)
    return f + h, (dense_cache, router_cache, norm_cache, experts_cache, post_norm_cache)


def gemma4_moe_backward(dout, cache):
    """Gradients: dout (B, T, C) -> (df (B, T, C), dx (B, T, C), dparams like the block's "moe")."""
    dense_cache, router_cache, norm_cache, experts_cache, post_norm_cache = cache
    df, ddense = rms_norm_backward(dout, dense_cache)                        # (B, T, C)
    dh, dpost_norm = rms_norm_backward(dout, post_norm_cache)                # (B, T, C)
    dh, dweights, dexperts = experts_backward(dh.reshape(-1, dh.shape[-1]), experts_cache, swiglu_backward)
    dx, dnorm = rms_norm_backward(dh, norm_cache)                            # (N, C)
    dx_router, drouter = gemma4_router_backward(dweights, router_cache)      # (N, C)
    dparams = {"router": drouter, "experts": dexperts, "dense_post_norm": ddense, "norm": dnorm,
               "post_norm": dpost_norm}
    return df, (dx + dx_router).reshape(dout.shape), dparams                 # x fed the router and the experts


# -- the block: a norm before and after each sublayer, then the layer's scalar ----------------------

class Gemma4BlockCache(NamedTuple):
    """The sub-caches in forward order, the output before the scalar, and the scalar."""

    attn_norm: tuple
    attn: Gemma4AttentionCache
    attn_post_norm: tuple
    mlp_norm: tuple
    mlp: tuple
    moe: tuple | None                   # gemma4_moe_forward's, with enable_moe
    mlp_post_norm: tuple
    per_layer: tuple | None             # gemma4_per_layer_forward's, with per-layer inputs
    inputs: PerLayerInputs | None       # the model's per-layer inputs, which this block read
    unscaled: np.ndarray
    scalar: np.ndarray


def gemma4_block_forward(x, params, config, positions, *, attn_mask=None, kv_cache=None, window=None, layer=0,
                         shared=None, per_layer=None):
    """One block: x (B, T, C) -> (B, T, C); ``per_layer`` the model's PerLayerInputs, or None.
    Returns ``(out, cache)``; every norm scales by w."""
    eps = config.rms_eps
    # 1-4: x + rms_norm(attn(rms_norm(x)))
    h, attn_norm_cache = rms_norm_forward(x, params["attn_norm"]["w"], eps)            # (B, T, C)
    a, attn_cache = gemma4_attention_forward(h, params["attn"], config, positions, attn_mask=attn_mask,
                                             kv_cache=kv_cache, window=window, layer=layer, shared=shared)
    a, attn_post_norm_cache = rms_norm_forward(a, params["attn_post_norm"]["w"], eps)  # (B, T, C)
    x = x + a
    # 5-8: x + rms_norm(geglu(rms_norm(x)))
    h, mlp_norm_cache = rms_norm_forward(x, params["mlp_norm"]["w"], eps)              # (B, T, C)
    f, mlp_cache = swiglu_forward(h, params["mlp"], act="gelu_tanh")                 # (B, T, C) via (B, T, H)
    moe_cache = None
    if config.enable_moe:   # the experts beside the MLP, on the same x
        f, moe_cache = gemma4_moe_forward(x, f, params["moe"], config)                  # (B, T, C)
    f, mlp_post_norm_cache = rms_norm_forward(f, params["mlp_post_norm"]["w"], eps)    # (B, T, C)
    x = x + f
    # 9: x + rms_norm((gelu(x @ g) * e_i) @ p), with per-layer inputs
    per_layer_cache = None
    if per_layer is not None:
        f, per_layer_cache = gemma4_per_layer_forward(x, params["per_layer"], per_layer.value[:, :, layer], eps)
        x = x + f                                                                       # (B, T, C)
    # 10: times the layer's scalar
    s = params["layer_scalar"]["w"]                                                     # (1,)
    cache = Gemma4BlockCache(attn_norm_cache, attn_cache, attn_post_norm_cache, mlp_norm_cache, mlp_cache,
                             moe_cache, mlp_post_norm_cache, per_layer_cache, per_layer, x, s)
    return x * s, cache


def gemma4_block_backward(dout, cache):
    """Gradients: dout (B, T, C) -> (dx (B, T, C), dparams like the block's params)."""
    # 10: undoes out = x * s.
    dscalar = {"w": np.sum(dout * cache.unscaled).reshape(1).astype(cache.scalar.dtype)}
    dout = dout * cache.scalar                                               # (B, T, C)
    dper_layer = None
    if cache.per_layer is not None:   # 9: branch + skip; e_i's gradient waits for the model's backward
        dx_per_layer, dper_layer, de = gemma4_per_layer_backward(dout, cache.per_layer)
        cache.inputs.grads[cache.attn.layer] = de
        dout = dout + dx_per_layer                                           # (B, T, C)
    # 8-5: undoes x + rms_norm(geglu(rms_norm(x))); x also fed the skip.
    df, dmlp_post_norm = rms_norm_backward(dout, cache.mlp_post_norm)        # (B, T, C)
    dx_moe = dmoe = None
    if cache.moe is not None:   # the experts' share goes to x directly
        df, dx_moe, dmoe = gemma4_moe_backward(df, cache.moe)
    dh, dmlp = swiglu_backward(df, cache.mlp)                                # (B, T, C)
    dx_mlp, dmlp_norm = rms_norm_backward(dh, cache.mlp_norm)                # (B, T, C)
    dx = dx_mlp + dout                                                       # branch + skip
    if dx_moe is not None:
        dx = dx + dx_moe
    # 4-1: undoes x + rms_norm(attn(rms_norm(x))) in the same way.
    da, dattn_post_norm = rms_norm_backward(dx, cache.attn_post_norm)        # (B, T, C)
    dh, dattn = gemma4_attention_backward(da, cache.attn)                    # (B, T, C)
    dx_attn, dattn_norm = rms_norm_backward(dh, cache.attn_norm)             # (B, T, C)
    dparams = {"attn_norm": dattn_norm, "attn": dattn, "attn_post_norm": dattn_post_norm,
               "mlp_norm": dmlp_norm, "mlp": dmlp, "mlp_post_norm": dmlp_post_norm, "layer_scalar": dscalar}
    if dmoe is not None:
        dparams["moe"] = dmoe
    if dper_layer is not None:
        dparams["per_layer"] = dper_layer
    return dx_attn + dx, dparams                                             # branch + skip


# -- the model ------------------------------------------------------------------------------------

def gemma4_forward(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
                   logits_to_keep=None, for_backward=True):
    """Logits for integer ``ids`` (B, T) -> (B, T, V), keywords as gemma3_forward's. Returns
    ``(logits, cache)``."""
    if kv_cache is not None and not isinstance(kv_cache, Gemma4Cache):
        raise TypeError(f"kv_cache must be a Gemma4Cache (from gemma4_kv_cache), got {type(kv_cache).__name__}")
    if kv_cache is not None and attn_mask is not None:
        raise ValueError("gemma4_forward: an attn_mask together with a kv_cache is not supported (the sliding "
                         "layers hold only their window, the mask spans all past + T keys); decode without attn_mask")
    shared = SharedKV({}, {})   # this forward's keys and values, which the shared layers read
    per_layer = None
    if config.per_layer_input_size:   # the ids are checked again, and first, by decoder_forward
        ids = _model.check_decoder_inputs(ids, config, Gemma4Config, positions, attn_mask, kv_cache, rng,
                                          logits_to_keep)
        per_layer = PerLayerInputs(*gemma4_per_layer_inputs_forward(ids, params, config), {})
    return _model.decoder_forward(ids, params, config, Gemma4Config, gemma4_block_forward, positions=positions,
                                  attn_mask=attn_mask, kv_cache=kv_cache, rng=rng, logits_to_keep=logits_to_keep,
                                  for_backward=for_backward, embed_scale=config.n_embd ** 0.5,
                                  logit_softcap=config.final_logit_softcap, padding_idx=config.pad_token_id,
                                  layer_options=lambda i: {"window": config.window(i), "layer": i,
                                                           "shared": shared, "per_layer": per_layer})


def gemma4_backward(dlogits, cache):
    """Gradients: dlogits (B, T, V) -> dparams, with the nesting of the params."""
    dparams = _model.decoder_backward("gemma4", dlogits, cache, gemma4_block_backward)
    inputs = cache.blocks[0].inputs
    if inputs is not None:   # undoes the per-layer inputs, once every block has left its de_i
        de = np.stack([inputs.grads.pop(i) for i in range(len(cache.blocks))], axis=2)   # (B, T, L, P)
        dwte, dparams["per_layer"] = gemma4_per_layer_inputs_backward(de, inputs.cache)
        dparams["wte"] = dparams["wte"] + dwte                               # x0 fed the blocks and e
    return dparams


# -- decoding: keys and values of the layers that make them, once ---------------------------------

@dataclass
class Gemma4Cache(KVCache):
    """KVCache's slots for the layers that make keys and values of layer 0's head size and count
    (its ``windows``, one per such layer: a sliding one keeps its last window), and ``wide``, a
    KVCache for those of the other (None where every layer has the same); a shared layer holds
    none, it reads its source's."""

    sources: tuple = ()    # per layer: (0, j) slot j here, (1, j) slot j of wide, None on a shared layer
    wide: KVCache | None = None

    @property
    def n_layer(self):
        return len(self.sources)

    @property
    def bytes_per_token(self):
        """Bytes each further token adds: the full layers' of both head sizes."""
        return super().bytes_per_token + (0 if self.wide is None else self.wide.bytes_per_token)

    @property
    def bytes_held(self):
        """Bytes of the tokens held now: the layers that make keys, every sequence."""
        own = sum(super(Gemma4Cache, self).layer(j).held * super(Gemma4Cache, self).layer(j).bytes_per_token
                  for j in range(len(self.windows))) * self.dims[0]
        return own + (0 if self.wide is None else self.wide.bytes_held)

    @property
    def nbytes(self):
        """Bytes of both allocations."""
        return super().nbytes + (0 if self.wide is None else self.wide.nbytes)

    def layer(self, i):
        """Layer i's keys and values (KVCache.layer, here or in ``wide``), or None on a shared layer."""
        if not isinstance(i, int | np.integer) or isinstance(i, bool) or not 0 <= i < self.n_layer:
            raise ValueError(f"layer must be an integer in [0, {self.n_layer}), got {i!r}")
        if self.sources[i] is None:
            return None
        part, j = self.sources[i]
        return super().layer(j) if part == 0 else self.wide.layer(j)


def gemma4_kv_cache(config, B, dtype=np.float32, max_len=None):
    """An empty cache for decoding B sequences of up to ``max_len`` (default block_size) tokens: a
    global layer that makes keys holds them all, a sliding one its last window, a shared one none;
    the layers of another head size or count than layer 0's in a second allocation, ``wide``."""
    max_len = config.block_size if max_len is None else max_len
    makers = [i for i in range(config.n_layer) if config.kv_source(i) == i]
    shape = lambda i: (config.layer_nkv(i), config.layer_hs(i))   # noqa: E731
    parts = ([i for i in makers if shape(i) == shape(0)], [i for i in makers if shape(i) != shape(0)])
    own, wide = (init_kv_cache(len(part), B, config.layer_nkv(part[0]), max_len, config.layer_hs(part[0]), dtype,
                               windows=[config.window(i) for i in part]) if part else None for part in parts)
    sources = tuple(None if i not in makers else (0, parts[0].index(i)) if i in parts[0] else (1, parts[1].index(i))
                    for i in range(config.n_layer))
    return Gemma4Cache(own.buffer_k, own.buffer_v, own.lengths, own.windows, own.dims, None, sources, wide)


FAMILY = Family(name="gemma4", title="Gemma 4", architectures=("Gemma4ForCausalLM",), config=Gemma4Config,
                forward=gemma4_forward, backward=gemma4_backward, kv_cache=gemma4_kv_cache,
                init_params=init_gemma4_params)
