"""Parity tests for numpy_attn/dropout.py and torch_attn/dropout.py.

F.dropout draws its own mask and cannot be given one, so the twin is compared with the formula
F.dropout applies, x * mask / (1 - p), for the same mask; separate tests check the statistics
(keep rate) and the scale of F.dropout, of the NumPy dropout and of the twin's own draws.
"""

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from numpy_attn.dropout import dropout_backward, dropout_forward
from parity_tests import helpers
from parity_tests import strategies as S
from parity_tests.helpers import assert_close, autograd, numerical_grad, to_numpy, to_torch
from torch_attn.dropout import dropout

probabilities = st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]) | st.floats(0.0, 1.0)


@st.composite
def dropped(draw, dtype=None):
    """(x, dout, p, mask): a keep-mask drawn by Hypothesis, so all-kept and all-dropped occur.

    At p = 0 the mask keeps everything, as any mask drawn at p = 0 would (and dropout ignores it).
    """
    dtype = draw(S.dtypes) if dtype is None else dtype
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6))
    x, dout = draw(S.arrays(dtype, shape)), draw(S.arrays(dtype, shape))
    p = draw(probabilities)
    return x, dout, p, draw(hnp.arrays(np.bool_, shape)) | (p == 0)


ONE_DROPPED = (np.array([1.0, -2.0, 3.0]), np.array([0.5, 0.25, -1.0]), 0.5,
               np.array([True, False, True]))


# -- forward matches the twin -----------------------------------------------------------------

@given(case=dropped())
@example(case=ONE_DROPPED)
def test_forward_matches_twin(case):
    """Exactly: the same mask and the same two elementwise products in the same dtype."""
    x, _, p, mask = case
    out, _ = dropout_forward(x, p, mask=mask)
    assert_close("dropout.out", out, to_numpy(dropout(to_torch(x), p, mask=to_torch(mask))),
                 rtol=0, atol=0)


# -- backward matches autograd ----------------------------------------------------------------

@pytest.mark.twin_parity
@given(case=dropped())
@example(case=ONE_DROPPED)
def test_backward_matches_autograd(case):
    x, dout, p, mask = case
    _, cache = dropout_forward(x, p, mask=mask)
    dx = dropout_backward(dout, cache)
    _, grads = autograd(lambda x: dropout(x, p, mask=to_torch(mask)), {"x": x}, dout)
    assert_close("dropout.dx", dx, grads["x"])


# -- the twin matches PyTorch's built-in --------------------------------------------------------

@given(case=dropped())
def test_twin_matches_builtin_formula(case):
    """F.dropout(x, p) is x * mask / (1 - p) for its own mask; the twin is that for ours. At
    p = 1 F.dropout itself is deterministic (zeros, zero gradient), whatever mask we pass."""
    x, dout, p, mask = case
    twin_out, twin_grads = autograd(lambda x: dropout(x, p, mask=to_torch(mask)), {"x": x}, dout)
    formula = (lambda x: F.dropout(x, 1.0)) if p == 1 else (lambda x: x * to_torch(mask) / (1 - p))
    formula_out, formula_grads = autograd(formula, {"x": x}, dout)
    assert_close("dropout.out vs x * mask / (1 - p)", twin_out, formula_out)
    assert_close("dropout.dx vs x * mask / (1 - p)", twin_grads["x"], formula_grads["x"])


@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
def test_p_one_gives_zeros_as_builtin(dtype):
    """p = 1 drops every entry: zeros and zero gradients (F.dropout's result), never 0 * inf."""
    x = np.array([[1.0, -2.0, 3.0], [0.5, 0.0, -4.0]], dtype)
    dout = np.array([[0.5, 1.0, -1.0], [2.0, -3.0, 0.25]], dtype)
    out, cache = dropout_forward(x, 1.0, rng=np.random.default_rng(0))
    dx = dropout_backward(dout, cache)
    builtin_out, builtin_grads = autograd(lambda x: F.dropout(x, 1.0), {"x": x}, dout)
    assert_close("dropout.out at p = 1 vs F.dropout", out, builtin_out, rtol=0, atol=0)
    assert_close("dropout.dx at p = 1 vs F.dropout", dx, builtin_grads["x"], rtol=0, atol=0)
    twin_out, twin_grads = autograd(lambda x: dropout(x, 1.0, torch.Generator().manual_seed(0)),
                                    {"x": x}, dout)
    assert_close("twin dropout.out at p = 1", twin_out, builtin_out, rtol=0, atol=0)
    assert_close("twin dropout.dx at p = 1", twin_grads["x"], builtin_grads["x"], rtol=0, atol=0)


@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
def test_p_one_needs_no_rng_and_draws_nothing(dtype):
    """p = 1 keeps nothing, so there is nothing to draw: without an rng the output is zeros and
    the gradient zero (F.dropout(x, 1.0)), and a given rng is left where it was, as F.dropout
    leaves torch's generator. The twin without a generator does the same."""
    x = S.ramp(3, 4, dtype=dtype) * 4
    dout = S.ramp(3, 4, dtype=dtype)[::-1].copy()
    out, cache = dropout_forward(x, 1.0)
    builtin_out, builtin_grads = autograd(lambda x: F.dropout(x, 1.0), {"x": x}, dout)
    assert_close("dropout.out at p = 1 without rng vs F.dropout", out, builtin_out, rtol=0, atol=0)
    assert_close("dropout.dx at p = 1 without rng vs F.dropout", dropout_backward(dout, cache),
                 builtin_grads["x"], rtol=0, atol=0)
    rng = np.random.default_rng(5)
    dropout_forward(x, 1.0, rng=rng)
    assert rng.random() == np.random.default_rng(5).random(), "dropout at p = 1 drew from rng"
    with torch.random.fork_rng():
        torch.manual_seed(3)
        twin_out, twin_grads = autograd(lambda x: dropout(x, 1.0), {"x": x}, dout)
        after = torch.rand(1)
        torch.manual_seed(3)
        assert torch.equal(after, torch.rand(1)), "twin dropout at p = 1 drew from torch's generator"
    assert_close("twin dropout.out at p = 1 without rng", twin_out, builtin_out, rtol=0, atol=0)
    assert_close("twin dropout.dx at p = 1 without rng", twin_grads["x"], builtin_grads["x"], rtol=0, atol=0)


class _Draws(np.random.Generator):
    """A Generator whose ``random`` returns the given draws: the keep rule meets chosen values."""

    def __init__(self, draws):
        super().__init__(np.random.PCG64(0))
        self.draws = draws

    def random(self, size=None, dtype=np.float64, out=None):
        return np.asarray(self.draws, dtype).reshape(size)


@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
@pytest.mark.parametrize("p", [0.25, 0.5, 0.75])
def test_keep_rule_at_the_boundary(p, dtype, monkeypatch):
    """PyTorch's rule, Bernoulli(1 - p): keep where the draw u is < 1 - p. A draw of exactly
    1 - p is dropped, the one below it kept; a draw of exactly p is kept only when p < 1 - p (the
    rule u >= p would keep it always, and u > p never). The twin, fed the same draws through
    torch.rand, decides the same."""
    t = dtype(1 - p)
    draws = np.array([t, np.nextafter(t, dtype(0)), dtype(p), dtype(0), np.nextafter(dtype(1), dtype(0))],
                     dtype)
    expected = np.array([False, True, p < 1 - p, True, False])
    x = np.arange(1, 6, dtype=dtype)
    out, (mask, *_) = dropout_forward(x, p, rng=_Draws(draws))
    np.testing.assert_array_equal(mask, expected, err_msg=f"dropout keep-mask at p = {p}, draws {draws}")
    monkeypatch.setattr(torch, "rand", lambda *args, **kwargs: to_torch(draws))
    twin_out = to_numpy(dropout(to_torch(x), p, rng=None))
    np.testing.assert_array_equal(twin_out != 0, expected, err_msg=f"twin dropout keep-mask at p = {p}")
    assert_close("twin dropout.out on the boundary draws", twin_out, out, rtol=0, atol=0)


def _check_dropout_statistics(name, x, out, p):
    """Every entry is 0 or x / (1 - p), and the kept share is within 5 standard deviations of
    1 - p (a false alarm once in 3.5 million; the seeds are fixed, so never flaky)."""
    kept = out != 0
    assert_close(f"{name} kept entries", out[kept], (x[kept] / (1 - p)).astype(x.dtype))
    n = x.size
    sigma = np.sqrt(n * p * (1 - p))
    assert abs(kept.sum() - n * (1 - p)) <= 5 * sigma, \
        f"{name}: kept {kept.sum()} of {n} at p = {p}, expected {n * (1 - p):.0f} +- {5 * sigma:.0f}"


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_builtin_keep_rate_and_scale(p):
    x = np.random.default_rng(1).uniform(1, 2, 100_000)    # no zeros, so out == 0 means dropped
    with torch.random.fork_rng():
        torch.manual_seed(0)
        out = to_numpy(F.dropout(to_torch(x), p, training=True))
    _check_dropout_statistics("F.dropout", x, out, p)


# -- properties ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_and_scale(p, dtype):
    """The NumPy draw (np.random.Generator) and the twin's own draw (torch.Generator)."""
    x = np.random.default_rng(1).uniform(1, 2, 100_000).astype(dtype)
    out, _ = dropout_forward(x, p, rng=np.random.default_rng(0))
    _check_dropout_statistics("dropout", x, out, p)
    twin_out = to_numpy(dropout(to_torch(x), p, rng=torch.Generator().manual_seed(0)))
    _check_dropout_statistics("twin dropout", x, twin_out, p)


@given(case=dropped(), training=st.booleans())
@example(case=ONE_DROPPED[:2] + (1.0, ONE_DROPPED[3]), training=False)
def test_identity_when_p_is_zero_or_not_training(case, training):
    """Any p in [0, 1] when not training (p = 1 included), p = 0 when training: no rng is needed,
    nothing is drawn, F.dropout returns x. The backward passes dout through as a fresh array."""
    x, dout, p, _ = case
    p = 0.0 if training else p
    out, cache = dropout_forward(x, p, rng=None, training=training)
    assert_close("dropout.out as identity", out, x, rtol=0, atol=0)
    dx = dropout_backward(dout, cache)
    assert_close("dropout.dx as identity", dx, dout, rtol=0, atol=0)
    assert not np.shares_memory(dx, dout), "dropout.dx as identity is dout itself, not a copy"
    builtin = to_numpy(F.dropout(to_torch(x), p, training=training))
    assert_close("twin dropout.out as identity", to_numpy(dropout(to_torch(x), p, training=training)),
                 builtin, rtol=0, atol=0)
    assert_close("F.dropout as identity", builtin, x, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES + tuple(d.type for d, _ in helpers.LOW_DTYPES.values()))
def test_identity_passes_a_read_only_x_through_uncopied(dtype):
    """With p = 0 or in evaluation a read-only x (softmax's weights in attention) comes back as x
    itself: nothing can change it through the output, so the copy a writeable x gets is not needed."""
    x = S.ramp(2, 3, dtype=dtype)
    x.flags.writeable = False
    for p, training in ((0.0, True), (0.5, False)):
        out, cache = dropout_forward(x, p, training=training)
        assert out is x, f"dropout(p={p}, training={training}) copied a read-only x"
        dout = S.ramp(2, 3, dtype=dtype)[::-1].copy()
        assert_close("dropout.dx as identity", dropout_backward(dout, cache), dout, rtol=0, atol=0)


@given(case=dropped())
def test_gradient_shares_no_memory(case):
    """dx is a fresh array: never dout, x, the cached mask, or the forward's output."""
    x, dout, p, mask = case
    out, cache = dropout_forward(x, p, mask=mask)
    dx = dropout_backward(dout, cache)
    for name, a in (("dout", dout), ("x", x), ("out", out), ("cache.mask", cache[0])):
        assert a is None or not np.shares_memory(dx, a), f"dropout.dx shares memory with {name}"


def test_same_seed_same_mask():
    x = np.ones((4, 64))
    a, _ = dropout_forward(x, 0.5, rng=np.random.default_rng(7))
    b, _ = dropout_forward(x, 0.5, rng=np.random.default_rng(7))
    c, _ = dropout_forward(x, 0.5, rng=np.random.default_rng(8))
    assert np.array_equal(a, b), "the same seed gave different masks"
    assert not np.array_equal(a, c), "different seeds gave the same 256-entry mask"


# -- finite differences (no torch) ----------------------------------------------------------------

@given(case=dropped(dtype=np.float64))
@example(case=ONE_DROPPED[:2] + (0.9999999999999999, ONE_DROPPED[3]))   # scale 9e15
def test_backward_matches_finite_differences(case):
    x, dout, p, mask = case
    _, cache = dropout_forward(x, p, mask=mask)
    dx = dropout_backward(dout, cache)
    f = lambda x: dropout_forward(x, p, mask=mask)[0]   # noqa: E731
    expected = numerical_grad(f, x.copy(), dout)
    # The outputs reach 9e15 for p near 1, and the stencil's rounding with them (its bound).
    assert_close("dropout.dx vs finite differences", dx, expected, **helpers.elementwise_fd_tol(f, x, dout))


# -- float16 and bfloat16: FlashAttention's error rule -------------------------------------------

LOW_TYPES = tuple(d.type for d, _ in helpers.LOW_DTYPES.values())


@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", helpers.LOW_DTYPES)
@given(case=dropped(dtype=np.float64))
@example(case=ONE_DROPPED[:2] + (0.1, ONE_DROPPED[3]))
def test_low_precision_meets_the_error_budget(dtype, case):
    """Ours and the twin against float64 truth, within twice the error of x * keep * scale written
    with plain torch ops in the low dtype (F.dropout's formula; it cannot take a mask), for the
    same mask on every side, for out and dx."""
    x, dout, p, mask = case
    x, dout = helpers.round_to(x, dtype), helpers.round_to(dout, dtype)         # the inputs every side shares
    out, cache = dropout_forward(x, p, mask=mask)
    dx = dropout_backward(dout, cache)
    scale = 0.0 if p == 1 else 1 / (1 - p)
    helpers.assert_one_input_budget("dropout", dtype, (out, dx), lambda x: dropout(x, p, mask=to_torch(mask)),
                                    lambda x: x * to_torch(mask) * scale, {"x": x}, dout)


@pytest.mark.parametrize("dtype", helpers.LOW_DTYPES)
def test_low_precision_draws_and_dout_mix(dtype):
    """A low-precision x draws its mask from an rng as float32 (the same mask as a float32 x of
    the same seed); a float32 dout for its output is refused, naming both dtypes."""
    low = helpers.LOW_DTYPES[dtype][0]
    x = np.ones((4, 64), low)
    out, cache = dropout_forward(x, 0.5, rng=np.random.default_rng(7))
    out32, _ = dropout_forward(np.ones((4, 64), np.float32), 0.5, rng=np.random.default_rng(7))
    assert out.dtype == low and np.array_equal(out.astype(np.float32), out32), "low-dtype dropout drew another mask"
    with pytest.raises(TypeError, match=f"dout must have the dtype of the forward's output, {dtype}, got float32"):
        dropout_backward(np.ones((4, 64), np.float32), cache)


# -- dtype preservation -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES + LOW_TYPES)
def test_dtype_is_preserved(dtype):
    x = np.array([[1.0, -2.0], [3.0, 0.5]], dtype=dtype)
    # A p given as a NumPy float64 must not upcast float32.
    out, cache = dropout_forward(x, np.float64(0.25), rng=np.random.default_rng(0))
    dx = dropout_backward(np.full_like(x, 0.5), cache)
    assert out.dtype == dtype, f"dropout.out dtype {out.dtype}"
    assert dx.dtype == dtype, f"dropout.dx dtype {dx.dtype}"


# -- bad upstream gradients --------------------------------------------------------------------------

@given(case=dropped(), training=st.booleans())
def test_bad_dout_is_refused(case, training):
    """With a mask and as the identity (not training), whose cache holds no mask: a dout of another
    shape, layout, dtype or type is refused; a NaN in a right one flows on as in autograd."""
    x, dout, p, mask = case
    out, cache = dropout_forward(x, p, mask=mask, training=training)
    helpers.assert_bad_dout_refused("dropout_backward", out, dropout_backward, cache)
    dout.flat[0] = np.nan
    _, grads = autograd(lambda x: dropout(x, p, training=training, mask=to_torch(mask)), {"x": x}, dout)
    assert_close("dropout.dx with a NaN in dout", dropout_backward(dout, cache), grads["x"])


# -- bad input --------------------------------------------------------------------------------------

def test_bad_input():
    x, rng = np.zeros((2, 3)), np.random.default_rng(0)
    for p in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match=f"dropout probability p must lie in \\[0, 1\\], got {p}"):
            dropout_forward(x, p, rng=rng)
    needs_rng = "dropout with p = 0.5 in training (and no mask) needs rng: rng must be a np.random.Generator, got "
    with pytest.raises(TypeError, match=re.escape(needs_rng + "NoneType")):
        dropout_forward(x, 0.5)
    with pytest.raises(TypeError, match=re.escape(needs_rng + "int")):
        dropout_forward(x, 0.5, rng=0)
    with pytest.raises(ValueError, match=r"mask must be boolean of x's shape \(2, 3\), got bool \(3,\)"):
        dropout_forward(x, 0.5, mask=np.ones(3, dtype=bool))
    with pytest.raises(TypeError, match=r"got float64 \(2, 3\)"):
        dropout_forward(x, 0.5, mask=np.ones((2, 3)))
    with pytest.raises(TypeError, match="x must be float16, bfloat16, float32 or float64, got dtype int64"):
        dropout_forward(np.arange(3), 0.5, rng=rng)
    with pytest.raises(TypeError, match="x must be a NumPy array, got list"):
        dropout_forward([1.0, 2.0], 0.5, rng=rng)
    # Nothing is drawn at p = 0 or p = 1, so an rng that is not a Generator goes unused there.
    assert_close("dropout.out at p = 0 with rng=0", dropout_forward(x + 1, 0.0, rng=0)[0], x + 1, rtol=0, atol=0)
    assert_close("dropout.out at p = 1 with rng=0", dropout_forward(x + 1, 1.0, rng=0)[0], x, rtol=0, atol=0)
