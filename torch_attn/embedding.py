"""Token embedding in plain PyTorch: a row lookup into a (V, C) table.

Twin of numpy_attn/embedding.py. Indexing ``wte[ids]`` is differentiable; autograd's backward is
the same scatter-add (repeated ids accumulate) that the NumPy twin writes with ``np.add.at``.
The padding row's lookups are detached, so it receives no gradient (the NumPy backward drops
their rows of dout).
float16 and bfloat16: the lookup is exact in the table's dtype, so no cast; autograd's scatter-add
then adds the rows in that dtype, as F.embedding does, where the NumPy backward adds in float32.
"""

import torch


def embedding(ids, wte, padding_idx=None):
    """Look up rows of ``wte`` (V, C) for integer ``ids`` (...,) -> out (..., C)."""
    V, C = wte.shape
    out = wte[ids]                                 # (...,) -> (..., C)
    if padding_idx is not None:   # the padding row's lookups pass no gradient: autograd sees a detached copy
        frozen = ids == padding_idx % V            # (...,) the lookups of the padding row
        out = torch.where(frozen[..., None], out.detach(), out)                       # (..., C)
    return out


# Equals torch.nn.functional.embedding(ids, wte, padding_idx), forward and backward.
