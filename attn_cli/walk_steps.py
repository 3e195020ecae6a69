"""The walkthrough's computation: its inputs checked and drawn (or typed in) once, and the eight
steps run on each side, NumPy (``numpy_attn``) and PyTorch (``torch_attn``), through one pipeline.

    1  GPT-2 tokenization                   ids = encode(text)
    2  embedding lookup                     x = wte[ids]
    3  sinusoidal positions (optional)      x = x + PE
    4  weight-free self-attention           weights = softmax(x @ x.T), context = weights @ x
    5  trainable projections                q, k, v = x @ Wq, x @ Wk, x @ Wv; softmax(q k^T / sqrt(d)) v
    6  the causal mask                      query t sees keys 0..t only
    7  multi-head attention                 split into heads, attend, merge, project
    8  decoding with a key/value cache      step 7 again, one token at a time, past k, v cached
    9  the backward of step 5               L = sum(context * G): dweights, dscores, dq, dk, dv, dW

Both sides run ``pipeline`` from the same inputs, each through its own operations (``NumpySide``
and ``TorchSide`` say which). torch is imported only when the PyTorch side is built.

``--dtype bfloat16`` or ``float16``: the inputs are the float32 walkthrough's, drawn (or typed in)
in float32 and rounded to the low dtype; every step then runs in that dtype, each operation
computing in float32 inside and rounding its output once, as PyTorch's CPU kernels do.
"""

import math
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from attn_cli import tokenizer
from attn_cli.source_example import SOURCE_EXAMPLE
from attn_cli.term import printable
from numpy_attn._tree import tree_map
from numpy_attn.attention import (
    scaled_dot_product_attention_backward,
    scaled_dot_product_attention_forward,
)
from numpy_attn.embedding import embedding_forward
from numpy_attn.kv_cache import init_kv_cache
from numpy_attn.linear import linear_backward, linear_forward
from numpy_attn.multi_head import (
    init_multi_head_params,
    merge_heads,
    multi_head_attention_forward,
    split_heads,
)
from numpy_attn.positional import sinusoidal_encoding
from numpy_attn.softmax import softmax_backward, softmax_forward

DEFAULT_TEXT = SOURCE_EXAMPLE["text"]
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

# Tables are T x T: beyond 32 tokens they no longer fit a screen, nor a heatmap's tick labels.
MAX_TOKENS = 32
MAX_DIM = 64

# ---------------------------------------------------------------------------------------------
# The two sides. Each exposes the same small API over its own package, so that the pipeline
# below is written once and reads the same for both.

class NumpySide:
    """The NumPy side: numpy_attn's forwards (each returns (out, cache); the cache is dropped)."""

    name = "NumPy"

    def asarray(self, a):
        return a

    def to_numpy(self, a):
        return a

    def embedding(self, ids, wte):
        return embedding_forward(ids, wte)[0]

    def sinusoidal(self, T, C, dtype):
        return sinusoidal_encoding(T, C, dtype=dtype)

    def linear(self, x, w, b=None):
        return linear_forward(x, w, b)[0]

    def softmax(self, x):
        return softmax_forward(x)[0]

    def attention(self, q, k, v, is_causal=False, scale=None):
        out, cache = scaled_dot_product_attention_forward(q, k, v, is_causal=is_causal, scale=scale)
        return out, cache.weights.astype(out.dtype, copy=False)     # printed in out's dtype

    def split_heads(self, x, num_heads):
        return split_heads(x, num_heads)

    def merge_heads(self, x):
        return merge_heads(x)

    def multi_head(self, x, params, num_heads, is_causal=False):
        out, cache = multi_head_attention_forward(x, params, num_heads, is_causal=is_causal)
        return out, cache.weights.astype(out.dtype, copy=False)

    def kv_cache(self, n_layer, B, n_kv_head, max_len, head_size, dtype):
        return init_kv_cache(n_layer, B, n_kv_head, max_len, head_size, dtype=dtype)

    def decode(self, x, params, num_heads, kv_cache):
        """One decoding step: x (1, 1, C) is the new token; its key and value join ``kv_cache``."""
        return multi_head_attention_forward(x, params, num_heads, is_causal="bottom_right",
                                            kv_cache=kv_cache.layer(0))[0]

    def concat_tokens(self, arrays):
        return np.concatenate(arrays, axis=1)

    def transpose(self, x):
        return x.swapaxes(-1, -2)

    def causal_mask(self, T):
        return np.tri(T, dtype=np.bool_)

    def mask_scores(self, scores, mask):
        return np.where(mask, scores, -np.inf).astype(scores.dtype)

    def attention_grads(self, x, w_query, w_key, w_value, scale, upstream):
        """Step 9: step 5 again, each cache kept, then L = sum(context * G) sent back by hand,
        each line undoing one forward line, in reverse order."""
        q, q_cache = linear_forward(x, w_query)                  # (T, C) -> (T, d)
        k, k_cache = linear_forward(x, w_key)                    # (T, C) -> (T, d)
        v, v_cache = linear_forward(x, w_value)                  # (T, C) -> (T, d)
        scores, scores_cache = linear_forward(q, k.T)            # (T, d) @ (d, T) -> (T, T)
        scaled = scores * scale                                  # (T, T)
        weights, softmax_cache = softmax_forward(scaled)         # (T, T)
        context, context_cache = linear_forward(weights, v)      # (T, T) @ (T, d) -> (T, d)
        loss = (context * upstream).sum()                        # dL/dcontext = upstream
        # Undoes context = weights @ v: dweights = G v^T, dv = weights^T G.
        dweights, dv = linear_backward(upstream, context_cache)  # (T, T), {"w": (T, d)}
        # Undoes weights = softmax(scaled): w * (dweights - rowsum(w * dweights)).
        dscores = softmax_backward(dweights, softmax_cache)      # (T, T)
        # Undoes scaled = scores * scale, then scores = q @ k^T: dq = dscores k, d(k^T) = q^T dscores.
        dq, dk_t = linear_backward(dscores * scale, scores_cache)   # (T, d), {"w": (d, T)}
        dk = dk_t["w"].T                                         # (d, T) -> (T, d)
        dv = dv["w"]
        # Undoes q, k, v = x @ W: dW = x^T dq (and dk, dv); dx, the sum of the three paths, is not shown.
        dw_query = linear_backward(dq, q_cache)[1]["w"]          # (C, d)
        dw_key = linear_backward(dk, k_cache)[1]["w"]            # (C, d)
        dw_value = linear_backward(dv, v_cache)[1]["w"]          # (C, d)
        # The same dq, dk, dv from attention's own backward, in one call.
        _, cache = scaled_dot_product_attention_forward(q, k, v, scale=scale)
        sdpa_dq, sdpa_dk, sdpa_dv = scaled_dot_product_attention_backward(upstream, cache)
        return dict(loss=loss, dweights=dweights, dscores=dscores, dq=dq, dk=dk, dv=dv, dw_query=dw_query,
                    dw_key=dw_key, dw_value=dw_value, sdpa_dq=sdpa_dq, sdpa_dk=sdpa_dk, sdpa_dv=sdpa_dv)


class TorchSide:
    """The PyTorch side: torch_attn's forwards on tensors made from the same NumPy inputs."""

    name = "PyTorch"

    def __init__(self):
        import torch

        from torch_attn import (
            attention,
            embedding,
            kv_cache,
            linear,
            multi_head,
            positional,
            softmax,
        )

        self.torch = torch
        self.ops = dict(attention=attention, embedding=embedding, kv_cache=kv_cache, linear=linear,
                        multi_head=multi_head, positional=positional, softmax=softmax)

    def asarray(self, a):
        """A tensor of a copy of ``a``, or a nested dict of them (the multi-head parameters).
        torch.from_numpy does not know ml_dtypes' bfloat16: its bits travel as uint16 and are
        viewed as torch.bfloat16, which has the same layout."""
        def tensor(leaf):
            leaf = np.array(leaf, copy=True)
            if leaf.dtype == BFLOAT16:
                return self.torch.from_numpy(leaf.view(np.uint16)).view(self.torch.bfloat16)
            return self.torch.from_numpy(leaf)

        return tree_map(tensor, a)

    def to_numpy(self, t):
        t = t.detach()
        if t.dtype == self.torch.bfloat16:
            return t.view(self.torch.uint16).numpy().view(BFLOAT16)
        return t.numpy()

    def embedding(self, ids, wte):
        return self.ops["embedding"].embedding(ids, wte)

    def sinusoidal(self, T, C, dtype):
        return self.ops["positional"].sinusoidal_encoding(T, C, dtype=getattr(self.torch, np.dtype(dtype).name))

    def linear(self, x, w, b=None):
        return self.ops["linear"].linear(x, w, b)

    def softmax(self, x):
        return self.ops["softmax"].softmax(x)

    def attention(self, q, k, v, is_causal=False, scale=None):
        out, weights = self.ops["attention"].scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)
        return out, weights.to(out.dtype)

    def split_heads(self, x, num_heads):
        return self.ops["multi_head"].split_heads(x, num_heads)

    def merge_heads(self, x):
        return self.ops["multi_head"].merge_heads(x)

    def multi_head(self, x, params, num_heads, is_causal=False):
        out, weights = self.ops["multi_head"].multi_head_attention(x, params, num_heads, is_causal=is_causal)
        return out, weights.to(out.dtype)

    def kv_cache(self, n_layer, B, n_kv_head, max_len, head_size, dtype):
        return self.ops["kv_cache"].init_kv_cache(n_layer, B, n_kv_head, max_len, head_size,
                                                  dtype=getattr(self.torch, np.dtype(dtype).name))

    def decode(self, x, params, num_heads, kv_cache):
        with self.torch.no_grad():    # the cache is for inference only
            return self.ops["multi_head"].multi_head_attention(x, params, num_heads, is_causal="bottom_right",
                                                               kv_cache=kv_cache.layer(0))[0]

    def concat_tokens(self, tensors):
        return self.torch.cat(tensors, dim=1)

    def transpose(self, x):
        return x.transpose(-1, -2)

    def causal_mask(self, T):
        return self.torch.ones(T, T, dtype=self.torch.bool).tril()

    def mask_scores(self, scores, mask):
        return scores.masked_fill(~mask, -self.torch.inf)

    def attention_grads(self, x, w_query, w_key, w_value, scale, upstream):
        """Step 9: step 5 again, then L = sum(context * G) sent back by autograd; each gradient
        is read from .grad (retain_grad keeps those of the tensors that are not leaves)."""
        for w in (w_query, w_key, w_value):
            w.requires_grad_()
        q = self.linear(x, w_query)                              # (T, C) -> (T, d)
        k = self.linear(x, w_key)                                # (T, C) -> (T, d)
        v = self.linear(x, w_value)                              # (T, C) -> (T, d)
        scores = self.linear(q, k.T)                             # (T, d) @ (d, T) -> (T, T)
        scaled = scores * scale                                  # (T, T)
        weights = self.softmax(scaled)                           # (T, T)
        context = self.linear(weights, v)                        # (T, T) @ (T, d) -> (T, d)
        loss = (context * upstream).sum()                        # dL/dcontext = upstream
        for t in (q, k, v, scaled, weights):
            t.retain_grad()
        loss.backward()
        # The same dq, dk, dv through attention in one call, from copies of q, k, v.
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out, _ = self.attention(*leaves, scale=scale)
        (out * upstream).sum().backward()
        return dict(loss=loss, dweights=weights.grad, dscores=scaled.grad, dq=q.grad, dk=k.grad, dv=v.grad,
                    dw_query=w_query.grad, dw_key=w_key.grad, dw_value=w_value.grad,
                    sdpa_dq=leaves[0].grad, sdpa_dk=leaves[1].grad, sdpa_dv=leaves[2].grad)


def pipeline(side, inputs):
    """Run every step on one side; return {name: NumPy array} of everything the tables show."""
    r = {}
    T, C = len(inputs.ids), inputs.C
    ids = side.asarray(inputs.ids)
    r["ids"] = ids
    # Step 2: the embedding lookup.
    x = side.embedding(ids, side.asarray(inputs.wte))           # (T,) -> (T, C)
    r["tok"] = x
    # Step 3: positions, added.
    if inputs.positional:
        pe = side.sinusoidal(T, C, inputs.dtype)                 # (T, C)
        r["pe"] = pe
        x = x + pe                                               # (T, C)
        r["x"] = x
    # Step 4: weight-free self-attention; linear with w = x.T and no bias is the plain matmul x @ x.T.
    scores = side.linear(x, side.transpose(x))                   # (T, C) @ (C, T) -> (T, T)
    r["s4_scores"] = scores
    weights = side.softmax(scores)                               # (T, T), rows sum to one
    r["s4_weights"] = weights
    r["s4_context"] = side.linear(weights, x)                    # (T, T) @ (T, C) -> (T, C)
    r["s4_sdpa"], _ = side.attention(x, x, x, scale=1.0)         # the same, in one call
    # Step 5: trainable projections.
    q = side.linear(x, side.asarray(inputs.w_query))             # (T, C) -> (T, d)
    k = side.linear(x, side.asarray(inputs.w_key))               # (T, C) -> (T, d)
    v = side.linear(x, side.asarray(inputs.w_value))             # (T, C) -> (T, d)
    r.update(q=q, k=k, v=v)
    scores = side.linear(q, side.transpose(k))                   # (T, d) @ (d, T) -> (T, T)
    r["s5_scores"] = scores
    scaled = scores * inputs.scale                               # (T, T)
    r["s5_scaled"] = scaled
    weights = side.softmax(scaled)                               # (T, T)
    r["s5_weights"] = weights
    context = side.linear(weights, v)                            # (T, T) @ (T, d) -> (T, d)
    r["s5_context"] = context
    r["s5_sdpa"], r["s5_sdpa_weights"] = side.attention(q, k, v)
    # Step 6: the causal mask.
    mask = side.causal_mask(T)                                   # (T, T), True on and below the diagonal
    r["s6_mask"] = mask
    masked = side.mask_scores(scaled, mask)                      # (T, T), -inf above the diagonal
    r["s6_masked"] = masked
    weights = side.softmax(masked)                               # (T, T)
    r["s6_weights"] = weights
    r["s6_context"] = side.linear(weights, v)                    # (T, d)
    r["s6_change"] = r["s6_context"] - context                   # (T, d)
    r["s6_sdpa"], r["s6_sdpa_weights"] = side.attention(q, k, v, is_causal=True)
    # Step 7: multi-head attention, causal as in GPT, on a batch of one.
    params = side.asarray(inputs.params)
    xb = x[None]                                                 # (T, C) -> (1, T, C)
    nh = inputs.num_heads
    for name in ("q", "k", "v"):
        p = side.linear(xb, **params[name])                      # (1, T, C)
        r[f"mh_{name}"] = p
        r[f"mh_{name}_heads"] = side.split_heads(p, nh)          # (1, T, C) -> (1, nh, T, hs)
    heads, weights = side.attention(r["mh_q_heads"], r["mh_k_heads"], r["mh_v_heads"], is_causal=True)
    r["mh_heads"] = heads                                        # (1, nh, T, hs)
    r["mh_weights"] = weights                                    # (1, nh, T, T)
    r["mh_merged"] = side.merge_heads(heads)                     # (1, nh, T, hs) -> (1, T, C)
    r["mh_out"] = side.linear(r["mh_merged"], **params["o"])     # (1, T, C)
    r["mh_one_call"], r["mh_one_call_weights"] = side.multi_head(xb, params, nh, is_causal=True)
    # Step 9: the backward of step 5, from L = sum(context * G).
    grads = side.attention_grads(x, *(side.asarray(w) for w in (inputs.w_query, inputs.w_key, inputs.w_value)),
                                 inputs.scale, side.asarray(inputs.upstream))
    r.update({f"s9_{name}": value for name, value in grads.items()})
    r["s9_upstream"] = side.asarray(inputs.upstream)
    # Step 8: the same heads, decoding: one token at a time, past keys and values from a cache.
    hs = inputs.C // nh
    nkv = inputs.params["k"]["w"].shape[1] // hs                 # key/value heads (nh here)
    cache = side.kv_cache(1, 1, nkv, T, hs, inputs.dtype)        # k, v (1, 1, nkv, T, hs) of zeros
    outs, lengths = [], []
    for t in range(T):
        outs.append(side.decode(xb[:, t:t + 1], params, nh, cache))   # (1, 1, C) -> (1, 1, C)
        lengths.append(cache.length)
    r["kv_out"] = side.concat_tokens(outs)                       # T x (1, 1, C) -> (1, T, C)
    r["kv_k"] = cache.k[0, :, :, :cache.length]                  # (1, nkv, T, hs): the cached keys
    r["kv_v"] = cache.v[0, :, :, :cache.length]                  # (1, nkv, T, hs): the cached values
    r["kv_length"] = side.asarray(np.array(lengths, dtype=np.int64))                   # (T,)
    r["kv_bytes"] = side.asarray(np.array(lengths, dtype=np.int64) * cache.bytes_per_token)  # (T,)
    r["kv_bytes_per_token"] = side.asarray(np.array(cache.bytes_per_token))
    r["kv_nbytes"] = side.asarray(np.array(cache.nbytes))
    return {name: side.to_numpy(value) for name, value in r.items()}


# ---------------------------------------------------------------------------------------------
# Inputs: checked and drawn once, shared by both sides.

@dataclass
class Inputs:
    text: str
    ids: np.ndarray            # (T,) int64
    labels: list               # row/column label of each token
    pieces: list               # the exact token strings
    C: int
    d_out: int
    num_heads: int
    dtype: np.dtype
    positional: bool
    focus: int
    wte: np.ndarray            # (V, C)
    w_query: np.ndarray        # (C, d_out)
    w_key: np.ndarray
    w_value: np.ndarray
    params: dict               # multi-head parameters, (C, C) weights
    upstream: np.ndarray       # (T, d_out) G = dL/dcontext of step 9
    scale: float
    source: bool               # the source example (--example source)
    seed: int
    notes: list = field(default_factory=list)


def _labels(pieces):
    """Short row/column labels: the token without its leading space, or its repr if blank;
    control characters (a newline, an escape) written as escapes, never sent to the terminal."""
    out = []
    for piece in pieces:
        label = printable(piece.strip()) or repr(piece)
        out.append(label if len(label) <= 10 else label[:9] + "~")
    return out


def _default_heads(C):
    """The fewest heads above one that divide C into heads of size 2 or more; failing that (C
    prime, or 2), the smallest divisor above one."""
    divisors = [n for n in range(2, C + 1) if C % n == 0]
    return next((n for n in divisors if C // n >= 2), divisors[0] if divisors else 1)


def _resolve_focus(focus, labels):
    """Position of the followed token: a 0-based position, or a token's text (its first occurrence)."""
    T = len(labels)
    if focus is None:
        return min(1, T - 1)
    try:
        pos = int(focus)
    except ValueError:
        matches = [i for i, label in enumerate(labels) if label == focus.strip()]
        if not matches:
            raise ValueError(f"--focus {focus!r} is neither a position nor a token of the text; "
                             f"the tokens are {labels}") from None
        return matches[0]
    if not -T <= pos < T:
        raise ValueError(f"--focus {pos} is out of range: the text has {T} tokens (positions 0..{T - 1})")
    return pos % T


def as_dtype(name):
    """The NumPy dtype of ``--dtype`` (bfloat16 is ml_dtypes')."""
    return BFLOAT16 if name == "bfloat16" else np.dtype(name)


def _cast(a, dtype):
    """``a`` (float64) in ``dtype``, through float32 for float16 and bfloat16: the low-precision
    walkthrough's inputs are then exactly the float32 walkthrough's, rounded."""
    return a.astype(dtype) if dtype == np.float64 else a.astype(np.float32).astype(dtype)


def prepare(args):
    """Check the command's arguments and draw (or type in) every input; raise ValueError if bad."""
    source = args.example == "source"
    text = args.text
    if source:
        if text is not None and text != DEFAULT_TEXT:
            raise ValueError(f"--example source replays {DEFAULT_TEXT!r}; give no TEXT with it")
        for option, value, needed in (("--dim", args.dim, 3), ("--d-out", args.d_out, 2)):
            if value is not None and value != needed:
                raise ValueError(f"--example source has fixed sizes: {option} must be {needed}, got {value}")
    text = DEFAULT_TEXT if text is None else text
    if not text.strip():
        raise ValueError("TEXT is empty: give a sentence to walk through, e.g. "
                         f"numpy-attn walkthrough {DEFAULT_TEXT!r}")
    ids = tokenizer.encode(text)
    if len(ids) > MAX_TOKENS:
        raise ValueError(f"TEXT has {len(ids)} GPT-2 tokens; the walkthrough prints T x T tables "
                         f"and takes at most {MAX_TOKENS} tokens")
    C = (3 if source else 4) if args.dim is None else args.dim
    d_out = 2 if args.d_out is None else args.d_out
    if not 1 <= C <= MAX_DIM:
        raise ValueError(f"--dim must lie in 1..{MAX_DIM}, got {C}")
    if not 1 <= d_out <= MAX_DIM:
        raise ValueError(f"--d-out must lie in 1..{MAX_DIM}, got {d_out}")
    num_heads = _default_heads(C) if args.heads is None else args.heads
    if num_heads < 1 or C % num_heads:
        raise ValueError(f"--heads {num_heads} does not divide --dim {C}: each head takes C / nh channels")
    if args.seed < 0:
        raise ValueError(f"--seed must be at least 0, got {args.seed}")
    if args.precision is not None and not 0 <= args.precision <= 12:
        raise ValueError(f"--precision must lie in 0..12, got {args.precision}")
    dtype = as_dtype(args.dtype)
    pieces = tokenizer.token_strings(ids)
    labels = _labels(pieces)
    focus = _resolve_focus(args.focus, labels)
    ids = np.asarray(ids, dtype=np.int64)
    V = tokenizer.get_encoding().n_vocab
    rng = np.random.default_rng(args.seed)
    notes = []
    if source:
        # The typed-in rows go into the table at their tokens' ids; the rest of the table stays zero.
        wte = np.zeros((V, C), dtype=dtype)
        wte[ids] = _cast(np.array(SOURCE_EXAMPLE["embeddings"]), dtype)
        w = {name: _cast(np.array(SOURCE_EXAMPLE[name]), dtype) for name in ("w_query", "w_key", "w_value")}
        notes.append("wte: the six rows typed in from the source example, the rest of the table zero")
        notes.append("W_query, W_key, W_value: typed in from the source (torch.manual_seed(123); torch.rand(3, 2))")
    else:
        wte = _cast(rng.standard_normal((V, C)), dtype)      # N(0, 1), as torch.nn.Embedding
        w = {name: _cast(rng.random((C, d_out)), dtype) for name in ("w_query", "w_key", "w_value")}
        notes.append(f"wte ({V}, {C}) drawn from N(0, 1), as torch.nn.Embedding; seed {args.seed}")
        notes.append(f"W_query, W_key, W_value ({C}, {d_out}) drawn from U[0, 1), as torch.rand in the source example")
    drawn = dtype if dtype == np.float64 else np.dtype(np.float32)       # a low dtype: rounded after
    params = tree_map(lambda p: p.astype(dtype), init_multi_head_params(C, rng, bias=True, dtype=drawn))
    # Drawn after everything else, so that the earlier draws (and steps) stay as they were.
    upstream = _cast(np.round(rng.standard_normal((len(ids), d_out)), 2), dtype)
    positional = (not source) if args.positional is None else args.positional
    return Inputs(text=text, ids=ids, labels=labels, pieces=pieces, C=C, d_out=d_out,
                  num_heads=num_heads, dtype=dtype, positional=positional, focus=focus, wte=wte,
                  params=params, upstream=upstream, scale=1 / math.sqrt(d_out), source=source, seed=args.seed,
                  notes=notes, **w)


