"""Kimi Delta Attention, the linear-attention sublayer of Kimi Linear, in PyTorch (autograd): the
twin of numpy_attn/kimi_delta_attention.py."""

import torch

from torch_attn.causal_conv1d import causal_conv1d
from torch_attn.gated_deltanet import delta_rule, log_decay, opmath_sublayer_inputs, rounded_tree
from torch_attn.gated_rms_norm import gated_rms_norm
from torch_attn.l2_norm import l2_norm
from torch_attn.linear import linear
from torch_attn.swiglu import sigmoid


def kimi_delta_attention(x, params, num_heads, head_dim, eps=1e-6, state=None, mask=None, chunk_size=64):
    """x (B, T, C) -> (out (B, T, C), new_state {"conv": (B, 3 nh d, K-1), "recurrent": (B, nh, d, d)})."""
    nh, d = num_heads, head_dim
    B, T, C = x.shape
    dtype = x.dtype
    x, params, state = opmath_sublayer_inputs(x, params, state)      # float32 for float16 and bfloat16
    if mask is not None:
        x = x * mask[:, :, None]                                     # padding read as zeros
    proj = {name: linear(x, **params[name]) for name in ("q_proj", "k_proj", "v_proj", "b_proj", "f_a_proj",
                                                         "g_a_proj")}   # (B, T, nh d), (B, T, nh), (B, T, d)
    f = linear(proj["f_a_proj"], **params["f_b_proj"])               # (B, T, d) -> (B, T, nh d)
    z = linear(proj["g_a_proj"], **params["g_b_proj"])               # (B, T, d) -> (B, T, nh d)
    qkv = torch.cat([proj["q_proj"], proj["k_proj"], proj["v_proj"]], dim=-1)   # (B, T, 3 nh d)
    conv_state = None if state is None else state["conv"]
    qkv, conv_state = causal_conv1d(qkv, params["conv1d"]["w"], None, conv_state, "silu")
    q, k, v = (t.reshape(B, T, nh, d).transpose(1, 2) for t in torch.chunk(qkv, 3, dim=-1))   # (B, nh, T, d)
    q = l2_norm(q)                                                    # eps 1e-6, fixed in the model
    k = l2_norm(k)
    beta = sigmoid(proj["b_proj"])                                    # (B, T, nh)
    g = log_decay((f + params["dt_bias"]).reshape(B, T, nh, d), params["A_log"][:, None])   # (B, T, nh, d)
    S0 = None if state is None else state["recurrent"]
    o, S = delta_rule(q, k, v, g.transpose(1, 2), beta.transpose(1, 2), S0, chunk_size)
    # The gated norm per head, gate z through a sigmoid.
    y = gated_rms_norm(o.transpose(1, 2), z.reshape(B, T, nh, d), params["o_norm"]["w"], eps, act="sigmoid",
                       round_norm=False)
    out = linear(y.reshape(B, T, nh * d), **params["o_proj"])        # (B, T, C)
    return out.to(dtype), rounded_tree({"conv": conv_state, "recurrent": S}, dtype)


# Equals Hugging Face's KimiLinearDeltaAttention.forward (its torch fallbacks, whose softplus
# returns g itself above 20, where log(1 + exp(g)) differs from g by under exp(-20));
# parity_tests/test_kimi_delta_attention.py checks it.
