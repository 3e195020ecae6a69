"""Affine map ``x @ w + b`` with the weight stored (C_in, C_out), and its backward.

    out = x @ w + b,   dx = dout @ w.T,   dw = x^T dout,   db = sum of dout over all rows

Storing w as (C_in, C_out) keeps transposes out of the forward; ``torch.nn.Linear`` stores the
transpose (C_out, C_in), so the built-in to match is ``F.linear(x, w.T, b)``. Any number of
leading dimensions is allowed: they are flattened into rows for dw and db.

float16 and bfloat16: the products, their sums and the bias are computed in float32 and rounded
once to x's dtype, forward and backward, as PyTorch's CPU matmul accumulates in float32
(docs/precision.md); PyTorch's ``x @ w`` then ``+ b`` rounds twice, ours once.
"""

from typing import NamedTuple

from numpy_attn._checks import check_dout, check_float, check_ndim, check_same_dtype, upcast


class LinearCache(NamedTuple):
    # The inputs by reference in their own dtype (PyTorch saves the low-dtype tensors too: an
    # activation-sized float32 copy would double the memory of a float16 x); the backward casts up.
    x: object               # (..., C_in) the input, for dw
    w: object               # (C_in, C_out) the weight, for dx
    has_bias: bool          # whether a b was added (the gradients then have a "b")


def linear_forward(x, w, b=None):
    """Apply ``x @ w + b``: x (..., C_in), w (C_in, C_out), b (C_out,) or None -> (..., C_out).

    Returns ``(out, cache)``; the cache is a LinearCache ``(x, w, has_bias)``: dw needs x, dx needs w.
    """
    _check_linear(x, w, b)
    C_in, C_out = w.shape
    xf, wf, bf = upcast(x), upcast(w), upcast(b)   # float32 for float16 and bfloat16
    out = xf @ wf                                  # (..., C_in) -> (..., C_out)
    if b is not None:
        out = out + bf                             # (..., C_out)
    cache = LinearCache(x, w, b is not None)
    return out.astype(x.dtype, copy=False), cache  # rounded once to x's dtype


def linear_backward(dout, cache):
    """Gradients of ``x @ w + b``: dout (..., C_out) -> (dx (..., C_in), {"w": dw, "b": db}).

    Without a bias the dict has no "b" key, so it has exactly the keys of the parameters used.
    """
    x, w, has_bias = cache
    C_in, C_out = w.shape
    check_dout("linear_backward", dout, x.shape[:-1] + (C_out,), x.dtype)
    doutf, xf, wf = upcast(dout), upcast(x), upcast(w)                  # float32 for the low dtypes
    # Undoes out = out + b: every row added the same b.
    db = doutf.reshape(-1, C_out).sum(axis=0) if has_bias else None     # (C_out,)
    # Undoes out = x @ w.
    dx = doutf @ wf.T                                                    # (..., C_out) -> (..., C_in)
    dw = xf.reshape(-1, C_in).T @ doutf.reshape(-1, C_out)               # (C_in, C_out)
    # Each gradient rounded once to its input's dtype (one dtype for all three).
    dx, dw = dx.astype(x.dtype, copy=False), dw.astype(x.dtype, copy=False)
    grads = {"w": dw} if db is None else {"w": dw, "b": db.astype(x.dtype, copy=False)}
    return dx, grads


def _check_linear(x, w, b):
    """Raise unless x (..., C_in), w (C_in, C_out) and b (C_out,) or None are float arrays of one
    dtype."""
    check_float("x", x)
    check_float("w", w)
    check_ndim("w", w, 2)
    C_in, C_out = w.shape
    if x.ndim < 1 or x.shape[-1] != C_in:
        raise ValueError(f"x of shape {x.shape} does not end in C_in = {C_in} of w {w.shape}")
    if b is not None:
        check_float("b", b)
        if b.shape != (C_out,):
            raise ValueError(f"b must have shape ({C_out},) to match w {w.shape}, got {b.shape}")
    check_same_dtype(x=x, w=w, b=b)
