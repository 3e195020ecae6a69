"""Parity tests for numpy_attn/small_gpt.py and torch_attn/small_gpt.py.

The small model has no single built-in: its pieces are tested against theirs in their own files
(embedding, positional, multi_head, linear); here the whole model is checked against autograd
through the twin and against finite differences.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks import convert
from numpy_attn.gpt import GPTConfig
from numpy_attn.small_gpt import init_small_gpt_params, small_gpt_backward, small_gpt_forward
from parity_tests.helpers import (
    LOW_DTYPES,
    assert_backward_matches_finite_differences,
    assert_bad_ids_refused,
    assert_close,
    assert_error_budget,
    assert_tree_close,
    autograd,
    moved_off_init,
    round_to,
    to_numpy,
    to_torch,
    tree_leaves,
    tree_map,
    tree_to_torch,
)
from parity_tests.model_kit import GRAD_MULTIPLE, gpt_budget_models, gpt_models, sinusoid_closed_form
from torch_attn.small_gpt import small_gpt


@st.composite
def small_models(draw, dtype=None):
    """(config, params, ids, dout) for the small model, params moved off their initial values."""
    config, _, ids, dout = draw(gpt_models(dtype=dtype, n_layer=0))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="seed"))
    params = moved_off_init(init_small_gpt_params(config, rng, dout.dtype), rng)
    return config, params, ids, dout


@pytest.mark.twin_parity
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


# -- float16 and bfloat16: FlashAttention's error rule against PyTorch's built-ins ----------------

def _builtin_small_gpt(config, params, ids, dout):
    """The small model written with PyTorch's built-ins holding ``params`` in their dtype: F.embedding,
    the sinusoidal table (test_gpt's closed form, rounded to that dtype), nn.MultiheadAttention (causal)
    and F.linear. Returns the logits and the gradients of sum(logits * dout) by our dotted paths."""
    C, T = config.n_embd, ids.shape[1]
    tparams = tree_to_torch(params, requires_grad=True)
    mha = torch.nn.MultiheadAttention(C, config.n_head, bias=config.bias, batch_first=True,
                                      dtype=tparams["wte"].dtype)
    mha.load_state_dict(convert.to_mha(tparams["attn"]))
    x = F.embedding(to_torch(ids), tparams["wte"]) + sinusoid_closed_form(T, params["wte"])
    mask = torch.nn.Transformer.generate_square_subsequent_mask(T, dtype=x.dtype)
    x, _ = mha(x, x, x, attn_mask=mask, is_causal=True, need_weights=False)
    logits = F.linear(x, tparams["head"]["w"].T, tparams["head"].get("b"))
    (logits * to_torch(dout)).sum().backward()
    grads = {f"attn.{path}": to_numpy(g) for path, g in tree_leaves(convert.from_mha(
        {name: p.grad for name, p in mha.named_parameters()}))}
    return to_numpy(logits), {"wte": to_numpy(tparams["wte"].grad), **grads,
                              **{f"head.{k}": to_numpy(p.grad) for k, p in tparams["head"].items()}}


# The model, its twin and two built-in programs: a handful of examples.
@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@settings(max_examples=10)
@given(case=gpt_budget_models(n_layer=0), seed=st.integers(0, 2**32 - 1))
def test_low_precision_meets_the_error_budget(dtype, case, seed):
    """Ours and the twin in float16 and bfloat16 against the built-ins of _builtin_small_gpt in float64
    on the same rounded weights, within twice the error of those built-ins run in the low dtype."""
    config, _, ids, dout = case
    rng = np.random.default_rng(seed)
    params = moved_off_init(init_small_gpt_params(config, rng, np.float64), rng)
    params, dout = tree_map(lambda p: round_to(p, dtype), params), round_to(dout, dtype)
    logits, cache = small_gpt_forward(ids, params, config)
    grads = dict(tree_leaves(small_gpt_backward(dout, cache)))
    twin_logits, twin_grads = autograd(lambda params: small_gpt(to_torch(ids), params, config), {"params": params},
                                       dout)
    lowp_logits, lowp_grads = _builtin_small_gpt(config, params, ids, dout)
    truth_logits, truth_grads = _builtin_small_gpt(config, tree_map(lambda p: p.astype(np.float64), params), ids,
                                                   dout.astype(np.float64))
    twin_grads = dict(tree_leaves(twin_grads["params"]))
    for who, (out, g) in {"numpy": (logits, grads), "twin": (twin_logits, twin_grads)}.items():
        assert_error_budget(f"small_gpt[{who}]", dtype, {"logits": (out, lowp_logits, truth_logits)})
        assert_error_budget(f"small_gpt[{who}]", dtype, {f"d{path}": (g[path], lowp_grads[path], truth_grads[path])
                                                         for path in truth_grads if path != "attn.k.b"},
                            multiple=GRAD_MULTIPLE)   # model_kit.GRAD_MULTIPLE says why; k.b: see test_block


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
    from parity_tests.helpers import assert_same_distribution

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
