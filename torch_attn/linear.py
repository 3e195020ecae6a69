"""Affine map ``x @ w + b`` in plain PyTorch, the weight stored (C_in, C_out).

Twin of numpy_attn/linear.py. ``torch.nn.Linear`` stores the transpose, hence ``F.linear(x, w.T, b)``.
"""

from torch_attn._opmath import upcast


def linear(x, w, b=None):
    """Apply ``x @ w + b``: x (..., C_in), w (C_in, C_out), b (C_out,) or None -> (..., C_out)."""
    xf, wf, bf = upcast(x), upcast(w), upcast(b)   # float32 for float16 and bfloat16
    out = xf @ wf                                  # (..., C_in) -> (..., C_out)
    if b is not None:
        out = out + bf                             # (..., C_out)
    return out.to(x.dtype)                         # rounded once to x's dtype


# Equals torch.nn.functional.linear(x, w.T, b).
