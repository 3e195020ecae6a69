"""Qwen3: the Llama-style model (numpy_attn/llama.py) with QK-norm per head.

    q, k   = rms_norm(q), rms_norm(k)      per head, width hs, after the projection, before RoPE

Qwen Team, "Qwen3 Technical Report" (2025), section 2: Qwen2's grouped-query attention without
the bias on q, k and v, with an RMS norm of width hs on each head's query and key instead
(weights ``blocks.i.attn.q_norm.w`` and ``k_norm.w``, (hs,), shared by the heads). Everything
else is llama.py's: the blocks, the keywords, the parameters' initialisation (``init_llama_params``,
which gives a Qwen3Config's q and k norms their width) and the key/value cache
(``llama_kv_cache``); what stands here is what Qwen3 changes. The head size is its own setting
(Hugging Face's ``head_dim``, 128 in the released models whatever the width). Qwen3's optional
sliding window is not implemented.
"""

from dataclasses import dataclass
from typing import ClassVar

from numpy_attn import llama


@dataclass(frozen=True)
class Qwen3Config(llama.LlamaConfig):
    """LlamaConfig's fields and checks; q and k are RMS-normed per head."""

    qk_norm: ClassVar[str] = "head"


def qwen3_forward(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
                  logits_to_keep=None, for_backward=True):
    """Logits for integer ``ids`` (B, T) -> (B, T, V), as llama_forward (same keywords). Returns
    ``(logits, cache)``."""
    return llama.decoder_forward(ids, params, config, Qwen3Config, llama.llama_block_forward, positions=positions,
                                 attn_mask=attn_mask, kv_cache=kv_cache, rng=rng,
                                 logits_to_keep=logits_to_keep, for_backward=for_backward)


def qwen3_backward(dlogits, cache):
    """Gradients: dlogits (B, T, V) -> dparams, with the nesting of the params."""
    return llama.decoder_backward("qwen3", dlogits, cache, llama.llama_block_backward)
