"""Tests for numpy_attn/kv_cache.py and torch_attn/kv_cache.py: appending in place equals
concatenating, the twins agree, the size per token, overflow, and attention over the cache."""

import re

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import torch_attn.kv_cache as tw
from numpy_attn.attention import scaled_dot_product_attention_forward
from numpy_attn.flash_attention import flash_attention_forward
from numpy_attn.kv_cache import KVCache, init_kv_cache, kv_cache_update
from numpy_attn.masks import causal_mask, sliding_window_mask
from parity_tests import strategies as S
from parity_tests.attention_kit import capped_attention_forward
from parity_tests.helpers import LOW_DTYPES, assert_close, round_to, to_numpy, to_torch, ulp
from parity_tests.strategies import splits


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

@pytest.mark.twin_parity
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
            assert_close(f"kv_cache.k[{layer}] step {n} vs twin", to_numpy(tk_all), k_all, rtol=0, atol=0)
            assert_close(f"kv_cache.v[{layer}] step {n} vs twin", to_numpy(tv_all), v_all, rtol=0, atol=0)
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


@pytest.mark.parametrize("dtype", LOW_DTYPES)
@given(steps=splits(6), data=st.data())
def test_low_precision_cache_halves_the_bytes_and_keeps_the_bits(dtype, steps, data):
    """A float16 or bfloat16 cache takes half the bytes of a float32 one, per token and in all
    (twin too); it keeps the keys and values bit for bit; attention over it decodes what the full
    causal attention computes in that dtype, to one rounding: both compute in float32 and round
    once, and only the order of BLAS's float32 sums differs (2^-24 relative, against the 2^-11 or
    2^-8 of rounding to the low dtype), so an output may land on the neighbouring low-precision
    number; and a float32 k or v is refused, as float64 into a float32 cache is."""
    low, torch_low = LOW_DTYPES[dtype]
    B, nkv, g, T, hs = 2, 2, 2, 6, 4
    q, k, v = (round_to(data.draw(S.arrays(np.float64, (B, nh, T, hs)), label=name), dtype)
               for name, nh in (("q", g * nkv), ("k", nkv), ("v", nkv)))
    cache, wide = init_kv_cache(3, B, nkv, T, hs, low), init_kv_cache(3, B, nkv, T, hs, np.float32)
    assert 2 * cache.nbytes == wide.nbytes and 2 * cache.bytes_per_token == wide.bytes_per_token, \
        f"{dtype} cache: {cache.nbytes} bytes, float32 {wide.nbytes}"
    twin = tw.init_kv_cache(3, B, nkv, T, hs, torch_low)
    assert twin.bytes_per_token == cache.bytes_per_token, f"kv_cache twin bytes_per_token ({dtype})"
    full, _ = scaled_dot_product_attention_forward(q, k, v, is_causal=True)
    start = 0
    for i, n in enumerate(steps):
        k_all, v_all = kv_cache_update(cache.layer(1), k[:, :, start:start + n], v[:, :, start:start + n])
        assert k_all.dtype == low and np.array_equal(k_all.view(np.uint16), k[:, :, :start + n].view(np.uint16)), \
            f"{dtype} cache: keys changed in step {i}"
        assert np.array_equal(v_all.view(np.uint16), v[:, :, :start + n].view(np.uint16)), \
            f"{dtype} cache: values changed in step {i}"
        out, _ = scaled_dot_product_attention_forward(q[:, :, start:start + n], k_all, v_all, is_causal="bottom_right")
        expected = full[:, :, start:start + n].astype(np.float64)
        step = np.abs(out.astype(np.float64) - expected)
        assert np.all(step <= np.vectorize(lambda x: ulp(x, dtype))(expected)), \
            f"{dtype} cached attention step {i}: off by {step.max()}"
        start += n
    with pytest.raises(TypeError, match=f"k has dtype float32, the cache holds {dtype}"):
        kv_cache_update(cache.layer(0), k[:, :, :1].astype(np.float32), v[:, :, :1])


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
    with pytest.raises(TypeError, match="dtype must be float16, bfloat16, float32 or float64, got int64"):
        init_kv_cache(1, 1, 1, 4, 2, np.int64)
    assert isinstance(cache, KVCache)


def test_a_layer_index_must_be_an_integer_in_range():
    """A bool or a float names no layer, even where int() of it would (1.0, True): refused naming it."""
    cache = init_kv_cache(2, 1, 1, 4, 2)
    for i in (True, 1.0, -1, 2):
        with pytest.raises(ValueError, match=rf"^layer must be an integer in \[0, 2\), got {re.escape(repr(i))}$"):
            cache.layer(i)
    assert cache.layer(np.int64(1)).index == 1


def test_check_returns_the_past_or_refuses_naming_the_counts():
    """KVCache.check, which every model's forward calls: None holds 0 tokens; a cache that fits
    returns its length, up to block_size exactly; another type, another layer count (fewer or more)
    or one token too many is refused with the numbers at fault."""
    made_by = "from the family's cache function"
    cache = init_kv_cache(2, 1, 1, 8, 2, windows=[None, 3])
    kv_cache_update(cache.layer(0), np.zeros((1, 1, 3, 2), np.float32), np.zeros((1, 1, 3, 2), np.float32))
    assert KVCache.check(None, 2, 8, 5, made_by) == 0
    assert KVCache.check(cache, 2, 8, 5, made_by) == 3, "3 cached + 5 new fill block_size = 8 exactly"
    with pytest.raises(ValueError, match=r"^3 cached \+ 6 new tokens = 9 exceed block_size = 8$"):
        KVCache.check(cache, 2, 8, 6, made_by)
    with pytest.raises(ValueError, match=r"^3 cached \+ 2 new tokens = 5 exceed block_size = 4$"):
        KVCache.check(cache, 2, 4, 2, made_by)
    for n_layer in (1, 3):
        with pytest.raises(ValueError, match=rf"^kv_cache has 2 layers \(windows \[None, 3\]\), the model n_layer = "
                                             rf"{n_layer}$"):
            KVCache.check(cache, n_layer, 8, 1, made_by)
    with pytest.raises(TypeError, match=rf"^kv_cache must be a KVCache \({made_by}\), got tuple$"):
        KVCache.check((cache.layer(0).k, cache.layer(0).v), 2, 8, 1, made_by)


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


# -- sliding layers: a bounded cache ----------------------------------------------------------------

@st.composite
def sliding_cases(draw, dtype=None):
    """(dims, windows, steps) as cache_cases, with a window (or None) per layer, from 1 to past
    the tokens, and steps that fill up to max_len: several times a small window."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    L, B, nkv, hs = draw(S.dim(1, 3)), draw(S.dim(1, 2)), draw(S.dim(1, 2)), draw(S.dim(1, 3))
    max_len = draw(S.dim(1, 12))
    windows = [draw(st.none() | st.integers(1, max_len + 1)) for _ in range(L)]
    sizes = draw(splits(draw(st.integers(1, max_len))))
    steps = [[(draw(S.arrays(dtype, (B, nkv, n, hs))), draw(S.arrays(dtype, (B, nkv, n, hs))))
              for _ in range(L)] for n in sizes]
    return (L, B, nkv, max_len, hs), windows, steps


@given(case=sliding_cases())
@example(case=((2, 1, 1, 8, 1), [None, 3],
               [[(np.arange(n, dtype=np.float64).reshape(1, 1, n, 1) + s,) * 2] * 2
                for s, n in ((0, 5), (5, 1), (6, 2))]))
def test_sliding_layer_holds_its_last_window(case):
    """After each step a sliding layer hands back its held tokens then the new ones (the last
    held + T of all the tokens so far, in order), and keeps the last min(window, max_len), oldest
    first, in its slots; ``start`` and ``held`` say which positions those are. A full layer
    returns every token. The twin does the same."""
    (L, B, nkv, max_len, hs), windows, steps = case
    dtype = steps[0][0][0].dtype
    cache = init_kv_cache(L, B, nkv, max_len, hs, dtype, windows=windows)
    twin = tw.init_kv_cache(L, B, nkv, max_len, hs, to_torch(np.zeros(0, dtype)).dtype, windows=windows)
    for n, step in enumerate(steps):
        for layer, (k, v) in enumerate(step):
            lc, tc = cache.layer(layer), twin.layer(layer)
            held_before = lc.held
            k_all, v_all = kv_cache_update(lc, k, v)
            tk_all, tv_all = tw.kv_cache_update(tc, to_torch(k), to_torch(v))
            k_so_far = np.concatenate([s[layer][0] for s in steps[: n + 1]], axis=2)   # (B, nkv, length, hs)
            v_so_far = np.concatenate([s[layer][1] for s in steps[: n + 1]], axis=2)
            length = k_so_far.shape[2]
            returned = length if windows[layer] is None else held_before + k.shape[2]
            assert_close(f"sliding k_all[{layer}] step {n}", k_all, k_so_far[:, :, length - returned:], rtol=0, atol=0)
            assert_close(f"sliding v_all[{layer}] step {n}", v_all, v_so_far[:, :, length - returned:], rtol=0, atol=0)
            assert_close(f"sliding twin k_all[{layer}] step {n}", to_numpy(tk_all), k_all, rtol=0, atol=0)
            assert_close(f"sliding twin v_all[{layer}] step {n}", to_numpy(tv_all), v_all, rtol=0, atol=0)
            kept = length if windows[layer] is None else min(windows[layer], max_len, length)
            assert (lc.held, lc.start, lc.length) == (kept, length - kept, length), \
                f"layer {layer} held {lc.held} start {lc.start} length {lc.length}, expected {kept}, {length - kept}"
            assert (tc.held, tc.start) == (lc.held, lc.start), f"twin layer {layer} held {tc.held} start {tc.start}"
            assert_close(f"sliding slots k[{layer}] step {n}", lc.k[:, :, :kept], k_so_far[:, :, length - kept:],
                         rtol=0, atol=0)
            assert_close(f"sliding slots v[{layer}] step {n}", lc.v[:, :, :kept], v_so_far[:, :, length - kept:],
                         rtol=0, atol=0)
    assert twin.lengths == cache.lengths.tolist(), "sliding twin lengths"
    assert (twin.nbytes, twin.bytes_per_token, twin.bytes_held) == (cache.nbytes, cache.bytes_per_token,
                                                                     cache.bytes_held), "sliding twin bytes"


@given(L=S.dim(1, 4), B=S.dim(1, 3), nkv=S.dim(1, 3), hs=S.dim(1, 4), max_len=S.dim(1, 16),
       dtype=S.dtypes, data=st.data())
@example(L=4, B=1, nkv=8, hs=256, max_len=8192, dtype=np.float32, data=None)   # Gemma 2 9B's shape, 4 layers
def test_bytes_of_each_layer_kind(L, B, nkv, hs, max_len, dtype, data):
    """A full layer allocates max_len slots, a sliding one min(window, max_len): nbytes counts
    both; bytes_per_token counts the full layers only (all a further token adds); without
    windows both are as before."""
    windows = [None, 4096] * (L // 2) + [None] * (L % 2) if data is None else \
        data.draw(st.lists(st.none() | st.integers(1, 20), min_size=L, max_size=L), label="windows")
    cache = init_kv_cache(L, B, nkv, max_len, hs, dtype, windows=windows)
    one = 2 * nkv * hs * np.dtype(dtype).itemsize                  # one token, one layer, one sequence
    full = sum(w is None for w in windows)
    slots = sum(max_len if w is None else min(w, max_len) for w in windows)
    assert cache.bytes_per_token == full * one, f"bytes_per_token {cache.bytes_per_token}, {full} full layers"
    assert cache.nbytes == slots * one * B, f"nbytes {cache.nbytes} for {slots} slots"
    assert all(cache.layer(i).bytes_per_token == one for i in range(L)), "a layer's bytes_per_token"
    plain = init_kv_cache(L, B, nkv, max_len, hs, dtype)
    assert plain.nbytes >= cache.nbytes, "a sliding layer takes more than a full one"
    if data is None:
        assert cache.nbytes == (2 * 8192 + 2 * 4096) * one, "Gemma 2 shape: two full layers, two of 4096"
        assert cache.nbytes * 4 == plain.nbytes * 3, "half the layers sliding at half the length: 3/4 the bytes"


def test_a_cache_with_sliding_layers_has_no_stacked_k():
    cache = init_kv_cache(2, 1, 1, 4, 2, windows=[None, 2])
    with pytest.raises(ValueError, match=r"sliding layers \(windows \[None, 2\]\).*cache.layer\(i\).k"):
        _ = cache.k
    assert cache.layer(1).k.shape == (1, 1, 2, 2) and cache.layer(0).k.shape == (1, 1, 4, 2), "layer views"
    twin = tw.init_kv_cache(2, 1, 1, 4, 2, windows=[None, 2])
    with pytest.raises(ValueError, match="sliding layers"):
        _ = twin.v


def test_bad_windows_are_refused():
    with pytest.raises(ValueError, match=r"windows\[1\] must be a positive integer or None, got 0"):
        init_kv_cache(2, 1, 1, 4, 2, windows=[None, 0])
    with pytest.raises(ValueError, match=r"windows\[0\] must be a positive integer or None, got -4"):
        init_kv_cache(2, 1, 1, 4, 2, windows=[-4, None])
    with pytest.raises(TypeError, match=r"windows\[0\] must be a positive integer or None, got float 4.0"):
        init_kv_cache(2, 1, 1, 4, 2, windows=[4.0, None])
    with pytest.raises(TypeError, match=r"windows\[1\] must be a positive integer or None, got bool True"):
        init_kv_cache(2, 1, 1, 4, 2, windows=[None, True])
    with pytest.raises(ValueError, match=r"windows must hold one entry per layer \(n_layer = 2\).*\[4\]"):
        init_kv_cache(2, 1, 1, 4, 2, windows=[4])
    with pytest.raises(ValueError, match=r"windows must hold one entry per layer .* got 4"):
        init_kv_cache(2, 1, 1, 4, 2, windows=4)


@st.composite
def sliding_decodes(draw):
    """(q, k, v, window, sizes): T tokens, a window w with T >= 3 w, and a prompt longer than w
    followed by steps of one or a few tokens, decoding well past the window."""
    dtype = draw(S.dtypes)
    B, nkv, g, hs = draw(S.dim(1, 2)), draw(S.dim(1, 2)), draw(S.dim(1, 2)), draw(S.dim(1, 4))
    window = draw(S.dim(1, 4))
    T = draw(st.integers(3 * window + 1, 3 * window + 6))
    prompt = draw(st.integers(window + 1, T - window))
    sizes = [prompt] + draw(splits(T - prompt))
    q = draw(S.arrays(dtype, (B, g * nkv, T, hs)))
    k = draw(S.arrays(dtype, (B, nkv, T, hs)))
    v = draw(S.arrays(dtype, (B, nkv, T, hs)))
    return q, k, v, window, sizes


@given(case=sliding_decodes(), flash=st.booleans(), softcap=st.none() | st.floats(0.5, 50.0))
@example(case=(S.ramp(1, 2, 14, 3), S.ramp(1, 1, 14, 3), S.ramp(1, 1, 14, 3) * 2, 3, [5] + [1] * 9),
         flash=False, softcap=None)
def test_sliding_decode_equals_full_window_attention(case, flash, softcap):
    """A prompt longer than the window, then decoding well past it through a sliding layer of a
    cache built with windows=[None, w]: every step's attention output (dense or flash, with or
    without a softcap) equals the rows of the full sliding-window forward; the full layer beside
    it, over every key, equals the full causal forward. The cache's bytes stay constant once the
    window is full (the full layer's grow by one token's). The same sums in another order: the
    tolerance of test_cached_attention_equals_full_causal_attention."""
    q, k, v, window, sizes = case
    B, nkv, T, hs = k.shape
    full_window, _ = capped_attention_forward(q, k, v, sliding_window_mask(T, T, window), softcap)
    full_causal, _ = capped_attention_forward(q, k, v, causal_mask(T, T), softcap)
    cache = init_kv_cache(2, B, nkv, T, hs, q.dtype, windows=[None, window])
    nbytes, one = cache.nbytes, cache.layer(0).bytes_per_token * B
    eps = float(np.finfo(q.dtype).eps)
    tol = dict(rtol=0, atol=eps * (8 * 16 * hs**1.5 + 4 * T))
    start = 0
    for i, n in enumerate(sizes):
        held_before = cache.bytes_held
        rows = slice(start, start + n)
        for layer, expected in ((0, full_causal), (1, full_window)):
            lc = cache.layer(layer)
            k_all, v_all = kv_cache_update(lc, k[:, :, rows], v[:, :, rows])
            if flash:
                out, _ = flash_attention_forward(q[:, :, rows], k_all, v_all, is_causal="bottom_right",
                                                 softcap=softcap, window=lc.window, block_q=2, block_k=2)
            else:
                S_ = k_all.shape[2]   # a sliding layer: its window's mask
                mask = (causal_mask(n, S_, "bottom_right") if lc.window is None else
                        sliding_window_mask(n, S_, lc.window, "bottom_right"))
                out, _ = capped_attention_forward(q[:, :, rows], k_all, v_all, mask, softcap)
            assert_close(f"sliding decode layer {layer} step {i}", out, expected[:, :, rows], **tol)
        start += n
        sliding = min(start, window) * one                       # the sliding layer's tokens held
        assert cache.bytes_held == start * one + sliding, f"bytes_held {cache.bytes_held} at {start} tokens"
        if start - n >= window:                                  # the window was already full
            assert cache.bytes_held - held_before == n * one, "sliding layer grew after its window filled"
        assert cache.layer(1).held == min(start, window), f"sliding layer holds {cache.layer(1).held}"
        assert cache.nbytes == nbytes, "the allocation changed"
    assert nbytes == (T + window) * one, f"nbytes {nbytes}: T slots for the full layer, {window} for the sliding"


@pytest.mark.parametrize("windows", [None, [None, 2]])
def test_unused_slots_start_at_zero_and_are_never_read(windows):
    """A new cache's slots are zeros (np.empty would hand out whatever memory held, so an
    accidental read would differ from run to run), and what the unused slots hold never reaches
    the keys and values returned: filled with NaN past the length, the answer is the same."""
    cache = init_kv_cache(2, 1, 1, 5, 2, np.float64, windows=windows)
    assert not cache.buffer_k.any() and not cache.buffer_v.any(), "a new cache's slots are not zeros"
    poisoned = init_kv_cache(2, 1, 1, 5, 2, np.float64, windows=windows)
    poisoned.buffer_k[:], poisoned.buffer_v[:] = np.nan, np.nan
    for T in (2, 1, 1):
        k, v = S.ramp(1, 1, T, 2), -S.ramp(1, 1, T, 2)
        for i in range(2):
            expected = kv_cache_update(cache.layer(i), k, v)
            got = kv_cache_update(poisoned.layer(i), k, v)
            assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True)), \
                f"layer {i} read an unused slot: {got}"
