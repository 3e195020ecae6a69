"""GELU, exact (erf) and tanh-approximated, with its backward.

    gelu(x)      = x * Phi(x),  Phi(x) = (1 + erf(x / sqrt(2))) / 2     (approximate="none")
    gelu_tanh(x) = x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))) / 2  (approximate="tanh")

Both write out = x * cdf, so both backwards are dx = dout * (cdf + x * dcdf/dx). The tanh form's
cdf is computed as sigmoid(2 u), u = sqrt(2/pi) (x + 0.044715 x^3), the same number: where u << 0,
tanh(u) lies within float32's spacing of -1 and 1 + tanh(u) would keep that whole error, while
sigmoid(2 u) = exp(2 u) / (1 + exp(2 u)) keeps its relative precision. Follows
Hendrycks and Gimpel, "Gaussian Error Linear Units" (2016), and ``torch.nn.functional.gelu``.
NumPy has no erf: the exact form uses the one in numpy_attn/erf.py.

float16 and bfloat16: x is cast up to float32 and both forms and their backward are computed
there, out and dx rounded once to x's dtype, as PyTorch's GELU kernel evaluates erf or tanh in
float32 (its opmath type, docs/precision.md).
"""

import numpy as np

from numpy_attn._checks import check_dout, check_float, upcast
from numpy_attn.erf import erf

_KAPPA = 0.044715                        # the cubic coefficient of the tanh approximation
_APPROXIMATIONS = ("none", "tanh")


def gelu_forward(x, approximate="none"):
    """GELU of ``x`` elementwise: (...) -> (...), exact (erf) or ``approximate="tanh"``.

    Returns ``(out, cache)``; the cache is ``(x, cdf, cdf_rest, approximate, x's dtype)`` with
    cdf_rest = 1 - cdf for the tanh form (None for the exact form), each in the dtype computed in
    (float32 for float16 and bfloat16): the backward recomputes only the Gaussian density exp(-x^2 / 2).
    """
    _check_gelu(x, approximate)
    xf = upcast(x)                                 # (...) float32 for float16 and bfloat16
    half, one = xf.dtype.type(0.5), xf.dtype.type(1)
    cdf_rest = None
    if approximate == "none":
        cdf = half * (one + erf(xf * xf.dtype.type(np.sqrt(0.5))))   # Phi(x), the normal CDF
    else:
        x_cube = xf * xf * xf
        inner = xf.dtype.type(np.sqrt(2 / np.pi)) * (xf + xf.dtype.type(_KAPPA) * x_cube)
        # (1 + tanh(inner)) / 2 = sigmoid(2 inner), and 1 - cdf with it, from exp(-2 |inner|) <= 1.
        e = np.exp(-2 * np.abs(inner))
        cdf = np.where(inner >= 0, one / (one + e), e / (one + e))
        cdf_rest = np.where(inner >= 0, e / (one + e), one / (one + e))
    out = np.asarray(xf * cdf)                     # asarray: a 0-d x gives a 0-d array, not a scalar
    cache = (xf, cdf, cdf_rest, approximate, x.dtype)
    return out.astype(x.dtype, copy=False), cache  # rounded once to x's dtype


def gelu_backward(dout, cache):
    """Gradient of GELU: dout (...) -> dx (...)."""
    x, cdf, cdf_rest, approximate, x_dtype = cache
    check_dout("gelu_backward", dout, x.shape, x_dtype)
    dout = upcast(dout)                            # float32 for float16 and bfloat16
    half, one = x.dtype.type(0.5), x.dtype.type(1)
    if approximate == "none":
        # Undoes cdf = Phi(x): its derivative is the normal density exp(-x^2 / 2) / sqrt(2 pi).
        dcdf = np.exp(-half * x * x) * x.dtype.type(1 / np.sqrt(2 * np.pi))
    else:
        # Undoes cdf = sigmoid(2 inner): (1 - tanh^2) / 2 = 2 cdf (1 - cdf); then inner = sqrt(2/pi) (x + kappa x^3).
        dinner = 2 * cdf * cdf_rest
        dcdf = dinner * x.dtype.type(np.sqrt(2 / np.pi)) * (one + x.dtype.type(3 * _KAPPA) * x * x)
    # Undoes out = x * cdf (product rule).
    dx = np.asarray(dout * (cdf + x * dcdf))       # asarray: 0-d stays an array, as in the forward
    return dx.astype(x_dtype, copy=False)          # rounded once to x's dtype


def _check_gelu(x, approximate):
    """Raise unless x is a float array and ``approximate`` is "none" or "tanh"."""
    check_float("x", x)
    if approximate not in _APPROXIMATIONS:
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
