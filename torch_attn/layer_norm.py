"""Layer normalisation over the last axis (or the last few) in plain PyTorch; autograd supplies
the backward.

Twin of numpy_attn/layer_norm.py: biased variance, eps inside the square root, the same second
centring that keeps near-constant rows accurate, and w and b each optional; float16 and bfloat16
computed in float32 and rounded once, as there.
"""

import torch

from torch_attn._opmath import upcast


def layer_norm(x, w=None, b=None, eps=1e-5, normalized_shape=None):
    """Normalise x (..., *S) over its trailing axes S = ``normalized_shape`` (default: the last
    axis), then scale by w S and shift by b S, each optional -> (..., *S)."""
    normalized_shape = _normalized_shape(x, normalized_shape)
    axes = tuple(range(-len(normalized_shape), 0))         # the normalised trailing axes
    xf, wf, bf = upcast(x), upcast(w), upcast(b)           # float32 for float16 and bfloat16
    mu = xf.mean(dim=axes, keepdim=True)                   # (..., *S) -> (..., 1, ..., 1)
    xc = xf - mu                                           # (..., *S)
    xc = xc - xc.mean(dim=axes, keepdim=True)              # removes mu's rounding error
    var = (xc * xc).mean(dim=axes, keepdim=True)           # (..., 1, ..., 1), biased
    rstd = 1 / torch.sqrt(var + eps)                       # (..., 1, ..., 1)
    xhat = xc * rstd                                       # (..., *S), zero mean, unit variance
    out = xhat if wf is None else xhat * wf                # no w: elementwise_affine=False
    out = out if bf is None else out + bf                  # no b: bias=False
    return out.to(x.dtype)                                 # rounded once to x's dtype


def _normalized_shape(x, normalized_shape):
    """normalized_shape as a tuple (x's last axis if None): what the maths needs of the NumPy
    twin's _check_layer_norm; the refusals are left to the NumPy side and to torch itself."""
    if normalized_shape is None:
        normalized_shape = x.shape[-1:]
    normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    return normalized_shape


# Equals torch.nn.functional.layer_norm(x, normalized_shape, w, b, eps), and so nn.LayerNorm with
# elementwise_affine=False (w = b = None) or bias=False (b = None).
