"""Gemma 2 in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/gemma2.py: blocks x + rms_norm(attn(rms_norm(x))) and
x + rms_norm(geglu(rms_norm(x))), every norm scaling by 1 + w, attention with its own score scale,
capped scores and sliding layers, inside torch_attn/_model.py's ``decoder`` with the embedding
times sqrt(C) and capped logits; its cache is gemma2_kv_cache.
"""


from torch_attn import _model
from torch_attn.rms_norm import rms_norm
from torch_attn.swiglu import swiglu

# -- attention: Llama's, with its own score scale, capped scores and sliding layers -----------------

def gemma2_attention(x, params, config, positions, *, attn_mask=None, kv_cache=None, window=None):
    """llama_attention with the scores scaled by query_pre_attn_scalar^-0.5 and capped, on a
    sliding layer each query seeing its last ``window`` keys: x (B, T, C) -> (B, T, C)."""
    q, k, v = _model.heads(x, params, config.n_head, config.n_kv_head)        # (B, nh | nkv, T, hs)
    q, k = _model.rotate(q, k, positions, config.rope_theta, config.rope_scaling, config.rope_layout)
    out = _model.attend(q, k, v, params["o"], kv_cache, attn_mask, window=window,
                        scale=config.query_pre_attn_scalar ** -0.5,
                        softcap=config.attn_logit_softcap)                    # (B, T, C)
    return out


# -- the block: a norm before and after each sublayer -----------------------------------------------

def gemma2_block(x, params, config, positions, *, attn_mask=None, kv_cache=None, window=None,
                 attention=gemma2_attention):
    """One block: x (B, T, C) -> (B, T, C); ``attn_mask``, ``kv_cache`` and ``window`` go to ``attention``."""
    eps = config.rms_eps
    # 1-4: x + rms_norm(attn(rms_norm(x)))
    h = rms_norm(x, params["attn_norm"]["w"], eps, 1.0)                       # (B, T, C)
    a = attention(h, params["attn"], config, positions, attn_mask=attn_mask,
                  kv_cache=kv_cache, window=window)                           # (B, T, C)
    a = rms_norm(a, params["attn_post_norm"]["w"], eps, 1.0)                  # (B, T, C)
    x = x + a
    # 5-8: x + rms_norm(geglu(rms_norm(x)))
    h = rms_norm(x, params["mlp_norm"]["w"], eps, 1.0)                        # (B, T, C)
    f = swiglu(h, params["mlp"], act="gelu_tanh")                             # (B, T, C) via (B, T, H)
    f = rms_norm(f, params["mlp_post_norm"]["w"], eps, 1.0)                   # (B, T, C)
    out = x + f
    return out


# -- the model ------------------------------------------------------------------------------------

gemma2_kv_cache = _model.sliding_kv_cache   # a full layer holds every token, a sliding layer its last window


def gemma2(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
           logits_to_keep=None):
    """Logits for integer ``ids`` (B, T) -> (B, T, V); keywords as llama's, ``kv_cache`` from gemma2_kv_cache."""
    return gemma_decoder(ids, params, config, gemma2_block, positions=positions,
                         attn_mask=attn_mask, kv_cache=kv_cache, logits_to_keep=logits_to_keep)


def gemma_decoder(ids, params, config, block, **keywords):
    """decoder with the Gemmas' embedding times sqrt(C), final norm's 1 + w, capped logits and windows."""
    return _model.decoder(ids, params, config, block, **keywords,
                          embed_scale=config.n_embd ** 0.5, norm_offset=1.0,
                          logit_softcap=config.final_logit_softcap,
                          layer_options=lambda i: {"window": config.window(i)})


# Equals Hugging Face's transformers.Gemma2ForCausalLM(...).logits holding the same weights;
# parity_tests/test_gemma2.py checks it in float32 and float64, and through saved checkpoints.
