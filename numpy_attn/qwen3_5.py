"""Qwen3.5's language model: Llama's pre-norm blocks, most of them with Gated DeltaNet in place of
attention, and its backward.

    x      = wte[ids]
    x      = x + mixer_i(rms_norm(x))        mixer_i: gated attention or Gated DeltaNet, by layer_types[i]
    x      = x + swiglu(rms_norm(x))         (the two lines above once per block)
    x      = rms_norm(x)
    logits = x @ head.w

Qwen Team, Qwen3-Next and Qwen3.5 (2025): a hybrid of linear and full attention, three
Gated DeltaNet layers (numpy_attn/gated_deltanet.py, "linear_attention") to each attention layer
("full_attention") by default, ``layer_types`` listing them. The attention layers are Qwen3's
(numpy_attn/qwen3.py: QK-norm per head, grouped-query heads) with two changes written here:

- an output gate: the query projection gives each head its query and a gate of the same width,
  [query | gate] side by side per head (q.w is (C, nh * 2 hs)), and the heads' output is multiplied
  by sigmoid(gate) before the output projection, so that a head can close itself per token;
- partial rotary: only the first ``rotary_dim = int(hs * partial_rotary_factor)`` channels of each
  head rotate (a quarter by default), with the frequencies of a head of that size.

Every RMS norm of the model (the blocks', the final one, the QK-norms) scales by 1 + w, its weight
stored minus one and starting at 0 (rms_norm.py's ``offset``, as Gemma's); the gated norm inside
Gated DeltaNet scales by w. The block, the SwiGLU network and the shell are llama.py's and
_model.py's; each layer's mixer is a Sublayer handed to the block by ``decoder_forward``'s layer
options. Parameters: ``blocks.i.attn`` holds the attention's q, k, v, o, q_norm, k_norm on a full
layer, Gated DeltaNet's (named as Hugging Face's) on a linear one.

Decoding (``qwen3_5_kv_cache``): a full layer keeps its keys and values, as llama_kv_cache's; a
linear layer keeps Gated DeltaNet's state {"conv", "recurrent"}, whose size does not grow with the
text. ``attn_mask`` marks padding for the linear layers too: a token whose own key it masks
(a padding mask's column) is read as zeros by them, so that it never reaches their state.

float16 and bfloat16 as the other families (Gated DeltaNet computes them in float32), float32, float64.
"""

from dataclasses import dataclass, field

import numpy as np

from numpy_attn import _model
from numpy_attn._checks import check_config, check_no_past, check_rng
from numpy_attn._family import Family
from numpy_attn.gated_deltanet import gated_deltanet_backward, gated_deltanet_forward
from numpy_attn.kv_cache import KVCache, LayerView, init_kv_cache
from numpy_attn.linear import linear_backward, linear_forward
from numpy_attn.llama import LlamaConfig, init_llama_params, llama_block_backward, llama_block_forward
from numpy_attn.multi_head import merge_heads, split_heads
from numpy_attn.qk_norm import qk_norm_backward, qk_norm_forward
from numpy_attn.swiglu import sigmoid

LAYER_TYPES = ("linear_attention", "full_attention")


@dataclass(frozen=True)
class Qwen3_5Config(LlamaConfig):
    """LlamaConfig's fields and checks, and the layer types, the partial rotary and Gated DeltaNet's sizes."""

    layer_types: tuple | None = None      # n_layer of LAYER_TYPES; None: every 4th layer full, as Hugging Face
    partial_rotary_factor: float = 0.25   # the share of each head's channels that rotate
    linear_k_heads: int = 2               # nk, Gated DeltaNet's key heads (linear_num_key_heads)
    linear_v_heads: int = 4               # nv, its value heads, a multiple of nk (linear_num_value_heads)
    linear_k_dim: int = 8                 # dk (linear_key_head_dim)
    linear_v_dim: int = 8                 # dv (linear_value_head_dim)
    conv_kernel: int = 4                  # K, its convolution's taps (linear_conv_kernel_dim)

    def __post_init__(self):
        super().__post_init__()
        for name, value in _check_qwen3_5_config(self).items():
            object.__setattr__(self, name, value)

    @property
    def rotary_dim(self):
        """The channels of each head that rotate: int(hs * partial_rotary_factor)."""
        return int(self.hs * self.partial_rotary_factor)

    def is_full(self, i):
        """Whether layer i is an attention layer (else Gated DeltaNet)."""
        return self.layer_types[i] == "full_attention"

    @property
    def conv_dim(self):
        """Gated DeltaNet's convolved channels: q, k and v, 2 nk dk + nv dv."""
        return 2 * self.linear_k_heads * self.linear_k_dim + self.linear_v_heads * self.linear_v_dim


def init_qwen3_5_params(config, rng, dtype=np.float32):
    """init_llama_params' tree with Qwen3.5's mixers: on a full layer q.w (C, nh * 2 hs) (query and
    gate per head) and "q_norm", "k_norm" {"w": (hs,)}; on a linear layer Gated DeltaNet's params.
    Every RMS norm weight starts at 0 (it scales by 1 + w); Gated DeltaNet's dt_bias at 1, its A_log
    at log U(1, 16), its gated norm at 1, its convolution and projections from N(0, 0.02^2)."""
    check_rng(rng, "init_qwen3_5_params")
    params = init_llama_params(config, rng, dtype)
    C, hs, nh = config.n_embd, config.hs, config.n_head
    nv, dv = config.linear_v_heads, config.linear_v_dim
    normal = _model.normal_init(rng, dtype)                                   # shape -> N(0, 0.02^2) draws
    for i, block in params["blocks"].items():
        block["attn_norm"]["w"][:] = 0                                         # 1 + w starts at 1
        block["mlp_norm"]["w"][:] = 0
        if config.is_full(int(i)):
            block["attn"]["q"]["w"] = normal(C, nh * 2 * hs)                     # (C, nh * 2 hs): query and gate
            if config.attn_bias:
                block["attn"]["q"]["b"] = np.zeros(nh * 2 * hs, dtype)
            block["attn"]["q_norm"] = {"w": np.zeros(hs, dtype)}                 # (hs,)
            block["attn"]["k_norm"] = {"w": np.zeros(hs, dtype)}
        else:
            block["attn"] = {"in_proj_qkv": {"w": normal(C, config.conv_dim)}, "in_proj_z": {"w": normal(C, nv * dv)},
                             "in_proj_b": {"w": normal(C, nv)}, "in_proj_a": {"w": normal(C, nv)},
                             "conv1d": {"w": normal(config.conv_dim, config.conv_kernel)},
                             "dt_bias": np.ones(nv, dtype), "A_log": np.log(rng.uniform(1, 16, nv)).astype(dtype),
                             "norm": {"w": np.ones(dv, dtype)}, "out_proj": {"w": normal(nv * dv, C)}}
    params["norm"]["w"][:] = 0
    return params


# -- the full layers' attention: Qwen3's, with an output gate and partial rotary ----------------------

@dataclass(frozen=True)
class GatedAttentionCache:
    """Qwen3's attention caches, the heads' output before the gate and the gate's sigmoid."""

    attn: _model.AttentionCache
    y: np.ndarray              # (B, T, nh*hs), attention's output, merged
    gate: np.ndarray           # (B, T, nh*hs), sigmoid(gate)


def gated_attention_forward(x, params, config, positions, *, attn_mask=None, kv_cache=None):
    """Qwen3's attention with the output gate and partial rotary: x (B, T, C) -> (B, T, C). Returns ``(out, cache)``."""
    nh, nkv, hs = config.n_head, config.n_kv_head, config.hs
    qg, k, v, qkv_cache = _model.heads_forward(x, params, nh, nkv)            # (B, nh, T, 2hs), (B, nkv, T, hs)
    q, gate = qg[..., :hs], qg[..., hs:]                                      # [query | gate]: (B, nh, T, hs) each
    q, k, qk_norm_cache = qk_norm_forward(q, k, params, config.rms_eps, offset=1.0)   # each head, 1 + w
    q, k, rope_cache = _model.rotate_forward(q, k, positions, config.rope_theta, config.rope_scaling,
                                             config.rope_layout, config.rotary_dim)  # the first rotary_dim
    y, attn_cache = _model.cached_attention_forward(q, k, v, kv_cache, attn_mask)  # (B, nh, T, hs)
    y, s = merge_heads(y), sigmoid(merge_heads(gate))                         # (B, T, nh*hs) each
    out, o_cache = linear_forward(y * s, **params["o"])                       # (B, T, nh*hs) -> (B, T, C)
    cache = _model.AttentionCache(qkv_cache, rope_cache, _model.AttendCache(attn_cache, o_cache, nh), qk_norm_cache)
    return out, GatedAttentionCache(cache, y, s)


def gated_attention_backward(dout, cache):
    """Gradients: dout (B, T, C) -> (dx (B, T, C), {"q", "k", "v", "o", "q_norm", "k_norm"})."""
    c, nh = cache.attn, cache.attn.attend.num_heads
    dys, do = linear_backward(dout, c.attend.o)                               # (B, T, C) -> (B, T, nh*hs)
    dy = dys * cache.gate                                                     # undoes y * s: to y ...
    dgate = dys * cache.y * cache.gate * (1 - cache.gate)                     # ... and to the gate: s' = s (1 - s)
    dq, dk, dv = _model.cached_attention_backward(split_heads(dy, nh), c.attend.attn)   # nkv heads for dk, dv
    dq, dk = _model.rotate_backward(dq, dk, c.rope)                           # (B, nh, T, hs), (B, nkv, T, hs)
    dq, dk, dqk_norm = qk_norm_backward(dq, dk, c.qk_norm)
    dqg = np.concatenate([dq, split_heads(dgate, nh)], axis=-1)               # (B, nh, T, 2hs), as q gave them
    dx, dqkv = _model.heads_backward(dqg, dk, dv, c.qkv)                      # (B, T, C)
    return dx, {**dqkv, "o": do, **dqk_norm}


GATED_ATTENTION = _model.Sublayer(gated_attention_forward, gated_attention_backward)


# -- the linear layers' mixer: Gated DeltaNet as a sublayer ------------------------------------------

@dataclass(frozen=True)
class LinearAttentionCache:
    """The linear-attention sublayer's cache and how many tokens its state had seen before (0 without a cache)."""

    deltanet: tuple
    past: int


def state_sublayer(mixer_forward, mixer_backward):
    """A Sublayer from a linear-attention sublayer that carries a state: ``mixer_forward(x, params,
    config, state, mask)`` -> (out, new_state, cache), ``mixer_backward(dout, cache)`` -> (dx,
    dparams). The forward continues the state of ``kv_cache`` (this layer's, a Qwen3_5Cache's
    layer(i)) if given and writes the new one there; ``positions`` unused (the recurrence is its
    order). The backward refuses a forward that continued a cached state (for inference only: its
    tokens' inputs are not here). Kimi Linear's delta attention is made the same way."""
    def forward(x, params, config, positions, *, attn_mask=None, kv_cache=None):
        state = None if kv_cache is None or kv_cache.length == 0 else kv_cache.state
        past = 0 if kv_cache is None else kv_cache.length
        out, new_state, cache = mixer_forward(x, params, config, state,
                                              _token_mask(attn_mask, x.shape[:2], config.n_head))
        if kv_cache is not None:
            kv_cache.update(new_state, x.shape[1])
        return out, LinearAttentionCache(cache, past)

    def backward(dout, cache):
        check_no_past("the model's backward", cache.past + dout.shape[1], cache.past)
        return mixer_backward(dout, cache.deltanet)

    return _model.Sublayer(forward, backward)


def _gated_deltanet(x, params, config, state, mask):
    """Gated DeltaNet with the config's sizes."""
    return gated_deltanet_forward(x, params, config.linear_k_heads, config.linear_v_heads, config.linear_k_dim,
                                  config.linear_v_dim, config.rms_eps, state=state, mask=mask)


# Gated DeltaNet on x (B, T, C) -> (B, T, C), and its backward (dx, Gated DeltaNet's dparams).
LINEAR_ATTENTION = state_sublayer(_gated_deltanet, gated_deltanet_backward)
linear_attention_forward, linear_attention_backward = LINEAR_ATTENTION


def _token_mask(attn_mask, shape, n_head):
    """(B, T) bool, False at the new tokens ``attn_mask`` marks as padding (a token whose own key the
    mask hides from it, in some head), or None when there is none: what the linear layers read as zeros."""
    if attn_mask is None:
        return None
    B, T = shape
    S = attn_mask.shape[-1]
    m = np.broadcast_to(attn_mask, (B, n_head, T, S))
    own = m[:, :, np.arange(T), S - T + np.arange(T)].all(axis=1)             # (B, T): query t on its own key
    return None if own.all() else own


# -- the model -------------------------------------------------------------------------------------

def _layer_options(config):
    """Block i's options for decoder_forward: its mixer, and norms that scale by 1 + w."""
    return lambda i: {"attention": GATED_ATTENTION if config.is_full(i) else LINEAR_ATTENTION, "norm_offset": 1.0}


def qwen3_5_forward(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
                    logits_to_keep=None, for_backward=True):
    """Logits for integer ``ids`` (B, T) -> (B, T, V), as llama_forward (same keywords; ``kv_cache``
    from qwen3_5_kv_cache). Returns ``(logits, cache)``."""
    return hybrid_decoder_forward(ids, params, config, Qwen3_5Config, _layer_options(config), positions=positions,
                                  attn_mask=attn_mask, kv_cache=kv_cache, rng=rng, logits_to_keep=logits_to_keep,
                                  for_backward=for_backward)


def hybrid_decoder_forward(ids, params, config, config_class, layer_options, **keywords):
    """decoder_forward with Llama's blocks, each layer's mixer (and network) from ``layer_options``,
    the final norm scaling by 1 + w, and the keywords' ``kv_cache`` a Qwen3_5Cache or None."""
    kv_cache = keywords["kv_cache"]
    if kv_cache is not None and not isinstance(kv_cache, Qwen3_5Cache):
        raise TypeError(f"kv_cache must be a Qwen3_5Cache (from qwen3_5_kv_cache), got {type(kv_cache).__name__}")
    return _model.decoder_forward(ids, params, config, config_class, llama_block_forward, **keywords,
                                  norm_offset=1.0, layer_options=layer_options)


qwen3_5_backward = _model.decoder_backward_of("qwen3_5", llama_block_backward)


# -- decoding: keys and values on the full layers, Gated DeltaNet's state on the linear ones ----------

@dataclass
class Qwen3_5Cache(KVCache):
    """KVCache's slots for the full layers only (its ``windows``, one per full layer) and, per linear
    layer, Gated DeltaNet's state and the tokens it has seen; ``layer(i)`` hands each block its own."""

    layer_types: tuple = ()
    full_index: tuple = ()     # per layer: its index among the full layers, None on a linear one
    states: list = field(default_factory=list)      # per layer: {"conv", "recurrent"}, None on a full one
    linear_lengths: np.ndarray = None               # (L,) tokens each linear layer has seen

    @property
    def n_layer(self):
        return len(self.layer_types)

    @property
    def length(self):
        """Tokens seen by layer 0: the position of the next token, before a step appends."""
        return self.layer(0).length

    @property
    def k(self):
        """(F, B, nkv, max_len, hs): the F full layers' key slots (a view)."""
        return self.buffer_k.reshape((len(self.windows),) + self.dims)

    @property
    def v(self):
        """(F, B, nkv, max_len, hs): the F full layers' value slots (a view)."""
        return self.buffer_v.reshape((len(self.windows),) + self.dims)

    @property
    def bytes_held(self):
        """Bytes held now: the full layers' keys and values of the tokens seen, and the states."""
        return self.length * self.bytes_per_token * self.dims[0] + self.state_nbytes

    @property
    def nbytes(self):
        """Bytes of the whole allocation: the key and value slots, and the states."""
        return self.buffer_k.nbytes + self.buffer_v.nbytes + self.state_nbytes

    @property
    def state_nbytes(self):
        """Bytes of the linear layers' states, the same whatever the length."""
        return sum(s["conv"].nbytes + s["recurrent"].nbytes for s in self.states if s is not None)

    def layer(self, i):
        """Layer i's view: a full layer's keys and values (KVCache.layer), or a linear layer's state."""
        if not isinstance(i, int | np.integer) or isinstance(i, bool) or not 0 <= i < self.n_layer:
            raise ValueError(f"layer must be an integer in [0, {self.n_layer}), got {i!r}")
        if self.full_index[i] is not None:
            return super().layer(self.full_index[i])
        return LinearLayerState(self, int(i))


class LinearLayerState(LayerView):
    """One linear layer of a Qwen3_5Cache: the state it continues and replaces."""

    @property
    def state(self):
        return self.cache.states[self.index]

    @property
    def length(self):
        return int(self.cache.linear_lengths[self.index])

    def update(self, state, T):
        """Keep ``state`` (Gated DeltaNet's after T more tokens), written into the held arrays."""
        for key, value in state.items():
            self.cache.states[self.index][key][...] = value
        self.cache.linear_lengths[self.index] += T


def qwen3_5_kv_cache(config, B, dtype=np.float32, max_len=None):
    """An empty cache for decoding B sequences of up to ``max_len`` (default block_size) tokens: the
    full layers' keys and values (nkv heads), each linear layer's state at zeros."""
    max_len = config.block_size if max_len is None else max_len
    full = [i for i in range(config.n_layer) if config.is_full(i)]
    if full:
        kv = init_kv_cache(len(full), B, config.n_kv_head, max_len, config.hs, dtype)
    else:   # no attention layer: an empty key/value part (init_kv_cache wants a layer)
        kv = init_kv_cache(1, B, config.n_kv_head, max_len, config.hs, dtype)
        kv = KVCache(kv.buffer_k[:0], kv.buffer_v[:0], kv.lengths[:0], (), kv.dims)
    dt = kv.buffer_k.dtype
    K = config.conv_kernel
    states = [None if config.is_full(i) else
              {"conv": np.zeros((B, config.conv_dim, K - 1), dt),
               "recurrent": np.zeros((B, config.linear_v_heads, config.linear_k_dim, config.linear_v_dim), dt)}
              for i in range(config.n_layer)]
    full_index = tuple(full.index(i) if i in full else None for i in range(config.n_layer))
    return Qwen3_5Cache(kv.buffer_k, kv.buffer_v, kv.lengths, kv.windows, kv.dims, None, tuple(config.layer_types),
                        full_index, states, np.zeros(config.n_layer, np.int64))


def _check_qwen3_5_config(config):
    """Return the new fields as Python values, or raise naming the field (numpy_attn/_checks.py)."""
    values = check_config(config, {
        "partial_rotary_factor": (float, None), "linear_k_heads": (int, 1), "linear_v_heads": (int, 1),
        "linear_k_dim": (int, 1), "linear_v_dim": (int, 1), "conv_kernel": (int, 1)})
    name = type(config).__name__                   # a subclass (Qwen3NextConfig) names itself
    f = values["partial_rotary_factor"]
    if not 0 < f <= 1:
        raise ValueError(f"{name}.partial_rotary_factor must be in (0, 1], got {f!r}")
    r = int(config.hs * f)
    if r < 2 or r % 2:
        raise ValueError(f"{name}.partial_rotary_factor = {f!r} rotates int(hs * factor) = {r} channels of each head "
                         f"(hs = {config.hs}): they must be an even number >= 2")
    if values["linear_v_heads"] % values["linear_k_heads"]:
        raise ValueError(f"{name}.linear_v_heads = {values['linear_v_heads']} must be a multiple of "
                         f"linear_k_heads = {values['linear_k_heads']}")
    types = config.layer_types
    if types is None:   # Hugging Face's default: every 4th layer full
        types = tuple(LAYER_TYPES[(i + 1) % 4 == 0] for i in range(config.n_layer))
    values["layer_types"] = check_layer_types(name, types, config.n_layer)
    return values


def check_layer_types(name, types, n_layer):
    """``types`` as a tuple of n_layer entries of LAYER_TYPES, or raise naming ``name``.layer_types."""
    if isinstance(types, str) or not isinstance(types, tuple | list) or len(types) != n_layer:
        raise ValueError(f"{name}.layer_types must list n_layer = {n_layer} entries, got {types!r}")
    for t in types:
        if t not in LAYER_TYPES:
            raise ValueError(f"{name}.layer_types: each entry must be 'linear_attention' or 'full_attention', "
                             f"got {t!r}")
    return tuple(types)


FAMILY = Family(name="qwen3_5", title="Qwen3.5", architectures=("Qwen3_5ForCausalLM",), config=Qwen3_5Config,
                forward=qwen3_5_forward, backward=qwen3_5_backward, kv_cache=qwen3_5_kv_cache,
                init_params=init_qwen3_5_params)
