"""GPT-2 as released, in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/gpt2.py: learned positions, blocks of x + attn(ln_1(x)) and x + mlp(ln_2(x))
with the config's GELU (tanh for GPT-2's checkpoints) and layer-norm eps, ln_f, and the token
embedding as the output layer (or a separate head), on the same nested parameter dict. Decoding
with ``kv_cache`` (gpt2_kv_cache, torch_attn/kv_cache.py) as in the NumPy twin.
"""

import torch

from torch_attn.embedding import embedding
from torch_attn.feed_forward import feed_forward
from torch_attn.kv_cache import init_kv_cache
from torch_attn.layer_norm import layer_norm
from torch_attn.linear import linear
from torch_attn.multi_head import multi_head_attention


def gpt2(ids, params, config, kv_cache=None):
    """Logits for integer ``ids`` (B, T), T <= block_size -> (B, T, V); with ``kv_cache``
    (gpt2_kv_cache) ids hold only the new tokens."""
    B, T = ids.shape
    past = 0 if kv_cache is None else kv_cache.length                         # tokens already cached
    wte = params["wte"]
    eps = config.ln_eps
    # 1: token embedding and learned positions
    tok = embedding(ids, wte)                                                 # (B, T) -> (B, T, C)
    pos = embedding(torch.arange(past, past + T, device=ids.device), params["wpe"])   # (T,) -> (T, C)
    x = tok + pos                                                             # (B, T, C)
    # 2: the blocks, in order: x + attn(ln_1(x)), then x + mlp(ln_2(x))
    for i in range(config.n_layer):
        p = params["blocks"][str(i)]
        h = layer_norm(x, **p["ln1"], eps=eps)                                # (B, T, C)
        a, _ = multi_head_attention(h, p["attn"], config.n_head, is_causal=True,
                                    kv_cache=kv_cache, layer=i)                # (B, T, C)
        x = x + a                                                             # (B, T, C)
        h = layer_norm(x, **p["ln2"], eps=eps)                                # (B, T, C)
        f = feed_forward(h, p["ffn"], config.gelu)                            # (B, T, C) via (B, T, H)
        x = x + f                                                             # (B, T, C)
    # 3: final layer norm
    x = layer_norm(x, **params["ln_f"], eps=eps)                              # (B, T, C)
    # 4: the output layer
    head_w = wte.T if config.tie_weights else params["head"]["w"]             # (C, V)
    logits = linear(x, head_w)                                                # (B, T, C) -> (B, T, V)
    return logits


def gpt2_kv_cache(config, B, dtype=torch.float32, max_len=None, device=None):
    """An empty key/value cache for decoding B sequences of up to ``max_len`` (default block_size) tokens."""
    max_len = config.block_size if max_len is None else max_len
    return init_kv_cache(config.n_layer, B, config.n_head, max_len, config.n_embd // config.n_head, dtype, device)


# Equals Hugging Face's transformers.GPT2LMHeadModel(...).logits holding the same weights (its
# Conv1D layers store (C_in, C_out) as we do; c_attn holds q, k, v side by side);
# parity_tests/test_gpt2.py and parity_tests/test_hf.py check it.
