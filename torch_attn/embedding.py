"""Token embedding in plain PyTorch: a row lookup into a (V, C) table.

Twin of numpy_attn/embedding.py. Indexing ``wte[ids]`` is differentiable; autograd's backward is
the same scatter-add (repeated ids accumulate) that the NumPy twin writes with ``np.add.at``.
"""


def embedding(ids, wte):
    """Look up rows of ``wte`` (V, C) for integer ``ids`` (...,) -> out (..., C)."""
    V, C = wte.shape
    out = wte[ids]                                 # (...,) -> (..., C)
    return out


# Equals torch.nn.functional.embedding(ids, wte).
