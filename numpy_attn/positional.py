"""Sinusoidal position encoding (Vaswani et al., 2017, section 3.5).

    PE[t, 2i]     = sin(t / base^(2i / C))
    PE[t, 2i + 1] = cos(t / base^(2i / C))

Sin on even channels, cos on odd channels; an odd C ends with one sin channel. For each channel
pair, PE[t + k] is PE[t] rotated by the angle k / base^(2i/C), which depends only on k: that is
what lets attention read relative positions. The table is computed in float64 and rounded once to
``dtype``. It has no parameters and so no backward.

float16 and bfloat16 are rounded once from the same float64 table: the angles t / base^(2i/C) need
more digits than either has (bfloat16 cannot even hold t = 257), so no step runs in them.

Learned positions are not a separate operation: they are the embedding of the positions,

    wpe_out, cache = embedding_forward(np.arange(T), wpe)    # wpe (T_max, C) -> (T, C)

with ``embedding_backward`` as their backward.
"""

import numbers
import operator

import numpy as np

from numpy_attn._checks import FLOAT_DTYPES


def sinusoidal_encoding(T, C, base=10000.0, dtype=np.float32):
    """The (T, C) sinusoidal table for positions 0..T-1; T = 0 or C = 0 give an empty table."""
    _check_sinusoidal_encoding(T, C, base, dtype)
    t = np.arange(T, dtype=np.float64)[:, None]                  # (T, 1)
    i2 = np.arange(0, C, 2, dtype=np.float64)                    # (ceil(C/2),) the even channels 2i
    inv_freq = base ** (-i2 / C)                                 # (ceil(C/2),)
    angle = t * inv_freq                                         # (T, ceil(C/2))
    pe = np.zeros((T, C), dtype=np.float64)                      # (T, C)
    pe[:, 0::2] = np.sin(angle)                                  # even channels
    pe[:, 1::2] = np.cos(angle[:, : C // 2])                     # odd channels; odd C has one fewer
    return pe.astype(dtype)


def _check_sinusoidal_encoding(T, C, base, dtype):
    """Raise unless T and C are integers >= 0, base > 1 and dtype is float16, bfloat16, float32 or
    float64."""
    for name, n in (("T", T), ("C", C)):
        try:
            operator.index(n)
        except TypeError:
            raise TypeError(f"{name} must be an integer, got {n!r}") from None
        if n < 0:
            raise ValueError(f"{name} must be >= 0, got {n}")
    if isinstance(base, bool) or not isinstance(base, numbers.Real) or not base > 1:   # as rope's theta
        raise ValueError(f"base must be > 1, got {base!r}")
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = repr(dtype)                      # not a NumPy dtype at all (a torch dtype, a typo)
    if name not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be float16, bfloat16, float32 or float64, got {name}")
