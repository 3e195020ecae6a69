"""The gated delta rule computed a chunk of steps at a time, and its backward.

    S_t = (I - beta_t k_t k_t^T) D_t S_(t-1) + beta_t k_t v_t^T      D_t = diag(exp(g_t))
    o_t = scale * S_t^T q_t                                          scale = 1 / sqrt(dk) unless given

Yang, Kautz and Hatamizadeh, "Gated Delta Networks" (2024), computed as transformers'
``torch_chunk_gated_delta_rule`` (Qwen3.5, Qwen3-Next, OLMo Hybrid: one scalar g per head and
step) and ``chunk_kimi_delta_attention`` (Kimi Linear: g per key channel) compute it. One step:
decay the state, S <- exp(g_t) * S; read what it predicts for k_t and write the correction,
u_t = beta_t * (v_t - S^T k_t), S <- S + k_t u_t^T; read it, o_t = scale * S^T q_t.

The state S (B, nh, dk, dv) is stored as transformers stores it: the paper's S transposed, rows
the key channels (which a per-channel g decays), columns the value channels.

Why chunks: the recurrence is T small steps, each a rank-one update that waits for the last. Cut
the sequence into chunks of C steps (``chunk_size``, a parameter; 64 in transformers) and the
steps inside a chunk are solved together with matmuls; only the N = T / C chunks run in turn.
In a chunk that starts from the state S, with G_i the log-decay summed from the chunk's start
through step i (per key channel), decay_ij = exp(G_i - G_j) for j <= i, and the UT transform:

    A_ij = beta_i k_i^T decay_ij k_j     for j < i, else 0          (C, C), strictly lower
    (I + A) W = beta K exp(G),   (I + A) U = beta V                   solved by forward substitution
    u = U - W S                                                      the corrections u_t of the chunk
    o = scale * (Q exp(G)) S + P u,   P_ij = scale * q_i^T decay_ij k_j for j <= i
    S_new = exp(G_last) S + (K exp(G_last - G))^T u                  the state handed to the next chunk

(I + A) is unit lower triangular: W and U come by forward substitution, row by row from the top
(``_solve_unit_lower``; NumPy has no triangular solver). Every exponent above is a later G minus an
earlier one, or a G itself, so never positive: the (C, C, dk) pairwise decays of a per-channel g are
exponentials of differences within the chunk, masked to -inf above the diagonal before the exp,
and never exp(G_i) * exp(-G_j), whose exp(-G_j) overflows once a chunk's decays add up past 709.
A scalar g is the same with one channel that broadcasts over dk.

Padding. ``mask`` (B, T) is False at padding: that step is an identity step (g = 0: no decay,
beta = 0: u_t = 0, nothing written) and its output is 0, so padding never reaches the state. A
length T that is not a multiple of C is padded at the tail to N * C steps with the same identity
steps (zeros), whose outputs are dropped.

Backward, in reverse: the chunks in reverse order (du, dS through each chunk's three lines), then
the UT transform's lines vectorised over the chunks. The triangular solve's backward is a solve
with the transpose: (I + A) X = R gives dR = (I + A)^-T dX, by back substitution, and
dA = -dR X^T kept strictly lower. The cumulative sums' backward is a reversed cumulative sum.

float16 and bfloat16 are computed in float32 and rounded once: transformers computes this in float32
whatever its inputs.
"""

from typing import NamedTuple

import numpy as np

from numpy_attn._checks import check_dout, upcast
from numpy_attn.gated_delta_rule import _check_gated_delta_rule


class ChunkedDeltaRuleCache(NamedTuple):
    """What the backward needs, by chunk (B, nh, N, C, ...): the identity-padded inputs, the
    decays, the UT transform's A, W and U, the reads, and each chunk's starting state and u. The
    pairwise products of the keys are recomputed."""

    q: np.ndarray              # (B, nh, N, C, dk)
    k: np.ndarray              # (B, nh, N, C, dk)
    v: np.ndarray              # (B, nh, N, C, dv)
    beta: np.ndarray           # (B, nh, N, C), 0 at masked and padded steps
    G: np.ndarray              # (B, nh, N, C, e): cumulative log-decays, e = dk or 1 (scalar g)
    decay: np.ndarray          # (B, nh, N, C, C, e): exp(G_i - G_j) for j <= i, else 0
    A: np.ndarray              # (B, nh, N, C, C) strictly lower
    W: np.ndarray              # (B, nh, N, C, dk)
    U: np.ndarray              # (B, nh, N, C, dv)
    P: np.ndarray              # (B, nh, N, C, C) lower
    Qd: np.ndarray             # (B, nh, N, C, dk)
    Kd: np.ndarray             # (B, nh, N, C, dk)
    chunk_decay: np.ndarray    # (B, nh, N, e, 1)
    states: np.ndarray         # (B, nh, N, dk, dv): the state each chunk starts from
    u: np.ndarray              # (B, nh, N, C, dv)
    keep: np.ndarray           # (B, nh, T) bool: False at masked steps
    scale: np.floating
    per_channel: bool          # g was (B, nh, T, dk)
    has_initial_state: bool
    dtype: np.dtype            # the inputs' dtype (float16 and bfloat16 compute in float32)


def chunked_delta_rule_forward(q, k, v, g, beta, initial_state=None, scale=None, mask=None, chunk_size=64):
    """The gated delta rule on q, k (B, nh, T, dk), v (B, nh, T, dv), g (B, nh, T) or (B, nh, T, dk)
    (log-decays <= 0), beta (B, nh, T), from ``initial_state`` (B, nh, dk, dv) or zeros, a chunk of
    ``chunk_size`` steps at a time. Returns ``(o (B, nh, T, dv), state (B, nh, dk, dv), cache)``."""
    _check_chunked_delta_rule(q, k, v, g, beta, initial_state, scale, mask, chunk_size)
    dtype = q.dtype
    q, k, v, g, beta, initial_state = (upcast(x) for x in (q, k, v, g, beta, initial_state))   # float32 for 16 bits
    B, nh, T, dk = k.shape
    dv = v.shape[-1]
    C = chunk_size
    N = -(-T // C)                                            # chunks, the last padded to C steps
    scale = q.dtype.type(dk ** -0.5 if scale is None else scale)
    per_channel = g.ndim == 4
    g = g if per_channel else g[..., None]                    # (B, nh, T) -> (B, nh, T, 1): one decay, every row of S
    # A masked step is an identity step: g = 0 (no decay), beta = 0 (nothing written).
    keep = np.broadcast_to((np.ones((B, T), bool) if mask is None else mask)[:, None, :], (B, nh, T))
    g, beta = np.where(keep[..., None], g, 0), np.where(keep, beta, 0)
    # The tail is padded with identity steps too (zeros): N * C steps in chunks of C.
    q, k, v, g = (_chunks(x, N, C) for x in (q, k, v, g))    # (B, nh, T, d) -> (B, nh, N, C, d)
    beta = _chunks(beta[..., None], N, C)[..., 0]             # (B, nh, T) -> (B, nh, N, C)

    # The UT transform of every chunk at once.
    G = np.cumsum(g, axis=-2)                                 # (B, nh, N, C, e): log-decay from the chunk's start
    causal = np.tri(C, dtype=bool)[..., None]                 # (C, C, 1): j <= i
    # decay_ij = exp(G_i - G_j), masked before the exp: above the diagonal G_i - G_j > 0 could overflow.
    decay = np.exp(np.where(causal, G[..., :, None, :] - G[..., None, :, :], -np.inf))   # (B, nh, N, C, C, e)
    kb = beta[..., None] * k                                  # (B, nh, N, C, dk): the write's rate times its key
    A = np.tril(_pair(kb, k, decay), -1)                      # (B, nh, N, C, C): step j's write seen by step i's read
    Kb = kb * np.exp(G)                                       # (B, nh, N, C, dk): beta k decayed from the chunk's start
    Vb = beta[..., None] * v                                  # (B, nh, N, C, dv)
    W = _solve_unit_lower(A, Kb)                              # (I + A) W = Kb
    U = _solve_unit_lower(A, Vb)                              # (I + A) U = Vb
    P = scale * np.tril(_pair(q, k, decay))                   # (B, nh, N, C, C): causal attention within the chunk
    Qd = scale * q * np.exp(G)                                # (B, nh, N, C, dk): reads the chunk's starting state
    Kd = k * np.exp(G[..., -1:, :] - G)                       # (B, nh, N, C, dk): writes, decayed to the chunk's end
    chunk_decay = np.exp(G[..., -1, :])[..., None]            # (B, nh, N, e, 1): the state's decay over the chunk

    # The chunks in turn, each from the state the last one left.
    S = np.zeros((B, nh, dk, dv), q.dtype) if initial_state is None else initial_state
    states, u, o = [], [], []
    for n in range(N):
        states.append(S)
        u_n = U[:, :, n] - W[:, :, n] @ S                     # (B, nh, C, dv): the corrections
        o.append(Qd[:, :, n] @ S + P[:, :, n] @ u_n)          # (B, nh, C, dv): the old state's read + the chunk's own
        S = chunk_decay[:, :, n] * S + Kd[:, :, n].swapaxes(-1, -2) @ u_n   # (B, nh, dk, dv)
        u.append(u_n)
    states, u = np.stack(states, axis=2), np.stack(u, axis=2)   # (B, nh, N, dk, dv), (B, nh, N, C, dv)
    o = np.stack(o, axis=2).reshape(B, nh, N * C, dv)[:, :, :T]   # (B, nh, N, C, dv) -> (B, nh, T, dv)
    o = o * keep[..., None]                                   # a masked step's output is 0
    cache = ChunkedDeltaRuleCache(q, k, v, beta, G, decay, A, W, U, P, Qd, Kd, chunk_decay, states, u, keep,
                                  scale, per_channel, initial_state is not None, dtype)
    return o.astype(dtype, copy=False), S.astype(dtype, copy=False), cache


def chunked_delta_rule_backward(do, dstate, cache):
    """Gradients: do (B, nh, T, dv) and dstate (B, nh, dk, dv) or None (zeros) -> {"q", "k", "v",
    "g", "beta", "initial_state"}, g's shaped as g, initial_state's None without an initial state."""
    c = cache
    B, nh, N, C, dv = c.u.shape
    dk, T = c.k.shape[-1], c.keep.shape[-1]
    check_dout("chunked_delta_rule", do, (B, nh, T, dv), c.dtype, name="do")
    if dstate is not None:
        check_dout("chunked_delta_rule", dstate, (B, nh, dk, dv), c.dtype, name="dstate")
    do, dstate = upcast(do), upcast(dstate)                   # float32 for float16 and bfloat16
    # Undoes o = o * keep (a masked step's output is 0) and the tail's padding.
    do = _chunks(do * c.keep[..., None], N, C)                # (B, nh, T, dv) -> (B, nh, N, C, dv)

    # The chunks in reverse order, each line of the loop undone from the last.
    dS = np.zeros((B, nh, dk, dv), c.q.dtype) if dstate is None else dstate
    dU, dW, dP, dQd, dKd, dchunk_decay = [], [], [], [], [], []
    for n in reversed(range(N)):
        S, u_n, do_n = c.states[:, :, n], c.u[:, :, n], do[:, :, n]
        # Undoes S_new = chunk_decay * S + Kd^T u (dS is dS_new).
        du_write = c.Kd[:, :, n] @ dS                         # (B, nh, C, dv)
        dKd.append(u_n @ dS.swapaxes(-1, -2))                 # (B, nh, C, dk)
        dchunk_decay.append(_sum_to((dS * S).sum(-1, keepdims=True), c.G.shape[-1], -2))   # (B, nh, e, 1)
        dS_decay = c.chunk_decay[:, :, n] * dS
        # Undoes o = Qd S + P u.
        dQd.append(do_n @ S.swapaxes(-1, -2))                 # (B, nh, C, dk)
        dP.append(do_n @ u_n.swapaxes(-1, -2))                # (B, nh, C, C)
        du = du_write + c.P[:, :, n].swapaxes(-1, -2) @ do_n
        dS_read = c.Qd[:, :, n].swapaxes(-1, -2) @ do_n       # (B, nh, dk, dv)
        # Undoes u = U - W S.
        dU.append(du)
        dW.append(-du @ S.swapaxes(-1, -2))                   # (B, nh, C, dk)
        dS = dS_decay + dS_read - c.W[:, :, n].swapaxes(-1, -2) @ du
    dinitial_state = dS if c.has_initial_state else None
    dU, dW, dP, dQd, dKd, dchunk_decay = (np.stack(x[::-1], axis=2) for x in (dU, dW, dP, dQd, dKd, dchunk_decay))

    # The UT transform's lines, undone from the last, every chunk at once.
    G, decay, q, k, v, beta = c.G, c.decay, c.q, c.k, c.v, c.beta
    e = G.shape[-1]
    kb = beta[..., None] * k                                  # (B, nh, N, C, dk), recomputed
    # Undoes chunk_decay = exp(G_last).
    dG_last = dchunk_decay[..., 0] * c.chunk_decay[..., 0]   # (B, nh, N, e)
    # Undoes Kd = k * exp(G_last - G): d(G_last - G_i) = dKd_i * Kd_i.
    dk_write = dKd * np.exp(G[..., -1:, :] - G)
    dG_write = _sum_to(dKd * c.Kd, e)                         # (B, nh, N, C, e)
    dG_last = dG_last + dG_write.sum(axis=-2)
    # Undoes Qd = scale * q * exp(G).
    dq_read = c.scale * dQd * np.exp(G)
    dG_read = _sum_to(dQd * c.Qd, e)
    # Undoes P = scale * tril(pair(q, k, decay)).
    dq_intra, dk_intra, ddecay_intra = _pair_backward(c.scale * np.tril(dP), q, k, decay)
    # Undoes (I + A) U = Vb and (I + A) W = Kb: a solve with the transpose, by back substitution.
    dVb = _solve_unit_upper(c.A.swapaxes(-1, -2), dU)        # (B, nh, N, C, dv)
    dKb = _solve_unit_upper(c.A.swapaxes(-1, -2), dW)        # (B, nh, N, C, dk)
    dA = -np.tril(dVb @ c.U.swapaxes(-1, -2) + dKb @ c.W.swapaxes(-1, -2), -1)   # (B, nh, N, C, C)
    # Undoes Vb = beta v.
    dv = beta[..., None] * dVb
    dbeta_v = (dVb * v).sum(-1)                               # (B, nh, N, C)
    # Undoes Kb = kb * exp(G): d(G_i) = dKb_i * Kb_i.
    dkb_decayed = dKb * np.exp(G)
    dG_kb = _sum_to(dkb_decayed * kb, e)
    # Undoes A = tril(pair(kb, k, decay), -1) (dA is already strictly lower).
    dkb_A, dk_A, ddecay_A = _pair_backward(dA, kb, k, decay)
    # Undoes kb = beta k.
    dkb = dkb_decayed + dkb_A
    dbeta = dbeta_v + (dkb * k).sum(-1)
    dk = dk_write + dk_intra + dk_A + beta[..., None] * dkb
    dq = dq_read + dq_intra
    # Undoes decay = exp(G_i - G_j) (0 above the diagonal, where it has no gradient).
    dpair = (ddecay_intra + ddecay_A) * decay                 # (B, nh, N, C, C, e): d(G_i - G_j)
    dG = dG_read + dG_kb + dpair.sum(axis=-2) - dpair.sum(axis=-3) - dG_write
    last = (np.arange(C) == C - 1)[:, None]                   # (C, 1): G_last is G's last row
    dG = dG + last * dG_last[..., None, :]                    # (B, nh, N, C, e)
    # Undoes G = cumsum(g): a reversed cumulative sum.
    dg = np.flip(np.cumsum(np.flip(dG, axis=-2), axis=-2), axis=-2)

    # Undoes the chunking and the tail's padding, then g, beta = where(keep, ...).
    dq, dk, dv, dg = (_unchunks(x, T) for x in (dq, dk, dv, dg))   # (B, nh, N, C, d) -> (B, nh, T, d)
    dbeta = _unchunks(dbeta[..., None], T)[..., 0]            # (B, nh, T)
    dg = np.where(c.keep[..., None], dg, 0)
    dg = dg if c.per_channel else dg[..., 0]                 # (B, nh, T, 1) -> (B, nh, T)
    dbeta = np.where(c.keep, dbeta, 0)
    grads = {"q": dq, "k": dk, "v": dv, "g": dg, "beta": dbeta, "initial_state": dinitial_state}
    return {name: None if d is None else d.astype(c.dtype, copy=False) for name, d in grads.items()}   # rounded once


def _chunks(x, N, C):
    """(B, nh, T, d) -> (B, nh, N, C, d), the tail padded with zeros to N * C steps."""
    B, nh, T, d = x.shape
    x = np.pad(x, ((0, 0), (0, 0), (0, N * C - T), (0, 0)))
    return x.reshape(B, nh, N, C, d)


def _unchunks(x, T):
    """(B, nh, N, C, d) -> (B, nh, T, d), the tail's padding dropped."""
    B, nh, N, C, d = x.shape
    return x.reshape(B, nh, N * C, d)[:, :, :T]


def _pair(a, b, decay):
    """M_ij = sum_c a_ic b_jc decay_ijc: a (..., C, dk), b (..., C, dk), decay (..., C, C, e),
    e = dk or 1 (broadcast) -> (..., C, C)."""
    return (a[..., :, None, :] * b[..., None, :, :] * decay).sum(-1)


def _pair_backward(dM, a, b, decay):
    """Gradients of _pair: dM (..., C, C) -> (da, db, ddecay), ddecay summed to decay's e."""
    dM = dM[..., None]                                        # (..., C, C, 1)
    da = (dM * b[..., None, :, :] * decay).sum(-2)            # (..., C, dk)
    db = (dM * a[..., :, None, :] * decay).sum(-3)            # (..., C, dk)
    ddecay = _sum_to(dM * a[..., :, None, :] * b[..., None, :, :], decay.shape[-1])   # (..., C, C, e)
    return da, db, ddecay


def _sum_to(x, e, axis=-1):
    """x summed over ``axis`` (keeping it) when the decay there had one channel (scalar g, e = 1)."""
    return x.sum(axis, keepdims=True) if e == 1 else x


def _solve_unit_lower(A, R):
    """X (..., C, d) with (I + A) X = R, A (..., C, C) strictly lower: forward substitution,
    X_i = R_i - sum_(j<i) A_ij X_j from the top row down (one matmul per row for every batch, head
    and chunk)."""
    X = np.zeros_like(R)
    for i in range(R.shape[-2]):
        X[..., i, :] = R[..., i, :] - (A[..., i, None, :i] @ X[..., :i, :])[..., 0, :]
    return X


def _solve_unit_upper(A, R):
    """X (..., C, d) with (I + A) X = R, A (..., C, C) strictly upper: back substitution,
    X_i = R_i - sum_(j>i) A_ij X_j from the bottom row up."""
    X = np.zeros_like(R)
    for i in reversed(range(R.shape[-2])):
        X[..., i, :] = R[..., i, :] - (A[..., i, None, i + 1:] @ X[..., i + 1:, :])[..., 0, :]
    return X


def _check_chunked_delta_rule(q, k, v, g, beta, initial_state, scale, mask, chunk_size):
    """The recurrence's checks (gated_delta_rule.py), at least one step, and a chunk size that is an
    integer >= 1; each raises naming the argument at fault."""
    _check_gated_delta_rule(q, k, v, g, beta, initial_state, scale, mask, "chunked_delta_rule")
    if q.shape[2] < 1:
        raise ValueError(f"q must hold at least one step, shape (B, nh, T, dk) with T >= 1, got {q.shape}")
    if isinstance(chunk_size, bool | np.bool_) or not isinstance(chunk_size, int | np.integer):
        raise TypeError(f"chunk_size must be an integer >= 1, got {type(chunk_size).__name__} {chunk_size!r}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be an integer >= 1, got {chunk_size!r}")
