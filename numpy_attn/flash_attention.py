"""FlashAttention: exact attention computed in tiles, never forming the (T, S) scores, with backward.

    out = softmax(scale * q @ k^T) @ v                          scale = 1 / sqrt(hs) unless given

Dao, "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning" (2023),
Algorithm 1 (forward) and Algorithm 2 (backward), written out as loops over tiles of block_q
queries by block_k keys. Forward: each query tile visits the key tiles in order, keeping per row
a running maximum m, a running sum l = sum_j exp(s_j - m) and a running numerator
acc = sum_j exp(s_j - m) v_j. When a tile raises the maximum to m', the old l and acc are
multiplied by exp(m - m'). This is exact, not an approximation, because for any constant m

    softmax(s)_j = exp(s_j - m) / sum_i exp(s_i - m),

so sums taken against an old maximum equal, once rescaled, sums taken against the new one. A row
ends with out = acc / l and lse = m + log(l), its log-sum-exp: all that is stored besides the
inputs, O(T) memory instead of O(T S). Backward: each tile's probabilities are recomputed as
P = exp(S - lse) (no maximum, no sum), then dV += P^T dO, dP = dO V^T, dS = P * (dP - D),
dQ += scale dS K, dK += scale dS^T Q, where D = rowsum(dO * O) equals rowsum(P * dP), the softmax
backward's sum, without a pass over the keys.

``is_causal=True`` is top-left aligned as in ``torch.nn.functional.scaled_dot_product_attention``:
query t sees keys 0..t; ``is_causal="bottom_right"`` lets it see keys 0..S-T+t (see the picture in
numpy_attn/attention.py). Tiles above either diagonal are skipped, not computed and masked, so
causal attention does about half the work. A row that sees no key (S = 0, or the first T - S rows
bottom-right aligned) gives zeros and zero gradients; every other row sees key 0. Unlike
numpy_attn/attention.py there is no ``attn_mask`` and no dropout. Grouped-query attention works
as there, at the edges: k and v may have fewer heads (axis -3) than q, query head h reading
key/value head h // g.

``window=w`` (with is_causal, as FlashAttention-2's ``window_size=(w - 1, 0)``) lets query t see
only keys t + offset - w < s <= t + offset (numpy_attn/masks.py's sliding_window_mask): a query
tile visits only the key tiles that meet its band, from the one holding its first row's first
key to the diagonal, so the work grows with T w instead of T S. A row may then see no key of the
first tile it visits (its window starts in a later one): its running maximum stays -inf and the
shift is taken as 0 there, so that its sums stay 0 instead of exp(-inf + inf) = NaN. Top-left
aligned with T > S + w - 1, the last rows see no key: zeros, as above. ``softcap=c`` caps every
score at c * tanh(s / c) before the mask (numpy_attn/softcap.py, FlashAttention-2's
``softcap``); lse is then that of the capped scores, and the backward multiplies dS by the cap's
derivative 1 - tanh^2, recomputed with the scores.

``sinks`` (nh,), one learned logit s_h per query head (gpt-oss; grouped-query heads too), joins
every row's softmax as one more column whose value vector is zero, and is dropped again:

    weights = exp(s - m) / (sum_j exp(s_j - m) + exp(s_h - m)),   m = max(max_j s_j, s_h)

It is folded in by starting each row's online softmax with it, as the column visited first:
m = s_h, l = exp(s_h - m) = 1, acc = 0 (its value is zero). Folding it in at the end instead
would cost one more rescale per row; starting with it costs nothing per tile, and it keeps m
finite from the start. The sink is neither scaled nor capped nor masked. lse is then the row's
log-sum-exp with the sink, L = log(sum_j exp(s_j) + exp(s_h)), so the backward's P = exp(S - L)
needs no change; a row that sees no key gives output 0 and lse = s_h (the sink alone).
dsinks, derived: out = sum_j exp(s_j - L) v_j and dL/ds_h = exp(s_h - L) = p, the sink's
probability, so d out / d s_h = -p out and dLoss/ds_h = sum_rows dout . (-p out) = -p D, with
D = rowsum(dout * out) the backward's D (the softmax backward's dS = P (dP - D) for a column of
dP = dout . 0 = 0). dsinks sums -p D over every row, batch and query position of head h. The
forward keeps p = exp(s_h - m) / l per row (O(T), as lse) rather than have the backward
recompute it as exp(s_h - lse): lse rounds to an ulp of |lse|, which exp turns into |lse| ulps
of error in p, where the kept p has the few ulps of the division.

float16 and bfloat16: q, k, v (and sinks) are cast up to float32 once, at the top, and every
tile, the running m and l, the accumulator and lse stay in float32; the output is rounded once at
the end, and each gradient once at the end of the backward (lse and the cache stay float32). This
is how FlashAttention itself works: low-precision inputs, float32 accumulators, as PyTorch's
opmath and its CPU flash kernel (docs/precision.md), except that the probabilities are not
rounded to the low dtype before P @ V here, so the error is that of float32 rounded once.

This is the readable version; numpy_attn/kernels/flash_attention.py computes the same, faster.
"""

from typing import NamedTuple

import numpy as np

from numpy_attn._checks import (
    check_attention_inputs,
    check_dout,
    check_scale,
    check_sinks,
    check_softcap,
    check_window_is_causal,
    upcast,
)
from numpy_attn.masks import causal_mask, sliding_window_mask
from numpy_attn.softcap import logit_softcap_backward, logit_softcap_forward


class FlashCache(NamedTuple):
    """What the backward needs: the inputs, the output and the per-row log-sum-exp (no T x S array),
    all in the dtype computed in (float32 for float16 and bfloat16: the backward reads them there)."""

    q: np.ndarray           # (..., nh, T, hs)
    k: np.ndarray           # (..., nh, S, hs) k, its heads repeated g times
    v: np.ndarray           # (..., nh, S, hv) v, its heads repeated g times
    out: np.ndarray         # (..., nh, T, hv) a copy of the forward's output
    lse: np.ndarray         # (..., nh, T) log-sum-exp of each row of scale * q @ k^T
    is_causal: bool
    scale: np.floating      # in the dtype computed in
    block_q: int
    block_k: int
    g: int                  # query heads per key/value head (1 without grouped-query heads)
    softcap: float | None = None   # the cap c of c * tanh(s / c), None without one
    window: int | None = None      # the sliding window, None without one
    sinks: np.ndarray | None = None   # (nh,) the sink logits, None without them
    sink_p: np.ndarray | None = None  # (..., nh, T) each row's sink probability exp(s_h - lse), None without
    dtype: np.dtype | None = None     # the inputs' dtype, which the output and gradients are rounded to


def flash_attention_forward(q, k, v, is_causal=False, scale=None, block_q=128, block_k=512, softcap=None,
                            window=None, sinks=None):
    """Attention of q (..., T, hs) over k (..., S, hs), v (..., S, hv) -> out (..., T, hv), in tiles.

    Returns ``(out, cache)``; ``cache.lse`` (..., T) is each query row's log-sum-exp. Tiles are
    block_q queries by block_k keys (any sizes >= 1; larger than the lengths means one tile).
    The backward reads the output (D = rowsum(dout * out)) from ``cache.out``, a copy (O(T hv)),
    so changing ``out`` in place after the forward leaves the gradients alone. ``softcap`` caps
    the scores at c * tanh(s / c); ``window`` (with is_causal) keeps each query's last keys only;
    ``sinks`` (nh,) adds each query head's sink logit to its softmax (the backward adds dsinks).
    float16 and bfloat16 are computed in float32 and the output rounded once; lse stays float32.
    """
    _check_flash_attention(q, k, v, is_causal, scale, block_q, block_k, softcap, window, sinks)
    dtype = q.dtype
    q, k, v, sinks = upcast(q), upcast(k), upcast(v), upcast(sinks)   # float32 for float16 and bfloat16
    T, hs = q.shape[-2:]
    S, hv = v.shape[-2:]
    scale = q.dtype.type(1 / np.sqrt(hs) if scale is None else scale)
    g = q.shape[-3] // k.shape[-3] if q.shape[:-2] != k.shape[:-2] else 1   # query heads per key head
    if g > 1:   # grouped-query: repeat key/value head j for its query heads j*g .. j*g+g-1
        k, v = np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3)   # (..., nkv, S, .) -> (..., nh, S, .)
    align = "bottom_right" if is_causal == "bottom_right" else "top_left"
    offset = S - T if align == "bottom_right" else 0         # causal: query t sees keys 0..t+offset
    first = min(T, max(0, -offset)) if S > 0 else T          # rows before it see no key: out 0, lse log(0)
    last = _last_row(T, S, offset, window)                   # rows from it on see no key (a window, top-left)
    out = np.zeros(q.shape[:-1] + (hv,), q.dtype)            # (..., T, hv)
    lse = np.full(q.shape[:-1], -np.inf, q.dtype)            # (..., T)
    sink_p = None if sinks is None else np.ones(q.shape[:-1], q.dtype)   # (..., nh, T) for dsinks
    if sinks is not None:   # rows that see no key: the sink alone, lse = s_h, p = 1 (out stays 0)
        lse[...] = sinks[:, None]                            # (nh,) -> (..., nh, T)
    for i0 in range(first, last, block_q):                   # query tile: rows i0 .. i1-1
        i1 = min(i0 + block_q, last)
        q_i = q[..., i0:i1, :] * scale                       # (..., bq, hs)
        m = np.full(q_i.shape[:-1], -np.inf, q.dtype)        # (..., bq) running row maximum
        row_sum = np.zeros(q_i.shape[:-1], q.dtype)          # (..., bq) running sum of exp(s - m): l
        acc = np.zeros(q_i.shape[:-1] + (hv,), q.dtype)      # (..., bq, hv) running sum of exp(s - m) v
        if sinks is not None:   # the sink is the column seen first: m = max(-inf, s_h), l = 0 + exp(s_h - m) = 1
            m = np.maximum(m, sinks[:, None])                # (nh,) -> (..., nh, bq); acc += 0: its value is 0
            row_sum = row_sum + np.exp(sinks[:, None] - m)   # (..., nh, bq)
        S_seen = min(S, i1 + offset) if is_causal else S     # causal: keys after row i1-1's are never seen
        # A window: keys before row i0's first are never seen; start at the key tile holding it.
        j_first = max(0, i0 + offset - window + 1) // block_k * block_k if window else 0
        for j0 in range(j_first, S_seen, block_k):           # key tile: keys j0 .. j1-1
            j1 = min(j0 + block_k, S_seen)
            s = q_i @ k[..., j0:j1, :].swapaxes(-1, -2)      # (..., bq, bk)
            if softcap is not None:                          # c * tanh(s / c), before the mask
                s, _ = logit_softcap_forward(s, softcap)     # (..., bq, bk)
            if is_causal and _crosses(i0, i1, j0, j1, offset, window):   # hide the keys a row may not see
                s = np.where(_visible(T, S, align, window, slice(i0, i1), slice(j0, j1)), s, -np.inf)
            m_new = np.maximum(m, s.max(axis=-1))            # (..., bq); -inf while a row has seen no key
            m_safe = np.where(m_new == -np.inf, 0, m_new)    # (..., bq) shift by 0 there: p, alpha 0, not NaN
            p = np.exp(s - m_safe[..., None])                # (..., bq, bk) in [0, 1]
            alpha = np.exp(m - m_safe)                       # (..., bq) rescales the old sums to m_new
            row_sum = alpha * row_sum + p.sum(axis=-1)       # (..., bq)
            acc = alpha[..., None] * acc + p @ v[..., j0:j1, :]   # (..., bq, hv)
            m = m_new
        out[..., i0:i1, :] = acc / row_sum[..., None]        # (..., bq, hv); row_sum >= 1 (the maximum adds 1)
        lse[..., i0:i1] = m + np.log(row_sum)                # (..., bq)
        if sinks is not None:   # kept for dsinks: the sink's probability, its share of the row sum
            sink_p[..., i0:i1] = np.exp(sinks[:, None] - m) / row_sum   # (..., nh, bq)
    cache = FlashCache(q, k, v, out.copy(), lse, is_causal, scale, block_q, block_k, g, softcap, window, sinks,
                       sink_p, dtype)
    return out.astype(dtype, copy=False), cache              # rounded once to the inputs' dtype


def flash_attention_backward(dout, cache):
    """Gradients: dout (..., T, hv) -> (dq (..., T, hs), dk (..., S, hs), dv (..., S, hv)), and
    dsinks (nh,) after them if the forward had ``sinks``: (dq, dk, dv[, dsinks]).

    With grouped-query attention dk and dv have the fewer heads of k and v: each sums its group.
    """
    q, k, v, out, lse, is_causal, scale, block_q, block_k, g, softcap, window, sinks, sink_p, dtype = cache
    check_dout("flash_attention", dout, out.shape, dtype)
    dout = upcast(dout)                                      # float32 for float16 and bfloat16
    T, hs = q.shape[-2:]
    S, hv = v.shape[-2:]
    # Undoes out = acc / row_sum: D = rowsum(dout * out) = rowsum(P * dP), the softmax backward's sum.
    D = (dout * out).sum(axis=-1)                            # (..., T)
    align = "bottom_right" if is_causal == "bottom_right" else "top_left"
    offset = S - T if align == "bottom_right" else 0         # causal: query t sees keys 0..t+offset
    first = min(T, max(0, -offset))                          # rows before it see no key: gradient 0
    last = _last_row(T, S, offset, window)                   # rows from it on see no key: gradient 0
    dq = np.zeros(q.shape, q.dtype)                          # (..., nh, T, hs)
    dk = np.zeros(k.shape, k.dtype)                          # (..., nh, S, hs)
    dv = np.zeros(v.shape, v.dtype)                          # (..., nh, S, hv)
    S_seen = min(S, last + offset) if is_causal else S       # causal: keys after the last row's are never seen
    for j0 in range(0, S_seen if T > 0 else 0, block_k):     # key tile: keys j0 .. j1-1
        j1 = min(j0 + block_k, S_seen)
        dk_j = np.zeros(k.shape[:-2] + (j1 - j0, hs), k.dtype)   # (..., bk, hs)
        dv_j = np.zeros(v.shape[:-2] + (j1 - j0, hv), v.dtype)   # (..., bk, hv)
        # Causal: rows before j0 - offset see none of these keys; the tiles start at first.
        i_first = first + max(0, j0 - offset - first) // block_q * block_q if is_causal else first
        # A window: rows after j1 - 1 + window - 1 - offset see none of these keys either.
        i_stop = min(last, j1 - 1 + window - offset) if window else last
        for i0 in range(i_first, i_stop, block_q):           # query tile: rows i0 .. i1-1
            i1 = min(i0 + block_q, last)
            q_i, dout_i = q[..., i0:i1, :], dout[..., i0:i1, :]
            # Undoes the tile's p = exp(s - m) and the running sums: recomputed from lse directly.
            s = (q_i * scale) @ k[..., j0:j1, :].swapaxes(-1, -2)   # (..., bq, bk)
            if softcap is not None:                          # c * tanh(s / c), its tanh kept for ds
                s, softcap_cache = logit_softcap_forward(s, softcap)   # (..., bq, bk)
            if is_causal and _crosses(i0, i1, j0, j1, offset, window):   # hide the keys a row may not see
                s = np.where(_visible(T, S, align, window, slice(i0, i1), slice(j0, j1)), s, -np.inf)
            p = np.exp(s - lse[..., i0:i1, None])            # (..., bq, bk) the softmax weights
            # Undoes acc += p @ v.
            dv_j += p.swapaxes(-1, -2) @ dout_i              # (..., bk, hv)
            dp = dout_i @ v[..., j0:j1, :].swapaxes(-1, -2)  # (..., bq, bk)
            # Undoes p = softmax(s) on this tile: dS = P * (dP - D).
            ds = p * (dp - D[..., i0:i1, None])              # (..., bq, bk)
            if softcap is not None:                          # Undoes s = c * tanh(s / c)
                ds = logit_softcap_backward(ds, softcap_cache)   # (..., bq, bk)
            # Undoes s = (q * scale) @ k^T.
            dq[..., i0:i1, :] += scale * (ds @ k[..., j0:j1, :])   # (..., bq, hs)
            dk_j += scale * (ds.swapaxes(-1, -2) @ q_i)      # (..., bk, hs)
        dk[..., j0:j1, :] = dk_j
        dv[..., j0:j1, :] = dv_j
    if g > 1:   # grouped-query: undoes the repeat; key/value head j sums the gradients of its g query heads
        # (..., nh, S, .) -> (..., nkv, g, S, .) -> (..., nkv, S, .)
        dk, dv = (d.reshape(d.shape[:-3] + (-1, g) + d.shape[-2:]).sum(axis=-3) for d in (dk, dv))
    if sinks is not None:   # Undoes the sink column: dS = p (0 - D), p its probability, summed over the rows
        dsink = -sink_p * D                                  # (..., nh, T)
        dsinks = dsink.sum(axis=-1).reshape(-1, len(sinks)).sum(axis=0)   # (..., nh, T) -> (nh,)
        return tuple(d.astype(dtype, copy=False) for d in (dq, dk, dv, dsinks))   # each rounded once
    return tuple(d.astype(dtype, copy=False) for d in (dq, dk, dv))


def _last_row(T, S, offset, window):
    """The first query row from which on no row sees a key: T, but for a window aligned top-left
    (row t sees keys > t + offset - window, none once that passes key S - 1)."""
    return T if window is None else max(0, min(T, S - 1 + window - offset))


def _crosses(i0, i1, j0, j1, offset, window):
    """Whether the tile of rows i0..i1-1 by keys j0..j1-1 holds a key some row may not see: one
    past a row's diagonal, or (a window) one before a row's first key."""
    return j1 - 1 > i0 + offset or (window is not None and j0 <= i1 - 1 + offset - window)


def _visible(T, S, align, window, rows, cols):
    """(bq, bk) tile of the (T, S) causal or sliding-window mask: True where a query may attend."""
    if window is None:
        return causal_mask(T, S, align, rows, cols)
    return sliding_window_mask(T, S, window, align, rows, cols)


def _check_flash_attention(q, k, v, is_causal, scale, block_q, block_k, softcap, window, sinks):
    """Raise TypeError/ValueError on inputs flash attention cannot take, naming the argument."""
    if not (isinstance(is_causal, bool | np.bool_) or is_causal in ("top_left", "bottom_right")):
        raise ValueError(f'is_causal must be False, True, "top_left" or "bottom_right", got {is_causal!r}')
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        if not isinstance(b, int | np.integer) or isinstance(b, bool):
            raise TypeError(f"{name} must be a positive integer, got {b!r}")
        if b < 1:
            raise ValueError(f"{name} must be a positive integer, got {b!r}")
    check_window_is_causal(window, is_causal)
    # The shapes, dtypes and grouped-query heads that numpy_attn/attention.py takes, same messages.
    check_attention_inputs(q, k, v)
    check_scale(scale, dtype=q.dtype)
    check_softcap(softcap, dtype=q.dtype)
    check_sinks(sinks, q)
