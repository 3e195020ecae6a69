"""The gated delta rule in plain PyTorch; autograd supplies the backward through time.

Twin of numpy_attn/gated_delta_rule.py: S = exp(g_t) * S, u_t = beta_t * (v_t - S^T k_t),
S = S + k_t u_t^T, o_t = scale * S^T q_t, the state S (B, nh, dk, dv) stored as transformers
stores it; g (B, nh, T) one decay per head (Gated DeltaNet) or (B, nh, T, dk) one per key channel
(Kimi Delta Attention); ``mask`` (B, T) False at padding, which leaves S as it was. And the
parallel (UT) form of the whole sequence, for short ones. float16 and bfloat16 compute in float32.
"""

import torch

from torch_attn._opmath import upcast


def gated_delta_rule(q, k, v, g, beta, initial_state=None, scale=None, mask=None):
    """q, k (B, nh, T, dk), v (B, nh, T, dv), g (B, nh, T) or (B, nh, T, dk), beta (B, nh, T),
    initial_state (B, nh, dk, dv) or None (zeros), mask (B, T) bool or None -> (o (B, nh, T, dv),
    final state (B, nh, dk, dv))."""
    dtype = q.dtype
    q, k, v, gk, beta, S, scale = _start(q, k, v, g, beta, initial_state, scale)   # gk (B, nh, T, dk or 1)
    B, nh, T, dk = q.shape
    dv = v.shape[-1]
    # Padding: a padded step decays nothing (g = 0) and writes nothing (beta = 0).
    if mask is not None:
        gk, beta = torch.where(mask[:, None, :, None], gk, 0), torch.where(mask[:, None], beta, 0)
    o = torch.empty((B, nh, T, dv), dtype=q.dtype)
    for t in range(T):
        S = torch.exp(gk[:, :, t])[..., None] * S                       # (B, nh, dk, dv), decayed
        kv_mem = torch.einsum("...kv,...k->...v", S, k[:, :, t])        # (B, nh, dv), S's reading of k_t
        u = beta[:, :, t, None] * (v[:, :, t] - kv_mem)                 # (B, nh, dv), the delta
        S = S + k[:, :, t, :, None] * u[..., None, :]                   # (B, nh, dk, dv)
        o[:, :, t] = scale * torch.einsum("...kv,...k->...v", S, q[:, :, t])   # (B, nh, dv)
    # A padded step's output row is 0.
    if mask is not None:
        o = o * mask[:, None, :, None]
    # S.to copies: at T = 0, S is still the caller's initial_state, which the result must not be.
    return o.to(dtype), S.to(dtype, copy=True)


def gated_delta_rule_parallel(q, k, v, g, beta, initial_state=None, scale=None):
    """The same outputs and final state as gated_delta_rule (no mask), without a loop over time: the
    UT form of the whole sequence, with (B, nh, T, T, dk or 1) pairwise decays -> (o, final state)."""
    dtype = q.dtype
    q, k, v, gk, beta, S0, scale = _start(q, k, v, g, beta, initial_state, scale)   # gk (B, nh, T, dk or 1)
    B, nh, T, dk = q.shape
    G = torch.cumsum(gk, dim=2)                            # (B, nh, T, dk or 1), log of the decay since the start
    # exp(G_t - G_s), the decay from step s to step t, for s <= t; the exponent is masked before the
    # exp so that s > t (a growth, not a decay) never overflows.
    causal = torch.ones(T, T, dtype=torch.bool).tril()[:, :, None]   # (T, T, 1), s <= t
    decays = torch.exp(torch.where(causal, G[:, :, :, None] - G[:, :, None], -torch.inf))   # (B, nh, T, T, dk or 1)
    A = (k[:, :, :, None] * decays * k[:, :, None]).sum(dim=-1)   # (B, nh, T, T), k_t . k_s decayed
    L = torch.tril(beta[..., None] * A, -1)                # (B, nh, T, T), strictly lower
    rhs = beta[..., None] * (v - (torch.exp(G) * k) @ S0)   # (B, nh, T, dv)
    U = torch.linalg.solve(torch.eye(T, dtype=q.dtype) + L, rhs)   # (B, nh, T, dv), the u_t
    W = (q[:, :, :, None] * decays * k[:, :, None]).sum(dim=-1)   # (B, nh, T, T), q_t . k_s decayed, s <= t
    o = scale * ((torch.exp(G) * q) @ S0 + W @ U)          # (B, nh, T, dv)
    # S_T: S_0 decayed over every step, plus each k_s u_s^T decayed from s to T.
    state = torch.exp(G[:, :, -1])[..., None] * S0 + (decays[:, :, -1] * k).transpose(-1, -2) @ U   # (B, nh, dk, dv)
    return o.to(dtype), state.to(dtype)


def _start(q, k, v, g, beta, initial_state, scale):
    """The inputs as both forms compute with them: float32 for float16 and bfloat16, g with a key
    axis (one decay for every row of S when g is one per head), zeros for a missing initial state
    and the scale 1 / sqrt(dk) unless given."""
    q, k, v, g, beta, initial_state = (upcast(x) for x in (q, k, v, g, beta, initial_state))
    B, nh, T, dk = q.shape
    dv = v.shape[-1]
    gk = g if g.dim() == 4 else g[..., None]                 # (B, nh, T) -> (B, nh, T, 1)
    S0 = torch.zeros((B, nh, dk, dv), dtype=q.dtype) if initial_state is None else initial_state   # (B, nh, dk, dv)
    return q, k, v, gk, beta, S0, dk ** -0.5 if scale is None else scale


# PyTorch has no built-in for it. Equals transformers' fallbacks on (B, T, nh, d) inputs with
# use_qk_l2norm_in_kernel=False and the default scale: torch_recurrent_gated_delta_rule
# (transformers.models.qwen3_5.modeling_qwen3_5) for scalar g and recurrent_kimi_delta_attention
# (transformers.models.kimi_linear.modeling_kimi_linear) for per-channel g, outputs and final
# state; parity_tests/test_gated_delta_rule.py checks it.
