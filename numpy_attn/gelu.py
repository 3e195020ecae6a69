"""GELU, exact (erf) and tanh-approximated, with its backward; and an erf in pure NumPy.

    gelu(x)      = x * Phi(x),  Phi(x) = (1 + erf(x / sqrt(2))) / 2     (approximate="none")
    gelu_tanh(x) = x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))) / 2  (approximate="tanh")

Both write out = x * cdf, so both backwards are dx = dout * (cdf + x * dcdf/dx). Follows
Hendrycks and Gimpel, "Gaussian Error Linear Units" (2016), and ``torch.nn.functional.gelu``.

NumPy has no erf, so ``erf`` below evaluates the rational approximations of Sun's fdlibm
``s_erf.c`` (each good to about 2**-57 on its interval). Against ``torch.erf`` its largest
error over a dense sweep of 2,000,001 points on [-8, 8], plus 200,001 magnitudes from 1e-300 to 8
of both signs, 0, subnormals and +-inf, is 1.1e-16 in float64: one ulp of numbers near 1, the
same as torch.erf's own distance from ``math.erf`` there. In float32 it is 6.0e-8 (half an ulp
of 1). ``test_erf_matches_torch`` repeats the sweep on every run. All arithmetic stays in the
input's dtype.
"""

import numpy as np

from numpy_attn._checks import check_float

# fdlibm s_erf.c: Copyright (C) 1993 by Sun Microsystems, Inc. All rights reserved. Developed at
# SunPro, a Sun Microsystems, Inc. business. Permission to use, copy, modify, and distribute this
# software is freely granted, provided that this notice is preserved.
# Coefficients lowest power first; each was checked against the hex words in s_erf.c.
_ERX = 8.45062911510467529297e-01        # erf(1) rounded to 24 bits
# erf(a) = a + a * PP(a^2) / QQ(a^2) on [0, 0.84375): a correction to the Taylor series.
_PP = (1.28379167095512558561e-01, -3.25042107247001499370e-01, -2.84817495755985104766e-02,
       -5.77027029648944159157e-03, -2.37630166566501626084e-05)
_QQ = (1.0, 3.97917223959155352819e-01, 6.50222499887672944485e-02, 5.08130628187576562776e-03,
       1.32494738004321644526e-04, -3.96022827877536812320e-06)
# erf(1 + s) = _ERX + PA(s) / QA(s) on a in [0.84375, 1.25), s = a - 1.
_PA = (-2.36211856075265944077e-03, 4.14856118683748331666e-01, -3.72207876035701323847e-01,
       3.18346619901161753674e-01, -1.10894694282396677476e-01, 3.54783043256182359371e-02,
       -2.16637559486879084300e-03)
_QA = (1.0, 1.06420880400844228286e-01, 5.40397917702171048937e-01, 7.18286544141962662868e-02,
       1.26171219808761642112e-01, 1.36370839120290507362e-02, 1.19844998467991074170e-02)
# erfc(a) = exp(-a^2 - 0.5625 + R(z) / S(z)) / a, z = 1 / a^2: RA/SA on [1.25, 1/0.35),
# RB/SB on [1/0.35, 6); from a = 6 on, erf(a) rounds to 1 in float64.
_RA = (-9.86494403484714822705e-03, -6.93858572707181764372e-01, -1.05586262253232909814e+01,
       -6.23753324503260060396e+01, -1.62396669462573470355e+02, -1.84605092906711035994e+02,
       -8.12874355063065934246e+01, -9.81432934416914548592e+00)
_SA = (1.0, 1.96512716674392571292e+01, 1.37657754143519042600e+02, 4.34565877475229228821e+02,
       6.45387271733267880336e+02, 4.29008140027567833386e+02, 1.08635005541779435134e+02,
       6.57024977031928170135e+00, -6.04244152148580987438e-02)
_RB = (-9.86494292470009928597e-03, -7.99283237680523006574e-01, -1.77579549177547519889e+01,
       -1.60636384855821916062e+02, -6.37566443368389627722e+02, -1.02509513161107724954e+03,
       -4.83519191608651397019e+02)
_SB = (1.0, 3.03380607434824582924e+01, 3.25792512996573918826e+02, 1.53672958608443695994e+03,
       3.19985821950859553908e+03, 2.55305040643316442583e+03, 4.74528541206955367215e+02,
       -2.24409524465858183362e+01)

_KAPPA = 0.044715                        # the cubic coefficient of the tanh approximation
_APPROXIMATIONS = ("none", "tanh")


def _poly(z, coeffs):
    """c0 + c1 z + c2 z^2 + ... by Horner's rule, in z's dtype (coefficients are cast to it)."""
    y = np.zeros_like(z)
    for c in reversed(coeffs):
        y = y * z + z.dtype.type(c)
    return y


def erf(x):
    """The error function of a float array, elementwise, in its dtype: (...) -> (...).

    Each interval's formula is evaluated on |x| clipped into that interval, so no formula ever sees
    an argument where it would overflow or divide by zero; ``np.select`` then keeps the right one.
    """
    check_float("x", x)
    one = x.dtype.type(1)
    a = np.abs(x)
    a1 = np.minimum(a, 0.84375)
    small = a1 + a1 * (_poly(a1 * a1, _PP) / _poly(a1 * a1, _QQ))
    s = np.clip(a, 0.84375, 1.25) - one
    near_one = x.dtype.type(_ERX) + _poly(s, _PA) / _poly(s, _QA)
    a3 = np.clip(a, 1.25, 6.0)
    z = one / (a3 * a3)
    r_over_s = np.where(a3 < 1 / 0.35, _poly(z, _RA) / _poly(z, _SA), _poly(z, _RB) / _poly(z, _SB))
    # 1 - erfc(a) loses nothing here: erfc(a) < 0.08, so its rounding is far below one ulp of 1.
    tail = one - np.exp(-a3 * a3 - x.dtype.type(0.5625) + r_over_s) / a3
    # Only NaN fails every condition, and the default passes it through.
    y = np.select([a < 0.84375, a < 1.25, a < 6.0, a >= 6.0], [small, near_one, tail, one], a)
    return np.copysign(y, x)                       # erf is odd


def gelu_forward(x, approximate="none"):
    """GELU of ``x`` elementwise: (...) -> (...), exact (erf) or ``approximate="tanh"``.

    Returns ``(out, cache)``; the cache is ``(x, cdf, t, approximate)`` with t the tanh (None for
    the exact form): the backward recomputes only the Gaussian density exp(-x^2 / 2).
    """
    check_float("x", x)
    if approximate not in _APPROXIMATIONS:
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    half, one = x.dtype.type(0.5), x.dtype.type(1)
    t = None
    if approximate == "none":
        cdf = half * (one + erf(x * x.dtype.type(np.sqrt(0.5))))     # Phi(x), the normal CDF
    else:
        x_cube = x * x * x
        inner = x.dtype.type(np.sqrt(2 / np.pi)) * (x + x.dtype.type(_KAPPA) * x_cube)
        t = np.tanh(inner)
        cdf = half * (one + t)
    out = x * cdf
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
    dx = dout * (cdf + x * dcdf)
    return dx
