"""The model of "Attention Is All You Need" at its smallest, in plain PyTorch; autograd is the backward.

Twin of numpy_attn/small_gpt.py: token embedding + sinusoidal encoding, one causal multi-head
self-attention, a linear layer to the vocabulary, on the same parameter dict and ``GPTConfig``.
"""

from torch_attn.embedding import embedding
from torch_attn.linear import linear
from torch_attn.multi_head import multi_head_attention
from torch_attn.positional import sinusoidal_encoding


def small_gpt(ids, params, config):
    """Logits of the small model: ids (B, T) -> (B, T, V)."""
    B, T = ids.shape
    wte = params["wte"]
    tok = embedding(ids, wte)                                             # (B, T) -> (B, T, C)
    x = tok + sinusoidal_encoding(T, wte.shape[1], dtype=wte.dtype).to(wte.device)  # (B, T, C)
    x, _ = multi_head_attention(x, params["attn"], config.n_head, is_causal=True)
    logits = linear(x, **params["head"])                                  # (B, T, C) -> (B, T, V)
    return logits


# No single built-in. parity_tests/test_small_gpt.py tests it against autograd through this twin
# and against finite differences; each piece is tested against its built-in in its own test file.
