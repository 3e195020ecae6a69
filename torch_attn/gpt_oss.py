"""gpt-oss in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/gpt_oss.py: blocks x + attn(rms_norm(x)) (attention with a sink per head and
sliding layers) and x + moe(rms_norm(x)) (torch_attn/moe.py's gpt_oss_moe), every norm rounding
w * xhat once; its cache is gpt_oss_kv_cache.
"""


from torch_attn import _model
from torch_attn.llama import llama_block
from torch_attn.moe import gpt_oss_moe

# -- attention: Llama's, with a sink per head and sliding layers -----------------------------------

def gpt_oss_attention(x, params, config, positions, *, attn_mask=None, kv_cache=None, window=None):
    """llama_attention with each query head's sink logit ``params["sinks"]`` (nh,), on a sliding
    layer each query seeing its last ``window`` keys: x (B, T, C) -> (B, T, C)."""
    q, k, v = _model.heads(x, params, config.n_head, config.n_kv_head)        # (B, nh | nkv, T, hs)
    q, k = _model.rotate(q, k, positions, config.rope_theta, config.rope_scaling, config.rope_layout)
    out = _model.attend(q, k, v, params["o"], kv_cache, attn_mask, window=window,
                        sinks=params["sinks"])                                # (B, T, C)
    return out


# -- the block: Llama's, with attention with sinks and the mixture of experts -----------------------

def gpt_oss_mlp(h, params, config):
    """The mixture of experts with the config's routing: h (B, T, C) -> (B, T, C) via k experts."""
    return gpt_oss_moe(h, params, config.experts_per_token, config.swiglu_alpha, config.swiglu_limit)


def gpt_oss_block(x, params, config, positions, *, attn_mask=None, kv_cache=None, window=None):
    """One block: x (B, T, C) -> (B, T, C), Llama's with gpt-oss's attention (``window`` None for a
    full layer) and mixture of experts, every norm's product w * xhat rounded once."""
    return llama_block(x, params, config, positions, attn_mask=attn_mask, kv_cache=kv_cache,
                       attention=gpt_oss_attention, mlp=gpt_oss_mlp, round_xhat=False, window=window)


# -- the model ------------------------------------------------------------------------------------

gpt_oss_kv_cache = _model.sliding_kv_cache   # a full layer holds every token, a sliding layer its last window


def gpt_oss(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None,
            logits_to_keep=None):
    """Logits for integer ``ids`` (B, T) -> (B, T, V); keywords as llama's, ``kv_cache`` from gpt_oss_kv_cache."""
    return _model.decoder(ids, params, config, gpt_oss_block, positions=positions, attn_mask=attn_mask,
                          kv_cache=kv_cache, logits_to_keep=logits_to_keep, norm_round_xhat=False,
                          layer_options=lambda i: {"window": config.window(i)})


# Equals Hugging Face's transformers.GptOssForCausalLM(...).logits holding the same weights (gate_up_proj
# interleaving gate and up); parity_tests/test_gpt_oss.py checks it in float32 and float64, through
# saved checkpoints.
