"""Scaled dot-product attention and its backward: the twin of torch.nn.functional.scaled_dot_product_attention.

    scores  = (q * scale) @ k^T + attn_mask       scale = 1 / sqrt(hs) unless given
    weights = softmax(scores)                     along the key axis S
    out     = dropout(weights) @ v

Vaswani et al., "Attention Is All You Need" (2017), eq. 1, with F.scaled_dot_product_attention's
arguments: a bool ``attn_mask`` is True where a query may attend, a float one is added (and can be
learned: ``attn_mask_grad=True``); k and v may have fewer heads than q (grouped-query, as
``enable_gqa=True``), and batch axes broadcast. A fully masked row gives weights, output and
gradient 0. ``is_causal`` is True (top-left, as PyTorch) or "bottom_right" (decoding with a cache
of S - T earlier keys); for T = 3 queries and S = 5 keys, 1 where a query may attend:

    top-left (True, "top_left")     bottom-right ("bottom_right")
        1 0 0 0 0                       1 1 1 0 0
        1 1 0 0 0                       1 1 1 1 0
        1 1 1 0 0                       1 1 1 1 1

The forward also keeps each row's log-sum-exp, ``cache.lse``: an operation on the output through
it (numpy_attn/attention_sinks.py) hands its gradient back as ``dlse``. A sliding window is a mask
(numpy_attn/masks.py's sliding_window_mask); Gemma 2's cap on the scores is a score modifier,
flex attention's soft_cap (numpy_attn/flex_attention.py).

Backward, in reverse: dv = dropped^T dout, dweights = dropout_backward(dout v^T),
dscores = softmax_backward(dweights) + weights * dlse, dq = dscores k * scale, dk = dscores^T (q * scale).

float16 and bfloat16 compute in float32 and round out and each gradient once (docs/precision.md).
"""

from typing import NamedTuple

import numpy as np

from numpy_attn._checks import check_attention_inputs, check_dout, check_scale, upcast
from numpy_attn.dropout import dropout_backward, dropout_forward
from numpy_attn.masks import causal_mask
from numpy_attn.softmax import softmax_backward, softmax_forward


class AttentionCache(NamedTuple):
    """What the backward needs. ``weights`` is public: the attention weights (..., T, S)."""

    q_scaled: np.ndarray        # (..., nh, T, hs) q * scale
    k: np.ndarray               # (..., nh, S, hs) k, its heads repeated g times
    v: np.ndarray               # (..., nh, S, hv) v, its heads repeated g times
    weights: np.ndarray         # (..., nh, T, S) after softmax, before dropout, in q's dtype
    softmax_cache: tuple        # softmax_forward's cache (holds weights itself, not a copy)
    dropped: np.ndarray         # (..., nh, T, S) dropout(weights): weights itself without dropout
    dropout_cache: tuple        # dropout_forward's DropoutCache: keep-mask and 1 / (1 - p), or None, None
    scale: np.floating          # the score scale, in the dtype computed in
    g: int                      # query heads per key/value head (1 without grouped-query heads)
    mask_shape: tuple | None    # the float attn_mask's shape when its gradient is asked for, else None
    lse: np.ndarray             # (..., nh, T) each row's log-sum-exp of the scores (-inf if fully masked)

    @property
    def keep(self):
        """(..., nh, T, S) bool dropout keep-mask (True = kept), None without dropout."""
        return self.dropout_cache.mask

    @property
    def keep_scale(self):
        """1 / (1 - dropout_p): the scale of the kept weights (1 without dropout)."""
        return 1.0 if self.dropout_cache.scale is None else self.dropout_cache.scale


def scaled_dot_product_attention_forward(q, k, v, attn_mask=None, is_causal=False, scale=None,
                                         dropout_p=0.0, rng=None, attn_mask_grad=False):
    """out = dropout(softmax((q * scale) @ k^T + attn_mask)) @ v: q (..., T, hs), k (..., S, hs),
    v (..., S, hv) -> out (..., T, hv). Returns ``(out, cache)``.

    ``rng`` draws the dropout keep-mask (``cache.keep``, for the twin to replay); with
    ``attn_mask_grad=True`` the backward also returns a float mask's gradient. ``cache.weights`` (read-only,
    in q's dtype) are the weights before dropout, ``cache.lse`` each row's log-sum-exp (float32
    for float16 and bfloat16).
    """
    _check_attention(q, k, v, attn_mask, is_causal, scale, dropout_p, rng, attn_mask_grad)
    T, hs = q.shape[-2:]
    S, hv = v.shape[-2:]
    dtype = q.dtype                                               # out's: float16 and bfloat16 compute in float32
    q, k, v = upcast(q), upcast(k), upcast(v)                     # float32 copies for float16 and bfloat16
    scale = q.dtype.type(1 / np.sqrt(hs) if scale is None else scale)
    # g query heads per key/value head: more than one with grouped-query heads
    g = q.shape[-3] // k.shape[-3] if min(q.ndim, k.ndim) >= 3 and q.shape[-3] > k.shape[-3] > 1 else 1
    if g > 1:   # grouped-query: repeat key/value head j for its query heads j*g .. j*g+g-1
        # (..., nkv, S, .) -> (..., nh, S, .)
        k, v = np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3)
    mask_shape = attn_mask.shape if attn_mask_grad else None     # the backward returns dattn_mask
    if is_causal:   # (T, S): query t sees keys 0..t, or 0..S-T+t aligned bottom-right
        attn_mask = causal_mask(T, S, "bottom_right" if is_causal == "bottom_right" else "top_left")
    if attn_mask is not None and attn_mask.dtype == np.bool_:
        attn_mask = np.where(attn_mask, 0, -np.inf).astype(q.dtype)   # False -> a score of -inf
    attn_mask = upcast(attn_mask)                                 # a float16/bfloat16 mask in float32: -inf stays -inf
    # The scale goes into q (T x hs numbers) rather than the scores (T x S).
    q_scaled = q * scale                                          # (..., nh, T, hs)
    scores = q_scaled @ k.swapaxes(-1, -2)                        # (..., nh, T, S)
    if attn_mask is not None:
        scores += attn_mask                                       # in place: scores is our own array
    weights, softmax_cache = softmax_forward(scores)              # (..., nh, T, S); all -inf row -> 0
    dropped, dropout_cache = dropout_forward(weights, dropout_p, rng)   # (..., nh, T, S)
    out = dropped @ v                                             # (..., nh, T, hv)
    lse = _logsumexp(scores)                                      # (..., nh, T)
    shown = weights.astype(dtype, copy=False)                     # weights itself, or rounded to float16/bfloat16
    shown.flags.writeable = False
    cache = AttentionCache(q_scaled, k, v, shown, softmax_cache, dropped, dropout_cache, scale, g,
                           mask_shape, lse)
    return out.astype(dtype, copy=False), cache                   # rounded once to q's dtype


@np.errstate(divide="ignore")
def _logsumexp(scores):
    """log sum exp of each row of scores (..., S) -> (...): -inf for a fully masked row."""
    empty = np.isneginf(scores).all(axis=-1)                      # (...)
    m = np.where(empty[..., None], 0, scores).max(axis=-1, keepdims=True, initial=-np.inf)   # (..., 1)
    return np.where(empty, -np.inf, (m + np.log(np.exp(scores - m).sum(axis=-1, keepdims=True)))[..., 0])


def scaled_dot_product_attention_backward(dout, cache, dlse=None):
    """Gradients of attention: dout (..., T, hv) [, dlse (..., T), the gradient of ``cache.lse``]
    -> (dq (..., T, hs), dk (..., S, hs), dv (..., S, hv)[, dattn_mask]), dattn_mask (the mask's
    shape) if the forward had ``attn_mask_grad=True``.

    With grouped-query attention dk and dv have the fewer heads of k and v: each sums its group.
    """
    q_scaled, k, v, dropped, g = cache.q_scaled, cache.k, cache.v, cache.dropped, cache.g
    dtype = cache.weights.dtype                                   # the inputs'; the cache may hold float32
    check_dout("scaled_dot_product_attention", dout, cache.weights.shape[:-1] + v.shape[-1:], dtype)
    dout = upcast(dout)                                           # float32 for float16 and bfloat16
    # Undoes out = dropped @ v.
    dv = dropped.swapaxes(-1, -2) @ dout                          # (..., nh, S, hv)
    ddropped = dout @ v.swapaxes(-1, -2)                          # (..., nh, T, S)
    # Undoes dropped = dropout(weights): the same keep-mask and scale.
    dweights = dropout_backward(ddropped, cache.dropout_cache)    # (..., nh, T, S)
    # Undoes weights = softmax(scores). Masked scores have weight 0, so softmax_backward already
    # gives them gradient 0 (and a fully masked row 0 throughout).
    dscores = softmax_backward(dweights, cache.softmax_cache)     # (..., nh, T, S)
    if dlse is not None:   # Undoes lse = log sum exp(scores): d lse / d scores = the weights
        _check_dlse(dlse, cache.lse.shape)
        dscores = dscores + cache.softmax_cache.y * upcast(dlse)[..., None]   # (..., nh, T, S)
    # Undoes scores = q_scaled @ k^T + attn_mask and q_scaled = q * scale.
    dq = (dscores @ k) * cache.scale                              # (..., nh, T, hs)
    dk = dscores.swapaxes(-1, -2) @ q_scaled                      # (..., nh, S, hs)
    # Undoes the broadcasting of the batch axes: each input's gradient summed back to its shape.
    dq, dk, dv = (_sum_to_shape(d, a.shape) for d, a in ((dq, q_scaled), (dk, k), (dv, v)))
    if g > 1:   # grouped-query: undoes the repeat; key/value head j sums the gradients of its g query heads
        # (..., nh, S, .) -> (..., nkv, g, S, .) -> (..., nkv, S, .)
        dk, dv = (d.reshape(d.shape[:-3] + (-1, g) + d.shape[-2:]).sum(axis=-3) for d in (dk, dv))
    grads = (dq, dk, dv)
    if cache.mask_shape is not None:   # a learned float mask: dscores summed over the axes it was broadcast along
        grads += (_sum_to_shape(dscores, cache.mask_shape),)       # (..., nh, T, S) -> mask's shape
    return tuple(d.astype(dtype, copy=False) for d in grads)      # each rounded once to its input's dtype


def _sum_to_shape(x, shape):
    """Sum ``x`` over the axes along which an array of ``shape`` was broadcast to x's shape."""
    if x.shape == tuple(shape):
        return x
    lead = x.ndim - len(shape)                                    # axes the array did not have
    x = x.sum(axis=tuple(range(lead)))
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    return x.sum(axis=stretched, keepdims=True)


def _check_dlse(dlse, shape):
    """Raise unless ``dlse`` is an array of lse's shape (..., nh, T)."""
    if not isinstance(dlse, np.ndarray) or dlse.shape != shape:
        got = f"shape {dlse.shape}" if isinstance(dlse, np.ndarray) else type(dlse).__name__
        raise ValueError(f"dlse must be an array of lse's shape {shape}, got {got}")


def _check_attention(q, k, v, attn_mask, is_causal, scale, dropout_p, rng, attn_mask_grad):
    """Raise on inputs attention cannot take (check_attention_inputs and check_scale, shared with
    flash attention), and unless attn_mask_grad is a bool, True only with a float attn_mask."""
    check_attention_inputs(q, k, v, attn_mask, is_causal, dropout_p, rng, broadcast=True)
    check_scale(scale, dtype=q.dtype)
    if not (isinstance(is_causal, bool | np.bool_) or is_causal in ("top_left", "bottom_right")):
        raise ValueError(f'is_causal must be False, True, "top_left" or "bottom_right", got {is_causal!r}')
    if not isinstance(attn_mask_grad, bool | np.bool_):
        raise TypeError(f"attn_mask_grad must be True or False, got {attn_mask_grad!r}")
    if attn_mask_grad and (attn_mask is None or attn_mask.dtype == np.bool_):
        got = "no attn_mask" if attn_mask is None else f"a bool attn_mask of shape {attn_mask.shape}"
        raise ValueError(f"attn_mask_grad=True needs a float attn_mask (its gradient), got {got}")
