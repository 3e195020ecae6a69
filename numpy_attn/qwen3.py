"""Qwen3: the Llama-style model (numpy_attn/llama.py) with QK-norm per head.

    q, k   = rms_norm(q), rms_norm(k)      per head, width hs, after the projection, before RoPE

Qwen Team, "Qwen3 Technical Report" (2025), section 2: Qwen2's grouped-query attention without
the bias on q, k and v, with an RMS norm of width hs on each head's query and key instead
(numpy_attn/qk_norm.py; weights ``blocks.i.attn.q_norm.w`` and ``k_norm.w``, (hs,), shared by the
heads). Everything else is llama.py's: the block, the keywords and the key/value cache
(``llama_kv_cache``); what stands here is what Qwen3 changes. The head size is its own setting
(Hugging Face's ``head_dim``, 128 in the released models whatever the width). Qwen3's optional
sliding window is not implemented.
"""

from dataclasses import dataclass
from functools import partial

import numpy as np

from numpy_attn import _model
from numpy_attn._checks import check_rng
from numpy_attn._family import Family
from numpy_attn.llama import LlamaConfig, init_llama_params, llama_block_backward, llama_block_forward, llama_kv_cache
from numpy_attn.qk_norm import qk_norm_backward, qk_norm_forward


@dataclass(frozen=True)
class Qwen3Config(LlamaConfig):
    """LlamaConfig's fields and checks; q and k are RMS-normed per head."""


def init_qwen3_params(config, rng, dtype=np.float32):
    """init_llama_params' tree with each attention's "q_norm" and "k_norm" {"w": (hs,)}, at 1."""
    check_rng(rng, "init_qwen3_params")
    params = init_llama_params(config, rng, dtype)
    for block in params["blocks"].values():   # the norms start at 1, as the others
        block["attn"]["q_norm"] = {"w": np.ones(config.hs, dtype)}                     # (hs,)
        block["attn"]["k_norm"] = {"w": np.ones(config.hs, dtype)}                     # (hs,)
    return params


# -- attention: Llama's, with each head's q and k normed before the rotation -------------------------

def qwen3_attention_forward(x, params, config, positions, *, attn_mask=None, kv_cache=None):
    """llama_attention_forward with QK-norm per head: x (B, T, C) -> (B, T, C). Returns ``(out, cache)``."""
    q, k, v, qkv_cache = _model.heads_forward(x, params, config.n_head, config.n_kv_head)   # (B, nh | nkv, T, hs)
    q, k, qk_norm_cache = qk_norm_forward(q, k, params, config.rms_eps)       # each head alone, width hs
    q, k, rope_cache = _model.rotate_forward(q, k, positions, config.rope_theta,
                                             config.rope_scaling, config.rope_layout)
    out, attend_cache = _model.attend_forward(q, k, v, params["o"], kv_cache, attn_mask)   # (B, T, C)
    return out, _model.AttentionCache(qkv_cache, rope_cache, attend_cache, qk_norm_cache)


def qwen3_attention_backward(dout, cache):
    """Gradients: dout (B, T, C) -> (dx (B, T, C), {"q", "k", "v", "o", "q_norm", "k_norm"})."""
    dq, dk, dv, do = _model.attend_backward(dout, cache.attend)               # (B, nh, T, hs), (B, nkv, T, hs)
    dq, dk = _model.rotate_backward(dq, dk, cache.rope)                       # (B, nh, T, hs), (B, nkv, T, hs)
    dq, dk, dqk_norm = qk_norm_backward(dq, dk, cache.qk_norm)                # undoes the per-head QK-norm
    dx, dqkv = _model.heads_backward(dq, dk, dv, cache.qkv)                   # (B, T, C)
    return dx, {**dqkv, "o": do, **dqk_norm}


QWEN3_ATTENTION = _model.Sublayer(qwen3_attention_forward, qwen3_attention_backward)


# -- the model: Llama's blocks with Qwen3's attention ---------------------------------------------

def qwen3_forward(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
                  logits_to_keep=None, for_backward=True):
    """Logits for integer ``ids`` (B, T) -> (B, T, V), as llama_forward (same keywords). Returns
    ``(logits, cache)``."""
    block_forward = partial(llama_block_forward, attention=QWEN3_ATTENTION)
    return _model.decoder_forward(ids, params, config, Qwen3Config, block_forward, positions=positions,
                                  attn_mask=attn_mask, kv_cache=kv_cache, rng=rng,
                                  logits_to_keep=logits_to_keep, for_backward=for_backward)


qwen3_backward = _model.decoder_backward_of("qwen3", llama_block_backward)


FAMILY = Family(name="qwen3", title="Qwen3", architectures=("Qwen3ForCausalLM",), config=Qwen3Config,
                forward=qwen3_forward, backward=qwen3_backward, kv_cache=llama_kv_cache, init_params=init_qwen3_params)
