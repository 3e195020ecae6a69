"""Hypothesis strategies for shapes, arrays and parameters.

Coupled shapes are built by construction (``C = nh * hs``), never by filtering. Elements are
bounded so that tolerances can be stated; float32 elements are drawn with ``width=32`` so that
they are exactly representable. Token ids are drawn from a small vocabulary so that they repeat.
"""

import math

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

# Shared with the users of numpy_attn.testing, which offers them: bounded elements and arrays, shapes
# that broadcast to a given one, and attention masks of every kind.
from numpy_attn.testing import MASK_KINDS as MASK_KINDS
from numpy_attn.testing import arrays as arrays
from numpy_attn.testing import attention_masks as attention_masks
from numpy_attn.testing import broadcastable_to as broadcastable_to
from numpy_attn.testing import floats as floats

FLOAT_DTYPES = (np.float64, np.float32)

dtypes = st.sampled_from(FLOAT_DTYPES)


def ramp(*shape, dtype=np.float64):
    """Distinct values in [-1, 1] of ``shape`` (sin 1, sin 2, ...), for hand-written @example cases."""
    return np.sin(np.arange(1, math.prod(shape) + 1)).reshape(shape).astype(dtype)


def dim(min_value=1, max_value=6):
    """One dimension's size."""
    return st.integers(min_value, max_value)


def batch_shapes(max_dims=2, max_side=4):
    """Leading dimensions (possibly none), e.g. (), (B,), (B, nh)."""
    return hnp.array_shapes(min_dims=0, max_dims=max_dims, min_side=1, max_side=max_side)


def token_ids(V, shape):
    """Integer ids in [0, V) of ``shape``; with a small V they repeat."""
    return hnp.arrays(np.int64, shape, elements=st.integers(0, V - 1))


@st.composite
def linear_params(draw, dtype, layers, bias, bound=1.0):
    """Parameters {name: {"w": (C_in, C_out), "b": (C_out,)}} of the linear layers ``layers``
    ((name, C_in, C_out), ...), each "b" only with ``bias``; elements within ``bound``."""
    params = {}
    for name, C_in, C_out in layers:
        params[name] = {"w": draw(arrays(dtype, (C_in, C_out), bound))}
        if bias:
            params[name]["b"] = draw(arrays(dtype, (C_out,), bound))
    return params


@st.composite
def splits(draw, total):
    """Step sizes >= 1 that add up to ``total``: a prefill, then one or several tokens at a time."""
    cuts = sorted(draw(st.sets(st.integers(1, total - 1), max_size=total - 1))) if total > 1 else []
    bounds = [0] + cuts + [total]
    return [b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


@st.composite
def cu_seqlens_of(draw, max_seqs=4, max_len=4):
    """Cumulative lengths [0, n1, n1+n2, ...] of 1..max_seqs sequences (empty ones allowed)."""
    lengths = draw(st.lists(st.integers(0, max_len), min_size=1, max_size=max_seqs))
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
