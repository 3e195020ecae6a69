"""A GPT language model in plain PyTorch; autograd supplies the backward.

Twin of numpy_attn/gpt.py: token embedding + positions (learned or sinusoidal), dropout, the
causal pre-LN blocks with the config's layer-norm eps and GELU (GPT-2's checkpoints: tanh), a
final layer norm and the output layer (the token embedding, transposed, with tied weights), on the
same nested parameter dict and the same ``GPTConfig``. With tied weights autograd adds the
gradients of wte's two uses itself. Pass the NumPy side's ``cache.masks`` as ``masks`` for exact
dropout parity. ``positions``, ``attn_mask`` and ``kv_cache`` as in the NumPy twin.
"""

import torch

from torch_attn._model import head
from torch_attn.block import block
from torch_attn.dropout import dropout
from torch_attn.embedding import embedding
from torch_attn.kv_cache import init_kv_cache
from torch_attn.layer_norm import layer_norm
from torch_attn.masks import causal_mask
from torch_attn.positional import sinusoidal_encoding


def gpt(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None, masks=None,
        logits_to_keep=None):
    """Logits for integer ``ids`` (B, T), T <= block_size -> (B, T, V); ``positions``, ``attn_mask``,
    ``kv_cache`` (gpt_kv_cache) and ``logits_to_keep`` (-> (B, N, V)) as in the NumPy twin."""
    B, T = ids.shape
    past = 0 if kv_cache is None else kv_cache.length                     # tokens already cached
    positions = torch.arange(past, past + T, device=ids.device) if positions is None else positions
    masks = {"emb": None, "blocks": [None] * config.n_layer} if masks is None else masks
    wte = params["wte"]
    # Causal, aligned bottom-right (the T new tokens follow the past ones); one mask with the caller's.
    attn_mask = None if attn_mask is None else attn_mask & causal_mask(T, past + T, "bottom_right", device=ids.device)
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
    # 3: the blocks, in order; each reads and appends to its own layer of the cache
    for i in range(config.n_layer):
        layer_cache = None if kv_cache is None else kv_cache.layer(i)
        x = block(x, params["blocks"][str(i)], config.n_head, dropout_p=config.dropout,
                  rng=rng, masks=masks["blocks"][i], attn_mask=attn_mask,
                  kv_cache=layer_cache, ln_eps=config.ln_eps, gelu=config.gelu)
    # 4: final layer norm
    x = layer_norm(x, **params["ln_f"], eps=config.ln_eps)               # (B, T, C)
    # 5: the output layer
    logits = head(x, params, config.tie_weights, logits_to_keep)         # (B, T, C) -> (B, N, V)
    return logits


def gpt_kv_cache(config, B, dtype=torch.float32, max_len=None, device=None):
    """An empty key/value cache for decoding B sequences of up to ``max_len`` (default
    block_size) tokens with this model: one layer per block, every head's keys and values."""
    max_len = config.block_size if max_len is None else max_len
    n_kv_head = config.n_head if config.n_kv_head is None else config.n_kv_head
    return init_kv_cache(config.n_layer, B, n_kv_head, max_len, config.n_embd // config.n_head, dtype, device)


# No single built-in. parity_tests/test_gpt.py tests gpt against nn.Embedding, a stack of
# nn.TransformerEncoderLayer(norm_first=True, activation="gelu") with causal masks, nn.LayerNorm
# and nn.Linear holding the same weights, and both models against autograd and finite differences;
# parity_tests/test_hf.py against Hugging Face's GPT2LMHeadModel holding a checkpoint's weights.
