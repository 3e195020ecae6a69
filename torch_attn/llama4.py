"""Llama 4's text model in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/llama4.py: torch_attn/llama.py's blocks with Llama 4's attention (chunked and
rotary with q and k normed to unit root mean square, or global and tempered on the NoPE layers)
and, on the MoE layers, top-k experts fed the sigmoid-scaled tokens plus a shared expert
(torch_attn/moe.py's loop over experts); its cache is llama4_kv_cache.
"""

from functools import partial

import torch

from numpy_attn._tree import tree_map  # plain Python: walks the nested dicts
from torch_attn import _model
from torch_attn._opmath import opmath, upcast
from torch_attn.linear import linear
from torch_attn.llama import llama_block, swiglu_mlp
from torch_attn.moe import experts, top_k
from torch_attn.rms_norm import rms_norm
from torch_attn.swiglu import swiglu

# -- attention: chunked and rotary with normed q and k, or global and tempered (NoPE) ------------------

def chunked_causal_mask(T, S, chunk, first=0, left_padding=None, device=None):
    """(T, S) bool: True where key s (at first + s) is not later than query t (at first + S - T + t)
    and lies in its chunk of ``chunk`` positions counted from 0, or from each sequence's first real
    token given ``left_padding`` (B,) -> (B, 1, T, S)."""
    q_pos = first + S - T + torch.arange(T, device=device)[:, None]           # (T, 1)
    k_pos = first + torch.arange(S, device=device)[None, :]                   # (1, S)
    if left_padding is None:
        return (k_pos <= q_pos) & (k_pos // chunk == q_pos // chunk)          # (T, S)
    pad = left_padding[:, None, None, None]                                   # (B, 1, 1, 1)
    return (k_pos <= q_pos) & ((k_pos - pad) // chunk == (q_pos - pad) // chunk)   # (B, 1, T, S)


def leading_padding(attn_mask):
    """(B,) how many keys at the start of each sequence no query sees; None without a mask."""
    if attn_mask is None:
        return None
    mask = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))   # (B, nh, T, S)
    seen = mask.any(dim=2).any(dim=1)                                         # (B, S): some query sees key s
    first_seen = seen.int().argmax(dim=-1)                                    # (B,) the first seen key
    return torch.where(seen.any(dim=-1), first_seen, seen.shape[-1])          # (B,)


def attention_temperature(past, T, floor_scale, attn_scale, device=None):
    """(T, 1) float64: 1 + attn_scale * log(1 + floor((p + 1) / floor_scale)), p = past .. past + T - 1."""
    p = torch.arange(past, past + T, dtype=torch.float64, device=device)
    return (torch.log1p(torch.floor((p + 1) / floor_scale)) * attn_scale + 1)[:, None]   # (T, 1)


def qk_unit_rms(q, k, eps):
    """Each head's q (B, nh, T, hs) and k (B, nkv, T, hs) scaled to unit root mean square (RMS norm with weight 1)."""
    ones = torch.ones(q.shape[-1], dtype=q.dtype, device=q.device)            # (hs,) the absent weight
    return rms_norm(q, ones, eps), rms_norm(k, ones, eps)


def llama4_attention(x, params, config, positions, *, attn_mask=None, kv_cache=None, rope=True, chunk=None):
    """Llama 4's attention: x (B, T, C) -> (B, T, C); ``rope`` and ``chunk`` as the NumPy twin's."""
    T = x.shape[1]
    q, k, v = _model.heads(x, params, config.n_head, config.n_kv_head)        # (B, nh | nkv, T, hs)
    if rope:
        q, k = _model.rotate(q, k, positions, config.rope_theta, config.rope_scaling, config.rope_layout)
        if config.use_qk_norm:   # after the rotation, as transformers
            q, k = qk_unit_rms(q, k, config.rms_eps)
    elif config.attn_temperature_tuning:
        past = 0 if kv_cache is None else int(kv_cache.length)
        temperature = attention_temperature(past, T, config.floor_scale, config.attn_scale, x.device)
        q = (upcast(q) * temperature.to(opmath(q.dtype))).to(q.dtype)         # (B, nh, T, hs), rounded once
    if chunk is not None:   # only the keys of each query's chunk; a cache holds the last c tokens from `start`
        first, held = (0, 0) if kv_cache is None else (int(kv_cache.start), int(kv_cache.held))
        pad = leading_padding(attn_mask)                                      # (B,) or None
        local = chunked_causal_mask(T, held + T, chunk, first, pad, x.device)  # (T, S) or (B, 1, T, S)
        attn_mask = local if attn_mask is None else attn_mask & local
    out = _model.attend(q, k, v, params["o"], kv_cache, attn_mask)            # (B, T, C)
    return out


# -- the mixture of experts: sigmoid-scaled inputs to the top-k experts, and a shared expert ------------

def llama4_router(x, router, k):
    """Top-k of the router's logits through a sigmoid: x (N, C) -> (scores (N, k), indices (N, k))."""
    logits = linear(x, **router)                                              # (N, C) -> (N, E)
    indices = top_k(logits, k)                                                # (N, k)
    scores = torch.sigmoid(torch.gather(logits, -1, indices))                 # (N, k)
    return scores, indices


def llama4_moe(x, params, k):
    """Llama 4's mixture of experts on x (..., C), k experts per token -> (..., C)."""
    x_dtype = x.dtype
    x, params = upcast(x), tree_map(upcast, params)                           # float32 for float16 and bfloat16
    C = x.shape[-1]
    tokens = x.reshape(-1, C)                                                 # (..., C) -> (N, C)
    N = tokens.shape[0]
    scores, indices = llama4_router(tokens, params["router"], k)              # (N, k)
    routed_in = (tokens[:, None, :] * scores[..., None]).reshape(N * k, C)    # (N, k, C) -> (N k, C)
    ones = torch.ones((N * k, 1), dtype=x.dtype, device=x.device)             # the inputs carry the scores
    routed = experts(routed_in, ones, indices.reshape(N * k, 1), params["experts"], swiglu)   # (N k, C)
    shared = swiglu(tokens, params["shared"])                                 # (N, C)
    out = (shared + routed.reshape(N, k, C).sum(dim=1)).reshape(x.shape)      # (N, C) -> (..., C)
    return out.to(x_dtype)                                                    # rounded once to x's dtype


def llama4_moe_mlp(h, params, config):
    """The mixture of experts with the config's k: h (B, T, C) -> (B, T, C)."""
    return llama4_moe(h, params, config.experts_per_token)


# -- the model: Llama's blocks with Llama 4's attention and networks ---------------------------------

llama4_kv_cache = _model.sliding_kv_cache   # a global layer holds every token, a chunked layer its last chunk


def llama4_block(x, params, config, positions, *, attn_mask=None, kv_cache=None, moe=False, rope=True, chunk=None):
    """One block: x (B, T, C) -> (B, T, C), Llama's with Llama 4's attention and, where ``moe``, its experts."""
    return llama_block(x, params, config, positions, attn_mask=attn_mask, kv_cache=kv_cache,
                       attention=llama4_attention, mlp=llama4_moe_mlp if moe else swiglu_mlp, rope=rope, chunk=chunk)


def llama4(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None, logits_to_keep=None):
    """Logits for integer ``ids`` (B, T) -> (B, T, V); keywords as llama's, ``kv_cache`` from llama4_kv_cache."""
    return _model.decoder(ids, params, config, llama4_block, positions=positions, attn_mask=attn_mask,
                          kv_cache=kv_cache, logits_to_keep=logits_to_keep, padding_idx=config.pad_token_id,
                          layer_options=partial(_layer_options, config))


def _layer_options(config, i):
    """Block i's keywords: its network, whether it rotates, its chunk."""
    return {"moe": config.is_moe(i), "rope": config.use_rope(i), "chunk": config.window(i)}


# Equals Hugging Face's transformers.Llama4ForCausalLM(...).logits holding the same weights (gate_up_proj
# the experts' gate and up side by side, gate first); parity_tests/test_llama4.py checks it in float64.
