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

The model shell (embedding, the loop over the blocks, final norm, head, and their backward) is
numpy_attn/_model.py's ``decoder_forward``, shared by every decoder here; so are the steps its
attention is composed of (``heads_forward``, ``rotate_forward``, ``attend_forward``).
What stands here is Llama's block and attention.

float16 and bfloat16 (params from ``init_llama_params(..., dtype=)``, a cache from
``llama_kv_cache(..., dtype=)``): every operation computes in float32 and rounds its output once
to the params' dtype (docs/precision.md), as numpy_attn/_model.py says.
"""

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from numpy_attn import _model
from numpy_attn._checks import check_config, check_rng
from numpy_attn._family import Family
from numpy_attn.kv_cache import init_kv_cache
from numpy_attn.rms_norm import rms_norm_backward, rms_norm_forward
from numpy_attn.rope import LAYOUTS, rope_frequencies
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
    def __post_init__(self):
        for name, value in _check_llama_config(self).items():
            object.__setattr__(self, name, value)     # NumPy scalars become Python int/float/bool

    @property
    def hs(self):
        """The head size: head_dim, or n_embd // n_head."""
        return self.n_embd // self.n_head if self.head_dim is None else self.head_dim


def init_llama_params(config, rng, dtype=np.float32):
    """{"wte": (V, C), "blocks": {"0": ..., ...}, "norm": {"w": (C,)}, ["head": {"w": (C, V)}]}.

    Embeddings and linear weights are drawn from N(0, 0.02^2), as Hugging Face's Llama
    (initializer_range); norms start at 1, biases at 0; head only without tied weights.
    """
    check_rng(rng, "init_llama_params")
    C, hs = config.n_embd, config.hs
    nh, nkv = config.n_head, config.n_kv_head

    def linear(C_in, C_out, bias):
        layer = {"w": rng.normal(0, 0.02, (C_in, C_out)).astype(dtype)}
        if bias:
            layer["b"] = np.zeros(C_out, dtype)
        return layer

    def init_block(i):
        attn = {"q": linear(C, nh * hs, config.attn_bias), "k": linear(C, nkv * hs, config.attn_bias),
                "v": linear(C, nkv * hs, config.attn_bias), "o": linear(nh * hs, C, config.attn_bias)}
        mlp = {"gate": linear(C, config.hidden, config.mlp_bias),
               "up": linear(C, config.hidden, config.mlp_bias),
               "down": linear(config.hidden, C, config.mlp_bias)}
        return {"attn_norm": {"w": np.ones(C, dtype)}, "attn": attn, "mlp_norm": {"w": np.ones(C, dtype)}, "mlp": mlp}

    return _model.init_decoder_params(config, rng, dtype, init_block)


# -- attention with rotary positions and grouped-query heads ------------------------------------

def llama_attention_forward(x, params, config, positions, *, attn_mask=None, kv_cache=None):
    """Causal self-attention with RoPE: x (B, T, C), positions (T,) or (B, T) -> (B, T, C).

    Returns ``(out, cache)``. ``attn_mask`` (bool, broadcasting to (B, nh, T, S)) restricts the
    causal mask further. With a ``kv_cache`` (this layer's, KVCache.layer(i)) x holds only the T
    new tokens: their rotated keys and values join the cached ones, S = past + T, and the new
    queries are the last T of the S.
    """
    q, k, v, qkv_cache = _model.heads_forward(x, params, config.n_head, config.n_kv_head)   # (B, nh | nkv, T, hs)
    q, k, rope_cache = _model.rotate_forward(q, k, positions, config.rope_theta,
                                             config.rope_scaling, config.rope_layout)
    out, attend_cache = _model.attend_forward(q, k, v, params["o"], kv_cache, attn_mask)   # (B, T, C)
    return out, _model.AttentionCache(qkv_cache, rope_cache, attend_cache)


def llama_attention_backward(dout, cache):
    """Gradients: dout (B, T, C) -> (dx (B, T, C), {"q", "k", "v", "o"} like the params)."""
    dq, dk, dv, do = _model.attend_backward(dout, cache.attend)               # (B, nh, T, hs), (B, nkv, T, hs)
    dq, dk = _model.rotate_backward(dq, dk, cache.rope)                       # (B, nh, T, hs), (B, nkv, T, hs)
    dx, dqkv = _model.heads_backward(dq, dk, dv, cache.qkv)                   # (B, T, C)
    return dx, {**dqkv, "o": do}


LLAMA_ATTENTION = _model.Sublayer(llama_attention_forward, llama_attention_backward)


# -- the block ------------------------------------------------------------------------------------

def swiglu_mlp_forward(h, params, config):
    """Llama's network as a sublayer: swiglu(h) (B, T, C) -> (B, T, C) via (B, T, H)."""
    return swiglu_forward(h, params)


SWIGLU_MLP = _model.Sublayer(swiglu_mlp_forward, swiglu_backward)


class LlamaBlockCache(NamedTuple):
    """The four sub-caches, in forward order, and what undoes the two sublayers."""

    attn_norm: tuple
    attn: tuple
    mlp_norm: tuple
    mlp: tuple
    attn_backward: object = llama_attention_backward
    mlp_backward: object = swiglu_backward


def llama_block_forward(x, params, config, positions, *, attn_mask=None, kv_cache=None, attention=LLAMA_ATTENTION,
                        mlp=SWIGLU_MLP, round_xhat=True, norm_offset=0.0, **attention_options):
    """One block: x (B, T, C) -> (B, T, C). Returns ``(out, cache)``, the four sub-caches;
    ``attn_mask``, ``kv_cache`` (this block's layer) and ``attention_options`` go to attention.
    ``attention`` and ``mlp`` (Sublayers) and the norms' ``round_xhat`` and ``norm_offset`` (1.0:
    they scale by 1 + w) are Llama's unless a family built on this block brings its own."""
    # 1-3: x + attn(rms_norm(x)), h and a (B, T, C)
    h, attn_norm_cache = rms_norm_forward(x, params["attn_norm"]["w"], config.rms_eps, norm_offset, round_xhat)
    a, attn_cache = attention.forward(h, params["attn"], config, positions, attn_mask=attn_mask,
                                      kv_cache=kv_cache, **attention_options)  # (B, T, C)
    x = x + a
    # 4-6: x + mlp(rms_norm(x)), Llama's mlp a SwiGLU network; h and f (B, T, C)
    h, mlp_norm_cache = rms_norm_forward(x, params["mlp_norm"]["w"], config.rms_eps, norm_offset, round_xhat)
    f, mlp_cache = mlp.forward(h, params["mlp"], config)                      # (B, T, C) via (B, T, H)
    out = x + f
    cache = LlamaBlockCache(attn_norm_cache, attn_cache, mlp_norm_cache, mlp_cache, attention.backward, mlp.backward)
    return out, cache


def llama_block_backward(dout, cache):
    """Gradients: dout (B, T, C) -> (dx (B, T, C), dparams like the block's params)."""
    # 6: undoes out = x + f: the skip hands dout to x, the branch to f.
    # 5: undoes f = mlp(h).
    dh, dmlp = cache.mlp_backward(dout, cache.mlp)                            # (B, T, C)
    # 4: undoes h = rms_norm(x); x also fed the skip.
    dx_mlp, dmlp_norm = rms_norm_backward(dh, cache.mlp_norm)                 # (B, T, C)
    dx = dx_mlp + dout                                                        # branch + skip
    # 3: undoes x = x + a, as step 6.
    # 2: undoes a = attn(h).
    dh, dattn = cache.attn_backward(dx, cache.attn)                           # (B, T, C)
    # 1: undoes h = rms_norm(x).
    dx_attn, dattn_norm = rms_norm_backward(dh, cache.attn_norm)              # (B, T, C)
    dx = dx_attn + dx                                                         # branch + skip
    return dx, {"attn_norm": dattn_norm, "attn": dattn, "mlp_norm": dmlp_norm, "mlp": dmlp}


# -- the model ------------------------------------------------------------------------------------

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
    return _model.decoder_forward(ids, params, config, LlamaConfig, llama_block_forward, positions=positions,
                                  attn_mask=attn_mask, kv_cache=kv_cache, rng=rng,
                                  logits_to_keep=logits_to_keep, for_backward=for_backward)


llama_backward = _model.decoder_backward_of("llama", llama_block_backward)


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


# The family's row, which numpy_attn._family.families() finds (attn_cli reads and decodes by it).
FAMILY = Family(name="llama", title="Llama", architectures=("LlamaForCausalLM",), config=LlamaConfig,
                forward=llama_forward, backward=llama_backward, kv_cache=llama_kv_cache, init_params=init_llama_params)
