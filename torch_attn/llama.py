"""A Llama-style language model in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/llama.py: blocks of x + attn(rms_norm(x)) (RoPE on q and k, grouped-query
heads, causal) and x + swiglu(rms_norm(x)) inside torch_attn/_model.py's ``decoder`` (token
embedding, final RMS norm, output layer), on the same nested parameter dict and the same
``LlamaConfig``. ``positions``, ``attn_mask`` and ``kv_cache`` (llama_kv_cache,
torch_attn/kv_cache.py) as in the NumPy twin.
"""

import torch

from torch_attn import _model
from torch_attn.kv_cache import init_kv_cache
from torch_attn.rms_norm import rms_norm
from torch_attn.swiglu import swiglu

# -- attention with rotary positions and grouped-query heads ------------------------------------

def llama_attention(x, params, config, positions, *, attn_mask=None, kv_cache=None):
    """Causal self-attention with RoPE: x (B, T, C), positions (T,) or (B, T) -> (B, T, C);
    with a ``kv_cache`` (this layer's) x holds only the new tokens."""
    q, k, v = _model.heads(x, params, config.n_head, config.n_kv_head)        # (B, nh | nkv, T, hs)
    q, k = _model.rotate(q, k, positions, config.rope_theta, config.rope_scaling, config.rope_layout)
    out = _model.attend(q, k, v, params["o"], kv_cache, attn_mask)            # (B, T, C)
    return out


# -- the block ------------------------------------------------------------------------------------

def swiglu_mlp(h, params, config):
    """Llama's network as a sublayer: swiglu(h) (B, T, C) -> (B, T, C) via (B, T, H)."""
    return swiglu(h, params)


def llama_block(x, params, config, positions, *, attn_mask=None, kv_cache=None, attention=llama_attention,
                mlp=swiglu_mlp, round_xhat=True, norm_offset=0.0, **attention_options):
    """One block: x (B, T, C) -> (B, T, C); ``attn_mask``, ``kv_cache`` and ``attention_options`` go
    to ``attention``; ``attention``, ``mlp`` and the norms' ``round_xhat`` and ``norm_offset`` are
    Llama's unless a family built on this block brings its own."""
    # 1-3: x + attn(rms_norm(x)), h and a (B, T, C)
    h = rms_norm(x, params["attn_norm"]["w"], config.rms_eps, norm_offset, round_xhat)
    a = attention(h, params["attn"], config, positions, attn_mask=attn_mask,
                  kv_cache=kv_cache, **attention_options)                     # (B, T, C)
    x = x + a
    # 4-6: x + mlp(rms_norm(x)), Llama's mlp a SwiGLU network; h and f (B, T, C)
    h = rms_norm(x, params["mlp_norm"]["w"], config.rms_eps, norm_offset, round_xhat)
    f = mlp(h, params["mlp"], config)                                         # (B, T, C) via (B, T, H)
    out = x + f
    return out


# -- the model ------------------------------------------------------------------------------------

def llama(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
          logits_to_keep=None):
    """Logits for integer ``ids`` (B, T) -> (B, T, V); ``positions``, ``attn_mask``, ``kv_cache``
    (llama_kv_cache) and ``logits_to_keep`` (-> (B, N, V)) as in the NumPy twin."""
    return _model.decoder(ids, params, config, llama_block, positions=positions,
                          attn_mask=attn_mask, kv_cache=kv_cache, logits_to_keep=logits_to_keep)


def llama_kv_cache(config, B, dtype=torch.float32, max_len=None, device=None):
    """An empty key/value cache for decoding B sequences of up to ``max_len`` (default
    block_size) tokens with this model: one layer per block, the nkv key/value heads only."""
    max_len = config.block_size if max_len is None else max_len
    return init_kv_cache(config.n_layer, B, config.n_kv_head, max_len, config.hs, dtype, device)


# Equals Hugging Face's transformers.LlamaForCausalLM(...).logits holding the same weights
# (transposed into nn.Linear's (C_out, C_in)); parity_tests/test_llama.py checks it in float32 and
# float64, and parity_tests/test_hf.py through checkpoints saved by transformers.
