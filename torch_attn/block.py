"""The pre-LayerNorm Transformer block (GPT-2), causal, in plain PyTorch; autograd is the backward.

Twin of numpy_attn/block.py: x = x + dropout(attn(ln1(x))), then x = x + dropout(ffn(ln2(x))),
with the same nested parameter dict. Pass the NumPy side's ``cache.masks`` as ``masks`` for exact
dropout parity; without them the keep-masks are drawn from ``rng``, a ``torch.Generator``.
"""

from torch_attn.dropout import dropout
from torch_attn.feed_forward import feed_forward
from torch_attn.layer_norm import layer_norm
from torch_attn.multi_head import multi_head_attention


def block(x, params, num_heads, *, dropout_p=0.0, rng=None, masks=None, attn_mask=None, kv_cache=None,
          ln_eps=1e-5, gelu="none"):
    """One causal pre-LN block: x (B, T, C) -> out (B, T, C)."""
    B, T, C = x.shape
    masks = {"attn": None, "ffn": None} if masks is None else masks
    # Causal, aligned bottom-right: with a cache the T new queries are the last T of the keys.
    is_causal = "bottom_right" if attn_mask is None else False
    # 1-4: x + dropout(attn(ln1(x))), one step a line
    h = layer_norm(x, **params["ln1"], eps=ln_eps)                                     # (B, T, C)
    a, _ = multi_head_attention(h, params["attn"], num_heads, attn_mask=attn_mask,
                                is_causal=is_causal, kv_cache=kv_cache)                # (B, T, C)
    a = dropout(a, dropout_p, rng, mask=masks["attn"])                                 # (B, T, C)
    x = x + a
    # 5-8: x + dropout(ffn(ln2(x))), one step a line
    h = layer_norm(x, **params["ln2"], eps=ln_eps)                                     # (B, T, C)
    f = feed_forward(h, params["ffn"], gelu)                                           # (B, T, C) via (B, T, 4C)
    f = dropout(f, dropout_p, rng, mask=masks["ffn"])                                  # (B, T, C)
    out = x + f
    return out


# Equals torch.nn.TransformerEncoderLayer(C, num_heads, dim_feedforward=4 * C, dropout=0.0,
# activation="gelu", batch_first=True, norm_first=True) called with is_causal=True and the causal
# mask, its weights set from params (nn.Linear stores w.T); test_block.py checks it. With dropout
# they differ: the built-in also drops attention weights and the feed-forward's hidden layer.
