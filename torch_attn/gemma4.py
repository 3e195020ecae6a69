"""Gemma 4 (text) in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/gemma4.py: blocks x + rms_norm(attn(rms_norm(x))) and
x + rms_norm(geglu(rms_norm(x))) (the experts' output added to the GeGLU's, each normed, with
a mixture of experts; then x + rms_norm((gelu(x @ g) * e_i) @ p) with per-layer
inputs), times the layer's scalar, every norm scaling by w; q and k
RMS-normed per head, v too without weight, scores unscaled; the global layers' wider heads turning
only their first pairs; the last n_kv_shared_layers layers attending over an earlier layer's keys
and values (autograd adds both uses' gradients by itself, as it adds wte's through the blocks and
through the per-layer inputs, and k's projection's as keys and as values where they are one).
"""

from dataclasses import dataclass
from functools import partial

import torch

from torch_attn import _model
from torch_attn.embedding import embedding
from torch_attn.gelu import gelu
from torch_attn.kv_cache import KVCache, LayerKVCache, init_kv_cache, kv_cache_update
from torch_attn.linear import linear
from torch_attn.moe import experts, top_k
from torch_attn.multi_head import merge_heads, split_heads
from torch_attn.rms_norm import rms_norm
from torch_attn.rope import rope
from torch_attn.swiglu import swiglu

# -- RoPE per layer type ----------------------------------------------------------------------------

def gemma4_rotate(x, positions, config, window):
    """Rotate x (B, n, T, hs): a sliding layer every pair with rope_local_theta, a global one its
    first r pairs (channels j and j + hs/2) with base theta^(2r/hs) over those 2r channels."""
    hs = x.shape[-1]
    pos = positions if positions.ndim == 1 else positions[:, None, :]         # (B, T) -> (B, 1, T): all heads
    if window is not None:
        return rope(x, pos, config.rope_local_theta, "half")                  # (B, n, T, hs)
    r = int(config.partial_rotary_factor * hs // 2)
    h = hs // 2
    turned = rope(torch.cat([x[..., :r], x[..., h:h + r]], dim=-1), pos, config.rope_theta ** (2 * r / hs), "half")
    return torch.cat([turned[..., :r], x[..., r:h], turned[..., r:], x[..., h + r:]], dim=-1)   # (B, n, T, hs)


# -- attention: QK- and V-norm, scores unscaled, keys and values maybe another layer's -------------

def gemma4_attention(x, params, config, positions, *, attn_mask=None, kv_cache=None, window=None, layer=0,
                     shared=None):
    """x (B, T, C) -> (B, T, C); k, v made here (v the projected k where the layer's values are its
    keys) and kept in ``shared``, or read from it on a shared layer."""
    nh, nkv, eps = config.n_head, config.layer_nkv(layer), config.rms_eps
    source = config.kv_source(layer)
    q = split_heads(linear(x, **params["q"]), nh)                             # (B, nh, T, hs)
    q = gemma4_rotate(rms_norm(q, params["q_norm"]["w"], eps), positions, config, window)
    if source == layer:
        k = split_heads(linear(x, **params["k"]), nkv)                        # (B, nkv, T, hs)
        v = k if config.k_eq_v(layer) else split_heads(linear(x, **params["v"]), nkv)   # (B, nkv, T, hs)
        k = gemma4_rotate(rms_norm(k, params["k_norm"]["w"], eps), positions, config, window)
        v = rms_norm(v, torch.ones(v.shape[-1], dtype=v.dtype, device=v.device), eps)   # no weight
        if kv_cache is not None:   # decoding: the held tokens' keys and values, then the new ones
            k, v = kv_cache_update(kv_cache, k, v)                            # (B, nkv, S, hs)
        shared[layer] = (k, v)
    else:   # made by an earlier layer, the cached ones included: this layer holds none
        k, v = shared[source]                                                 # (B, nkv, S, hs)
    y = _model.cached_attention(q, k, v, None, attn_mask, window=window, scale=1.0)   # (B, nh, T, hs)
    return linear(merge_heads(y), **params["o"])                              # (B, T, C)


# -- per-layer inputs: each token's own input to every layer ---------------------------------------

def gemma4_per_layer_inputs(ids, params, config):
    """e (B, T, L, P) for ``ids`` (B, T): (rms_norm(x0 @ m / sqrt(C)) + wte_pl[ids] * sqrt(P)) / sqrt(2)."""
    C, L, P, eps = config.n_embd, config.n_layer, config.per_layer_input_size, config.rms_eps
    p, pad = params["per_layer"], config.pad_token_id
    c, root_p, inv_c, half = (torch.tensor(v, dtype=p["wte"].dtype) for v in (C ** 0.5, P ** 0.5, C ** -0.5, 2 ** -0.5))
    x = embedding(ids, params["wte"], pad) * c                                # x0 (B, T, C)
    t = (embedding(ids, p["wte"], pad) * root_p).reshape(*ids.shape, L, P)    # (B, T, L, P)
    m = rms_norm((linear(x, **p["proj"]) * inv_c).reshape(*ids.shape, L, P), p["norm"]["w"], eps)   # per group
    return (m + t) * half                                                     # (B, T, L, P)


def gemma4_per_layer(x, params, e, eps):
    """The block's last sublayer: x (B, T, C), e (B, T, P) -> rms_norm((gelu(x @ g) * e) @ p) (B, T, C)."""
    a = gelu(linear(x, **params["gate"]), approximate="tanh")                 # (B, T, P)
    return rms_norm(linear(a * e, **params["proj"]), params["norm"]["w"], eps)


# -- the mixture of experts beside the MLP --------------------------------------------------------

def gemma4_router(x, router, k, eps):
    """x (N, C) -> (weights (N, k), indices (N, k)): p = softmax(rms_norm(x) * scale / sqrt(C) @ w)
    over all E; the k largest p divided by their sum, times their experts' expert_scale."""
    C = x.shape[-1]
    p = torch.softmax(linear(rms_norm(x, router["scale"] * C ** -0.5, eps), router["w"]), dim=-1)   # (N, E)
    indices = top_k(p, k)                                                     # (N, k)
    chosen = torch.gather(p, -1, indices)                                     # (N, k)
    return chosen / chosen.sum(dim=-1, keepdim=True) * router["expert_scale"][indices], indices


def gemma4_moe(x, f, params, config):
    """The MLP's output f (B, T, C) and the experts' on the block's x (B, T, C), each normed, added."""
    eps, C = config.rms_eps, config.n_embd
    flat = x.reshape(-1, C)                                                   # (N, C)
    weights, indices = gemma4_router(flat, params["router"], config.experts_per_token, eps)
    h = experts(rms_norm(flat, params["norm"]["w"], eps), weights, indices, params["experts"],
                partial(swiglu, act="gelu_tanh"))   # (N, C)
    return rms_norm(f, params["dense_post_norm"]["w"], eps) + rms_norm(h.reshape(x.shape), params["post_norm"]["w"],
                                                                       eps)


# -- the block: a norm before and after each sublayer, then the layer's scalar ----------------------

def gemma4_block(x, params, config, positions, *, attn_mask=None, kv_cache=None, window=None, layer=0,
                 shared=None, inputs=None):
    """One block: x (B, T, C) -> (B, T, C); ``inputs`` the per-layer inputs (B, T, L, P), or None."""
    eps = config.rms_eps
    h = rms_norm(x, params["attn_norm"]["w"], eps)                            # (B, T, C)
    a = gemma4_attention(h, params["attn"], config, positions, attn_mask=attn_mask, kv_cache=kv_cache,
                         window=window, layer=layer, shared=shared)           # (B, T, C)
    x = x + rms_norm(a, params["attn_post_norm"]["w"], eps)
    h = rms_norm(x, params["mlp_norm"]["w"], eps)                             # (B, T, C)
    f = swiglu(h, params["mlp"], act="gelu_tanh")                             # (B, T, C) via (B, T, H)
    if config.enable_moe:
        f = gemma4_moe(x, f, params["moe"], config)                           # (B, T, C)
    x = x + rms_norm(f, params["mlp_post_norm"]["w"], eps)
    if inputs is not None:
        x = x + gemma4_per_layer(x, params["per_layer"], inputs[:, :, layer], eps)   # (B, T, C)
    return x * params["layer_scalar"]["w"]                                    # (B, T, C)


# -- the model ------------------------------------------------------------------------------------

def gemma4(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
           logits_to_keep=None):
    """Logits for integer ``ids`` (B, T) -> (B, T, V); keywords as gemma3's."""
    shared = {}   # this forward's keys and values, which the shared layers read
    inputs = gemma4_per_layer_inputs(ids, params, config) if config.per_layer_input_size else None
    return _model.decoder(ids, params, config, gemma4_block, positions=positions, attn_mask=attn_mask,
                          kv_cache=kv_cache, logits_to_keep=logits_to_keep, embed_scale=config.n_embd ** 0.5,
                          logit_softcap=config.final_logit_softcap, padding_idx=config.pad_token_id,
                          layer_options=lambda i: {"window": config.window(i), "layer": i, "shared": shared,
                                                                    "inputs": inputs})


# -- decoding: keys and values of the layers that make them, once ---------------------------------

@dataclass
class Gemma4Cache(KVCache):
    """KVCache's slots for the layers that make keys and values of layer 0's head size and count,
    ``wide`` for those of the other; a shared layer holds none."""

    sources: tuple = ()    # per layer: (0, j) here, (1, j) in wide, None on a shared layer
    wide: KVCache | None = None

    @property
    def n_layer(self):
        return len(self.sources)

    @property
    def bytes_per_token(self):
        return super().bytes_per_token + (0 if self.wide is None else self.wide.bytes_per_token)

    @property
    def bytes_held(self):
        own = sum(LayerKVCache(self, j).held * LayerKVCache(self, j).bytes_per_token
                  for j in range(len(self.windows))) * self.dims[0]
        return own + (0 if self.wide is None else self.wide.bytes_held)

    @property
    def nbytes(self):
        return super().nbytes + (0 if self.wide is None else self.wide.nbytes)

    def layer(self, i):
        """Layer i's keys and values, here or in ``wide``, or None on a shared layer."""
        if self.sources[i] is None:
            return None
        part, j = self.sources[i]
        return LayerKVCache(self, j) if part == 0 else self.wide.layer(j)


def gemma4_kv_cache(config, B, dtype=torch.float32, max_len=None, device=None):
    """An empty cache: a layer that makes keys holds them (a sliding one its last window), a shared
    one none; the layers of another head size or count than layer 0's in ``wide``."""
    max_len = config.block_size if max_len is None else max_len
    makers = [i for i in range(config.n_layer) if config.kv_source(i) == i]
    shape = lambda i: (config.layer_nkv(i), config.layer_hs(i))   # noqa: E731
    parts = ([i for i in makers if shape(i) == shape(0)], [i for i in makers if shape(i) != shape(0)])
    own, wide = (init_kv_cache(len(part), B, config.layer_nkv(part[0]), max_len, config.layer_hs(part[0]), dtype,
                               device, windows=[config.window(i) for i in part]) if part else None for part in parts)
    sources = tuple(None if i not in makers else (0, parts[0].index(i)) if i in parts[0] else (1, parts[1].index(i))
                    for i in range(config.n_layer))
    return Gemma4Cache(own.buffer_k, own.buffer_v, own.lengths, own.windows, own.dims, None, sources, wide)


# Equals Hugging Face's transformers Gemma4ForCausalLM(...).logits holding the same weights;
# parity_tests/test_gemma4.py checks it in float64.
