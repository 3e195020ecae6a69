"""Qwen3.5's language model in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/qwen3_5.py: torch_attn/llama.py's blocks, norms scaling by 1 + w, each layer's
mixer either Qwen3's attention with an output gate and partial rotary (full layers) or Gated
DeltaNet (torch_attn/gated_deltanet.py, linear layers); its cache keeps keys and values on the full
layers and Gated DeltaNet's state on the linear ones.
"""

from dataclasses import dataclass, field

import torch

from torch_attn import _model
from torch_attn.gated_deltanet import gated_deltanet
from torch_attn.kv_cache import KVCache, LayerKVCache, LayerView, init_kv_cache
from torch_attn.linear import linear
from torch_attn.llama import llama_block
from torch_attn.multi_head import merge_heads
from torch_attn.qk_norm import qk_norm
from torch_attn.swiglu import sigmoid

# -- the full layers' attention: Qwen3's, with an output gate and partial rotary ----------------------

def gated_attention(x, params, config, positions, *, attn_mask=None, kv_cache=None):
    """Qwen3's attention with the output gate and partial rotary: x (B, T, C) -> (B, T, C)."""
    nh, nkv, hs = config.n_head, config.n_kv_head, config.hs
    qg, k, v = _model.heads(x, params, nh, nkv)                               # (B, nh, T, 2hs), (B, nkv, T, hs)
    q, gate = qg[..., :hs], qg[..., hs:]                                      # [query | gate]: (B, nh, T, hs) each
    q, k = qk_norm(q, k, params, config.rms_eps, offset=1.0)                  # each head, 1 + w
    q, k = _model.rotate(q, k, positions, config.rope_theta, config.rope_scaling, config.rope_layout,
                         config.rotary_dim)                                   # the first rotary_dim
    y = _model.cached_attention(q, k, v, kv_cache, attn_mask)                 # (B, nh, T, hs)
    return linear(merge_heads(y) * sigmoid(merge_heads(gate)), **params["o"])   # (B, T, nh*hs) -> (B, T, C)


# -- the linear layers' mixer: Gated DeltaNet as a sublayer ------------------------------------------

def state_sublayer(mixer):
    """A sublayer from a linear-attention sublayer ``mixer(x, params, config, state, mask)`` ->
    (out, new_state) that continues the state of ``kv_cache`` if given and writes the new one there."""
    def forward(x, params, config, positions, *, attn_mask=None, kv_cache=None):
        state = None if kv_cache is None or kv_cache.length == 0 else kv_cache.state
        out, new_state = mixer(x, params, config, state, _token_mask(attn_mask, x.shape[:2], config.n_head))
        if kv_cache is not None:
            kv_cache.update(new_state, x.shape[1])
        return out
    return forward


def _gated_deltanet(x, params, config, state, mask):
    """Gated DeltaNet with the config's sizes."""
    return gated_deltanet(x, params, config.linear_k_heads, config.linear_v_heads, config.linear_k_dim,
                          config.linear_v_dim, config.rms_eps, state=state, mask=mask)


# Gated DeltaNet on x (B, T, C) -> (B, T, C).
linear_attention = state_sublayer(_gated_deltanet)


def _token_mask(attn_mask, shape, n_head):
    """(B, T) bool, False at the new tokens attn_mask marks as padding, or None when there is none."""
    if attn_mask is None:
        return None
    B, T = shape
    S = attn_mask.shape[-1]
    m = attn_mask.expand(B, n_head, T, S)
    t = torch.arange(T, device=m.device)
    own = m[:, :, t, S - T + t].all(dim=1)                                    # (B, T): query t on its own key
    return None if bool(own.all()) else own


# -- the model -------------------------------------------------------------------------------------

def _layer_options(config):
    """Block i's options: its mixer, and norms that scale by 1 + w."""
    return lambda i: {"attention": gated_attention if config.is_full(i) else linear_attention, "norm_offset": 1.0}


def qwen3_5(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
            logits_to_keep=None):
    """Logits for integer ``ids`` (B, T) -> (B, T, V); keywords as llama's, ``kv_cache`` from qwen3_5_kv_cache."""
    return hybrid_decoder(ids, params, config, _layer_options(config), positions=positions, attn_mask=attn_mask,
                          kv_cache=kv_cache, logits_to_keep=logits_to_keep)


def hybrid_decoder(ids, params, config, layer_options, **keywords):
    """decoder with Llama's blocks, each layer's mixer (and network) from ``layer_options``, the final
    norm scaling by 1 + w."""
    return _model.decoder(ids, params, config, llama_block, **keywords,
                          norm_offset=1.0, layer_options=layer_options)


# -- decoding: keys and values on the full layers, Gated DeltaNet's state on the linear ones ----------

@dataclass
class Qwen3_5Cache(KVCache):
    """KVCache's slots for the full layers only, and each linear layer's state and length."""

    layer_types: tuple = ()
    full_index: tuple = ()
    states: list = field(default_factory=list)
    linear_lengths: list = field(default_factory=list)

    @property
    def n_layer(self):
        return len(self.layer_types)

    @property
    def length(self):
        return self.layer(0).length

    def layer(self, i):
        """Layer i's view: a full layer's keys and values, or a linear layer's state."""
        if self.full_index[i] is not None:
            return LayerKVCache(self, self.full_index[i])
        return LinearLayerState(self, i)


class LinearLayerState(LayerView):
    """One linear layer of a Qwen3_5Cache: the state it continues and replaces."""

    @property
    def state(self):
        return self.cache.states[self.index]

    @property
    def length(self):
        return self.cache.linear_lengths[self.index]

    def update(self, state, T):
        """Keep ``state`` (after T more tokens)."""
        self.cache.states[self.index] = state
        self.cache.linear_lengths[self.index] += T


def qwen3_5_kv_cache(config, B, dtype=torch.float32, max_len=None, device=None):
    """An empty cache: the full layers' keys and values, each linear layer's state at zeros."""
    max_len = config.block_size if max_len is None else max_len
    full = [i for i in range(config.n_layer) if config.is_full(i)]
    kv = init_kv_cache(len(full), B, config.n_kv_head, max_len, config.hs, dtype, device)
    K = config.conv_kernel
    states = [None if config.is_full(i) else
              {"conv": torch.zeros(B, config.conv_dim, K - 1, dtype=dtype, device=device),
               "recurrent": torch.zeros(B, config.linear_v_heads, config.linear_k_dim, config.linear_v_dim,
                                        dtype=dtype, device=device)}
              for i in range(config.n_layer)]
    full_index = tuple(full.index(i) if i in full else None for i in range(config.n_layer))
    return Qwen3_5Cache(kv.buffer_k, kv.buffer_v, kv.lengths, kv.windows, kv.dims, None, tuple(config.layer_types),
                        full_index, states, [0] * config.n_layer)


# Equals Hugging Face's transformers Qwen3_5ForCausalLM(...).logits holding the same weights;
# parity_tests/test_qwen3_5.py checks it in float64.
