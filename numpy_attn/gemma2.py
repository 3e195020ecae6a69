"""Gemma 2: the Llama-style model (numpy_attn/llama.py) with four norms per block, GeGLU,
softcapped scores and logits, and layers alternating between sliding and global attention.

    x      = wte[ids] * sqrt(C)                       sqrt(C) rounded to the model's dtype first
    x      = x + rms_norm(attn(rms_norm(x)))          scores q.k * query_pre_attn_scalar^-0.5, capped
    x      = x + rms_norm(geglu(rms_norm(x)))         (the two lines above once per block)
    x      = rms_norm(x)                              every norm scales by 1 + w
    logits = c * tanh((x @ wte^T) / c)                c = final_logit_softcap

Gemma Team, "Gemma 2: Improving Open Language Models at a Practical Size" (2024), section 2: each
sublayer's input and output are RMS-normed (weights ``blocks.i.attn_norm``, ``attn_post_norm``,
``mlp_norm``, ``mlp_post_norm``: Hugging Face's input, post-attention, pre-feedforward and
post-feedforward layernorms), scaled by 1 + w (numpy_attn/rms_norm.py's ``offset=1.0``, the
weights stored minus one, so they start at 0); the MLP is GeGLU with the tanh GELU
(numpy_attn/swiglu.py); the scores are capped by c * tanh(s / c) before the mask
(``attn_logit_softcap``, numpy_attn/softcap.py) and so are the logits (``final_logit_softcap``);
the layers whose ``layer_types`` entry is "sliding_attention" (every other one, from the first)
see only their last ``sliding_window`` keys, and ``gemma2_kv_cache`` keeps only that many for
them. The head is the embedding, transposed. The rest (attention's steps, the keywords) is
llama.py's and numpy_attn/_model.py's.
"""

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from numpy_attn import _model
from numpy_attn._checks import POSITIVE, check_config, check_rng
from numpy_attn._family import Family
from numpy_attn.llama import LlamaConfig, init_llama_params, llama_attention_backward
from numpy_attn.rms_norm import rms_norm_backward, rms_norm_forward
from numpy_attn.swiglu import swiglu_backward, swiglu_forward


@dataclass(frozen=True)
class Gemma2Config(LlamaConfig):
    """LlamaConfig's fields and checks, and Gemma 2's own (Hugging Face's names where they say the same)."""

    tie_weights: bool = True
    query_pre_attn_scalar: float = 8.0        # the scores are scaled by its inverse square root
    attn_logit_softcap: float | None = 50.0   # c inside attention (attn_logit_softcapping); None: no cap
    final_logit_softcap: float | None = 30.0  # c on the logits (final_logit_softcapping); None: no cap
    sliding_window: int = 4                   # w of the sliding layers: query i sees keys i - w < j <= i
    layer_types: tuple | None = None          # per layer, "sliding_attention" or "full_attention";
    #                                           None alternates, the first sliding (as Hugging Face)
    sliding_pattern = 2                       # by default every 2nd layer is global (Gemma 3: every 6th)

    def __post_init__(self):
        super().__post_init__()
        for name, value in check_config(self, {
                "query_pre_attn_scalar": (float, POSITIVE), "attn_logit_softcap": (float | None, POSITIVE),
                "final_logit_softcap": (float | None, POSITIVE), "sliding_window": (int, 1)}).items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "layer_types", _model.layer_types(self, self.sliding_pattern))

    def window(self, i):
        """Layer i's window: sliding_window for a sliding layer, None for a global one."""
        return self.sliding_window if self.layer_types[i] == "sliding_attention" else None


def init_gemma2_params(config, rng, dtype=np.float32):
    """init_llama_params' tree with each block's two norms after the sublayers ("attn_post_norm",
    "mlp_post_norm"); every norm's weight starts at 0, as the norms scale by 1 + w."""
    check_rng(rng, "init_gemma2_params")
    params = init_llama_params(config, rng, dtype)
    params["norm"]["w"][:] = 0
    for block in params["blocks"].values():
        C = block["attn_norm"]["w"].shape[0]
        block["attn_norm"]["w"][:] = 0
        block["mlp_norm"]["w"][:] = 0
        block["attn_post_norm"] = {"w": np.zeros(C, dtype)}
        block["mlp_post_norm"] = {"w": np.zeros(C, dtype)}
    return params


# -- attention: Llama's, with its own score scale, capped scores and sliding layers -----------------

def gemma2_attention_forward(x, params, config, positions, *, attn_mask=None, kv_cache=None, window=None):
    """llama_attention_forward with the scores scaled by query_pre_attn_scalar^-0.5 and capped at
    c * tanh(s / c) before the mask, each query seeing its last ``window`` keys on a sliding layer
    (None on a global one): x (B, T, C) -> (B, T, C). Returns ``(out, cache)``; the backward is Llama's."""
    q, k, v, qkv_cache = _model.heads_forward(x, params, config.n_head, config.n_kv_head)   # (B, nh | nkv, T, hs)
    q, k, rope_cache = _model.rotate_forward(q, k, positions, config.rope_theta,
                                             config.rope_scaling, config.rope_layout)
    out, attend_cache = _model.attend_forward(q, k, v, params["o"], kv_cache, attn_mask, window=window,
                                              scale=config.query_pre_attn_scalar ** -0.5,
                                              softcap=config.attn_logit_softcap)   # (B, T, C)
    return out, _model.AttentionCache(qkv_cache, rope_cache, attend_cache)


GEMMA2_ATTENTION = _model.Sublayer(gemma2_attention_forward, llama_attention_backward)


# -- the block: a norm before and after each sublayer -----------------------------------------------

class Gemma2BlockCache(NamedTuple):
    """The six sub-caches, in forward order, and what undoes the attention."""

    attn_norm: tuple
    attn: _model.AttentionCache
    attn_post_norm: tuple
    mlp_norm: tuple
    mlp: tuple
    mlp_post_norm: tuple
    attn_backward: object = llama_attention_backward


def gemma2_block_forward(x, params, config, positions, *, attn_mask=None, kv_cache=None, window=None,
                         attention=GEMMA2_ATTENTION):
    """One block: x (B, T, C) -> (B, T, C). Returns ``(out, cache)``; ``attn_mask``, ``kv_cache``
    (this block's layer) and ``window`` (None for a global layer) go to ``attention`` (a Sublayer:
    Gemma 2's, or Gemma 3's). Every norm scales by 1 + w."""
    eps = config.rms_eps
    # 1-4: x + rms_norm(attn(rms_norm(x)))
    h, attn_norm_cache = rms_norm_forward(x, params["attn_norm"]["w"], eps, 1.0)          # (B, T, C)
    a, attn_cache = attention.forward(h, params["attn"], config, positions, attn_mask=attn_mask,
                                      kv_cache=kv_cache, window=window)                    # (B, T, C)
    a, attn_post_norm_cache = rms_norm_forward(a, params["attn_post_norm"]["w"], eps, 1.0)  # (B, T, C)
    x = x + a
    # 5-8: x + rms_norm(geglu(rms_norm(x)))
    h, mlp_norm_cache = rms_norm_forward(x, params["mlp_norm"]["w"], eps, 1.0)            # (B, T, C)
    f, mlp_cache = swiglu_forward(h, params["mlp"], act="gelu_tanh")                   # (B, T, C) via (B, T, H)
    f, mlp_post_norm_cache = rms_norm_forward(f, params["mlp_post_norm"]["w"], eps, 1.0)  # (B, T, C)
    out = x + f
    cache = Gemma2BlockCache(attn_norm_cache, attn_cache, attn_post_norm_cache, mlp_norm_cache, mlp_cache,
                             mlp_post_norm_cache, attention.backward)
    return out, cache


def gemma2_block_backward(dout, cache):
    """Gradients: dout (B, T, C) -> (dx (B, T, C), dparams like the block's params)."""
    # 8-5: undoes out = x + rms_norm(geglu(rms_norm(x))), the last step first; x also fed the skip.
    df, dmlp_post_norm = rms_norm_backward(dout, cache.mlp_post_norm)        # (B, T, C)
    dh, dmlp = swiglu_backward(df, cache.mlp)                                # (B, T, C)
    dx_mlp, dmlp_norm = rms_norm_backward(dh, cache.mlp_norm)                # (B, T, C)
    dx = dx_mlp + dout                                                       # branch + skip
    # 4-1: undoes x = x + rms_norm(attn(rms_norm(x))) in the same way.
    da, dattn_post_norm = rms_norm_backward(dx, cache.attn_post_norm)        # (B, T, C)
    dh, dattn = cache.attn_backward(da, cache.attn)                          # (B, T, C)
    dx_attn, dattn_norm = rms_norm_backward(dh, cache.attn_norm)             # (B, T, C)
    dparams = {"attn_norm": dattn_norm, "attn": dattn, "attn_post_norm": dattn_post_norm,
               "mlp_norm": dmlp_norm, "mlp": dmlp, "mlp_post_norm": dmlp_post_norm}
    return dx_attn + dx, dparams                                             # branch + skip


# -- the model ------------------------------------------------------------------------------------

gemma2_kv_cache = _model.sliding_kv_cache   # a full layer holds every token, a sliding layer its last window


def gemma2_forward(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
                   logits_to_keep=None, for_backward=True):
    """Logits for integer ``ids`` (B, T) -> (B, T, V), as llama_forward (same keywords) with Gemma
    2's blocks, scaled embedding and capped logits; ``kv_cache`` from gemma2_kv_cache. Returns
    ``(logits, cache)``."""
    return gemma_decoder_forward("gemma2", ids, params, config, Gemma2Config, gemma2_block_forward,
                                 positions=positions, attn_mask=attn_mask, kv_cache=kv_cache, rng=rng,
                                 logits_to_keep=logits_to_keep, for_backward=for_backward)


def gemma_decoder_forward(op, ids, params, config, config_class, block_forward, **keywords):
    """decoder_forward with what the Gemmas change around the blocks: the embedding times sqrt(C),
    the final norm's 1 + w, the logits capped at final_logit_softcap (None: no cap), and each
    layer's window; ``op`` names the model in the message about a mask with a sliding cache."""
    _model.check_mask_with_windows(op, keywords["attn_mask"], keywords["kv_cache"])
    return _model.decoder_forward(ids, params, config, config_class, block_forward, **keywords,
                                  embed_scale=config.n_embd ** 0.5, norm_offset=1.0,
                                  logit_softcap=config.final_logit_softcap,
                                  layer_options=lambda i: {"window": config.window(i)})


gemma2_backward = _model.decoder_backward_of("gemma2", gemma2_block_backward)


FAMILY = Family(name="gemma2", title="Gemma 2", architectures=("Gemma2ForCausalLM",), config=Gemma2Config,
                forward=gemma2_forward, backward=gemma2_backward, kv_cache=gemma2_kv_cache,
                init_params=init_gemma2_params)
