"""OLMo Hybrid: OLMo 2's model (numpy_attn/olmo2.py) with most of its layers Gated DeltaNet blocks,
and its backward.

    full layer:    x = x + rms_norm(attn(x))          OLMo 2's block: norms after, QK-norm over
                   x = x + rms_norm(swiglu(x))        the whole projection, RoPE on every channel
    linear layer:  x = x + gated_deltanet(rms_norm(x))   Llama's block: norms before
                   x = x + swiglu(rms_norm(x))

Team OLMo (2025): three Gated DeltaNet layers ("linear_attention") to each attention layer
("full_attention") by default, ``layer_types`` listing them. What differs from OLMo 2 is written
here; the rest is reused:

- the attention layers are OLMo 2's blocks as they are (olmo2_block_forward);
- the linear layers are Llama's pre-norm block (llama_block_forward) around Gated DeltaNet
  (numpy_attn/gated_deltanet.py) with three changes from Qwen3.5's: q, k and v come from three
  projections (``q_proj``, ``k_proj``, ``v_proj``), concatenated here into the one projection
  gated_deltanet takes, and its gradient split again; with ``allow_neg_eigval`` beta is doubled
  (beta_scale 2: beta in (0, 2)); the gated norm's eps is 1e-5 whatever rms_eps;
- every RMS norm scales by w and rounds w * xhat once (OLMo 2's ``round_xhat=False``).

Parameters: on a full layer ``blocks.i`` is OLMo 2's (``attn_norm`` and ``mlp_norm`` normalise the
sublayers' outputs, Hugging Face's post_attention_layernorm and post_feedforward_layernorm); on a
linear layer ``attn_norm`` and ``mlp_norm`` normalise their inputs (input_layernorm and
post_attention_layernorm) and ``attn`` holds Gated DeltaNet's, named as Hugging Face's module:
q_proj, k_proj, v_proj, a_proj, b_proj, g_proj (the gate), o_proj, conv1d, dt_bias, A_log, o_norm.

Decoding: Qwen3.5's cache (qwen3_5_kv_cache): keys and values on the full layers, Gated DeltaNet's
state on the linear ones; ``attn_mask``'s padding reaches the linear layers as in Qwen3.5.

float16 and bfloat16 as the other families (Gated DeltaNet computes them in float32), float32, float64.
"""

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from numpy_attn import _model, qwen3_5
from numpy_attn._checks import check_config, check_rng
from numpy_attn._family import Family
from numpy_attn.gated_deltanet import gated_deltanet_forward
from numpy_attn.llama import llama_block_backward, llama_block_forward
from numpy_attn.olmo2 import Olmo2Config, init_olmo2_params, olmo2_block_backward, olmo2_block_forward
from numpy_attn.qwen3_5 import (
    LAYER_TYPES,
    LinearAttentionCache,
    Qwen3_5Cache,
    Qwen3_5Config,
    _token_mask,
    check_layer_types,
    qwen3_5_kv_cache,
)

GATED_NORM_EPS = 1e-5   # the gated norm's, fixed in Hugging Face's OlmoHybridGatedDeltaNet


@dataclass(frozen=True)
class OlmoHybridConfig(Olmo2Config):
    """Olmo2Config's fields and checks, the layer types and Gated DeltaNet's sizes; a size left None
    takes Hugging Face's default from the others."""

    layer_types: tuple | None = None      # n_layer of LAYER_TYPES; None: every 4th layer full (the last at least)
    linear_k_heads: int | None = None     # nk (linear_num_key_heads); None: n_head
    linear_v_heads: int | None = None     # nv, a multiple of nk (linear_num_value_heads); None: n_head
    linear_k_dim: int | None = None       # dk (linear_key_head_dim); None: int(0.75 * n_embd / nk)
    linear_v_dim: int | None = None       # dv (linear_value_head_dim); None: 2 dk
    conv_kernel: int = 4                  # K, the convolution's taps (linear_conv_kernel_dim)
    allow_neg_eigval: bool = True         # beta in (0, 2) rather than (0, 1) (linear_allow_neg_eigval)

    def __post_init__(self):
        super().__post_init__()
        for name, value in _check_olmo_hybrid_config(self).items():
            object.__setattr__(self, name, value)

    is_full = Qwen3_5Config.is_full
    conv_dim = Qwen3_5Config.conv_dim


def init_olmo_hybrid_params(config, rng, dtype=np.float32):
    """init_olmo2_params' tree with Gated DeltaNet in place of attention on the linear layers: its
    projections and convolution from N(0, 0.02^2), A_log at log U(1, 16), dt_bias at softplus^-1 of
    a dt log-uniform in [1e-3, 0.1] (Hugging Face's), the gated norm at 1."""
    check_rng(rng, "init_olmo_hybrid_params")
    normal = _model.normal_init(rng, dtype)                                   # shape -> N(0, 0.02^2) draws
    params = init_olmo2_params(config, rng, dtype)
    C, nk, nv = config.n_embd, config.linear_k_heads, config.linear_v_heads
    dk, dv = config.linear_k_dim, config.linear_v_dim
    for i, block in params["blocks"].items():
        if not config.is_full(int(i)):
            dt = np.exp(rng.uniform(np.log(1e-3), np.log(0.1), nv))            # (nv,)
            block["attn"] = {"q_proj": {"w": normal(C, nk * dk)}, "k_proj": {"w": normal(C, nk * dk)},
                             "v_proj": {"w": normal(C, nv * dv)}, "a_proj": {"w": normal(C, nv)},
                             "b_proj": {"w": normal(C, nv)}, "g_proj": {"w": normal(C, nv * dv)},
                             "o_proj": {"w": normal(nv * dv, C)},
                             "conv1d": {"w": normal(config.conv_dim, config.conv_kernel)},
                             "dt_bias": (dt + np.log(-np.expm1(-dt))).astype(dtype),   # softplus(dt_bias) = dt
                             "A_log": np.log(rng.uniform(1, 16, nv)).astype(dtype),
                             "o_norm": {"w": np.ones(dv, dtype)}}
    return params


# -- the linear layers' mixer: Gated DeltaNet with OLMo Hybrid's projections and beta ----------------

# gated_deltanet's name of each of OLMo Hybrid's parameters (q, k and v go into in_proj_qkv).
RENAMED = {"g_proj": "in_proj_z", "b_proj": "in_proj_b", "a_proj": "in_proj_a", "conv1d": "conv1d",
           "dt_bias": "dt_bias", "A_log": "A_log", "o_norm": "norm", "o_proj": "out_proj"}


def olmo_hybrid_linear_attention_forward(x, params, config, positions, *, attn_mask=None, kv_cache=None):
    """Gated DeltaNet on x (B, T, C) -> (B, T, C), continuing the state of ``kv_cache`` (this layer's,
    Qwen3_5Cache.layer(i)) if given; ``positions`` unused (the recurrence is its order)."""
    state = None if kv_cache is None or kv_cache.length == 0 else kv_cache.state
    past = 0 if kv_cache is None else kv_cache.length
    qkv = np.concatenate([params[name]["w"] for name in ("q_proj", "k_proj", "v_proj")], axis=1)   # (C, conv_dim)
    inner = {"in_proj_qkv": {"w": qkv}} | {theirs: params[ours] for ours, theirs in RENAMED.items()}
    out, new_state, cache = gated_deltanet_forward(
        x, inner, config.linear_k_heads, config.linear_v_heads, config.linear_k_dim, config.linear_v_dim,
        GATED_NORM_EPS, state=state, mask=_token_mask(attn_mask, x.shape[:2], config.n_head),
        beta_scale=2.0 if config.allow_neg_eigval else 1.0)
    if kv_cache is not None:
        kv_cache.update(new_state, x.shape[1])
    return out, LinearAttentionCache(cache, past)


def olmo_hybrid_linear_attention_backward(dout, cache):
    """Gradients: dout (B, T, C) -> (dx (B, T, C), dparams named as the params): Qwen3.5's linear
    backward, in_proj_qkv's gradient split into q_proj's, k_proj's and v_proj's columns."""
    dx, inner = qwen3_5.linear_attention_backward(dout, cache)
    nk, nv, dk, dv = cache.deltanet.sizes
    dq, dk_, dv_ = np.split(inner["in_proj_qkv"]["w"], [nk * dk, 2 * nk * dk], axis=1)   # (C, nk dk | nv dv)
    grads = {"q_proj": {"w": dq}, "k_proj": {"w": dk_}, "v_proj": {"w": dv_}}
    return dx, grads | {ours: inner[theirs] for ours, theirs in RENAMED.items()}


LINEAR_ATTENTION = _model.Sublayer(olmo_hybrid_linear_attention_forward, olmo_hybrid_linear_attention_backward)


# -- the block: OLMo 2's on a full layer, Llama's around Gated DeltaNet on a linear one --------------

class OlmoHybridBlockCache(NamedTuple):
    """Whether the block is a full layer, and its block's cache."""

    full: bool
    block: tuple


def olmo_hybrid_block_forward(x, params, config, positions, *, attn_mask=None, kv_cache=None, full=True):
    """One block, OLMo 2's (``full``) or Llama's with Gated DeltaNet: x (B, T, C) -> (B, T, C)."""
    if full:
        out, cache = olmo2_block_forward(x, params, config, positions, attn_mask=attn_mask, kv_cache=kv_cache)
    else:
        out, cache = llama_block_forward(x, params, config, positions, attn_mask=attn_mask, kv_cache=kv_cache,
                                         attention=LINEAR_ATTENTION, round_xhat=False)
    return out, OlmoHybridBlockCache(full, cache)


def olmo_hybrid_block_backward(dout, cache):
    """Gradients: dout (B, T, C) -> (dx (B, T, C), dparams like the block's params)."""
    return (olmo2_block_backward if cache.full else llama_block_backward)(dout, cache.block)


# -- the model -------------------------------------------------------------------------------------

def olmo_hybrid_forward(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
                        logits_to_keep=None, for_backward=True):
    """Logits for integer ``ids`` (B, T) -> (B, T, V), as llama_forward (same keywords; ``kv_cache``
    from qwen3_5_kv_cache). Returns ``(logits, cache)``."""
    if kv_cache is not None and not isinstance(kv_cache, Qwen3_5Cache):
        raise TypeError(f"kv_cache must be a Qwen3_5Cache (from qwen3_5_kv_cache), got {type(kv_cache).__name__}")
    return _model.decoder_forward(ids, params, config, OlmoHybridConfig, olmo_hybrid_block_forward,
                                  positions=positions, attn_mask=attn_mask, kv_cache=kv_cache, rng=rng,
                                  logits_to_keep=logits_to_keep, for_backward=for_backward, norm_round_xhat=False,
                                  layer_options=lambda i: {"full": config.is_full(i)})


olmo_hybrid_backward = _model.decoder_backward_of("olmo_hybrid", olmo_hybrid_block_backward)


def _check_olmo_hybrid_config(config):
    """Return the new fields as Python values, Hugging Face's defaults filled in, or raise naming
    the field (numpy_attn/_checks.py)."""
    name = "OlmoHybridConfig"
    values = check_config(config, {"linear_k_heads": (int | None, 1), "linear_v_heads": (int | None, 1),
                                   "linear_k_dim": (int | None, 1), "linear_v_dim": (int | None, 1),
                                   "conv_kernel": (int, 1), "allow_neg_eigval": (bool, None)})
    nk = values["linear_k_heads"] = values["linear_k_heads"] or config.n_head
    values["linear_v_heads"] = values["linear_v_heads"] or config.n_head
    dk = values["linear_k_dim"] = values["linear_k_dim"] or int(0.75 * config.n_embd / nk)
    values["linear_v_dim"] = values["linear_v_dim"] or 2 * dk
    if dk < 1:
        raise ValueError(f"{name}.linear_k_dim: the default int(0.75 * n_embd / linear_k_heads) is 0 "
                         f"(n_embd = {config.n_embd}, linear_k_heads = {nk}); give it")
    if values["linear_v_heads"] % nk:
        raise ValueError(f"{name}.linear_v_heads = {values['linear_v_heads']} must be a multiple of "
                         f"linear_k_heads = {nk}")
    types = config.layer_types
    if types is None:   # Hugging Face's default: every 4th layer full, and the last if none is
        types = tuple(LAYER_TYPES[i % 4 == 3 or (i == config.n_layer - 1 and config.n_layer < 4)]
                      for i in range(config.n_layer))
    values["layer_types"] = check_layer_types(name, types, config.n_layer)
    return values


FAMILY = Family(name="olmo_hybrid", title="OLMo Hybrid", architectures=("OlmoHybridForCausalLM",),
                config=OlmoHybridConfig, forward=olmo_hybrid_forward, backward=olmo_hybrid_backward,
                kv_cache=qwen3_5_kv_cache, init_params=init_olmo_hybrid_params)
