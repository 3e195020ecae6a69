"""Boolean attention masks for causal models, padded batches and packed sequences, in PyTorch.

Twin of numpy_attn/masks.py: True where a query may attend; causal masks top-left or bottom-right
aligned, or restricted to a sliding window; ``key_padding_mask`` True at padding; packed sequences by ``cu_seqlens``.
"""

import torch


def causal_mask(T, S, align="top_left", rows=slice(None), cols=slice(None), device=None):
    """(T, S) bool: True where query t may see key s. top_left: s <= t; bottom_right: s <= S - T + t;
    ``rows`` and ``cols`` (slices) give one tile of it."""
    t, s = _query_key_positions(T, S, align, rows, cols, device)   # (T, 1), (1, S)
    return s <= t                                         # (T, S)


def sliding_window_mask(T, S, window, align="top_left", rows=slice(None), cols=slice(None), device=None):
    """(T, S) bool: causal_mask keeping only each query's last ``window`` keys, its own included."""
    window = min(window, T + S)   # a window past every key is no limit (2**63 would overflow int64)
    t, s = _query_key_positions(T, S, align, rows, cols, device)   # (T, 1), (1, S)
    return (s <= t) & (s > t - window)                    # (T, S)


def _query_key_positions(T, S, align, rows, cols, device):
    """(T, 1) query and (1, S) key positions, the queries moved right by S - T bottom-right."""
    offset = 0 if align == "top_left" else S - T          # the diagonal moves right by S - T
    t = torch.arange(T, device=device)[rows, None] + offset   # (T, 1): the queries, or a tile's
    s = torch.arange(S, device=device)[None, cols]        # (1, S): the keys, or a tile's
    return t, s


def padding_attn_mask(key_padding_mask):
    """key_padding_mask (B, S), True at padding -> attn_mask (B, 1, 1, S), True where a query may attend."""
    B, S = key_padding_mask.shape
    return ~key_padding_mask[:, None, None, :]            # (B, S) -> (B, 1, 1, S): every head, every query


def padded_position_ids(key_padding_mask):
    """key_padding_mask (B, T) -> position ids (B, T) int64; padding gets position 0."""
    real = ~key_padding_mask                              # (B, T)
    positions = torch.cumsum(real, dim=1) - 1             # (B, T): real tokens before t, minus one
    return torch.where(real, positions, 0).to(torch.int64)   # padding before the first token would be -1


def varlen_attn_mask(cu_seqlens, causal=False):
    """cu_seqlens (n + 1,) -> (N, N) bool block-diagonal mask (causal within each block if asked)."""
    seq = varlen_sequence_ids(cu_seqlens)                 # (N,)
    mask = seq[:, None] == seq[None, :]                   # (N, 1) == (1, N) -> (N, N)
    if causal:
        mask &= causal_mask(len(seq), len(seq), device=seq.device)   # within a block, top-left is its own causal
    return mask


def varlen_position_ids(cu_seqlens):
    """cu_seqlens (n + 1,) -> position ids (N,) int64, restarting at 0 at each sequence's start."""
    seq = varlen_sequence_ids(cu_seqlens)                 # (N,)
    return torch.arange(len(seq), device=seq.device) - cu_seqlens[seq]   # index minus its sequence's start


def varlen_sequence_ids(cu_seqlens):
    """cu_seqlens (n + 1,) -> (N,) int64: the index of the sequence each packed token belongs to."""
    lengths = torch.diff(cu_seqlens)                      # (n,)
    return torch.repeat_interleave(torch.arange(len(lengths), device=cu_seqlens.device), lengths)   # (n,) -> (N,)


# causal_mask(T, S, "top_left") is the mask of F.scaled_dot_product_attention(..., is_causal=True);
# causal_mask(T, S, "bottom_right") equals torch.nn.attention.bias.causal_lower_right(T, S);
# sliding_window_mask equals transformers.masking_utils.sliding_window_causal_mask_function(window)
# at query positions S - T + t (bottom-right) or t (top-left); and
# varlen_attn_mask equals running each sequence alone (FlashAttention's flash_attn_varlen_func).
