"""OLMo Hybrid in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/olmo_hybrid.py: OLMo 2's blocks (torch_attn/olmo2.py) on the full layers,
Llama's pre-norm block around Gated DeltaNet (torch_attn/gated_deltanet.py) on the linear ones,
q_proj, k_proj and v_proj concatenated into its one projection, beta doubled with allow_neg_eigval,
the gated norm's eps 1e-5; every norm rounds w * xhat once; its cache is Qwen3.5's.
"""

import torch

from torch_attn import _model
from torch_attn.gated_deltanet import gated_deltanet
from torch_attn.llama import llama_block
from torch_attn.olmo2 import olmo2_block
from torch_attn.qwen3_5 import _token_mask

GATED_NORM_EPS = 1e-5   # the gated norm's, fixed in Hugging Face's OlmoHybridGatedDeltaNet

# -- the linear layers' mixer: Gated DeltaNet with OLMo Hybrid's projections and beta ----------------

# gated_deltanet's name of each of OLMo Hybrid's parameters (q, k and v go into in_proj_qkv).
RENAMED = {"g_proj": "in_proj_z", "b_proj": "in_proj_b", "a_proj": "in_proj_a", "conv1d": "conv1d",
           "dt_bias": "dt_bias", "A_log": "A_log", "o_norm": "norm", "o_proj": "out_proj"}


def olmo_hybrid_linear_attention(x, params, config, positions, *, attn_mask=None, kv_cache=None):
    """Gated DeltaNet on x (B, T, C) -> (B, T, C), continuing the state of ``kv_cache`` if given."""
    state = None if kv_cache is None or kv_cache.length == 0 else kv_cache.state
    qkv = torch.cat([params[name]["w"] for name in ("q_proj", "k_proj", "v_proj")], dim=1)   # (C, conv_dim)
    inner = {"in_proj_qkv": {"w": qkv}} | {theirs: params[ours] for ours, theirs in RENAMED.items()}
    out, new_state = gated_deltanet(
        x, inner, config.linear_k_heads, config.linear_v_heads, config.linear_k_dim, config.linear_v_dim,
        GATED_NORM_EPS, state=state, mask=_token_mask(attn_mask, x.shape[:2], config.n_head),
        beta_scale=2.0 if config.allow_neg_eigval else 1.0)
    if kv_cache is not None:
        kv_cache.update(new_state, x.shape[1])
    return out


# -- the block: OLMo 2's on a full layer, Llama's around Gated DeltaNet on a linear one --------------

def olmo_hybrid_block(x, params, config, positions, *, attn_mask=None, kv_cache=None, full=True):
    """One block, OLMo 2's (``full``) or Llama's with Gated DeltaNet: x (B, T, C) -> (B, T, C)."""
    if full:
        return olmo2_block(x, params, config, positions, attn_mask=attn_mask, kv_cache=kv_cache)
    return llama_block(x, params, config, positions, attn_mask=attn_mask, kv_cache=kv_cache,
                       attention=olmo_hybrid_linear_attention, round_xhat=False)


# -- the model -------------------------------------------------------------------------------------

def olmo_hybrid(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
                logits_to_keep=None):
    """Logits for integer ``ids`` (B, T) -> (B, T, V); keywords as llama's, ``kv_cache`` from qwen3_5_kv_cache."""
    return _model.decoder(ids, params, config, olmo_hybrid_block, positions=positions, attn_mask=attn_mask,
                          kv_cache=kv_cache, logits_to_keep=logits_to_keep, norm_round_xhat=False,
                          layer_options=lambda i: {"full": config.is_full(i)})


# Equals Hugging Face's transformers OlmoHybridForCausalLM(...).logits holding the same weights;
# parity_tests/test_olmo_hybrid.py checks it in float64.
