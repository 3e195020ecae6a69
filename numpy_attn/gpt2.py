"""GPT-2 as released (Radford et al., 2019), to run its checkpoints, and its backward.

    x      = wte[ids] + wpe[0..T-1]
    x      = x + attn(ln_1(x))               causal multi-head attention, biases
    x      = x + mlp(ln_2(x))                linear C -> H, GELU (tanh form), linear H -> C
    x      = ln_f(x)
    logits = x @ wte^T                       (or a separate head.w)

numpy_attn/gpt.py is the same architecture, but its blocks use the exact erf GELU and layer norm's
default eps, while GPT-2's checkpoints were trained with the tanh approximation
(``activation_function="gelu_new"``) and carry their own ``layer_norm_epsilon``. This model takes
both from its config, and the feed-forward width H from the weights (GPT-2's n_inner, 4C unless
given). Parameters have gpt.py's nesting: ``blocks.0.attn.q.w`` (C, C), ``blocks.0.ffn.fc.w``
(C, H), ``blocks.0.ln1.w``, so one loader fills either. No dropout: this model is for inference
and for checking gradients against Hugging Face's ``GPT2LMHeadModel``. With a key/value cache
(``gpt2_kv_cache``, numpy_attn/kv_cache.py) ids hold only the new tokens, their positions continue
from the cached length and the causal mask aligns bottom-right, as in numpy_attn/gpt.py.
"""

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from numpy_attn._checks import check_dout, check_model_kv_cache, check_token_ids
from numpy_attn.embedding import embedding_backward, embedding_forward
from numpy_attn.feed_forward import feed_forward_backward, feed_forward_forward
from numpy_attn.kv_cache import init_kv_cache
from numpy_attn.layer_norm import layer_norm_backward, layer_norm_forward
from numpy_attn.linear import linear_backward, linear_forward
from numpy_attn.multi_head import multi_head_attention_backward, multi_head_attention_forward


@dataclass(frozen=True)
class GPT2Config:
    """GPT-2's sizes and switches; the defaults are a toy (GPT-2 small is 50257, 1024, 12, 12, 768)."""

    vocab_size: int = 64          # V
    block_size: int = 32          # the longest context T (n_positions)
    n_layer: int = 2
    n_head: int = 2               # nh
    n_embd: int = 32              # C = nh * hs
    ln_eps: float = 1e-5          # layer_norm_epsilon
    gelu: str = "tanh"            # "tanh" (gelu_new) or "none" (the exact erf form)
    tie_weights: bool = True      # the output layer is the token embedding, transposed

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_head", "n_embd"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if isinstance(self.n_layer, bool) or not isinstance(self.n_layer, int):
            raise TypeError(f"n_layer must be an int, got {self.n_layer!r}")
        if self.n_layer < 0:
            raise ValueError(f"n_layer must be >= 0, got {self.n_layer}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd = {self.n_embd} is not divisible by n_head = {self.n_head}")
        if isinstance(self.ln_eps, bool) or not isinstance(self.ln_eps, int | float) or not self.ln_eps >= 0:
            raise ValueError(f"ln_eps must be a number >= 0, got {self.ln_eps!r}")
        if self.gelu not in ("tanh", "none"):
            raise ValueError(f"gelu must be 'tanh' or 'none', got {self.gelu!r}")
        if not isinstance(self.tie_weights, bool):
            raise TypeError(f"tie_weights must be a bool, got {self.tie_weights!r}")


def init_gpt2_params(config, rng, dtype=np.float32, hidden=None):
    """{"wte": (V, C), "wpe": (block_size, C), "blocks": {"0": {"ln1", "attn", "ln2", "ffn"}, ...},
    "ln_f": {"w", "b"}, ["head": {"w": (C, V)}]}, ffn width ``hidden`` (default 4C).

    Weights from N(0, 0.02^2) as GPT-2's initializer_range, biases 0, layer norms the identity.
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a np.random.Generator, got {type(rng).__name__}")
    V, C = config.vocab_size, config.n_embd
    H = 4 * C if hidden is None else hidden

    def normal(*shape):
        return rng.normal(0, 0.02, shape).astype(dtype)

    def layer_norm():
        return {"w": np.ones(C, dtype), "b": np.zeros(C, dtype)}

    params = {"wte": normal(V, C), "wpe": normal(config.block_size, C), "blocks": {}}
    for i in range(config.n_layer):
        attn = {name: {"w": normal(C, C), "b": np.zeros(C, dtype)} for name in "qkvo"}
        ffn = {"fc": {"w": normal(C, H), "b": np.zeros(H, dtype)},
               "proj": {"w": normal(H, C), "b": np.zeros(C, dtype)}}
        params["blocks"][str(i)] = {"ln1": layer_norm(), "attn": attn, "ln2": layer_norm(), "ffn": ffn}
    params["ln_f"] = layer_norm()
    if not config.tie_weights:
        params["head"] = {"w": normal(C, V)}
    return params


class GPT2Cache(NamedTuple):
    wte: tuple
    wpe: tuple
    blocks: list             # per block: (ln1, attn, ln2, ffn) caches
    ln_f: tuple
    head: tuple
    tied: bool


def gpt2_forward(ids, params, config, kv_cache=None):
    """Logits for integer ``ids`` (B, T), T <= block_size -> (B, T, V). Returns ``(logits, cache)``.

    ``kv_cache`` (gpt2_kv_cache) holds the past tokens, ids only the new ones (inference only).
    """
    ids = _check_gpt2(ids, config, kv_cache)
    B, T = ids.shape
    past = 0 if kv_cache is None else kv_cache.length                         # tokens already cached
    wte = params["wte"]
    eps = config.ln_eps
    # 1: token embedding and learned positions
    tok, wte_cache = embedding_forward(ids, wte)                              # (B, T) -> (B, T, C)
    pos, wpe_cache = embedding_forward(np.arange(past, past + T), params["wpe"])   # (T,) -> (T, C)
    x = tok + pos                                                             # (B, T, C)
    # 2: the blocks, in order: x + attn(ln_1(x)), then x + mlp(ln_2(x))
    block_caches = []
    for i in range(config.n_layer):
        p = params["blocks"][str(i)]
        h, ln1_cache = layer_norm_forward(x, **p["ln1"], eps=eps)             # (B, T, C)
        a, attn_cache = multi_head_attention_forward(h, p["attn"], config.n_head, is_causal=True,
                                                     kv_cache=kv_cache, layer=i)   # (B, T, C)
        x = x + a                                                             # (B, T, C)
        h, ln2_cache = layer_norm_forward(x, **p["ln2"], eps=eps)             # (B, T, C)
        f, ffn_cache = feed_forward_forward(h, p["ffn"], config.gelu)         # (B, T, C) via (B, T, H)
        x = x + f                                                             # (B, T, C)
        block_caches.append((ln1_cache, attn_cache, ln2_cache, ffn_cache))
    # 3: final layer norm
    x, ln_f_cache = layer_norm_forward(x, **params["ln_f"], eps=eps)          # (B, T, C)
    # 4: the output layer
    head_w = wte.T if config.tie_weights else params["head"]["w"]             # (C, V)
    logits, head_cache = linear_forward(x, head_w)                            # (B, T, C) -> (B, T, V)
    cache = GPT2Cache(wte_cache, wpe_cache, block_caches, ln_f_cache, head_cache, config.tie_weights)
    return logits, cache


def gpt2_backward(dlogits, cache):
    """Gradients: dlogits (B, T, V) -> dparams, with the nesting of the params."""
    x, head_w, _ = cache.head
    check_dout("gpt2", dlogits, x.shape[:-1] + head_w.shape[1:], x.dtype, name="dlogits")
    # 4: undoes logits = x @ head_w.
    dx, dhead = linear_backward(dlogits, cache.head)                          # (B, T, V) -> (B, T, C)
    # 3: undoes x = ln_f(x).
    dx, dln_f = layer_norm_backward(dx, cache.ln_f)                           # (B, T, C)
    # 2: undoes the blocks, the last one first; each residual hands dx to its skip and its branch.
    dblocks = {}
    for i in reversed(range(len(cache.blocks))):
        ln1_cache, attn_cache, ln2_cache, ffn_cache = cache.blocks[i]
        dh, dffn = feed_forward_backward(dx, ffn_cache)                       # (B, T, C)
        dx_ffn, dln2 = layer_norm_backward(dh, ln2_cache)                     # (B, T, C)
        dx = dx_ffn + dx                                                      # branch + skip
        dh, dattn = multi_head_attention_backward(dx, attn_cache)             # (B, T, C)
        dx_attn, dln1 = layer_norm_backward(dh, ln1_cache)                    # (B, T, C)
        dx = dx_attn + dx                                                     # branch + skip
        dblocks[str(i)] = {"ln1": dln1, "attn": dattn, "ln2": dln2, "ffn": dffn}
    dblocks = {str(i): dblocks[str(i)] for i in range(len(cache.blocks))}     # in params' order
    # 1: undoes x = tok + pos; pos was broadcast over the batch, so its gradient sums over B.
    dwte_embedding = embedding_backward(dx, cache.wte)                        # (V, C)
    dwpe = embedding_backward(dx.sum(axis=0), cache.wpe)                      # (B, T, C) -> (T_max, C)
    dparams = {"wte": dwte_embedding, "wpe": dwpe, "blocks": dblocks, "ln_f": dln_f}
    if cache.tied:
        # wte was used twice, as the embedding and (transposed) as the head: the uses add.
        dwte_head = dhead["w"].T                                              # (C, V) -> (V, C)
        dparams["wte"] = dwte_embedding + dwte_head
    else:
        dparams["head"] = dhead
    return dparams


def gpt2_kv_cache(config, B, dtype=np.float32, max_len=None):
    """An empty key/value cache for decoding B sequences of up to ``max_len`` (default
    block_size) tokens with this model: one layer per block, every head's keys and values."""
    max_len = config.block_size if max_len is None else max_len
    return init_kv_cache(config.n_layer, B, config.n_head, max_len, config.n_embd // config.n_head, dtype)


def _check_gpt2(ids, config, kv_cache=None):
    """Return ids as an integer (B, T) array with past + T <= block_size, or raise."""
    if not isinstance(config, GPT2Config):
        raise TypeError(f"config must be a GPT2Config, got {type(config).__name__}")
    ids = check_token_ids(ids, config.block_size)
    check_model_kv_cache(kv_cache, config.n_layer, config.block_size, ids.shape[1], "gpt2_kv_cache")
    return ids
