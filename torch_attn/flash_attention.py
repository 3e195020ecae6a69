"""FlashAttention in plain PyTorch: the same tiles and online softmax; autograd supplies the backward.

Twin of numpy_attn/flash_attention.py (Dao, "FlashAttention-2", 2023, Algorithm 1): each query
tile visits the key tiles keeping a running row maximum m, a running sum l and a running
numerator acc; a larger maximum m' rescales both by exp(m - m'); out = acc / l and
lse = m + log(l). Causal (top-left aligned, or is_causal="bottom_right") skips the tiles above
the diagonal, and with a sliding ``window`` those before each query tile's band; ``softcap``
caps the scores at c * tanh(s / c) before the mask; ``sinks`` (nh,) starts each row's running
sums with its head's sink logit (m = s_h, l = 1; its value is zero). No attn_mask, no dropout; grouped-query heads
repeated at the edge as in the NumPy twin. Returns ``(out, lse)``, lse being the NumPy twin's
``cache.lse``. float16 and bfloat16 are cast up to float32 at the top and the output rounded once
at the end, as in the NumPy twin; lse stays float32.
"""

import math

import torch

from torch_attn._opmath import upcast
from torch_attn.masks import causal_mask, sliding_window_mask
from torch_attn.softcap import logit_softcap


def flash_attention(q, k, v, is_causal=False, scale=None, block_q=128, block_k=512, softcap=None, window=None,
                    sinks=None):
    """Attention of q (..., T, hs) over k (..., S, hs), v (..., S, hv) -> (out (..., T, hv), lse (..., T))."""
    _check_flash_attention(scale)
    dtype = q.dtype
    q, k, v, sinks = upcast(q), upcast(k), upcast(v), upcast(sinks)   # float32 for float16 and bfloat16
    T, hs = q.shape[-2:]
    S, hv = v.shape[-2:]
    scale = 1 / math.sqrt(hs) if scale is None else scale
    g = q.shape[-3] // k.shape[-3] if q.shape[:-2] != k.shape[:-2] else 1   # query heads per key head
    if g > 1:   # grouped-query: repeat key/value head j for its query heads j*g .. j*g+g-1
        k, v = k.repeat_interleave(g, dim=-3), v.repeat_interleave(g, dim=-3)   # (..., nkv, S, .) -> (..., nh, S, .)
    align = "bottom_right" if is_causal == "bottom_right" else "top_left"
    offset = S - T if align == "bottom_right" else 0         # causal: query t sees keys 0..t+offset
    first = min(T, max(0, -offset)) if S > 0 else T          # rows before it see no key: out 0, lse log(0)
    last = _last_row(T, S, offset, window)                   # rows from it on see no key (a window, top-left)
    out = torch.zeros(q.shape[:-1] + (hv,), dtype=q.dtype, device=q.device)   # (..., T, hv)
    lse = torch.full(q.shape[:-1], -torch.inf, dtype=q.dtype, device=q.device)   # (..., T)
    if sinks is not None:   # rows that see no key: the sink alone, lse = s_h (out stays 0)
        lse[...] = sinks[:, None]                            # (nh,) -> (..., nh, T)
    for i0 in range(first, last, block_q):                   # query tile: rows i0 .. i1-1
        i1 = min(i0 + block_q, last)
        q_i = q[..., i0:i1, :] * scale                       # (..., bq, hs)
        m = q_i.new_full(q_i.shape[:-1], -torch.inf)          # (..., bq) running row maximum
        row_sum = q_i.new_zeros(q_i.shape[:-1])               # (..., bq) running sum of exp(s - m): l
        acc = q_i.new_zeros(q_i.shape[:-1] + (hv,))           # (..., bq, hv) running sum of exp(s - m) v
        if sinks is not None:   # the sink is the column seen first: m = max(-inf, s_h), l = 0 + exp(s_h - m) = 1
            m = torch.maximum(m, sinks[:, None].detach())    # (nh,) -> (..., nh, bq); detach: m is a shift
            row_sum = row_sum + torch.exp(sinks[:, None] - m)   # (..., nh, bq); its gradient reaches the sink
        S_seen = min(S, i1 + offset) if is_causal else S     # causal: keys after row i1-1's are never seen
        # A window: keys before row i0's first are never seen; start at the key tile holding it.
        j_first = max(0, i0 + offset - window + 1) // block_k * block_k if window else 0
        for j0 in range(j_first, S_seen, block_k):           # key tile: keys j0 .. j1-1
            j1 = min(j0 + block_k, S_seen)
            s = q_i @ k[..., j0:j1, :].transpose(-1, -2)     # (..., bq, bk)
            if softcap is not None:                          # c * tanh(s / c), before the mask
                s = logit_softcap(s, softcap)                # (..., bq, bk)
            if is_causal and _crosses(i0, i1, j0, j1, offset, window):   # hide the keys a row may not see
                s = torch.where(_visible(T, S, align, window, slice(i0, i1), slice(j0, j1), q.device), s, -torch.inf)
            # detach: m is a constant shift that cancels between acc and row_sum; no gradient flows through it
            m_new = torch.maximum(m, s.amax(dim=-1)).detach()   # (..., bq); -inf while a row has seen no key
            m_safe = torch.where(m_new == -torch.inf, 0, m_new)   # (..., bq) shift by 0 there: p, alpha 0, not NaN
            p = torch.exp(s - m_safe[..., None])             # (..., bq, bk) in [0, 1]
            alpha = torch.exp(m - m_safe)                    # (..., bq) rescales the old sums to m_new
            row_sum = alpha * row_sum + p.sum(dim=-1)        # (..., bq)
            acc = alpha[..., None] * acc + p @ v[..., j0:j1, :]   # (..., bq, hv)
            m = m_new
        out[..., i0:i1, :] = acc / row_sum[..., None]        # (..., bq, hv); row_sum >= 1 (the maximum adds 1)
        lse[..., i0:i1] = m + torch.log(row_sum)             # (..., bq)
    return out.to(dtype), lse                                # rounded once to the inputs' dtype


def _last_row(T, S, offset, window):
    """The first query row from which on no row sees a key: T, but for a window aligned top-left."""
    return T if window is None else max(0, min(T, S - 1 + window - offset))


def _crosses(i0, i1, j0, j1, offset, window):
    """Whether the tile holds a key some row may not see: past its diagonal or before its window."""
    return j1 - 1 > i0 + offset or (window is not None and j0 <= i1 - 1 + offset - window)


def _visible(T, S, align, window, rows, cols, device):
    """(bq, bk) tile of the (T, S) causal or sliding-window mask: True where a query may attend."""
    if window is None:
        return causal_mask(T, S, align, rows, cols, device=device)
    return sliding_window_mask(T, S, window, align, rows, cols, device=device)


def _check_flash_attention(scale):
    """Raise ValueError on an inf or NaN scale, with the NumPy twin's message: every score would
    be inf or NaN and the output NaN without a word (F.scaled_dot_product_attention returns it)."""
    if scale is not None and not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number or None, got {scale!r}")


# Equals torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale,
# enable_gqa=True) (its output; enable_gqa only where k, v have fewer heads than q), and lse equals
# torch.logsumexp(scale * q @ k^T (causally masked), dim=-1). With softcap and window it equals
# torch.nn.attention.flex_attention.flex_attention with score_mod c * tanh(score / c) and a
# sliding-window mask_mod (parity_tests/test_flash_attention.py). With sinks, out equals the output
# without them times sigmoid(lse - s_h), lse the no-sink log-sum-exp, and lse becomes
# logaddexp(lse, s_h): the sink only enlarges each row's denominator.
