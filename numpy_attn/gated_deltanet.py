"""Gated DeltaNet, the linear-attention sublayer of Qwen3.5 (and Qwen3-Next), and its backward:
the operations before it put together.

    qkv     = causal_conv1d(x @ in_proj_qkv, conv1d, silu)       K taps, no bias, per channel
    q, k, v = split(qkv)                                          nk, nk, nv heads of dk, dk, dv
    q, k    = l2_norm(repeat(q)), l2_norm(repeat(k))              each key head serves nv / nk value heads
    beta    = beta_scale * sigmoid(x @ in_proj_b)                 (B, T, nv), the learning rate
    g       = -exp(A_log) * softplus(x @ in_proj_a + dt_bias)     (B, T, nv), the log-decay, <= 0
    o, S    = delta_rule(q, k, v, g, beta, S)                     chunked (prefill) or one step (decoding)
    out     = gated_rms_norm(o, x @ in_proj_z, norm, silu) @ out_proj   per value head of width dv

Yang, Kautz and Hatamizadeh, "Gated Delta Networks" (2024); Qwen Team, Qwen3-Next and Qwen3.5
(2025): three of every four layers are this sublayer instead of attention. The parameters are
named as Hugging Face's ``Qwen3_5GatedDeltaNet`` names them, each linear's weight stored (C_in,
C_out) as linear.py stores it, the convolution's (conv_dim, K) as causal_conv1d.py does, and
``norm`` the gated norm's weight (dv,). ``beta_scale`` (1 here; OLMo Hybrid's 2) widens beta's
range to (0, beta_scale): above 1 a step may flip the sign of what the state holds along k_t (an
eigenvalue 1 - beta_t of I - beta_t k_t k_t^T below 0).

Grouped heads: nv is a multiple of nk, and key head i serves the value heads i * r .. i * r + r - 1
(r = nv / nk, ``np.repeat``, as torch's repeat_interleave); its gradient is the sum over them.

The state, for decoding: {"conv": (B, conv_dim, K-1), the last K-1 inputs of the convolution;
"recurrent": (B, nv, dk, dv), the delta rule's state, rows the key channels}. With a state and one
token the step is the recurrence (gated_delta_rule.py), otherwise the chunked form
(chunked_delta_rule.py); both compute the same thing. ``mask`` (B, T) bool zeroes the input at
padding (False), as Hugging Face does before the projections.

softplus(a) = log(1 + exp(a)) is written here (no other operation uses it), computed as
logaddexp(0, a) so that a large a cannot overflow; its derivative is sigmoid(a).

float16 and bfloat16 compute in float32 throughout, from float32 copies of x, the parameters and the
state, and round the output, the state handed on and each gradient once (transformers keeps the
delta rule, the decay and the norms in float32 too).
"""

from typing import NamedTuple

import numpy as np

from numpy_attn._checks import check_dout, check_float, check_ndim, check_same_dtype, upcast
from numpy_attn._tree import tree_map
from numpy_attn.causal_conv1d import causal_conv1d_backward, causal_conv1d_forward
from numpy_attn.chunked_delta_rule import chunked_delta_rule_backward, chunked_delta_rule_forward
from numpy_attn.gated_delta_rule import gated_delta_rule_backward, gated_delta_rule_forward
from numpy_attn.gated_rms_norm import gated_rms_norm_backward, gated_rms_norm_forward
from numpy_attn.l2_norm import l2_norm_backward, l2_norm_forward
from numpy_attn.linear import linear_backward, linear_forward
from numpy_attn.swiglu import sigmoid

LINEARS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")


class GatedDeltaNetCache(NamedTuple):
    """Each operation's cache, beta and the decay's pieces (their backwards are written here), the
    sizes and the mask; Kimi Delta Attention's cache too, its sizes (nh, d)."""

    linears: dict              # name -> linear's cache
    conv: tuple
    q_norm: tuple
    k_norm: tuple
    delta: tuple
    recurrent: bool            # the one-step recurrence ran (else the chunked form)
    norm: tuple
    beta: np.ndarray           # (B, T, nv)
    decay: tuple               # log_decay_forward's cache
    sizes: tuple               # (nk, nv, dk, dv)
    mask: object               # (B, T) bool or None
    dtype: np.dtype            # x's (float16 and bfloat16 compute in float32)
    beta_scale: float = 1.0    # beta = beta_scale * sigmoid(b)


def gated_deltanet_forward(x, params, num_k_heads, num_v_heads, head_k_dim, head_v_dim, eps=1e-6,
                           state=None, mask=None, chunk_size=64, beta_scale=1.0):
    """x (B, T, C) through the sublayer with ``params`` (the dict named as Hugging Face's module),
    nk = num_k_heads, nv = num_v_heads key and value heads of widths dk, dv, the gated norm's eps,
    the state of the text before x (None: its start), mask (B, T) bool or None, ``beta_scale`` a
    positive number multiplying the learning rate beta.

    Returns ``(out (B, T, C), new_state, cache)``, new_state {"conv", "recurrent"} for the next call.
    """
    _check_gated_deltanet(x, params, num_k_heads, num_v_heads, head_k_dim, head_v_dim, state, mask)
    if isinstance(beta_scale, bool) or not isinstance(beta_scale, int | float) or not 0 < beta_scale < np.inf:
        raise ValueError(f"gated_deltanet: beta_scale must be a positive finite number, got {beta_scale!r}")
    nk, nv, dk, dv = num_k_heads, num_v_heads, head_k_dim, head_v_dim
    B, T, C = x.shape
    dtype = x.dtype
    x, params, state = opmath_sublayer_inputs(x, params, state)      # float32 for float16 and bfloat16
    if mask is not None:
        x = x * mask[:, :, None]                                     # padding read as zeros
    lin = {}
    qkv, lin["in_proj_qkv"] = linear_forward(x, **params["in_proj_qkv"])   # (B, T, 2 nk dk + nv dv)
    z, lin["in_proj_z"] = linear_forward(x, **params["in_proj_z"])         # (B, T, nv dv)
    b, lin["in_proj_b"] = linear_forward(x, **params["in_proj_b"])         # (B, T, nv)
    a, lin["in_proj_a"] = linear_forward(x, **params["in_proj_a"])         # (B, T, nv)
    conv_state = None if state is None else state["conv"]
    qkv, conv_state, conv_cache = causal_conv1d_forward(qkv, params["conv1d"]["w"], None, conv_state, "silu")
    q, k, v = np.split(qkv, [nk * dk, 2 * nk * dk], axis=-1)
    # Heads first; each key head repeated for the r value heads it serves.
    q = np.repeat(q.reshape(B, T, nk, dk), nv // nk, axis=2).swapaxes(1, 2)   # (B, nv, T, dk)
    k = np.repeat(k.reshape(B, T, nk, dk), nv // nk, axis=2).swapaxes(1, 2)   # (B, nv, T, dk)
    v = v.reshape(B, T, nv, dv).swapaxes(1, 2)                                # (B, nv, T, dv)
    q, q_norm_cache = l2_norm_forward(q)                              # eps 1e-6, fixed in the models
    k, k_norm_cache = l2_norm_forward(k)
    beta = sigmoid(b)                                                 # (B, T, nv), before the scale
    g, decay_cache = log_decay_forward(a + params["dt_bias"], params["A_log"])   # (B, T, nv), <= 0
    S0 = None if state is None else state["recurrent"]
    o, S, delta_cache, recurrent = delta_rule_forward(q, k, v, g.swapaxes(1, 2), (beta_scale * beta).swapaxes(1, 2), S0,
                                                      chunk_size)
    # The gated norm per value head, gate z.
    y, norm_cache = gated_rms_norm_forward(o.swapaxes(1, 2), z.reshape(B, T, nv, dv), params["norm"]["w"], eps)
    out, lin["out_proj"] = linear_forward(y.reshape(B, T, nv * dv), **params["out_proj"])   # (B, T, C)
    cache = GatedDeltaNetCache(lin, conv_cache, q_norm_cache, k_norm_cache, delta_cache, recurrent,
                               norm_cache, beta, decay_cache, (nk, nv, dk, dv), mask, dtype, beta_scale)
    return out.astype(dtype, copy=False), rounded_tree({"conv": conv_state, "recurrent": S}, dtype), cache


def gated_deltanet_backward(dout, cache):
    """Gradients: dout (B, T, C) -> (dx (B, T, C), dparams shaped as params). The state handed on
    is for decoding: no gradient flows into it, nor (here) into a state given."""
    c = cache
    nk, nv, dk, dv = c.sizes
    B, T, _ = c.beta.shape
    check_dout("gated_deltanet", dout, (B, T, c.linears["out_proj"].w.shape[1]), c.dtype)
    dout = upcast(dout)
    grads = {}
    dy, grads["out_proj"] = linear_backward(dout, c.linears["out_proj"])
    do, dz, grads["norm"] = gated_rms_norm_backward(dy.reshape(B, T, nv, dv), c.norm)
    d = delta_rule_backward(do.swapaxes(1, 2), c.delta, c.recurrent)
    dg, dbeta = d["g"].swapaxes(1, 2), d["beta"].swapaxes(1, 2)     # (B, T, nv)
    dpre, grads["A_log"] = log_decay_backward(dg, c.decay)
    grads["dt_bias"] = dpre.sum(axis=(0, 1))
    db = dbeta * c.beta_scale * c.beta * (1 - c.beta)                 # sigmoid' = s (1 - s), s = c.beta
    # Undoes the norms and the repeat: a key head's gradient sums its r value heads.
    dq = l2_norm_backward(d["q"], c.q_norm).swapaxes(1, 2).reshape(B, T, nk, nv // nk, dk).sum(3)
    dk_ = l2_norm_backward(d["k"], c.k_norm).swapaxes(1, 2).reshape(B, T, nk, nv // nk, dk).sum(3)
    dqkv = np.concatenate([dq.reshape(B, T, -1), dk_.reshape(B, T, -1),
                           d["v"].swapaxes(1, 2).reshape(B, T, -1)], axis=-1)
    dqkv, dconv, _ = causal_conv1d_backward(dqkv, c.conv)
    grads["conv1d"] = {"w": dconv["w"]}
    dx = 0
    for name, dproj in (("in_proj_qkv", dqkv), ("in_proj_z", dz.reshape(B, T, nv * dv)),
                        ("in_proj_b", db), ("in_proj_a", dpre)):
        dxi, grads[name] = linear_backward(dproj, c.linears[name])
        dx = dx + dxi
    if c.mask is not None:
        dx = dx * c.mask[:, :, None]                                  # padding was read as zeros
    order = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "conv1d", "dt_bias", "A_log", "norm", "out_proj")
    return dx.astype(c.dtype, copy=False), rounded_tree({name: grads[name] for name in order}, c.dtype)   # rounded once


# -- steps Kimi Delta Attention shares (numpy_attn/kimi_delta_attention.py) ------------------------

def opmath_sublayer_inputs(x, params, state):
    """x, params and state (None or {"conv", "recurrent"}) as the sublayer computes with them:
    float32 copies of float16 and bfloat16, the arrays themselves otherwise."""
    return upcast(x), tree_map(upcast, params), None if state is None else tree_map(upcast, state)


def rounded_tree(tree, dtype):
    """Every array of ``tree`` in ``dtype`` (itself where it is already)."""
    return tree_map(lambda a: a.astype(dtype, copy=False), tree)


def log_decay_forward(pre, A_log):
    """The log-decay g = -exp(A_log) * softplus(pre) (<= 0): pre (..., *A_log.shape), A_log one
    rate per head (broadcast from the right: (nv,) against (B, T, nv), or (nh, 1) against
    (B, T, nh, dk) for one g per key channel). Returns ``(g, cache)``."""
    sp = np.logaddexp(0, pre)                                         # softplus, no overflow
    A = np.exp(A_log)
    return -A * sp, (pre, sp, A)


def log_decay_backward(dg, cache):
    """Undoes log_decay_forward: dg like g -> (dpre, dA_log shaped as A_log)."""
    pre, sp, A = cache
    # dg/dA_log = g itself; the rate's gradient sums the positions (and the channels it broadcast over).
    dA = dg * -A * sp
    dA = dA.sum(axis=tuple(range(dA.ndim - A.ndim)))
    dA = dA.sum(axis=tuple(i for i, n in enumerate(A.shape) if n == 1), keepdims=True)
    return dg * -A * sigmoid(pre), dA                                 # softplus' = sigmoid


def delta_rule_forward(q, k, v, g, beta, S0, chunk_size):
    """The delta rule (head-first, g (B, nh, T) or (B, nh, T, dk)) from the state S0 (None: zeros):
    one step of the recurrence when decoding (a state and T = 1), the chunked form otherwise.
    Returns ``(o, S, cache, recurrent)``."""
    recurrent = S0 is not None and q.shape[2] == 1
    if recurrent:
        return (*gated_delta_rule_forward(q, k, v, g, beta, initial_state=S0), True)
    return (*chunked_delta_rule_forward(q, k, v, g, beta, initial_state=S0, chunk_size=chunk_size), False)


def delta_rule_backward(do, cache, recurrent):
    """Undoes delta_rule_forward (no gradient from the state handed on): a dict dq, dk, dv, dg, dbeta."""
    return (gated_delta_rule_backward if recurrent else chunked_delta_rule_backward)(do, None, cache)


def _check_gated_deltanet(x, params, nk, nv, dk, dv, state, mask):
    """Raise on an x that is not a (B, T, C) float array, head counts that do not group, a
    parameter or state of the wrong shape, or a mask that is not (B, T) bool."""
    check_float("x", x)
    check_ndim("x", x, 3)
    for name, value in (("num_k_heads", nk), ("num_v_heads", nv), ("head_k_dim", dk), ("head_v_dim", dv)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise ValueError(f"gated_deltanet: {name} must be a positive integer, got {value!r}")
    if nv % nk:
        raise ValueError(f"gated_deltanet: num_v_heads ({nv}) must be a multiple of num_k_heads ({nk})")
    B, T, C = x.shape
    conv_dim = 2 * nk * dk + nv * dv
    if not isinstance(params, dict) or "conv1d" not in params:
        raise TypeError("gated_deltanet: params must be a dict with conv1d, dt_bias, A_log, norm and the linears")
    K = np.shape(params["conv1d"].get("w"))[-1] if np.ndim(params["conv1d"].get("w")) == 2 else 0
    shapes = {"in_proj_qkv.w": (C, conv_dim), "in_proj_z.w": (C, nv * dv), "in_proj_b.w": (C, nv),
              "in_proj_a.w": (C, nv), "conv1d.w": (conv_dim, K if K else 1), "dt_bias": (nv,), "A_log": (nv,),
              "norm.w": (dv,), "out_proj.w": (nv * dv, C)}
    check_sublayer_inputs("gated_deltanet", x, params, shapes, LINEARS, state,
                          {"conv": (B, conv_dim, K - 1), "recurrent": (B, nv, dk, dv)}, mask)


def check_sublayer_inputs(op, x, params, shapes, linears, state, state_shapes, mask):
    """Raise, naming ``op`` and the value, on a parameter missing, of another shape than ``shapes``
    ({dotted path: shape}) or of another dtype than x, a linear with more than a weight, a state
    that is not {"conv", "recurrent"} of ``state_shapes``, or a mask that is not (B, T) bool."""
    B, T = x.shape[:2]
    for path, shape in shapes.items():
        node = params
        for key in path.split("."):
            if not isinstance(node, dict) or key not in node:
                raise ValueError(f"{op}: params lacks {path}")
            node = node[key]
        if np.shape(node) != shape:
            raise ValueError(f"{op}: params {path} must be {shape}, got {np.shape(node)}")
        check_same_dtype(x=x, **{path.replace(".", "_"): node})
    for name in linears:
        if set(params[name]) != {"w"}:
            raise ValueError(f"{op}: params {name} takes a weight w only, got {sorted(params[name])}")
    if state is not None:
        if not isinstance(state, dict) or set(state) != set(state_shapes):
            raise ValueError(f"{op}: state must be a dict with conv and recurrent, got {state!r:.80}")
        for key, shape in state_shapes.items():
            if np.shape(state[key]) != shape:
                raise ValueError(f"{op}: state {key} must be {shape}, got {np.shape(state[key])}")
    if mask is not None and (not isinstance(mask, np.ndarray) or mask.dtype != np.bool_ or mask.shape != (B, T)):
        raise ValueError(f"{op}: mask must be a bool array (B, T) = {(B, T)}, got "
                         f"{getattr(mask, 'dtype', type(mask).__name__)} {np.shape(mask)}")
