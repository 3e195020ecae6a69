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
where its memory saving comes from. A full layer holds 2 x nkv x hs numbers per token and
sequence of the batch. The new queries attend with the causal mask aligned bottom-right (query t
of T sees keys 0..S-T+t, numpy_attn/masks.py). It holds no gradients: it is for inference only.
A model hands each layer its own view, ``cache.layer(i)``, so that nothing below the model knows
which layer it is.

Sliding layers (``windows``): a layer whose queries see only their last w keys (Mistral, Gemma 2
and 3's local layers) needs only the last w tokens, so it keeps w slots, not max_len, and its
memory stops growing once they are full. It is a rolling copy, not a ring buffer: each step hands
attention its held keys followed by the new ones (a fresh array), then keeps the last w of those
in its slots, oldest first. So attention always receives a run of consecutive positions ending
at the newest token, and the bottom-right sliding-window mask it already uses for the full
forward is the right one, with no positions passed and no reordering; the copy (w tokens a step)
is of the size attention reads anyway. A ring buffer would save that copy but hand the keys over
out of order, which needs a mask built from each slot's position (the summation order would then
differ from the full forward's, too). A layer holds w tokens after the step, one more than the
next query needs (its oldest key falls outside that query's window): they are exactly the keys
the newest query saw.

How a model uses it:

    cache = init_kv_cache(n_layer, B, n_kv_head, max_len, hs, dtype, windows=[None, 4096, ...])
    past = cache.length                          # positions of the new tokens: past .. past + T - 1
    # in layer i, with k, v (B, nkv, T, hs) of the T new tokens (rotated at those positions):
    layer = cache.layer(i)
    k_all, v_all = kv_cache_update(layer, k, v)  # (B, nkv, S, hs): held keys, then the new ones
    S = k_all.shape[2]                           # on a sliding layer, attn_mask instead of is_causal:
    out, _ = scaled_dot_product_attention_forward(q, k_all, v_all, is_causal="bottom_right")
    # attn_mask=sliding_window_mask(T, S, layer.window, "bottom_right")

S is past + T on a full layer and min(past, w) + T on a sliding one; either way the last T keys
are the new tokens', so bottom-right alignment puts each query at its own position.
``layer.start`` is the position of the first key held (0 on a full layer), ``layer.held`` how many.
``cache.bytes_per_token`` is what each further token adds (the full layers' share),
``cache.bytes_held`` what the tokens held take now, ``cache.nbytes`` the allocation.

Keys and values may differ in width (``v_head_size``): naive multi-head latent attention
(numpy_attn/mla.py) caches keys of dn + dr numbers a head and values of dv.

The cache takes the model's dtype: float16 or bfloat16 keys and values are stored as they are,
2 bytes a number, half the bytes per token of float32 (a copy is exact; attention casts them up
to float32 when it reads them). Keys and values of another dtype are refused, not rounded.
"""

from dataclasses import dataclass

import numpy as np

from numpy_attn._checks import FLOAT_DTYPES, check_window


@dataclass
class KVCache:
    """Keys and values of ``lengths[i]`` tokens for each layer i: ``max_len`` slots for a full
    layer, ``min(window, max_len)`` for a sliding one, laid end to end in one allocation each."""

    buffer_k: np.ndarray   # (N,) every layer's key slots (B, nkv, slots, hs), one after another
    buffer_v: np.ndarray   # (N,) the same for the values
    lengths: np.ndarray    # (L,) int64: tokens each layer has seen (the position of its next one)
    windows: tuple         # L entries: None for a full layer, the window w of a sliding one
    dims: tuple            # (B, nkv, max_len, hs)
    v_head_size: int | None = None   # the values' width when it is not the keys' hs (MLA: dv)

    @property
    def v_hs(self):
        """The values' head size: v_head_size, or the keys' hs."""
        return self.dims[3] if self.v_head_size is None else self.v_head_size

    @property
    def n_layer(self):
        return len(self.windows)

    @property
    def max_len(self):
        """The longest sequence, fixed at allocation (a full layer's number of slots)."""
        return self.dims[2]

    @property
    def length(self):
        """Tokens seen by layer 0: the position of the next token, before a step appends."""
        return int(self.lengths[0])

    @property
    def k(self):
        """(L, B, nkv, max_len, hs): every layer's key slots, when every layer is full (a view)."""
        return _stacked(self, self.buffer_k)

    @property
    def v(self):
        """(L, B, nkv, max_len, hs): every layer's value slots, when every layer is full (a view)."""
        return _stacked(self, self.buffer_v, self.v_hs)

    @property
    def bytes_per_token(self):
        """Bytes each further token of one sequence adds: full layers x nkv x (hs + v_hs) x itemsize
        (2 hs without v_head_size: k and v; a sliding layer adds none once its window is full)."""
        B, nkv, max_len, hs = self.dims
        return sum(w is None for w in self.windows) * nkv * (hs + self.v_hs) * self.buffer_k.itemsize

    @property
    def bytes_held(self):
        """Bytes of the tokens held now, every layer and sequence: a full layer's grow with the
        length, a sliding layer's stop at its window."""
        return sum(self.layer(i).held * self.layer(i).bytes_per_token for i in range(self.n_layer)) * self.dims[0]

    @property
    def nbytes(self):
        """Bytes of the whole allocation: bytes_per_token x B x max_len without sliding layers."""
        return self.buffer_k.nbytes + self.buffer_v.nbytes

    def layer(self, i):
        """Layer i's view of the cache: its keys, values and length, written in place."""
        _check_layer(self, i)
        return LayerKVCache(self, int(i))

    @staticmethod
    def check(kv_cache, n_layer, block_size, T, made_by):
        """Return how many tokens ``kv_cache`` already holds (0 without one); raise unless it is a
        KVCache (from ``made_by``) with a layer per block and room for T more tokens in block_size."""
        if kv_cache is None:
            return 0
        if not isinstance(kv_cache, KVCache):
            raise TypeError(f"kv_cache must be a KVCache ({made_by}), got {type(kv_cache).__name__}")
        if kv_cache.n_layer != n_layer:
            raise ValueError(f"kv_cache has {kv_cache.n_layer} layers (windows {list(kv_cache.windows)}), "
                             f"the model n_layer = {n_layer}")
        past = kv_cache.length                                                # tokens already cached
        if past + T > block_size:
            raise ValueError(f"{past} cached + {T} new tokens = {past + T} exceed block_size = {block_size}")
        return past


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
        """None for a full layer; w for a sliding one (it keeps its last w tokens)."""
        return self.cache.windows[self.index]

    @property
    def slots(self):
        """Tokens it can hold: max_len, or min(window, max_len) for a sliding layer."""
        return _slots(self.window, self.cache.max_len)

    @property
    def k(self):
        """(B, nkv, slots, hs): a view of this layer's key slots in the cache."""
        return _layer_view(self, self.cache.buffer_k)

    @property
    def v(self):
        """(B, nkv, slots, v_hs): a view of this layer's value slots in the cache."""
        return _layer_view(self, self.cache.buffer_v, self.cache.v_hs)

    @property
    def length(self):
        """Tokens this layer has seen."""
        return int(self.cache.lengths[self.index])

    @property
    def held(self):
        """Tokens it holds, in slots 0..held-1: its length, or at most its window."""
        return min(self.length, self.slots)

    @property
    def start(self):
        """The position of the first token held (0 on a full layer)."""
        return self.length - self.held

    @property
    def bytes_per_token(self):
        """Bytes one token of one sequence takes in this layer: nkv x (hs + v_hs) x itemsize."""
        B, nkv, max_len, hs = self.cache.dims
        return nkv * (hs + self.cache.v_hs) * self.cache.buffer_k.itemsize


def init_kv_cache(n_layer, B, n_kv_head, max_len, head_size, dtype=np.float32, windows=None, v_head_size=None):
    """An empty cache for ``n_layer`` layers of a batch of B sequences of up to ``max_len``
    tokens, all lengths 0. ``windows`` (n_layer entries, None = a full layer) makes the layers
    with a window w sliding ones, of min(w, max_len) slots; without it every layer is full, and
    ``cache.k``, ``cache.v`` are (n_layer, B, n_kv_head, max_len, head_size). ``v_head_size``
    (default head_size) is the values' width, when it differs from the keys'."""
    windows = _check_init(n_layer, B, n_kv_head, max_len, head_size, dtype, windows)
    if v_head_size is not None:
        _check_sizes(v_head_size=v_head_size)
        v_head_size = int(v_head_size)
    slots = sum(_slots(w, max_len) for w in windows) * B * n_kv_head     # every layer's slots, every head
    N_k, N_v = slots * head_size, slots * (head_size if v_head_size is None else v_head_size)
    # Zeros rather than np.empty: slots past a layer's length are never read, but zeros make an
    # accidental read show up as a wrong answer that is the same on every run.
    return KVCache(np.zeros(N_k, dtype), np.zeros(N_v, dtype), np.zeros(n_layer, np.int64), windows,
                   (B, n_kv_head, max_len, head_size), v_head_size)


def kv_cache_update(layer_cache, k, v):
    """Append k (B, nkv, T, hs), v (B, nkv, T, v_hs) of T new tokens to ``layer_cache``
    (KVCache.layer(i)); return its keys and values so far, k_all (B, nkv, S, hs) and v_all
    (B, nkv, S, v_hs) with S = old length + T (views), or
    on a sliding layer S = held + T (fresh arrays: the held tokens, then the new ones)."""
    _check_update(layer_cache, k, v)
    if layer_cache.window is not None:   # a sliding layer: a rolling copy of its last `window` tokens
        return _sliding_update(layer_cache, k, v)
    start = layer_cache.length
    end = start + k.shape[2]
    layer_cache.k[:, :, start:end] = k                                  # (B, nkv, T, hs) into its slots
    layer_cache.v[:, :, start:end] = v
    layer_cache.cache.lengths[layer_cache.index] = end
    k_all = layer_cache.k[:, :, :end]                                   # (B, nkv, S, hs)
    v_all = layer_cache.v[:, :, :end]                                   # (B, nkv, S, hs)
    return k_all, v_all


def _sliding_update(layer_cache, k, v):
    """A sliding layer's step: the held tokens then the new ones go to attention, in order; the
    last ``slots`` of them stay, oldest first (see the module docstring for why a rolling copy)."""
    held = layer_cache.held
    k_all = np.concatenate([layer_cache.k[:, :, :held], k], axis=2)    # (B, nkv, held + T, hs)
    v_all = np.concatenate([layer_cache.v[:, :, :held], v], axis=2)    # (B, nkv, held + T, hs)
    keep = min(layer_cache.slots, k_all.shape[2])                       # the last `window` tokens
    layer_cache.k[:, :, :keep] = k_all[:, :, k_all.shape[2] - keep:]   # (B, nkv, keep, hs)
    layer_cache.v[:, :, :keep] = v_all[:, :, k_all.shape[2] - keep:]
    layer_cache.cache.lengths[layer_cache.index] += k.shape[2]
    return k_all, v_all


def _slots(window, max_len):
    """A layer's number of slots: max_len when full, at most its window when sliding."""
    return max_len if window is None else min(window, max_len)


def _layer_view(layer_cache, buffer, hs=None):
    """(B, nkv, slots, hs) view of one layer's part of a buffer laid out layer after layer; hs
    defaults to the keys'."""
    cache = layer_cache.cache
    B, nkv, max_len, key_hs = cache.dims
    hs = key_hs if hs is None else hs
    before = sum(_slots(w, max_len) for w in cache.windows[:layer_cache.index])   # slots of the layers before
    size = B * nkv * layer_cache.slots * hs
    return buffer[before * B * nkv * hs:][:size].reshape(B, nkv, layer_cache.slots, hs)


def _stacked(cache, buffer, hs=None):
    """(L, B, nkv, max_len, hs) view of a buffer whose layers are all full (hs default the keys');
    raise otherwise."""
    if any(w is not None for w in cache.windows):
        raise ValueError(f"a cache with sliding layers (windows {list(cache.windows)}) has layers of "
                         "different sizes: read each one's keys and values as cache.layer(i).k, .v")
    return buffer.reshape((cache.n_layer,) + cache.dims[:3] + (cache.dims[3] if hs is None else hs,))


def _check_init(n_layer, B, n_kv_head, max_len, head_size, dtype, windows):
    """Raise on sizes below 1 or not integers, a dtype other than float16/bfloat16/float32/float64, or
    windows that are not n_layer entries of None or an integer >= 1; return the windows as a tuple."""
    _check_sizes(n_layer=n_layer, B=B, n_kv_head=n_kv_head, max_len=max_len, head_size=head_size)
    if np.dtype(dtype).name not in FLOAT_DTYPES:   # by name: bfloat16 is ml_dtypes'
        raise TypeError(f"dtype must be float16, bfloat16, float32 or float64, got {np.dtype(dtype)}")
    if windows is None:
        return (None,) * n_layer
    if isinstance(windows, str) or not hasattr(windows, "__len__") or len(windows) != n_layer:
        raise ValueError(f"windows must hold one entry per layer (n_layer = {n_layer}): None for a "
                         f"full layer, the window of a sliding one; got {windows!r}")
    for i, w in enumerate(windows):
        check_window(w, f"windows[{i}]")
    return tuple(None if w is None else int(w) for w in windows)


def _check_sizes(**sizes):
    """Raise TypeError for a size that is not an integer, ValueError for one below 1."""
    for name, n in sizes.items():
        if not isinstance(n, int | np.integer) or isinstance(n, bool):
            raise TypeError(f"{name} must be an integer, got {n!r}")
        if n < 1:
            raise ValueError(f"{name} must be >= 1, got {n}")


def _check_layer(cache, i):
    """Raise unless i names one of the cache's layers."""
    L = cache.n_layer
    if not isinstance(i, int | np.integer) or isinstance(i, bool) or not 0 <= i < L:
        raise ValueError(f"layer must be an integer in [0, {L}), got {i!r}")


def _check_update(layer_cache, k, v):
    """Raise unless k (B, nkv, T, hs) and v (B, nkv, T, v_hs) are arrays of the cache's dtype that fit in
    the layer."""
    if not isinstance(layer_cache, LayerKVCache):
        raise TypeError(f"cache must be a KVCache's layer (KVCache.layer(i)), got "
                        f"{type(layer_cache).__name__}")
    cache, layer = layer_cache.cache, layer_cache.index
    B, nkv, max_len, hs = cache.dims
    for name, a, width in (("k", k, hs), ("v", v, cache.v_hs)):
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{name} must be a NumPy array, got {type(a).__name__}")
        if a.dtype != cache.buffer_k.dtype:
            raise TypeError(f"{name} has dtype {a.dtype}, the cache holds {cache.buffer_k.dtype}")
        if a.ndim != 4 or a.shape[:2] != (B, nkv) or a.shape[3] != width:
            hs_name = "hs" if name == "k" or cache.v_head_size is None else "v_hs"
            raise ValueError(f"{name} must have shape (B, nkv, T, {hs_name}) = ({B}, {nkv}, T, {width}) "
                             f"to fit the cache {cache.dims}, got {a.shape}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k and v shapes differ: k {k.shape}, v {v.shape}")
    start = layer_cache.length
    if start + k.shape[2] > max_len:
        raise ValueError(f"cache overflow: layer {layer} holds {start} tokens, appending "
                         f"{k.shape[2]} would make {start + k.shape[2]} > max_len = {max_len}")
