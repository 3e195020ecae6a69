"""QK-norm: an RMS norm on the queries and one on the keys, each with its own weight, and its backward.

    q = rms_norm(q) * w_q
    k = rms_norm(k) * w_k              over the last axis of each

Dehghani et al., "Scaling Vision Transformers to 22 Billion Parameters" (2023), section 3.1.1:
bounding each query and key bounds the scores q . k / sqrt(hs), so that no logit grows without
limit while training. Where the norm sits is the family's choice: Qwen3 and Gemma 3 norm each
head alone (q (B, nh, T, hs), k (B, nkv, T, hs), weights (hs,) shared by the heads, after the
split into heads and before the rotation); OLMo 2 norms the whole projection (q (B, T, nh*hs),
k (B, T, nkv*hs), weights of those widths, before the split). Each norm is
numpy_attn/rms_norm.py's, with its ``offset`` (Gemma 3's 1 + w) and ``round_xhat`` (OLMo 2's
product rounded once in float16 and bfloat16).
"""

from typing import NamedTuple

from numpy_attn.rms_norm import rms_norm_backward, rms_norm_forward


class QKNormCache(NamedTuple):
    """The two RMS norms' caches (each holds its rstd at index 1)."""

    q: tuple
    k: tuple


def qk_norm_forward(q, k, params, eps, offset=0.0, round_xhat=True):
    """RMS norm of q (..., dq) and of k (..., dk) over their last axis, with ``params["q_norm"]["w"]``
    (dq,) and ``params["k_norm"]["w"]`` (dk,). Returns ``(q, k, cache)``."""
    _check_qk_norm(q, k, params)
    q, q_cache = rms_norm_forward(q, params["q_norm"]["w"], eps, offset, round_xhat)   # (..., dq)
    k, k_cache = rms_norm_forward(k, params["k_norm"]["w"], eps, offset, round_xhat)   # (..., dk)
    cache = QKNormCache(q_cache, k_cache)
    return q, k, cache


def qk_norm_backward(dq, dk, cache):
    """Gradients: (dq, dk) of the normed q and k -> (dq, dk, {"q_norm": {"w"}, "k_norm": {"w"}})."""
    # Undoes k = rms_norm(k), then q = rms_norm(q).
    dk, dk_norm = rms_norm_backward(dk, cache.k)                                      # (..., dk)
    dq, dq_norm = rms_norm_backward(dq, cache.q)                                      # (..., dq)
    return dq, dk, {"q_norm": dq_norm, "k_norm": dk_norm}


def _check_qk_norm(q, k, params):
    """Raise unless ``params`` holds a q_norm and a k_norm weight as wide as q's and k's last axis,
    naming the weight (rms_norm_forward checks the rest: dtypes, eps, offset)."""
    if not isinstance(params, dict) or not all(isinstance(params.get(n), dict) and "w" in params[n]
                                               for n in ("q_norm", "k_norm")):
        got = sorted(params) if isinstance(params, dict) else type(params).__name__
        raise ValueError(f"params must hold 'q_norm' and 'k_norm', each {{'w': weight}}, got {got}")
    for name, x in (("q", q), ("k", k)):
        w = params[f"{name}_norm"]["w"]
        if hasattr(x, "shape") and hasattr(w, "shape") and x.ndim and w.shape != x.shape[-1:]:
            raise ValueError(f"params['{name}_norm']['w'] must have shape ({x.shape[-1]},) to match {name} "
                             f"{x.shape}, got {w.shape}")
