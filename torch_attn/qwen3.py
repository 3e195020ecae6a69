"""Qwen3 in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/qwen3.py: torch_attn/llama.py's blocks with Qwen3's attention, which RMS-norms
q and k per head (torch_attn/qk_norm.py) before the rotation; its cache is llama_kv_cache.
"""

from functools import partial

from torch_attn import _model
from torch_attn.llama import llama_block
from torch_attn.qk_norm import qk_norm

# -- attention: Llama's, with each head's q and k normed before the rotation -------------------------

def qwen3_attention(x, params, config, positions, *, attn_mask=None, kv_cache=None):
    """llama_attention with QK-norm per head: x (B, T, C) -> (B, T, C)."""
    q, k, v = _model.heads(x, params, config.n_head, config.n_kv_head)        # (B, nh | nkv, T, hs)
    q, k = qk_norm(q, k, params, config.rms_eps)                              # each head alone, width hs
    q, k = _model.rotate(q, k, positions, config.rope_theta, config.rope_scaling, config.rope_layout)
    out = _model.attend(q, k, v, params["o"], kv_cache, attn_mask)            # (B, T, C)
    return out


# -- the model: Llama's blocks with Qwen3's attention ---------------------------------------------

def qwen3(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
          logits_to_keep=None):
    """Logits for integer ``ids`` (B, T) -> (B, T, V); keywords as llama's."""
    block = partial(llama_block, attention=qwen3_attention)
    return _model.decoder(ids, params, config, block, positions=positions,
                          attn_mask=attn_mask, kv_cache=kv_cache, logits_to_keep=logits_to_keep)


# Equals Hugging Face's transformers.Qwen3ForCausalLM(...).logits holding the same weights;
# parity_tests/test_qwen3.py checks it in float32 and float64, and through saved checkpoints.
