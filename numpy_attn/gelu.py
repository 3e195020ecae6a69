"""GELU, exact (erf) and tanh-approximated, with its backward.

    gelu(x)      = x * Phi(x),  Phi(x) = (1 + erf(x / sqrt(2))) / 2     (approximate="none")
    gelu_tanh(x) = x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))) / 2  (approximate="tanh")

Both write out = x * cdf, so both backwards are dx = dout * (cdf + x * dcdf/dx). Follows
Hendrycks and Gimpel, "Gaussian Error Linear Units" (2016), and ``torch.nn.functional.gelu``.
NumPy has no erf: the exact form uses the one in numpy_attn/erf.py.
"""

import numpy as np

from numpy_attn._checks import check_float
from numpy_attn.erf import erf

_KAPPA = 0.044715                        # the cubic coefficient of the tanh approximation
_APPROXIMATIONS = ("none", "tanh")


def gelu_forward(x, approximate="none"):
    """GELU of ``x`` elementwise: (...) -> (...), exact (erf) or ``approximate="tanh"``.

    Returns ``(out, cache)``; the cache is ``(x, cdf, t, approximate)`` with t the tanh (None for
    the exact form): the backward recomputes only the Gaussian density exp(-x^2 / 2).
    """
    _check_gelu(x, approximate)
    half, one = x.dtype.type(0.5), x.dtype.type(1)
    t = None
    if approximate == "none":
        cdf = half * (one + erf(x * x.dtype.type(np.sqrt(0.5))))     # Phi(x), the normal CDF
    else:
        x_cube = x * x * x
        inner = x.dtype.type(np.sqrt(2 / np.pi)) * (x + x.dtype.type(_KAPPA) * x_cube)
        t = np.tanh(inner)
        cdf = half * (one + t)
    out = np.asarray(x * cdf)                      # asarray: a 0-d x gives a 0-d array, not a scalar
    cache = (x, cdf, t, approximate)
    return out, cache


def gelu_backward(dout, cache):
    """Gradient of GELU: dout (...) -> dx (...)."""
    x, cdf, t, approximate = cache
    half, one = x.dtype.type(0.5), x.dtype.type(1)
    if approximate == "none":
        # Undoes cdf = Phi(x): its derivative is the normal density exp(-x^2 / 2) / sqrt(2 pi).
        dcdf = np.exp(-half * x * x) * x.dtype.type(1 / np.sqrt(2 * np.pi))
    else:
        # Undoes cdf = (1 + tanh(inner)) / 2, then inner = sqrt(2/pi) (x + kappa x^3).
        dinner = half * (one - t * t)
        dcdf = dinner * x.dtype.type(np.sqrt(2 / np.pi)) * (one + x.dtype.type(3 * _KAPPA) * x * x)
    # Undoes out = x * cdf (product rule).
    dx = np.asarray(dout * (cdf + x * dcdf))       # asarray: 0-d stays an array, as in the forward
    return dx


def _check_gelu(x, approximate):
    """Raise unless x is a float array and ``approximate`` is "none" or "tanh"."""
    check_float("x", x)
    if approximate not in _APPROXIMATIONS:
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
