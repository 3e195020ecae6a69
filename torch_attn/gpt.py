"""A GPT language model in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/gpt.py: token embedding + positions (learned or sinusoidal), dropout, the
causal pre-LN blocks, a final layer norm and the output layer (the token embedding, transposed,
with tied weights), on the same nested parameter dict and the same ``GPTConfig``. With tied
weights autograd adds the gradients of wte's two uses itself. Pass the NumPy side's
``cache.masks`` as ``masks`` for exact dropout parity.
"""

import torch

from torch_attn.block import block
from torch_attn.dropout import dropout
from torch_attn.embedding import embedding
from torch_attn.layer_norm import layer_norm
from torch_attn.linear import linear
from torch_attn.positional import sinusoidal_encoding


def gpt(ids, params, config, rng=None, masks=None):
    """Logits for integer ``ids`` (B, T), T <= block_size -> (B, T, V)."""
    B, T = ids.shape
    masks = {"emb": None, "blocks": [None] * config.n_layer} if masks is None else masks
    wte = params["wte"]
    # 1: token embedding and positions
    tok = embedding(ids, wte)                                             # (B, T) -> (B, T, C)
    if config.positions == "learned":
        pos = embedding(torch.arange(T, device=ids.device), params["wpe"])  # (T,) -> (T, C)
    else:
        pos = sinusoidal_encoding(T, wte.shape[1], dtype=wte.dtype).to(wte.device)  # (T, C)
    x = tok + pos                                                         # (B, T, C)
    # 2: dropout
    x = dropout(x, config.dropout, rng, mask=masks["emb"])
    # 3: the blocks, in order
    for i in range(config.n_layer):
        x = block(x, params["blocks"][str(i)], config.n_head,
                  config.dropout, rng, masks["blocks"][i])                # (B, T, C)
    # 4: final layer norm
    x = layer_norm(x, **params["ln_f"])                                   # (B, T, C)
    # 5: the output layer
    head_w = wte.T if config.tie_weights else params["head"]["w"]         # (C, V)
    logits = linear(x, head_w)                                            # (B, T, C) -> (B, T, V)
    return logits


# No single built-in. parity_tests/test_gpt.py tests gpt against nn.Embedding, a stack of
# nn.TransformerEncoderLayer(norm_first=True, activation="gelu") with causal masks, nn.LayerNorm
# and nn.Linear holding the same weights, and both models against autograd and finite differences.
