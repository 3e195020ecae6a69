"""Parity tests for numpy_attn/gpt.py and torch_attn/gpt.py, and training parity with AdamW."""

import dataclasses
from functools import partial

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import nn

from numpy_attn import optim
from numpy_attn._model import head_backward
from numpy_attn._tree import flatten
from numpy_attn.gpt import (
    GPTConfig,
    gpt_backward,
    gpt_forward,
    init_gpt_params,
)
from numpy_attn.layer_norm import layer_norm_backward
from numpy_attn.loss import cross_entropy_backward, cross_entropy_forward
from parity_tests import strategies as S
from parity_tests.helpers import (
    LOW_DTYPES,
    assert_backward_matches_finite_differences,
    assert_bad_ids_refused,
    assert_close,
    assert_error_budget,
    assert_grads_match_autograd,
    assert_logits_match_twin,
    assert_tree_close,
    autograd,
    layer_norm_rstds,
    layer_norm_tol,
    moved_off_init,
    randomly_rounded,
    reorder_tol,
    round_to,
    to_numpy,
    to_torch,
    tree_leaves,
    tree_map,
    tree_to_torch,
)
from parity_tests.model_kit import (
    GRAD_MULTIPLE,
    assert_keeps_the_last_logits,
    builtin_gpt,
    gpt_budget_case,
    gpt_budget_models,
    gpt_models,
    with_zero_biases,
)
from torch_attn import optim as torch_optim
from torch_attn.gpt import gpt
from torch_attn.loss import cross_entropy


def _pinned_case():
    """Tied weights, learned positions, two layers, repeated ids, float64."""
    config = GPTConfig(vocab_size=5, block_size=4, n_layer=2, n_head=2, n_embd=4)
    rng = np.random.default_rng(1)
    params = moved_off_init(init_gpt_params(config, rng, np.float64), rng)
    ids = np.array([[1, 3, 1, 1]])
    return config, params, ids, rng.normal(size=ids.shape + (config.vocab_size,))


def _ln_tol(cache, dtype):
    """Tolerance widened by the rstd of every layer norm of the model (see layer_norm_tol)."""
    return layer_norm_tol(layer_norm_rstds(cache), dtype)


def _twin(config, ids, **kw):
    """The torch twin as a function of its parameters only, for autograd()."""
    return lambda params: gpt(to_torch(ids), params, config, **kw)


# -- forward matches the twin -----------------------------------------------------------------

@given(case=gpt_models())
@example(case=_pinned_case())
def test_forward_matches_twin(case):
    config, params, ids, dout = case
    assert_logits_match_twin("gpt", lambda p: gpt_forward(ids, p, config), _twin(config, ids), params, dout, _ln_tol)


# -- backward matches autograd ----------------------------------------------------------------

@pytest.mark.twin_parity
@given(case=gpt_models())
@example(case=_pinned_case())
def test_backward_matches_autograd(case):
    """Every gradient of the nested parameters, labelled by path (gpt.blocks.0.attn.q.w, ...)."""
    config, params, ids, dout = case
    assert_grads_match_autograd("gpt", lambda p: gpt_forward(ids, p, config), gpt_backward, _twin(config, ids),
                                params, dout, _ln_tol)


@given(case=gpt_models(dropout=0.3), seed=st.integers(0, 2**32 - 1))
def test_dropout_parity_through_masks(case, seed):
    """The NumPy model draws every keep-mask from rng; the twin replays them from cache.masks."""
    config, params, ids, dout = case
    logits, cache = gpt_forward(ids, params, config, rng=np.random.default_rng(seed))
    dparams = gpt_backward(dout, cache)
    masks = cache.masks
    masks = {"emb": to_torch(masks["emb"]),
             "blocks": [{k: to_torch(m) for k, m in b.items()} for b in masks["blocks"]]}
    twin_logits, grads = autograd(_twin(config, ids, masks=masks), {"params": params}, dout)
    tol = _ln_tol(cache, dout.dtype)
    assert_close("gpt[dropout].logits", logits, twin_logits, **tol)
    assert_tree_close("gpt[dropout]", dparams, grads["params"], **tol)


# -- the twin matches PyTorch's built-ins ---------------------------------------------------------


@given(case=gpt_models(tie_weights=True))
def test_twin_matches_builtin(case):
    """F.embedding, nn.TransformerEncoderLayer (pre-LN, causal) per block, F.layer_norm and
    F.linear(x, wte) (tied) holding the same weights."""
    config, params, ids, dout = case
    params = with_zero_biases(params, config)
    _, cache = gpt_forward(ids, params, config)
    twin_logits, twin_grads = autograd(_twin(config, ids), {"params": params}, dout)
    logits, builtin_grads = builtin_gpt(config, params, ids, dout)
    tol = _ln_tol(cache, dout.dtype)
    assert_close("gpt.logits vs built-ins", twin_logits, logits, **tol)
    assert_tree_close("gpt vs built-ins", twin_grads["params"], builtin_grads, **tol)


# -- float16 and bfloat16: FlashAttention's error rule against PyTorch's built-ins ----------------


# Two layers in three programs and the twin: a handful of examples (the ops' own budget tests draw many more).
@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@settings(max_examples=6)
@given(case=gpt_budget_models())
@example(case=gpt_budget_case(2, "sinusoidal", 6, 844))   # PyTorch's run alone: our float16
def test_low_precision_meets_the_error_budget(dtype, case):  # dblocks.0.attn.k.w reached 11.5 x its error
    """Ours and the twin in float16 and bfloat16 against test_twin_matches_builtin's built-ins in
    float64 on the same rounded weights, within twice the error of those built-ins run in the low dtype
    (PyTorch's own program: each built-in rounding its output, nn.TransformerEncoderLayer's attention sdpa)."""
    config, params, ids, dout = case
    params, dout = tree_map(lambda p: round_to(p, dtype), with_zero_biases(params, config)), round_to(dout, dtype)
    logits, cache = gpt_forward(ids, params, config)
    grads = flatten(gpt_backward(dout, cache))
    twin_logits, twin_grads = autograd(_twin(config, ids), {"params": params}, dout)
    lowp_logits, lowp_grads = builtin_gpt(config, params, ids, dout)
    truth = partial(builtin_gpt, config, tree_map(lambda p: p.astype(np.float64), params), ids,
                    dout.astype(np.float64))
    truth_logits, truth_grads = truth()
    runs = [(r_logits, flatten(r_grads)) for r_logits, r_grads in randomly_rounded(truth, dtype)]   # why: its docs
    lowp_grads, truth_grads = flatten(lowp_grads), flatten(truth_grads)
    for who, (out, g) in {"numpy": (logits, grads), "twin": (twin_logits, flatten(twin_grads["params"]))}.items():
        assert_error_budget(f"gpt[{who}]", dtype, {"logits": (out, lowp_logits, truth_logits, [r[0] for r in runs])})
        assert_error_budget(f"gpt[{who}]", dtype,
                            {f"d{path}": (g[path], lowp_grads[path], truth_grads[path], [r[1][path] for r in runs])
                             for path in truth_grads if not path.endswith("attn.k.b")},
                            multiple=GRAD_MULTIPLE)   # model_kit.GRAD_MULTIPLE says why; k.b: see test_block


def test_low_precision_wpe_gradient_sums_the_batch_in_float32():
    """wpe's gradient sums the gradient reaching x = tok + pos over the batch: in float32, rounded
    once to bfloat16, each entry lies within half an ulp of the exact sum plus float32's error (a
    sum of 256 terms rounded at every step in bfloat16 strays by several ulps)."""
    config = GPTConfig(vocab_size=7, block_size=3, n_layer=0, n_embd=8, n_head=2)
    rng = np.random.default_rng(0)
    params = tree_map(lambda p: round_to(p, "bfloat16"), moved_off_init(init_gpt_params(config, rng, np.float64), rng))
    ids = rng.integers(0, config.vocab_size, (256, 3))
    dout = round_to(rng.normal(size=(256, 3, config.vocab_size)), "bfloat16")
    _, cache = gpt_forward(ids, params, config)
    dx, _ = head_backward("gpt", dout, cache.head)                        # the steps before wpe's sum
    dx, _ = layer_norm_backward(dx, cache.ln_f)                           # (B, T, C) in bfloat16
    exact = dx.astype(np.float64).sum(axis=0)                             # (T, C)
    err = np.abs(gpt_backward(dout, cache)["wpe"].astype(np.float64) - exact)
    half_ulp = np.spacing(np.abs(exact).astype(np.float32)) * 2.0**15     # bfloat16 keeps 8 of float32's 24 bits
    bound = half_ulp + 256 * 2.0**-24 * np.abs(dx.astype(np.float64)).sum(axis=0)
    assert (err <= bound).all(), f"gpt dwpe (bfloat16): error {err.max():.3g} past half an ulp"


# -- properties ---------------------------------------------------------------------------------

def _tied_and_untied(case):
    """(tied gradients, untied gradients, cache) with the untied head a copy of wte^T."""
    config, params, ids, dout = case
    dtied = gpt_backward(dout, gpt_forward(ids, params, config)[1])
    untied_config = dataclasses.replace(config, tie_weights=False)
    untied = {**params, "head": {"w": params["wte"].T.copy()}}
    logits, cache = gpt_forward(ids, untied, untied_config)
    return dtied, gpt_backward(dout, cache), cache


@given(case=gpt_models(tie_weights=True))
@example(case=_pinned_case())
def test_tied_gradient_is_the_sum_of_both_uses(case):
    """Untie the weights (head.w = wte^T, a separate copy): the tied wte gradient is the untied
    embedding gradient plus the untied head gradient, transposed. (The two runs round alike but
    not identically, BLAS taking wte^T as a view or a copy, hence the layer-norm tolerance.)"""
    dtied, duntied, cache = _tied_and_untied(case)
    assert_close("gpt tied wte = embedding + head", dtied["wte"],
                 duntied["wte"] + duntied["head"]["w"].T, **_ln_tol(cache, dtied["wte"].dtype))


def test_tied_gradient_has_both_shares():
    """On the pinned case both uses contribute: the tied gradient is neither share alone."""
    dtied, duntied, _ = _tied_and_untied(_pinned_case())
    for name, share in (("embedding", duntied["wte"]), ("head", duntied["head"]["w"].T)):
        assert np.abs(share).max() > 1e-3, f"the {name} share of the tied gradient is negligible"
        assert not np.allclose(dtied["wte"], share), f"the tied gradient is the {name} share alone"


@given(case=gpt_models(), data=st.data())
def test_causal(case, data):
    """The logits at position t ignore the tokens after t."""
    config, params, ids, _ = case
    B, T = ids.shape
    t = data.draw(st.integers(0, T - 1), label="t")
    later = data.draw(S.token_ids(config.vocab_size, (B, T - t - 1)), label="new later ids")
    logits, _ = gpt_forward(ids, params, config)
    changed, _ = gpt_forward(np.concatenate([ids[:, : t + 1], later], axis=1), params, config)
    np.testing.assert_array_equal(changed[:, : t + 1], logits[:, : t + 1],
                                  err_msg=f"gpt logits up to t = {t} saw later tokens")


# -- finite differences (no torch) ----------------------------------------------------------------

@given(case=gpt_models(dtype=np.float64), seed=st.integers(0, 2**32 - 1))
@example(case=_pinned_case(), seed=0)
def test_backward_matches_finite_differences(case, seed):
    """One directional derivative of sum(logits * dout) along a random direction in every
    parameter."""
    config, params, ids, dout = case
    assert_backward_matches_finite_differences("gpt", lambda p: gpt_forward(ids, p, config), gpt_backward,
                                               params, dout, seed, rstds=layer_norm_rstds)


# -- training parity: 20 AdamW steps in NumPy and in torch ---------------------------------------------

# No biases: the key bias gets a gradient that is zero in exact arithmetic (softmax ignores a
# constant added to a whole row of scores), so it trains on rounding noise, which Adam divides by
# sqrt(v) + eps of the same noise: lr-sized steps in float32 whose sign two correct programs need
# not share. Biases are checked by every gradient test above.
TRAIN_CONFIG = GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=8, bias=False)
TRAIN_STEPS = 20
# The loss at every step, relative: float64 carries 16 digits and the twins differ by rounding
# only, so 1e-9 (the bound) leaves ample room; float32 carries 7, 1e-4 (the bound).
LOSS_RTOL = {np.float64: 1e-9, np.float32: 1e-4}


def _batches(config, B=4, steps=TRAIN_STEPS, seed=0):
    """(ids, targets) pairs: windows of one token stream, targets shifted by one. The stream
    repeats a random permutation of the vocabulary, so each token predicts the next: learnable."""
    rng = np.random.default_rng(seed)
    stream = np.tile(rng.permutation(config.vocab_size), 200 // config.vocab_size)
    T = config.block_size
    starts = rng.integers(0, len(stream) - T - 1, size=(steps, B))
    return [(np.stack([stream[s: s + T] for s in row]), np.stack([stream[s + 1: s + T + 1] for s in row]))
            for row in starts]


def _train_numpy(config, params, batches, hyper):
    state = optim.adamw_init(params)
    losses = []
    for ids, targets in batches:
        logits, cache = gpt_forward(ids, params, config)
        loss, loss_cache = cross_entropy_forward(logits, targets)
        dlogits = cross_entropy_backward(np.ones((), loss.dtype), loss_cache)
        params, state = optim.adamw_step(params, gpt_backward(dlogits, cache), state, **hyper)
        losses.append(float(loss))
    return losses, params


def _train_torch(config, params, batches, hyper):
    params = tree_to_torch(params, requires_grad=True)
    state = torch_optim.adamw_init(params)
    losses = []
    for ids, targets in batches:
        loss = cross_entropy(gpt(to_torch(ids), params, config), to_torch(targets))
        loss.backward()
        grads = tree_map(lambda p: p.grad, params)
        params, state = torch_optim.adamw_step(params, grads, state, **hyper)
        params = tree_map(lambda p: p.requires_grad_(), params)
        losses.append(float(loss.detach()))
    return losses, tree_map(to_numpy, params)


@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
def test_training_parity(dtype, record_property):
    """Same initial weights, same batches, dropout 0: the same loss at every one of 20 AdamW
    steps and the same final weights; and the loss falls."""
    config = TRAIN_CONFIG
    params = init_gpt_params(config, np.random.default_rng(0), dtype)
    batches = _batches(config)
    hyper = dict(lr=1e-2, weight_decay=0.01)
    losses, final = _train_numpy(config, params, batches, hyper)
    twin_losses, twin_final = _train_torch(config, params, batches, hyper)
    rel = np.abs(np.array(losses) - twin_losses) / np.abs(twin_losses)
    record_property("loss_rel_diff_per_step", [f"{r:.2e}" for r in rel])
    print(f"\ntraining parity {np.dtype(dtype)}: losses {losses[0]:.4f} -> {losses[-1]:.4f}, "
          f"relative difference per step: " + " ".join(f"{r:.1e}" for r in rel))
    assert rel.max() <= LOSS_RTOL[dtype], f"{np.dtype(dtype)} losses differ by {rel.max():.2e}: {rel}"
    assert_tree_close(f"gpt trained {TRAIN_STEPS} steps", final, twin_final)
    assert losses[-1] < losses[0] - 0.1, f"the loss did not fall: {losses}"


# -- dtype preservation -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
@pytest.mark.parametrize("config", [
    GPTConfig(vocab_size=7, block_size=4, n_layer=1, n_head=2, n_embd=4, dropout=0.1),
    GPTConfig(vocab_size=7, block_size=4, n_layer=1, n_head=2, n_embd=4, tie_weights=False,
              positions="sinusoidal", bias=False)])
def test_dtype_is_preserved(config, dtype):
    params = init_gpt_params(config, np.random.default_rng(0), dtype)
    ids = np.array([[1, 2, 2, 6]])
    logits, cache = gpt_forward(ids, params, config, rng=np.random.default_rng(1))
    dparams = gpt_backward(np.ones_like(logits), cache)
    for name, arr in [("logits", logits)] + tree_leaves(dparams) + tree_leaves(params):
        assert arr.dtype == dtype, f"gpt {name} dtype {arr.dtype}"
    assert {p for p, _ in tree_leaves(dparams)} == {p for p, _ in tree_leaves(params)}, \
        "gradients and parameters have different paths"


# -- bad input --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_mixed_low_precision_params_are_refused(dtype):
    """A float16 or bfloat16 model with one float32 parameter is refused, naming it, as a
    float32/float64 mix is (nothing is upcast silently)."""
    config = GPTConfig(vocab_size=7, block_size=4, n_layer=1)
    params = init_gpt_params(config, np.random.default_rng(0), LOW_DTYPES[dtype][0])
    params["blocks"]["0"]["ln2"]["b"] = params["blocks"]["0"]["ln2"]["b"].astype(np.float32)
    with pytest.raises(TypeError, match=rf"^params\['blocks'\]\['0'\]\['ln2'\]\['b'\] is float32 but "
                                        rf"params\['wte'\] is {dtype}: every parameter must share one dtype$"):
        gpt_forward(np.array([[1, 2]]), params, config)


def test_bad_input():
    config = GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=2, n_embd=4)
    params = init_gpt_params(config, np.random.default_rng(0), np.float64)
    assert_bad_ids_refused(gpt_forward, params, config)
    with pytest.raises(ValueError, match=r"ids must have 2 dimensions, got shape \(3,\)"):
        gpt_forward(np.zeros(3, int), params, config)
    with pytest.raises(TypeError, match="needs rng"):
        gpt_forward(np.zeros((1, 2), int), params, dataclasses.replace(config, dropout=0.1))
    # Parameters are named by their path, not by the name an inner operation gives them.
    mixed = dict(params, blocks={"0": dict(params["blocks"]["0"], ln1={
        "w": params["blocks"]["0"]["ln1"]["w"].astype(np.float32), "b": params["blocks"]["0"]["ln1"]["b"]})})
    with pytest.raises(TypeError, match=r"params\['blocks'\]\['0'\]\['ln1'\]\['w'\] is float32 but "
                                        r"params\['wte'\] is float64"):
        gpt_forward(np.zeros((1, 2), int), mixed, config)
    with pytest.raises(ValueError, match=r"params\['wte'\] has shape \(5, 4\), but the config asks for "
                                         r"\(vocab_size, n_embd\) = \(6, 4\)"):
        gpt_forward(np.zeros((1, 2), int), params, dataclasses.replace(config, vocab_size=6))


def test_bad_dlogits_is_refused():
    """dlogits must have the logits' shape and dtype, checked by the output layer's backward."""
    config = GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=2, n_embd=4)
    params = init_gpt_params(config, np.random.default_rng(0), np.float64)
    _, cache = gpt_forward(np.zeros((2, 3), int), params, config)
    with pytest.raises(ValueError, match=r"gpt_backward: dlogits must have the shape .* \(2, 3, 5\), got \(2, 3, 4\)"):
        gpt_backward(np.zeros((2, 3, 4)), cache)
    with pytest.raises(TypeError, match=r"gpt_backward: dlogits must have the dtype .* float64, got float32"):
        gpt_backward(np.zeros((2, 3, 5), np.float32), cache)
    with pytest.raises(TypeError, match=r"gpt_backward: dlogits must be a NumPy array .* got list"):
        gpt_backward(np.zeros((2, 3, 5)).tolist(), cache)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(positions=np.arange(3)), ValueError, r"positions must have shape \(2,\) or \(1, 2\) .* got \(3,\)"),
    (dict(positions=np.array([0, 4])), ValueError, r"positions must lie in \[0, block_size = 4\), got values 0..4"),
    (dict(positions=np.array([0.0, 1.0])), TypeError, "positions must be integers, got dtype float64"),
    (dict(attn_mask=np.ones((2, 2))), TypeError, "attn_mask must be a bool NumPy array"),
    (dict(attn_mask=np.ones((3, 3), bool)), ValueError,
     r"attn_mask of shape \(3, 3\) does not broadcast to the scores' shape \(B, nh, T, S\) = \(1, 2, 2, 2\)"),
])
def test_bad_positions_and_attn_mask(kwargs, error, message):
    """Refused at the top of gpt_forward and llama_forward, naming the argument, never by an
    operation deep inside (a float mask would reach numpy's bitwise and, a position 4 the
    embedding's "token id" check)."""
    config = GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=2, n_embd=4)
    params = init_gpt_params(config, np.random.default_rng(0), np.float64)
    with pytest.raises(error, match=message):
        gpt_forward(np.zeros((1, 2), int), params, config, **kwargs)
    from numpy_attn.llama import LlamaConfig, init_llama_params, llama_forward

    llama_config = LlamaConfig(vocab_size=5, block_size=4, n_layer=1, n_head=2, n_kv_head=1, n_embd=4)
    llama_params = init_llama_params(llama_config, np.random.default_rng(0), np.float64)
    if "block_size" not in message:                                  # RoPE takes any position
        with pytest.raises(error, match=message):
            llama_forward(np.zeros((1, 2), int), llama_params, llama_config, **kwargs)
    with pytest.raises(TypeError, match="rng must be a np.random.Generator, got int"):
        llama_forward(np.zeros((1, 2), int), llama_params, llama_config, rng=0)


@pytest.mark.parametrize("kwargs, message", [
    (dict(n_embd=6, n_head=4), "n_embd = 6 is not divisible by n_head = 4"),
    (dict(positions="rotary"), "positions must be 'learned' or 'sinusoidal', got 'rotary'"),
    (dict(dropout=1.0), r"dropout must lie in \[0, 1\), got 1.0"),
    (dict(dropout=1.5), r"dropout must lie in \[0, 1\), got 1.5"),
    (dict(vocab_size=0), "vocab_size must be a positive integer, got 0"),
    (dict(n_layer=-1), "n_layer must be an integer >= 0, got -1"),
])
def test_bad_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**kwargs)
    with pytest.raises(dataclasses.FrozenInstanceError):
        GPTConfig().n_layer = 3


@pytest.mark.parametrize("kwargs, message", [
    (dict(tie_weights="false"), "GPTConfig.tie_weights must be a bool, got str 'false'"),
    (dict(bias=1), "GPTConfig.bias must be a bool, got int 1"),
    (dict(vocab_size=True), "GPTConfig.vocab_size must be an integer, got bool True"),
    (dict(n_embd=32.0), "GPTConfig.n_embd must be an integer, got float 32.0"),
    (dict(dropout="0.1"), "GPTConfig.dropout must be a real number, got str '0.1'"),
    (dict(positions=None), "GPTConfig.positions must be a str, got NoneType None"),
])
def test_config_field_types(kwargs, message):
    """Booleans are booleans: a string such as "false" is truthy and once switched tying on."""
    with pytest.raises(TypeError, match=message):
        GPTConfig(**kwargs)


def test_config_numpy_scalars_become_python_values():
    """NumPy scalars (e.g. read from an array) are accepted and stored as Python values, so that
    the config writes to JSON and a float64 dropout cannot upcast anything."""
    config = GPTConfig(vocab_size=np.int64(5), dropout=np.float64(0.1), bias=np.bool_(False))
    for name, kind in (("vocab_size", int), ("dropout", float), ("bias", bool)):
        value = getattr(config, name)
        assert type(value) is kind, f"GPTConfig.{name} stored as {type(value).__name__}"


# -- gradient structure, initialisation ---------------------------------------------------------------

def _key_order(tree):
    """The keys of every dict in a nested dict, in order, as (path, keys) pairs."""
    if not isinstance(tree, dict):
        return []
    return [("", list(tree))] + [(f"{k}.{p}", keys) for k, sub in tree.items() for p, keys in _key_order(sub)]


@pytest.mark.parametrize("tie_weights", [True, False])
@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
def test_gradients_have_the_params_key_order(tie_weights, positions):
    """dparams has exactly params' keys in params' order at every level, blocks "0", "1", ...
    included (the backward visits the blocks last to first), so zipping leaves pairs them."""
    config = GPTConfig(vocab_size=7, block_size=4, n_layer=3, n_head=2, n_embd=4,
                       tie_weights=tie_weights, positions=positions)
    params = init_gpt_params(config, np.random.default_rng(0), np.float64)
    ids = np.array([[1, 2, 2, 6]])
    logits, cache = gpt_forward(ids, params, config)
    dparams = gpt_backward(S.ramp(*logits.shape), cache)
    assert list(dparams["blocks"]) == ["0", "1", "2"], f"dparams['blocks'] keys {list(dparams['blocks'])}"
    assert _key_order(dparams) == _key_order(params), "dparams' key order differs from params'"


def test_init_statistics_match_pytorch():
    """Embeddings and the head are N(0, 0.02^2), GPT-2's initialiser (torch.nn.init.normal_ with
    std 0.02 on a tensor of the same shape is the reference); every layer norm starts as
    nn.LayerNorm does, weight exactly 1 and bias exactly 0."""
    from parity_tests.helpers import assert_same_distribution

    config = GPTConfig(vocab_size=512, block_size=256, n_layer=1, n_head=2, n_embd=64, tie_weights=False)
    params = init_gpt_params(config, np.random.default_rng(0), np.float64)
    torch.manual_seed(0)
    for name in ("wte", "wpe", "head"):
        ours = params["head"]["w"] if name == "head" else params[name]
        theirs = nn.init.normal_(torch.empty(ours.shape, dtype=torch.float64), mean=0.0, std=0.02)
        assert_same_distribution(name, ours, to_numpy(theirs))
    layer_norm = nn.LayerNorm(config.n_embd, dtype=torch.float64)
    for path, ln in (("ln_f", params["ln_f"]), ("blocks.0.ln1", params["blocks"]["0"]["ln1"]),
                     ("blocks.0.ln2", params["blocks"]["0"]["ln2"])):
        assert np.array_equal(ln["w"], to_numpy(layer_norm.weight)), f"{path}.w is not all ones"
        assert np.array_equal(ln["b"], to_numpy(layer_norm.bias)), f"{path}.b is not all zeros"


# -- logits_to_keep: the head on the last positions only -------------------------------------------


@given(case=gpt_models(), N=st.integers(0, 6))
@example(case=_pinned_case(), N=1)
def test_logits_to_keep_gives_the_last_positions_and_their_gradient(case, N):
    """N from 0 (all) through T (all) to past T (all, as transformers' slice)."""
    config, params, ids, dout = case
    assert_keeps_the_last_logits("gpt", lambda ids, p, **kw: gpt_forward(ids, p, config, **kw), gpt_backward,
                                 lambda p, **kw: gpt(to_torch(ids), p, config, **kw), params, ids, N, dout,
                                 layer_norm_rstds)


def test_logits_to_keep_with_a_cache_gives_the_last_new_position():
    """Generation's call: a prefill keeping 1, then two tokens keeping 1, equal to the full
    forward's logits at those positions (tolerance as test_generate_cache.py's decoding). Sizes
    where a wrong cache is seen: head size 3 (not n_embd - n_head = 4), and 3 cached tokens before
    2 new ones (positions 3, 4: past + T = 5 where past | T = 3)."""
    from numpy_attn.gpt import gpt_kv_cache

    config = GPTConfig(vocab_size=7, block_size=6, n_layer=2, n_head=2, n_embd=6)
    rng = np.random.default_rng(3)
    params = moved_off_init(init_gpt_params(config, rng, np.float64), rng)
    ids = np.array([[1, 3, 1, 6, 0]])
    full, full_cache = gpt_forward(ids, params, config)
    kv_cache = gpt_kv_cache(config, 1, np.float64)
    prefill, _ = gpt_forward(ids[:, :3], params, config, kv_cache=kv_cache, logits_to_keep=1)   # (1, 1, V)
    step, _ = gpt_forward(ids[:, 3:], params, config, kv_cache=kv_cache, logits_to_keep=1)      # (1, 1, V)
    tol = reorder_tol(layer_norm_rstds(full_cache), np.float64)
    assert_close("gpt prefill logits_to_keep=1 vs full[:, 2]", prefill, full[:, 2:3], **tol)
    assert_close("gpt cached step logits_to_keep=1 vs full[:, 4]", step, full[:, 4:5], **tol)


def test_an_attn_mask_joins_the_causal_mask():
    """An attn_mask keeping every key changes nothing: the causal mask still joins it (and'ed)."""
    config = GPTConfig(vocab_size=7, block_size=6, n_layer=1, n_head=2, n_embd=6)
    rng = np.random.default_rng(4)
    params = moved_off_init(init_gpt_params(config, rng, np.float64), rng)
    ids = np.array([[1, 3, 1, 6, 0]])
    plain, _ = gpt_forward(ids, params, config)
    masked, _ = gpt_forward(ids, params, config, attn_mask=np.ones((5, 5), bool))
    np.testing.assert_array_equal(masked, plain)


def test_the_default_config_has_gpt2s_layers():
    """The toy sizes aside, GPTConfig() is GPT-2's kind of model: biases in every linear layer,
    learned positions, the embedding tied to the output."""
    config = GPTConfig()
    assert (config.bias, config.positions, config.tie_weights) == (True, "learned", True), config


@pytest.mark.parametrize("bad, error, message", [
    (-1, ValueError, "logits_to_keep must be None or an int >= 0 .*, got -1$"),
    (True, TypeError, "logits_to_keep must be None or an int >= 0 .*, got True of type bool"),
    (1.0, TypeError, "logits_to_keep must be None or an int >= 0 .*, got 1.0 of type float"),
    (np.array([1]), TypeError, "logits_to_keep must be None or an int >= 0 .*, got array"),
])
def test_bad_logits_to_keep_is_refused(bad, error, message):
    config = GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=2)
    params = init_gpt_params(config, np.random.default_rng(0), np.float64)
    with pytest.raises(error, match=message):
        gpt_forward(np.zeros((1, 3), np.int64), params, config, logits_to_keep=bad)


@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
def test_no_tokens_give_empty_logits_and_zero_gradients(positions):
    """ids (B, 0), as attention takes T = 0: logits (B, 0, V), every gradient zero (an empty sum);
    with sinusoidal positions the table of no position is empty (its largest position is
    taken over none)."""
    config = GPTConfig(vocab_size=7, block_size=4, n_layer=1, n_head=2, n_embd=8, positions=positions)
    params = init_gpt_params(config, np.random.default_rng(0), dtype=np.float64)
    logits, cache = gpt_forward(np.zeros((2, 0), np.int64), params, config)
    assert logits.shape == (2, 0, 7), f"gpt logits with T = 0: {logits.shape}"
    grads = gpt_backward(np.zeros((2, 0, 7)), cache)
    for path, g in tree_leaves(grads):
        assert not g.any(), f"gpt.{path} with T = 0: {g}"
