"""FlexAttention: attention whose scores a user's function modifies or masks, tile by tile.

    score = scale * q @ k^T,  score = score_mod(score, b, h, q_idx, kv_idx),
    score = -inf where not mask_mod(b, h, q_idx, kv_idx),  out = softmax(score) @ v

as ``torch.nn.attention.flex_attention`` defines it (He, Guessous, Liang, Zhang, Horace He et al.,
"FlexAttention", 2024). ``b, h, q_idx, kv_idx`` are integer index grids that broadcast against the
scores (B, 1, 1, 1), (1, H, 1, 1), (1, 1, L, 1), (1, 1, 1, S), so a modifier is written once as an
expression of arrays. A ``BlockMask`` (from ``create_block_mask``) lists, per block of queries, the
key blocks that are partly masked and those fully kept; every other block is skipped. Two paths,
equal up to rounding: ``dense_flex_attention_forward`` (all scores, then the modifiers; the torch
twin's) and ``flex_attention_forward``, the online softmax of FlashAttention-2 (Dao, 2023) that
visits only the listed blocks and calls mask_mod only inside the partial ones.

The backward is written by hand through the modifiers: a ``ScoreMod`` carries the derivative of
its output with respect to the score (``dscore``) and the gradients of its parameters
(``dparams``, a scatter-add over the index it read). A plain function as score_mod works forward
but the backward refuses it. Fully masked rows give output 0, lse -inf and zero gradients.

``sinks`` (Hq,), one learned logit s_h per query head (gpt-oss), joins every row's softmax as
one more column of value zero, after the modifiers and the mask, and is dropped again (the
derivation of dsinks is in numpy_attn/flash_attention.py): it enters the row's maximum and sum
only, so the dense path adds exp(s_h - m) to the row sum and the tiled path starts each row's
running sums with it (m = s_h, l = 1). lse then includes the sink; a fully masked row gives
output 0 and lse = s_h. The backward returns dsinks = -sum over rows of p (D - dlse), p the
sink's probability, which the forward keeps.

What a user's function returns is checked where it is called (``_call_mask_mod``,
``_call_score_mod``, ``_call_dparams``): the kind (a NumPy array), the dtype (bool for a mask, as
torch requires; real numbers for a score) and the shape (it must broadcast to the scores without
growing them); a refusal names the function. A float mask read as bool would invert an additive
0 / -inf mask, and a score of the wrong shape would give an output of the wrong shape.

float16 and bfloat16: q, k, v and sinks are cast up to float32 once, at the top, so the scores
the modifiers see, the softmax, its sums and lse are float32 (as torch's flex_attention computes
its scores in float32 for both), and the output is rounded once to the inputs' dtype at the end;
lse is returned in float32. The backward likewise rounds each gradient once (a score_mod
parameter's to that parameter's dtype, its scatter-add summed in float32), docs/precision.md.
"""

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from numpy_attn._checks import (
    FLOAT_DTYPES,
    check_dout,
    check_float,
    check_ndim,
    check_same_dtype,
    check_scale,
    check_sinks,
    check_softcap,
    layout_hint,
    opmath,
    upcast,
)

# ---------------------------------------------------------------------------------------------
# Mask modifiers: mask_mod(b, h, q_idx, kv_idx) -> bool array, True where a query may attend.

def causal(b, h, q_idx, kv_idx):
    """Top-left aligned causal mask (is_causal in F.scaled_dot_product_attention)."""
    return q_idx >= kv_idx


def causal_bottom_right(Q_LEN, KV_LEN):
    """Bottom-right aligned causal mask: query i of Q_LEN sees keys 0..KV_LEN - Q_LEN + i."""
    def mask_mod(b, h, q_idx, kv_idx):
        return q_idx + (KV_LEN - Q_LEN) >= kv_idx
    return mask_mod


def sliding_window(window):
    """Causal and local: query i sees the ``window`` keys i - window + 1 .. i."""
    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < window)
    return mask_mod


def prefix_lm(prefix_length):
    """Bidirectional over the first ``prefix_length`` keys, causal after them."""
    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx < prefix_length) | (q_idx >= kv_idx)
    return mask_mod


def document(seq_lengths):
    """Packed sequences: a query sees only keys of its own document (lengths in packing order;
    from cu_seqlens, pass ``np.diff(cu_seqlens)``). Combine with causal through and_masks."""
    _check_document(seq_lengths)
    doc_id = np.repeat(np.arange(len(seq_lengths)), seq_lengths)      # (total,) document of each position

    def mask_mod(b, h, q_idx, kv_idx):
        _check_document_covers(seq_lengths, q_idx, kv_idx)           # else an IndexError
        return doc_id[q_idx] == doc_id[kv_idx]
    return mask_mod


def and_masks(*mask_mods):
    """A mask_mod that keeps a position where every one of ``mask_mods`` keeps it."""
    def mask_mod(b, h, q_idx, kv_idx):
        keep = True
        for mod in mask_mods:
            keep = keep & _call_mask_mod(mod, (b, h, q_idx, kv_idx))
        return keep
    return mask_mod


def or_masks(*mask_mods):
    """A mask_mod that keeps a position where any one of ``mask_mods`` keeps it."""
    def mask_mod(b, h, q_idx, kv_idx):
        keep = False
        for mod in mask_mods:
            keep = keep | _call_mask_mod(mod, (b, h, q_idx, kv_idx))
        return keep
    return mask_mod


# ---------------------------------------------------------------------------------------------
# Score modifiers: score_mod(score, b, h, q_idx, kv_idx) -> new score, each with its derivatives.

class ScoreMod(NamedTuple):
    """A score modifier and its derivatives, all called as fn(score, b, h, q_idx, kv_idx).

    ``dscore(...)`` -> d new score / d score, elementwise (broadcastable to the scores).
    ``dparams(grad, ...)`` -> {name: gradient of params[name]} given grad = dL / d new score.
    A plain function as score_mod has neither: the backward refuses it.
    """

    fn: Callable
    dscore: Callable
    dparams: Callable | None = None
    params: dict | None = None

    def __call__(self, score, b, h, q_idx, kv_idx):
        return self.fn(score, b, h, q_idx, kv_idx)


def _one(score, b, h, q_idx, kv_idx):
    """d (score + bias) / d score."""
    return np.ones((), dtype=score.dtype)


def _scatter_add(param, index, grad):
    """A zero array like ``param`` plus ``grad`` summed in at ``param[index]``, in ``param``'s
    opmath dtype (float32 for a float16 or bfloat16 table: the backward rounds it once at the end).

    np.add.at, not ``+=``: the same table entry is read by many (b, q_idx, kv_idx).
    """
    dparam = np.zeros(param.shape, opmath(param.dtype))
    np.add.at(dparam, tuple(np.broadcast_to(i, grad.shape) for i in index), grad.astype(dparam.dtype))
    return dparam


def alibi_slopes(num_heads):
    """ALiBi's head slopes 2^(-8 (h + 1) / num_heads) (Press et al., 2022), float64 (num_heads,)."""
    return 2.0 ** (-8.0 * np.arange(1, num_heads + 1) / num_heads)


def alibi(slopes):
    """ALiBi: score + slopes[h] * (kv_idx - q_idx), a penalty growing with distance."""
    def score_mod(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx).astype(score.dtype)

    def dparams(grad, score, b, h, q_idx, kv_idx):
        return {"slopes": _scatter_add(slopes, (h,), grad * (kv_idx - q_idx))}
    return ScoreMod(score_mod, _one, dparams, {"slopes": slopes})


def relative_position_bias(table):
    """Learned bias by head and distance: score + table[h, q_idx - kv_idx + N - 1].

    ``table`` (H, 2N - 1) holds distances -(N - 1) .. N - 1, so any L, S <= N.
    """
    offset = table.shape[-1] // 2

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + table[h, q_idx - kv_idx + offset]

    def dparams(grad, score, b, h, q_idx, kv_idx):
        return {"table": _scatter_add(table, (h, q_idx - kv_idx + offset), grad)}
    return ScoreMod(score_mod, _one, dparams, {"table": table})


def learned_bias(table):
    """Learned bias per head and position pair: score + table[h, q_idx, kv_idx], table (H, L, S)."""
    def score_mod(score, b, h, q_idx, kv_idx):
        return score + table[h, q_idx, kv_idx]

    def dparams(grad, score, b, h, q_idx, kv_idx):
        return {"table": _scatter_add(table, (h, q_idx, kv_idx), grad)}
    return ScoreMod(score_mod, _one, dparams, {"table": table})


def soft_cap(cap):
    """tanh soft-capping (Gemma 2): cap * tanh(score / cap) keeps scores inside (-cap, cap)."""
    if cap is None:
        raise TypeError("softcap must be a finite number > 0, got None")
    # The scores' dtype is not known yet: c must hold in float32, the narrowest they are computed in.
    check_softcap(cap, dtype=np.float32)
    def score_mod(score, b, h, q_idx, kv_idx):
        return cap * np.tanh(score / cap)

    def dscore(score, b, h, q_idx, kv_idx):
        return 1 - np.tanh(score / cap) ** 2
    return ScoreMod(score_mod, dscore)


# ---------------------------------------------------------------------------------------------
# Block masks.

class BlockMask(NamedTuple):
    """Which (query block, key block) tiles to visit, as torch's BlockMask.

    kv_num_blocks (B, H, nq), kv_indices (B, H, nq, nk): per query block, how many key blocks are
    partly masked (mask_mod is applied there) and their indices first; full_kv_num_blocks,
    full_kv_indices: the same for key blocks kept whole (mask_mod is skipped). B or H is 1 where
    the mask is the same for every batch or head. Other blocks are never visited.
    """

    kv_num_blocks: np.ndarray
    kv_indices: np.ndarray
    full_kv_num_blocks: np.ndarray
    full_kv_indices: np.ndarray
    BLOCK_SIZE: tuple
    seq_lengths: tuple
    mask_mod: Callable | None

    def blocks(self):
        """(B, H, nq, nk) int8: 0 skipped, 1 partial, 2 full."""
        out = np.zeros(self.kv_indices.shape, dtype=np.int8)
        for indices, count, kind in ((self.kv_indices, self.kv_num_blocks, 1),
                                     (self.full_kv_indices, self.full_kv_num_blocks, 2)):
            position = np.argsort(indices, axis=-1)             # where key block j stands in the list
            out = np.where(position < count[..., None], np.int8(kind), out)
        return out

    def fraction_skipped(self):
        """Share of the tiles the tiled path never visits."""
        return float(np.mean(self.blocks() == 0))


def _index_grids(B, H, L, S, q0=0, kv0=0):
    """Integer grids b (B, 1, 1, 1), h (1, H, 1, 1), q_idx (1, 1, L, 1), kv_idx (1, 1, 1, S)."""
    b = np.arange(B).reshape(B, 1, 1, 1)
    h = np.arange(H).reshape(1, H, 1, 1)
    q_idx = np.arange(q0, q0 + L).reshape(1, 1, L, 1)
    kv_idx = np.arange(kv0, kv0 + S).reshape(1, 1, 1, S)
    return b, h, q_idx, kv_idx


def create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, BLOCK_SIZE=128):
    """The BlockMask of ``mask_mod`` over (B, H, Q_LEN, KV_LEN); B or H None: the same for all.

    BLOCK_SIZE is one int or (query block, key block). Positions past the lengths (the last
    blocks' padding) count as masked, so those blocks are partial, as in torch.
    """
    _check_create_block_mask(B, H, Q_LEN, KV_LEN, BLOCK_SIZE)
    BQ, BK = (BLOCK_SIZE, BLOCK_SIZE) if np.ndim(BLOCK_SIZE) == 0 else tuple(BLOCK_SIZE)
    B, H = B or 1, H or 1
    nq, nk = -(-Q_LEN // BQ), -(-KV_LEN // BK)
    keep = np.zeros((B, H, nq * BQ, nk * BK), dtype=bool)                 # padding: masked
    keep[..., :Q_LEN, :KV_LEN] = np.broadcast_to(_call_mask_mod(mask_mod, _index_grids(B, H, Q_LEN, KV_LEN)),
                                                 (B, H, Q_LEN, KV_LEN))
    kept = keep.reshape(B, H, nq, BQ, nk, BK).sum(axis=(3, 5))          # (B, H, nq, nk)
    partial = (kept > 0) & (kept < BQ * BK)
    full = kept == BQ * BK
    # Listed blocks first, in increasing order, then the rest (a stable sort of "not listed").
    return BlockMask(
        kv_num_blocks=partial.sum(axis=-1).astype(np.int32),
        kv_indices=np.argsort(~partial, axis=-1, kind="stable").astype(np.int32),
        full_kv_num_blocks=full.sum(axis=-1).astype(np.int32),
        full_kv_indices=np.argsort(~full, axis=-1, kind="stable").astype(np.int32),
        BLOCK_SIZE=(BQ, BK), seq_lengths=(Q_LEN, KV_LEN), mask_mod=mask_mod,
    )


def _all_blocks(Q_LEN, KV_LEN, BLOCK_SIZE=128):
    """The BlockMask without a mask: every tile visited (those cut short by the end of the
    sequence count as partial, where the mask keeps everything)."""
    return create_block_mask(lambda b, h, q_idx, kv_idx: np.ones((), dtype=bool), None, None,
                             Q_LEN, KV_LEN, BLOCK_SIZE)


def _one_tile(Q_LEN, KV_LEN, mask_mod):
    """A BlockMask of a single Q_LEN x KV_LEN tile: partial (mask_mod everywhere) or, without a
    mask_mod, full."""
    one, none = np.ones((1, 1, 1), np.int32), np.zeros((1, 1, 1), np.int32)
    return BlockMask(kv_num_blocks=none if mask_mod is None else one,
                     kv_indices=np.zeros((1, 1, 1, 1), np.int32),
                     full_kv_num_blocks=one if mask_mod is None else none,
                     full_kv_indices=np.zeros((1, 1, 1, 1), np.int32),
                     BLOCK_SIZE=(Q_LEN, KV_LEN), seq_lengths=(Q_LEN, KV_LEN), mask_mod=mask_mod)


# ---------------------------------------------------------------------------------------------
# The dense path: all scores, then the modifiers (what the torch twin does).

class FlexCache(NamedTuple):
    """What the backward needs: the inputs and modifiers, out and lse (the scores are recomputed),
    the arrays in the dtype computed in (float32 for float16 and bfloat16)."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    out: np.ndarray
    lse: np.ndarray
    score_mod: Callable | None
    block_mask: BlockMask
    scale: float
    sinks: np.ndarray | None = None   # (Hq,) the sink logits, None without them
    sink_p: np.ndarray | None = None  # (B, Hq, L) each row's sink probability exp(s_h - lse), None without
    dtype: np.dtype | None = None     # the inputs' dtype, which out and the gradients are rounded to


def dense_flex_attention_forward(q, k, v, score_mod=None, block_mask=None, scale=None,
                                 enable_gqa=False, return_lse=False, sinks=None):
    """q (B, Hq, L, E), k (B, Hkv, S, E), v (B, Hkv, S, Ev) -> out (B, Hq, L, Ev) [, lse (B, Hq, L)].

    Every score is computed, modified and masked (mask_mod everywhere). Returns (out, cache) or
    ((out, lse), cache); flex_attention_backward on this cache is dense as well. ``sinks`` (Hq,)
    adds each query head's sink logit to its softmax.
    """
    _check_flex_attention(q, k, v, score_mod, block_mask, scale, enable_gqa, sinks)
    dtype = q.dtype
    q, k, v, sinks = upcast(q), upcast(k), upcast(v), upcast(sinks)   # float32 for float16 and bfloat16
    B, Hq, L, E = q.shape
    S = k.shape[2]
    scale = 1 / math.sqrt(E) if scale is None else scale
    q_, k_, v_ = q, k, v                                        # the cache keeps k, v unrepeated
    k = np.repeat(k, Hq // k.shape[1], axis=1)                 # (B, Hkv, S, E) -> (B, Hq, S, E)
    v = np.repeat(v, Hq // v.shape[1], axis=1)                 # (B, Hkv, S, Ev) -> (B, Hq, S, Ev)
    b, h, q_idx, kv_idx = _index_grids(B, Hq, L, S)
    score = (q @ k.swapaxes(-2, -1)) * scale                    # (B, Hq, L, S)
    if score_mod is not None:   # checked, in q's dtype: float64 tables must not upcast float32
        score = _call_score_mod(score_mod, score, (b, h, q_idx, kv_idx))
    if block_mask is not None:
        score = np.where(_call_mask_mod(block_mask.mask_mod, (b, h, q_idx, kv_idx)), score, -np.inf)
    m = score.max(axis=-1, keepdims=True)                       # (B, Hq, L, 1)
    if sinks is not None:   # the sink is one more column of the row: it joins the maximum
        m = np.maximum(m, sinks[:, None, None])                 # (Hq,) -> (B, Hq, L, 1)
    m = np.where(np.isneginf(m), 0, m).astype(q.dtype)          # a fully masked row: no NaN
    e = np.exp(score - m)                                       # (B, Hq, L, S)
    row_sum = e.sum(axis=-1, keepdims=True)                     # (B, Hq, L, 1)
    if sinks is not None:   # ... and the sum; its value is 0, so it adds nothing to e @ v
        row_sum = row_sum + np.exp(sinks[:, None, None] - m)    # (B, Hq, L, 1)
    empty = row_sum == 0                                        # fully masked rows
    out = (e / np.where(empty, 1, row_sum)) @ v                 # (B, Hq, L, Ev), zeros where empty
    lse = np.where(empty, -np.inf, m + np.log(np.where(empty, 1, row_sum)))[..., 0]  # (B, Hq, L)
    # One L x S tile, partial where there is a mask: flex_attention_backward is dense too.
    mask_mod = None if block_mask is None else block_mask.mask_mod
    sink_p = None if sinks is None else (np.exp(sinks[:, None, None] - m) / row_sum)[..., 0]   # (B, Hq, L)
    cache = FlexCache(q_, k_, v_, out, lse.astype(q.dtype), score_mod, _one_tile(L, S, mask_mod), scale, sinks,
                      sink_p, dtype)
    out = out.astype(dtype, copy=False)                         # rounded once; lse stays float32
    return ((out, cache.lse) if return_lse else out), cache


# ---------------------------------------------------------------------------------------------
# The tiled path: online softmax over the blocks the block mask lists.

def _tiles(block_mask):
    """Per entry of the block mask: (batch slice, head slice, query block i, [(key block j, partial)]).

    A block mask of batch (or head) size 1 serves every batch (head) at once.
    """
    mB, mH, nq = block_mask.kv_num_blocks.shape
    for bi in range(mB):
        for hi in range(mH):
            bs = slice(None) if mB == 1 else slice(bi, bi + 1)
            hs = slice(None) if mH == 1 else slice(hi, hi + 1)
            for i in range(nq):
                partial = block_mask.kv_indices[bi, hi, i, :block_mask.kv_num_blocks[bi, hi, i]]
                full = block_mask.full_kv_indices[bi, hi, i, :block_mask.full_kv_num_blocks[bi, hi, i]]
                yield bs, hs, i, [(int(j), True) for j in partial] + [(int(j), False) for j in full]


def _tile_grids(B, H, bs, hs, i0, i1, j0, j1):
    """Index grids of the tile (batches bs, heads hs, queries i0..i1, keys j0..j1)."""
    b, h, q_idx, kv_idx = _index_grids(B, H, i1 - i0, j1 - j0, i0, j0)
    return b[bs], h[:, hs], q_idx, kv_idx


def _tile_scores(q_blk, k_blk, grids, score_mod, mask_mod, partial, scale):
    """Modified, masked scores of one tile -> (score (b, h, bq, bk), raw score before score_mod)."""
    raw = (q_blk @ k_blk.swapaxes(-2, -1)) * scale               # (b, h, bq, bk)
    score = raw
    if score_mod is not None:
        score = _call_score_mod(score_mod, raw, grids)
    if partial:                                                   # full tiles skip mask_mod
        score = np.where(_call_mask_mod(mask_mod, grids), score, -np.inf)
    return score, raw


def flex_attention_forward(q, k, v, score_mod=None, block_mask=None, scale=None,
                           enable_gqa=False, return_lse=False, sinks=None):
    """q (B, Hq, L, E), k (B, Hkv, S, E), v (B, Hkv, S, Ev) -> out (B, Hq, L, Ev) [, lse (B, Hq, L)].

    Tiles of block_mask.BLOCK_SIZE (128 without a block mask); only the listed tiles are
    computed. Returns (out, cache) or ((out, lse), cache); lse is the natural log-sum-exp.
    ``sinks`` (Hq,) adds each query head's sink logit to its softmax.
    """
    _check_flex_attention(q, k, v, score_mod, block_mask, scale, enable_gqa, sinks)
    dtype = q.dtype
    q, k, v, sinks = upcast(q), upcast(k), upcast(v), upcast(sinks)   # float32 for float16 and bfloat16
    B, Hq, L, E = q.shape
    S, Ev = v.shape[2], v.shape[3]
    scale = 1 / math.sqrt(E) if scale is None else scale
    block_mask = _all_blocks(L, S) if block_mask is None else block_mask
    BQ, BK = block_mask.BLOCK_SIZE
    k_rep = np.repeat(k, Hq // k.shape[1], axis=1)             # (B, Hkv, S, E) -> (B, Hq, S, E)
    v_rep = np.repeat(v, Hq // v.shape[1], axis=1)             # (B, Hkv, S, Ev) -> (B, Hq, S, Ev)
    out = np.zeros((B, Hq, L, Ev), dtype=q.dtype)
    lse = np.full((B, Hq, L), -np.inf, dtype=q.dtype)
    sink_p = None if sinks is None else np.ones((B, Hq, L), dtype=q.dtype)   # (B, Hq, L) for dsinks
    for bs, hs, i, kv_blocks in _tiles(block_mask):
        i0, i1 = i * BQ, min((i + 1) * BQ, L)
        q_blk = q[bs, hs, i0:i1]                                  # (b, h, bq, E)
        m = np.full(q_blk.shape[:-1], -np.inf, dtype=q.dtype)    # (b, h, bq) running max
        row_sum = np.zeros(q_blk.shape[:-1], dtype=q.dtype)       # (b, h, bq) running sum
        acc = np.zeros((*q_blk.shape[:-1], Ev), dtype=q.dtype)  # (b, h, bq, Ev) running p @ v
        if sinks is not None:   # the sink is the column seen first: m = max(-inf, s_h), l = 0 + exp(s_h - m) = 1
            m = np.maximum(m, sinks[hs][:, None])                 # (h,) -> (b, h, bq); acc += 0: its value is 0
            row_sum = row_sum + np.exp(sinks[hs][:, None] - m)    # (b, h, bq)
        for j, partial in kv_blocks:
            j0, j1 = j * BK, min((j + 1) * BK, S)
            grids = _tile_grids(B, Hq, bs, hs, i0, i1, j0, j1)
            score, _ = _tile_scores(q_blk, k_rep[bs, hs, j0:j1], grids, score_mod,
                                    block_mask.mask_mod, partial, scale)          # (b, h, bq, bk)
            m_new = np.maximum(m, score.max(axis=-1))             # (b, h, bq)
            m_safe = np.where(np.isneginf(m_new), 0, m_new).astype(q.dtype)   # nothing kept yet
            alpha = np.exp(m - m_safe)                            # rescales the earlier tiles
            p = np.exp(score - m_safe[..., None])                 # (b, h, bq, bk)
            row_sum = row_sum * alpha + p.sum(axis=-1)
            acc = acc * alpha[..., None] + p @ v_rep[bs, hs, j0:j1]   # (b, h, bq, Ev)
            m = m_new
        empty = row_sum == 0                                      # fully masked rows: 0 and -inf
        out[bs, hs, i0:i1] = acc / np.where(empty, 1, row_sum)[..., None]
        lse[bs, hs, i0:i1] = np.where(empty, -np.inf, m + np.log(np.where(empty, 1, row_sum)))
        if sinks is not None:   # kept for dsinks: the sink's share of the row sum (never empty here)
            sink_p[bs, hs, i0:i1] = np.exp(sinks[hs][:, None] - m) / row_sum
    cache = FlexCache(q, k, v, out, lse, score_mod, block_mask, scale, sinks, sink_p, dtype)
    out = out.astype(dtype, copy=False)                         # rounded once; lse stays float32
    return ((out, lse) if return_lse else out), cache


def flex_attention_backward(dout, cache, dlse=None):
    """dout (B, Hq, L, Ev) [, dlse (B, Hq, L)] -> (dq, dk, dv, dparams[, dsinks]), tile by tile.

    dparams maps the score_mod's parameter names to their gradients ({} without parameters);
    dsinks (Hq,) comes last if the forward had sinks. Each tile's probabilities are recomputed
    from lse (FlashAttention-2's backward).
    """
    q, k, v, out, lse, score_mod, block_mask, scale, sinks, sink_p, dtype = cache
    _check_flex_backward(dout, dlse, cache)
    dout = upcast(dout)                                         # float32 for float16 and bfloat16
    B, Hq, L, E = q.shape
    S, Ev = v.shape[2], v.shape[3]
    BQ, BK = block_mask.BLOCK_SIZE
    g = Hq // k.shape[1]
    k_rep = np.repeat(k, g, axis=1)                             # (B, Hkv, S, E) -> (B, Hq, S, E)
    v_rep = np.repeat(v, g, axis=1)                             # (B, Hkv, S, Ev) -> (B, Hq, S, Ev)
    # Undoes out = P @ v inside the softmax: dS = P * (dP - D), D = rowsum(dout * out); an lse
    # output adds dlse to every row (d lse / d score = P).
    D = (dout * out).sum(axis=-1)                               # (B, Hq, L)
    if dlse is not None:
        D = D - dlse
    lse_safe = np.where(np.isneginf(lse), np.inf, lse)          # fully masked rows: P = 0
    dq = np.zeros_like(q)
    dk = np.zeros_like(k_rep)
    dv = np.zeros_like(v_rep)
    params = getattr(score_mod, "params", None) or {}
    param_dtypes = {name: np.asarray(p).dtype for name, p in params.items()}
    # In the parameters' opmath dtype, rounded once at the end.
    dparams = {name: np.zeros(np.shape(p), opmath(param_dtypes[name])) for name, p in params.items()}
    for bs, hs, i, kv_blocks in _tiles(block_mask):
        i0, i1 = i * BQ, min((i + 1) * BQ, L)
        q_blk, do_blk = q[bs, hs, i0:i1], dout[bs, hs, i0:i1]    # (b, h, bq, E), (b, h, bq, Ev)
        for j, partial in kv_blocks:
            j0, j1 = j * BK, min((j + 1) * BK, S)
            grids = _tile_grids(B, Hq, bs, hs, i0, i1, j0, j1)
            k_blk, v_blk = k_rep[bs, hs, j0:j1], v_rep[bs, hs, j0:j1]
            score, raw = _tile_scores(q_blk, k_blk, grids, score_mod, block_mask.mask_mod,
                                      partial, scale)                         # (b, h, bq, bk)
            p = np.exp(score - lse_safe[bs, hs, i0:i1, None])      # (b, h, bq, bk)
            dv[bs, hs, j0:j1] += p.swapaxes(-2, -1) @ do_blk      # undoes acc += p @ v
            dp = do_blk @ v_blk.swapaxes(-2, -1)                   # (b, h, bq, bk)
            ds = p * (dp - D[bs, hs, i0:i1, None])                 # d loss / d modified score
            if score_mod is not None:                              # undoes score = score_mod(raw)
                if score_mod.dparams is not None:
                    for name, grad in _call_dparams(score_mod, ds, raw, grids).items():
                        dparams[name] = dparams[name] + grad
                ds = ds * _call_score_mod(score_mod.dscore, raw, grids, of=score_mod)
            dq[bs, hs, i0:i1] += (ds @ k_blk) * scale               # undoes raw = q @ k^T * scale
            dk[bs, hs, j0:j1] += (ds.swapaxes(-2, -1) @ q_blk) * scale
    # Grouped-query heads: each kv head served g query heads; their gradients add up.
    dk = dk.reshape(B, Hq // g, g, S, E).sum(axis=2)           # (B, Hq, S, E) -> (B, Hkv, S, E)
    dv = dv.reshape(B, Hq // g, g, S, Ev).sum(axis=2)          # (B, Hq, S, Ev) -> (B, Hkv, S, Ev)
    # Each gradient rounded once: dq, dk, dv to the inputs' dtype, each parameter's to its own.
    grads = tuple(d.astype(dtype, copy=False) for d in (dq, dk, dv))
    dparams = {name: d.astype(param_dtypes[name], copy=False) for name, d in dparams.items()}
    if sinks is not None:   # the sink column's dS = p (0 - D), summed over the batch and the rows
        return *grads, dparams, (-sink_p * D).sum(axis=(0, 2)).astype(dtype, copy=False)   # (B, Hq, L) -> (Hq,)
    return *grads, dparams


# ---------------------------------------------------------------------------------------------
# Input checks (outside the reading path).

def _check_create_block_mask(B, H, Q_LEN, KV_LEN, BLOCK_SIZE):
    for name, n in (("B", B), ("H", H)):
        if n is not None and (not isinstance(n, int | np.integer) or n < 1):
            raise ValueError(f"create_block_mask: {name} must be a positive int or None, got {n!r}")
    for name, n in (("Q_LEN", Q_LEN), ("KV_LEN", KV_LEN)):
        if not isinstance(n, int | np.integer) or n < 1:
            raise ValueError(f"create_block_mask: {name} must be a positive int, got {n!r}")
    sizes = (BLOCK_SIZE,) if np.ndim(BLOCK_SIZE) == 0 else tuple(BLOCK_SIZE)
    if len(sizes) not in (1, 2) or not all(isinstance(n, int | np.integer) and n >= 1 for n in sizes):
        raise ValueError(f"create_block_mask: BLOCK_SIZE must be a positive int or a pair of them, "
                         f"got {BLOCK_SIZE!r}")


def _check_flex_attention(q, k, v, score_mod, block_mask, scale, enable_gqa, sinks):
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_float(name, x)
        check_ndim(name, x, 4)
    check_same_dtype(q=q, k=k, v=v)
    if 0 in q.shape or 0 in k.shape or 0 in v.shape:
        raise ValueError(f"flex_attention: empty input: q {q.shape}, k {k.shape}, v {v.shape}")
    if k.shape[:3] != v.shape[:3] or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"flex_attention: q (B, Hq, L, E), k (B, Hkv, S, E), v (B, Hkv, S, Ev) "
                         f"do not fit: q {q.shape}, k {k.shape}, v {v.shape}")
    Hq, Hkv = q.shape[1], k.shape[1]
    hint = layout_hint(q.shape, k.shape, lambda qs, ks: qs[1] % ks[1] == 0)   # q of (B, L, Hq, E)?
    if Hq != Hkv and not enable_gqa:
        raise ValueError(f"flex_attention: q has {Hq} heads and k, v {Hkv}: pass enable_gqa=True{hint}")
    if Hq % Hkv:
        raise ValueError(f"flex_attention: q's {Hq} heads are not a multiple of k's {Hkv}{hint}")
    if score_mod is not None and not callable(score_mod):
        raise TypeError(f"flex_attention: score_mod must be callable, got {type(score_mod).__name__}")
    check_scale(scale, "flex_attention", dtype=q.dtype)
    check_sinks(sinks, q, "flex_attention")
    if block_mask is None:
        return
    if not isinstance(block_mask, BlockMask):
        raise TypeError(f"flex_attention: block_mask must be a BlockMask from create_block_mask, "
                        f"got {type(block_mask).__name__}")
    L, S = q.shape[2], k.shape[2]
    if tuple(block_mask.seq_lengths) != (L, S):
        raise ValueError(f"flex_attention: block_mask was made for (Q_LEN, KV_LEN) = "
                         f"{tuple(block_mask.seq_lengths)}, the inputs have ({L}, {S})")
    mB, mH = block_mask.kv_num_blocks.shape[:2]
    if mB not in (1, q.shape[0]) or mH not in (1, Hq):
        raise ValueError(f"flex_attention: block_mask's (B, H) = ({mB}, {mH}) must be 1 or q's "
                         f"({q.shape[0]}, {Hq})")


def _check_flex_backward(dout, dlse, cache):
    check_dout("flex_attention_backward", dout, cache.out.shape, cache.dtype)
    if dlse is not None:
        check_dout("flex_attention_backward", dlse, cache.lse.shape, cache.lse.dtype, name="dlse")
    score_mod = cache.score_mod
    if score_mod is not None and not callable(getattr(score_mod, "dscore", None)):
        raise TypeError(f"flex_attention_backward: score_mod {getattr(score_mod, '__name__', score_mod)!r} "
                        "declares no derivative; wrap it as ScoreMod(fn, dscore, dparams, params) "
                        "to differentiate through it")


# ---------------------------------------------------------------------------------------------
# What the user's functions return, checked at every call (the kind, dtype and shape: O(1)).

def _name(fn):
    """A user function as messages name it: 'mask_mod' for a plain function, a ScoreMod by its fn."""
    fn = fn.fn if isinstance(fn, ScoreMod) else fn
    return repr(getattr(fn, "__name__", type(fn).__name__))


def _check_returned_shape(what, got, target):
    """Raise ValueError unless shape ``got`` broadcasts to ``target`` without growing it."""
    try:
        fits = np.broadcast_shapes(got, target) == target
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"flex_attention: {what} returned shape {got}, which does not broadcast to "
                         f"the scores' shape {target} (the shape of b, h, q_idx and kv_idx together)")


def _call_mask_mod(mask_mod, grids):
    """mask_mod(b, h, q_idx, kv_idx): a bool array (or bool) that broadcasts to the grids' shape."""
    keep = mask_mod(*grids)
    what = f"mask_mod {_name(mask_mod)}"
    if not isinstance(keep, np.ndarray | np.bool_ | bool):
        raise TypeError(f"flex_attention: {what} returned {type(keep).__name__}; it must return a "
                        "bool NumPy array, True where a query may attend")
    if np.asarray(keep).dtype != np.bool_:
        raise TypeError(f"flex_attention: {what} returned dtype {keep.dtype}; it must return bool, "
                        "True where a query may attend, as torch's flex_attention requires (an "
                        "additive mask of 0 and -inf belongs in a score_mod: return score + mask)")
    _check_returned_shape(what, np.shape(keep), np.broadcast_shapes(*(g.shape for g in grids)))
    return keep


def _call_score_mod(fn, score, grids, of=None):
    """fn(score, b, h, q_idx, kv_idx), a score_mod (or, ``of`` a ScoreMod, its dscore), as an
    array of score's shape and dtype: real numbers (bool and int as torch takes them) that
    broadcast to it. A Python number is refused, as torch refuses it."""
    new = fn(score, *grids)
    what = f"score_mod {_name(fn)}" if of is None else f"dscore {_name(fn)} of score_mod {_name(of)}"
    if not isinstance(new, np.ndarray | np.generic):
        raise TypeError(f"flex_attention: {what} returned {type(new).__name__}; it must return a "
                        "NumPy array, such as score + x or np.full_like(score, x) (torch's "
                        "flex_attention also refuses a Python number)")
    if not (np.issubdtype(new.dtype, np.floating) or new.dtype.name in FLOAT_DTYPES   # bfloat16 is not "floating"
            or np.issubdtype(new.dtype, np.integer) or new.dtype == np.bool_):
        raise TypeError(f"flex_attention: {what} returned dtype {new.dtype}; it must return real "
                        f"numbers (float, int or bool), cast to the scores' {score.dtype}")
    _check_returned_shape(what, new.shape, score.shape)
    return np.broadcast_to(new, score.shape).astype(score.dtype, copy=False)


def _call_dparams(score_mod, grad, score, grids):
    """score_mod.dparams(grad, score, b, h, q_idx, kv_idx): a dict of float arrays, one per entry
    of score_mod.params, each of that parameter's shape."""
    got = score_mod.dparams(grad, score, *grids)
    params = score_mod.params or {}
    what = f"dparams {_name(score_mod.dparams)} of score_mod {_name(score_mod)}"
    if not isinstance(got, dict):
        raise TypeError(f"flex_attention_backward: {what} returned {type(got).__name__}; it must "
                        f"return a dict of gradients keyed as its params, {sorted(params)}")
    if got.keys() != params.keys():
        raise ValueError(f"flex_attention_backward: {what} returned gradients of {sorted(got)}; its "
                         f"params are {sorted(params)}")
    for name, g in got.items():
        if not (isinstance(g, np.ndarray) and (np.issubdtype(g.dtype, np.floating) or g.dtype.name in FLOAT_DTYPES)):
            kind = f"dtype {g.dtype}" if isinstance(g, np.ndarray) else type(g).__name__
            raise TypeError(f"flex_attention_backward: {what} returned {kind} for {name!r}; it must "
                            "return a float NumPy array")
        if g.shape != np.shape(params[name]):
            raise ValueError(f"flex_attention_backward: {what} returned shape {g.shape} for {name!r}, "
                             f"whose shape is {np.shape(params[name])}")
    return got


def _check_document(seq_lengths):
    lengths = np.asarray(seq_lengths)
    if lengths.ndim != 1 or not (lengths.size == 0 or np.issubdtype(lengths.dtype, np.integer)) \
            or np.any(lengths < 0):
        raise ValueError(f"document: seq_lengths must be a list of non-negative integers, got {seq_lengths!r}")


def _check_document_covers(seq_lengths, q_idx, kv_idx):
    total = int(np.sum(seq_lengths))
    last = max(int(np.max(q_idx, initial=-1)), int(np.max(kv_idx, initial=-1)))
    if last >= total:
        raise ValueError(f"document: seq_lengths {list(seq_lengths)} cover {total} positions, but the "
                         f"mask is asked about position {last}: the lengths must add up to the "
                         "sequence length (Q_LEN and KV_LEN)")
