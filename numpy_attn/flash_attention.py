"""FlashAttention: exact attention computed in tiles (for now the tuned kernel itself).

The implementation lives in ``numpy_attn/kernels/flash_attention.py``; this stem re-exports it so
that the operation keeps its twin and its tests while a readable transcription is written.
"""

from numpy_attn.kernels.flash_attention import (  # noqa: F401
    FlashCache,
    flash_attention_backward,
    flash_attention_forward,
)
