"""OLMo 2: the Llama-style model (numpy_attn/llama.py) with its norms after the sublayers, and
QK-norm over the whole projection.

    x      = x + rms_norm(attn(x))          q, k = rms_norm(q), rms_norm(k) before the head split
    x      = x + rms_norm(swiglu(x))        (the two lines above once per block)

Team OLMo, "2 OLMo 2 Furious" (2024): the block's input reaches attention and the
MLP unnormed, and their outputs are normed before joining the residual stream (weights
``blocks.i.attn_norm.w`` and ``mlp_norm.w`` (C,), Hugging Face's post_attention_layernorm and
post_feedforward_layernorm); q and k are RMS-normed across all their heads at once, widths
nh * hs and nkv * hs, before they are split into heads and rotated. The embedding, the final norm,
the head, the cache and the keywords are llama.py's, and so are the parameters'
initialisation (``init_llama_params``, which gives an Olmo2Config's q and k norms their widths)
and the key/value cache (``llama_kv_cache``).
"""

from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from numpy_attn.llama import (
    LlamaAttentionCache,
    LlamaConfig,
    decoder_backward,
    decoder_forward,
    llama_attention_backward,
    llama_attention_forward,
)
from numpy_attn.rms_norm import rms_norm_backward, rms_norm_forward
from numpy_attn.swiglu import swiglu_backward, swiglu_forward


@dataclass(frozen=True)
class Olmo2Config(LlamaConfig):
    """LlamaConfig's fields and checks; q and k are RMS-normed over the whole projection."""

    qk_norm: ClassVar[str] = "projection"
    norm_round_xhat = False   # Olmo2RMSNorm rounds (w * xhat) once, not xhat first as LlamaRMSNorm


# -- the block: norms after attention and after the MLP ---------------------------------------------

class Olmo2BlockCache(NamedTuple):
    """The four sub-caches, in forward order: each norm's after its sublayer's."""

    attn: LlamaAttentionCache
    attn_norm: tuple         # the norm of attention's output
    mlp: tuple
    mlp_norm: tuple          # the norm of the MLP's output


def olmo2_block_forward(x, params, config, positions, *, attn_mask=None, kv_cache=None):
    """One block, as llama_block_forward's with the norms after: x (B, T, C) -> (B, T, C)."""
    # 1-3: x + rms_norm(attn(x))
    a, attn_cache = llama_attention_forward(x, params["attn"], config, positions, attn_mask=attn_mask,
                                            kv_cache=kv_cache)                 # (B, T, C)
    a, attn_norm_cache = rms_norm_forward(a, params["attn_norm"]["w"], config.rms_eps,
                                          round_xhat=config.norm_round_xhat)   # (B, T, C)
    x = x + a
    # 4-6: x + rms_norm(swiglu(x))
    f, mlp_cache = swiglu_forward(x, params["mlp"])                                    # (B, T, C) via (B, T, H)
    f, mlp_norm_cache = rms_norm_forward(f, params["mlp_norm"]["w"], config.rms_eps,
                                         round_xhat=config.norm_round_xhat)   # (B, T, C)
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
    dx_attn, dattn = llama_attention_backward(da, cache.attn)                 # (B, T, C)
    dparams = {"attn": dattn, "attn_norm": dattn_norm, "mlp": dmlp, "mlp_norm": dmlp_norm}
    return dx_attn + dx, dparams                                              # branch + skip


# -- the model ------------------------------------------------------------------------------------

def olmo2_forward(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
                  logits_to_keep=None, for_backward=True):
    """Logits for integer ``ids`` (B, T) -> (B, T, V), as llama_forward (same keywords) with
    OLMo 2's blocks. Returns ``(logits, cache)``."""
    return decoder_forward(ids, params, config, Olmo2Config, olmo2_block_forward, positions=positions,
                           attn_mask=attn_mask, kv_cache=kv_cache, rng=rng,
                           logits_to_keep=logits_to_keep, for_backward=for_backward)


def olmo2_backward(dlogits, cache):
    """Gradients: dlogits (B, T, V) -> dparams, with the nesting of the params."""
    return decoder_backward("olmo2", dlogits, cache, olmo2_block_backward)
