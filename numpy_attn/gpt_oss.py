"""gpt-oss: the Llama-style model (numpy_attn/llama.py) with attention sinks, sliding and full
layers, YaRN and a mixture of experts in place of the MLP.

    x      = wte[ids]
    x      = x + attn(rms_norm(x))           q, k, v, o with biases; one learned sink per query head
    x      = x + moe(rms_norm(x))            top-k of E clamped-GLU experts (the two lines once per block)
    x      = rms_norm(x)
    logits = x @ head.w

OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card" (2025), section 2.1, and transformers'
``GptOssForCausalLM``. Attention is llama.py's (grouped-query heads, RoPE in the "half" layout)
with biases on the four projections and ``blocks.i.attn.sinks`` (nh,): each head's sink logit joins
the softmax of every query row and takes a share of its weight: attention's output times
sigmoid(lse - s_h) per row (numpy_attn/attention_sinks.py, through _model.py's
``attend_forward``). The layers whose ``layer_types`` entry is "sliding_attention" (every
other one, from the first) see only their last ``sliding_window`` keys, and ``gpt_oss_kv_cache``
keeps only that many for them.
The rotary frequencies are YaRN's (``rope_scaling`` {"rope_type": "yarn", ...},
numpy_attn/rope.py). The MLP is numpy_attn/moe.py's ``gpt_oss_moe_forward``: a router with bias
picks ``experts_per_token`` of ``n_experts`` experts per token and softmaxes their logits; each
expert is (up + 1) * gate * sigmoid(alpha * gate) with gate and up clamped at ``swiglu_limit``,
with biases (``blocks.i.mlp``: {"router", "experts"}). The choice of experts is piecewise constant:
the backward flows through the chosen experts and the routing weights (moe.py). The rest (the
keywords, the embedding, the untied head) is llama.py's and numpy_attn/_model.py's. In float16
and bfloat16 every norm rounds the product w * xhat once (``round_xhat=False``), where Llama's
rounds xhat first.
"""

import math
from dataclasses import dataclass

import numpy as np

from numpy_attn import _model
from numpy_attn._checks import POSITIVE, check_config, check_rng
from numpy_attn._family import Family
from numpy_attn.llama import LlamaConfig, init_llama_params, llama_block_backward, llama_block_forward
from numpy_attn.moe import gpt_oss_moe_backward, gpt_oss_moe_forward, init_gpt_oss_moe_params


@dataclass(frozen=True)
class GptOssConfig(LlamaConfig):
    """LlamaConfig's fields and checks (``hidden`` is each expert's width), biases on attention,
    and gpt-oss's own fields (Hugging Face's names in the comments)."""

    attn_bias: bool = True
    n_experts: int = 4                 # E (num_local_experts)
    experts_per_token: int = 2         # k (num_experts_per_tok)
    swiglu_alpha: float = 1.702        # alpha of the experts' sigmoid(alpha * gate)
    swiglu_limit: float = 7.0          # the clamp of gate (above) and up (both sides)
    sliding_window: int = 4            # w of the sliding layers: query i sees keys i - w < j <= i
    layer_types: tuple | None = None   # per layer, "sliding_attention" or "full_attention";
    #                                    None alternates, the first sliding (as Hugging Face)

    def __post_init__(self):
        super().__post_init__()
        for name, value in check_config(self, {
                "n_experts": (int, 1), "experts_per_token": (int, 1), "swiglu_alpha": (float, None),
                "swiglu_limit": (float, POSITIVE), "sliding_window": (int, 1)}).items():
            object.__setattr__(self, name, value)
        if not math.isfinite(self.swiglu_alpha):
            raise ValueError(f"GptOssConfig.swiglu_alpha must be a finite number, got {self.swiglu_alpha!r}")
        if self.experts_per_token > self.n_experts:
            raise ValueError(f"GptOssConfig.experts_per_token = {self.experts_per_token} must be at most "
                             f"n_experts = {self.n_experts}")
        object.__setattr__(self, "layer_types", _model.layer_types(self, 2))  # None: the first sliding, then full

    def window(self, i):
        """Layer i's window: sliding_window for a sliding layer, None for a full one."""
        return self.sliding_window if self.layer_types[i] == "sliding_attention" else None


def init_gpt_oss_params(config, rng, dtype=np.float32):
    """init_llama_params' tree (with the attention's biases) with each block's "mlp" a mixture of
    experts (moe.py's init_gpt_oss_moe_params: {"router", "experts"}) and "attn.sinks" (nh,) drawn
    from N(0, 0.02^2), as Hugging Face initialises them."""
    check_rng(rng, "init_gpt_oss_params")
    params = init_llama_params(config, rng, dtype)
    for block in params["blocks"].values():
        block["attn"]["sinks"] = rng.normal(0, 0.02, config.n_head).astype(dtype)          # (nh,)
        block["mlp"] = init_gpt_oss_moe_params(config.n_embd, config.hidden, config.n_experts, rng, dtype)
    return params


# -- attention: Llama's, with a sink per head and sliding layers -----------------------------------

def gpt_oss_attention_forward(x, params, config, positions, *, attn_mask=None, kv_cache=None, window=None):
    """llama_attention_forward with each query head's sink logit ``params["sinks"]`` (nh,) in its
    softmax, each query seeing its last ``window`` keys on a sliding layer (None on a full one):
    x (B, T, C) -> (B, T, C). Returns ``(out, cache)``."""
    q, k, v, qkv_cache = _model.heads_forward(x, params, config.n_head, config.n_kv_head)   # (B, nh | nkv, T, hs)
    q, k, rope_cache = _model.rotate_forward(q, k, positions, config.rope_theta,
                                             config.rope_scaling, config.rope_layout)
    out, attend_cache = _model.attend_forward(q, k, v, params["o"], kv_cache, attn_mask, window=window,
                                              sinks=params["sinks"])          # (B, T, C)
    return out, _model.AttentionCache(qkv_cache, rope_cache, attend_cache)


def gpt_oss_attention_backward(dout, cache):
    """Gradients: dout (B, T, C) -> (dx (B, T, C), {"q", "k", "v", "o", "sinks"} like the params)."""
    dq, dk, dv, do, dsinks = _model.attend_backward(dout, cache.attend)       # dsinks (nh,)
    dq, dk = _model.rotate_backward(dq, dk, cache.rope)                       # (B, nh, T, hs), (B, nkv, T, hs)
    dx, dqkv = _model.heads_backward(dq, dk, dv, cache.qkv)                   # (B, T, C)
    return dx, {**dqkv, "o": do, "sinks": dsinks}


GPT_OSS_ATTENTION = _model.Sublayer(gpt_oss_attention_forward, gpt_oss_attention_backward)


# -- the block: Llama's, with attention with sinks and the mixture of experts -----------------------

def gpt_oss_mlp_forward(h, params, config):
    """The mixture of experts with the config's routing: h (B, T, C) -> (B, T, C) via k experts."""
    return gpt_oss_moe_forward(h, params, config.experts_per_token, config.swiglu_alpha, config.swiglu_limit)


GPT_OSS_MOE = _model.Sublayer(gpt_oss_mlp_forward, gpt_oss_moe_backward)


def gpt_oss_block_forward(x, params, config, positions, *, attn_mask=None, kv_cache=None, window=None):
    """One block: x (B, T, C) -> (B, T, C), Llama's with gpt-oss's attention (``window`` None for a
    full layer) and mixture of experts, every norm's product w * xhat rounded once in float16 and
    bfloat16. Returns ``(out, cache)``; llama_block_backward undoes it (the cache names the sublayers)."""
    return llama_block_forward(x, params, config, positions, attn_mask=attn_mask, kv_cache=kv_cache,
                               attention=GPT_OSS_ATTENTION, mlp=GPT_OSS_MOE, round_xhat=False, window=window)


gpt_oss_block_backward = llama_block_backward


# -- the model ------------------------------------------------------------------------------------

gpt_oss_kv_cache = _model.sliding_kv_cache   # a full layer holds every token, a sliding layer its last window


def gpt_oss_forward(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
                    logits_to_keep=None, for_backward=True):
    """Logits for integer ``ids`` (B, T) -> (B, T, V), as llama_forward (same keywords) with gpt-oss's
    blocks; ``kv_cache`` from gpt_oss_kv_cache (its sliding layers hold their window only). Returns
    ``(logits, cache)``."""
    _model.check_mask_with_windows("gpt_oss", attn_mask, kv_cache)
    return _model.decoder_forward(ids, params, config, GptOssConfig, gpt_oss_block_forward, positions=positions,
                                  attn_mask=attn_mask, kv_cache=kv_cache, rng=rng, logits_to_keep=logits_to_keep,
                                  for_backward=for_backward, norm_round_xhat=False,
                                  layer_options=lambda i: {"window": config.window(i)})


gpt_oss_backward = _model.decoder_backward_of("gpt_oss", gpt_oss_block_backward)


FAMILY = Family(name="gpt_oss", title="gpt-oss", architectures=("GptOssForCausalLM",), config=GptOssConfig,
                forward=gpt_oss_forward, backward=gpt_oss_backward, kv_cache=gpt_oss_kv_cache,
                init_params=init_gpt_oss_params)
