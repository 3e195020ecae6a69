"""Gated DeltaNet, Qwen3.5's linear-attention sublayer, in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/gated_deltanet.py: the input projections, the causal convolution with SiLU,
q and k repeated to the value heads and L2-normalised, beta = beta_scale * sigmoid(x @ in_proj_b),
g = -exp(A_log) * softplus(x @ in_proj_a + dt_bias), the delta rule (chunked, or one step of the recurrence when
decoding), the gated RMS norm per value head and out_proj. float16 and bfloat16 compute in float32
throughout and round the output and the state handed on once, as there.
"""

import torch

from numpy_attn._tree import tree_map  # plain Python: walks the nested dicts
from torch_attn._opmath import upcast
from torch_attn.causal_conv1d import causal_conv1d
from torch_attn.chunked_delta_rule import chunked_delta_rule
from torch_attn.gated_delta_rule import gated_delta_rule
from torch_attn.gated_rms_norm import gated_rms_norm
from torch_attn.l2_norm import l2_norm
from torch_attn.linear import linear
from torch_attn.swiglu import sigmoid


def gated_deltanet(x, params, num_k_heads, num_v_heads, head_k_dim, head_v_dim, eps=1e-6,
                   state=None, mask=None, chunk_size=64, beta_scale=1.0):
    """x (B, T, C) -> (out (B, T, C), new_state {"conv": (B, conv_dim, K-1), "recurrent": (B, nv, dk, dv)})."""
    nk, nv, dk, dv = num_k_heads, num_v_heads, head_k_dim, head_v_dim
    B, T, C = x.shape
    dtype = x.dtype
    x, params, state = opmath_sublayer_inputs(x, params, state)      # float32 for float16 and bfloat16
    if mask is not None:
        x = x * mask[:, :, None]                                     # padding read as zeros
    qkv = linear(x, **params["in_proj_qkv"])                          # (B, T, 2 nk dk + nv dv)
    z = linear(x, **params["in_proj_z"])                              # (B, T, nv dv)
    b = linear(x, **params["in_proj_b"])                              # (B, T, nv)
    a = linear(x, **params["in_proj_a"])                              # (B, T, nv)
    conv_state = None if state is None else state["conv"]
    qkv, conv_state = causal_conv1d(qkv, params["conv1d"]["w"], None, conv_state, "silu")
    q, k, v = torch.split(qkv, [nk * dk, nk * dk, nv * dv], dim=-1)
    # Heads first; each key head repeated for the r value heads it serves.
    q = torch.repeat_interleave(q.reshape(B, T, nk, dk), nv // nk, dim=2).transpose(1, 2)   # (B, nv, T, dk)
    k = torch.repeat_interleave(k.reshape(B, T, nk, dk), nv // nk, dim=2).transpose(1, 2)   # (B, nv, T, dk)
    v = v.reshape(B, T, nv, dv).transpose(1, 2)                                             # (B, nv, T, dv)
    q = l2_norm(q)                                                    # eps 1e-6, fixed in the models
    k = l2_norm(k)
    beta = beta_scale * sigmoid(b)                                    # (B, T, nv)
    g = log_decay(a + params["dt_bias"], params["A_log"])            # (B, T, nv), <= 0
    S0 = None if state is None else state["recurrent"]
    o, S = delta_rule(q, k, v, g.transpose(1, 2), beta.transpose(1, 2), S0, chunk_size)
    # The gated norm per value head, gate z.
    y = gated_rms_norm(o.transpose(1, 2), z.reshape(B, T, nv, dv), params["norm"]["w"], eps)
    out = linear(y.reshape(B, T, nv * dv), **params["out_proj"])     # (B, T, C)
    return out.to(dtype), rounded_tree({"conv": conv_state, "recurrent": S}, dtype)


# -- steps Kimi Delta Attention shares (torch_attn/kimi_delta_attention.py) ------------------------

def opmath_sublayer_inputs(x, params, state):
    """x, params and state (None or {"conv", "recurrent"}) as the sublayer computes with them:
    float32 for float16 and bfloat16, the tensors themselves otherwise."""
    return upcast(x), tree_map(upcast, params), None if state is None else tree_map(upcast, state)


def rounded_tree(tree, dtype):
    """Every tensor of ``tree`` in ``dtype``."""
    return tree_map(lambda t: t.to(dtype), tree)


def log_decay(pre, A_log):
    """g = -exp(A_log) * softplus(pre) (<= 0), A_log broadcast from the right."""
    sp = torch.logaddexp(torch.zeros_like(pre), pre)                  # softplus, no overflow
    return -torch.exp(A_log) * sp


def delta_rule(q, k, v, g, beta, S0, chunk_size):
    """One step of the recurrence when decoding (a state and T = 1), the chunked form otherwise: (o, S)."""
    if S0 is not None and q.shape[2] == 1:
        return gated_delta_rule(q, k, v, g, beta, initial_state=S0)
    return chunked_delta_rule(q, k, v, g, beta, initial_state=S0, chunk_size=chunk_size)


# Equals Hugging Face's Qwen3_5GatedDeltaNet.forward (its torch fallbacks, with F.softplus, whose
# threshold of 20 returns a itself where log(1 + exp(a)) differs from a by under exp(-20));
# parity_tests/test_gated_deltanet.py checks it.
