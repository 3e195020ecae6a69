"""Scaled dot-product attention with masks, dropout and grouped-query heads, and its backward.

    scores  = (q * scale) @ k^T + mask            scale = 1 / sqrt(hs) unless given
    weights = softmax(scores)                     along the key axis S
    out     = dropout(weights) @ v

Vaswani et al., "Attention Is All You Need" (2017), eq. 1; the semantics are those of
``torch.nn.functional.scaled_dot_product_attention``:

- ``attn_mask`` has at least two dimensions and broadcasts to the scores (..., T, S): bool is
  True where a query may attend (False becomes a score of -inf), float is added to the scores
  and must have q's dtype.
- ``is_causal`` lets query t see keys 0..t (top-left aligned, also when T != S). Giving both
  ``is_causal`` and ``attn_mask`` is a ValueError, as in PyTorch: combine them into one mask.
- A query row with every key masked gets weights 0, output 0 and gradient 0 (never NaN).
- Dropout is inverted dropout on the weights: a keep-mask drawn from ``rng`` with P(keep) = 1 - p,
  kept entries scaled by 1 / (1 - p); the keep-mask is cached so that the twin can replay it.
- Grouped-query attention: k and v may have fewer heads (axis -3) than q, the query head count a
  multiple g of theirs; query head h uses key/value head h // g, as with ``enable_gqa=True``.
  Leading dimensions are otherwise equal (no broadcasting between q, k, v).

The attention weights (after softmax, before dropout) are ``cache.weights`` (..., T, S).
Backward, with P = dropout(weights): dv = P^T dout, dweights = dropout(dout v^T) (the same
keep-mask and scale), dscores = softmax_backward(dweights), dq = dscores k * scale,
dk = dscores^T (q * scale). Masked entries have weight 0 and so get no gradient.
"""

from typing import NamedTuple

import numpy as np

from numpy_attn._checks import check_float, check_same_dtype
from numpy_attn.softmax import softmax_backward, softmax_forward


class AttentionCache(NamedTuple):
    """What the backward needs. ``weights`` is public: the attention weights (..., T, S)."""

    q_scaled: np.ndarray        # (..., nkv, g*T, hs) q * scale, query heads grouped by key head
    k: np.ndarray               # (..., nkv, S, hs)
    v: np.ndarray               # (..., nkv, S, hv)
    weights: np.ndarray         # (..., nh, T, S) after softmax, before dropout
    softmax_cache: tuple        # softmax_forward's cache (holds weights itself, not a copy)
    keep: np.ndarray | None     # (..., nh, T, S) bool dropout keep-mask, None without dropout
    keep_scale: float           # 1 / (1 - dropout_p)
    scale: np.floating          # the score scale, in q's dtype


def _check_inputs(q, k, v, attn_mask, is_causal, dropout_p, rng):
    """Raise ValueError (TypeError for wrong array types) on inputs attention cannot take."""
    for name, a in (("q", q), ("k", k), ("v", v)):
        check_float(name, a)
        if a.ndim < 2:
            raise ValueError(f"{name} must have shape (..., length, head size), got {a.shape}")
    check_same_dtype(q=q, k=k, v=v)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k head sizes differ: q {q.shape}, k {k.shape}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v lengths differ: k {k.shape}, v {v.shape}")
    if k.shape[:-2] != v.shape[:-2]:
        raise ValueError(f"k and v leading dimensions differ: k {k.shape}, v {v.shape}")
    if q.shape[:-2] != k.shape[:-2]:
        if q.ndim != k.ndim or q.ndim < 3 or q.shape[:-3] != k.shape[:-3]:
            raise ValueError(f"q {q.shape} and k {k.shape} must have the same leading dimensions, "
                             "or differ only in the head axis -3 (grouped-query attention)")
        if q.shape[-3] % k.shape[-3]:
            raise ValueError(f"grouped-query attention needs the query head count {q.shape[-3]} to "
                             f"be a multiple of the key/value head count {k.shape[-3]}: "
                             f"q {q.shape}, k {k.shape}")
    if attn_mask is not None:
        if not isinstance(attn_mask, np.ndarray):
            raise TypeError(f"attn_mask must be a NumPy array, got {type(attn_mask).__name__}")
        if is_causal:
            raise ValueError(f"attn_mask of shape {attn_mask.shape} and is_causal=True are both "
                             "given (PyTorch's SDPA refuses this too); pass one mask, e.g. "
                             "attn_mask & np.tri(T, S, dtype=bool)")
        if attn_mask.dtype != np.bool_ and attn_mask.dtype != q.dtype:
            raise ValueError(f"attn_mask of shape {attn_mask.shape} must be bool (True = may "
                             f"attend) or float of q's dtype {q.dtype}, got dtype {attn_mask.dtype}")
        scores_shape = q.shape[:-1] + k.shape[-2:-1]
        try:   # at least (T, S) or (1, S), as PyTorch requires, and no growing the output's shape
            fits = attn_mask.ndim >= 2 and np.broadcast_shapes(attn_mask.shape, scores_shape) == scores_shape
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(f"attn_mask of shape {attn_mask.shape} does not broadcast to the "
                             f"scores' shape {scores_shape} (q {q.shape}, k {k.shape})")
    if not 0 <= dropout_p < 1:
        raise ValueError(f"dropout_p must lie in [0, 1), got {dropout_p}")
    if dropout_p > 0 and not isinstance(rng, np.random.Generator):
        raise ValueError(f"dropout_p = {dropout_p} needs rng, an np.random.Generator, got {rng!r}")


def scaled_dot_product_attention_forward(q, k, v, attn_mask=None, is_causal=False, scale=None,
                                         dropout_p=0.0, rng=None):
    """Attention of q (..., T, hs) over k (..., S, hs) and v (..., S, hv) -> out (..., T, hv).

    Returns ``(out, cache)``. ``cache.weights`` (..., T, S) are the attention weights after
    softmax and before dropout (for plots); ``cache.keep`` is the dropout keep-mask or None.
    The cache holds q * scale, k, v, the weights and the keep-mask; the dropped weights are
    recomputed in the backward rather than stored as a second (..., T, S) array.
    """
    _check_inputs(q, k, v, attn_mask, is_causal, dropout_p, rng)
    T, hs = q.shape[-2:]
    S, hv = v.shape[-2:]
    g = q.shape[-3] // k.shape[-3] if q.shape[:-2] != k.shape[:-2] else 1   # query heads per key head
    scale = q.dtype.type(1 / np.sqrt(hs) if scale is None else scale)
    # The scale goes into q (T x hs numbers) rather than the scores (T x S). The g query heads that
    # share a key/value head become one matrix of g*T rows: one matmul serves the group, and the
    # backward's dk, dv sum over it by themselves. Without GQA g = 1 and the reshape changes nothing.
    q_scaled = (q * scale).reshape(k.shape[:-2] + (g * T, hs))   # (..., nh, T, hs) -> (..., nkv, g*T, hs)
    scores = q_scaled @ k.swapaxes(-1, -2)                        # (..., nkv, g*T, S)
    scores = scores.reshape(q.shape[:-1] + (S,))                  # (..., nkv, g*T, S) -> (..., nh, T, S)
    if is_causal:
        attn_mask = np.tri(T, S, dtype=np.bool_)                  # (T, S): query t sees keys 0..t
    if attn_mask is not None and attn_mask.dtype == np.bool_:
        # In place: scores is our own fresh array, and np.where would allocate another (..., T, S).
        np.copyto(scores, -np.inf, where=~attn_mask)
    elif attn_mask is not None:
        scores += attn_mask
    weights, softmax_cache = softmax_forward(scores)              # (..., nh, T, S); all -inf row -> 0
    keep = None
    keep_scale = 1 / (1 - float(dropout_p))    # a Python float, so float32 stays float32
    dropped = weights
    if dropout_p > 0:
        keep = rng.random(weights.shape) < 1 - dropout_p         # (..., nh, T, S), P(keep) = 1 - p
        dropped = weights * keep * keep_scale                     # inverted dropout: E[dropped] = weights
    out = dropped.reshape(k.shape[:-2] + (g * T, S)) @ v          # (..., nh, T, S) -> (..., nkv, g*T, hv)
    out = out.reshape(q.shape[:-1] + (hv,))                       # (..., nkv, g*T, hv) -> (..., nh, T, hv)
    cache = AttentionCache(q_scaled, k, v, weights, softmax_cache, keep, keep_scale, scale)
    return out, cache


def scaled_dot_product_attention_backward(dout, cache):
    """Gradients of attention: dout (..., T, hv) -> (dq (..., T, hs), dk (..., S, hs), dv (..., S, hv)).

    With grouped-query attention dk and dv have the fewer heads of k and v: each sums its group.
    """
    q_scaled, k, v, weights, softmax_cache, keep, keep_scale, scale = cache
    gT, hs = q_scaled.shape[-2:]
    S, hv = v.shape[-2:]
    dropped = weights if keep is None else weights * keep * keep_scale   # recomputed, not cached
    # Undoes out = out.reshape(...): back to grouped query heads.
    dout = dout.reshape(v.shape[:-2] + (gT, hv))                  # (..., nh, T, hv) -> (..., nkv, g*T, hv)
    # Undoes out = dropped @ v; dv sums over the g query heads of each group through the matmul.
    dv = dropped.reshape(v.shape[:-2] + (gT, S)).swapaxes(-1, -2) @ dout   # (..., nkv, S, hv)
    ddropped = dout @ v.swapaxes(-1, -2)                          # (..., nkv, g*T, S)
    ddropped = ddropped.reshape(weights.shape)                    # (..., nkv, g*T, S) -> (..., nh, T, S)
    # Undoes dropped = weights * keep * keep_scale.
    dweights = ddropped if keep is None else ddropped * keep * keep_scale
    # Undoes weights = softmax(scores). The masks are constants; masked scores have weight 0, so
    # softmax_backward already gives them gradient 0 (and a fully masked row 0 throughout).
    dscores = softmax_backward(dweights, softmax_cache)           # (..., nh, T, S)
    # Undoes scores.reshape(...) and scores = q_scaled @ k^T; dk sums over each group.
    dscores = dscores.reshape(k.shape[:-2] + (gT, S))             # (..., nh, T, S) -> (..., nkv, g*T, S)
    dk = dscores.swapaxes(-1, -2) @ q_scaled                      # (..., nkv, S, hs)
    dq_scaled = dscores @ k                                       # (..., nkv, g*T, hs)
    # Undoes q_scaled = (q * scale).reshape(...).
    dq = (dq_scaled * scale).reshape(weights.shape[:-1] + (hs,))  # (..., nkv, g*T, hs) -> (..., nh, T, hs)
    return dq, dk, dv
