"""Parity tests for numpy_attn/positional.py and torch_attn/positional.py.

The table has no parameters and no backward, so there is no autograd leg. PyTorch has no built-in
sinusoidal encoding, so the third leg is an independent float64 closed form computed element by
element with the math module.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from numpy_attn.embedding import embedding_forward
from numpy_attn.positional import sinusoidal_encoding
from parity_tests import strategies as S
from parity_tests.helpers import LOW_DTYPES, assert_close, assert_error_budget, round_to, to_numpy
from torch_attn.positional import sinusoidal_encoding as twin_encoding

sizes = st.tuples(st.integers(0, 40), st.integers(0, 17))
bases = st.sampled_from([10000.0, 100.0, 2.0])


def closed_form(T, C, base):
    """PE[t, c] one element at a time: sin for even c = 2i, cos for odd c = 2i + 1."""
    pe = np.zeros((T, C))
    for t in range(T):
        for c in range(C):
            angle = t / base ** ((c - c % 2) / C)
            pe[t, c] = math.sin(angle) if c % 2 == 0 else math.cos(angle)
    return pe


# -- forward matches the twin -----------------------------------------------------------------

@pytest.mark.twin_parity
@given(size=sizes, base=bases, dtype=S.dtypes)
@example(size=(1, 1), base=10000.0, dtype=np.float64)
@example(size=(7, 5), base=10000.0, dtype=np.float32)
def test_forward_matches_twin(size, base, dtype):
    T, C = size
    pe = sinusoidal_encoding(T, C, base=base, dtype=dtype)
    twin = to_numpy(twin_encoding(T, C, base=base, dtype=torch.float32 if dtype == np.float32 else torch.float64))
    assert_close("positional.pe", pe, twin)


# -- matches the closed form (PyTorch has no built-in) -------------------------------------------

@given(size=sizes, base=bases, dtype=S.dtypes)
@example(size=(6, 3), base=10000.0, dtype=np.float64)
def test_matches_closed_form(size, base, dtype):
    T, C = size
    pe = sinusoidal_encoding(T, C, base=base, dtype=dtype)
    # Both sides round a float64 value once, so float32 agrees to the last bit or one ulp.
    assert_close("positional.pe vs closed form", pe, closed_form(T, C, base).astype(dtype))


# -- properties ---------------------------------------------------------------------------------

@given(size=sizes)
def test_values_lie_in_unit_interval(size):
    pe = sinusoidal_encoding(*size, dtype=np.float64)
    assert np.all(np.abs(pe) <= 1.0), "positional.pe leaves [-1, 1]"


@given(C=st.integers(1, 17))
def test_row_zero_alternates_zero_one(C):
    pe = sinusoidal_encoding(3, C, dtype=np.float64)
    assert_close("positional.pe row 0", pe[0], (np.arange(C) % 2).astype(np.float64))


@given(C=st.integers(2, 17), t=st.integers(0, 39), k=st.integers(0, 39))
def test_shift_is_a_rotation(C, t, k):
    """For each pair (sin, cos) at frequency w: PE(t + k) = R(w k) PE(t), R depending on k only."""
    pe = sinusoidal_encoding(t + k + 1, C, dtype=np.float64)
    w = 10000.0 ** (-np.arange(0, C - 1, 2) / C)                 # one frequency per full pair
    cos, sin = np.cos(w * k), np.sin(w * k)
    s, c = pe[t, 0:2 * len(w):2], pe[t, 1:2 * len(w):2]         # sin and cos channels at t
    # sin(a + b) = sin a cos b + cos a sin b;  cos(a + b) = cos a cos b - sin a sin b
    assert_close("positional.pe(t + k) sin channels", pe[t + k, 0:2 * len(w):2], s * cos + c * sin,
                 atol=1e-11)
    assert_close("positional.pe(t + k) cos channels", pe[t + k, 1:2 * len(w):2], c * cos - s * sin,
                 atol=1e-11)


def test_learned_positions_are_an_embedding_of_positions():
    """The docstring's claim: learned positions = embedding_forward(np.arange(T), wpe)."""
    wpe = np.random.default_rng(0).standard_normal((10, 4))
    out, _ = embedding_forward(np.arange(6), wpe)
    assert_close("learned positions", out, wpe[:6])


@pytest.mark.parametrize("T, C", [(0, 4), (5, 0), (0, 0)])
def test_empty_sizes_give_empty_tables(T, C):
    """T = 0 or C = 0 is a valid, empty table, as np.zeros((T, C)) would be."""
    pe = sinusoidal_encoding(T, C)
    assert pe.shape == (T, C), f"positional.pe shape {pe.shape}"


# -- float16 and bfloat16: FlashAttention's error rule -------------------------------------------

def _low_precision_formula(T, C, base, dtype):
    """The table as a user's PyTorch code would write it for a low dtype: every step in it."""
    t = torch.arange(T, dtype=dtype)[:, None]                    # (T, 1); bfloat16 rounds t > 256
    inv_freq = base ** (-torch.arange(0, C, 2, dtype=dtype) / C)
    angle = t * inv_freq
    pe = torch.zeros((T, C), dtype=dtype)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : C // 2])
    return pe


@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@given(size=sizes, base=bases)
@example(size=(40, 17), base=10000.0)
def test_low_precision_meets_the_error_budget(size, base, dtype):
    """Ours and the twin against the float64 closed form, within twice the error of the same
    formula run in the low dtype with plain torch ops; each is its own float64 table rounded once,
    exactly, by its own library's cast (the two float64 tables may differ in the last bit, torch's
    pow not being NumPy's, and torch's float64 -> float16 cast need not round as NumPy's does near
    a tie)."""
    T, C = size
    low, torch_dtype = LOW_DTYPES[dtype]
    truth = closed_form(T, C, base)
    pe = sinusoidal_encoding(T, C, base=base, dtype=low)
    twin = to_numpy(twin_encoding(T, C, base=base, dtype=torch_dtype))
    theirs = to_numpy(_low_precision_formula(T, C, base, torch_dtype))
    once = {"numpy": round_to(sinusoidal_encoding(T, C, base=base, dtype=np.float64), dtype),
            "twin": to_numpy(twin_encoding(T, C, base=base, dtype=torch.float64).to(torch_dtype))}
    for who, ours in {"numpy": pe, "twin": twin}.items():
        assert_error_budget(f"positional[{who}]", dtype, {"pe": (ours, theirs, truth)})
        assert np.array_equal(ours.astype(np.float64), once[who].astype(np.float64)), \
            f"positional[{who}] ({dtype}) is not its float64 table rounded once"


# -- dtype preservation -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES + tuple(d.type for d, _ in LOW_DTYPES.values()))
def test_dtype_is_preserved(dtype):
    assert sinusoidal_encoding(4, 6, dtype=dtype).dtype == dtype


# -- bad input --------------------------------------------------------------------------------------

def test_bad_input():
    with pytest.raises(ValueError, match="T must be >= 0, got -1"):
        sinusoidal_encoding(-1, 4)
    with pytest.raises(ValueError, match="C must be >= 0, got -3"):
        sinusoidal_encoding(4, -3)
    with pytest.raises(TypeError, match="C must be an integer, got 4.0"):
        sinusoidal_encoding(4, 4.0)
    with pytest.raises(ValueError, match="base must be > 1, got 1.0"):
        sinusoidal_encoding(4, 4, base=1.0)
    for base in (float("nan"), True, "10000", None):   # a comparison error or a silent base before
        with pytest.raises(ValueError, match=f"^base must be > 1, got {base!r}$"):
            sinusoidal_encoding(4, 4, base=base)
    with pytest.raises(TypeError, match="^dtype must be float16, bfloat16, float32 or float64, got int32$"):
        sinusoidal_encoding(4, 4, dtype=np.int32)
    with pytest.raises(TypeError, match=r"^dtype must be float16, bfloat16, float32 or float64, got torch.float16$"):
        sinusoidal_encoding(4, 4, dtype=torch.float16)
