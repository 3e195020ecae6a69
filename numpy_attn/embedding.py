"""Token embedding: a row lookup into a (V, C) table, and its scatter-add backward.

    out[..., :] = wte[ids[...], :]

The backward sends each upstream gradient row back to the table row it was read from. A token id
that appears several times collects the sum of its rows, so the backward must use ``np.add.at``:
``dwte[ids] += dout`` would keep only one of the repeated rows (fancy-index assignment does not
accumulate). With ``padding_idx`` that row is read like any other but receives no gradient, so
training never moves it. Follows ``torch.nn.functional.embedding`` (padding_idx included; a
negative one counts from the end, as there).

float16 and bfloat16: the lookup copies rows, exact in any dtype, so it runs in wte's own dtype
(a float32 copy of the table would cost V * C floats for nothing). The backward adds the rows in
float32 and rounds each table row once; PyTorch's F.embedding adds them in the low dtype
(docs/precision.md), and so does the twin (its lookup has no cast for autograd to undo in
float32): an id repeated many times loses digits there and not here.
"""

import numpy as np

from numpy_attn._checks import check_dout, check_float, check_integer, check_ndim, opmath, upcast


def embedding_forward(ids, wte, padding_idx=None):
    """Look up rows of ``wte`` (V, C) for integer ``ids`` of any shape (...,) -> out (..., C).

    Returns ``(out, cache)``; the cache is ``(ids, V, C, dtype, frozen)``: the backward needs where
    each row came from, the table's shape and dtype and which lookups read the padding row (None
    without padding_idx), not the table itself.
    """
    ids, padding_idx = _check_embedding(ids, wte, padding_idx)
    V, C = wte.shape
    out = wte[ids]                                 # (...,) -> (..., C)
    frozen = None
    if padding_idx is not None:
        frozen = ids == padding_idx                # (...,) the lookups of the padding row
    cache = (ids, V, C, wte.dtype, frozen)
    return out, cache


def embedding_backward(dout, cache):
    """Gradient of the table: dout (..., C) -> dwte (V, C); repeated ids add up."""
    ids, V, C, dtype, frozen = cache
    check_dout("embedding_backward", dout, ids.shape + (C,), dtype)
    dwte = np.zeros((V, C), dtype=opmath(dtype))   # (V, C) float32 for float16 and bfloat16
    if frozen is not None:   # the padding row's lookups pass no gradient: that row stays as it is
        dout = np.where(frozen[..., None], 0, dout)                                   # (..., C)
    # Undoes out = wte[ids]; np.add.at accumulates repeated ids, unlike dwte[ids] += dout.
    np.add.at(dwte, ids, upcast(dout))
    return dwte.astype(dtype, copy=False)          # each row's sum rounded once to wte's dtype


def _check_embedding(ids, wte, padding_idx):
    """Return ``(ids, padding_idx)``: ids as an integer array, padding_idx in [0, V) or None.
    Raise unless wte is a float (V, C) table, every id lies in [0, V) and padding_idx (if given) is
    an integer in [-V, V)."""
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
    if padding_idx is not None:
        if isinstance(padding_idx, bool) or not isinstance(padding_idx, int | np.integer):
            raise TypeError(f"padding_idx must be an integer or None, got {type(padding_idx).__name__}")
        if not -V <= padding_idx < V:
            raise ValueError(f"padding_idx = {padding_idx} must lie in [-V, V) with V = {V}")
        padding_idx = int(padding_idx) % V
    return ids, padding_idx
