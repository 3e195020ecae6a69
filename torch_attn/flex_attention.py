"""FlexAttention in plain PyTorch: all scores, then the modifiers; autograd supplies the backward.

Twin of numpy_attn/flex_attention.py's dense path:

    score = scale * q @ k^T,  score = score_mod(score, b, h, q_idx, kv_idx),
    score = -inf where not mask_mod(b, h, q_idx, kv_idx),  out = softmax(score) @ v

The modifiers are the NumPy twin's, written with torch ops, so they serve both this twin and
torch.nn.attention.flex_attention.flex_attention unchanged; a learned table or ALiBi's slopes that
require grad receive their gradient through autograd. ``block_mask`` is any object with a
``mask_mod`` (torch's BlockMask or numpy_attn's); its mask is applied everywhere. Fully masked
rows give output 0 and lse -inf, with zero gradients. ``sinks`` (Hq,) adds each query head's sink
logit to the row's maximum and sum, as one more column of value zero. float16 and bfloat16 are
cast up to float32 at the top and the output rounded once at the end, as in the NumPy twin; lse
stays float32.
"""

import math

import torch

from torch_attn._opmath import upcast

# ---------------------------------------------------------------------------------------------
# Mask modifiers: mask_mod(b, h, q_idx, kv_idx) -> bool tensor, True where a query may attend.

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
    from cu_seqlens, pass ``torch.diff(cu_seqlens)``). Combine with causal through and_masks."""
    doc_id = torch.repeat_interleave(torch.arange(len(seq_lengths)), torch.as_tensor(seq_lengths))

    def mask_mod(b, h, q_idx, kv_idx):
        return doc_id[q_idx] == doc_id[kv_idx]
    return mask_mod


def and_masks(*mask_mods):
    """A mask_mod that keeps a position where every one of ``mask_mods`` keeps it."""
    def mask_mod(b, h, q_idx, kv_idx):
        keep = True
        for mod in mask_mods:
            keep = keep & mod(b, h, q_idx, kv_idx)
        return keep
    return mask_mod


def or_masks(*mask_mods):
    """A mask_mod that keeps a position where any one of ``mask_mods`` keeps it."""
    def mask_mod(b, h, q_idx, kv_idx):
        keep = False
        for mod in mask_mods:
            keep = keep | mod(b, h, q_idx, kv_idx)
        return keep
    return mask_mod


# ---------------------------------------------------------------------------------------------
# Score modifiers: score_mod(score, b, h, q_idx, kv_idx) -> new score; autograd differentiates.

def alibi_slopes(num_heads):
    """ALiBi's head slopes 2^(-8 (h + 1) / num_heads) (Press et al., 2022), float64 (num_heads,)."""
    return 2.0 ** (-8.0 * torch.arange(1, num_heads + 1, dtype=torch.float64) / num_heads)


def alibi(slopes):
    """ALiBi: score + slopes[h] * (kv_idx - q_idx), a penalty growing with distance."""
    def score_mod(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx).to(score.dtype)
    return score_mod


def relative_position_bias(table):
    """Learned bias by head and distance: score + table[h, q_idx - kv_idx + N - 1].

    ``table`` (H, 2N - 1) holds distances -(N - 1) .. N - 1, so any L, S <= N.
    """
    offset = table.shape[-1] // 2

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + table[h, q_idx - kv_idx + offset]
    return score_mod


def learned_bias(table):
    """Learned bias per head and position pair: score + table[h, q_idx, kv_idx], table (H, L, S)."""
    def score_mod(score, b, h, q_idx, kv_idx):
        return score + table[h, q_idx, kv_idx]
    return score_mod


def soft_cap(cap):
    """tanh soft-capping (Gemma 2): cap * tanh(score / cap) keeps scores inside (-cap, cap)."""
    def score_mod(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)
    return score_mod


# ---------------------------------------------------------------------------------------------
# The dense path.

def _index_grids(B, H, L, S):
    """Integer grids b (B, 1, 1, 1), h (1, H, 1, 1), q_idx (1, 1, L, 1), kv_idx (1, 1, 1, S)."""
    b = torch.arange(B).reshape(B, 1, 1, 1)
    h = torch.arange(H).reshape(1, H, 1, 1)
    q_idx = torch.arange(L).reshape(1, 1, L, 1)
    kv_idx = torch.arange(S).reshape(1, 1, 1, S)
    return b, h, q_idx, kv_idx


def flex_attention(q, k, v, score_mod=None, block_mask=None, scale=None,
                   enable_gqa=False, return_lse=False, sinks=None):
    """q (B, Hq, L, E), k (B, Hkv, S, E), v (B, Hkv, S, Ev) -> out (B, Hq, L, Ev) [, lse (B, Hq, L)]."""
    dtype = q.dtype
    q, k, v, sinks = upcast(q), upcast(k), upcast(v), upcast(sinks)   # float32 for float16 and bfloat16
    B, Hq, L, E = q.shape
    S = k.shape[2]
    scale = 1 / math.sqrt(E) if scale is None else scale
    k = k.repeat_interleave(Hq // k.shape[1], dim=1)          # (B, Hkv, S, E) -> (B, Hq, S, E)
    v = v.repeat_interleave(Hq // v.shape[1], dim=1)          # (B, Hkv, S, Ev) -> (B, Hq, S, Ev)
    b, h, q_idx, kv_idx = _index_grids(B, Hq, L, S)
    score = (q @ k.transpose(-2, -1)) * scale                   # (B, Hq, L, S)
    if score_mod is not None:
        score = score_mod(score, b, h, q_idx, kv_idx).to(q.dtype)
    if block_mask is not None:
        score = torch.where(block_mask.mask_mod(b, h, q_idx, kv_idx), score, -torch.inf)
    # detach: subtracting m is a constant shift of the scores, no gradient flows through it
    m = score.amax(dim=-1, keepdim=True).detach()               # (B, Hq, L, 1)
    if sinks is not None:   # the sink is one more column of the row: it joins the maximum
        m = torch.maximum(m, sinks[:, None, None].detach())     # (Hq,) -> (B, Hq, L, 1)
    m = torch.where(torch.isneginf(m), 0, m)                    # a fully masked row: no NaN
    e = torch.exp(score - m)                                    # (B, Hq, L, S)
    row_sum = e.sum(dim=-1, keepdim=True)                       # (B, Hq, L, 1)
    if sinks is not None:   # ... and the sum; its value is 0, so it adds nothing to e @ v
        row_sum = row_sum + torch.exp(sinks[:, None, None] - m)   # (B, Hq, L, 1)
    empty = row_sum == 0                                        # fully masked rows
    out = (e / torch.where(empty, 1, row_sum)) @ v              # (B, Hq, L, Ev), zeros where empty
    lse = torch.where(empty, -torch.inf, m + torch.log(torch.where(empty, 1, row_sum)))[..., 0]  # (B, Hq, L)
    out = out.to(dtype)                                         # rounded once; lse stays float32
    return (out, lse) if return_lse else out


# Equals torch.nn.attention.flex_attention.flex_attention(q, k, v, score_mod, block_mask, scale,
# enable_gqa, return_lse) with the same modifiers (there the block mask's skipped tiles are masked
# too; with a block mask from create_block_mask of the same mask_mod that is the same mask). With
# sinks it equals that built-in's out * sigmoid(lse - s_h) and logaddexp(lse, s_h), out and lse
# being the built-in's without the sink.
