"""Decoding the Llama-style model with a key/value cache (numpy_attn/llama.py, torch_attn/llama.py
through numpy_attn/kv_cache.py): for any prompt and split point, a prefill then one token at a
time gives the full forward's logits at every position, the cache holds the full forward's
rotated keys and values (nkv heads only), and the torch twin decodes the same."""

import dataclasses

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import torch_attn.llama as tw
from numpy_attn.linear import linear_forward
from numpy_attn.llama import (
    LlamaConfig,
    init_llama_params,
    llama_backward,
    llama_forward,
    llama_kv_cache,
)
from numpy_attn.rope import rope_forward
from parity_tests import strategies as S
from parity_tests.helpers import (
    LOW_DTYPES,
    assert_close,
    assert_error_budget,
    assert_twin_cache_equal,
    decode_with_cache,
    layer_norm_tol,
    moved_off_init,
    reorder_tol,
    to_numpy,
    to_torch,
    tree_map,
    twin_decode_with_cache,
)
from parity_tests.model_kit import exact_hf_llama, hf_llama, llama_configs, llama_rstds, round_tree


@st.composite
def decodes(draw, dtype=None):
    """(config, params, ids, sizes): a tiny Llama (1 or 2 layers; with or without grouped-query
    heads, both RoPE layouts, every scaling, from test_llama's llama_configs), params moved by
    U(-0.5, 0.5) off their initial values, repeating ids (B, T), and the step sizes: a prefill of
    P tokens, then T - P single tokens."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    config = draw(llama_configs(n_layer=draw(st.integers(1, 2))))
    B, T = draw(S.dim(1, 2)), draw(S.dim(1, config.block_size))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="seed"))
    params = moved_off_init(init_llama_params(config, rng, dtype), rng)
    ids = draw(S.token_ids(config.vocab_size, (B, T)))
    P = draw(st.integers(1, T), label="prefill")
    return config, params, ids, [P] + [1] * (T - P)


def _pinned(n_kv_head=2):
    """Two layers, 4 query heads on n_kv_head key/value heads, prompt of 3 then two single
    tokens, float64."""
    config = LlamaConfig(vocab_size=5, block_size=6, n_layer=2, n_head=4, n_kv_head=n_kv_head, n_embd=8,
                         head_dim=2, hidden=5)
    rng = np.random.default_rng(3)
    params = moved_off_init(init_llama_params(config, rng, np.float64), rng)
    return config, params, np.array([[1, 3, 1, 4, 0]]), [3, 1, 1]


def decode_tol(full_cache, dtype):
    """How far cached decoding may stray from the full forward: reorder_tol over the RMS norms' rstds."""
    return reorder_tol(llama_rstds(full_cache), dtype)


# -- cached decoding equals the full forward ----------------------------------------------------------

@given(case=decodes())
@example(case=_pinned())
@example(case=_pinned(n_kv_head=4))
def test_cached_logits_equal_full_forward(case):
    """For any prompt and prefill length, every position's logits."""
    config, params, ids, sizes = case
    full, full_cache = llama_forward(ids, params, config)
    cached, _ = decode_with_cache(llama_forward, llama_kv_cache, config, params, ids, sizes)
    assert_close("llama decode.logits vs full forward", cached, full, **decode_tol(full_cache, full.dtype))


@given(case=decodes())
@example(case=_pinned())
def test_cache_holds_the_full_forwards_rotated_keys_and_values(case):
    """After a prefill of P tokens, layer i's cache holds the keys (rotated to positions
    0..P-1) and values (B, nkv, P, hs) that block i's attention computed in the full forward of
    those P tokens: the same functions (linear_forward, rope_forward) on the same input, the
    projections' input h kept in the full forward's cache, so exactly. Only the nkv key/value
    heads are stored."""
    config, params, ids, sizes = case
    P, B = sizes[0], ids.shape[0]
    nkv, hs = config.n_kv_head, config.hs
    _, full_cache = llama_forward(ids[:, :P], params, config)
    kv_cache = llama_kv_cache(config, B, params["wte"].dtype)
    llama_forward(ids[:, :P], params, config, kv_cache=kv_cache)
    assert kv_cache.k.shape == (config.n_layer, B, nkv, config.block_size, hs), f"cache {kv_cache.k.shape}"
    assert kv_cache.lengths.tolist() == [P] * config.n_layer, f"cache lengths {kv_cache.lengths}"
    rope = dict(theta=config.rope_theta, layout=config.rope_layout, scaling=config.rope_scaling)
    for i, block_cache in enumerate(full_cache.blocks):
        h = block_cache.attn.qkv[1][0]                                  # (B, P, C): the projections' input
        p = params["blocks"][str(i)]["attn"]
        k = linear_forward(h, **p["k"])[0].reshape(B, P, nkv, hs).swapaxes(1, 2)   # (B, nkv, P, hs)
        v = linear_forward(h, **p["v"])[0].reshape(B, P, nkv, hs).swapaxes(1, 2)   # (B, nkv, P, hs)
        k = rope_forward(k, np.arange(P), **rope)[0]                    # rotated to positions 0..P-1
        assert_close(f"llama decode.cache.k[{i}]", kv_cache.k[i, :, :, :P], k, rtol=0, atol=0)
        assert_close(f"llama decode.cache.v[{i}]", kv_cache.v[i, :, :, :P], v, rtol=0, atol=0)


# -- the torch twin decodes the same --------------------------------------------------------------

@given(case=decodes())
@example(case=_pinned())
def test_twin_decoding_equals_numpy(case):
    """The twin's cached logits at every step, and its cache at the end, equal the NumPy ones."""
    config, params, ids, sizes = case
    _, full_cache = llama_forward(ids, params, config)
    cached, kv_cache = decode_with_cache(llama_forward, llama_kv_cache, config, params, ids, sizes)
    twin, twin_cache = twin_decode_with_cache(tw.llama, tw.llama_kv_cache, config, params, ids, sizes)
    tol = layer_norm_tol(llama_rstds(full_cache), cached.dtype)    # two programs that round differently
    assert_close("llama decode twin.logits", twin, cached, **tol)
    assert_twin_cache_equal("llama decode twin", twin_cache, kv_cache, ids.shape[1], tol)


# -- the bound catches a real bug ---------------------------------------------------------------

# -- float16 and bfloat16: a cache in the model's dtype -------------------------------------------

# A model decoding in steps and transformers' model twice: a handful of examples (test_llama.py's
# budget test covers the full forward and backward).
@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@settings(max_examples=6)
@given(case=decodes(dtype=np.float64))
def test_low_precision_cache_stays_within_the_full_forwards_budget(dtype, case):
    """A float16 or bfloat16 model decodes with a cache of its own dtype (nkv heads, half float32's
    bytes a token), and its logits at every position, ours and the twin's, stay within the full
    forward's budget: against LlamaForCausalLM in float64 on the same rounded weights, twice the error
    of LlamaForCausalLM run in the low dtype over the whole prompt at once."""
    config, params, ids, sizes = case
    config = dataclasses.replace(config, rope_layout="half")   # transformers' layout; the params fit either
    params = round_tree(params, dtype)
    cached, kv_cache = decode_with_cache(llama_forward, llama_kv_cache, config, params, ids, sizes)
    twin, _ = twin_decode_with_cache(tw.llama, tw.llama_kv_cache, config, params, ids, sizes)
    assert kv_cache.k.dtype == kv_cache.v.dtype == params["wte"].dtype, kv_cache.k.dtype
    assert kv_cache.bytes_per_token == 2 * config.n_layer * config.n_kv_head * config.hs * kv_cache.k.itemsize
    lowp = hf_llama(config, params)(input_ids=to_torch(ids)).logits
    wide = tree_map(lambda p: p.astype(np.float64), params)
    truth = exact_hf_llama(hf_llama(config, wide), config)(input_ids=to_torch(ids)).logits
    for who, logits in {"numpy": cached, "twin": twin}.items():
        assert_error_budget(f"llama decode[{who}]", dtype, {"logits": (logits, to_numpy(lowp), to_numpy(truth))})


@pytest.mark.parametrize("n_kv_head", [2, 4])
def test_tolerance_catches_positions_restarting_at_each_step(n_kv_head):
    """Steps that rotate their tokens from position 0 again (forgetting the cached length) break
    the bound by far: RoPE sees only relative positions, and those are then wrong."""
    config, params, ids, _ = _pinned(n_kv_head)
    full, full_cache = llama_forward(ids, params, config)
    kv_cache = llama_kv_cache(config, 1, np.float64)
    llama_forward(ids[:, :3], params, config, kv_cache=kv_cache)
    wrong, _ = llama_forward(ids[:, 3:4], params, config, positions=np.arange(1), kv_cache=kv_cache)
    assert not np.allclose(wrong, full[:, 3:4], **decode_tol(full_cache, np.float64))


# -- errors ---------------------------------------------------------------------------------------

def test_backward_through_past_tokens_is_refused():
    """Gradients cannot reach tokens whose keys came from the cache: a clear error, not a wrong
    one. A prefill alone (nothing cached before it) still has its backward."""
    config, params, ids, _ = _pinned()
    kv_cache = llama_kv_cache(config, 1, np.float64)
    logits, cache = llama_forward(ids[:, :3], params, config, kv_cache=kv_cache)
    dlogits = np.random.default_rng(0).normal(size=logits.shape)
    assert_close("llama prefill backward.wte", llama_backward(dlogits, cache)["wte"],
                 llama_backward(dlogits, llama_forward(ids[:, :3], params, config)[1])["wte"], rtol=0, atol=0)
    logits, cache = llama_forward(ids[:, 3:4], params, config, kv_cache=kv_cache)
    with pytest.raises(ValueError, match="attended over 4 keys of which only 1 came from its input"):
        llama_backward(np.ones_like(logits), cache)


def test_decoding_past_block_size_or_a_wrong_cache_is_refused():
    config, params, ids, _ = _pinned()
    config = dataclasses.replace(config, block_size=5)
    kv_cache = llama_kv_cache(config, 1, np.float64)
    llama_forward(ids, params, config, kv_cache=kv_cache)     # 5 tokens: full
    with pytest.raises(ValueError, match="5 cached \\+ 1 new tokens = 6 exceed block_size = 5"):
        llama_forward(ids[:, :1], params, config, kv_cache=kv_cache)
    with pytest.raises(ValueError, match="overflow.*> max_len = 2"):
        llama_forward(ids[:, :3], params, config, kv_cache=llama_kv_cache(config, 1, np.float64, max_len=2))
    with pytest.raises(TypeError, match="kv_cache must be a KVCache"):
        llama_forward(ids, params, config, kv_cache={})
    with pytest.raises(ValueError, match="kv_cache has 1 layers"):
        llama_forward(ids, params, config, kv_cache=llama_kv_cache(dataclasses.replace(config, n_layer=1), 1))
    with pytest.raises(TypeError, match="dtype float64, the cache holds float32"):
        llama_forward(ids, params, config, kv_cache=llama_kv_cache(config, 1, np.float32))
