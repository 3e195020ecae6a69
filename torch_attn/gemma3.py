"""Gemma 3 (text) in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/gemma3.py: torch_attn/gemma2.py's blocks with Gemma 3's attention, whose q and k
are RMS-normed per head (1 + w) and whose sliding layers rotate with their own base; its cache is
gemma2_kv_cache.
"""

from functools import partial

from torch_attn import _model
from torch_attn.gemma2 import gemma2_block, gemma_decoder
from torch_attn.qk_norm import qk_norm

# -- attention: Gemma 2's, with QK-norm per head and the local layers' own rotary base ---------------

def gemma3_attention(x, params, config, positions, *, attn_mask=None, kv_cache=None, window=None):
    """gemma2_attention with QK-norm per head (1 + w), a sliding layer rotating with
    rope_local_theta: x (B, T, C) -> (B, T, C)."""
    theta, scaling = (config.rope_theta, config.rope_scaling) if window is None else (config.rope_local_theta, None)
    q, k, v = _model.heads(x, params, config.n_head, config.n_kv_head)        # (B, nh | nkv, T, hs)
    q, k = qk_norm(q, k, params, config.rms_eps, offset=1.0)                  # each head alone, 1 + w
    q, k = _model.rotate(q, k, positions, theta, scaling, config.rope_layout)
    out = _model.attend(q, k, v, params["o"], kv_cache, attn_mask, window=window,
                        scale=config.query_pre_attn_scalar ** -0.5,
                        softcap=config.attn_logit_softcap)                    # (B, T, C)
    return out


# -- the model: Gemma 2's blocks with Gemma 3's attention -----------------------------------------

def gemma3(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
           logits_to_keep=None):
    """Logits for integer ``ids`` (B, T) -> (B, T, V); keywords as gemma2's."""
    block = partial(gemma2_block, attention=gemma3_attention)
    return gemma_decoder(ids, params, config, block, positions=positions,
                         attn_mask=attn_mask, kv_cache=kv_cache, logits_to_keep=logits_to_keep)


# Equals Hugging Face's transformers.Gemma3ForCausalLM(...).logits holding the same weights;
# parity_tests/test_gemma2.py checks it in float32 and float64, and through saved checkpoints.
