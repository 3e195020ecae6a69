"""Multi-head latent attention (MLA) in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/mla.py: the query's low-rank path (q_a, RMS norm, q_b; or one projection q),
the joint key/value compression kv_a to the latent c_kv (RMS norm) and the shared rotary key k_r,
kv_b up to per-head k_n and v, causal attention with ``MLAConfig.softmax_scale``, o (with a naive
key/value cache of full per-head keys and values, as numpy_attn/mla.py's); and absorbed
decoding from a latent cache (W_uk folded into the query, W_uv after the weighted sum), on the
same nested parameter dict and the same ``MLAConfig``. float16 and bfloat16: each operation
rounds its own output, and the absorbed path's two matmuls are cast up and rounded once, as in
the NumPy twin (the same numbers as torch's own low-precision matmul, float32 inside).
"""

from dataclasses import dataclass

import torch

from torch_attn._opmath import upcast
from torch_attn.attention import scaled_dot_product_attention
from torch_attn.kv_cache import init_kv_cache, kv_cache_update
from torch_attn.linear import linear
from torch_attn.rms_norm import rms_norm
from torch_attn.rope import rope as rotate

# -- the query and the latent, shared by both paths -----------------------------------------------

def _query(x, params, config, pos):
    """x (B, T, C) -> q_n (B, nh, T, dn), rotated q_r (B, nh, T, dr)."""
    B, T, C = x.shape
    nh, dn, dr = config.n_head, config.qk_nope_head_dim, config.qk_rope_head_dim
    if config.q_lora_rank is None:   # one full-rank projection
        q = linear(x, **params["q"])                                          # (B, T, C) -> (B, T, nh*(dn+dr))
    else:
        c_q = linear(x, **params["q_a"])                                      # (B, T, C) -> (B, T, rq)
        c_q = rms_norm(c_q, params["q_a_norm"]["w"], config.rms_eps)          # (B, T, rq)
        q = linear(c_q, **params["q_b"])                                      # (B, T, rq) -> (B, T, nh*(dn+dr))
    q = q.reshape(B, T, nh, dn + dr).transpose(1, 2)                          # -> (B, nh, T, dn+dr)
    q_n, q_r = q[..., :dn], q[..., dn:]                                       # (B, nh, T, dn), (B, nh, T, dr)
    q_r = rotate(q_r, pos, config.rope_theta, config.rope_layout,
                 config.rope_scaling)                                         # (B, nh, T, dr)
    return q_n, q_r


def _latent(x, params, config, pos):
    """x (B, T, C) -> the normed latent c_kv (B, T, rkv), the rotated shared key k_r (B, 1, T, dr)."""
    B, T, C = x.shape
    rkv = config.kv_lora_rank
    kv = linear(x, **params["kv_a"])                                          # (B, T, C) -> (B, T, rkv+dr)
    c_kv, k_r = kv[..., :rkv], kv[..., rkv:]                                  # (B, T, rkv), (B, T, dr)
    c_kv = rms_norm(c_kv, params["kv_a_norm"]["w"], config.rms_eps)           # (B, T, rkv)
    k_r = rotate(k_r[:, None], pos, config.rope_theta, config.rope_layout,
                 config.rope_scaling)                                         # (B, T, dr) -> (B, 1, T, dr)
    return c_kv, k_r


# -- naive MLA: keys and values per head ----------------------------------------------------------

def mla(x, params, config, positions=None, kv_cache=None, attn_mask=None):
    """Causal MLA: x (B, T, C), positions (T,) or (B, T) (default past..past+T-1) -> (B, T, C);
    ``kv_cache`` (init_mla_kv_cache(...).layer(i)) holds the past tokens' keys and values."""
    B, T, C = x.shape
    past = 0 if kv_cache is None else kv_cache.length                         # tokens already cached
    positions = torch.arange(past, past + T, device=x.device) if positions is None else positions
    nh, dn, dr, dv = config.n_head, config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
    pos = positions if positions.ndim == 1 else positions[:, None, :]         # (B, T) -> (B, 1, T): all heads
    q_n, q_r = _query(x, params, config, pos)                                 # (B, nh, T, dn), (B, nh, T, dr)
    c_kv, k_r = _latent(x, params, config, pos)                               # (B, T, rkv), (B, 1, T, dr)
    kv = linear(c_kv, **params["kv_b"])                                       # (B, T, rkv) -> (B, T, nh*(dn+dv))
    kv = kv.reshape(B, T, nh, dn + dv).transpose(1, 2)                        # -> (B, nh, T, dn+dv)
    k_n, v = kv[..., :dn], kv[..., dn:]                                       # (B, nh, T, dn), (B, nh, T, dv)
    q = torch.cat([q_n, q_r], dim=-1)                                         # (B, nh, T, dn+dr)
    k = torch.cat([k_n, k_r.expand(B, nh, T, dr)], dim=-1)                    # (B, nh, T, dn+dr): k_r shared
    if kv_cache is not None:   # decoding: the past tokens' keys and values come from the cache
        k, v = kv_cache_update(kv_cache, k, v)                                # -> (B, nh, S, dn+dr), (B, nh, S, dv)
    y, _ = scaled_dot_product_attention(q, k, v, attn_mask, is_causal=_causal(attn_mask),
                                        scale=config.softmax_scale)           # (B, nh, T, dv)
    y = y.transpose(1, 2).reshape(B, T, nh * dv)                              # (B, nh, T, dv) -> (B, T, nh*dv)
    out = linear(y, **params["o"])                                            # (B, T, nh*dv) -> (B, T, C)
    return out


def init_mla_kv_cache(config, n_layer, B, max_len, dtype=torch.float32, device=None):
    """An empty naive cache for ``n_layer`` MLA layers: per head keys of dn + dr, values of dv."""
    return init_kv_cache(n_layer, B, config.n_head, max_len, config.qk_head_dim, dtype, device,
                         v_head_size=config.v_head_dim)


# -- absorbed MLA: decoding from a cache of latents ----------------------------------------------

@dataclass
class LatentCache:
    """The normed latents and rotated shared keys of ``length`` tokens, in tensors of max_len slots."""

    c_kv: torch.Tensor     # (B, max_len, rkv)
    k_r: torch.Tensor      # (B, max_len, dr)
    length: int = 0        # tokens stored: the position of the next token


def init_latent_cache(config, B, max_len, dtype=torch.float32, device=None):
    """An empty latent cache of one MLA layer for B sequences of up to ``max_len`` tokens."""
    return LatentCache(torch.zeros(B, max_len, config.kv_lora_rank, dtype=dtype, device=device),
                       torch.zeros(B, max_len, config.qk_rope_head_dim, dtype=dtype, device=device))


def latent_cache_update(latent_cache, c_kv, k_r):
    """Append c_kv (B, T, rkv) and k_r (B, T, dr); return all of them so far, (B, S, rkv), (B, S, dr)."""
    start, end = latent_cache.length, latent_cache.length + c_kv.shape[1]
    latent_cache.c_kv[:, start:end] = c_kv                                    # (B, T, rkv) into its slots
    latent_cache.k_r[:, start:end] = k_r                                      # (B, T, dr)
    latent_cache.length = end
    return latent_cache.c_kv[:, :end], latent_cache.k_r[:, :end]             # (B, S, rkv), (B, S, dr)


def mla_absorbed(x, params, config, latent_cache, positions=None, attn_mask=None):
    """MLA of the T new tokens x (B, T, C) over the cached ones and themselves -> (B, T, C)."""
    B, T, C = x.shape
    past = latent_cache.length
    positions = torch.arange(past, past + T, device=x.device) if positions is None else positions
    nh, dn, dv, rkv = config.n_head, config.qk_nope_head_dim, config.v_head_dim, config.kv_lora_rank
    pos = positions if positions.ndim == 1 else positions[:, None, :]         # (B, T) -> (B, 1, T): all heads
    q_n, q_r = _query(x, params, config, pos)                                 # (B, nh, T, dn), (B, nh, T, dr)
    c_kv, k_r = _latent(x, params, config, pos)                               # (B, T, rkv), (B, 1, T, dr)
    c_kv, k_r = latent_cache_update(latent_cache, c_kv, k_r[:, 0])            # (B, S, rkv), (B, S, dr)
    w_kv = params["kv_b"]["w"].reshape(rkv, nh, -1).transpose(0, 1)           # (rkv, nh*(dn+dv)) -> (nh, rkv, dn+dv)
    w_uk, w_uv = w_kv[..., :dn], w_kv[..., dn:]                               # (nh, rkv, dn), (nh, rkv, dv)
    q_c = (upcast(q_n) @ upcast(w_uk).transpose(-1, -2)).to(x.dtype)          # (B, nh, T, dn) -> (.., rkv)
    q = torch.cat([q_c, q_r], dim=-1)                                         # (B, nh, T, rkv+dr)
    k = torch.cat([c_kv, k_r], dim=-1)[:, None]                               # (B, 1, S, rkv+dr): one head for all
    y_c, _ = scaled_dot_product_attention(q, k, c_kv[:, None], attn_mask, is_causal=_causal(attn_mask),
                                          scale=config.softmax_scale)         # (B, nh, T, rkv)
    y = (upcast(y_c) @ upcast(w_uv)).to(x.dtype)                              # (B, nh, T, rkv) -> (B, nh, T, dv)
    y = y.transpose(1, 2).reshape(B, T, nh * dv)                              # (B, nh, T, dv) -> (B, T, nh*dv)
    out = linear(y, **params["o"])                                            # (B, T, nh*dv) -> (B, T, C)
    return out


def _causal(attn_mask):
    """The causal mask aligned bottom-right, unless ``attn_mask`` (which holds it) is given."""
    return "bottom_right" if attn_mask is None else False


# No PyTorch built-in. ``mla`` equals Hugging Face's
# transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3Attention holding the same weights
# (transposed into nn.Linear's (C_out, C_in)), and ``mla_absorbed``, step by step, equals ``mla``;
# parity_tests/test_mla.py checks both, in float32 and float64.
