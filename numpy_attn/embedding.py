"""Token embedding: a row lookup into a (V, C) table, and its scatter-add backward.

    out[..., :] = wte[ids[...], :]

The backward sends each upstream gradient row back to the table row it was read from. A token id
that appears several times collects the sum of its rows, so the backward must use ``np.add.at``:
``dwte[ids] += dout`` would keep only one of the repeated rows (fancy-index assignment does not
accumulate). Follows ``torch.nn.functional.embedding``.
"""

import numpy as np

from numpy_attn._checks import check_dout, check_float, check_integer, check_ndim


def embedding_forward(ids, wte):
    """Look up rows of ``wte`` (V, C) for integer ``ids`` of any shape (...,) -> out (..., C).

    Returns ``(out, cache)``; the cache is ``(ids, V, C, dtype)``: the backward needs where each
    row came from and the table's shape and dtype, not the table itself.
    """
    ids = _check_embedding(ids, wte)
    V, C = wte.shape
    out = wte[ids]                                 # (...,) -> (..., C)
    cache = (ids, V, C, wte.dtype)
    return out, cache


def embedding_backward(dout, cache):
    """Gradient of the table: dout (..., C) -> dwte (V, C); repeated ids add up."""
    ids, V, C, dtype = cache
    check_dout("embedding_backward", dout, ids.shape + (C,), dtype)
    dwte = np.zeros((V, C), dtype=dout.dtype)      # (V, C)
    # Undoes out = wte[ids]; np.add.at accumulates repeated ids, unlike dwte[ids] += dout.
    np.add.at(dwte, ids, dout)
    return dwte


def _check_embedding(ids, wte):
    """Return ``ids`` as an integer array; raise unless wte is a float (V, C) table and every id
    lies in [0, V)."""
    check_float("wte", wte)
    check_ndim("wte", wte, 2)
    V = wte.shape[0]
    ids = np.asarray(ids)
    check_integer("token ids", ids)
    if ids.size:
        low, high = ids.min(), ids.max()
        if low < 0:
            raise ValueError(f"token id {low} is negative; ids must lie in [0, V) with V = {V}")
        if high >= V:
            raise ValueError(f"token id {high} is out of range for a vocabulary of size V = {V}")
    return ids
