"""OLMo 2 in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/olmo2.py: torch_attn/llama.py's model with blocks x + rms_norm(attn(x)) and
x + rms_norm(swiglu(x)), whose attention RMS-norms q and k over the whole projection (the
config's qk_norm, "projection") before splitting them into heads; its cache is llama_kv_cache.
"""

from torch_attn.llama import decoder, llama_attention
from torch_attn.rms_norm import rms_norm
from torch_attn.swiglu import swiglu

# -- the block: norms after attention and after the MLP ---------------------------------------------

def olmo2_block(x, params, config, positions, *, attn_mask=None, kv_cache=None):
    """One block: x (B, T, C) -> (B, T, C); ``attn_mask`` and ``kv_cache`` go to attention."""
    # 1-3: x + rms_norm(attn(x))
    a = llama_attention(x, params["attn"], config, positions, attn_mask=attn_mask,
                        kv_cache=kv_cache)                                    # (B, T, C)
    a = rms_norm(a, params["attn_norm"]["w"], config.rms_eps, round_xhat=config.norm_round_xhat)   # (B, T, C)
    x = x + a
    # 4-6: x + rms_norm(swiglu(x))
    f = swiglu(x, params["mlp"])                                              # (B, T, C) via (B, T, H)
    f = rms_norm(f, params["mlp_norm"]["w"], config.rms_eps, round_xhat=config.norm_round_xhat)   # (B, T, C)
    out = x + f
    return out


# -- the model ------------------------------------------------------------------------------------

def olmo2(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
          logits_to_keep=None):
    """Logits for integer ``ids`` (B, T) -> (B, T, V); keywords as llama's."""
    return decoder(ids, params, config, olmo2_block, positions=positions,
                   attn_mask=attn_mask, kv_cache=kv_cache, logits_to_keep=logits_to_keep)


# Equals Hugging Face's transformers.Olmo2ForCausalLM(...).logits holding the same weights;
# parity_tests/test_olmo2.py checks it in float32 and float64, and through saved checkpoints.
