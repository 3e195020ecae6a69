"""FlashAttention, tuned: what numpy_attn/flash_attention.py computes, with the same arguments
and results (out, ``cache.lse``), faster. Read that file for the algorithm (Dao,
"FlashAttention-2", 2023: tiles, the online softmax, the backward from the log-sum-exp); this one
lists only what it does differently (docs/flash_attention_breakdown.md measures each):

- (batch, head) slices spread over threads (``_map_slices``), BLAS held to one thread meanwhile;
  the forward stacks several slices in each call (``STACK_SCORES``), the backward takes a key/value
  head and its query heads; grouped-query heads read their key/value slice in place instead of
  repeating it;
- tile buffers allocated once per slice (forward: per stack) and reused, k transposed once to
  contiguous rows;
- no running maximum on the first try: each row is shifted once by its score against key 0,
  folded into the tile matmul, and redone with the running maximum only where that overflowed
  (see UNSHIFTED_MIN_SUM for why this is as accurate);
- the row sums come out of p @ [v | 1], and in the backward s - lse and dP - D out of matmuls
  with an extra column, saving a pass over each tile;
- exponentials in base 2 where NumPy vectorizes np.exp2 (AVX-512), base e elsewhere (see EXP);
- causal: a tile the diagonal crosses is split (``_causal_pieces``) into blocks of DIAG_ROWS
  rows (DIAG_ROWS_BACKWARD in the backward), each against the keys up to its last row's only,
  masked by a precomputed triangle (``_exp_visible``);
- ``sinks``: the sink's exp(s_h - c) starts the row sum (the column of ones' total), so the
  tiles are untouched; the forward keeps each row's sink probability p, and the backward's
  dsinks = -sum p D needs only it and D, O(T).

Only top-left causal alignment (``is_causal`` True or False), block defaults 256 x 512.

float16 and bfloat16, as in the readable version: q, k, v and sinks cast up to float32 once at
the top, every tile, sum and lse in float32, the output and each gradient rounded once at the end
(float32 and float64 take no copy: the casts are no-ops for them).
"""

import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from numpy_attn._checks import check_attention_inputs, check_float, check_scale, check_sinks, upcast

LOG2E = math.log2(math.e)


def _exp2_is_vectorized():
    """Whether this NumPy has a SIMD float32 exp2 on this CPU (AVX-512: X86_V4, or AVX512_SKX
    before NumPy 2.4). Without it np.exp2 is scalar and half as fast as np.exp, which NumPy
    vectorizes with AVX2 as well (measured here on AVX2: 0.22 against 0.46 Gelem/s)."""
    try:   # private, np.show_runtime()'s source
        from numpy._core._multiarray_umath import __cpu_features__
    except ImportError:
        return False
    return bool(__cpu_features__.get("X86_V4") or __cpu_features__.get("AVX512_SKX"))


# The base the scores are exponentiated in, chosen once for this CPU: base 2 where np.exp2 is
# vectorized (log2(e) is folded into q's scale, T x hs multiplies, not T x S), else base e.
# LOG_FACTOR converts: a natural-log quantity x is x * LOG_FACTOR in the kernel's base.
EXP, LOG, LOG_FACTOR = (np.exp2, np.log2, LOG2E) if _exp2_is_vectorized() else (np.exp, np.log, 1.0)

# Below this many multiply-adds (slices x T x S x hs) the thread pool costs more than it saves.
PARALLEL_MIN_WORK = 1 << 22


class FlashCache(NamedTuple):
    """What the backward needs: the inputs, the output and the per-row log-sum-exp (no T x S array),
    all in the dtype computed in (float32 for float16 and bfloat16: the backward reads them there)."""

    q: np.ndarray           # (..., nh, T, hs)
    k: np.ndarray           # (..., nkv, S, hs)
    v: np.ndarray           # (..., nkv, S, hv)
    out: np.ndarray         # (..., nh, T, hv)
    lse_b: np.ndarray       # (..., nh, T) log-sum-exp of each row in the kernel's base: lse * LOG_FACTOR
    is_causal: bool
    scale: np.floating      # in the dtype computed in
    block_q: int
    block_k: int
    sinks: np.ndarray | None = None   # (nh,) the sink logits, None without them
    sink_p: np.ndarray | None = None  # (..., nh, T) each row's sink probability, None without sinks
    dtype: np.dtype | None = None     # the inputs' dtype, which the output and gradients are rounded to

    @property
    def lse(self):
        """(..., nh, T) log-sum-exp of each row of scale * q @ k^T (natural log).

        The cache keeps it in the kernel's base, as the backward uses it: converting there and
        back would round it twice more, and in float32 each rounding of lse (an ulp of |lse|,
        which grows with the scores) enters every probability the backward recomputes.
        """
        return self.lse_b / LOG_FACTOR


def _check_inputs(q, k, v, is_causal, scale, block_q, block_k, sinks):
    """Raise ValueError (TypeError for wrong array types) on inputs attention cannot take."""
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        if not isinstance(b, int | np.integer) or b < 1:
            raise ValueError(f"{name} must be a positive integer, got {b!r}")
    if not isinstance(is_causal, bool | np.bool_):
        # Only the top-left diagonal is tuned here; a string such as "bottom_right" would be truthy
        # and silently give top-left. numpy_attn/flash_attention.py takes both alignments.
        raise ValueError(f"is_causal must be True or False (top-left) in the tuned kernel, got "
                         f"{is_causal!r}; numpy_attn.flash_attention takes is_causal='bottom_right'")
    # The shapes, dtypes and grouped-query heads the reference takes, with the same messages.
    check_attention_inputs(q, k, v, attn_mask=None, is_causal=False, dropout_p=0.0, rng=None)
    check_scale(scale, dtype=q.dtype)   # as numpy_attn/flash_attention.py
    check_sinks(sinks, q)


def _cpu_count():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _one_blas_thread():
    """Limit BLAS to one thread while our own threads run, one slice each.

    A BLAS that also spread each small tile matmul over every core would oversubscribe them.
    threadpoolctl is optional (numpy_attn needs NumPy only); without it BLAS keeps its setting.
    """
    from numpy_attn._threads import limit_blas_threads

    return limit_blas_threads(1)


def _map_slices(fn, count, work):
    """Call fn(0), ..., fn(count - 1): on a thread pool when ``work`` is large enough.

    The (batch, head) slices are independent, and NumPy releases the GIL inside matmul and the
    ufuncs, so plain threads keep every core busy (one process, no copies of the inputs).
    """
    workers = min(count, _cpu_count())
    if workers < 2 or work < PARALLEL_MIN_WORK:
        for n in range(count):
            fn(n)
        return
    with _one_blas_thread(), ThreadPoolExecutor(workers) as pool:
        list(pool.map(fn, range(count)))   # list() re-raises here any exception of a worker


def _mask_future(s, i0, j0, future):
    """Set to -inf, in place, the scores in tile s (..., queries i0.., keys j0..) of keys after
    their query.

    ``future`` is a (block_q, block_q) square, -inf above its diagonal and 0 elsewhere. Keys before
    the block's first query are seen by all its rows: only the square on the diagonal needs a
    mask, the same for every block, and adding it is faster than a boolean ``np.copyto(where=)``.
    """
    bq, bk = s.shape[-2:]
    c0, c1 = max(j0, i0), min(j0 + bk, i0 + bq)            # keys inside the block's diagonal square
    if c0 < c1:
        s[..., c0 - j0:c1 - j0] += future[:bq, c0 - i0:c1 - i0]
    s[..., max(c1, j0) - j0:] = -np.inf                     # keys after the block's last query


def _exp_visible(s, i0, j0, keep):
    """p = EXP(s) in place, 0 where the key is after its query (tile s: ..., queries i0.., keys j0..).

    ``keep`` (block_q, block_q) is 1 on and below its diagonal, 0 above. The masked scores are
    zeroed before EXP and its results there after: exponentiating -inf (or any score whose result
    underflows) takes NumPy's float32 np.exp2 about 7 times as long as an ordinary score on
    AVX-512 (200 against 30 us for a 256 x 512 tile half masked), where np.exp does not slow down.
    A masked score of +inf (q k^T past the dtype's range) gives nan, as adding -inf did.
    """
    bq, bk = s.shape[-2:]
    c0, c1 = max(j0, i0), min(j0 + bk, i0 + bq)            # keys inside the block's diagonal square
    square = slice(c0 - j0, max(c1 - j0, 0))
    s[..., square] *= keep[:bq, c0 - i0:c1 - i0]
    s[..., max(c1, j0) - j0:] = 0                           # keys after the block's last query
    p = EXP(s, out=s)
    p[..., square] *= keep[:bq, c0 - i0:c1 - i0]
    p[..., max(c1, j0) - j0:] = 0
    return p


# Rows per piece of a diagonal square: the square of a row block of block_q rows then costs
# block_q * (block_q + DIAG_ROWS) / 2 scores instead of block_q^2, for block_q / DIAG_ROWS
# matmul pairs and exp calls instead of one (docs/flash_attention_breakdown.md measures it).
# The forward, whose calls take a stack of slices, is fastest with 32 rows; the backward, one
# slice per call, with 64 (32 made it 10% slower: twice the short calls).
DIAG_ROWS = 32
DIAG_ROWS_BACKWARD = 64


def _causal_pieces(i0, i1, j0, j1, is_causal, diag_rows):
    """The pieces (r0, r1, j0, k1, masked) of tile rows i0:i1 by keys j0:j1 that attention reads.

    Non-causal, or a tile wholly below the diagonal: the tile itself. A tile the diagonal
    crosses: rows r0:r1 of diag_rows each against keys j0:k1, up to their last row's (k1 <= r1);
    ``masked`` where some key is after row r0. (The keys before row i0 stay in each piece: split
    off, they would cost one more matmul pair and exp call per tile and save no score.)
    """
    if not is_causal or j1 - 1 <= i0:
        yield i0, i1, j0, j1, False
        return
    for r0 in range(i0, i1, diag_rows):
        r1 = min(r0 + diag_rows, i1)
        k1 = min(j1, r1)
        if j0 < k1:                                          # else these rows see none of the tile's keys
            yield r0, r1, j0, k1, k1 - 1 > r0


def _future_mask(block_q, T, dtype):
    """(future, keep), each (bq, bq): future -inf above the diagonal (a later key) and 0 on and
    below it, for _mask_future; keep 0 above the diagonal and 1 on and below it, for _exp_visible."""
    bq = min(block_q, T)
    keep = np.tri(bq, dtype=dtype)
    return np.where(keep == 1, dtype.type(0), dtype.type(-np.inf)), keep


# The forward first tries each block of query rows without the running maximum: each row's scores
# are shifted once by a constant c, its score against key 0 (folded into the tile matmul as an
# extra column of q, so no pass over the tile), then exponentiated: no max, no subtraction and no
# rescaling, two passes over every tile fewer. Any shift is exact in real arithmetic; this one is
# also as accurate as the running maximum m in float, because every row sees key 0, so c <= m:
# each weight exp(s - c) is exp(m - c) >= 1 times exp(s - m), and the row sum l is as many times
# larger, so a weight that underflows (or turns subnormal) here is one that underflows (or turns
# subnormal) against m too, and loses no more relative to l. (Shifting by 0 instead, as this
# kernel once did, loses every weight below exp(-87) in float32 even when s - m is not small:
# q = 1, k = (-40, -110), v = (1, 1e30) gave 1 instead of 1.3975.) l >= 1 for the same reason.
# Where the row spreads too far above c, anything overflows (inf or nan in p @ v_1) and the
# block is computed again with the running maximum: rows whose scores spread over more than
# about 88 (float32; 709 in float64) cost twice the time but give the same answer.
# UNSHIFTED_MIN_SUM guards l >= 1 (rounding cannot bring it near 1/2). A sink s_h is one more
# score of the row, with value 0: it starts the row sum at exp(s_h - c), and since c is still at
# most the row's maximum (over the scores and s_h) all of the above holds; a sink far above c
# overflows there and sends the block to the running maximum, which then starts at s_h - c.
UNSHIFTED_MIN_SUM = 0.5


def _pieces(i0, bq, S_seen, is_causal, block_k):
    """The forward's pieces of row block i0:i0+bq over keys 0:S_seen, as (a, b, k0, k1, masked):
    rows a:b of the block (0 <= a < b <= bq) against keys k0:k1 (_causal_pieces)."""
    for j0 in range(0, S_seen, block_k):
        for r0, r1, k0, k1, masked in _causal_pieces(i0, i0 + bq, j0, min(j0 + block_k, S_seen), is_causal,
                                                     DIAG_ROWS):
            yield r0 - i0, r1 - i0, k0, k1, masked


def _rows_unshifted(q_blk, k_t, v_1, acc, i0, S_seen, is_causal, masks, block_k, s_buf, pv_buf):
    """acc += sum over key tiles of exp(s - c) @ v_1, no running maximum; for each slice, whether
    that was safe ((G,) bool).

    q_blk (G, bq, hs+1) is [q * scale | -c] and k_t (G, hs+1, S) is [k^T ; 1], so the matmul
    yields s - c; acc (G, bq, hv+1). s_buf and pv_buf are flat buffers the tiles are views of.
    """
    G = len(q_blk)
    with np.errstate(over="ignore", invalid="ignore"):   # overflow is detected below
        for a, b, j0, j1, masked in _pieces(i0, q_blk.shape[1], S_seen, is_causal, block_k):
            rows, keys = b - a, j1 - j0
            s = np.matmul(q_blk[:, a:b], k_t[:, :, j0:j1], out=s_buf[:G * rows * keys].reshape(G, rows, keys))
            # (G, rows, keys) in place, exp(s - c); masked only in pieces crossing the diagonal
            p = _exp_visible(s, i0 + a, j0, masks[1]) if masked else EXP(s, out=s)
            acc[:, a:b] += np.matmul(p, v_1[:, j0:j1], out=pv_buf[:G * rows * acc.shape[2]].reshape(G, rows, -1))
    return np.isfinite(acc).all(axis=(1, 2)) & (acc[..., -1].min(axis=1) >= UNSHIFTED_MIN_SUM)


def _rows_shifted(q_blk, k_t, v_1, acc, i0, S_seen, is_causal, masks, block_k, s_buf, pv_buf, m):
    """acc = sum over key tiles of exp(s - m) @ v_1 with the running row maximum m; returns m.

    Its scores are s - c too (q_blk as in _rows_unshifted): m is the maximum of s - c. ``m``
    (G, bq) and acc come in holding what the tiles start from: -inf and 0, or the sink's; m is
    updated in place, a block of rows at a time on the diagonal.
    """
    G = len(q_blk)
    for a, b, j0, j1, masked in _pieces(i0, q_blk.shape[1], S_seen, is_causal, block_k):
        rows, keys = b - a, j1 - j0
        s = np.matmul(q_blk[:, a:b], k_t[:, :, j0:j1], out=s_buf[:G * rows * keys].reshape(G, rows, keys))
        if masked:
            _mask_future(s, i0 + a, j0, masks[0])
        m_new = np.maximum(m[:, a:b], s.max(axis=2))        # (G, rows), finite: key 0 is always seen first
        acc[:, a:b] *= EXP(m[:, a:b] - m_new)[..., None]     # rescale the old sums to the new maximum
        m[:, a:b] = m_new
        s -= m_new[..., None]
        p = EXP(s, out=s)                                    # (G, rows, keys) in [0, 1], in place
        acc[:, a:b] += np.matmul(p, v_1[:, j0:j1], out=pv_buf[:G * rows * acc.shape[2]].reshape(G, rows, -1))
    return m


# The causal forward takes several (batch, head) slices in each call, stacked along a first axis:
# a thread then makes one matmul or exp call per piece where it made one per slice's piece, and
# the Python between two calls, which runs holding the GIL while the other thread waits for it,
# is shared by more work. With two threads the diagonal's short pieces had lost most of their
# gain to it (docs/flash_attention_breakdown.md). A stack holds at most this many scores per
# tile: 4 MiB of float32, 8 slices of a 256 x 512 tile. The non-causal forward makes few, long
# calls and gains nothing: stacked, it measured 3% slower, its slices' keys and values no longer
# staying in a core's L2 cache from one row block to the next.
STACK_SCORES = 1 << 20


def _stack_size(N, block_q, block_k, is_causal):
    """Slices per stack: causal, as many as STACK_SCORES allows and no more than a worker's share
    of the N slices; else 1."""
    if not is_causal:
        return 1
    share = -(-N // max(1, min(N, _cpu_count())))            # ceil(N / workers)
    return max(1, min(share, STACK_SCORES // (block_q * block_k)))


def _forward_slices(q, ks, vs, out, lse_b, is_causal, scale, block_q, block_k, sink_b, sink_p):
    """A stack of G (batch, head) slices: q (G, T, hs), and ks, vs the G slices' k (S, hs) and
    v (S, hv) -> writes out (G, T, hv) and lse_b (G, T); sink_b (G,) is each slice's sink logit
    in the kernel's base, or None, and then sink_p (G, T) its probability in each row."""
    G, T, hs = q.shape
    S, hv = vs[0].shape
    dtype = q.dtype
    # Once per slice, O(S hs): k transposed to contiguous rows (the tile matmul reads it faster
    # than a transposed view) over a row of ones, so that [q | -c] @ k_t yields s - c; and v with
    # a column of ones, so that p @ v_1 yields in its last column the row sums of p. Each saves
    # a pass over every tile. Grouped-query heads copy their key/value slice here, not before.
    k_t = np.ones((G, hs + 1, S), dtype)                     # (G, hs+1, S): k^T over a row of ones
    v_1 = np.ones((G, S, hv + 1), dtype)                     # (G, S, hv+1)
    for n, (k_n, v_n) in enumerate(zip(ks, vs, strict=True)):
        k_t[n, :hs] = k_n.T
        v_1[n, :, :hv] = v_n
    # Tile buffers, reused: a fresh array this size per tile would come from the OS each time and
    # be page-faulted in. Views of their first G*rows*cols elements are contiguous for every shape.
    s_buf = np.empty(G * block_q * block_k, dtype)
    pv_buf = np.empty(G * block_q * (hv + 1), dtype)
    masks = _future_mask(block_q, T, dtype) if is_causal else None   # (bq, bq) causal masks
    for i0 in range(0, T, block_q):
        i1 = min(i0 + block_q, T)
        q_blk = np.empty((G, i1 - i0, hs + 1), dtype)        # (G, bq, hs+1): [q * scale | -c]
        np.multiply(q[:, i0:i1], scale * LOG_FACTOR, out=q_blk[..., :hs])   # scores in the kernel's base
        c = np.matmul(q_blk[..., :hs], k_t[:, :hs, :1])[..., 0]   # (G, bq) score against key 0, <= the row maximum
        q_blk[..., hs] = -c
        acc = np.zeros((G, i1 - i0, hv + 1), dtype)          # (G, bq, hv+1) running p @ v_1: numerator, l
        if sink_b is not None:   # the sink: value 0, score s_h, so it adds exp(s_h - c) to l alone
            with np.errstate(over="ignore"):                 # overflow sends the slice to the fallback
                acc[..., hv] = EXP(sink_b[:, None] - c)
        S_seen = min(S, i1) if is_causal else S              # causal: keys after row i1-1 are never seen
        top = np.zeros((G, i1 - i0), dtype)                  # the shift the sums were taken against, above c
        safe = _rows_unshifted(q_blk, k_t, v_1, acc, i0, S_seen, is_causal, masks, block_k, s_buf, pv_buf)
        # A slice that overflowed is computed again alone: no slice's result depends on the
        # slices stacked with it (or on how many threads there are).
        for n in np.flatnonzero(~safe):
            one = slice(n, n + 1)
            acc[n] = 0
            m0 = np.full((1, i1 - i0), -np.inf, dtype)       # (1, bq) the running maximum's start
            if sink_b is not None:   # the sink seen first: m = s_h - c, l = exp(s_h - c - m) = 1
                m0[0], acc[n, :, hv] = sink_b[n] - c[n], 1
            top[one] = _rows_shifted(q_blk[one], k_t[one], v_1[one], acc[one], i0, S_seen, is_causal, masks,
                                     block_k, s_buf, pv_buf, m0)
        row_sum = acc[..., hv]                               # (G, bq) >= 1: the row maximum's term
        out[:, i0:i1] = acc[..., :hv] / row_sum[..., None]
        lse_b[:, i0:i1] = c + top + LOG(row_sum)             # log-sum-exp in the kernel's base
        if sink_b is not None:   # kept for dsinks, as in the readable version: exp(s_h - m) / l
            sink_p[:, i0:i1] = EXP(sink_b[:, None] - c - top) / row_sum


def flash_attention_forward(q, k, v, is_causal=False, scale=None, block_q=256, block_k=512, sinks=None):
    """Attention of q (..., T, hs) over k (..., S, hs), v (..., S, hv) -> out (..., T, hv), in tiles.

    Returns ``(out, cache)``; ``cache.lse`` (..., T) is each query row's log-sum-exp. Tiles are
    block_q queries by block_k keys (any sizes >= 1). The defaults, 256 x 512 (512 KiB of float32
    scores, a core's L2 cache on the machine measured), were the fastest shape that held up in
    repeated runs there (docs/flash_attention_breakdown.md). ``sinks`` (nh,): each query head's
    sink logit joins its softmax (numpy_attn/flash_attention.py); the backward adds dsinks.
    float16 and bfloat16 are computed in float32 and the output rounded once; lse stays float32.
    """
    _check_inputs(q, k, v, is_causal, scale, block_q, block_k, sinks)
    dtype = q.dtype
    q, k, v, sinks = upcast(q), upcast(k), upcast(v), upcast(sinks)   # float32 for float16 and bfloat16
    T, hs = q.shape[-2:]
    S, hv = v.shape[-2:]
    # A tile never needs to be larger than the sequence: buffers are sized by the tiles.
    block_q, block_k = int(min(block_q, max(T, 1))), int(min(block_k, max(S, 1)))
    scale = q.dtype.type(1 / np.sqrt(hs) if scale is None else scale)
    N, Nkv = math.prod(q.shape[:-2]), math.prod(k.shape[:-2])   # (batch, head) slices
    g = N // Nkv if Nkv else 1                               # query heads per key/value head
    q3 = q.reshape(N, T, hs)                                 # (..., nh, T, hs) -> (N, T, hs)
    k3 = k.reshape(Nkv, S, hs)                               # (..., nkv, S, hs) -> (Nkv, S, hs)
    v3 = v.reshape(Nkv, S, hv)                               # (..., nkv, S, hv) -> (Nkv, S, hv)
    out = np.zeros((N, T, hv), q.dtype)                      # stays 0 if S = 0
    lse_b = np.full((N, T), -np.inf, q.dtype)                # log(0) if S = 0
    # Each slice's sink in the kernel's base: slice n is query head n % nh.
    sinks_b = None if sinks is None else np.tile(sinks * q.dtype.type(LOG_FACTOR), N // len(sinks))   # (N,)
    sink_p = None if sinks is None else np.ones((N, T), q.dtype)   # (N, T); S = 0: the sink alone, p = 1
    if sinks is not None:   # S = 0: lse = s_h
        lse_b[:] = sinks_b[:, None]
    G = _stack_size(N, block_q, block_k, is_causal)

    def one(i):   # the stack of query slices n0:n1; slice n reads key/value slice n // g
        n = slice(i * G, min(i * G + G, N))
        kv = [m // g for m in range(n.start, n.stop)]
        sink_b, sink_p_n = (None, None) if sinks is None else (sinks_b[n], sink_p[n])
        _forward_slices(q3[n], [k3[m] for m in kv], [v3[m] for m in kv], out[n], lse_b[n], is_causal, scale,
                        block_q, block_k, sink_b, sink_p_n)

    if S > 0:
        _map_slices(one, -(-N // G), N * T * S * hs)
    out = out.reshape(q.shape[:-1] + (hv,))                  # (N, T, hv) -> (..., nh, T, hv)
    lse_b = lse_b.reshape(q.shape[:-1])                      # (N, T) -> (..., nh, T)
    sink_p = None if sinks is None else sink_p.reshape(q.shape[:-1])   # (N, T) -> (..., nh, T)
    cache = FlashCache(q, k, v, out, lse_b, is_causal, scale, block_q, block_k, sinks, sink_p, dtype)
    return out.astype(dtype, copy=False), cache              # rounded once to the inputs' dtype


def _backward_slice(q, k, v, out, dout, lse_b, dq, dk, dv, is_causal, scale, block_q, block_k):
    """One key/value head and its g query heads: q, out, dout (g, T, .), lse_b (g, T), k, v (S, .)
    -> writes dq (g, T, hs), dk (S, hs), dv (S, hv)."""
    g, T, hs = q.shape
    S, hv = v.shape
    dtype = q.dtype
    # Appending a column to each side of a matmul adds a term to every entry: [a | -c] @ [b | 1]^T
    # = a @ b^T - c. So s - lse and dP - D come out of the matmuls, saving two passes per tile.
    k_1 = np.ones((hs + 1, S), dtype)                        # (hs+1, S): k^T over a row of ones
    k_1[:hs] = k.T
    v_1 = np.ones((hv + 1, S), dtype)                        # (hv+1, S): v^T over a row of ones
    v_1[:hv] = v.T
    q_lse = np.empty((T, hs + 1), dtype)                     # (T, hs+1): [q * scale * LOG_FACTOR | -lse_b]
    dout_D = np.empty((T, hv + 1), dtype)                    # (T, hv+1): [dout | -D]
    s_buf = np.empty(block_q * block_k, dtype)
    dp_buf = np.empty(block_q * block_k, dtype)
    dkv_buf = np.empty(block_k * max(hs, hv), dtype)
    dq_buf = np.empty(block_q * hs, dtype)
    keep = _future_mask(block_q, T, dtype)[1] if is_causal else None   # (bq, bq) causal mask
    for h in range(g):
        np.multiply(q[h], scale * LOG_FACTOR, out=q_lse[:, :hs])
        np.negative(lse_b[h], out=q_lse[:, hs])
        dout_D[:, :hv] = dout[h]
        # D = rowsum(dout * out) without a (T, hv) temporary. Undoes out = acc / l (Algorithm 2).
        np.negative(np.einsum("ij,ij->i", dout[h], out[h]), out=dout_D[:, hv])
        dq_h = dq[h]
        for j0 in range(0, S, block_k):
            j1 = min(j0 + block_k, S)
            i_first = j0 // block_q * block_q if is_causal else 0   # causal: rows before j0 see none of these keys
            for i0 in range(i_first, T, block_q):
                for r0, r1, k0, k1, masked in _causal_pieces(i0, min(i0 + block_q, T), j0, j1, is_causal,
                                                             DIAG_ROWS_BACKWARD):
                    rows, keys = r1 - r0, k1 - k0
                    # Undoes p = EXP(s - m) and the running sums: recomputed from lse directly.
                    s = np.matmul(q_lse[r0:r1], k_1[:, k0:k1], out=s_buf[:rows * keys].reshape(rows, keys))
                    p = _exp_visible(s, r0, k0, keep) if masked else EXP(s, out=s)   # (rows, keys)
                    # Undoes acc += p @ v: dv gets p^T dout.
                    dv_tile = np.matmul(p.T, dout[h, r0:r1], out=dkv_buf[:keys * hv].reshape(keys, hv))
                    dv[k0:k1] += dv_tile
                    dp = np.matmul(dout_D[r0:r1], v_1[:, k0:k1], out=dp_buf[:rows * keys].reshape(rows, keys))
                    ds = np.multiply(dp, p, out=dp)          # dS = P * (dP - D): softmax backward
                    # Undoes s = (q * scale) @ k^T; the scale is applied once at the end.
                    dk_tile = np.matmul(ds.T, q[h, r0:r1], out=dkv_buf[:keys * hs].reshape(keys, hs))
                    dk[k0:k1] += dk_tile
                    dq_tile = np.matmul(ds, k[k0:k1], out=dq_buf[:rows * hs].reshape(rows, hs))
                    dq_h[r0:r1] += dq_tile
        dq_h *= scale
    dk *= scale


def flash_attention_backward(dout, cache):
    """Gradients: dout (..., T, hv) -> (dq (..., T, hs), dk (..., S, hs), dv (..., S, hv)), and
    dsinks (nh,) after them if the forward had ``sinks``.

    With grouped-query attention dk and dv have the fewer heads of k and v: each sums its group.
    """
    q, k, v, out, lse_b, is_causal, scale, block_q, block_k, sinks, sink_p, dtype = cache
    check_float("dout", dout)
    if dout.dtype != dtype:   # the output's dtype: the cache holds float32 for float16 and bfloat16
        raise TypeError(f"arrays must share one dtype: dout is {dout.dtype}, out is {dtype}")
    if dout.shape != out.shape:
        raise ValueError(f"dout of shape {dout.shape} must have the output's shape {out.shape}")
    dout = upcast(dout)                                      # float32 for float16 and bfloat16
    T, hs = q.shape[-2:]
    S, hv = v.shape[-2:]
    N, Nkv = math.prod(q.shape[:-2]), math.prod(k.shape[:-2])
    groups = (Nkv, N // Nkv if Nkv else 1, T)                # (Nkv, g, T): the query heads of each kv head
    k3 = k.reshape(Nkv, S, hs)                               # (..., nkv, S, hs) -> (Nkv, S, hs)
    v3 = v.reshape(Nkv, S, hv)                               # (..., nkv, S, hv) -> (Nkv, S, hv)
    q4 = q.reshape(groups + (hs,))                           # (..., nh, T, hs) -> (Nkv, g, T, hs)
    out4 = out.reshape(groups + (hv,))
    dout4 = dout.reshape(groups + (hv,))
    lse_b = lse_b.reshape(groups)                            # (..., nh, T) -> (Nkv, g, T)
    dq = np.zeros(q4.shape, q.dtype)
    dk = np.zeros(k3.shape, k.dtype)
    dv = np.zeros(v3.shape, v.dtype)

    def one(n):   # key/value slice n with its g query heads: no two workers write the same dk, dv
        _backward_slice(q4[n], k3[n], v3[n], out4[n], dout4[n], lse_b[n], dq[n], dk[n], dv[n],
                        is_causal, scale, block_q, block_k)

    if S > 0 and T > 0:
        _map_slices(one, Nkv, N * T * S * hs)
    grads = dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)
    if sinks is not None:   # dsinks = -sum over rows of p D (numpy_attn/flash_attention.py derives it)
        D = np.einsum("...ij,...ij->...i", dout, out)        # (..., nh, T)
        grads += ((-(sink_p * D)).sum(axis=-1).reshape(-1, len(sinks)).sum(axis=0),)   # (nh,)
    return tuple(d.astype(dtype, copy=False) for d in grads)   # each rounded once
