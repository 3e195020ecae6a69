"""A GPT language model (GPT-2's architecture, small), and its backward.

    x      = wte[ids] + pos                    pos: wpe[0..T-1] (learned) or the sinusoidal table
    x      = dropout(x)
    x      = block_n(... block_1(x))           causal pre-LN blocks (numpy_attn/block.py)
    x      = ln_f(x)
    logits = x @ head.w                        head.w = wte^T with tied weights

Radford et al. (2019) as written in nanoGPT's model.py. With ``tie_weights`` the output layer
reuses the token embedding (Press and Wolf, 2017): wte is used twice, so its gradient is the sum
of the two uses, written out as ``dwte = dwte_embedding + dwte_head``. Parameters are nested dicts
all the way down; the blocks are keyed "0", "1", ... so that a path reads ``blocks.0.attn.q.w``.

Decoding and real batches (all optional, handled before step 1): with a key/value cache
(``gpt_kv_cache``) ids hold only the new tokens, their positions continue from the cached length
and the causal mask aligns bottom-right; a key padding mask hides padding and numbers each row's
real tokens from 0; ``position_ids`` and an extra ``attn_mask`` run packed sequences in one row
(numpy_attn/masks.py). ``n_kv_head`` < ``n_head`` gives grouped-query attention.
"""

import numbers
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from numpy_attn._checks import (
    check_dout,
    check_float,
    check_rng,
    check_token_ids,
)
from numpy_attn._tree import leaves
from numpy_attn.block import block_backward, block_forward, init_block_params
from numpy_attn.dropout import dropout_backward, dropout_forward
from numpy_attn.embedding import embedding_backward, embedding_forward
from numpy_attn.kv_cache import init_kv_cache
from numpy_attn.layer_norm import layer_norm_backward, layer_norm_forward
from numpy_attn.linear import linear_backward, linear_forward
from numpy_attn.masks import causal_mask, padded_position_ids, padding_attn_mask
from numpy_attn.positional import sinusoidal_encoding


@dataclass(frozen=True)
class GPTConfig:
    """The model's sizes and switches; the defaults train in seconds on a CPU."""

    vocab_size: int = 64          # V
    block_size: int = 32          # the longest context T
    n_layer: int = 2
    n_head: int = 2               # nh
    n_kv_head: int | None = None  # nkv key/value heads (grouped-query attention); None: n_head
    n_embd: int = 32              # C = nh * hs
    dropout: float = 0.0
    bias: bool = True             # biases of the linear layers (layer norms always have one)
    tie_weights: bool = True      # the output layer is the token embedding, transposed
    positions: str = "learned"    # "learned" (a wpe table) or "sinusoidal" (no parameters)

    def __post_init__(self):
        for name, value in _check_gpt_config(self).items():
            object.__setattr__(self, name, value)     # NumPy scalars become Python int/float/bool


def init_gpt_params(config, rng, dtype=np.float32):
    """{"wte": (V, C), ["wpe": (block_size, C)], "blocks": {"0": ..., ...}, "ln_f": {"w", "b"},
    ["head": {"w": (C, V)}]}: wpe only for learned positions, head only without tied weights.

    Embeddings and the head are drawn from N(0, 0.02^2) as in GPT-2; blocks by init_block_params.
    """
    check_rng(rng, "init_gpt_params")
    V, C = config.vocab_size, config.n_embd
    params = {"wte": rng.normal(0, 0.02, (V, C)).astype(dtype)}                           # (V, C)
    if config.positions == "learned":
        params["wpe"] = rng.normal(0, 0.02, (config.block_size, C)).astype(dtype)         # (T_max, C)
    kv_width = _n_kv_head(config) * (C // config.n_head)                                 # nkv * hs
    params["blocks"] = {str(i): init_block_params(C, rng, bias=config.bias, dtype=dtype, kv_width=kv_width)
                        for i in range(config.n_layer)}
    params["ln_f"] = {"w": np.ones(C, dtype), "b": np.zeros(C, dtype)}
    if not config.tie_weights:
        params["head"] = {"w": rng.normal(0, 0.02, (C, V)).astype(dtype)}                 # (C, V)
    return params


class GPTCache(NamedTuple):
    """The sub-caches in forward order; ``pos`` is None for sinusoidal positions."""

    wte: tuple
    pos: tuple | None
    drop: tuple
    blocks: list
    ln_f: tuple
    head: tuple
    tied: bool

    @property
    def masks(self):
        """Every dropout keep-mask, for the torch twin: {"emb": (B, T, C), "blocks": [...]}."""
        return {"emb": self.drop[0], "blocks": [c.masks for c in self.blocks]}


def gpt_forward(ids, params, config, rng=None, masks=None, kv_cache=None, key_padding_mask=None,
                position_ids=None, attn_mask=None):
    """Logits for integer ``ids`` (B, T), T <= block_size -> (B, T, V). Returns ``(logits, cache)``.

    With ``config.dropout`` > 0 the keep-masks are drawn from ``rng`` or taken from ``masks``
    (the shape of ``cache.masks``); pass a config with dropout 0 to evaluate. Decoding and real
    batches, each optional: ``kv_cache`` (gpt_kv_cache) holds the past tokens, ids only the new
    ones; ``key_padding_mask`` (B, S) is True at padding, S = past + T; ``position_ids`` (T,) or
    (B, T) default to past..past+T-1, or with padding each row's real tokens counted from 0;
    ``attn_mask`` (bool, broadcasting to (B, nh, T, S)) restricts attention further, e.g.
    numpy_attn/masks.py's varlen_attn_mask for packed sequences. Causality always applies.
    """
    ids = _check_gpt(ids, params, config, rng, masks)
    B, T = ids.shape
    masks = {"emb": None, "blocks": [None] * config.n_layer} if masks is None else masks
    wte = params["wte"]
    # Positions 0..T-1 and the causal mask, unless decoding, padded or packed (then the mask).
    positions, attn_mask = _positions_and_mask(T, config, kv_cache, key_padding_mask, position_ids, attn_mask)
    # 1: token embedding and positions
    tok, wte_cache = embedding_forward(ids, wte)                          # (B, T) -> (B, T, C)
    if config.positions == "learned":
        pos, pos_cache = embedding_forward(positions, params["wpe"])      # (T,) -> (T, C) or (B, T) -> (B, T, C)
    else:
        table = sinusoidal_encoding(int(positions.max(initial=-1)) + 1, wte.shape[1], dtype=wte.dtype)
        pos, pos_cache = table[positions], None                           # (T, C) or (B, T, C)
    x = tok + pos                                                         # (B, T, C)
    # 2: dropout
    x, drop_cache = dropout_forward(x, config.dropout, rng, mask=masks["emb"])
    # 3: the blocks, in order
    block_caches = []
    for i in range(config.n_layer):
        x, block_cache = block_forward(x, params["blocks"][str(i)], config.n_head, config.dropout, rng,
                                       masks["blocks"][i], attn_mask, kv_cache, i)   # (B, T, C)
        block_caches.append(block_cache)
    # 4: final layer norm
    x, ln_f_cache = layer_norm_forward(x, **params["ln_f"])               # (B, T, C)
    # 5: the output layer
    head_w = wte.T if config.tie_weights else params["head"]["w"]         # (C, V)
    logits, head_cache = linear_forward(x, head_w)                        # (B, T, C) -> (B, T, V)
    cache = GPTCache(wte_cache, pos_cache, drop_cache, block_caches, ln_f_cache, head_cache,
                     config.tie_weights)
    return logits, cache


def gpt_backward(dlogits, cache):
    """Gradients: dlogits (B, T, V) -> dparams, with the nesting of the params."""
    x, head_w, _ = cache.head                                             # (B, T, C), (C, V)
    check_dout("gpt_backward", dlogits, x.shape[:-1] + head_w.shape[1:], x.dtype, name="dlogits")
    # 5: undoes logits = x @ head_w.
    dx, dhead = linear_backward(dlogits, cache.head)                      # (B, T, V) -> (B, T, C)
    # 4: undoes x = ln_f(x).
    dx, dln_f = layer_norm_backward(dx, cache.ln_f)                       # (B, T, C)
    # 3: undoes the blocks, the last one first.
    dblocks = {}
    for i in reversed(range(len(cache.blocks))):
        dx, dblocks[str(i)] = block_backward(dx, cache.blocks[i])         # (B, T, C)
    dblocks = {str(i): dblocks[str(i)] for i in range(len(cache.blocks))}   # in params' order
    # 2: undoes x = dropout(x).
    dx = dropout_backward(dx, cache.drop)                                 # (B, T, C)
    # 1: undoes x = tok + pos; pos was broadcast over the batch, so its gradient sums over B.
    dtok = dx                                                             # (B, T, C)
    dpos = dx.sum(axis=0)                                                 # (B, T, C) -> (T, C)
    dpos = dx if cache.pos is not None and cache.pos[0].ndim == 2 else dpos   # positions per row: no sum
    dwte_embedding = embedding_backward(dtok, cache.wte)                  # (V, C)
    dparams = {"wte": dwte_embedding}
    if cache.pos is not None:
        dparams["wpe"] = embedding_backward(dpos, cache.pos)              # (T_max, C)
    dparams["blocks"] = dblocks
    dparams["ln_f"] = dln_f
    if cache.tied:
        # wte was used twice, as the embedding and (transposed) as the head: the uses add.
        dwte_head = dhead["w"].T                                          # (C, V) -> (V, C)
        dparams["wte"] = dwte_embedding + dwte_head
    else:
        dparams["head"] = dhead
    return dparams


def gpt_kv_cache(config, B, dtype=np.float32, max_len=None):
    """An empty key/value cache for decoding B sequences of up to ``max_len`` (default
    block_size) tokens with this model: one layer per block, every head's keys and values."""
    max_len = config.block_size if max_len is None else max_len
    return init_kv_cache(config.n_layer, B, _n_kv_head(config), max_len, config.n_embd // config.n_head, dtype)


def _n_kv_head(config):
    """Key/value heads: n_kv_head, or n_head without grouped-query attention."""
    return config.n_head if config.n_kv_head is None else config.n_kv_head


def _positions_and_mask(T, config, kv_cache, key_padding_mask, position_ids, attn_mask):
    """Positions ((T,) or (B, T)) and attention mask (None: plain causal) for gpt_forward."""
    past = 0 if kv_cache is None else kv_cache.length                     # tokens already cached
    S = past + T
    if S > config.block_size:
        raise ValueError(f"{past} cached + {T} new tokens = {S} exceed block_size = {config.block_size}")
    if key_padding_mask is not None and key_padding_mask.shape[-1:] != (S,):
        raise ValueError(f"key_padding_mask {key_padding_mask.shape} must be (B, S) with S = {past} "
                         f"cached + {T} new tokens = {S}")
    if position_ids is None and key_padding_mask is not None:
        position_ids = padded_position_ids(key_padding_mask)[:, past:]    # (B, S) -> (B, T)
    positions = np.arange(past, S) if position_ids is None else np.asarray(position_ids)
    if (positions.shape[-1:] != (T,) or positions.ndim > 2 or positions.min(initial=0) < 0
            or positions.max(initial=0) >= config.block_size):
        raise ValueError(f"position_ids must be (T,) or (B, T) with T = {T} and values in [0, block_size "
                         f"= {config.block_size}), got shape {positions.shape}, values "
                         f"{positions.min(initial=0)}..{positions.max(initial=0)}")
    if key_padding_mask is None and attn_mask is None and kv_cache is None:
        return positions, None                                            # causal, top-left
    mask = causal_mask(T, S, "bottom_right")                              # (T, S); top-left if past = 0
    mask = mask if key_padding_mask is None else mask & padding_attn_mask(key_padding_mask)   # (B, 1, T, S)
    mask = mask if attn_mask is None else mask & attn_mask
    return positions, mask


def _check_gpt_config(config):
    """Return the fields as Python int/float/bool/str; raise TypeError for a field of the wrong
    type (a bool is not an integer, and a string is not a bool: tie_weights="false" would be
    true), ValueError for one out of bounds."""
    fields = (("vocab_size", numbers.Integral, 1), ("block_size", numbers.Integral, 1),
              ("n_layer", numbers.Integral, 0), ("n_head", numbers.Integral, 1),
              ("n_embd", numbers.Integral, 1), ("dropout", numbers.Real, None),
              ("bias", bool, None), ("tie_weights", bool, None), ("positions", str, None))
    for name, kind, low in fields:
        value = getattr(config, name)
        is_bool = isinstance(value, bool | np.bool_)
        if (kind is bool) != is_bool or not isinstance(value, kind | np.bool_):
            raise TypeError(f"GPTConfig.{name} must be {_KIND_NAMES[kind]}, got "
                            f"{type(value).__name__} {value!r}")
        if low is not None and value < low:
            bound = "a positive integer" if low == 1 else f"an integer >= {low}"
            raise ValueError(f"GPTConfig.{name} must be {bound}, got {value!r}")
    if config.n_embd % config.n_head:
        raise ValueError(f"n_embd = {config.n_embd} is not divisible by n_head = {config.n_head}")
    if not 0 <= config.dropout < 1:
        raise ValueError(f"dropout must lie in [0, 1), got {config.dropout!r}")
    if config.positions not in ("learned", "sinusoidal"):
        raise ValueError(f"positions must be 'learned' or 'sinusoidal', got {config.positions!r}")
    n_kv_head = config.n_kv_head
    if n_kv_head is not None and (isinstance(n_kv_head, bool | np.bool_) or not isinstance(n_kv_head, numbers.Integral)
                                  or n_kv_head < 1 or config.n_head % n_kv_head):
        raise ValueError(f"GPTConfig.n_kv_head must be None or a positive integer dividing n_head = "
                         f"{config.n_head}, got {n_kv_head!r}")
    python_type = {numbers.Integral: int, numbers.Real: float, bool: bool, str: str}
    return {name: python_type[kind](getattr(config, name)) for name, kind, _ in fields}


_KIND_NAMES = {numbers.Integral: "an integer", numbers.Real: "a real number", bool: "a bool",
               str: "a str"}


def _check_gpt(ids, params, config, rng, masks):
    """Return ``ids`` as an array; raise unless it is an integer (B, T) array with T <= block_size,
    wte is (vocab_size, n_embd) and every parameter shares its float dtype (named by its path, not
    by the name an inner operation gives it), and, with dropout, an rng or masks are given."""
    if not isinstance(config, GPTConfig):
        raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
    ids = check_token_ids(ids, config.block_size)
    wte = params["wte"]
    check_float("params['wte']", wte)
    if wte.shape != (config.vocab_size, config.n_embd):
        raise ValueError(f"params['wte'] has shape {wte.shape}, but the config asks for "
                         f"(vocab_size, n_embd) = ({config.vocab_size}, {config.n_embd})")
    for dotted, leaf in leaves(params):
        path = "".join(f"[{key!r}]" for key in dotted.split("."))   # ['blocks']['0']['ln1']['w']
        check_float(f"params{path}", leaf)
        if leaf.dtype != wte.dtype:
            raise TypeError(f"params{path} is {leaf.dtype} but params['wte'] is {wte.dtype}: "
                            f"every parameter must share one dtype")
    if config.dropout > 0 and masks is None:
        check_rng(rng, f"gpt_forward with config.dropout = {config.dropout} (and no masks)")
    return ids
