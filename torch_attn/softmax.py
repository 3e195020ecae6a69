"""Softmax and log-softmax along one axis in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/softmax.py: subtract the row maximum, exponentiate, normalise. A row that is
entirely ``-inf`` gives zeros (softmax) or ``-inf`` (log-softmax) and zero gradient, as in the
NumPy twin; ``torch.softmax`` gives NaN there. ``dtype`` casts x first, as in torch.softmax.
float16 and bfloat16 are computed in float32 and rounded once, as there.
"""

import torch

from torch_attn._opmath import upcast


def _row_max(x, dim):
    """Row maximum, with 0 in place of -inf for rows that are entirely -inf."""
    m = x.amax(dim=dim, keepdim=True)
    return torch.where(torch.isneginf(m), torch.zeros_like(m), m)


def softmax(x, dim=-1, dtype=None):
    """Softmax of ``x`` along ``dim``: (..., n) -> (..., n); ``dtype`` casts x first."""
    x = x if dtype is None else x.to(dtype)        # as torch.softmax(x, dim, dtype=dtype)
    y_dtype = x.dtype                              # the output's dtype: x's after dtype='s cast
    x = upcast(x)                                  # (..., n) float32 for float16 and bfloat16
    m = _row_max(x, dim).detach()                  # (..., 1); a constant shift, no gradient
    e = torch.exp(x - m)                           # (..., n)
    s = e.sum(dim=dim, keepdim=True)               # (..., 1)
    y = e / torch.where(s == 0, torch.ones_like(s), s)
    y = y.to(y_dtype)                              # rounded once to the output dtype
    return y


def log_softmax(x, dim=-1, dtype=None):
    """Log-softmax of ``x`` along ``dim``: (..., n) -> (..., n); ``dtype`` casts x first."""
    x = x if dtype is None else x.to(dtype)        # as torch.log_softmax(x, dim, dtype=dtype)
    y_dtype = x.dtype                              # the output's dtype: x's after dtype='s cast
    x = upcast(x)                                  # (..., n) float32 for float16 and bfloat16
    m = _row_max(x, dim).detach()                  # (..., 1)
    shifted = x - m                                # (..., n)
    e = torch.exp(shifted)                         # (..., n)
    s = e.sum(dim=dim, keepdim=True)               # (..., 1)
    empty = s == 0                                 # rows that are entirely -inf
    log_s = torch.log(torch.where(empty, torch.ones_like(s), s))
    y = torch.where(empty, torch.full_like(shifted, -torch.inf), shifted - log_s)
    return y.to(y_dtype)                           # rounded once to the output dtype


# Equals torch.softmax(x, dim, dtype=dtype) and torch.log_softmax(x, dim, dtype=dtype) wherever a row
# has a finite entry (a 0-d x included).
