"""The gated delta rule computed a chunk of steps at a time, in plain PyTorch; autograd supplies the
backward.

Twin of numpy_attn/chunked_delta_rule.py: S_t = (I - beta_t k_t k_t^T) D_t S_(t-1) + beta_t k_t v_t^T,
o_t = scale * S_t^T q_t, the state S (B, nh, dk, dv) stored as transformers stores it (rows the key
channels); inside a chunk of C steps the UT transform (I + A) W = beta K exp(G), (I + A) U = beta V,
solved here with torch.linalg.solve_triangular (unit lower triangular), then the chunks in turn.
float16 and bfloat16 compute in float32 and round once.
"""

import torch
import torch.nn.functional as F

from torch_attn._opmath import upcast


def chunked_delta_rule(q, k, v, g, beta, initial_state=None, scale=None, mask=None, chunk_size=64):
    """The gated delta rule on q, k (B, nh, T, dk), v (B, nh, T, dv), g (B, nh, T) or (B, nh, T, dk),
    beta (B, nh, T), from ``initial_state`` (B, nh, dk, dv) or zeros -> (o (B, nh, T, dv), state)."""
    dtype = q.dtype
    q, k, v, g, beta, initial_state = (upcast(x) for x in (q, k, v, g, beta, initial_state))   # float32 for 16 bits
    B, nh, T, dk = k.shape
    dv = v.shape[-1]
    C = chunk_size
    N = -(-T // C)                                            # chunks, the last padded to C steps
    scale = dk ** -0.5 if scale is None else scale
    per_channel = g.dim() == 4
    g = g if per_channel else g[..., None]                    # (B, nh, T) -> (B, nh, T, 1): one decay, every row of S
    # A masked step is an identity step: g = 0 (no decay), beta = 0 (nothing written).
    keep = (torch.ones((B, T), dtype=torch.bool) if mask is None else mask)[:, None, :].expand(B, nh, T)
    g, beta = torch.where(keep[..., None], g, 0), torch.where(keep, beta, 0)
    # The tail is padded with identity steps too (zeros): N * C steps in chunks of C.
    q, k, v, g = (_chunks(x, N, C) for x in (q, k, v, g))    # (B, nh, T, d) -> (B, nh, N, C, d)
    beta = _chunks(beta[..., None], N, C)[..., 0]             # (B, nh, T) -> (B, nh, N, C)

    # The UT transform of every chunk at once.
    G = torch.cumsum(g, dim=-2)                               # (B, nh, N, C, e): log-decay from the chunk's start
    causal = torch.ones(C, C, dtype=torch.bool).tril()[..., None]   # (C, C, 1): j <= i
    # decay_ij = exp(G_i - G_j), masked before the exp: above the diagonal G_i - G_j > 0 could overflow.
    decay = torch.exp(torch.where(causal, G[..., :, None, :] - G[..., None, :, :], -torch.inf))   # (B, nh, N, C, C, e)
    kb = beta[..., None] * k                                  # (B, nh, N, C, dk): the write's rate times its key
    A = torch.tril(_pair(kb, k, decay), -1)                   # (B, nh, N, C, C): step j's write seen by step i's read
    Kb = kb * torch.exp(G)                                    # (B, nh, N, C, dk): beta k decayed from the chunk's start
    Vb = beta[..., None] * v                                  # (B, nh, N, C, dv)
    W = _solve_unit_lower(A, Kb)                              # (I + A) W = Kb
    U = _solve_unit_lower(A, Vb)                              # (I + A) U = Vb
    P = scale * torch.tril(_pair(q, k, decay))                # (B, nh, N, C, C): causal attention within the chunk
    Qd = scale * q * torch.exp(G)                             # (B, nh, N, C, dk): reads the chunk's starting state
    Kd = k * torch.exp(G[..., -1:, :] - G)                    # (B, nh, N, C, dk): writes, decayed to the chunk's end
    chunk_decay = torch.exp(G[..., -1, :])[..., None]         # (B, nh, N, e, 1): the state's decay over the chunk

    # The chunks in turn, each from the state the last one left.
    S = torch.zeros((B, nh, dk, dv), dtype=q.dtype) if initial_state is None else initial_state
    o = []
    for n in range(N):
        u_n = U[:, :, n] - W[:, :, n] @ S                     # (B, nh, C, dv): the corrections
        o.append(Qd[:, :, n] @ S + P[:, :, n] @ u_n)          # (B, nh, C, dv): the old state's read + the chunk's own
        S = chunk_decay[:, :, n] * S + Kd[:, :, n].transpose(-1, -2) @ u_n   # (B, nh, dk, dv)
    o = torch.stack(o, dim=2).reshape(B, nh, N * C, dv)[:, :, :T]   # (B, nh, N, C, dv) -> (B, nh, T, dv)
    o = o * keep[..., None]                                   # a masked step's output is 0
    return o.to(dtype), S.to(dtype)


def _chunks(x, N, C):
    """(B, nh, T, d) -> (B, nh, N, C, d), the tail padded with zeros to N * C steps."""
    B, nh, T, d = x.shape
    x = F.pad(x, (0, 0, 0, N * C - T))
    return x.reshape(B, nh, N, C, d)


def _pair(a, b, decay):
    """M_ij = sum_c a_ic b_jc decay_ijc: a (..., C, dk), b (..., C, dk), decay (..., C, C, e),
    e = dk or 1 (broadcast) -> (..., C, C)."""
    return (a[..., :, None, :] * b[..., None, :, :] * decay).sum(-1)


def _solve_unit_lower(A, R):
    """X (..., C, d) with (I + A) X = R, A (..., C, C) strictly lower: PyTorch's triangular solver,
    told the diagonal is ones."""
    eye = torch.eye(A.shape[-1], dtype=A.dtype)
    return torch.linalg.solve_triangular(eye + A, R, upper=False, unitriangular=True)


# No PyTorch built-in: equals transformers' torch_chunk_gated_delta_rule (scalar g) and
# chunk_kimi_delta_attention (per-channel g), on their layout (B, T, nh, d), with q and k as given
# (use_qk_l2norm_in_kernel=False), for any chunk_size; parity_tests/test_chunked_delta_rule.py checks it.
