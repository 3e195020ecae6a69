"""Scaled dot-product attention with masks, dropout, grouped-query heads and sinks, and its backward.

    scores  = (q * scale) @ k^T                   scale = 1 / sqrt(hs) unless given
    scores  = c * tanh(scores / c) + mask         softcap c: Gemma 2's; without, scores + mask
    weights = softmax([scores, s_h])[:S]          along the key axis S; the sink s_h only with sinks
    out     = dropout(weights) @ v

Vaswani et al., "Attention Is All You Need" (2017), eq. 1; the semantics are those of
``torch.nn.functional.scaled_dot_product_attention``:

- ``attn_mask`` has at least two dimensions and broadcasts to the scores (..., T, S): bool is
  True where a query may attend (False becomes a score of -inf), float is added to the scores
  and must have q's dtype.
- ``is_causal=True`` lets query t see keys 0..t (top-left aligned, also when T != S), as in
  PyTorch; ``is_causal="bottom_right"`` lets it see keys 0..S-T+t, the last query seeing every
  key (decoding with a cache of S - T earlier keys; ``torch.nn.attention.bias.causal_lower_right``).
  For T = 3 queries (rows) and S = 5 keys, 1 where a query may attend:

      top-left (True, "top_left")     bottom-right ("bottom_right")
          1 0 0 0 0                       1 1 1 0 0
          1 1 0 0 0                       1 1 1 1 0
          1 1 1 0 0                       1 1 1 1 1

  With T > S bottom-right leaves the first T - S rows without a key. ``window=w`` (with
  is_causal) keeps only each query's last w keys, its own included, in either alignment
  (sliding-window attention, numpy_attn/masks.py's sliding_window_mask); with w = 2, T = 3, S = 5,
  bottom-right: rows 0 1 1 0 0 / 0 0 1 1 0 / 0 0 0 1 1. A caller with its own attn_mask combines
  it with sliding_window_mask instead. Giving both ``is_causal``
  and ``attn_mask`` is a ValueError, as in PyTorch: combine them into one mask.
- ``softcap=c`` caps the scaled scores smoothly into (-c, c) before the mask is added
  (numpy_attn/softcap.py; the order of transformers' Gemma 2 attention: scale, cap, mask,
  softmax); a float mask's gradient is taken after the cap, the scores' through its derivative.
- A query row with every key masked gets weights 0, output 0 and gradient 0 (never NaN).
- ``sinks`` (nh,), one learned logit s_h per query head (gpt-oss; OpenAI, "gpt-oss-120b &
  gpt-oss-20b Model Card", 2025): each row's softmax gets one more column, s_h, after the scale,
  cap and mask, and that column is dropped again, so the row's weights sum to less than one:
  weights = exp(scores - m) / (sum exp(scores - m) + exp(s_h - m)), m the row's maximum over the
  scores and s_h. The sink takes a share of the attention and gives no value: a head can attend
  to nothing. A fully masked row then has weight 1 on its sink and so weights 0 and output 0.
  With grouped-query heads there is still one sink per query head. Dropout acts on the weights
  without the sink column (the order of transformers' gpt-oss eager attention).
- A float ``attn_mask`` can be learned (a relative-position bias, ALiBi): with
  ``attn_mask_grad=True`` the backward also returns its gradient, dscores summed over the axes
  along which the mask was broadcast, in the mask's shape. Bool masks and is_causal have none.
- Dropout is inverted dropout on the weights (numpy_attn/dropout.py): a keep-mask drawn from
  ``rng`` with P(keep) = 1 - p, kept entries scaled by 1 / (1 - p); the keep-mask is cached so
  that the twin can replay it.
- Grouped-query attention: k and v may have fewer heads (axis -3) than q, the query head count a
  multiple g of theirs; query head h uses key/value head h // g, as with ``enable_gqa=True``.
  It is handled at the edges: the forward repeats each key/value head g times, the backward sums
  each group.
- The other leading (batch) dimensions of q and of k, v broadcast against each other, as in
  PyTorch (a size 1 or a missing axis stands for any size); the backward sums the gradient of a
  broadcast input over the axes it was broadcast along.

Backward, in reverse: dv = dropped^T dout, dweights = dropout_backward(dout v^T),
dscores = softmax_backward(dweights) (times 1 - tanh^2 under a softcap), dq = dscores k * scale,
dk = dscores^T (q * scale).
Masked entries have weight 0 and so get no gradient; a float mask's own gradient is dscores.
With sinks, dweights gets a zero column for the sink (its weight reached no output) before the
softmax backward, and dsinks is that column of dscores, -w_sink * sum(dweights * weights) per
row, summed over every axis but the head axis; the backward returns it last.

float16 and bfloat16: q, k, v, a float mask and the sinks are cast up to float32 at the top and
everything, scores, cap, softmax (max, exp, sum) and weights @ v, runs in float32; out is rounded
once to q's dtype, and so are the weights ``cache.weights`` shows. The backward computes in float32
from the float32 cache and rounds each gradient once. This is PyTorch's math backend exactly
(docs/precision.md); its CPU flash kernel, the default, also rounds the weights to the low dtype
before weights @ v, which adds an error this does not have.
"""

from typing import NamedTuple

import numpy as np

from numpy_attn._checks import (
    check_attention_inputs,
    check_dout,
    check_sinks,
    check_softcap,
    check_window_is_causal,
    upcast,
)
from numpy_attn.dropout import dropout_backward, dropout_forward
from numpy_attn.masks import causal_mask, sliding_window_mask
from numpy_attn.softcap import logit_softcap_backward, logit_softcap_forward
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
    softcap_cache: tuple | None = None   # logit_softcap_forward's cache (tanh of the scores), None without a cap
    sinks: bool = False         # whether the softmax had a sink column (softmax_cache then holds S + 1 columns)

    @property
    def keep(self):
        """(..., nh, T, S) bool dropout keep-mask (True = kept), None without dropout."""
        return self.dropout_cache.mask

    @property
    def keep_scale(self):
        """1 / (1 - dropout_p): the scale of the kept weights (1 without dropout)."""
        return 1.0 if self.dropout_cache.scale is None else self.dropout_cache.scale


def scaled_dot_product_attention_forward(q, k, v, attn_mask=None, is_causal=False, scale=None,
                                         dropout_p=0.0, rng=None, attn_mask_grad=False, softcap=None,
                                         window=None, sinks=None):
    """Attention of q (..., T, hs) over k (..., S, hs) and v (..., S, hv) -> out (..., T, hv).

    With ``attn_mask_grad=True`` and a float ``attn_mask``, the backward returns its gradient too.
    ``softcap`` (a number > 0, or None) caps the scaled scores at c * tanh(scores / c);
    ``window`` (an integer >= 1, or None; needs is_causal) lets each query see its last keys only;
    ``sinks`` (nh,) in q's dtype, or None, adds each query head's sink logit to its softmax (the
    backward then returns dsinks last).

    Returns ``(out, cache)``. ``cache.weights`` (..., T, S) are the attention weights after
    softmax and before dropout (for plots); ``cache.keep`` is the dropout keep-mask or None.
    ``out`` is a fresh array that the cache does not hold: changing it leaves the backward alone.
    ``cache.weights`` is read-only, changing it in place is an error; for float32 and float64 it is
    the very array the backward reads, for float16 and bfloat16 that array rounded to q's dtype.
    The cache holds the rest in float32 for those (the dtype the backward computes in).
    """
    _check_attention(q, k, v, attn_mask, is_causal, dropout_p, rng, attn_mask_grad, softcap, window, sinks)
    T, hs = q.shape[-2:]
    S, hv = v.shape[-2:]
    dtype = q.dtype                                               # out's: float16 and bfloat16 compute in float32
    q, k, v, sinks = upcast(q), upcast(k), upcast(v), upcast(sinks)   # float32 copies for float16 and bfloat16
    scale = q.dtype.type(1 / np.sqrt(hs) if scale is None else scale)
    # g query heads per key/value head: more than one with grouped-query heads
    g = q.shape[-3] // k.shape[-3] if min(q.ndim, k.ndim) >= 3 and q.shape[-3] > k.shape[-3] > 1 else 1
    if g > 1:   # grouped-query: repeat key/value head j for its query heads j*g .. j*g+g-1
        # (..., nkv, S, .) -> (..., nh, S, .)
        k, v = np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3)
    mask_shape = attn_mask.shape if attn_mask_grad else None     # the backward returns dattn_mask
    if is_causal:   # (T, S): query t sees keys 0..t, or 0..S-T+t aligned bottom-right; a window keeps the last w
        align = "bottom_right" if is_causal == "bottom_right" else "top_left"
        attn_mask = causal_mask(T, S, align) if window is None else sliding_window_mask(T, S, window, align)
    if attn_mask is not None and attn_mask.dtype == np.bool_:
        attn_mask = np.where(attn_mask, 0, -np.inf).astype(q.dtype)   # False -> a score of -inf
    attn_mask = upcast(attn_mask)                                 # a float16/bfloat16 mask in float32: -inf stays -inf
    # The scale goes into q (T x hs numbers) rather than the scores (T x S).
    q_scaled = q * scale                                          # (..., nh, T, hs)
    scores = q_scaled @ k.swapaxes(-1, -2)                        # (..., nh, T, S)
    softcap_cache = None
    if softcap is not None:   # Gemma 2: c * tanh(scores / c), before the mask (-inf stays -inf)
        scores, softcap_cache = logit_softcap_forward(scores, softcap)   # (..., nh, T, S)
    if attn_mask is not None:
        scores += attn_mask                                       # in place: scores is our own array
    if sinks is not None:   # gpt-oss: head h's sink logit joins every row of its scores as column S
        sink_column = np.broadcast_to(sinks[:, None, None], scores.shape[:-1] + (1,))   # (nh,) -> (..., nh, T, 1)
        scores = np.concatenate([scores, sink_column], axis=-1)   # (..., nh, T, S + 1)
    weights, softmax_cache = softmax_forward(scores)              # (..., nh, T, S[ + 1]); all -inf row -> 0
    if sinks is not None:   # the sink's weight is dropped: it takes a share of the row but has no value
        # A contiguous copy, not the strided view: matmul sums a strided operand in another order, and
        # the same weights would then give another last bit of out than without a sink.
        weights = np.ascontiguousarray(weights[..., :-1])         # (..., nh, T, S + 1) -> (..., nh, T, S)
        weights.flags.writeable = False                           # read-only, as softmax's own output
    dropped, dropout_cache = dropout_forward(weights, dropout_p, rng)   # (..., nh, T, S)
    out = dropped @ v                                             # (..., nh, T, hv)
    shown = weights.astype(dtype, copy=False)                     # weights itself, or rounded to float16/bfloat16
    shown.flags.writeable = False
    cache = AttentionCache(q_scaled, k, v, shown, softmax_cache, dropped, dropout_cache, scale, g,
                           mask_shape, softcap_cache, sinks is not None)
    return out.astype(dtype, copy=False), cache                   # rounded once to q's dtype


def scaled_dot_product_attention_backward(dout, cache):
    """Gradients of attention: dout (..., T, hv) -> (dq (..., T, hs), dk (..., S, hs), dv (..., S, hv)),
    then dattn_mask (the mask's shape) if the forward had ``attn_mask_grad=True``, then dsinks (nh,)
    if it had ``sinks``: (dq, dk, dv[, dattn_mask][, dsinks]).

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
    if cache.sinks:   # Undoes weights = weights[..., :-1]: the dropped sink weight reached no output
        no_gradient = np.zeros(dweights.shape[:-1] + (1,), dweights.dtype)
        dweights = np.concatenate([dweights, no_gradient], axis=-1)   # (..., nh, T, S + 1)
    # Undoes weights = softmax(scores). Masked scores have weight 0, so softmax_backward already
    # gives them gradient 0 (and a fully masked row 0 throughout).
    dscores = softmax_backward(dweights, cache.softmax_cache)     # (..., nh, T, S[ + 1])
    if cache.sinks:   # Undoes the sink column: each head's sink fed every row of that head
        dsink_column, dscores = dscores[..., -1], dscores[..., :-1]   # (..., nh, T), (..., nh, T, S)
        dsinks = dsink_column.sum(axis=-1).reshape(-1, dsink_column.shape[-2]).sum(axis=0)   # -> (nh,)
    dmask = dscores                                               # the mask is added after the cap
    if cache.softcap_cache is not None:   # Undoes scores = c * tanh(scores / c)
        dscores = logit_softcap_backward(dscores, cache.softcap_cache)   # (..., nh, T, S)
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
        grads += (_sum_to_shape(dmask, cache.mask_shape),)       # (..., nh, T, S) -> mask's shape
    if cache.sinks:
        grads += (dsinks,)                                        # (nh,)
    return tuple(d.astype(dtype, copy=False) for d in grads)      # each rounded once to its input's dtype


def _sum_to_shape(x, shape):
    """Sum ``x`` over the axes along which an array of ``shape`` was broadcast to x's shape."""
    if x.shape == tuple(shape):
        return x
    lead = x.ndim - len(shape)                                    # axes the array did not have
    x = x.sum(axis=tuple(range(lead)))
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    return x.sum(axis=stretched, keepdims=True)


def _check_attention(q, k, v, attn_mask, is_causal, dropout_p, rng, attn_mask_grad, softcap, window, sinks):
    """Raise on inputs attention cannot take (check_attention_inputs, shared with flash
    attention), unless attn_mask_grad is a bool, True only with a float attn_mask, unless
    softcap is None or a finite number > 0, unless window is None or an integer >= 1 given
    with is_causal, and unless sinks is None or fits _check_sinks."""
    check_attention_inputs(q, k, v, attn_mask, is_causal, dropout_p, rng, broadcast=True)
    check_softcap(softcap)
    check_window_is_causal(window, is_causal)
    _check_sinks(sinks, q, k)
    if not (isinstance(is_causal, bool | np.bool_) or is_causal in ("top_left", "bottom_right")):
        raise ValueError(f'is_causal must be False, True, "top_left" or "bottom_right", got {is_causal!r}')
    if not isinstance(attn_mask_grad, bool | np.bool_):
        raise TypeError(f"attn_mask_grad must be True or False, got {attn_mask_grad!r}")
    if attn_mask_grad and (attn_mask is None or attn_mask.dtype == np.bool_):
        got = "no attn_mask" if attn_mask is None else f"a bool attn_mask of shape {attn_mask.shape}"
        raise ValueError(f"attn_mask_grad=True needs a float attn_mask (its gradient), got {got}")


def _check_sinks(sinks, q, k):
    """Raise unless ``sinks`` is None or fits _checks.check_sinks, nh the query heads of the
    scores: axis -3 of q, or of the batch axes q and k, v broadcast to."""
    if sinks is None or not isinstance(sinks, np.ndarray) or sinks.dtype != q.dtype:
        return check_sinks(sinks, q)                                       # no array, or not q's dtype
    g = q.shape[-3] // k.shape[-3] if min(q.ndim, k.ndim) >= 3 and q.shape[-3] > k.shape[-3] > 1 else 1
    kv_lead = k.shape[:-3] + (k.shape[-3] * g,) if g > 1 else k.shape[:-2]   # k's heads repeated g times
    lead = np.broadcast_shapes(q.shape[:-2], kv_lead)                      # the scores' (..., nh)
    if not lead:
        raise ValueError(f"sinks (shape {sinks.shape}) need a head axis, one sink per query head; "
                         f"q {q.shape} and k {k.shape} have none")
    check_sinks(sinks, q, heads=lead[-1:])
