"""Tests for numpy_attn/kv_cache.py and torch_attn/kv_cache.py: appending in place equals
concatenating, the twins agree, the size per token, overflow, and attention over the cache."""

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import torch_attn.kv_cache as tw
from numpy_attn.attention import scaled_dot_product_attention_forward
from numpy_attn.kv_cache import KVCache, init_kv_cache, kv_cache_update
from numpy_attn.masks import causal_mask
from parity_tests import strategies as S
from parity_tests.helpers import assert_close, to_numpy, to_torch


@st.composite
def splits(draw, total):
    """Step sizes >= 1 that add up to ``total``: a prefill, then one or several tokens at a time."""
    cuts = sorted(draw(st.sets(st.integers(1, total - 1), max_size=total - 1))) if total > 1 else []
    bounds = [0] + cuts + [total]
    return [b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


@st.composite
def cache_cases(draw, dtype=None):
    """(dims, steps): dims = (L, B, nkv, max_len, hs); steps = [(layer chunks k, v per layer)]
    that fill the cache up to some length <= max_len, split into steps of drawn sizes."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    L, B, nkv, hs = draw(S.dim(1, 3)), draw(S.dim(1, 2)), draw(S.dim(1, 3)), draw(S.dim(1, 3))
    max_len = draw(S.dim(1, 6))
    total = draw(st.integers(1, max_len))
    sizes = draw(splits(total))
    steps = [[(draw(S.arrays(dtype, (B, nkv, n, hs))), draw(S.arrays(dtype, (B, nkv, n, hs))))
              for _ in range(L)] for n in sizes]
    return (L, B, nkv, max_len, hs), steps


# -- appending in place equals concatenating ------------------------------------------------------

@given(case=cache_cases())
def test_update_equals_concatenation(case):
    """After each step every layer returns exactly the concatenation of its chunks so far."""
    (L, B, nkv, max_len, hs), steps = case
    dtype = steps[0][0][0].dtype
    cache = init_kv_cache(L, B, nkv, max_len, hs, dtype)
    for n, step in enumerate(steps):
        for layer, (k, v) in enumerate(step):
            k_all, v_all = kv_cache_update(cache.layer(layer), k, v)
            k_ref = np.concatenate([s[layer][0] for s in steps[: n + 1]], axis=2)
            v_ref = np.concatenate([s[layer][1] for s in steps[: n + 1]], axis=2)
            assert_close(f"kv_cache.k[{layer}] step {n}", k_all, k_ref, rtol=0, atol=0)
            assert_close(f"kv_cache.v[{layer}] step {n}", v_all, v_ref, rtol=0, atol=0)
        assert cache.lengths.tolist() == [k_ref.shape[2]] * L, f"kv_cache.lengths {cache.lengths}"
        assert cache.length == k_ref.shape[2], f"kv_cache.length {cache.length}"


# -- the twin matches the NumPy cache -------------------------------------------------------------

@given(case=cache_cases())
def test_twin_matches_numpy(case):
    (L, B, nkv, max_len, hs), steps = case
    dtype = steps[0][0][0].dtype
    cache = init_kv_cache(L, B, nkv, max_len, hs, dtype)
    twin = tw.init_kv_cache(L, B, nkv, max_len, hs, to_torch(np.zeros(0, dtype)).dtype)
    for n, step in enumerate(steps):
        for layer, (k, v) in enumerate(step):
            k_all, v_all = kv_cache_update(cache.layer(layer), k, v)
            tk_all, tv_all = tw.kv_cache_update(twin.layer(layer), to_torch(k), to_torch(v))
            assert_close(f"kv_cache twin.k[{layer}] step {n}", to_numpy(tk_all), k_all, rtol=0, atol=0)
            assert_close(f"kv_cache twin.v[{layer}] step {n}", to_numpy(tv_all), v_all, rtol=0, atol=0)
    assert twin.lengths == cache.lengths.tolist(), f"kv_cache.lengths {twin.lengths} != {cache.lengths}"
    assert twin.bytes_per_token == cache.bytes_per_token, "kv_cache.bytes_per_token"
    assert twin.nbytes == cache.nbytes, "kv_cache.nbytes"


@given(case=cache_cases())
def test_twin_matches_transformers_dynamic_cache(case):
    """DynamicCache.update(k, v, layer) of Hugging Face transformers has the same contract
    (append, return the layer's keys and values so far); it grows by concatenation instead."""
    transformers = pytest.importorskip("transformers")
    (L, B, nkv, max_len, hs), steps = case
    dtype = to_torch(steps[0][0][0]).dtype
    twin = tw.init_kv_cache(L, B, nkv, max_len, hs, dtype)
    ref = transformers.DynamicCache()
    for n, step in enumerate(steps):
        for layer, (k, v) in enumerate(step):
            tk_all, tv_all = tw.kv_cache_update(twin.layer(layer), to_torch(k), to_torch(v))
            rk_all, rv_all = ref.update(to_torch(k), to_torch(v), layer)
            assert_close(f"kv_cache twin vs DynamicCache.k[{layer}] step {n}", to_numpy(tk_all),
                         to_numpy(rk_all), rtol=0, atol=0)
            assert_close(f"kv_cache twin vs DynamicCache.v[{layer}] step {n}", to_numpy(tv_all),
                         to_numpy(rv_all), rtol=0, atol=0)
    assert twin.length == ref.get_seq_length(0), "kv_cache.length"


# -- size in bytes per token ----------------------------------------------------------------------

@given(L=S.dim(1, 4), B=S.dim(1, 3), nkv=S.dim(1, 4), g=S.dim(1, 4), hs=S.dim(1, 8),
       max_len=S.dim(1, 16), dtype=S.dtypes)
@example(L=12, B=1, nkv=12, g=1, hs=64, max_len=1024, dtype=np.float32)   # GPT-2 small: 72 KiB a token
def test_bytes_per_token(L, B, nkv, g, hs, max_len, dtype):
    """2 (k and v) x layers x kv heads x head size x itemsize: with nh = g * nkv query heads,
    grouped-query attention stores g times fewer bytes than one key/value head per query head."""
    cache = init_kv_cache(L, B, nkv, max_len, hs, dtype)
    itemsize = np.dtype(dtype).itemsize
    assert cache.k.shape == cache.v.shape == (L, B, nkv, max_len, hs), f"kv_cache.k {cache.k.shape}"
    assert cache.bytes_per_token == 2 * L * nkv * hs * itemsize, f"bytes_per_token {cache.bytes_per_token}"
    assert cache.nbytes == cache.bytes_per_token * B * max_len, f"nbytes {cache.nbytes}"
    mha = init_kv_cache(L, B, g * nkv, max_len, hs, dtype)        # one kv head per query head
    assert mha.bytes_per_token == g * cache.bytes_per_token, "GQA saving"
    twin = tw.init_kv_cache(L, B, nkv, max_len, hs, to_torch(np.zeros(0, dtype)).dtype)
    assert twin.bytes_per_token == cache.bytes_per_token, "kv_cache twin bytes_per_token"
    if (L, nkv, hs, dtype) == (12, 12, 64, np.float32):
        assert cache.bytes_per_token == 73728, "GPT-2 small: 2 * 12 * 12 * 64 * 4"


# -- overflow and bad input -----------------------------------------------------------------------

@given(max_len=S.dim(1, 5), first=S.dim(0, 5), extra=S.dim(1, 3), dtype=S.dtypes)
def test_overflow_is_an_error_and_changes_nothing(max_len, first, extra, dtype):
    first = min(first, max_len)
    cache = init_kv_cache(2, 1, 1, max_len, 2, dtype)
    twin = tw.init_kv_cache(2, 1, 1, max_len, 2, to_torch(np.zeros(0, dtype)).dtype)
    if first:
        chunk = np.ones((1, 1, first, 2), dtype)
        kv_cache_update(cache.layer(0), chunk, chunk)
        tw.kv_cache_update(twin.layer(0), to_torch(chunk), to_torch(chunk))
    before = cache.k.copy()
    over = np.full((1, 1, max_len - first + extra, 2), 7, dtype)
    with pytest.raises(ValueError, match=rf"overflow.*> max_len = {max_len}"):
        kv_cache_update(cache.layer(0), over, over)
    with pytest.raises(ValueError, match=rf"overflow.*> max_len = {max_len}"):
        tw.kv_cache_update(twin.layer(0), to_torch(over), to_torch(over))
    assert cache.lengths.tolist() == [first, 0], f"lengths after overflow {cache.lengths}"
    assert twin.lengths == [first, 0], f"twin lengths after overflow {twin.lengths}"
    np.testing.assert_array_equal(cache.k, before, err_msg="kv_cache.k after overflow")


def test_bad_input_is_refused():
    cache = init_kv_cache(2, 2, 1, 4, 3, np.float32)
    good = np.zeros((2, 1, 1, 3), np.float32)
    with pytest.raises(TypeError, match="dtype float64.*float32"):
        kv_cache_update(cache.layer(0), good.astype(np.float64), good)
    with pytest.raises(ValueError, match=r"k must have shape \(B, nkv, T, hs\) = \(2, 1, T, 3\)"):
        kv_cache_update(cache.layer(0), np.zeros((2, 2, 1, 3), np.float32), good)   # query heads, not kv heads
    with pytest.raises(ValueError, match="k and v shapes differ"):
        kv_cache_update(cache.layer(0), good, np.zeros((2, 1, 2, 3), np.float32))
    with pytest.raises(ValueError, match=r"layer must be an integer in \[0, 2\)"):
        kv_cache_update(cache.layer(2), good, good)
    with pytest.raises(TypeError, match="cache must be a KVCache"):
        kv_cache_update((cache.k, cache.v), good, good)
    with pytest.raises(ValueError, match="max_len must be >= 1"):
        init_kv_cache(1, 1, 1, 0, 1)
    with pytest.raises(TypeError, match="head_size must be an integer"):
        init_kv_cache(1, 1, 1, 4, 2.0)
    with pytest.raises(TypeError, match="dtype must be float32 or float64"):
        init_kv_cache(1, 1, 1, 4, 2, np.int64)
    assert isinstance(cache, KVCache)


# -- attention over the cache equals full causal attention ----------------------------------------

@st.composite
def attention_decodes(draw):
    """(q, k, v, sizes): self-attention inputs of T tokens with nh = g * nkv query heads, and the
    step sizes (a prefill, then one or several tokens) in which they arrive."""
    dtype = draw(S.dtypes)
    B, nkv, g, T, hs = draw(S.dim(1, 2)), draw(S.dim(1, 2)), draw(S.dim(1, 3)), draw(S.dim(1, 6)), draw(S.dim(1, 4))
    q = draw(S.arrays(dtype, (B, g * nkv, T, hs)))
    k = draw(S.arrays(dtype, (B, nkv, T, hs)))
    v = draw(S.arrays(dtype, (B, nkv, T, hs)))
    return q, k, v, draw(splits(T))


@given(case=attention_decodes())
def test_cached_attention_equals_full_causal_attention(case):
    """Queries a..b attending over the cached keys 0..b with the bottom-right causal mask give
    rows a..b of the full causal attention. The same sums of the same numbers, equal but for the
    order in which BLAS adds them, which may differ between a (b-a)-row and a T-row matmul. A score
    sums hs products |q k| <= 16 scaled by 1/sqrt(hs): reordered, it moves by up to
    hs * eps * 16 * sqrt(hs); an output is a weighted mean of |v| <= 4 and moves by at most
    2 * 4 = 8 times its scores' largest move, plus S * eps * 4 for reordering its own sum."""
    q, k, v, sizes = case
    B, nkv, T, hs = k.shape
    full, _ = scaled_dot_product_attention_forward(q, k, v, is_causal=True)
    cache = init_kv_cache(1, B, nkv, T, hs, q.dtype)
    start = 0
    for i, n in enumerate(sizes):
        k_all, v_all = kv_cache_update(cache.layer(0), k[:, :, start:start + n], v[:, :, start:start + n])
        out, _ = scaled_dot_product_attention_forward(
            q[:, :, start:start + n], k_all, v_all, attn_mask=causal_mask(n, start + n, "bottom_right"))
        eps = float(np.finfo(q.dtype).eps)
        assert_close(f"cached attention step {i}", out, full[:, :, start:start + n],
                     rtol=0, atol=eps * (8 * 16 * hs**1.5 + 4 * T))
        start += n


def test_twin_refuses_overflow_before_writing():
    twin = tw.init_kv_cache(1, 1, 1, 2, 1)
    with pytest.raises(ValueError, match="overflow"):
        tw.kv_cache_update(twin.layer(0), torch.ones(1, 1, 3, 1), torch.ones(1, 1, 3, 1))
    assert twin.lengths == [0] and not twin.k.any(), "twin cache after overflow"
