"""Kimi Delta Attention (KDA), the linear-attention sublayer of Kimi Linear, and its backward: Gated
DeltaNet with one decay per key channel instead of one per head.

    q, k, v = causal_conv1d([x @ q_proj | x @ k_proj | x @ v_proj], conv1d, silu)   nh heads of d each
    q, k    = l2_norm(q), l2_norm(k)
    g       = -exp(A_log) * softplus(x @ f_a_proj @ f_b_proj + dt_bias)      (B, T, nh, d): per channel, <= 0
    beta    = sigmoid(x @ b_proj)                                            (B, T, nh)
    o, S    = delta_rule(q, k, v, g, beta, S)                                chunked, or one step when decoding
    out     = gated_rms_norm(o, x @ g_a_proj @ g_b_proj, o_norm, sigmoid) @ o_proj   per head of width d

Kimi Team, "Kimi Linear: An Expressive, Efficient Attention Architecture" (2025), in the form of
Hugging Face's ``KimiLinearDeltaAttention``: the decay Diag(alpha_t) of the delta rule's state has
one rate per key channel, alpha_t = exp(g_t); g comes through a low-rank path (C -> d -> nh d, the
"forget gate"), and so does the output gate (``g_a_proj``, ``g_b_proj``). Keys and values have the
same nh heads of width d (no grouping). Parameters are named as Hugging Face's module names them
(the forget gate's four flattened: ``f_a_proj``, ``f_b_proj``, ``dt_bias`` (nh d,), ``A_log``
(nh,)), each linear's weight stored (C_in, C_out), the convolution's (3 nh d, K), ``o_norm`` the
gated norm's weight (d,). The gated norm keeps the normed value in the compute dtype before the
gate (gated_rms_norm's ``round_norm=False``, as Hugging Face's).

What it shares with Gated DeltaNet is taken from numpy_attn/gated_deltanet.py: the log-decay
(``log_decay_forward``, A_log broadcast over a head's channels) and the choice of the delta rule
(``delta_rule_forward``: the recurrence for one decoded token, the chunked form otherwise).

The state, for decoding: {"conv": (B, 3 nh d, K-1), the convolution's last inputs; "recurrent":
(B, nh, d, d), the delta rule's state, rows the key channels}: its size does not grow with the
text. ``mask`` (B, T) bool zeroes the input at padding (False), as Hugging Face does.

float16 and bfloat16 compute in float32 throughout and round the output, the state handed on and each
gradient once, as gated_deltanet.py does.
"""

import numpy as np

from numpy_attn._checks import check_dout, check_float, check_ndim, upcast
from numpy_attn.causal_conv1d import causal_conv1d_backward, causal_conv1d_forward
from numpy_attn.gated_deltanet import (
    GatedDeltaNetCache,
    check_sublayer_inputs,
    delta_rule_backward,
    delta_rule_forward,
    log_decay_backward,
    log_decay_forward,
    opmath_sublayer_inputs,
    rounded_tree,
)
from numpy_attn.gated_rms_norm import gated_rms_norm_backward, gated_rms_norm_forward
from numpy_attn.l2_norm import l2_norm_backward, l2_norm_forward
from numpy_attn.linear import linear_backward, linear_forward
from numpy_attn.swiglu import sigmoid

LINEARS = ("q_proj", "k_proj", "v_proj", "f_a_proj", "f_b_proj", "b_proj", "g_a_proj", "g_b_proj", "o_proj")


def kimi_delta_attention_forward(x, params, num_heads, head_dim, eps=1e-6, state=None, mask=None, chunk_size=64):
    """x (B, T, C) through the sublayer with ``params`` (named as Hugging Face's module), nh =
    num_heads heads of width d = head_dim, the gated norm's eps, the state of the text before x
    (None: its start), mask (B, T) bool or None.

    Returns ``(out (B, T, C), new_state, cache)``, new_state {"conv", "recurrent"} for the next call.
    """
    _check_kimi_delta_attention(x, params, num_heads, head_dim, state, mask)
    nh, d = num_heads, head_dim
    B, T, C = x.shape
    dtype = x.dtype
    x, params, state = opmath_sublayer_inputs(x, params, state)      # float32 for float16 and bfloat16
    if mask is not None:
        x = x * mask[:, :, None]                                     # padding read as zeros
    lin, proj = {}, {}
    for name in ("q_proj", "k_proj", "v_proj", "b_proj", "f_a_proj", "g_a_proj"):
        proj[name], lin[name] = linear_forward(x, **params[name])   # (B, T, nh d), (B, T, nh), (B, T, d)
    f, lin["f_b_proj"] = linear_forward(proj["f_a_proj"], **params["f_b_proj"])   # (B, T, d) -> (B, T, nh d)
    z, lin["g_b_proj"] = linear_forward(proj["g_a_proj"], **params["g_b_proj"])   # (B, T, d) -> (B, T, nh d)
    qkv = np.concatenate([proj["q_proj"], proj["k_proj"], proj["v_proj"]], axis=-1)   # (B, T, 3 nh d)
    conv_state = None if state is None else state["conv"]
    qkv, conv_state, conv_cache = causal_conv1d_forward(qkv, params["conv1d"]["w"], None, conv_state, "silu")
    q, k, v = (t.reshape(B, T, nh, d).swapaxes(1, 2) for t in np.split(qkv, 3, axis=-1))   # (B, nh, T, d)
    q, q_norm_cache = l2_norm_forward(q)                              # eps 1e-6, fixed in the model
    k, k_norm_cache = l2_norm_forward(k)
    beta = sigmoid(proj["b_proj"])                                    # (B, T, nh)
    g, decay_cache = log_decay_forward((f + params["dt_bias"]).reshape(B, T, nh, d),
                                       params["A_log"][:, None])      # (B, T, nh, d): a rate per head
    S0 = None if state is None else state["recurrent"]
    o, S, delta_cache, recurrent = delta_rule_forward(q, k, v, g.swapaxes(1, 2), beta.swapaxes(1, 2), S0, chunk_size)
    # The gated norm per head, gate z through a sigmoid.
    y, norm_cache = gated_rms_norm_forward(o.swapaxes(1, 2), z.reshape(B, T, nh, d), params["o_norm"]["w"], eps,
                                           act="sigmoid", round_norm=False)
    out, lin["o_proj"] = linear_forward(y.reshape(B, T, nh * d), **params["o_proj"])   # (B, T, C)
    cache = GatedDeltaNetCache(lin, conv_cache, q_norm_cache, k_norm_cache, delta_cache, recurrent, norm_cache, beta,
                               decay_cache, (nh, d), mask, dtype)   # Gated DeltaNet's fields, beta (B, T, nh)
    return out.astype(dtype, copy=False), rounded_tree({"conv": conv_state, "recurrent": S}, dtype), cache


def kimi_delta_attention_backward(dout, cache):
    """Gradients: dout (B, T, C) -> (dx (B, T, C), dparams shaped as params). The state handed on
    is for decoding: no gradient flows into it, nor into a state given."""
    c = cache
    nh, d = c.sizes
    B, T, _ = c.beta.shape
    check_dout("kimi_delta_attention", dout, (B, T, c.linears["o_proj"].w.shape[1]), c.dtype)
    dout = upcast(dout)
    grads, dproj = {}, {}
    dy, grads["o_proj"] = linear_backward(dout, c.linears["o_proj"])
    do, dz, grads["o_norm"] = gated_rms_norm_backward(dy.reshape(B, T, nh, d), c.norm)
    dd = delta_rule_backward(do.swapaxes(1, 2), c.delta, c.recurrent)
    df, grads["A_log"] = log_decay_backward(dd["g"].swapaxes(1, 2), c.decay)   # (B, T, nh, d), (nh, 1)
    grads["A_log"] = grads["A_log"][:, 0]
    df = df.reshape(B, T, nh * d)
    grads["dt_bias"] = df.sum(axis=(0, 1))
    dproj["b_proj"] = dd["beta"].swapaxes(1, 2) * c.beta * (1 - c.beta)   # sigmoid' = beta (1 - beta)
    dq = l2_norm_backward(dd["q"], c.q_norm)
    dk = l2_norm_backward(dd["k"], c.k_norm)
    dqkv = np.concatenate([t.swapaxes(1, 2).reshape(B, T, nh * d) for t in (dq, dk, dd["v"])], axis=-1)
    dqkv, dconv, _ = causal_conv1d_backward(dqkv, c.conv)
    grads["conv1d"] = {"w": dconv["w"]}
    dproj["q_proj"], dproj["k_proj"], dproj["v_proj"] = np.split(dqkv, 3, axis=-1)
    dproj["f_a_proj"], grads["f_b_proj"] = linear_backward(df, c.linears["f_b_proj"])
    dproj["g_a_proj"], grads["g_b_proj"] = linear_backward(dz.reshape(B, T, nh * d), c.linears["g_b_proj"])
    dx = 0
    for name in ("q_proj", "k_proj", "v_proj", "b_proj", "f_a_proj", "g_a_proj"):
        dxi, grads[name] = linear_backward(dproj[name], c.linears[name])
        dx = dx + dxi
    if c.mask is not None:
        dx = dx * c.mask[:, :, None]                                  # padding was read as zeros
    order = ("q_proj", "k_proj", "v_proj", "conv1d", "f_a_proj", "f_b_proj", "dt_bias", "A_log", "b_proj",
             "g_a_proj", "g_b_proj", "o_norm", "o_proj")
    return dx.astype(c.dtype, copy=False), rounded_tree({name: grads[name] for name in order}, c.dtype)   # rounded once


def kimi_delta_attention_param_shapes(C, num_heads, head_dim, conv_kernel):
    """{path: shape} of the sublayer's parameters for width C."""
    nh, d = num_heads, head_dim
    return {"q_proj.w": (C, nh * d), "k_proj.w": (C, nh * d), "v_proj.w": (C, nh * d),
            "conv1d.w": (3 * nh * d, conv_kernel), "f_a_proj.w": (C, d), "f_b_proj.w": (d, nh * d),
            "dt_bias": (nh * d,), "A_log": (nh,), "b_proj.w": (C, nh), "g_a_proj.w": (C, d),
            "g_b_proj.w": (d, nh * d), "o_norm.w": (d,), "o_proj.w": (nh * d, C)}


def _check_kimi_delta_attention(x, params, nh, d, state, mask):
    """Raise on an x that is not a (B, T, C) float array, sizes that are not positive integers,
    a parameter or state of the wrong shape, or a mask that is not (B, T) bool."""
    check_float("x", x)
    check_ndim("x", x, 3)
    for name, value in (("num_heads", nh), ("head_dim", d)):
        if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < 1:
            raise ValueError(f"kimi_delta_attention: {name} must be a positive integer, got {value!r}")
    B, T, C = x.shape
    if not isinstance(params, dict) or not isinstance(params.get("conv1d"), dict):
        raise TypeError("kimi_delta_attention: params must be a dict with conv1d, dt_bias, A_log, o_norm and the "
                        "linears")
    w = params["conv1d"].get("w")
    K = np.shape(w)[-1] if np.ndim(w) == 2 else 1
    check_sublayer_inputs("kimi_delta_attention", x, params, kimi_delta_attention_param_shapes(C, nh, d, K),
                          LINEARS, state, {"conv": (B, 3 * nh * d, K - 1), "recurrent": (B, nh, d, d)}, mask)
