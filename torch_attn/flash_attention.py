"""FlashAttention in plain PyTorch: the same tiled online softmax; autograd supplies the backward.

Twin of numpy_attn/flash_attention.py (Dao, "FlashAttention-2", 2023): each block of query rows
visits the key blocks keeping a running row maximum m, and a running p @ [v | 1] whose last
column is the running sum l; a larger maximum m' rescales both by exp(m - m'). Scores are in base
2 (log2(e) folded into the scale) as in the NumPy twin. Causal (top-left aligned) skips the tiles
above the diagonal. No attn_mask, no dropout; grouped-query heads as in the NumPy twin. The NumPy
twin runs one (batch, head) slice at a time on a thread pool; this one takes all of them at once.
Returns ``(out, lse)``, lse being the NumPy twin's ``cache.lse``.
"""

import math

import torch

LOG2E = math.log2(math.e)


def _mask_future(s, i0, j0):
    """Scores in tile s (..., bq, bk) (queries i0.., keys j0..) with keys after their query at -inf."""
    bq, bk = s.shape[-2:]
    query = torch.arange(i0, i0 + bq, device=s.device)
    key = torch.arange(j0, j0 + bk, device=s.device)
    return s.masked_fill(key > query[:, None], -torch.inf)


def flash_attention(q, k, v, is_causal=False, scale=None, block_q=128, block_k=512):
    """Attention of q (..., T, hs) over k (..., S, hs), v (..., S, hv) -> (out (..., T, hv), lse (..., T))."""
    T, hs = q.shape[-2:]
    S, hv = v.shape[-2:]
    scale = 1 / math.sqrt(hs) if scale is None else scale
    if q.shape[:-2] != k.shape[:-2]:                         # grouped-query: query head h reads kv head h // g
        g = q.shape[-3] // k.shape[-3]
        k = k.repeat_interleave(g, dim=-3)                   # (..., nkv, S, hs) -> (..., nh, S, hs)
        v = v.repeat_interleave(g, dim=-3)                   # (..., nkv, S, hv) -> (..., nh, S, hv)
    k_t = k.transpose(-1, -2)                                # (..., hs, S)
    v_1 = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)   # (..., S, hv+1)
    outs, lses = [], []
    for i0 in range(0, T, block_q):
        i1 = min(i0 + block_q, T)
        q_blk = q[..., i0:i1, :] * (scale * LOG2E)           # (..., bq, hs), scores in base 2
        m = torch.full(q_blk.shape[:-1], -torch.inf, dtype=q.dtype, device=q.device)     # (..., bq)
        acc = torch.zeros(q_blk.shape[:-1] + (hv + 1,), dtype=q.dtype, device=q.device)  # (..., bq, hv+1)
        S_seen = min(S, i1) if is_causal else S
        for j0 in range(0, S_seen, block_k):
            j1 = min(j0 + block_k, S_seen)
            s = q_blk @ k_t[..., j0:j1]                      # (..., bq, bk)
            if is_causal and j1 - 1 > i0:
                s = _mask_future(s, i0, j0)
            # detach: subtracting m is a constant shift of the scores, no gradient flows through it
            m_new = torch.maximum(m, s.amax(dim=-1)).detach()
            acc = acc * torch.exp2(m - m_new)[..., None]
            m = m_new
            s = s - m[..., None]
            p = torch.exp2(s)
            acc = acc + p @ v_1[..., j0:j1, :]               # (..., bq, hv+1)
        row_sum = acc[..., hv]                               # (..., bq)
        outs.append(acc[..., :hv] / row_sum[..., None])      # out[i0:i1]
        lses.append((m + torch.log2(row_sum)) / LOG2E)            # lse[i0:i1]
    out = torch.cat(outs, dim=-2)                            # (..., T, hv)
    lse = torch.cat(lses, dim=-1)                            # (..., T)
    return out, lse


# Equals torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale,
# enable_gqa=True) (its output; enable_gqa only where k, v have fewer heads than q), and lse equals
# torch.logsumexp(scale * q @ k^T (causally masked), dim=-1).
