"""gpt-oss in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/gpt_oss.py: torch_attn/llama.py's model (its attention reads each block's
``attn.sinks`` and the layer's window) with blocks x + attn(rms_norm(x)) and x + moe(rms_norm(x)),
the mixture of experts torch_attn/moe.py's gpt_oss_moe; its cache is gpt_oss_kv_cache.
"""

import torch

from torch_attn.gemma2 import gemma2_kv_cache
from torch_attn.llama import decoder, llama_attention
from torch_attn.moe import gpt_oss_moe
from torch_attn.rms_norm import rms_norm

# -- the block: attention with sinks, then the mixture of experts -----------------------------------

def gpt_oss_block(x, params, config, positions, *, attn_mask=None, kv_cache=None, window=None):
    """One block: x (B, T, C) -> (B, T, C); ``attn_mask``, ``kv_cache`` and ``window`` go to attention."""
    # 1-3: x + attn(rms_norm(x)), the sinks read from params["attn"]["sinks"]
    h = rms_norm(x, params["attn_norm"]["w"], config.rms_eps, round_xhat=config.norm_round_xhat)   # (B, T, C)
    a = llama_attention(h, params["attn"], config, positions, attn_mask=attn_mask,
                        kv_cache=kv_cache, window=window)                     # (B, T, C)
    x = x + a
    # 4-6: x + moe(rms_norm(x))
    h = rms_norm(x, params["mlp_norm"]["w"], config.rms_eps, round_xhat=config.norm_round_xhat)   # (B, T, C)
    f = gpt_oss_moe(h, params["mlp"], config.experts_per_token, config.swiglu_alpha,
                    config.swiglu_limit)                                      # (B, T, C) via k experts
    out = x + f
    return out


# -- the model ------------------------------------------------------------------------------------

def gpt_oss(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
            logits_to_keep=None):
    """Logits for integer ``ids`` (B, T) -> (B, T, V); keywords as llama's, ``kv_cache`` from gpt_oss_kv_cache."""
    return decoder(ids, params, config, gpt_oss_block, positions=positions,
                   attn_mask=attn_mask, kv_cache=kv_cache, logits_to_keep=logits_to_keep)


def gpt_oss_kv_cache(config, B, dtype=torch.float32, max_len=None, device=None):
    """An empty key/value cache for decoding B sequences of up to ``max_len`` (default block_size)
    tokens: torch_attn/gemma2.py's, full layers holding them all, sliding layers their window."""
    return gemma2_kv_cache(config, B, dtype, max_len, device)


# Equals Hugging Face's transformers.GptOssForCausalLM(...).logits holding the same weights (gate_up_proj
# interleaving gate and up); parity_tests/test_gpt_oss.py checks it in float32 and float64, through
# saved checkpoints.
