"""Decoding with a key/value cache (numpy_attn/kv_cache.py through gpt.py, block.py, multi_head.py
and their twins): for any prompt split into a prefill and steps of one or several tokens, the
cached logits equal the full forward's at every position, the cache holds the keys and values the
full forward computes, and the torch twin decodes the same."""

import dataclasses

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import torch_attn.gpt as tw
from numpy_attn.gpt import GPTConfig, gpt_backward, gpt_forward, gpt_kv_cache, init_gpt_params
from numpy_attn.multi_head import multi_head_attention_backward, multi_head_attention_forward
from parity_tests import strategies as S
from parity_tests.helpers import (
    LOW_DTYPES,
    assert_close,
    assert_error_budget,
    assert_tree_close,
    assert_twin_cache_equal,
    decode_with_cache,
    layer_norm_rstds,
    layer_norm_tol,
    moved_off_init,
    reorder_tol,
    round_to,
    to_numpy,
    to_torch,
    tree_map,
    twin_decode_with_cache,
)
from parity_tests.model_kit import builtin_gpt, gpt_budget_models, with_zero_biases
from parity_tests.strategies import splits


@st.composite
def decodes(draw, dtype=None):
    """(config, params, ids, sizes): a tiny GPT (learned or sinusoidal positions, 1 or 2 layers,
    with or without grouped-query heads), params moved by U(-0.5, 0.5) off their initial values,
    repeating ids (B, T) and the step sizes (a prefill of sizes[0] tokens, then the rest) that
    add up to T."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    nkv, g, hs = draw(S.dim(1, 2)), draw(S.dim(1, 2)), draw(S.dim(1, 3))
    config = GPTConfig(
        vocab_size=draw(S.dim(2, 7)), block_size=draw(S.dim(1, 6)), n_layer=draw(st.integers(1, 2)),
        n_head=g * nkv, n_kv_head=draw(st.sampled_from([None, nkv])), n_embd=g * nkv * hs,
        bias=draw(st.booleans()), tie_weights=draw(st.booleans()),
        positions=draw(st.sampled_from(["learned", "sinusoidal"])))
    B, T = draw(S.dim(1, 2)), draw(S.dim(1, config.block_size))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="seed"))
    params = moved_off_init(init_gpt_params(config, rng, dtype), rng)
    ids = draw(S.token_ids(config.vocab_size, (B, T)))
    return config, params, ids, draw(splits(T))


def _pinned(positions, n_kv_head=None):
    """Two layers, prompt of 3 then two single tokens, float64."""
    config = GPTConfig(vocab_size=5, block_size=6, n_layer=2, n_head=2, n_kv_head=n_kv_head, n_embd=4,
                       positions=positions)
    rng = np.random.default_rng(3)
    params = moved_off_init(init_gpt_params(config, rng, np.float64), rng)
    return config, params, np.array([[1, 3, 1, 4, 0]]), [3, 1, 1]


def decode_tol(full_cache, dtype):
    """How far cached decoding may stray from the full forward: reorder_tol over the layer norms' rstds."""
    return reorder_tol(layer_norm_rstds(full_cache), dtype)


def decode_numpy(config, params, ids, sizes):
    """Logits (B, T, V) of decoding ids in steps of ``sizes`` with a cache, and the cache."""
    return decode_with_cache(gpt_forward, gpt_kv_cache, config, params, ids, sizes)


# -- cached decoding equals the full forward ----------------------------------------------------------

@given(case=decodes())
@example(case=_pinned("learned"))
@example(case=_pinned("sinusoidal", n_kv_head=1))
def test_cached_logits_equal_full_forward(case):
    """For any split of the prompt into a prefill and steps, every position's logits."""
    config, params, ids, sizes = case
    full, full_cache = gpt_forward(ids, params, config)
    cached, _ = decode_numpy(config, params, ids, sizes)
    assert_close("decode.logits vs full forward", cached, full, **decode_tol(full_cache, full.dtype))


@given(case=decodes())
def test_cache_holds_the_full_forwards_keys_and_values(case):
    """After a prefill of P tokens, layer i's cache holds the keys and values (B, nkv, P, hs) that
    block i's attention projected in the full forward of those P tokens (its input h = ln1(x), in
    the multi-head cache, times the k and v weights): the same computation, exactly. Only the
    nkv key/value heads are stored."""
    config, params, ids, sizes = case
    P, B = sizes[0], ids.shape[0]
    _, full_cache = gpt_forward(ids[:, :P], params, config)
    kv_cache = gpt_kv_cache(config, B, params["wte"].dtype)
    gpt_forward(ids[:, :P], params, config, kv_cache=kv_cache)
    nkv, hs = config.n_kv_head or config.n_head, config.n_embd // config.n_head
    assert kv_cache.k.shape == (config.n_layer, B, nkv, config.block_size, hs), f"cache {kv_cache.k.shape}"
    assert kv_cache.lengths.tolist() == [P] * config.n_layer, f"cache lengths {kv_cache.lengths}"
    for i, block_cache in enumerate(full_cache.blocks):
        h = block_cache.attn.k[0]                                       # (B, P, C): the projections' input
        for name in ("k", "v"):
            p = params["blocks"][str(i)]["attn"][name]
            full = h @ p["w"] + p["b"] if "b" in p else h @ p["w"]      # (B, P, nkv*hs)
            full = full.reshape(B, P, nkv, hs).swapaxes(1, 2)           # (B, nkv, P, hs)
            cached = getattr(kv_cache, name)[i, :, :, :P]
            assert_close(f"decode.cache.{name}[{i}]", cached, full, rtol=0, atol=0)


# -- the torch twin decodes the same --------------------------------------------------------------

@given(case=decodes())
@example(case=_pinned("sinusoidal"))
def test_twin_decoding_equals_numpy(case):
    """The twin's cached logits at every step, and its cache at the end, equal the NumPy ones."""
    config, params, ids, sizes = case
    full, full_cache = gpt_forward(ids, params, config)
    cached, kv_cache = decode_numpy(config, params, ids, sizes)
    twin, twin_cache = twin_decode_with_cache(tw.gpt, tw.gpt_kv_cache, config, params, ids, sizes)
    tol = layer_norm_tol(layer_norm_rstds(full_cache), full.dtype)    # two programs that round differently
    assert_close("decode twin.logits", twin, cached, **tol)
    assert_twin_cache_equal("decode twin", twin_cache, kv_cache, ids.shape[1], tol)


# -- one new token at a time is the same as several --------------------------------------------

@given(case=decodes(dtype=np.float64), data=st.data())
def test_any_two_splits_agree(case, data):
    """Two different splits of the same prompt give the same logits (float64)."""
    config, params, ids, sizes = case
    other = data.draw(splits(ids.shape[1]), label="other split")
    a, _ = decode_numpy(config, params, ids, sizes)
    b, full_cache = decode_numpy(config, params, ids, other)
    _, full_cache = gpt_forward(ids, params, config)
    assert_close("decode.logits split vs other split", a, b, **decode_tol(full_cache, a.dtype))


# -- float16 and bfloat16: a cache in the model's dtype -------------------------------------------

# Two programs and a model in three steps or more: a handful of examples (test_gpt.py's budget test
# covers the full forward and backward).
@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@settings(max_examples=6)
@given(case=gpt_budget_models(), data=st.data())
def test_low_precision_cache_stays_within_the_full_forwards_budget(dtype, case, data):
    """A float16 or bfloat16 model decodes with a cache of its own dtype (half float32's bytes a
    token), and its logits at every position stay within the full forward's budget: against
    test_gpt.py's built-ins in float64 on the same rounded weights, twice the error of those built-ins
    run in the low dtype over the whole prompt at once."""
    config, params, ids, dout = case
    params = tree_map(lambda p: round_to(p, dtype), with_zero_biases(params, config))
    sizes = data.draw(splits(ids.shape[1]), label="sizes")
    cached, kv_cache = decode_numpy(config, params, ids, sizes)
    assert kv_cache.k.dtype == kv_cache.v.dtype == params["wte"].dtype, kv_cache.k.dtype
    assert kv_cache.bytes_per_token == 2 * config.n_layer * config.n_embd * params["wte"].dtype.itemsize
    lowp, _ = builtin_gpt(config, params, ids, np.zeros(dout.shape, params["wte"].dtype))
    truth, _ = builtin_gpt(config, tree_map(lambda p: p.astype(np.float64), params), ids, np.zeros(dout.shape))
    assert_error_budget("gpt decode", dtype, {"logits": (cached, lowp, truth)})


# -- errors ---------------------------------------------------------------------------------------

def test_decoding_past_block_size_is_refused():
    config, params, ids, _ = _pinned("learned")
    config = dataclasses.replace(config, block_size=5)
    kv_cache = gpt_kv_cache(config, 1, np.float64)
    gpt_forward(ids, params, config, kv_cache=kv_cache)        # 5 tokens: full
    with pytest.raises(ValueError, match="5 cached \\+ 1 new tokens = 6 exceed block_size = 5"):
        gpt_forward(ids[:, :1], params, config, kv_cache=kv_cache)
    small = gpt_kv_cache(config, 1, np.float64, max_len=2)
    with pytest.raises(ValueError, match="overflow.*> max_len = 2"):
        gpt_forward(ids[:, :3], params, config, kv_cache=small)


def test_backward_through_past_tokens_is_refused():
    """Gradients cannot reach tokens whose keys came from the cache: a clear error, not a wrong one."""
    config, params, ids, _ = _pinned("learned")
    attn = params["blocks"]["0"]["attn"]
    x = np.random.default_rng(0).normal(size=(1, 3, 4))
    kv_cache = gpt_kv_cache(config, 1, np.float64)
    multi_head_attention_forward(x[:, :2], attn, 2, is_causal="bottom_right", kv_cache=kv_cache.layer(0))
    out, cache = multi_head_attention_forward(x[:, 2:], attn, 2, is_causal="bottom_right",
                                              kv_cache=kv_cache.layer(0))
    with pytest.raises(ValueError, match="attended over 3 keys of which only 1 came from its input"):
        multi_head_attention_backward(np.ones_like(out), cache)


def test_tolerance_catches_positions_restarting_at_each_step():
    """The bound is far below a real bug's error: steps that number their tokens from 0 again
    (forgetting the cached length, a common slip) break it, for both kinds of positions."""
    for positions in ("learned", "sinusoidal"):
        config, params, ids, sizes = _pinned(positions)
        full, full_cache = gpt_forward(ids, params, config)
        kv_cache = gpt_kv_cache(config, 1, np.float64)
        gpt_forward(ids[:, :3], params, config, kv_cache=kv_cache)
        wrong, _ = gpt_forward(ids[:, 3:4], params, config, kv_cache=kv_cache, positions=np.arange(1))
        assert not np.allclose(wrong, full[:, 3:4], **decode_tol(full_cache, np.float64)), positions


# -- grouped-query heads in the model ---------------------------------------------------------------

@given(case=decodes(), data=st.data())
def test_grouped_query_model_equals_repeated_heads(case, data):
    """A model with nkv key/value heads equals the model with nh = g * nkv heads whose k and v
    weights repeat each key/value head's columns g times (query head h reads head h // g), in
    logits and, summed over each group, in gradients; the twin agrees."""
    config, params, ids, _ = case
    nkv = config.n_kv_head or config.n_head
    g, hs = config.n_head // nkv, config.n_embd // config.n_head
    dout = data.draw(S.arrays(params["wte"].dtype, ids.shape + (config.vocab_size,), 2.0), label="dout")

    def repeat(a):                                                     # (..., nkv*hs) -> (..., nh*hs)
        return np.repeat(a.reshape(a.shape[:-1] + (nkv, hs)), g, axis=-2).reshape(a.shape[:-1] + (nkv * g * hs,))

    def group_sum(a):                                                  # (..., nh*hs) -> (..., nkv*hs)
        return a.reshape(a.shape[:-1] + (nkv, g, hs)).sum(axis=-2).reshape(a.shape[:-1] + (nkv * hs,))

    full = dataclasses.replace(config, n_kv_head=None)
    repeated = tree_map(lambda p: p, params)
    for block in repeated["blocks"].values():
        for name in ("k", "v"):
            block["attn"][name] = {key: repeat(p) for key, p in block["attn"][name].items()}
    logits, cache = gpt_forward(ids, params, config)
    logits_r, cache_r = gpt_forward(ids, repeated, full)
    tol = layer_norm_tol(layer_norm_rstds(cache) + layer_norm_rstds(cache_r), logits.dtype)
    assert_close("gqa gpt.logits vs repeated heads", logits, logits_r, **tol)
    dparams, dparams_r = gpt_backward(dout, cache), gpt_backward(dout, cache_r)
    for block in dparams_r["blocks"].values():
        for name in ("k", "v"):
            block["attn"][name] = {key: group_sum(p) for key, p in block["attn"][name].items()}
    assert_tree_close("gqa gpt vs repeated heads", dparams, dparams_r, **tol)
    twin = tw.gpt(to_torch(ids), tree_map(to_torch, params), config)
    assert_close("gqa gpt.logits twin", to_numpy(twin), logits, **tol)
