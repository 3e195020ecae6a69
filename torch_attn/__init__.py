"""torch_attn: the forward of every numpy_attn operation in plain PyTorch; autograd is the backward.

Each ``torch_attn/<op>.py`` mirrors ``numpy_attn/<op>.py``: same argument names and order, same
local variable names, same statement order. Only the spellings differ (``axis``/``dim``,
``keepdims``/``keepdim``, ``swapaxes``/``transpose``). It takes the same parameter dicts, converted
with ``torch.from_numpy``. Each file ends with a comment naming the PyTorch built-in it equals.

Reading order, leaf to root (numpy_attn's): embedding, positional, softmax, linear, softcap,
dropout, masks, attention, attention_sinks, kv_cache, multi_head, small_gpt, layer_norm, erf, gelu,
feed_forward, block, gpt, loss, optim, flash_attention, flex_attention, rope, rms_norm, qk_norm, swiglu,
moe, l2_norm, causal_conv1d, gated_rms_norm, gated_delta_rule, chunked_delta_rule, gated_deltanet,
kimi_delta_attention, llama, qwen3, qwen3_5, qwen3_next, olmo2, olmo_hybrid, gemma2, gemma3, gemma4,
gpt_oss, mla, lightning_indexer, deepseek_v3, deepseek_v32, glm_moe_dsa, llama4,
kimi_linear.

Dimension key: B batch, T query length, S key length, C model width, nh heads,
hs head size (C = nh * hs), V vocabulary size.
"""

# One distribution, one version: numpy_attn's (setup.cfg reads it from there).
from numpy_attn import __version__ as __version__
