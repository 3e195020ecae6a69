"""Hypothesis strategies for shapes, arrays and parameters.

Coupled shapes are built by construction (``C = nh * hs``), never by filtering. Elements are
bounded so that tolerances can be stated; float32 elements are drawn with ``width=32`` so that
they are exactly representable. Token ids are drawn from a small vocabulary so that they repeat.
"""

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

FLOAT_DTYPES = (np.float64, np.float32)

dtypes = st.sampled_from(FLOAT_DTYPES)


def dim(min_value=1, max_value=6):
    """One dimension's size."""
    return st.integers(min_value, max_value)


def floats(dtype, bound=4.0):
    """Bounded, finite elements of ``dtype``."""
    width = 32 if np.dtype(dtype) == np.float32 else 64
    return st.floats(-bound, bound, width=width, allow_nan=False, allow_infinity=False,
                     allow_subnormal=False)


def arrays(dtype, shape, bound=4.0):
    """Arrays of ``shape`` with bounded elements of ``dtype``."""
    return hnp.arrays(dtype, shape, elements=floats(dtype, bound))


def batch_shapes(max_dims=2, max_side=4):
    """Leading dimensions (possibly none), e.g. (), (B,), (B, nh)."""
    return hnp.array_shapes(min_dims=0, max_dims=max_dims, min_side=1, max_side=max_side)


def token_ids(V, shape):
    """Integer ids in [0, V) of ``shape``; with a small V they repeat."""
    return hnp.arrays(np.int64, shape, elements=st.integers(0, V - 1))
