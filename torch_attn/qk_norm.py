"""QK-norm in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/qk_norm.py: an RMS norm of q and one of k over their last axis, each with its
own weight (per head for Qwen3 and Gemma 3, over the projection for OLMo 2).
"""

from torch_attn.rms_norm import rms_norm


def qk_norm(q, k, params, eps, offset=0.0, round_xhat=True):
    """RMS norm of q (..., dq) and of k (..., dk) over their last axis -> (q, k)."""
    q = rms_norm(q, params["q_norm"]["w"], eps, offset, round_xhat)                   # (..., dq)
    k = rms_norm(k, params["k_norm"]["w"], eps, offset, round_xhat)                   # (..., dk)
    return q, k


# Equals torch.nn.functional.rms_norm(q, (dq,), w_q, eps) and the same on k (offset 0), the q_norm
# and k_norm of transformers' Qwen3Attention; parity_tests/test_qk_norm.py checks it.
