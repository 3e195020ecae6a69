"""Parity tests for numpy_attn/small_gpt.py and torch_attn/small_gpt.py.

The small model has no single built-in: its pieces are tested against theirs in their own files
(embedding, positional, multi_head, linear); here the whole model is checked against autograd
through the twin and against finite differences.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from numpy_attn.gpt import GPTConfig
from numpy_attn.small_gpt import init_small_gpt_params, small_gpt_backward, small_gpt_forward
from parity_tests.helpers import (
    assert_backward_matches_finite_differences,
    assert_bad_ids_refused,
    assert_close,
    assert_tree_close,
    autograd,
    moved_off_init,
    to_torch,
)
from parity_tests.test_gpt import models
from torch_attn.small_gpt import small_gpt


@st.composite
def small_models(draw, dtype=None):
    """(config, params, ids, dout) for the small model, params moved off their initial values."""
    config, _, ids, dout = draw(models(dtype=dtype, n_layer=0))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="seed"))
    params = moved_off_init(init_small_gpt_params(config, rng, dout.dtype), rng)
    return config, params, ids, dout


@given(case=small_models())
def test_small_model_matches_twin_and_autograd(case):
    config, params, ids, dout = case
    logits, cache = small_gpt_forward(ids, params, config)
    dparams = small_gpt_backward(dout, cache)
    twin_logits, grads = autograd(lambda params: small_gpt(to_torch(ids), params, config),
                                  {"params": params}, dout)
    assert_close("small_gpt.logits", logits, twin_logits)
    assert_tree_close("small_gpt", dparams, grads["params"])


@given(case=small_models(dtype=np.float64), seed=st.integers(0, 2**32 - 1))
def test_small_model_matches_finite_differences(case, seed):
    config, params, ids, dout = case
    assert_backward_matches_finite_differences("small_gpt", lambda p: small_gpt_forward(ids, p, config),
                                               small_gpt_backward, params, dout, seed)


# -- bad input --------------------------------------------------------------------------------------

def test_bad_input():
    config = GPTConfig(vocab_size=5, block_size=4, n_layer=0, n_head=2, n_embd=4)
    params = init_small_gpt_params(config, np.random.default_rng(0), np.float64)
    assert_bad_ids_refused(small_gpt_forward, params, config)
    with pytest.raises(TypeError, match="rng must be a np.random.Generator, got int"):
        init_small_gpt_params(config, 0)


def test_bad_dlogits_is_refused():
    config = GPTConfig(vocab_size=5, block_size=4, n_layer=0, n_head=2, n_embd=4)
    params = init_small_gpt_params(config, np.random.default_rng(0), np.float64)
    _, cache = small_gpt_forward(np.zeros((2, 3), int), params, config)
    with pytest.raises(ValueError, match=r"small_gpt_backward: dlogits must have the shape .* \(2, 3, 5\), "
                                         r"got \(3, 2, 5\)"):
        small_gpt_backward(np.zeros((3, 2, 5)), cache)
    with pytest.raises(TypeError, match=r"small_gpt_backward: dlogits must have the dtype .* float64, got float32"):
        small_gpt_backward(np.zeros((2, 3, 5), np.float32), cache)


@pytest.mark.parametrize("bias", [True, False])
def test_init_small_gpt_params(bias):
    """wte and head.w from N(0, 0.02^2), as GPT-2's initialiser (the same check as test_gpt's
    against torch.nn.init.normal_); head.b exactly zero, and present only with config.bias, as
    are the attention's biases; the attention weights are init_multi_head_params'."""
    from parity_tests.test_feed_forward import assert_same_distribution

    config = GPTConfig(vocab_size=512, block_size=4, n_layer=0, n_head=2, n_embd=64, bias=bias)
    params = init_small_gpt_params(config, np.random.default_rng(0), np.float64)
    reference = np.random.default_rng(1).normal(0, 0.02, (512, 64))
    assert_same_distribution("small_gpt.wte", params["wte"], reference)
    assert_same_distribution("small_gpt.head.w", params["head"]["w"], reference.T)
    assert ("b" in params["head"]) == bias, f"small_gpt.head.b present with bias={bias}: {sorted(params['head'])}"
    if bias:
        assert np.array_equal(params["head"]["b"], np.zeros(512)), "small_gpt.head.b is not all zeros"
    assert all(("b" in p) == bias for p in params["attn"].values()), f"small_gpt.attn biases with bias={bias}"
    bound = 1 / np.sqrt(64)
    assert np.abs(params["attn"]["q"]["w"]).max() <= bound, "small_gpt.attn.q.w outside U(-1/sqrt(C), 1/sqrt(C))"
