"""OLMo 2: the Llama-style model (numpy_attn/llama.py) with its norms after the sublayers, and
QK-norm over the whole projection.

    x      = x + rms_norm(attn(x))          q, k = rms_norm(q), rms_norm(k) before the head split
    x      = x + rms_norm(swiglu(x))        (the two lines above once per block)

Team OLMo, "2 OLMo 2 Furious" (2024): the block's input reaches attention and the
MLP unnormed, and their outputs are normed before joining the residual stream (weights
``blocks.i.attn_norm.w`` and ``mlp_norm.w`` (C,), Hugging Face's post_attention_layernorm and
post_feedforward_layernorm); q and k are RMS-normed across all their heads at once, widths
nh * hs and nkv * hs, before they are split into heads and rotated (numpy_attn/qk_norm.py). In
float16 and bfloat16 every norm rounds the product w * xhat once (``round_xhat=False``), where
Llama's rounds xhat first. The embedding, the head, the keywords and the key/value cache
(``llama_kv_cache``) are llama.py's.
"""

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from numpy_attn import _model
from numpy_attn._checks import check_rng
from numpy_attn._family import Family
from numpy_attn.llama import LlamaConfig, init_llama_params, llama_kv_cache
from numpy_attn.multi_head import merge_heads, split_heads
from numpy_attn.qk_norm import qk_norm_backward, qk_norm_forward
from numpy_attn.rms_norm import rms_norm_backward, rms_norm_forward
from numpy_attn.swiglu import swiglu_backward, swiglu_forward


@dataclass(frozen=True)
class Olmo2Config(LlamaConfig):
    """LlamaConfig's fields and checks; q and k are RMS-normed over the whole projection."""


def init_olmo2_params(config, rng, dtype=np.float32):
    """init_llama_params' tree with each attention's "q_norm" {"w": (nh*hs,)} and "k_norm"
    {"w": (nkv*hs,)}, at 1."""
    check_rng(rng, "init_olmo2_params")
    params = init_llama_params(config, rng, dtype)
    for block in params["blocks"].values():   # the norms start at 1, as the others
        block["attn"]["q_norm"] = {"w": np.ones(config.n_head * config.hs, dtype)}      # (nh*hs,)
        block["attn"]["k_norm"] = {"w": np.ones(config.n_kv_head * config.hs, dtype)}   # (nkv*hs,)
    return params


# -- attention: q and k normed across all their heads, before the split ------------------------------

def olmo2_attention_forward(x, params, config, positions, *, attn_mask=None, kv_cache=None):
    """llama_attention_forward with QK-norm over the projection: x (B, T, C) -> (B, T, C).
    Returns ``(out, cache)``."""
    nh, nkv = config.n_head, config.n_kv_head
    (q, k, v), qkv_cache = _model.qkv_forward(x, params)                      # (B, T, C) -> (B, T, nh*hs | nkv*hs)
    q, k, qk_norm_cache = qk_norm_forward(q, k, params, config.rms_eps, round_xhat=False)   # widths nh*hs, nkv*hs
    q, k, v = split_heads(q, nh), split_heads(k, nkv), split_heads(v, nkv)    # -> (B, nh, T, hs), (B, nkv, T, hs)
    q, k, rope_cache = _model.rotate_forward(q, k, positions, config.rope_theta,
                                             config.rope_scaling, config.rope_layout)
    out, attend_cache = _model.attend_forward(q, k, v, params["o"], kv_cache, attn_mask)   # (B, T, C)
    return out, _model.AttentionCache(qkv_cache, rope_cache, attend_cache, qk_norm_cache)


def olmo2_attention_backward(dout, cache):
    """Gradients: dout (B, T, C) -> (dx (B, T, C), {"q", "k", "v", "o", "q_norm", "k_norm"}); the heads
    are merged before the QK-norm is undone, as it came before the split."""
    dq, dk, dv, do = _model.attend_backward(dout, cache.attend)               # (B, nh, T, hs), (B, nkv, T, hs)
    dq, dk = _model.rotate_backward(dq, dk, cache.rope)                       # (B, nh, T, hs), (B, nkv, T, hs)
    dq, dk, dv = merge_heads(dq), merge_heads(dk), merge_heads(dv)            # -> (B, T, nh*hs | nkv*hs)
    dq, dk, dqk_norm = qk_norm_backward(dq, dk, cache.qk_norm)                # undoes the QK-norm
    dx, dqkv = _model.qkv_backward(dq, dk, dv, cache.qkv)                     # (B, T, C)
    return dx, {**dqkv, "o": do, **dqk_norm}


# -- the block: norms after attention and after the MLP ---------------------------------------------

class Olmo2BlockCache(NamedTuple):
    """The four sub-caches, in forward order: each norm's after its sublayer's."""

    attn: _model.AttentionCache
    attn_norm: tuple         # the norm of attention's output
    mlp: tuple
    mlp_norm: tuple          # the norm of the MLP's output


def olmo2_block_forward(x, params, config, positions, *, attn_mask=None, kv_cache=None):
    """One block, as llama_block_forward's with the norms after: x (B, T, C) -> (B, T, C)."""
    # 1-3: x + rms_norm(attn(x)), the product w * xhat rounded once in float16 and bfloat16
    a, attn_cache = olmo2_attention_forward(x, params["attn"], config, positions, attn_mask=attn_mask,
                                            kv_cache=kv_cache)                 # (B, T, C)
    a, attn_norm_cache = rms_norm_forward(a, params["attn_norm"]["w"], config.rms_eps, round_xhat=False)   # (B, T, C)
    x = x + a
    # 4-6: x + rms_norm(swiglu(x))
    f, mlp_cache = swiglu_forward(x, params["mlp"])                                    # (B, T, C) via (B, T, H)
    f, mlp_norm_cache = rms_norm_forward(f, params["mlp_norm"]["w"], config.rms_eps, round_xhat=False)    # (B, T, C)
    out = x + f
    cache = Olmo2BlockCache(attn_cache, attn_norm_cache, mlp_cache, mlp_norm_cache)
    return out, cache


def olmo2_block_backward(dout, cache):
    """Gradients: dout (B, T, C) -> (dx (B, T, C), dparams like the block's params), each norm
    undone before the sublayer it follows."""
    # 6-4: undoes out = x + rms_norm(swiglu(x)): the norm (5), then the MLP (4), then the skip's dout (6).
    df, dmlp_norm = rms_norm_backward(dout, cache.mlp_norm)                   # (B, T, C)
    dx_mlp, dmlp = swiglu_backward(df, cache.mlp)                             # (B, T, C)
    dx = dx_mlp + dout                                                        # branch + skip
    # 3-1: undoes x = x + rms_norm(attn(x)) in the same way.
    da, dattn_norm = rms_norm_backward(dx, cache.attn_norm)                   # (B, T, C)
    dx_attn, dattn = olmo2_attention_backward(da, cache.attn)                 # (B, T, C)
    dparams = {"attn": dattn, "attn_norm": dattn_norm, "mlp": dmlp, "mlp_norm": dmlp_norm}
    return dx_attn + dx, dparams                                              # branch + skip


# -- the model ------------------------------------------------------------------------------------

def olmo2_forward(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
                  logits_to_keep=None, for_backward=True):
    """Logits for integer ``ids`` (B, T) -> (B, T, V), as llama_forward (same keywords) with
    OLMo 2's blocks. Returns ``(logits, cache)``."""
    return _model.decoder_forward(ids, params, config, Olmo2Config, olmo2_block_forward, positions=positions,
                                  attn_mask=attn_mask, kv_cache=kv_cache, rng=rng, logits_to_keep=logits_to_keep,
                                  for_backward=for_backward, norm_round_xhat=False)


olmo2_backward = _model.decoder_backward_of("olmo2", olmo2_block_backward)


FAMILY = Family(name="olmo2", title="OLMo 2", architectures=("Olmo2ForCausalLM",), config=Olmo2Config,
                forward=olmo2_forward, backward=olmo2_backward, kv_cache=llama_kv_cache, init_params=init_olmo2_params)
