"""Qwen3 in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/qwen3.py: torch_attn/llama.py's model, whose attention RMS-norms q and k per
head (the config's qk_norm, "head") before the rotation; its cache is llama_kv_cache.
"""

from torch_attn.llama import decoder, llama_block


def qwen3(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
          logits_to_keep=None):
    """Logits for integer ``ids`` (B, T) -> (B, T, V); keywords as llama's."""
    return decoder(ids, params, config, llama_block, positions=positions, attn_mask=attn_mask, kv_cache=kv_cache,
                   logits_to_keep=logits_to_keep)


# Equals Hugging Face's transformers.Qwen3ForCausalLM(...).logits holding the same weights;
# parity_tests/test_qwen3.py checks it in float32 and float64, and through saved checkpoints.
