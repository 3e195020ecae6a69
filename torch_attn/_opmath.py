"""The dtype an operation computes in, for the twins: float32 for float16 and bfloat16.

Twin of ``opmath`` and ``upcast`` in numpy_attn/_checks.py: PyTorch's CPU kernels load
low-precision inputs, compute in float32 (their "opmath" type) and round once at the end
(docs/precision.md). A twin that casts up with ``upcast`` and back with ``.to(x.dtype)`` lets
autograd do the same in the backward: the gradient is computed in float32 and rounded once at the cast.
"""

import torch

LOW_PRECISION = (torch.float16, torch.bfloat16)


def opmath(dtype):
    """float32 for float16 and bfloat16, ``dtype`` itself otherwise."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


def upcast(x):
    """``x`` in its opmath dtype (``x`` itself for float32 and float64); None stays None."""
    return None if x is None else x.to(opmath(x.dtype))
