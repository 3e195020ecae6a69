"""Attention sinks: one learned logit per query head that takes a share of every softmax row, and its backward.

    out_sink = out * sigmoid(lse - s_h)      out, lse: attention's output and log-sum-exp per row

gpt-oss (OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card", 2025): each query head h has a sink
logit s_h that joins every row of its scores as one more softmax column, whose weight is then
dropped: the sink takes a share of the row and gives no value, so a head can attend to nothing.
That needs no change to attention. With Z = sum_j exp(scores_j) = exp(lse),

    softmax([scores, s_h])_j = exp(scores_j) / (Z + exp(s_h))
                             = softmax(scores)_j * Z / (Z + exp(s_h))
                             = softmax(scores)_j * sigmoid(lse - s_h),

so the output with a sink is attention's output, each row scaled by sigmoid(lse - s_h) < 1. A
fully masked row (lse = -inf) gets 0. Dropout acts on the weights without the sink, as in
transformers' gpt-oss eager attention, so the row's scale passes through it unchanged.

Backward, with a = sigmoid(lse - s_h) and da = sum(dout_sink * out) over the row:
dout = dout_sink * a, dlse = da * a (1 - a), dsinks = -dlse summed over every axis but the head
axis. dlse goes back into attention (scaled_dot_product_attention_backward's ``dlse``), where
d lse / d scores = softmax(scores) adds weights * dlse to dscores.

float16 and bfloat16: out is cast up to float32 (lse is float32 already), the product rounded once.
"""

from typing import NamedTuple

import numpy as np

from numpy_attn._checks import check_dout, check_sinks, upcast


class AttentionSinksCache(NamedTuple):
    """What the backward needs."""

    out: np.ndarray          # (..., nh, T, hv) attention's output, in the dtype computed in
    share: np.ndarray        # (..., nh, T) sigmoid(lse - s_h): the share of each row the sink leaves
    dtype: np.dtype          # out's dtype: each gradient is rounded to it


def attention_sinks_forward(out, lse, sinks):
    """out * sigmoid(lse - s_h): out (..., nh, T, hv), lse (..., nh, T), sinks (nh,) -> (..., nh, T, hv).

    Returns ``(out_sink, cache)``; ``cache.share`` is each row's sigmoid(lse - s_h), the total
    weight the row gives its keys (below one).
    """
    _check_attention_sinks(out, lse, sinks)
    dtype = out.dtype                                             # float16 and bfloat16 compute in float32
    out, sinks = upcast(out), upcast(sinks)
    x = lse - sinks[:, None]                                      # (..., nh, T); -inf on a fully masked row
    share = _sigmoid(x).astype(out.dtype)                         # sigmoid(x); 0 at -inf
    out_sink = out * share[..., None]                             # (..., nh, T, hv)
    return out_sink.astype(dtype, copy=False), AttentionSinksCache(out, share, dtype)


def _sigmoid(x):
    """1 / (1 + exp(-x)) as exp(-log(1 + exp(-x))): no overflow for x far below 0."""
    return np.exp(-np.logaddexp(0, -x))


def attention_sinks_backward(dout_sink, cache):
    """Gradients: dout_sink (..., nh, T, hv) -> (dout (..., nh, T, hv), dlse (..., nh, T), dsinks (nh,))."""
    out, share = cache.out, cache.share
    check_dout("attention_sinks", dout_sink, out.shape, cache.dtype)
    dout_sink = upcast(dout_sink)
    # Undoes out_sink = out * share.
    dout = dout_sink * share[..., None]                           # (..., nh, T, hv)
    dshare = (dout_sink * out).sum(axis=-1)                       # (..., nh, T)
    # Undoes share = sigmoid(lse - s_h): the derivative of sigmoid is share (1 - share).
    dlse = dshare * share * (1 - share)                           # (..., nh, T)
    dsinks = -dlse.reshape(-1, dlse.shape[-2], dlse.shape[-1]).sum(axis=(0, 2))   # (..., nh, T) -> (nh,)
    return dout.astype(cache.dtype, copy=False), dlse, dsinks.astype(cache.dtype, copy=False)


def _check_attention_sinks(out, lse, sinks):
    """Raise unless out is a float array with a head axis (..., nh, T, hv), lse (..., nh, T) and
    sinks fit _checks.check_sinks: (nh,) of out's dtype, finite."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"attention_sinks: out must be a NumPy array (..., nh, T, hv), got {type(out).__name__}")
    if out.ndim < 3:
        shape = getattr(sinks, "shape", None)
        raise ValueError(f"sinks (shape {shape}) need a head axis, one sink per query head; out {out.shape} has none")
    if not isinstance(lse, np.ndarray) or lse.shape != out.shape[:-1]:
        got = f"shape {lse.shape}" if isinstance(lse, np.ndarray) else type(lse).__name__
        raise ValueError(f"attention_sinks: lse must be an array of shape {out.shape[:-1]} (out's rows), got {got}")
    if sinks is None:
        raise TypeError("attention_sinks: sinks must be a NumPy array (nh,), got None")
    check_sinks(sinks, out)
