"""Gemma 3 (text) in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/gemma3.py: torch_attn/gemma2.py's blocks on a Gemma3Config, whose q and k are
RMS-normed per head (1 + w) and whose sliding layers rotate with their own base; its cache is
gemma2_kv_cache.
"""

from torch_attn.gemma2 import gemma2_block
from torch_attn.llama import decoder


def gemma3(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
           logits_to_keep=None):
    """Logits for integer ``ids`` (B, T) -> (B, T, V); keywords as gemma2's."""
    return decoder(ids, params, config, gemma2_block, positions=positions,
                   attn_mask=attn_mask, kv_cache=kv_cache, logits_to_keep=logits_to_keep)


# Equals Hugging Face's transformers.Gemma3ForCausalLM(...).logits holding the same weights;
# parity_tests/test_gemma2.py checks it in float32 and float64, and through saved checkpoints.
