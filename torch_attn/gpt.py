"""A GPT language model in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/gpt.py: token embedding + positions (learned or sinusoidal), dropout, the
causal pre-LN blocks, a final layer norm and the output layer (the token embedding, transposed,
with tied weights), on the same nested parameter dict and the same ``GPTConfig``. With tied
weights autograd adds the gradients of wte's two uses itself. Pass the NumPy side's
``cache.masks`` as ``masks`` for exact dropout parity. Decoding with ``kv_cache``, padding, position
ids and extra masks as in the NumPy twin.
"""

import torch

from torch_attn.block import block
from torch_attn.dropout import dropout
from torch_attn.embedding import embedding
from torch_attn.kv_cache import init_kv_cache
from torch_attn.layer_norm import layer_norm
from torch_attn.linear import linear
from torch_attn.masks import causal_mask, padded_position_ids, padding_attn_mask
from torch_attn.positional import sinusoidal_encoding


def gpt(ids, params, config, rng=None, masks=None, kv_cache=None, key_padding_mask=None,
        position_ids=None, attn_mask=None):
    """Logits for integer ``ids`` (B, T), T <= block_size -> (B, T, V); decoding with ``kv_cache``
    (gpt_kv_cache), padding, position ids and extra masks as in the NumPy twin."""
    B, T = ids.shape
    masks = {"emb": None, "blocks": [None] * config.n_layer} if masks is None else masks
    wte = params["wte"]
    # Positions 0..T-1 and the causal mask, unless decoding, padded or packed (then the mask).
    positions, attn_mask = _positions_and_mask(T, kv_cache, key_padding_mask, position_ids, attn_mask, ids.device)
    # 1: token embedding and positions
    tok = embedding(ids, wte)                                             # (B, T) -> (B, T, C)
    if config.positions == "learned":
        pos = embedding(positions, params["wpe"])                         # (T,) -> (T, C) or (B, T) -> (B, T, C)
    else:
        table = sinusoidal_encoding(int(positions.max()) + 1, wte.shape[1], dtype=wte.dtype).to(wte.device)
        pos = table[positions]                                            # (T, C) or (B, T, C)
    x = tok + pos                                                         # (B, T, C)
    # 2: dropout
    x = dropout(x, config.dropout, rng, mask=masks["emb"])
    # 3: the blocks, in order
    for i in range(config.n_layer):
        x = block(x, params["blocks"][str(i)], config.n_head, config.dropout, rng,
                  masks["blocks"][i], attn_mask, kv_cache, i)             # (B, T, C)
    # 4: final layer norm
    x = layer_norm(x, **params["ln_f"])                                   # (B, T, C)
    # 5: the output layer
    head_w = wte.T if config.tie_weights else params["head"]["w"]         # (C, V)
    logits = linear(x, head_w)                                            # (B, T, C) -> (B, T, V)
    return logits


def gpt_kv_cache(config, B, dtype=torch.float32, max_len=None, device=None):
    """An empty key/value cache for decoding B sequences of up to ``max_len`` (default block_size) tokens."""
    max_len = config.block_size if max_len is None else max_len
    n_kv_head = config.n_head if config.n_kv_head is None else config.n_kv_head
    return init_kv_cache(config.n_layer, B, n_kv_head, max_len, config.n_embd // config.n_head, dtype, device)


def _positions_and_mask(T, kv_cache, key_padding_mask, position_ids, attn_mask, device):
    """Positions ((T,) or (B, T)) and attention mask (None: plain causal) for gpt."""
    past = 0 if kv_cache is None else kv_cache.length                     # tokens already cached
    S = past + T
    if position_ids is None and key_padding_mask is not None:
        position_ids = padded_position_ids(key_padding_mask)[:, past:]    # (B, S) -> (B, T)
    positions = torch.arange(past, S, device=device) if position_ids is None else position_ids
    if key_padding_mask is None and attn_mask is None and kv_cache is None:
        return positions, None                                            # causal, top-left
    mask = causal_mask(T, S, "bottom_right", device=device)               # (T, S); top-left if past = 0
    mask = mask if key_padding_mask is None else mask & padding_attn_mask(key_padding_mask)   # (B, 1, T, S)
    mask = mask if attn_mask is None else mask & attn_mask
    return positions, mask


# No single built-in. parity_tests/test_gpt.py tests gpt against nn.Embedding, a stack of
# nn.TransformerEncoderLayer(norm_first=True, activation="gelu") with causal masks, nn.LayerNorm
# and nn.Linear holding the same weights, and both models against autograd and finite differences.
