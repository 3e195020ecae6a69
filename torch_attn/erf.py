"""The error function in plain PyTorch, built the same way as numpy_attn/erf.py.

Twin of numpy_attn/erf.py: the same three expansions on a = |x| in float64 (Taylor series at 0
below 1, Taylor series at 1.5 below 2, the continued fraction of erfc below 6, 1 beyond), with
the same coefficients, then the sign of x and one rounding to x's dtype (float16 and bfloat16
included, computed in float64 as float32 is). It exists so that the
NumPy erf is read beside a torch program of the same shape; torch_attn/gelu.py uses ``torch.erf``
itself, whose autograd gives erf's exact derivative (the derivative of this piecewise
approximation would be close but not the same, and |x| has no gradient at 0).
"""

import math

import torch

# Taylor coefficients of erf(a) / a in powers of a^2, 2/sqrt(pi) folded in; 24 terms reach
# float64 precision for a < 1 (the 24th is below 1e-24).
_AT_ZERO = tuple(2 / math.sqrt(math.pi) * (-1) ** n / (math.factorial(n) * (2 * n + 1))
                 for n in range(24))
# Depth of the continued fraction, evaluated from its tail up: 60 levels converge to float64
# precision from a = 2 on (convergence is slower the smaller a is).
_CF_DEPTH = 60
_MID = 1.5                               # centre of the Taylor series for 1 <= a < 2


def _horner(z, coeffs):
    """c0 + c1 z + c2 z^2 + ... by Horner's rule."""
    p = torch.zeros_like(z)
    for c in reversed(coeffs):
        p = p * z + c
    return p


def _erfc_continued_fraction(a, depth):
    """erfc(a) for a > 0, by the continued fraction evaluated from its tail."""
    f = a.clone()
    for k in range(depth, 0, -1):
        f = a + (k / 2) / f
    return torch.exp(-a * a) / (math.sqrt(math.pi) * f)


def _taylor_coefficients(x0, erf_x0, n):
    """erf^(k)(x0) / k! for k < n, the derivatives from the Hermite polynomials at x0."""
    hermite = [1.0, 2 * x0]                        # H_0, H_1; H_(j+1) = 2x H_j - 2j H_(j-1)
    for j in range(1, n - 2):
        hermite.append(2 * x0 * hermite[j] - 2 * j * hermite[j - 1])
    g = 2 / math.sqrt(math.pi) * math.exp(-x0 * x0)
    return (erf_x0,) + tuple(g * (-1) ** (k - 1) * hermite[k - 1] / math.factorial(k)
                             for k in range(1, n))


# 30 terms reach float64 precision for |a - 1.5| <= 0.5 (the 30th is below 1e-13 * 0.5^29).
# erf(1.5) itself comes from the continued fraction, deep enough to converge at 1.5.
_AT_MID = _taylor_coefficients(
    _MID, 1 - float(_erfc_continued_fraction(torch.tensor(_MID, dtype=torch.float64), depth=400)), 30)


def erf(x):
    """The error function of a float tensor, elementwise: (...) -> (...), same dtype."""
    a = torch.abs(x).to(torch.float64)             # (...)
    y = torch.ones_like(a)                         # a >= 6 (and inf): erf is 1 to float64
    small, mid, tail = a < 1, (a >= 1) & (a < 2), (a >= 2) & (a < 6)
    y[small] = a[small] * _horner(a[small] ** 2, _AT_ZERO)
    y[mid] = _horner(a[mid] - _MID, _AT_MID)       # a - 1.5 is exact here (Sterbenz)
    y[tail] = 1 - _erfc_continued_fraction(a[tail], _CF_DEPTH)
    y[torch.isnan(a)] = torch.nan
    return torch.copysign(y, x.to(torch.float64)).to(x.dtype)


# Equals torch.erf(x) to two ulps (each is within about one ulp of the true erf);
# parity_tests/test_erf.py checks it on a dense sweep.
