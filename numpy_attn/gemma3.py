"""Gemma 3 (text): Gemma 2's model (numpy_attn/gemma2.py) with QK-norm per head, five local
layers in six, and a rotary base of their own for the local layers.

    q, k   = rms_norm(q), rms_norm(k)      per head, width hs, scaling by 1 + w, before RoPE
    RoPE   base rope_local_theta on the sliding layers, rope_theta (and its scaling) on the global ones

Gemma Team, "Gemma 3 Technical Report" (2025), section 2: Gemma 2's four norms per block, GeGLU,
scaled embedding, score scale and sliding window, with the soft caps replaced by QK-norm
(numpy_attn/qk_norm.py; ``blocks.i.attn.q_norm.w`` and ``k_norm.w``, (hs,), with Gemma's 1 + w),
and five sliding layers for each global one (``layer_types``; the global layers' longer
rotary wavelengths, a base of 1e6, serve the long context, the local ones keep 1e4). Everything
else, the block and the cache included (``gemma2_kv_cache``), is gemma2.py's.
"""

from dataclasses import dataclass
from functools import partial

import numpy as np

from numpy_attn import _model
from numpy_attn._checks import POSITIVE, check_config, check_rng
from numpy_attn._family import Family
from numpy_attn.gemma2 import (
    Gemma2Config,
    gemma2_block_backward,
    gemma2_block_forward,
    gemma2_kv_cache,
    gemma_decoder_forward,
    init_gemma2_params,
)
from numpy_attn.qk_norm import qk_norm_forward
from numpy_attn.qwen3 import qwen3_attention_backward


@dataclass(frozen=True)
class Gemma3Config(Gemma2Config):
    """Gemma2Config's fields and checks, no caps by default, q and k RMS-normed per head, and the
    local layers' rotary base."""

    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    rope_local_theta: float = 10000.0     # the sliding layers' base (Hugging Face's sliding_attention rope_theta)
    sliding_pattern = 6                   # by default five sliding layers, then a global one

    def __post_init__(self):
        super().__post_init__()
        for name, value in check_config(self, {"rope_local_theta": (float, POSITIVE)}).items():
            object.__setattr__(self, name, value)


def init_gemma3_params(config, rng, dtype=np.float32):
    """init_gemma2_params' tree with each attention's "q_norm" and "k_norm" {"w": (hs,)}, at 0 as
    every norm here (they scale by 1 + w)."""
    check_rng(rng, "init_gemma3_params")
    params = init_gemma2_params(config, rng, dtype)
    for block in params["blocks"].values():
        block["attn"]["q_norm"] = {"w": np.zeros(config.hs, dtype)}                    # (hs,)
        block["attn"]["k_norm"] = {"w": np.zeros(config.hs, dtype)}                    # (hs,)
    return params


# -- attention: Gemma 2's, with QK-norm per head and the local layers' own rotary base ---------------

def gemma3_attention_forward(x, params, config, positions, *, attn_mask=None, kv_cache=None, window=None):
    """gemma2_attention_forward with each head's q and k RMS-normed (1 + w) before the rotation,
    and a sliding layer (``window`` not None) rotating with rope_local_theta, unscaled:
    x (B, T, C) -> (B, T, C). Returns ``(out, cache)``; the backward is Qwen3's."""
    theta, scaling = (config.rope_theta, config.rope_scaling) if window is None else (config.rope_local_theta, None)
    q, k, v, qkv_cache = _model.heads_forward(x, params, config.n_head, config.n_kv_head)   # (B, nh | nkv, T, hs)
    q, k, qk_norm_cache = qk_norm_forward(q, k, params, config.rms_eps, offset=1.0)   # each head alone, 1 + w
    q, k, rope_cache = _model.rotate_forward(q, k, positions, theta, scaling, config.rope_layout)
    out, attend_cache = _model.attend_forward(q, k, v, params["o"], kv_cache, attn_mask, window=window,
                                              scale=config.query_pre_attn_scalar ** -0.5,
                                              softcap=config.attn_logit_softcap)   # (B, T, C)
    return out, _model.AttentionCache(qkv_cache, rope_cache, attend_cache, qk_norm_cache)


GEMMA3_ATTENTION = _model.Sublayer(gemma3_attention_forward, qwen3_attention_backward)


# -- the model: Gemma 2's blocks with Gemma 3's attention -----------------------------------------

def gemma3_forward(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
                   logits_to_keep=None, for_backward=True):
    """Logits for integer ``ids`` (B, T) -> (B, T, V), as gemma2_forward (same keywords, the cache
    from gemma2_kv_cache). Returns ``(logits, cache)``."""
    block_forward = partial(gemma2_block_forward, attention=GEMMA3_ATTENTION)
    return gemma_decoder_forward("gemma3", ids, params, config, Gemma3Config, block_forward,
                                 positions=positions, attn_mask=attn_mask, kv_cache=kv_cache, rng=rng,
                                 logits_to_keep=logits_to_keep, for_backward=for_backward)


gemma3_backward = _model.decoder_backward_of("gemma3", gemma2_block_backward)


FAMILY = Family(name="gemma3", title="Gemma 3", architectures=("Gemma3ForCausalLM",), config=Gemma3Config,
                forward=gemma3_forward, backward=gemma3_backward, kv_cache=gemma2_kv_cache,
                init_params=init_gemma3_params)
