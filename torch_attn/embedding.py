"""Token embedding in plain PyTorch: a row lookup into a (V, C) table.

Twin of numpy_attn/embedding.py. Indexing ``wte[ids]`` is differentiable; autograd's backward is
the same scatter-add (repeated ids accumulate) that the NumPy twin writes with ``np.add.at``.
The padding row's lookups are detached, so it receives no gradient (the NumPy backward zeroes it).
float16 and bfloat16: the lookup is exact in the table's dtype, so no cast; autograd's scatter-add
then adds the rows in that dtype, as F.embedding does, where the NumPy backward adds in float32.
"""

import torch


def embedding(ids, wte, padding_idx=None):
    """Look up rows of ``wte`` (V, C) for integer ``ids`` (...,) -> out (..., C)."""
    V, C = wte.shape
    out = wte[ids]                                 # (...,) -> (..., C)
    # The padding row gets no gradient, as in F.embedding: NumPy zeroes it in its backward; here
    # the forward hands autograd a detached copy of it.
    out = out if padding_idx is None else torch.where((ids == padding_idx % V)[..., None], out.detach(), out)
    return out


# Equals torch.nn.functional.embedding(ids, wte, padding_idx), forward and backward.
