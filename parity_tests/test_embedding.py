"""Parity tests for numpy_attn/embedding.py and torch_attn/embedding.py."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given
from hypothesis import strategies as st

from numpy_attn.embedding import embedding_backward, embedding_forward
from parity_tests import helpers
from parity_tests import strategies as S
from parity_tests.helpers import FD_TOL, assert_close, autograd, numerical_grad, to_numpy, to_torch
from torch_attn.embedding import embedding


@st.composite
def lookups(draw, dtype=None):
    """(ids, wte, dout, padding_idx): ids of shape (T,) or (B, T) from a small vocabulary, so they
    repeat; padding_idx None or a row counted from either end."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    V, C = draw(S.dim(1, 5)), draw(S.dim(1, 6))
    ids_shape = draw(st.sampled_from([(draw(S.dim(1, 8)),), (draw(S.dim(1, 3)), draw(S.dim(1, 8)))]))
    ids = draw(S.token_ids(V, ids_shape))
    wte = draw(S.arrays(dtype, (V, C)))
    dout = draw(S.arrays(dtype, ids_shape + (C,)))
    return ids, wte, dout, draw(st.none() | st.integers(-V, V - 1))


REPEATED = (np.array([[1, 1, 0, 1]]), np.arange(6.0).reshape(3, 2),
            np.array([[[0.5, -1.0], [2.0, 0.25], [1.5, 1.5], [-3.0, 4.0]]]), None)
# The repeated id is the padding row, given from the end (-2 is row 1 of 3).
PADDED = REPEATED[:3] + (-2,)


def _twin(ids, padding_idx):
    """The twin as a function of the table alone, for autograd (ids are not differentiable)."""
    return lambda wte: embedding(to_torch(ids), wte, padding_idx)


# -- forward matches the twin -----------------------------------------------------------------

@given(case=lookups())
@example(case=REPEATED)
@example(case=PADDED)
def test_forward_matches_twin(case):
    ids, wte, _, padding_idx = case
    out, _ = embedding_forward(ids, wte, padding_idx)
    assert_close("embedding.out", out, to_numpy(embedding(to_torch(ids), to_torch(wte), padding_idx)))


# -- backward matches autograd ----------------------------------------------------------------

@pytest.mark.twin_parity
@given(case=lookups())
@example(case=REPEATED)
@example(case=PADDED)
def test_backward_matches_autograd(case):
    ids, wte, dout, padding_idx = case
    _, cache = embedding_forward(ids, wte, padding_idx)
    dwte = embedding_backward(dout, cache)
    _, grads = autograd(_twin(ids, padding_idx), {"wte": wte}, dout)
    assert_close("embedding.dwte", dwte, grads["wte"])


# -- the twin matches PyTorch's built-in --------------------------------------------------------

@given(case=lookups())
@example(case=PADDED)
def test_twin_matches_builtin(case):
    ids, wte, dout, padding_idx = case
    out_twin, g_twin = autograd(_twin(ids, padding_idx), {"wte": wte}, dout)
    out_builtin, g_builtin = autograd(lambda wte: F.embedding(to_torch(ids), wte, padding_idx),
                                      {"wte": wte}, dout)
    assert_close("embedding.out vs F.embedding", out_twin, out_builtin)
    assert_close("embedding.dwte vs F.embedding", g_twin["wte"], g_builtin["wte"])


# -- properties ---------------------------------------------------------------------------------

def test_repeated_ids_accumulate():
    """Id 1 appears three times: its gradient row is the sum of the three upstream rows.
    Fancy-index assignment (dwte[ids] += dout) would keep only the last of them."""
    ids, wte, dout, _ = REPEATED
    _, cache = embedding_forward(ids, wte)
    dwte = embedding_backward(dout, cache)
    assert_close("embedding.dwte row of id 1", dwte[1], dout[0, 0] + dout[0, 1] + dout[0, 3])
    assert_close("embedding.dwte row of unused id 2", dwte[2], np.zeros(2))
    naive = np.zeros_like(wte)
    naive[ids] += dout
    assert not np.allclose(naive, dwte), "the repeated-id example should defeat fancy-index +="


def test_padding_row_is_read_but_frozen():
    """Id 1 is the padding row and appears three times: it is looked up like any row, but its
    gradient row is exactly zero; the other rows are unchanged by padding_idx."""
    ids, wte, dout, padding_idx = PADDED
    out, cache = embedding_forward(ids, wte, padding_idx)
    assert_close("embedding.out of the padding row", out[0, 0], wte[1])
    dwte = embedding_backward(dout, cache)
    assert not dwte[1].any(), f"embedding.dwte of the padding row is {dwte[1]}, not 0"
    _, plain_cache = embedding_forward(ids, wte)
    plain = embedding_backward(dout, plain_cache)
    assert_close("embedding.dwte of the other rows", dwte[[0, 2]], plain[[0, 2]])


@given(case=lookups())
def test_gradient_total_is_preserved(case):
    """Every upstream row lands in exactly one table row: the column sums agree."""
    ids, wte, dout, _ = case
    _, cache = embedding_forward(ids, wte)
    dwte = embedding_backward(dout, cache)
    assert_close("embedding.dwte column sums", dwte.sum(axis=0),
                 dout.reshape(-1, wte.shape[1]).sum(axis=0), rtol=1e-5 if wte.dtype == np.float32 else None)


@given(case=lookups())
def test_gradient_shares_no_memory(case):
    """dwte is a fresh table: never wte, the forward's output or dout."""
    ids, wte, dout, padding_idx = case
    out, cache = embedding_forward(ids, wte, padding_idx)
    dwte = embedding_backward(dout, cache)
    for name, a in (("wte", wte), ("out", out), ("dout", dout), ("ids", ids)):
        assert not np.shares_memory(dwte, a), f"embedding.dwte shares memory with {name}"


# -- finite differences (no torch) ----------------------------------------------------------------

@given(case=lookups(dtype=np.float64))
@example(case=PADDED)
def test_backward_matches_finite_differences(case):
    """The padding row is read, so the function does depend on it: padding_idx is a rule about
    the gradient (that row is frozen), so its finite-difference row is set to 0 before comparing."""
    ids, wte, dout, padding_idx = case
    _, cache = embedding_forward(ids, wte, padding_idx)
    dwte = embedding_backward(dout, cache)
    expected = numerical_grad(lambda wte: embedding_forward(ids, wte, padding_idx)[0], wte.copy(), dout)
    if padding_idx is not None:
        expected[padding_idx] = 0
    assert_close("embedding.dwte vs finite differences", dwte, expected, **FD_TOL)


# -- float16 and bfloat16: FlashAttention's error rule -------------------------------------------

@st.composite
def crowded_lookups(draw):
    """(ids, wte, dout, padding_idx) in float64 with up to 64 ids from a vocabulary of 1 to 3: each
    table row sums many dout rows, where adding them in the low dtype (F.embedding) loses digits."""
    V, C = draw(S.dim(1, 3)), draw(S.dim(1, 4))
    ids = draw(S.token_ids(V, (draw(S.dim(16, 64)),)))
    wte = draw(S.arrays(np.float64, (V, C)))
    dout = draw(S.arrays(np.float64, ids.shape + (C,)))
    return ids, wte, dout, draw(st.none() | st.integers(-V, V - 1))


@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", helpers.LOW_DTYPES)
@given(case=crowded_lookups() | lookups(dtype=np.float64))
@example(case=PADDED)
def test_low_precision_meets_the_error_budget(dtype, case):
    """Ours and the twin against float64 truth, within twice the error of PyTorch's own
    low-precision F.embedding, for out (a copy: exact on every side) and dwte."""
    ids, wte, dout, padding_idx = case
    wte, dout = helpers.round_to(wte, dtype), helpers.round_to(dout, dtype)   # what every side shares
    out, cache = embedding_forward(ids, wte, padding_idx)
    dwte = embedding_backward(dout, cache)
    helpers.assert_one_input_budget("embedding", dtype, (out, dwte), _twin(ids, padding_idx),
                                    lambda wte: F.embedding(to_torch(ids), wte, padding_idx), {"wte": wte}, dout)


@pytest.mark.parametrize("dtype", helpers.LOW_DTYPES)
def test_repeated_ids_add_up_in_float32(dtype):
    """One id read 256 times, its dout rows 1 then 255 times a quarter of an ulp of 1: added one
    at a time in the low dtype (F.embedding) each quarter rounds away and the sum stays 1; added
    in float32, the table row is the exact sum rounded once, 1 + 255/4 ulp. The twin has no cast
    (the lookup is exact), so autograd adds in the low dtype as F.embedding does."""
    low, _ = helpers.LOW_DTYPES[dtype]
    quarter = np.spacing(low.type(1)).astype(np.float64) / 4
    dout = np.array([1.0] + [quarter] * 255)[:, None].astype(low)        # (256, 1), exact
    ids = np.zeros(256, np.int64)
    _, cache = embedding_forward(ids, np.zeros((1, 1), low))
    dwte = embedding_backward(dout, cache)
    exact = helpers.round_to(1 + 255 * quarter, dtype)
    _, twin_grads = autograd(_twin(ids, None), {"wte": np.zeros((1, 1), low)}, dout)
    _, torch_grads = autograd(lambda wte: F.embedding(to_torch(ids), wte), {"wte": np.zeros((1, 1), low)}, dout)
    assert dwte.dtype == low and dwte[0, 0] == exact[()], f"embedding.dwte = {dwte[0, 0]}, not {exact}"
    assert np.array_equal(twin_grads["wte"], torch_grads["wte"]), "the twin's dwte differs from F.embedding's"
    assert abs(float(torch_grads["wte"][0, 0]) - (1 + 255 * quarter)) >= abs(float(exact) - (1 + 255 * quarter))


@pytest.mark.parametrize("dtype", helpers.LOW_DTYPES)
def test_low_precision_dout_mix_is_refused(dtype):
    """A float32 dout for a float16/bfloat16 table (and the reverse) is refused, naming both."""
    low = helpers.LOW_DTYPES[dtype][0]
    _, cache = embedding_forward(np.array([0, 1]), np.zeros((2, 3), low))
    with pytest.raises(TypeError, match=f"dout must have the dtype of the forward's output, {dtype}, got float32"):
        embedding_backward(np.zeros((2, 3), np.float32), cache)
    _, cache = embedding_forward(np.array([0, 1]), np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError, match=f"dout must have the dtype of the forward's output, float32, got {dtype}"):
        embedding_backward(np.zeros((2, 3), low), cache)


# -- dtype preservation -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES + tuple(d.type for d, _ in helpers.LOW_DTYPES.values()))
@pytest.mark.parametrize("id_dtype", [np.int32, np.int64, np.uint8])
def test_dtype_is_preserved(dtype, id_dtype):
    wte = np.arange(8, dtype=dtype).reshape(4, 2)
    out, cache = embedding_forward(np.array([3, 0, 3], dtype=id_dtype), wte)
    dwte = embedding_backward(np.ones_like(out), cache)
    assert out.dtype == dtype, f"embedding.out dtype {out.dtype}"
    assert dwte.dtype == dtype, f"embedding.dwte dtype {dwte.dtype}"


def test_accepts_a_list_of_ids():
    out, _ = embedding_forward([2, 0], np.eye(3))
    assert_close("embedding.out from a list", out, np.eye(3)[[2, 0]])


# -- bad input --------------------------------------------------------------------------------------

def test_bad_input():
    wte = np.zeros((5, 3))
    with pytest.raises(ValueError, match=r"^token id 5 is out of range for a vocabulary of size V = 5$"):
        embedding_forward(np.array([0, 5, 2]), wte)
    with pytest.raises(ValueError, match=r"^token id -1 is negative; ids must lie in \[0, V\) with V = 5$"):
        embedding_forward(np.array([[0, -1]]), wte)
    with pytest.raises(TypeError, match="must be integers, got dtype float64"):
        embedding_forward(np.array([0.0, 1.0]), wte)
    with pytest.raises(TypeError, match="must be integers, got dtype bool"):
        embedding_forward(np.array([True, False]), wte)
    with pytest.raises(ValueError, match=r"wte must have 2 dimensions, got shape \(5,\)"):
        embedding_forward(np.array([0]), np.zeros(5))
    with pytest.raises(TypeError, match="^wte must be float16, bfloat16, float32 or float64, got dtype int64$"):
        embedding_forward(np.array([0]), np.zeros((5, 3), dtype=np.int64))
    with pytest.raises(TypeError, match="wte must be a NumPy array, got list"):
        embedding_forward(np.array([0]), [[0.0, 1.0]])
    for bad in (5, -6):
        with pytest.raises(ValueError, match=f"padding_idx = {bad} must lie in \\[-V, V\\) with V = 5"):
            embedding_forward(np.array([0]), wte, padding_idx=bad)
    for bad in (1.0, True, "0"):
        with pytest.raises(TypeError, match=f"^padding_idx must be an integer or None, got {type(bad).__name__}$"):
            embedding_forward(np.array([0]), wte, padding_idx=bad)
    _, cache = embedding_forward(np.array([0, 1]), wte)
    with pytest.raises(ValueError, match=r"embedding_backward: dout must have the shape .* \(2, 3\), got \(3, 2\)"):
        embedding_backward(np.zeros((3, 2)), cache)
    with pytest.raises(TypeError, match="embedding_backward: dout must have the dtype .* float64, got float32"):
        embedding_backward(np.zeros((2, 3), np.float32), cache)


def test_builtin_rejects_out_of_range_too():
    with pytest.raises(IndexError):
        F.embedding(torch.tensor([5]), torch.zeros(5, 3))
