"""Affine map ``x @ w + b`` in plain PyTorch, the weight stored (C_in, C_out).

Twin of numpy_attn/linear.py. ``torch.nn.Linear`` stores the transpose, hence ``F.linear(x, w.T, b)``.
"""


def linear(x, w, b=None):
    """Apply ``x @ w + b``: x (..., C_in), w (C_in, C_out), b (C_out,) or None -> (..., C_out)."""
    out = x @ w                                    # (..., C_in) -> (..., C_out)
    if b is not None:
        out = out + b                              # (..., C_out)
    return out


# Equals torch.nn.functional.linear(x, w.T, b).
