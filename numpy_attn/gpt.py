"""A GPT language model (GPT-2's architecture), and its backward: it runs GPT-2's checkpoints too.

    x      = wte[ids] + pos                    pos: wpe[positions] (learned) or the sinusoidal table
    x      = dropout(x)
    x      = block_n(... block_1(x))           causal pre-LN blocks (numpy_attn/block.py)
    x      = ln_f(x)
    logits = x @ head.w                        head.w = wte^T with tied weights (numpy_attn/_model.py)

Radford et al. (2019) as written in nanoGPT's model.py. GPT-2's released checkpoints were trained
with the tanh approximation of GELU (``activation_function="gelu_new"``) and carry their own
``layer_norm_epsilon``: ``gelu`` and ``ln_eps`` in the config say which (attn_cli/hf/gpt2.py sets
them), and the feed-forward width comes from the weights (4C unless a checkpoint says otherwise).
Parameters are nested dicts all the way down; the blocks are keyed "0", "1", ... so that a path
reads ``blocks.0.attn.q.w``.

The optional arguments are llama.py's: ``positions`` (default past..past+T-1), an ``attn_mask``
(bool) that restricts attention further, a ``kv_cache`` (``gpt_kv_cache``) holding the past tokens
while ids hold only the new ones, and ``rng`` for dropout. Padded and packed batches are the
caller's to compose with numpy_attn/masks.py: ``positions=padded_position_ids(key_padding_mask)``
and ``attn_mask=padding_attn_mask(key_padding_mask)``, or varlen_position_ids and
varlen_attn_mask. Causality always applies, aligned bottom-right so that new tokens follow the
cached ones. ``n_kv_head`` < ``n_head`` gives grouped-query attention.

float16 and bfloat16 (params from ``init_gpt_params(..., dtype=)``): every operation computes in
float32 and rounds its output once to the params' dtype (docs/precision.md), so the residual
stream x is held in that dtype between steps, as in transformers' GPT-2 run in bfloat16. The
model's own steps are elementwise adds (tok + pos and the blocks' residuals): NumPy adds two
float16 or bfloat16 arrays by rounding each float32 sum once, as PyTorch's add kernel does. The
one sum of many terms, wpe's gradient over the batch, is accumulated in float32 and rounded once.
"""

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from numpy_attn._checks import (
    POSITIVE,
    check_config,
    check_float,
    check_model_attn_mask,
    check_positions,
    check_rng,
    check_token_ids,
    upcast,
)
from numpy_attn._family import Family
from numpy_attn._model import (
    blocks_backward,
    check_for_backward,
    check_logits_to_keep,
    head_backward,
    head_forward,
    with_head,
)
from numpy_attn._tree import leaves
from numpy_attn.block import block_backward, block_forward, init_block_params
from numpy_attn.dropout import dropout_backward, dropout_forward
from numpy_attn.embedding import embedding_backward, embedding_forward
from numpy_attn.kv_cache import KVCache, init_kv_cache
from numpy_attn.layer_norm import layer_norm_backward, layer_norm_forward
from numpy_attn.masks import causal_mask
from numpy_attn.positional import sinusoidal_encoding


@dataclass(frozen=True)
class GPTConfig:
    """The model's sizes and switches; the defaults train in seconds on a CPU (GPT-2 small is
    vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768, gelu="tanh")."""

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
    ln_eps: float = 1e-5          # the layer norms' eps (GPT-2's layer_norm_epsilon)
    gelu: str = "none"            # "none" (exact, with erf) or "tanh" (GPT-2's gelu_new)

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
    positions: np.ndarray    # (T,) or (B, T): per row, their gradient does not sum over B
    pos: tuple | None
    drop: tuple
    blocks: list
    ln_f: tuple
    head: tuple              # numpy_attn/_model.py's HeadCache
    hidden: tuple = ()       # the residual stream: the embedding's output (after dropout), each block's
                             # (B, T, C), by reference (numpy_attn.testing.check_model)

    @property
    def masks(self):
        """Every dropout keep-mask, for the torch twin: {"emb": (B, T, C), "blocks": [...]}."""
        return {"emb": self.drop[0], "blocks": [c.masks for c in self.blocks]}


def gpt_forward(ids, params, config, *, positions=None, attn_mask=None, kv_cache=None, rng=None, masks=None,
                logits_to_keep=None, for_backward=True):
    """Logits for integer ``ids`` (B, T), T <= block_size -> (B, T, V). Returns ``(logits, cache)``.

    ``positions`` (T,) or (B, T) default to past..past+T-1; ``attn_mask`` (bool, broadcasting to
    (B, nh, T, S), S = past + T) restricts attention beyond causality, e.g. masks.py's
    padding_attn_mask or varlen_attn_mask; ``kv_cache`` (gpt_kv_cache) holds the past tokens, ids
    only the new ones. With ``config.dropout`` > 0 the keep-masks are drawn from ``rng`` or taken
    from ``masks`` (the shape of ``cache.masks``); pass a config with dropout 0 to evaluate.
    ``logits_to_keep`` N > 0 computes the last N positions' logits only, (B, N, V) (transformers'
    keyword; numpy_attn/_model.py); None or 0 all T. ``for_backward=False`` keeps no activations and
    returns ``(logits, None)`` (numpy_attn/_model.py).
    """
    ids = _check_gpt(ids, params, config, positions, attn_mask, kv_cache, rng, masks, logits_to_keep)
    check_for_backward(for_backward)
    B, T = ids.shape
    past = 0 if kv_cache is None else kv_cache.length                     # tokens already cached
    positions = np.arange(past, past + T) if positions is None else np.asarray(positions)
    masks = {"emb": None, "blocks": [None] * config.n_layer} if masks is None else masks
    wte = params["wte"]
    # Causal, aligned bottom-right (the T new tokens follow the past ones); one mask with the caller's.
    attn_mask = None if attn_mask is None else attn_mask & causal_mask(T, past + T, "bottom_right")
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
    # 3: the blocks, in order; each reads and appends to its own layer of the cache
    block_caches, hidden = [], ([x] if for_backward else [])
    for i in range(config.n_layer):
        layer_cache = None if kv_cache is None else kv_cache.layer(i)
        x, block_cache = block_forward(x, params["blocks"][str(i)], config.n_head, dropout_p=config.dropout,
                                       rng=rng, masks=masks["blocks"][i], attn_mask=attn_mask,
                                       kv_cache=layer_cache, ln_eps=config.ln_eps, gelu=config.gelu)
        if for_backward:
            block_caches.append(block_cache)                              # x: (B, T, C)
            hidden.append(x)
        del block_cache   # without for_backward its activations are freed now, not after the next block
    # 4: final layer norm
    x, ln_f_cache = layer_norm_forward(x, **params["ln_f"], eps=config.ln_eps)   # (B, T, C)
    # 5: the output layer
    logits, head_cache = head_forward(x, params, config.tie_weights, logits_to_keep)   # (B, T, C) -> (B, N, V)
    if not for_backward:
        return logits, None
    cache = GPTCache(wte_cache, positions, pos_cache, drop_cache, block_caches, ln_f_cache, head_cache,
                     tuple(hidden))
    return logits, cache


def gpt_backward(dlogits, cache):
    """Gradients: dlogits (B, N, V) (N = T unless logits_to_keep) -> dparams, with the nesting of the params."""
    # 5: undoes logits = x[:, -N:] @ head_w.
    dx, dhead = head_backward("gpt_backward", dlogits, cache.head)        # (B, T, V) -> (B, T, C)
    # 4: undoes x = ln_f(x).
    dx, dln_f = layer_norm_backward(dx, cache.ln_f)                       # (B, T, C)
    # 3: undoes the blocks, the last one first.
    dx, dblocks = blocks_backward(dx, cache.blocks, block_backward)       # (B, T, C)
    # 2: undoes x = dropout(x).
    dx = dropout_backward(dx, cache.drop)                                 # (B, T, C)
    # 1: undoes x = tok + pos; pos (T, C) was broadcast over the batch, so its gradient sums over B.
    # In float32 for float16 and bfloat16, rounded once (PyTorch's sum accumulates in float32 too).
    dpos = dx if cache.positions.ndim == 2 else upcast(dx).sum(axis=0).astype(dx.dtype, copy=False)   # or (T, C)
    dparams = {"wte": embedding_backward(dx, cache.wte)}                  # (V, C)
    if cache.pos is not None:
        dparams["wpe"] = embedding_backward(dpos, cache.pos)              # (T_max, C)
    dparams["blocks"] = dblocks
    dparams["ln_f"] = dln_f
    return with_head(dparams, dhead, cache.head)


def gpt_kv_cache(config, B, dtype=np.float32, max_len=None):
    """An empty key/value cache for decoding B sequences of up to ``max_len`` (default
    block_size) tokens with this model: one layer per block, every head's keys and values."""
    max_len = config.block_size if max_len is None else max_len
    return init_kv_cache(config.n_layer, B, _n_kv_head(config), max_len, config.n_embd // config.n_head, dtype)


def _n_kv_head(config):
    """Key/value heads: n_kv_head, or n_head without grouped-query attention."""
    return config.n_head if config.n_kv_head is None else config.n_kv_head


def _check_gpt_config(config):
    """Return the fields as Python values, or raise naming the field (numpy_attn/_checks.py)."""
    values = check_config(config, {
        "vocab_size": (int, 1), "block_size": (int, 1), "n_layer": (int, 0), "n_head": (int, 1),
        "n_kv_head": (int | None, 1), "n_embd": (int, 1), "dropout": (float, None), "bias": (bool, None),
        "tie_weights": (bool, None), "positions": (("learned", "sinusoidal"), None),
        "ln_eps": (float, POSITIVE), "gelu": (("tanh", "none"), None)})
    if config.n_embd % config.n_head:
        raise ValueError(f"n_embd = {config.n_embd} is not divisible by n_head = {config.n_head}")
    if not 0 <= config.dropout < 1:
        raise ValueError(f"dropout must lie in [0, 1), got {config.dropout!r}")
    if config.n_kv_head is not None and config.n_head % config.n_kv_head:
        raise ValueError(f"GPTConfig.n_kv_head must be None or a positive integer dividing n_head = "
                         f"{config.n_head}, got {config.n_kv_head!r}")
    return values


def _check_gpt(ids, params, config, positions, attn_mask, kv_cache, rng, masks, logits_to_keep):
    """Return ids as an array; raise unless ids is an
    integer (B, T) array, past + T <= block_size, positions and attn_mask fit, wte is
    (vocab_size, n_embd) and every parameter shares its float dtype (named by its path, not by the
    name an inner operation gives it), with dropout an rng or masks are given, and logits_to_keep
    is None or an int >= 0."""
    if not isinstance(config, GPTConfig):
        raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
    ids = check_token_ids(ids, config.block_size)
    B, T = ids.shape
    past = KVCache.check(kv_cache, config.n_layer, config.block_size, T, "gpt_kv_cache")
    check_positions(positions, B, T, config.block_size)
    check_model_attn_mask(attn_mask, (B, config.n_head, T, past + T))
    check_logits_to_keep(logits_to_keep)
    wte = params["wte"]
    check_float("params['wte']", wte)
    if wte.shape != (config.vocab_size, config.n_embd):
        raise ValueError(f"params['wte'] has shape {wte.shape}, but the config asks for "
                         f"(vocab_size, n_embd) = ({config.vocab_size}, {config.n_embd})")
    for dotted, leaf in leaves(params):
        if isinstance(leaf, np.ndarray) and leaf.dtype == wte.dtype:
            continue               # a float array of wte's dtype; the path is built for a message only
        path = "".join(f"[{key!r}]" for key in dotted.split("."))   # ['blocks']['0']['ln1']['w']
        check_float(f"params{path}", leaf)
        raise TypeError(f"params{path} is {leaf.dtype} but params['wte'] is {wte.dtype}: "
                        f"every parameter must share one dtype")
    if config.dropout > 0 and masks is None:
        check_rng(rng, f"gpt_forward with config.dropout = {config.dropout} (and no masks)")
    return ids


FAMILY = Family(name="gpt2", title="GPT-2", architectures=("GPT2LMHeadModel",), config=GPTConfig, forward=gpt_forward,
                backward=gpt_backward, kv_cache=gpt_kv_cache, init_params=init_gpt_params)
