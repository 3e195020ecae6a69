"""Parity tests for GPT-2 as released, run by numpy_attn/gpt.py and torch_attn/gpt.py with GPT-2's
constants in the config (tanh GELU, its layer-norm eps) and a feed-forward width of the weights'
choosing (Hugging Face's GPT2LMHeadModel is compared through saved checkpoints in test_hf.py)."""

import dataclasses

import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from numpy_attn.gpt import GPTConfig, gpt_backward, gpt_forward, gpt_kv_cache, init_gpt_params
from parity_tests import strategies as S
from parity_tests.helpers import (
    LOW_DTYPES,
    assert_backward_matches_finite_differences,
    assert_bad_config_rng_and_dlogits_refused,
    assert_close,
    assert_grads_match_autograd,
    assert_logits_match_twin,
    assert_model_keeps_dtype,
    decode_with_cache,
    layer_norm_rstds,
    layer_norm_tol,
    moved_off_init,
    reorder_tol,
    to_torch,
    twin_decode_with_cache,
)
from parity_tests.model_kit import assert_checkpoint_meets_error_budget, hf_gpt2_model
from torch_attn.gpt import gpt
from torch_attn.gpt import gpt_kv_cache as twin_gpt_kv_cache


def init_gpt2_params(config, rng, dtype=np.float32, hidden=None):
    """init_gpt_params with a feed-forward width ``hidden`` (GPT-2's n_inner, default 4C), drawn
    from N(0, 0.02^2) with zero biases as GPT-2's initializer_range."""
    params = init_gpt_params(config, rng, dtype)
    C = config.n_embd
    H = 4 * C if hidden is None else hidden
    for block in params["blocks"].values():
        block["ffn"] = {"fc": {"w": rng.normal(0, 0.02, (C, H)).astype(dtype), "b": np.zeros(H, dtype)},
                        "proj": {"w": rng.normal(0, 0.02, (H, C)).astype(dtype), "b": np.zeros(C, dtype)}}
    return params


@st.composite
def models(draw, dtype=None):
    """(config, params, ids, dout): tiny configs, params moved by U(-0.5, 0.5), repeating ids."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    nh, hs = draw(S.dim(1, 2)), draw(S.dim(1, 3))
    config = GPTConfig(vocab_size=draw(S.dim(2, 7)), block_size=draw(S.dim(1, 5)),
                        n_layer=draw(st.integers(0, 2)), n_head=nh, n_embd=nh * hs,
                        ln_eps=draw(st.sampled_from([1e-5, 1e-6])),
                        gelu=draw(st.sampled_from(["tanh", "none"])), tie_weights=draw(st.booleans()))
    B, T = draw(S.dim(1, 2)), draw(S.dim(1, config.block_size))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="seed"))
    hidden = draw(S.dim(1, 5))
    params = moved_off_init(init_gpt2_params(config, rng, dtype, hidden=hidden), rng)
    ids = draw(S.token_ids(config.vocab_size, (B, T)))
    return config, params, ids, draw(S.arrays(dtype, (B, T, config.vocab_size), 2.0))


def _pinned_case():
    config = GPTConfig(vocab_size=5, block_size=4, n_layer=2, n_head=2, n_embd=4, gelu="tanh")
    rng = np.random.default_rng(1)
    params = moved_off_init(init_gpt2_params(config, rng, np.float64), rng)
    ids = np.array([[1, 3, 1, 1]])
    return config, params, ids, rng.normal(size=ids.shape + (config.vocab_size,))


def _tol(cache, dtype):
    return layer_norm_tol(layer_norm_rstds(cache), dtype)


def _twin(config, ids):
    return lambda params: gpt(to_torch(ids), params, config)


@given(case=models())
@example(case=_pinned_case())
def test_forward_matches_twin(case):
    config, params, ids, dout = case
    assert_logits_match_twin("gpt2", lambda p: gpt_forward(ids, p, config), _twin(config, ids), params, dout, _tol)


@given(case=models())
@example(case=_pinned_case())
def test_backward_matches_autograd(case):
    config, params, ids, dout = case
    assert_grads_match_autograd("gpt2", lambda p: gpt_forward(ids, p, config), gpt_backward, _twin(config, ids),
                                params, dout, _tol)


@given(case=models(), data=st.data())
def test_causal(case, data):
    config, params, ids, _ = case
    t = data.draw(st.integers(0, ids.shape[1] - 1))
    changed = ids.copy()
    changed[:, t + 1:] = (changed[:, t + 1:] + 1) % config.vocab_size
    logits, cache = gpt_forward(ids, params, config)
    assert_close(f"gpt2.logits[:, :{t + 1}] after changing later tokens",
                 gpt_forward(changed, params, config)[0][:, : t + 1], logits[:, : t + 1],
                 **_tol(cache, logits.dtype))


@given(case=models(dtype=np.float64), seed=st.integers(0, 2**32 - 1))
@example(case=_pinned_case(), seed=0)
def test_backward_matches_finite_differences(case, seed):
    """One directional derivative of sum(logits * dout) along a random direction in every parameter."""
    config, params, ids, dout = case
    assert_backward_matches_finite_differences("gpt2", lambda p: gpt_forward(ids, p, config), gpt_backward,
                                               params, dout, seed, rstds=layer_norm_rstds)


@given(case=models(), data=st.data())
def test_cached_decoding_equals_full_forward(case, data):
    """A prefill of P tokens, then one token at a time with a key/value cache, gives the full
    forward's logits at every position; the twin decodes the same. The bound is reorder_tol, as
    test_decode.py's: only the order of some sums differs (float64: 1e-12 times the largest rstd;
    float32: the tolerance of two programs that round differently)."""
    config, params, ids, _ = case
    assume(config.n_layer >= 1)                                   # a cache holds at least one layer
    T = ids.shape[1]
    P = data.draw(st.integers(1, T), label="prefill")
    sizes = [P] + [1] * (T - P)
    full, full_cache = gpt_forward(ids, params, config)
    cached, _ = decode_with_cache(gpt_forward, gpt_kv_cache, config, params, ids, sizes)
    twin, _ = twin_decode_with_cache(gpt, twin_gpt_kv_cache, config, params, ids, sizes)
    assert_close("gpt2 decode.logits vs full forward", cached, full,
                 **reorder_tol(layer_norm_rstds(full_cache), full.dtype))
    assert_close("gpt2 decode twin.logits", twin, cached, **_tol(full_cache, full.dtype))


# -- float16 and bfloat16: FlashAttention's error rule against transformers ----------------------

def to_hf_names(grads, config):
    """Our gradient tree under GPT2LMHeadModel's names: q, k and v side by side in c_attn (its
    Conv1D layers hold weights (C_in, C_out), as ours)."""
    out = {"transformer.wte.weight": grads["wte"], "transformer.wpe.weight": grads["wpe"],
           "transformer.ln_f.weight": grads["ln_f"]["w"], "transformer.ln_f.bias": grads["ln_f"]["b"]}
    if not config.tie_weights:
        out["lm_head.weight"] = grads["head"]["w"].T
    for i, block in grads["blocks"].items():
        h = f"transformer.h.{i}."
        out[h + "attn.c_attn.weight"] = np.concatenate([block["attn"][n]["w"] for n in "qkv"], axis=1)
        out[h + "attn.c_attn.bias"] = np.concatenate([block["attn"][n]["b"] for n in "qkv"])
        layers = {"attn.c_proj": block["attn"]["o"], "mlp.c_fc": block["ffn"]["fc"],
                  "mlp.c_proj": block["ffn"]["proj"], "ln_1": block["ln1"], "ln_2": block["ln2"]}
        for theirs, layer in layers.items():
            out[f"{h}{theirs}.weight"], out[f"{h}{theirs}.bias"] = layer["w"], layer["b"]
    return out


# Two layers in four models: a handful of examples, each drawing the weights, ids and dout anew (the
# ops' own budget tests draw many more).
@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@settings(max_examples=4)
@given(tie=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_low_precision_meets_the_error_budget(tmp_path_factory, dtype, tie, seed):
    """Ours and the twin in float16 and bfloat16 against GPT2LMHeadModel in float64 on the same
    rounded weights (test_hf.py's model: its float64 computes in float64 throughout), within twice
    the error of GPT2LMHeadModel run in the low dtype (its sdpa attention)."""
    assert_checkpoint_meets_error_budget(
        "gpt2", dtype, hf_gpt2_model(tie, np.float64, seed), tmp_path_factory.mktemp("gpt2"), seed,
        gpt_forward, gpt_backward, gpt, to_hf_names, lambda model, config, _: model)


@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
def test_dtype_is_preserved(dtype):
    config = GPTConfig(vocab_size=7, block_size=4, n_layer=1, tie_weights=False, gelu="tanh")
    params = init_gpt2_params(config, np.random.default_rng(0), dtype)
    assert_model_keeps_dtype("gpt2", gpt_forward, gpt_backward, params, config, dtype)


@pytest.mark.parametrize("kw, error, message", [
    (dict(n_embd=5, n_head=2), ValueError, "n_embd = 5 is not divisible by n_head = 2"),
    (dict(vocab_size=0), ValueError, "vocab_size must be a positive integer, got 0"),
    (dict(n_layer=True), TypeError, "n_layer must be an integer, got bool True"),
    (dict(gelu="gelu_new"), ValueError, "gelu must be 'tanh' or 'none', got 'gelu_new'"),
    (dict(ln_eps=-1.0), ValueError, "ln_eps must be a number > 0, got -1.0"),
    (dict(ln_eps=0.0), ValueError, "GPTConfig.ln_eps must be a number > 0, got 0.0"),   # 0 / 0 on a constant row
    (dict(tie_weights="yes"), TypeError, "tie_weights must be a bool, got str 'yes'"),
])
def test_bad_config(kw, error, message):
    with pytest.raises(error, match=message):
        GPTConfig(**kw)


def test_bad_input():
    config = GPTConfig(vocab_size=7, block_size=4, n_layer=1)
    params = init_gpt2_params(config, np.random.default_rng(0), np.float64)
    with pytest.raises(ValueError, match=r"T = 5 of ids \(1, 5\) exceeds block_size = 4"):
        gpt_forward(np.zeros((1, 5), np.int64), params, config)
    with pytest.raises(TypeError, match="token ids must be integers"):
        gpt_forward(np.zeros((1, 3)), params, config)
    assert_bad_config_rng_and_dlogits_refused("gpt_backward", gpt_forward, gpt_backward, init_gpt2_params, params,
                                              config)


@given(case=models())
def test_with_exact_gelu_it_is_gpt_py(case):
    """GPT-2 differs from gpt.py's defaults only in the GELU form and the layer-norm eps: with
    gelu="none" and eps 1e-5 it is the default GPTConfig on the same parameter dict (which is why
    attn_cli.hf's GPT-2 dicts have gpt.py's nesting)."""
    config, params, ids, _ = case
    config = dataclasses.replace(config, gelu="none", ln_eps=1e-5)
    ours, cache = gpt_forward(ids, params, config)
    gpt_config = GPTConfig(vocab_size=config.vocab_size, block_size=config.block_size,
                           n_layer=config.n_layer, n_head=config.n_head, n_embd=config.n_embd,
                           tie_weights=config.tie_weights)
    theirs, _ = gpt_forward(ids, params, gpt_config)
    assert_close("gpt2[gelu=none].logits vs gpt.py", ours, theirs, **_tol(cache, ours.dtype))
