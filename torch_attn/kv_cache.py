"""A key/value cache for decoding in plain PyTorch: every layer's keys and values so far.

Twin of numpy_attn/kv_cache.py: every layer's slots allocated once, end to end in one tensor for
the keys and one for the values; each step writes its new tokens in place and reads back the
layer's keys and values up to its length; a model hands each layer its own view,
``cache.layer(i)``. A sliding layer (``windows``) keeps min(window, max_len) slots as a rolling
copy: its held tokens then the new ones go to attention, and the last ``window`` of them stay.
Only the key/value heads are stored (grouped-query attention); ``bytes_per_token`` is
full layers x nkv x (hs + v_hs) x itemsize (v_hs the values' width, hs unless ``v_head_size``
says otherwise). Inference only: run it under ``torch.no_grad()``.
"""

from dataclasses import dataclass

import torch


@dataclass
class KVCache:
    """Keys and values of ``lengths[i]`` tokens for each layer i, laid end to end."""

    buffer_k: torch.Tensor   # (N,) every layer's key slots (B, nkv, slots, hs), one after another
    buffer_v: torch.Tensor   # (N,) the same for the values
    lengths: list            # L ints: tokens each layer has seen
    windows: tuple           # L entries: None for a full layer, the window w of a sliding one
    dims: tuple              # (B, nkv, max_len, hs)
    v_head_size: int | None = None   # the values' width when it is not the keys' hs (MLA: dv)

    @property
    def v_hs(self):
        return self.dims[3] if self.v_head_size is None else self.v_head_size

    @property
    def n_layer(self):
        return len(self.windows)

    @property
    def max_len(self):
        return self.dims[2]

    @property
    def length(self):
        return self.lengths[0]

    @property
    def k(self):
        return _stacked(self, self.buffer_k)

    @property
    def v(self):
        return _stacked(self, self.buffer_v, self.v_hs)

    @property
    def bytes_per_token(self):
        B, nkv, max_len, hs = self.dims
        return sum(w is None for w in self.windows) * nkv * (hs + self.v_hs) * self.buffer_k.element_size()

    @property
    def bytes_held(self):
        return sum(self.layer(i).held * self.layer(i).bytes_per_token for i in range(self.n_layer)) * self.dims[0]

    @property
    def nbytes(self):
        return (self.buffer_k.numel() + self.buffer_v.numel()) * self.buffer_k.element_size()

    def layer(self, i):
        """Layer i's view of the cache: its keys, values and length, written in place."""
        return LayerKVCache(self, i)


@dataclass(frozen=True)
class LayerView:
    """One layer's view of a cache (a KVCache, or a cache that holds other layers' states too): the
    cache and the layer's index in it."""

    cache: object
    index: int


class LayerKVCache(LayerView):
    """One layer of a KVCache: what a layer's attention reads and appends to."""

    @property
    def window(self):
        return self.cache.windows[self.index]

    @property
    def slots(self):
        return _slots(self.window, self.cache.max_len)

    @property
    def k(self):
        return _layer_view(self, self.cache.buffer_k)

    @property
    def v(self):
        return _layer_view(self, self.cache.buffer_v, self.cache.v_hs)

    @property
    def length(self):
        return self.cache.lengths[self.index]

    @property
    def held(self):
        return min(self.length, self.slots)

    @property
    def start(self):
        return self.length - self.held

    @property
    def bytes_per_token(self):
        B, nkv, max_len, hs = self.cache.dims
        return nkv * (hs + self.cache.v_hs) * self.cache.buffer_k.element_size()


def init_kv_cache(n_layer, B, n_kv_head, max_len, head_size, dtype=torch.float32, device=None, windows=None,
                  v_head_size=None):
    """An empty cache, all lengths 0; ``windows`` (None = a full layer) and ``v_head_size`` (the
    values' width, default head_size) as in the NumPy twin."""
    windows = (None,) * n_layer if windows is None else tuple(windows)
    slots = sum(_slots(w, max_len) for w in windows) * B * n_kv_head     # every layer's slots, every head
    N_k, N_v = slots * head_size, slots * (head_size if v_head_size is None else v_head_size)
    return KVCache(torch.zeros(N_k, dtype=dtype, device=device), torch.zeros(N_v, dtype=dtype, device=device),
                   [0] * n_layer, windows, (B, n_kv_head, max_len, head_size), v_head_size)


def kv_cache_update(layer_cache, k, v):
    """Append k (B, nkv, T, hs), v (B, nkv, T, v_hs) to ``layer_cache`` (KVCache.layer(i)); return k_all,
    v_all (B, nkv, S, hs), (B, nkv, S, v_hs)."""
    start = layer_cache.length
    end = start + k.shape[2]
    if end > layer_cache.cache.max_len:
        raise ValueError(f"cache overflow: layer {layer_cache.index} holds {start} tokens, appending "
                         f"{k.shape[2]} would make {end} > max_len = {layer_cache.cache.max_len}")
    if layer_cache.window is not None:   # a sliding layer: a rolling copy of its last `window` tokens
        return _sliding_update(layer_cache, k, v)
    layer_cache.k[:, :, start:end] = k                                  # (B, nkv, T, hs) into its slots
    layer_cache.v[:, :, start:end] = v
    layer_cache.cache.lengths[layer_cache.index] = end
    k_all = layer_cache.k[:, :, :end]                                   # (B, nkv, S, hs)
    v_all = layer_cache.v[:, :, :end]                                   # (B, nkv, S, hs)
    return k_all, v_all


def _sliding_update(layer_cache, k, v):
    """The held tokens then the new ones go to attention; the last ``slots`` of them stay."""
    held = layer_cache.held
    k_all = torch.cat([layer_cache.k[:, :, :held], k], dim=2)          # (B, nkv, held + T, hs)
    v_all = torch.cat([layer_cache.v[:, :, :held], v], dim=2)          # (B, nkv, held + T, hs)
    keep = min(layer_cache.slots, k_all.shape[2])                       # the last `window` tokens
    layer_cache.k[:, :, :keep] = k_all[:, :, k_all.shape[2] - keep:]   # (B, nkv, keep, hs)
    layer_cache.v[:, :, :keep] = v_all[:, :, k_all.shape[2] - keep:]
    layer_cache.cache.lengths[layer_cache.index] += k.shape[2]
    return k_all, v_all


def _slots(window, max_len):
    return max_len if window is None else min(window, max_len)


def _layer_view(layer_cache, buffer, hs=None):
    """(B, nkv, slots, hs) view of one layer's part of a buffer laid out layer after layer; hs
    defaults to the keys'."""
    cache = layer_cache.cache
    B, nkv, max_len, key_hs = cache.dims
    hs = key_hs if hs is None else hs
    before = sum(_slots(w, max_len) for w in cache.windows[:layer_cache.index])   # slots of the layers before
    size = B * nkv * layer_cache.slots * hs
    return buffer[before * B * nkv * hs:][:size].view(B, nkv, layer_cache.slots, hs)


def _stacked(cache, buffer, hs=None):
    """(L, B, nkv, max_len, hs) view of a buffer whose layers are all full (hs default the keys');
    raise otherwise."""
    if any(w is not None for w in cache.windows):
        raise ValueError(f"a cache with sliding layers (windows {list(cache.windows)}) has layers of "
                         "different sizes: read each one's keys and values as cache.layer(i).k, .v")
    return buffer.view((cache.n_layer,) + cache.dims[:3] + (cache.dims[3] if hs is None else hs,))


# No single PyTorch built-in: test_kv_cache.py checks it against torch.cat of the steps' keys and
# values, and against transformers' DynamicCache.update (the same contract) where it is installed.
