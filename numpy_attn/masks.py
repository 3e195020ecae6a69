"""Boolean attention masks for causal models, padded batches and packed sequences.

Every mask here is in the convention of ``torch.nn.functional.scaled_dot_product_attention``'s
boolean ``attn_mask`` (True where a query may attend) and broadcasts to the scores (B, nh, T, S);
combine them with ``&``. Each also has a meaning a reader can check by hand:

- causal, top-left aligned: query t sees keys 0..t (``is_causal=True`` in PyTorch); bottom-right
  aligned: query t of T sees keys 0..S-T+t, so that the last query sees every key, as when T new
  tokens attend over S = past + T cached keys (``torch.nn.attention.bias.causal_lower_right``).
  The two agree when T = S.
- sliding window: the causal mask restricted to each query's last ``window`` keys, its own
  included: query t sees key s when t + offset - window < s <= t + offset (offset 0 top-left,
  S - T bottom-right), as transformers' ``sliding_window_causal_mask_function`` for Mistral,
  Gemma 2 and Gemma 3, whose query index is the absolute position (bottom-right with a cache).
- key padding: ``key_padding_mask`` (B, S) is True at padding, as ``nn.MultiheadAttention``'s
  argument; this is the one place where it is turned around into "may attend".
- position ids of a padded batch: each sequence's real tokens are numbered 0, 1, ... whether the
  padding is on the left or the right, so that a padded sequence gets the positions it has alone.
- packed sequences: several sequences laid end to end in one row, given by cumulative lengths
  ``cu_seqlens`` = [0, n1, n1+n2, ...] as FlashAttention's varlen functions take them; a query
  sees only keys of its own sequence (a block-diagonal mask), and with ``causal`` only the earlier
  ones, and positions restart at 0 for each sequence.

The masks are booleans, the same for every dtype. Written as a float mask of float16 or bfloat16
(0 where a query may attend, -inf elsewhere) they stay exact: both values exist in those dtypes;
any other float mask value (a position bias) is rounded when cast to the low dtype, and attention
adds it to the scores in float32 (numpy_attn/attention.py).
"""

import numpy as np

from numpy_attn._checks import check_ndim, check_window

ALIGNMENTS = ("top_left", "bottom_right")


def causal_mask(T, S, align="top_left", rows=slice(None), cols=slice(None)):
    """(T, S) bool: True where query t may see key s. top_left: s <= t; bottom_right: s <= S - T + t.

    ``rows`` and ``cols`` (slices) give one tile of it without building the rest (flash attention).
    """
    _check_causal(T, S, align)
    t, s = _query_key_positions(T, S, align, rows, cols)  # (T, 1), (1, S)
    return s <= t                                         # (T, S)


def sliding_window_mask(T, S, window, align="top_left", rows=slice(None), cols=slice(None)):
    """(T, S) bool: causal_mask keeping only each query's last ``window`` keys, its own included.
    top_left: t - window < s <= t; bottom_right: the same with t moved to S - T + t.

    ``rows`` and ``cols`` (slices) give one tile of it without building the rest (flash attention).
    """
    _check_causal(T, S, align)
    if window is None:
        raise TypeError("window must be a positive integer, got None (use causal_mask for no window)")
    check_window(window)
    window = min(window, T + S)   # a window past every key is no limit (2**63 would overflow int64)
    t, s = _query_key_positions(T, S, align, rows, cols)  # (T, 1), (1, S)
    return (s <= t) & (s > t - window)                    # (T, S)


def _query_key_positions(T, S, align, rows, cols):
    """(T, 1) query and (1, S) key positions on one axis, the queries moved right by S - T when
    aligned bottom-right, of the rows and cols asked for."""
    offset = 0 if align == "top_left" else S - T          # the diagonal moves right by S - T
    t = np.arange(T)[rows, None] + offset                 # (T, 1): the queries, or a tile's
    s = np.arange(S)[None, cols]                          # (1, S): the keys, or a tile's
    return t, s


def padding_attn_mask(key_padding_mask):
    """key_padding_mask (B, S), True at padding -> attn_mask (B, 1, 1, S), True where a query may attend."""
    _check_bool("key_padding_mask", key_padding_mask, 2)
    B, S = key_padding_mask.shape
    return ~key_padding_mask[:, None, None, :]            # (B, S) -> (B, 1, 1, S): every head, every query


def padded_position_ids(key_padding_mask):
    """key_padding_mask (B, T), True at padding -> position ids (B, T) int64: each sequence's real
    tokens numbered 0, 1, ... in order, left or right padding alike; padding gets position 0."""
    _check_bool("key_padding_mask", key_padding_mask, 2)
    real = ~key_padding_mask                              # (B, T)
    positions = np.cumsum(real, axis=1) - 1               # (B, T): real tokens before t, minus one
    return np.where(real, positions, 0).astype(np.int64)  # padding before the first token would be -1


def varlen_attn_mask(cu_seqlens, causal=False):
    """cu_seqlens (n + 1,) = [0, n1, n1+n2, ..., N] -> (N, N) bool block-diagonal mask: token i
    may attend to token j of the same sequence (and, with ``causal``, only j <= i)."""
    seq = varlen_sequence_ids(cu_seqlens)                 # (N,)
    mask = seq[:, None] == seq[None, :]                   # (N, 1) == (1, N) -> (N, N)
    if causal:
        mask &= causal_mask(len(seq), len(seq))           # within a block, top-left is its own causal
    return mask


def varlen_position_ids(cu_seqlens):
    """cu_seqlens (n + 1,) -> position ids (N,) int64, restarting at 0 at each sequence's start."""
    seq = varlen_sequence_ids(cu_seqlens)                 # (N,)
    return np.arange(len(seq)) - np.asarray(cu_seqlens)[seq]   # index minus its sequence's start


def varlen_sequence_ids(cu_seqlens):
    """cu_seqlens (n + 1,) -> (N,) int64: the index of the sequence each packed token belongs to."""
    _check_cu_seqlens(cu_seqlens)
    lengths = np.diff(cu_seqlens)                         # (n,)
    return np.repeat(np.arange(len(lengths)), lengths)    # (n,) -> (N,)


def _check_causal(T, S, align):
    for name, n in (("T", T), ("S", S)):
        if not isinstance(n, int | np.integer) or isinstance(n, bool):
            raise TypeError(f"{name} must be an integer, got {n!r}")
        if n < 0:
            raise ValueError(f"{name} must be >= 0, got {n}")
    if align not in ALIGNMENTS:
        raise ValueError(f"align must be one of {ALIGNMENTS}, got {align!r}")


def _check_bool(name, mask, ndim):
    if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_:
        raise TypeError(f"{name} must be a bool NumPy array (True at padding), got "
                        f"{getattr(mask, 'dtype', type(mask).__name__)}")
    check_ndim(name, mask, ndim)


def _check_cu_seqlens(cu_seqlens):
    if not isinstance(cu_seqlens, np.ndarray) or not np.issubdtype(cu_seqlens.dtype, np.integer):
        raise TypeError(f"cu_seqlens must be an integer NumPy array, got "
                        f"{getattr(cu_seqlens, 'dtype', type(cu_seqlens).__name__)}")
    check_ndim("cu_seqlens", cu_seqlens, 1)
    if len(cu_seqlens) < 1 or cu_seqlens[0] != 0 or np.any(np.diff(cu_seqlens) < 0):
        raise ValueError(f"cu_seqlens must start at 0 and never decrease (cumulative lengths "
                         f"[0, n1, n1+n2, ...]), got {cu_seqlens.tolist()}")
