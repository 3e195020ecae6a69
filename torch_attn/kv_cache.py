"""A key/value cache for decoding in plain PyTorch: every layer's keys and values so far.

Twin of numpy_attn/kv_cache.py: k and v allocated once as (L, B, nkv, max_len, hs) tensors, each
step writes its new tokens in place and reads back the layer's keys and values up to its length;
a model hands each layer its own view, ``cache.layer(i)``.
Only the key/value heads are stored (grouped-query attention); ``bytes_per_token`` is
2 x layers x nkv x hs x itemsize. Inference only: run it under ``torch.no_grad()``.
"""

from dataclasses import dataclass

import torch


@dataclass
class KVCache:
    """Keys and values of ``lengths[i]`` tokens for each layer i, in tensors of ``max_len`` slots."""

    k: torch.Tensor          # (L, B, nkv, max_len, hs)
    v: torch.Tensor          # (L, B, nkv, max_len, hs)
    lengths: list            # L ints: tokens stored in each layer

    @property
    def max_len(self):
        return self.k.shape[3]

    @property
    def length(self):
        return self.lengths[0]

    @property
    def bytes_per_token(self):
        L, B, nkv, max_len, hs = self.k.shape
        return 2 * L * nkv * hs * self.k.element_size()

    @property
    def nbytes(self):
        return (self.k.numel() + self.v.numel()) * self.k.element_size()

    def layer(self, i):
        """Layer i's view of the cache: its keys, values and length, written in place."""
        return LayerKVCache(self, i)


@dataclass(frozen=True)
class LayerKVCache:
    """One layer of a KVCache: what a layer's attention reads and appends to."""

    cache: KVCache
    index: int

    @property
    def k(self):
        return self.cache.k[self.index]

    @property
    def v(self):
        return self.cache.v[self.index]

    @property
    def length(self):
        return self.cache.lengths[self.index]


def init_kv_cache(n_layer, B, n_kv_head, max_len, head_size, dtype=torch.float32, device=None):
    """An empty cache: k and v of shape (n_layer, B, n_kv_head, max_len, head_size), lengths 0."""
    shape = (n_layer, B, n_kv_head, max_len, head_size)                 # (L, B, nkv, max_len, hs)
    return KVCache(torch.zeros(shape, dtype=dtype, device=device),
                   torch.zeros(shape, dtype=dtype, device=device), [0] * n_layer)


def kv_cache_update(layer_cache, k, v):
    """Append k, v (B, nkv, T, hs) to ``layer_cache`` (KVCache.layer(i)); return k_all, v_all (B, nkv, S, hs)."""
    start = layer_cache.length
    end = start + k.shape[2]
    if end > layer_cache.cache.max_len:
        raise ValueError(f"cache overflow: layer {layer_cache.index} holds {start} tokens, appending "
                         f"{k.shape[2]} would make {end} > max_len = {layer_cache.cache.max_len}")
    layer_cache.k[:, :, start:end] = k                                  # (B, nkv, T, hs) into its slots
    layer_cache.v[:, :, start:end] = v
    layer_cache.cache.lengths[layer_cache.index] = end
    k_all = layer_cache.k[:, :, :end]                                   # (B, nkv, S, hs)
    v_all = layer_cache.v[:, :, :end]                                   # (B, nkv, S, hs)
    return k_all, v_all


# No single PyTorch built-in: test_kv_cache.py checks it against torch.cat of the steps' keys and
# values, and against transformers' DynamicCache.update (the same contract) where it is installed.
