"""Every backward refuses an upstream gradient unlike its forward's output, naming itself.

A dout of the wrong shape (a transposed layout included) would broadcast or reshape into a wrong
gradient without a word, and one of another dtype would silently turn float32 gradients into
float64; both are refused through numpy_attn._checks.check_dout, TypeError for a wrong type or
dtype (an int array too), ValueError for a wrong shape. The messages name the backward and the
expected and received shape or dtype. One parametrised test per kind of mistake, over every
operation: each case draws the operation's inputs with Hypothesis, runs its forward and hands the
backward a wrong dout.
"""

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from numpy_attn.block import block_backward, block_forward, init_block_params
from numpy_attn.dropout import dropout_backward, dropout_forward
from numpy_attn.embedding import embedding_backward, embedding_forward
from numpy_attn.feed_forward import (
    feed_forward_backward,
    feed_forward_forward,
    init_feed_forward_params,
)
from numpy_attn.gelu import gelu_backward, gelu_forward
from numpy_attn.gpt import GPTConfig, gpt_backward, gpt_forward, init_gpt_params
from numpy_attn.layer_norm import layer_norm_backward, layer_norm_forward
from numpy_attn.linear import linear_backward, linear_forward
from numpy_attn.loss import cross_entropy_backward, cross_entropy_forward
from numpy_attn.small_gpt import init_small_gpt_params, small_gpt_backward, small_gpt_forward
from numpy_attn.softmax import (
    log_softmax_backward,
    log_softmax_forward,
    softmax_backward,
    softmax_forward,
)
from parity_tests import strategies as S
from parity_tests.helpers import assert_close


@st.composite
def sizes(draw):
    """(dtype, B, T, C, rng): T != C by construction, so that swapping the last two axes changes
    the shape (a square transposed layout would be indistinguishable, and right, by shape)."""
    dtype = draw(S.dtypes)
    B, T = draw(S.dim(1, 2)), draw(S.dim(1, 3))
    C = 2 * (T + draw(S.dim(0, 1)))            # even (two heads of hs = C / 2) and > T
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="seed"))
    return dtype, B, T, C, rng


# Each case: (draw) -> (backward name, dout name, out, backward, cache).

def _embedding(draw):
    dtype, B, T, C, rng = draw(sizes())
    wte = draw(S.arrays(dtype, (5, C)))
    out, cache = embedding_forward(draw(S.token_ids(5, (B, T))), wte)
    return "embedding_backward", "dout", out, embedding_backward, cache


def _softmax(draw):
    dtype, B, T, C, rng = draw(sizes())
    out, cache = softmax_forward(draw(S.arrays(dtype, (B, T, C))))
    return "softmax_backward", "dy", out, softmax_backward, cache


def _log_softmax(draw):
    dtype, B, T, C, rng = draw(sizes())
    out, cache = log_softmax_forward(draw(S.arrays(dtype, (B, T, C))))
    return "log_softmax_backward", "dy", out, log_softmax_backward, cache


def _linear(draw):
    dtype, B, T, C, rng = draw(sizes())
    w, b = draw(S.arrays(dtype, (3, C))), draw(S.arrays(dtype, (C,)))
    out, cache = linear_forward(draw(S.arrays(dtype, (B, T, 3))), w, b)
    return "linear_backward", "dout", out, linear_backward, cache


def _layer_norm(draw):
    dtype, B, T, C, rng = draw(sizes())
    w, b = draw(S.arrays(dtype, (C,))), draw(S.arrays(dtype, (C,)))
    out, cache = layer_norm_forward(draw(S.arrays(dtype, (B, T, C))), w, b)
    return "layer_norm_backward", "dout", out, layer_norm_backward, cache


def _gelu(draw):
    dtype, B, T, C, rng = draw(sizes())
    out, cache = gelu_forward(draw(S.arrays(dtype, (B, T, C))), draw(st.sampled_from(["none", "tanh"])))
    return "gelu_backward", "dout", out, gelu_backward, cache


def _dropout(draw):
    """With a drawn mask, and as the identity (p = 0), whose cache holds no mask."""
    dtype, B, T, C, rng = draw(sizes())
    p = draw(st.sampled_from([0.0, 0.5]))
    out, cache = dropout_forward(draw(S.arrays(dtype, (B, T, C))), p, rng=rng)
    return "dropout_backward", "dout", out, dropout_backward, cache


def _feed_forward(draw):
    dtype, B, T, C, rng = draw(sizes())
    params = init_feed_forward_params(C, rng, dtype=dtype)
    out, cache = feed_forward_forward(draw(S.arrays(dtype, (B, T, C))), params)
    return "feed_forward_backward", "dout", out, feed_forward_backward, cache


def _block(draw):
    dtype, B, T, C, rng = draw(sizes())
    params = init_block_params(C, rng, dtype=dtype)
    out, cache = block_forward(draw(S.arrays(dtype, (B, T, C))), params, 2)
    return "block_backward", "dout", out, block_backward, cache


def _config(draw, C, T):
    """V > T, so that the logits (B, T, V) transposed differ in shape."""
    return GPTConfig(vocab_size=T + draw(S.dim(1, 4)), block_size=T, n_layer=draw(st.integers(0, 1)),
                     n_head=2, n_embd=C, tie_weights=draw(st.booleans()))


def _model(draw, init_params, forward, backward):
    """A model's case: a tiny config, its initial params and repeating ids (B, T)."""
    dtype, B, T, C, rng = draw(sizes())
    config = _config(draw, C, T)
    params = init_params(config, rng, dtype)
    out, cache = forward(draw(S.token_ids(config.vocab_size, (B, T))), params, config)
    return backward.__name__, "dlogits", out, backward, cache


def _gpt(draw):
    return _model(draw, init_gpt_params, gpt_forward, gpt_backward)


def _small_gpt(draw):
    return _model(draw, init_small_gpt_params, small_gpt_forward, small_gpt_backward)


def _cross_entropy(draw):
    dtype, B, T, C, rng = draw(sizes())
    logits = draw(S.arrays(dtype, (B, T, C)))
    out, cache = cross_entropy_forward(logits, draw(S.token_ids(C, (B, T))))
    return "cross_entropy_backward", "dloss", out, cross_entropy_backward, cache


# Each case draws (backward name, dout name, out, backward, cache): case[2] is the forward's output.
CASES = {f.__name__[1:]: f for f in (_embedding, _softmax, _log_softmax, _linear, _layer_norm,
                                     _gelu, _dropout, _feed_forward, _block, _gpt, _small_gpt,
                                     _cross_entropy)}
OPS = pytest.mark.parametrize("op", list(CASES))


def _assert_refused(error, case, dout, *mentions):
    """The backward of ``case`` (a CASES tuple) refuses ``dout`` with ``error``, and its message
    names the backward, the argument and every one of ``mentions`` (the expected and the received
    shape or dtype)."""
    name, dout_name, _, backward, cache = case
    with pytest.raises(error) as info:
        backward(dout, cache)
    message = str(info.value)
    missing = [text for text in (f"{name}: {dout_name}",) + mentions if text not in message]
    assert not missing, f"{name}: {missing} not in {message}"


@OPS
@given(data=st.data())
def test_wrong_shape_is_refused(op, data):
    """One more entry along the last axis (a 0-d loss: a 1-element vector)."""
    case = CASES[op](data.draw)
    out = case[2]
    shape = out.shape[:-1] + (out.shape[-1] + 1,) if out.ndim else (1,)
    _assert_refused(ValueError, case, data.draw(S.arrays(out.dtype, shape)), str(out.shape), str(shape))


@OPS
@given(data=st.data())
def test_transposed_layout_is_refused(op, data):
    """The right numbers in the wrong layout: the last two axes swapped (0-d: not applicable)."""
    case = CASES[op](data.draw)
    out = case[2]
    if out.ndim < 2:
        pytest.skip(f"{op}'s output has {out.ndim} dimensions: nothing to transpose")
    dout = data.draw(S.arrays(out.dtype, out.shape)).swapaxes(-1, -2)
    _assert_refused(ValueError, case, dout, str(out.shape), str(dout.shape))


@OPS
@given(data=st.data())
def test_wrong_dtype_is_refused(op, data):
    """The other float dtype: float64 would upcast float32 gradients, float32 would round float64."""
    case = CASES[op](data.draw)
    out = case[2]
    other = np.float32 if out.dtype == np.float64 else np.float64
    _assert_refused(TypeError, case, data.draw(S.arrays(other, out.shape)), str(out.dtype), str(np.dtype(other)))


@OPS
@given(data=st.data())
def test_int_array_is_refused(op, data):
    case = CASES[op](data.draw)
    dout = data.draw(S.token_ids(3, case[2].shape))
    _assert_refused(TypeError, case, dout, str(case[2].dtype), str(dout.dtype))


@OPS
@given(data=st.data())
def test_non_array_is_refused(op, data):
    """A nested list of the right shape: refused, not converted (its dtype would be a guess)."""
    case = CASES[op](data.draw)
    out = case[2]
    _assert_refused(TypeError, case, np.zeros(out.shape).tolist() if out.ndim else [0.0], str(out.shape), "list")


@OPS
@given(data=st.data())
def test_right_dout_is_accepted(op, data):
    """The control: a dout of the output's shape and dtype goes through, and the checks leave the
    gradients' dtype alone."""
    name, dout_name, out, backward, cache = CASES[op](data.draw)
    grads = backward(data.draw(S.arrays(out.dtype, out.shape)), cache)
    leaves = [grads] if isinstance(grads, np.ndarray) else []
    stack = [grads] if not leaves else []
    while stack:
        item = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        for child in children:
            (leaves if isinstance(child, np.ndarray) else stack).append(child)
    assert leaves, f"{name} returned no arrays"
    for leaf in leaves:
        assert leaf.dtype == out.dtype, f"{name} returned a {leaf.dtype} gradient for {out.dtype}"


def test_loss_accepts_a_float_scalar_as_dloss():
    """The one exception, documented in cross_entropy_backward: a Python or NumPy float scalar is
    the 1 of loss.backward() and is cast to the loss's dtype; a 0-d array must match it."""
    logits = np.array([[1.0, -2.0, 0.5]], np.float32)
    _, cache = cross_entropy_forward(logits, np.array([2]))
    for dloss in (0.5, np.float64(0.5), np.float32(0.5)):
        assert cross_entropy_backward(dloss, cache).dtype == np.float32, f"dloss {dloss!r}"
    with pytest.raises(TypeError, match=re.escape("dloss must have the dtype of the forward's "
                                                  "output, float32, got float64")):
        cross_entropy_backward(np.array(0.5), cache)
    with pytest.raises(TypeError, match="dloss must be a NumPy array of shape"):
        cross_entropy_backward(1, cache)


# -- outputs and gradients are fresh arrays -----------------------------------------------------------

def _arrays(tree):
    """Every NumPy array in a nested structure of tuples, lists, dicts and NamedTuples."""
    if isinstance(tree, np.ndarray):
        return [tree]
    if isinstance(tree, dict):
        tree = list(tree.values())
    if isinstance(tree, tuple | list):
        return [a for item in tree for a in _arrays(item)]
    return []


@OPS
@given(data=st.data())
def test_output_shares_no_memory_with_cache(op, data):
    """Changing the returned output in place (y *= 2) must not reach the backward: the output
    shares no memory with anything in the cache, or is read-only (softmax's y, which its cache holds)."""
    name, _, out, _, cache = CASES[op](data.draw)
    for i, a in enumerate(_arrays(cache)):
        assert not out.flags.writeable or not np.shares_memory(out, a), \
            f"{op}: the output shares memory with cache array {i}"


@OPS
@given(data=st.data())
def test_gradients_share_no_memory_with_dout_or_cache(op, data):
    """Every returned gradient is a fresh array: none shares memory with dout, with the cache, or
    with another returned gradient (a caller accumulating into one would corrupt the others)."""
    name, _, out, backward, cache = CASES[op](data.draw)
    dout = data.draw(S.arrays(out.dtype, out.shape))
    grads = _arrays(backward(dout, cache))
    for i, g in enumerate(grads):
        assert not np.shares_memory(g, dout), f"{name}: gradient {i} shares memory with dout"
        for j, a in enumerate(_arrays(cache)):
            assert not np.shares_memory(g, a), f"{name}: gradient {i} shares memory with cache array {j}"
        for j, h in enumerate(grads[:i]):
            assert not np.shares_memory(g, h), f"{name}: gradients {j} and {i} share memory"


@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
def test_softmax_output_changed_in_place_leaves_the_gradient_alone(dtype):
    x, dy = S.ramp(3, 4, dtype=dtype), S.ramp(3, 4, dtype=dtype)[::-1].copy()
    y, cache = softmax_forward(x)
    expected = softmax_backward(dy, softmax_forward(x)[1])
    with pytest.raises(ValueError, match="read-only"):   # y is the cached array itself, read-only
        y *= 2
    assert_close("softmax.dx after y *= 2", softmax_backward(dy, cache), expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
def test_dropout_identity_returns_a_copy(dtype):
    """With p = 0 or in evaluation the output equals x but is not x: out *= 2 leaves x alone."""
    x = S.ramp(2, 3, dtype=dtype)
    for p, training in ((0.0, True), (0.5, False)):
        out, _ = dropout_forward(x, p, training=training)
        assert not np.shares_memory(out, x), f"dropout(p={p}, training={training}) returned x itself"
