"""OLMo 2 in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/olmo2.py: blocks x + rms_norm(attn(x)) and x + rms_norm(swiglu(x)), whose
attention RMS-norms q and k over the whole projection (torch_attn/qk_norm.py) before splitting
them into heads, every norm rounding w * xhat once; its cache is llama_kv_cache.
"""

from torch_attn import _model
from torch_attn.multi_head import split_heads
from torch_attn.qk_norm import qk_norm
from torch_attn.rms_norm import rms_norm
from torch_attn.swiglu import swiglu

# -- attention: q and k normed across all their heads, before the split ------------------------------

def olmo2_attention(x, params, config, positions, *, attn_mask=None, kv_cache=None):
    """llama_attention with QK-norm over the projection: x (B, T, C) -> (B, T, C)."""
    nh, nkv = config.n_head, config.n_kv_head
    q, k, v = _model.qkv(x, params)                                           # (B, T, C) -> (B, T, nh*hs | nkv*hs)
    q, k = qk_norm(q, k, params, config.rms_eps, round_xhat=False)            # widths nh*hs, nkv*hs
    q, k, v = split_heads(q, nh), split_heads(k, nkv), split_heads(v, nkv)    # -> (B, nh, T, hs), (B, nkv, T, hs)
    q, k = _model.rotate(q, k, positions, config.rope_theta, config.rope_scaling, config.rope_layout)
    out = _model.attend(q, k, v, params["o"], kv_cache, attn_mask)            # (B, T, C)
    return out


# -- the block: norms after attention and after the MLP ---------------------------------------------

def olmo2_block(x, params, config, positions, *, attn_mask=None, kv_cache=None):
    """One block: x (B, T, C) -> (B, T, C); ``attn_mask`` and ``kv_cache`` go to attention."""
    # 1-3: x + rms_norm(attn(x)), the product w * xhat rounded once in float16 and bfloat16
    a = olmo2_attention(x, params["attn"], config, positions, attn_mask=attn_mask,
                        kv_cache=kv_cache)                                    # (B, T, C)
    a = rms_norm(a, params["attn_norm"]["w"], config.rms_eps, round_xhat=False)   # (B, T, C)
    x = x + a
    # 4-6: x + rms_norm(swiglu(x))
    f = swiglu(x, params["mlp"])                                              # (B, T, C) via (B, T, H)
    f = rms_norm(f, params["mlp_norm"]["w"], config.rms_eps, round_xhat=False)    # (B, T, C)
    out = x + f
    return out


# -- the model ------------------------------------------------------------------------------------

def olmo2(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
          logits_to_keep=None):
    """Logits for integer ``ids`` (B, T) -> (B, T, V); keywords as llama's."""
    return _model.decoder(ids, params, config, olmo2_block, positions=positions, attn_mask=attn_mask,
                          kv_cache=kv_cache, logits_to_keep=logits_to_keep, norm_round_xhat=False)


# Equals Hugging Face's transformers.Olmo2ForCausalLM(...).logits holding the same weights;
# parity_tests/test_olmo2.py checks it in float32 and float64, and through saved checkpoints.
