"""Multi-head attention: project, split into heads, attend, merge the heads, project back.

    q, k, v = x @ Wq + bq,  kv @ Wk + bk,  kv @ Wv + bv        kv = x for self-attention
    head_i  = attention(q_i, k_i, v_i)                          q_i: columns i*hs .. (i+1)*hs
    out     = concat(head_1 .. head_nh) @ Wo + bo

Vaswani et al. (2017), section 3.2.2; the same computation as ``torch.nn.MultiheadAttention``
(which stores Wq, Wk, Wv stacked and transposed as ``in_proj_weight``). Masks, dropout and
``is_causal`` (True or "bottom_right") are those of numpy_attn/attention.py, handed to it as
given: ``attn_mask`` is True where a query may attend and broadcasts to (B, nh, T, S). Splitting
and merging the heads only move numbers around, so each is the other's backward. The backward
returns one gradient per input given: ``(dx, dparams)`` for self-attention and
``(dx, dparams, dkv)`` for cross-attention, followed by ``dattn_mask`` when the forward was given
``attn_mask_grad=True`` (a learned float mask, e.g. a position bias).

Grouped-query heads (Ainslie et al., 2023) come from the parameters' shapes: k and v projected to
nkv * hs columns make nkv key/value heads, each shared by nh / nkv query heads (as attention.py's).
For decoding, a ``kv_cache`` (one layer's view, numpy_attn/kv_cache.py's ``KVCache.layer(i)``)
stores the keys and values of past tokens, so that x holds only the new ones; the new queries are
then the last T of the S keys, so a causal caller passes ``is_causal="bottom_right"``. It is
inference only.

float16 and bfloat16: a composition, each step computing as its own module says: every
projection in float32, rounded once to x's dtype (numpy_attn/linear.py), and the attention in
float32, rounded once (numpy_attn/attention.py); so q, k, v and the merged heads are rounded to
the low dtype between the steps, as in PyTorch's own program of F.linear and
F.scaled_dot_product_attention (docs/precision.md).
"""

from typing import NamedTuple

import numpy as np

from numpy_attn._checks import check_dout, check_finite, check_float, check_ndim, check_no_past, check_same_dtype
from numpy_attn.attention import (
    scaled_dot_product_attention_backward,
    scaled_dot_product_attention_forward,
)
from numpy_attn.kv_cache import kv_cache_update
from numpy_attn.linear import linear_backward, linear_forward


def _check_heads(name, x, num_heads):
    """Raise ValueError unless the last axis of ``x`` splits into ``num_heads`` equal heads."""
    if num_heads < 1 or x.shape[-1] % num_heads:
        raise ValueError(f"C = {x.shape[-1]} of {name} {x.shape} is not divisible by "
                         f"num_heads = {num_heads}")


def split_heads(x, num_heads):
    """(B, T, C) -> (B, nh, T, hs): head i gets channels i*hs .. (i+1)*hs. Its backward is merge_heads."""
    check_ndim("x", x, 3)
    _check_heads("x", x, num_heads)
    B, T, C = x.shape
    x = x.reshape(B, T, num_heads, C // num_heads)               # (B, T, C) -> (B, T, nh, hs)
    return x.swapaxes(1, 2)                                       # (B, T, nh, hs) -> (B, nh, T, hs)


def merge_heads(x):
    """(B, nh, T, hs) -> (B, T, C), undoing split_heads. Its backward is split_heads."""
    check_ndim("x", x, 4)
    B, nh, T, hs = x.shape
    x = x.swapaxes(1, 2)                                          # (B, nh, T, hs) -> (B, T, nh, hs)
    return x.reshape(B, T, nh * hs)                               # (B, T, nh, hs) -> (B, T, C)


def init_multi_head_params(C, rng, bias=True, dtype=np.float32, kv_width=None):
    """Parameters {"q", "k", "v", "o"} -> {"w": (C, C), "b": (C,)} ("b" only with bias); k and v
    are (C, kv_width) and (kv_width,) with grouped-query heads, kv_width = nkv * hs (default C).

    Weights are drawn from U(-1/sqrt(C), 1/sqrt(C)) in float64 and rounded once to ``dtype``,
    the default of ``torch.nn.Linear``, so each output starts with a variance of about a third of
    its inputs'; biases start at zero, as in ``torch.nn.MultiheadAttention``.
    """
    if not isinstance(C, int | np.integer) or isinstance(C, bool):
        raise TypeError(f"C must be a positive integer (the model width), got {C!r}")
    if C < 1:
        raise ValueError(f"C must be a positive integer (the model width), got {C}")
    bound = 1 / np.sqrt(C)
    widths = {"q": C, "k": C if kv_width is None else kv_width, "v": C if kv_width is None else kv_width, "o": C}
    params = {}
    for name, out in widths.items():
        params[name] = {"w": rng.uniform(-bound, bound, size=(C, out)).astype(dtype)}   # (C_in, C_out)
        if bias:
            params[name]["b"] = np.zeros(out, dtype=dtype)                              # (C_out,)
    return params


class MultiHeadCache(NamedTuple):
    """The caches of the five steps; ``weights`` (B, nh, T, S) are the attention weights."""

    q: tuple                 # linear caches: each holds its input and weight
    k: tuple
    v: tuple
    attention: tuple         # the AttentionCache of the heads
    o: tuple
    num_heads: int
    cross: bool              # True when kv was given: the backward then returns dkv
    past: int                # keys read from a key/value cache (0 without one): no gradient reaches them

    @property
    def weights(self):
        """Attention weights (B, nh, T, S), after softmax and before dropout."""
        return self.attention.weights


def multi_head_attention_forward(x, params, num_heads, *, attn_mask=None, is_causal=False,
                                 dropout_p=0.0, rng=None, kv=None, attn_mask_grad=False,
                                 kv_cache=None):
    """Multi-head attention of x (B, T, C) over itself, or over kv (B, S, C) -> out (B, T, C).

    Returns ``(out, cache)``; ``cache.weights`` (B, nh, T, S) are the attention weights, the
    array the backward reads. ``out`` is a fresh array the cache does not hold. With a
    ``kv_cache`` (one layer's, KVCache.layer(i)) x holds only the T new tokens: their keys and
    values join the cached ones, S = past + T (pass ``is_causal="bottom_right"`` to be causal).
    """
    _check_multi_head(x, params, num_heads, kv)
    B, T, C = x.shape
    src = x if kv is None else kv                                 # (B, S, C), S = T for self-attention
    q, q_cache = linear_forward(x, **params["q"])                 # (B, T, C)
    k, k_cache = linear_forward(src, **params["k"])               # (B, S, C)
    v, v_cache = linear_forward(src, **params["v"])               # (B, S, C)
    for name, projected in {"q": q, "k": k, "v": v}.items():
        _check_weight_finite(name, params[name], projected)
    q = split_heads(q, num_heads)                                 # (B, T, C) -> (B, nh, T, hs)
    num_kv_heads = k.shape[-1] // (C // num_heads)   # fewer than num_heads: grouped-query heads
    k = split_heads(k, num_kv_heads)                              # (B, S, nkv*hs) -> (B, nkv, S, hs)
    v = split_heads(v, num_kv_heads)                              # (B, S, nkv*hs) -> (B, nkv, S, hs)
    past = 0 if kv_cache is None else kv_cache.length             # tokens already cached
    if kv_cache is not None:   # decoding: the past tokens' keys and values come from the cache
        k, v = kv_cache_update(kv_cache, k, v)                    # (B, nkv, T, hs) -> (B, nkv, past + T, hs)
    y, attention_cache = scaled_dot_product_attention_forward(
        q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p, rng=rng,
        attn_mask_grad=attn_mask_grad)                            # (B, nh, T, hs)
    y = merge_heads(y)                                            # (B, nh, T, hs) -> (B, T, C)
    out, o_cache = linear_forward(y, **params["o"])               # (B, T, C)
    _check_weight_finite("o", params["o"], out)
    cache = MultiHeadCache(q_cache, k_cache, v_cache, attention_cache, o_cache, num_heads, kv is not None, past)
    return out, cache


def multi_head_attention_backward(dout, cache):
    """Gradients: dout (B, T, C) -> (dx (B, T, C), dparams), dkv (B, S, C) after them for
    cross-attention, then dattn_mask (the mask's shape) if the forward had attn_mask_grad=True.
    dparams has the keys and nesting of params ("b" only with bias)."""
    B, nh, T, hs = cache.attention.q_scaled.shape
    check_dout("multi_head_attention", dout, (B, T, nh * hs), cache.weights.dtype)   # x's (q_scaled may be float32)
    # Undoes out = linear(y, o).
    dy, do = linear_backward(dout, cache.o)                       # (B, T, C)
    # Undoes y = merge_heads(y): split_heads is its backward.
    dy = split_heads(dy, cache.num_heads)                         # (B, T, C) -> (B, nh, T, hs)
    # Undoes the attention of the heads.
    dq, dk, dv, *dattn_mask = scaled_dot_product_attention_backward(dy, cache.attention)   # (B, nh, T|S, hs)
    check_no_past("multi_head_attention_backward", dk.shape[2], cache.past)   # cached past: inference only
    # Undoes q, k, v = split_heads(...): merge_heads is its backward.
    dq = merge_heads(dq)                                          # (B, nh, T, hs) -> (B, T, C)
    dk = merge_heads(dk)                                          # (B, nkv, S, hs) -> (B, S, nkv*hs)
    dv = merge_heads(dv)                                          # (B, nkv, S, hs) -> (B, S, nkv*hs)
    # Undoes the three projections; src fed both k and v, so its gradient is their sum.
    dx, dq_params = linear_backward(dq, cache.q)                  # (B, T, C)
    dsrc_k, dk_params = linear_backward(dk, cache.k)              # (B, S, C)
    dsrc_v, dv_params = linear_backward(dv, cache.v)              # (B, S, C)
    dsrc = dsrc_k + dsrc_v
    dparams = {"q": dq_params, "k": dk_params, "v": dv_params, "o": do}
    if cache.cross:
        return dx, dparams, dsrc, *dattn_mask
    # Undoes src = x: for self-attention x fed all three projections.
    dx = dx + dsrc
    return dx, dparams, *dattn_mask


def _check_multi_head(x, params, num_heads, kv):
    """Raise TypeError/ValueError naming the argument at fault: x (B, T, C), kv (B, S, C) or None,
    params {"q", "k", "v", "o"} -> {"w": (C, C), "b": (C,) optional}, all of x's dtype, x and kv
    finite (k and v (C, nkv * hs) and (nkv * hs,) with nkv key/value heads dividing num_heads);
    the weights' values are checked by _check_weight_finite, as each is used.

    Checked here, on the caller's arguments, so that no error names an intermediate (the
    projected q, k, v) that the caller never saw.
    """
    check_float("x", x)
    check_ndim("x", x, 3)
    _check_heads("x", x, num_heads)
    B, T, C = x.shape
    arrays = {"x": x}
    if kv is not None:
        check_float("kv", kv)
        if kv.ndim != 3 or kv.shape[0] != B or kv.shape[2] != C:
            raise ValueError(f"kv must have shape (B, S, C) = ({B}, S, {C}) to match x {x.shape}, "
                             f"got {kv.shape}")
        arrays["kv"] = kv
    if not isinstance(params, dict) or sorted(params) != ["k", "o", "q", "v"]:
        got = sorted(params) if isinstance(params, dict) else type(params).__name__
        raise TypeError(f'params must be a dict with keys "q", "k", "v", "o", got {got}')
    kv_width = _kv_width(params, C, num_heads)      # nkv * hs: C unless grouped-query heads
    for name, p in params.items():
        width = kv_width if name in ("k", "v") else C
        expected = {"w": (C, width), "b": (width,)}
        if not isinstance(p, dict) or "w" not in p or set(p) - set(expected):
            raise TypeError(f'params["{name}"] must be a dict {{"w": {expected["w"]}, "b": '
                            f'{expected["b"]} optional}}, got {sorted(p) if isinstance(p, dict) else type(p).__name__}')
        for key, a in p.items():
            label = f'params["{name}"]["{key}"]'
            check_float(label, a)
            if a.shape != expected[key]:
                raise ValueError(f"{label} must have shape {expected[key]} for C = {C} of x {x.shape}, "
                                 f"got {a.shape}")
            arrays[label] = a
    check_same_dtype(**arrays)
    for name in ("x", "kv"):
        if name in arrays:
            check_finite(name, arrays[name])


def _check_weight_finite(name, p, projected):
    """Raise ValueError naming params[name]["w"] or ["b"] if it holds NaN or inf. With a finite
    input (x and kv are checked first), a NaN or inf term makes a sum NaN or inf, so such a weight makes
    ``projected`` (input @ w + b) non-finite: the weights are read only when it is, or when it is
    the larger array. Decoding one token, it is 1/C of the weight (GPT-2 124M, one thread: 38.3 ms
    a token against 40.9 when every weight was read each call)."""
    if projected.size < p["w"].size and np.isfinite(projected).all():
        return
    for key, a in p.items():
        check_finite(f'params["{name}"]["{key}"]', a)


def _kv_width(params, C, num_heads):
    """The width of the k and v projections, nkv * hs; raise ValueError unless nkv divides nh."""
    w = params["k"].get("w") if isinstance(params.get("k"), dict) else None
    width = w.shape[-1] if isinstance(w, np.ndarray) and w.ndim == 2 else C
    hs = C // num_heads
    if width % hs or num_heads % (width // hs or 1) or width == 0:
        raise ValueError(f'params["k"]["w"] of shape {w.shape} must be (C, nkv * hs) with hs = {hs} '
                         f"and nkv dividing num_heads = {num_heads} (C = {C})")
    return width
