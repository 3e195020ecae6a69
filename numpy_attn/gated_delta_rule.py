"""The gated delta rule: a linear-attention state written by a decayed delta rule, and its backward.

    S_t = (I - beta_t k_t k_t^T) D_t S_(t-1) + beta_t k_t v_t^T,   D_t = diag(exp(g_t))
    o_t = scale * S_t^T q_t,   scale = 1 / sqrt(dk) unless given

One step, in the order the loop below (and transformers' fallbacks) runs it:

    S = exp(g_t) * S                   decay the state
    u_t = beta_t * (v_t - S^T k_t)     what S got wrong about v_t, times the learning rate beta_t
    S = S + k_t u_t^T                  write the correction
    o_t = scale * S^T q_t              read the new state

The state S is (B, nh, dk, dv), rows key channels and columns value channels: the paper's S
transposed, as transformers stores its recurrent state. q, k (B, nh, T, dk), v (B, nh, T, dv),
beta (B, nh, T). g is the log of the decay, finite and <= 0, of one of two kinds: (B, nh, T), one
scalar per head and step (Gated DeltaNet: Qwen3-Next, Qwen3.5, OLMo Hybrid), or (B, nh, T, dk), one
per key channel, each row of S decaying at its own rate (Kimi Delta Attention). The models
L2-normalise q and k before this op; then, with 0 <= beta_t <= 1 and g <= 0, each step's map of S
has norm at most 1 and nothing grows.

Padding: ``mask`` (B, T), False at a padded step, makes that step leave S as it was (g = 0,
beta = 0) and its output row 0, so a left-padded sequence ends in the state of the unpadded one.

Backward, through time in reverse: the forward keeps every state S_t, t = 0..T; each step of the
reverse loop undoes one forward step line by line, from the state before it, carrying dS back.

``gated_delta_rule_parallel_forward`` computes the same outputs and final state without a loop over
time, for short sequences: with G_t the cumulative sum of g up to t,

    A_ts = sum_c k_tc k_sc exp(G_tc - G_sc)   for s < t, pairwise decays
    U = (I + diag(beta) A)^(-1) diag(beta) (V - (exp(G) * K) S_0)
    O = scale * ((exp(G) * Q) S_0 + W U),   W_ts = sum_c q_tc k_sc exp(G_tc - G_sc) for s <= t

the UT (WY) form of the whole sequence as one block: U holds the u_t, solved from a unit
lower-triangular system.

Yang, Kautz and Hatamizadeh, "Gated Delta Networks: Improving Mamba2 with Delta Rule" (ICLR 2025),
for the scalar gate; Kimi Team, "Kimi Linear: An Expressive, Efficient Attention Architecture"
(2025), for the per-channel decay.
"""

from typing import NamedTuple

import numpy as np

from numpy_attn._checks import check_dout, check_finite, check_float, check_same_dtype, check_scale, upcast


class GatedDeltaRuleCache(NamedTuple):
    """The inputs as the loop read them (g with a key axis, padding already zeroed in g and beta),
    every state S_0..S_T, and what to round to and give back; the backward recomputes each step's
    decayed state and correction u_t from the state before it."""

    q: np.ndarray           # (B, nh, T, dk)
    k: np.ndarray           # (B, nh, T, dk)
    v: np.ndarray           # (B, nh, T, dv)
    gk: np.ndarray          # (B, nh, T, dk) or (B, nh, T, 1)
    beta: np.ndarray        # (B, nh, T)
    states: np.ndarray      # (B, nh, T + 1, dk, dv), states[:, :, t] = S_t
    scale: float
    mask: np.ndarray | None
    per_channel: bool
    has_initial_state: bool
    dtype: np.dtype


def gated_delta_rule_forward(q, k, v, g, beta, initial_state=None, scale=None, mask=None):
    """q, k (B, nh, T, dk), v (B, nh, T, dv), g (B, nh, T) or (B, nh, T, dk), beta (B, nh, T),
    initial_state (B, nh, dk, dv) or None (zeros), mask (B, T) bool or None -> (o (B, nh, T, dv),
    final state (B, nh, dk, dv), cache)."""
    _check_gated_delta_rule(q, k, v, g, beta, initial_state, scale, mask)
    dtype, per_channel, has_initial_state = q.dtype, g.ndim == 4, initial_state is not None
    q, k, v, gk, beta, S, scale = _start(q, k, v, g, beta, initial_state, scale)   # gk (B, nh, T, dk or 1)
    B, nh, T, dk = q.shape
    dv = v.shape[-1]
    # Padding: a padded step decays nothing (g = 0) and writes nothing (beta = 0).
    if mask is not None:
        gk, beta = np.where(mask[:, None, :, None], gk, 0), np.where(mask[:, None], beta, 0)
    states = np.empty((B, nh, T + 1, dk, dv), q.dtype)     # every S_t, for the backward
    states[:, :, 0] = S
    o = np.empty((B, nh, T, dv), q.dtype)
    for t in range(T):
        S = np.exp(gk[:, :, t])[..., None] * S                         # (B, nh, dk, dv), decayed
        kv_mem = np.einsum("...kv,...k->...v", S, k[:, :, t])           # (B, nh, dv), S's reading of k_t
        u = beta[:, :, t, None] * (v[:, :, t] - kv_mem)                 # (B, nh, dv), the delta
        S = S + k[:, :, t, :, None] * u[..., None, :]                   # (B, nh, dk, dv)
        o[:, :, t] = scale * np.einsum("...kv,...k->...v", S, q[:, :, t])   # (B, nh, dv)
        states[:, :, t + 1] = S
    # A padded step's output row is 0.
    if mask is not None:
        o = o * mask[:, None, :, None]
    cache = GatedDeltaRuleCache(q, k, v, gk, beta, states, scale, mask, per_channel, has_initial_state, dtype)
    # S.astype copies: at T = 0, S is still the caller's initial_state, which the result must not be.
    return o.astype(dtype, copy=False), S.astype(dtype), cache


def gated_delta_rule_backward(do, dstate, cache):
    """Gradients: do (B, nh, T, dv) of the outputs and dstate (B, nh, dk, dv) of the final state (None:
    zeros) -> {"q", "k", "v", "g", "beta", "initial_state"} (initial_state None when none was given)."""
    q, k, v, gk, beta, states, scale, mask, per_channel, has_initial_state, dtype = cache
    B, nh, T, dk = q.shape
    check_dout("gated_delta_rule", do, v.shape, dtype, name="do")
    if dstate is not None:
        check_dout("gated_delta_rule", dstate, states.shape[:2] + states.shape[3:], dtype, name="dstate")
    do = upcast(do)                                        # float32 for float16 and bfloat16
    # Undoes o = o * mask: a padded row sent nothing back.
    if mask is not None:
        do = do * mask[:, None, :, None]
    dS = np.zeros_like(states[:, :, 0]) if dstate is None else upcast(dstate)   # (B, nh, dk, dv)
    dq, dk_, dv_ = np.empty_like(q), np.empty_like(k), np.empty_like(v)   # dk, dv name the head sizes
    dgk, dbeta = np.empty_like(gk), np.empty_like(beta)
    for t in reversed(range(T)):
        # Recomputed from S_(t-1): the decayed state, S's reading of k_t and the delta.
        decay = np.exp(gk[:, :, t])[..., None]                          # (B, nh, dk or 1, 1)
        S_decayed = decay * states[:, :, t]                             # (B, nh, dk, dv)
        kv_mem = np.einsum("...kv,...k->...v", S_decayed, k[:, :, t])   # (B, nh, dv)
        u = beta[:, :, t, None] * (v[:, :, t] - kv_mem)                 # (B, nh, dv)
        # Undoes o_t = scale * S^T q_t, S = S_t.
        dq[:, :, t] = scale * np.einsum("...kv,...v->...k", states[:, :, t + 1], do[:, :, t])   # (B, nh, dk)
        dS = dS + scale * q[:, :, t, :, None] * do[:, :, t, None, :]    # (B, nh, dk, dv)
        # Undoes S = S + k_t u_t^T.
        dk_t = np.einsum("...kv,...v->...k", dS, u)                     # (B, nh, dk)
        du = np.einsum("...kv,...k->...v", dS, k[:, :, t])              # (B, nh, dv)
        # Undoes u_t = beta_t * (v_t - kv_mem).
        dbeta[:, :, t] = (du * (v[:, :, t] - kv_mem)).sum(axis=-1)
        dv_[:, :, t] = beta[:, :, t, None] * du
        dkv_mem = -dv_[:, :, t]                                         # (B, nh, dv)
        # Undoes kv_mem = S^T k_t: a second path into the decayed state and into k_t.
        dS_decayed = dS + k[:, :, t, :, None] * dkv_mem[..., None, :]   # (B, nh, dk, dv)
        dk_[:, :, t] = dk_t + np.einsum("...kv,...v->...k", S_decayed, dkv_mem)
        # Undoes S = exp(g_t) * S: d exp(g)/dg = exp(g), times dS . S_(t-1) over what each decay scaled.
        ddecay = (dS_decayed * states[:, :, t]).sum(axis=-1)             # (B, nh, dk)
        dgk[:, :, t] = decay[..., 0] * (ddecay if per_channel else ddecay.sum(axis=-1, keepdims=True))
        dS = decay * dS_decayed                                          # (B, nh, dk, dv), dS_(t-1)
    # Undoes the padding's g = 0 and beta = 0: a padded step's g and beta were not used.
    if mask is not None:
        dgk, dbeta = np.where(mask[:, None, :, None], dgk, 0), np.where(mask[:, None], dbeta, 0)
    dg = dgk if per_channel else dgk[..., 0]               # (B, nh, T, 1) -> (B, nh, T)
    grads = {"q": dq, "k": dk_, "v": dv_, "g": dg, "beta": dbeta, "initial_state": dS if has_initial_state else None}
    return {name: None if d is None else d.astype(dtype, copy=False) for name, d in grads.items()}   # each rounded once


def gated_delta_rule_parallel_forward(q, k, v, g, beta, initial_state=None, scale=None):
    """The same outputs and final state as gated_delta_rule_forward (no mask), without a loop over
    time: the UT form of the whole sequence, with (B, nh, T, T, dk or 1) pairwise decays; for short
    sequences. -> (o (B, nh, T, dv), final state (B, nh, dk, dv))."""
    _check_gated_delta_rule(q, k, v, g, beta, initial_state, scale, None)
    dtype = q.dtype
    q, k, v, gk, beta, S0, scale = _start(q, k, v, g, beta, initial_state, scale)   # gk (B, nh, T, dk or 1)
    B, nh, T, dk = q.shape
    G = np.cumsum(gk, axis=2)                              # (B, nh, T, dk or 1), log of the decay since the start
    # exp(G_t - G_s), the decay from step s to step t, for s <= t; the exponent is masked before the
    # exp so that s > t (a growth, not a decay) never overflows.
    causal = np.tri(T, dtype=bool)[:, :, None]             # (T, T, 1), s <= t
    decays = np.exp(np.where(causal, G[:, :, :, None] - G[:, :, None], -np.inf))   # (B, nh, T, T, dk or 1)
    A = (k[:, :, :, None] * decays * k[:, :, None]).sum(axis=-1)   # (B, nh, T, T), k_t . k_s decayed
    L = np.tril(beta[..., None] * A, -1)                   # (B, nh, T, T), strictly lower
    rhs = beta[..., None] * (v - (np.exp(G) * k) @ S0)     # (B, nh, T, dv)
    U = np.linalg.solve(np.eye(T, dtype=q.dtype) + L, rhs)   # (B, nh, T, dv), the u_t
    W = (q[:, :, :, None] * decays * k[:, :, None]).sum(axis=-1)   # (B, nh, T, T), q_t . k_s decayed, s <= t
    o = scale * ((np.exp(G) * q) @ S0 + W @ U)             # (B, nh, T, dv)
    # S_T: S_0 decayed over every step, plus each k_s u_s^T decayed from s to T.
    state = np.exp(G[:, :, -1])[..., None] * S0 + (decays[:, :, -1] * k).swapaxes(-1, -2) @ U   # (B, nh, dk, dv)
    return o.astype(dtype, copy=False), state.astype(dtype, copy=False)


def _start(q, k, v, g, beta, initial_state, scale):
    """The inputs as both forms compute with them: float32 for float16 and bfloat16, g with a key
    axis (one decay for every row of S when g is one per head), zeros for a missing initial state
    and the scale 1 / sqrt(dk) unless given."""
    q, k, v, g, beta, initial_state = (upcast(x) for x in (q, k, v, g, beta, initial_state))
    B, nh, T, dk = q.shape
    dv = v.shape[-1]
    gk = g if g.ndim == 4 else g[..., None]                 # (B, nh, T) -> (B, nh, T, 1)
    S0 = np.zeros((B, nh, dk, dv), q.dtype) if initial_state is None else initial_state   # (B, nh, dk, dv)
    return q, k, v, gk, beta, S0, q.dtype.type(dk ** -0.5 if scale is None else scale)


def _check_gated_delta_rule(q, k, v, g, beta, initial_state, scale, mask, op="gated_delta_rule"):
    """Raise unless q, k (B, nh, T, dk), v (B, nh, T, dv), g (B, nh, T) or (B, nh, T, dk), beta
    (B, nh, T), initial_state None or (B, nh, dk, dv) are float arrays of one dtype, finite, g <= 0,
    scale None or a finite number and mask None or a (B, T) bool array, naming the value at fault
    (and ``op``, the operation, in the scale's message)."""
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        check_float(name, x)
    if initial_state is not None:
        check_float("initial_state", initial_state)
    check_same_dtype(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state)
    if q.ndim != 4:
        raise ValueError(f"q must have shape (B, nh, T, dk), got {q.shape}")
    B, nh, T, dk = q.shape
    expected = {"k": (k, [(B, nh, T, dk)]), "v": (v, [(B, nh, T, v.shape[-1] if v.ndim == 4 else "dv")]),
                "g": (g, [(B, nh, T), (B, nh, T, dk)]), "beta": (beta, [(B, nh, T)])}
    if initial_state is not None:
        expected["initial_state"] = (initial_state, [(B, nh, dk, v.shape[-1] if v.ndim == 4 else "dv")])
    for name, (x, shapes) in expected.items():
        if x.shape not in shapes:
            wanted = " or ".join(str(s).replace("'", "") for s in shapes)
            raise ValueError(f"{name} must have shape {wanted} to match q {q.shape}, got {x.shape}")
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("initial_state", initial_state)):
        if x is not None:
            check_finite(name, x)
    if g.size and g.max() > 0:
        raise ValueError(f"g, the log of the decay, must be <= 0 (a decay of at most 1), got a largest "
                         f"value {float(g.max())!r} in g of shape {g.shape}")
    check_scale(scale, op)
    if mask is not None:
        if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_:
            raise TypeError(f"mask must be a bool NumPy array (B, T), False at padding, got "
                            f"{getattr(mask, 'dtype', type(mask).__name__)}")
        if mask.shape != (B, T):
            raise ValueError(f"mask must have shape (B, T) = {(B, T)} to match q {q.shape}, got {mask.shape}")
