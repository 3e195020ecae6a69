"""Gemma 3 (text): Gemma 2's model (numpy_attn/gemma2.py) with QK-norm per head, five local
layers in six, and a rotary base of their own for the local layers.

    q, k   = rms_norm(q), rms_norm(k)      per head, width hs, scaling by 1 + w, before RoPE
    RoPE   base rope_local_theta on the sliding layers, rope_theta (and its scaling) on the global ones

Gemma Team, "Gemma 3 Technical Report" (2025), section 2: Gemma 2's four norms per block, GeGLU,
scaled embedding, score scale and sliding window, with the soft caps replaced by QK-norm
(``blocks.i.attn.q_norm.w`` and ``k_norm.w``, (hs,), llama.py's per-head kind with Gemma's 1 + w),
and five sliding layers for each global one (``layer_types``; the global layers' longer
rotary wavelengths, a base of 1e6, serve the long context, the local ones keep 1e4). Everything
else, the cache included (``gemma2_kv_cache``), is gemma2.py's and llama.py's.
"""

from dataclasses import dataclass
from typing import ClassVar

from numpy_attn._checks import POSITIVE, check_config
from numpy_attn.gemma2 import Gemma2Config, gemma2_block_backward, gemma2_block_forward
from numpy_attn.llama import decoder_backward, decoder_forward


@dataclass(frozen=True)
class Gemma3Config(Gemma2Config):
    """Gemma2Config's fields and checks, no caps by default, q and k RMS-normed per head, and the
    local layers' rotary base."""

    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    rope_local_theta: float = 10000.0     # the sliding layers' base (Hugging Face's sliding_attention rope_theta)
    sliding_pattern = 6                   # by default five sliding layers, then a global one
    qk_norm: ClassVar[str] = "head"

    def __post_init__(self):
        super().__post_init__()
        for name, value in check_config(self, {"rope_local_theta": (float, POSITIVE)}).items():
            object.__setattr__(self, name, value)

    def block_options(self, i):
        """The window, and on a sliding layer its own rotary base (no scaling)."""
        rope = None if self.window(i) is None else {"theta": self.rope_local_theta, "scaling": None}
        return {"window": self.window(i), "rope": rope}


def gemma3_forward(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
                   logits_to_keep=None, for_backward=True):
    """Logits for integer ``ids`` (B, T) -> (B, T, V), as gemma2_forward (same keywords, the cache
    from gemma2_kv_cache). Returns ``(logits, cache)``."""
    return decoder_forward(ids, params, config, Gemma3Config, gemma2_block_forward, positions=positions,
                           attn_mask=attn_mask, kv_cache=kv_cache, rng=rng,
                           logits_to_keep=logits_to_keep, for_backward=for_backward)


def gemma3_backward(dlogits, cache):
    """Gradients: dlogits (B, T, V) -> dparams, with the nesting of the params."""
    return decoder_backward("gemma3", dlogits, cache, gemma2_block_backward)
