"""A key/value cache for decoding: every layer's keys and values of the tokens seen so far.

    step 1 (prefill):  k, v of the P prompt tokens      -> stored at positions 0..P-1
    step n (decode):   k, v of the new token(s) only    -> stored at P, P+1, ...
    attention:         q of the new tokens over k[0..len], v[0..len]

A causal model's keys and values at position t depend only on tokens 0..t, so they never change
once computed: each step computes them for its new tokens only and reads the rest back, turning
the O(T^2) work of re-running the model on the whole prefix into O(T) per token (Pope et al.,
"Efficiently Scaling Transformer Inference", 2022, section 2). The arrays are allocated once, at
the longest length, and written in place, so that a step copies only its new tokens.

With grouped-query attention only the key/value heads are stored (nkv of them, not nh): that is
where its memory saving comes from. The cache holds 2 x layers x nkv x hs numbers per token and
sequence of the batch (``bytes_per_token``). The new queries attend with the causal mask aligned
bottom-right (query t of T sees keys 0..S-T+t, numpy_attn/masks.py). It holds no gradients: it is
for inference only. A model hands each layer its own view, ``cache.layer(i)``, so that nothing
below the model knows which layer it is.
"""

from dataclasses import dataclass

import numpy as np


@dataclass
class KVCache:
    """Keys and values of ``lengths[i]`` tokens for each layer i, in arrays of ``max_len`` slots."""

    k: np.ndarray          # (L, B, nkv, max_len, hs)
    v: np.ndarray          # (L, B, nkv, max_len, hs)
    lengths: np.ndarray    # (L,) int64: tokens stored in each layer

    @property
    def max_len(self):
        """The number of token slots, fixed at allocation."""
        return self.k.shape[3]

    @property
    def length(self):
        """Tokens stored in layer 0: the position of the next token, before a step appends."""
        return int(self.lengths[0])

    @property
    def bytes_per_token(self):
        """Bytes one token of one sequence takes: 2 (k and v) x layers x nkv x hs x itemsize."""
        L, B, nkv, max_len, hs = self.k.shape
        return 2 * L * nkv * hs * self.k.itemsize

    @property
    def nbytes(self):
        """Bytes of the whole allocation: bytes_per_token x B x max_len."""
        return self.k.nbytes + self.v.nbytes

    def layer(self, i):
        """Layer i's view of the cache: its keys, values and length, written in place."""
        _check_layer(self, i)
        return LayerKVCache(self, int(i))


@dataclass(frozen=True)
class LayerKVCache:
    """One layer of a KVCache: what a layer's attention reads and appends to."""

    cache: KVCache
    index: int

    @property
    def k(self):
        """(B, nkv, max_len, hs): a view of this layer's slots in the cache."""
        return self.cache.k[self.index]

    @property
    def v(self):
        """(B, nkv, max_len, hs): a view of this layer's slots in the cache."""
        return self.cache.v[self.index]

    @property
    def length(self):
        """Tokens stored in this layer."""
        return int(self.cache.lengths[self.index])


def init_kv_cache(n_layer, B, n_kv_head, max_len, head_size, dtype=np.float32):
    """An empty cache for ``n_layer`` layers of a batch of B sequences of up to ``max_len``
    tokens: k and v of shape (n_layer, B, n_kv_head, max_len, head_size), all lengths 0."""
    _check_sizes(n_layer=n_layer, B=B, n_kv_head=n_kv_head, max_len=max_len, head_size=head_size)
    if np.dtype(dtype) not in (np.float32, np.float64):
        raise TypeError(f"dtype must be float32 or float64, got {np.dtype(dtype)}")
    shape = (n_layer, B, n_kv_head, max_len, head_size)                 # (L, B, nkv, max_len, hs)
    # Zeros rather than np.empty: slots past a layer's length are never read, but zeros make an
    # accidental read show up as a wrong answer that is the same on every run.
    return KVCache(np.zeros(shape, dtype), np.zeros(shape, dtype), np.zeros(n_layer, np.int64))


def kv_cache_update(layer_cache, k, v):
    """Append k, v (B, nkv, T, hs) of T new tokens to ``layer_cache`` (KVCache.layer(i)); return
    its keys and values so far, k_all, v_all (B, nkv, S, hs) with S = old length + T (views)."""
    _check_update(layer_cache, k, v)
    start = layer_cache.length
    end = start + k.shape[2]
    layer_cache.k[:, :, start:end] = k                                  # (B, nkv, T, hs) into its slots
    layer_cache.v[:, :, start:end] = v
    layer_cache.cache.lengths[layer_cache.index] = end
    k_all = layer_cache.k[:, :, :end]                                   # (B, nkv, S, hs)
    v_all = layer_cache.v[:, :, :end]                                   # (B, nkv, S, hs)
    return k_all, v_all


def _check_sizes(**sizes):
    """Raise TypeError for a size that is not an integer, ValueError for one below 1."""
    for name, n in sizes.items():
        if not isinstance(n, int | np.integer) or isinstance(n, bool):
            raise TypeError(f"{name} must be an integer, got {n!r}")
        if n < 1:
            raise ValueError(f"{name} must be >= 1, got {n}")


def _check_layer(cache, i):
    """Raise unless i names one of the cache's layers."""
    L = cache.k.shape[0]
    if not isinstance(i, int | np.integer) or isinstance(i, bool) or not 0 <= i < L:
        raise ValueError(f"layer must be an integer in [0, {L}), got {i!r}")


def _check_update(layer_cache, k, v):
    """Raise unless k and v are (B, nkv, T, hs) arrays of the cache's dtype that fit in the layer."""
    if not isinstance(layer_cache, LayerKVCache):
        raise TypeError(f"cache must be a KVCache's layer (KVCache.layer(i)), got "
                        f"{type(layer_cache).__name__}")
    cache, layer = layer_cache.cache, layer_cache.index
    L, B, nkv, max_len, hs = cache.k.shape
    for name, a in (("k", k), ("v", v)):
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{name} must be a NumPy array, got {type(a).__name__}")
        if a.dtype != cache.k.dtype:
            raise TypeError(f"{name} has dtype {a.dtype}, the cache holds {cache.k.dtype}")
        if a.ndim != 4 or a.shape[:2] != (B, nkv) or a.shape[3] != hs:
            raise ValueError(f"{name} must have shape (B, nkv, T, hs) = ({B}, {nkv}, T, {hs}) "
                             f"to fit the cache {cache.k.shape[1:]}, got {a.shape}")
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: k {k.shape}, v {v.shape}")
    start = layer_cache.length
    if start + k.shape[2] > max_len:
        raise ValueError(f"cache overflow: layer {layer} holds {start} tokens, appending "
                         f"{k.shape[2]} would make {start + k.shape[2]} > max_len = {max_len}")
