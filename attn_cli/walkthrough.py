"""The ``numpy-attn walkthrough`` command: self-attention step by step, NumPy and PyTorch side by side.

The seven steps of the source material's attention chapter, each computed twice with this
project's own operations, once by ``numpy_attn`` and once by its twin ``torch_attn``:

    1  GPT-2 tokenization                   ids = encode(text)
    2  embedding lookup                     x = wte[ids]
    3  sinusoidal positions (optional)      x = x + PE
    4  weight-free self-attention           weights = softmax(x @ x.T), context = weights @ x
    5  trainable projections                q, k, v = x @ Wq, x @ Wk, x @ Wv; softmax(q k^T / sqrt(d)) v
    6  the causal mask                      query t sees keys 0..t only
    7  multi-head attention                 split into heads, attend, merge, project

Both twins run the whole pipeline (``_pipeline``) from the same inputs, each through its own
operations (``_NumpySide`` and ``_TorchSide`` say which), and every table shows the NumPy result
beside the PyTorch one and the largest absolute difference between them. torch is imported only
when the PyTorch side runs; matplotlib only for ``--plot``.
"""

import math
import os
import shutil
import sys
from dataclasses import dataclass, field

import numpy as np

from attn_cli import tokenizer
from numpy_attn.attention import scaled_dot_product_attention_forward
from numpy_attn.embedding import embedding_forward
from numpy_attn.linear import linear_forward
from numpy_attn.multi_head import (
    init_multi_head_params,
    merge_heads,
    multi_head_attention_forward,
    split_heads,
)
from numpy_attn.positional import sinusoidal_encoding
from numpy_attn.softmax import softmax_forward

DEFAULT_TEXT = "The cat sat on the mat"

# Tables are T x T: beyond 32 tokens they no longer fit a screen, nor a heatmap's tick labels.
MAX_TOKENS = 32
MAX_DIM = 64

# The source material's worked example (issue 3), typed in: the 3-dimensional embeddings of
# "The cat sat on the mat" in token order, and torch.manual_seed(123); torch.rand(3, 2) three times.
SOURCE_EXAMPLE = {
    "text": DEFAULT_TEXT,
    "embeddings": [[2.2315, -0.7460, -0.0614], [-0.1235, 0.4462, 0.7265],
                   [1.4900, -2.0396, 1.0440], [-0.6735, -0.5763, -0.9291],
                   [0.7707, 0.5180, 0.2458], [0.6508, 0.1164, -1.3904]],
    "w_query": [[0.2961, 0.5166], [0.2517, 0.6886], [0.0740, 0.8665]],
    "w_key": [[0.1366, 0.1025], [0.1841, 0.7264], [0.3153, 0.6871]],
    "w_value": [[0.0756, 0.1966], [0.3164, 0.4017], [0.1186, 0.8274]],
}


# ---------------------------------------------------------------------------------------------
# The two sides. Each exposes the same small API over its own package, so that the pipeline
# below is written once and reads the same for both.

class _NumpySide:
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
        return out, cache.weights

    def split_heads(self, x, num_heads):
        return split_heads(x, num_heads)

    def merge_heads(self, x):
        return merge_heads(x)

    def multi_head(self, x, params, num_heads, is_causal=False):
        out, cache = multi_head_attention_forward(x, params, num_heads, is_causal=is_causal)
        return out, cache.weights

    def transpose(self, x):
        return x.swapaxes(-1, -2)

    def causal_mask(self, T):
        return np.tri(T, dtype=np.bool_)

    def mask_scores(self, scores, mask):
        return np.where(mask, scores, -np.inf).astype(scores.dtype)


class _TorchSide:
    """The PyTorch side: torch_attn's forwards on tensors made from the same NumPy inputs."""

    name = "PyTorch"

    def __init__(self):
        import torch

        from torch_attn import attention, embedding, linear, multi_head, positional, softmax

        self.torch = torch
        self.ops = dict(attention=attention, embedding=embedding, linear=linear,
                        multi_head=multi_head, positional=positional, softmax=softmax)

    def asarray(self, a):
        if isinstance(a, dict):
            return {key: self.asarray(value) for key, value in a.items()}
        return self.torch.from_numpy(np.array(a, copy=True))

    def to_numpy(self, t):
        return t.detach().numpy()

    def embedding(self, ids, wte):
        return self.ops["embedding"].embedding(ids, wte)

    def sinusoidal(self, T, C, dtype):
        return self.ops["positional"].sinusoidal_encoding(T, C, dtype=getattr(self.torch, np.dtype(dtype).name))

    def linear(self, x, w, b=None):
        return self.ops["linear"].linear(x, w, b)

    def softmax(self, x):
        return self.ops["softmax"].softmax(x)

    def attention(self, q, k, v, is_causal=False, scale=None):
        return self.ops["attention"].scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)

    def split_heads(self, x, num_heads):
        return self.ops["multi_head"].split_heads(x, num_heads)

    def merge_heads(self, x):
        return self.ops["multi_head"].merge_heads(x)

    def multi_head(self, x, params, num_heads, is_causal=False):
        return self.ops["multi_head"].multi_head_attention(x, params, num_heads, is_causal=is_causal)

    def transpose(self, x):
        return x.transpose(-1, -2)

    def causal_mask(self, T):
        return self.torch.ones(T, T, dtype=self.torch.bool).tril()

    def mask_scores(self, scores, mask):
        return scores.masked_fill(~mask, -self.torch.inf)


def _pipeline(side, inputs):
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
    scale: float
    source: bool               # the source material's example
    seed: int
    notes: list = field(default_factory=list)


def _labels(pieces):
    """Short row/column labels: the token without its leading space, or its repr if blank."""
    out = []
    for piece in pieces:
        label = piece.strip() or repr(piece)
        out.append(label if len(label) <= 10 else label[:9] + "~")
    return out


def _default_heads(C):
    """The smallest head count above one that divides C (C itself for a prime C)."""
    return next((n for n in range(2, C + 1) if C % n == 0), 1)


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
    C = 3 if args.dim is None else args.dim
    d_out = 2 if args.d_out is None else args.d_out
    if not 1 <= C <= MAX_DIM:
        raise ValueError(f"--dim must lie in 1..{MAX_DIM}, got {C}")
    if not 1 <= d_out <= MAX_DIM:
        raise ValueError(f"--d-out must lie in 1..{MAX_DIM}, got {d_out}")
    num_heads = _default_heads(C) if args.heads is None else args.heads
    if num_heads < 1 or C % num_heads:
        raise ValueError(f"--heads {num_heads} does not divide --dim {C}: each head takes C / nh channels")
    if args.precision is not None and not 0 <= args.precision <= 12:
        raise ValueError(f"--precision must lie in 0..12, got {args.precision}")
    dtype = np.dtype(args.dtype)
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
        wte[ids] = np.array(SOURCE_EXAMPLE["embeddings"], dtype=dtype)
        w = {name: np.array(SOURCE_EXAMPLE[name], dtype=dtype) for name in ("w_query", "w_key", "w_value")}
        notes.append("wte: the six rows typed in from the source (issue 3), the rest of the table zero")
        notes.append("W_query, W_key, W_value: typed in from the source (torch.manual_seed(123); torch.rand(3, 2))")
    else:
        wte = rng.standard_normal((V, C)).astype(dtype)       # N(0, 1), as torch.nn.Embedding
        w = {name: rng.random((C, d_out)).astype(dtype) for name in ("w_query", "w_key", "w_value")}
        notes.append(f"wte ({V}, {C}) drawn from N(0, 1), as torch.nn.Embedding; seed {args.seed}")
        notes.append(f"W_query, W_key, W_value ({C}, {d_out}) drawn from U[0, 1), as the source's torch.rand")
    params = init_multi_head_params(C, rng, bias=True, dtype=dtype)
    positional = (not source) if args.positional is None else args.positional
    return Inputs(text=text, ids=ids, labels=labels, pieces=pieces, C=C, d_out=d_out,
                  num_heads=num_heads, dtype=dtype, positional=positional, focus=focus, wte=wte,
                  params=params, scale=1 / math.sqrt(d_out), source=source, seed=args.seed,
                  notes=notes, **w)


# ---------------------------------------------------------------------------------------------
# Text output.

class _Style:
    """ANSI styles, or nothing when colour is off."""

    CODES = dict(title="1;36", bold="1", dim="2", good="32", bad="1;31", note="33")

    def __init__(self, enabled):
        self.enabled = enabled

    def __call__(self, kind, text):
        return f"\x1b[{self.CODES[kind]}m{text}\x1b[0m" if self.enabled and text else text


def _fmt(value, precision):
    if isinstance(value, np.bool_ | bool):
        return "1" if value else "0"
    if isinstance(value, np.integer | int):
        return str(int(value))
    if np.isneginf(value):
        return "-inf"
    text = f"{value:.{precision}f}"
    return text[1:] if text.startswith("-") and not text.strip("-0.") else text   # no "-0.0000"


def _table_lines(a, rows, cols, precision, sums=False):
    """Right-aligned text rows of a 2-D array, rows and columns labelled; ``sums`` adds row sums."""
    cells = [[_fmt(v, precision) for v in row] for row in a]
    cols = list(cols)
    if sums:
        cols.append("sum")
        for cell_row, row in zip(cells, a, strict=True):
            cell_row.append(_fmt(row.sum(dtype=np.float64), precision))
    widths = [max([len(c)] + [len(r[j]) for r in cells]) for j, c in enumerate(cols)]
    lw = max(len(r) for r in rows)
    lines = [" " * lw + "".join(f"  {c:>{w}}" for c, w in zip(cols, widths, strict=True))]
    for label, cell_row in zip(rows, cells, strict=True):
        lines.append(f"{label:<{lw}}" + "".join(f"  {c:>{w}}" for c, w in zip(cell_row, widths, strict=True)))
    return lines


def max_abs_diff(a, b):
    """Largest |a - b|, counting equal infinities (masked scores) as no difference."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:            # broadcasting would compare the wrong numbers
        raise ValueError(f"cannot compare shapes {a.shape} and {b.shape}")
    same = a == b                     # also True where both are the same infinity
    with np.errstate(invalid="ignore"):   # inf - inf, where ``same`` already answers
        diff = np.where(same, 0.0, np.abs(a - b))
    return float(diff.max()) if diff.size else 0.0


class Printer:
    """Prints steps and tables; records each table's largest difference and the weights to plot."""

    def __init__(self, inputs, results, out, style, precision, width):
        self.inputs = inputs
        self.np = results["NumPy"]
        self.torch = results.get("PyTorch")
        self.out = out
        self.style = style
        self.precision = precision
        self.width = width
        self.tolerance = 1e-4 if inputs.dtype == np.float32 else 1e-10
        self.diffs = []               # (step, table title, max |NumPy - PyTorch|)
        self.heatmaps = []            # (file stem, title, weights (T, T))
        self.step_number = 0

    def line(self, text=""):
        print(text, file=self.out)

    def note(self, text):
        self.line("  " + self.style("note", text))

    def step(self, number, title, numpy_ops, torch_ops):
        self.step_number = number
        head = f"Step {number}. {title} "
        self.line()
        self.line(self.style("title", head + "=" * max(3, min(self.width, 100) - len(head))))
        self.line("  " + self.style("dim", f"NumPy (numpy_attn): {numpy_ops}"))
        if self.torch is not None:
            self.line("  " + self.style("dim", f"PyTorch (torch_attn): {torch_ops}"))

    def table(self, key, title, rows, cols, sums=False, index=()):
        """One table: the NumPy result beside the PyTorch one, then their largest difference."""
        a = self.np[key][index]
        if a.ndim == 1:
            a = a[:, None]
        where = self.np[key].shape
        if index != ():
            where = f"{where}, showing [{', '.join(map(str, np.atleast_1d(index)))}]"
        self.line()
        self.line(f"  {self.style('bold', title)}  shape {where}")
        left = _table_lines(a, rows, cols, self.precision, sums)
        if self.torch is None:
            for text in left:
                self.line("    " + text)
            return
        b = self.torch[key][index].reshape(a.shape)
        right = _table_lines(b, rows, cols, self.precision, sums)
        lw = max(len(s) for s in left)
        if 4 + lw + 5 + max(len(s) for s in right) <= self.width:
            self.line("    " + self.style("dim", f"{'NumPy':<{lw}}  |  PyTorch"))
            for x, y in zip(left, right, strict=True):
                self.line(f"    {x:<{lw}}  |  {y}")
        else:                         # too wide for the terminal: one above the other
            for name, lines in (("NumPy", left), ("PyTorch", right)):
                self.line("    " + self.style("dim", name))
                for text in lines:
                    self.line("    " + text)
        self.diff(title, a, b)

    def diff(self, title, a, b):
        d = max_abs_diff(a, b)
        self.diffs.append((self.step_number, title, d))
        kind = "good" if d <= self.tolerance else "bad"
        self.line("    " + self.style(kind, f"max |NumPy - PyTorch| = {d:.2e}"))

    def same(self, what, key_a, key_b):
        """Say that two ways of computing one thing agree (on the NumPy side, and on the torch side)."""
        d = max_abs_diff(self.np[key_a], self.np[key_b])
        text = f"{what}: max |difference| = {d:.2e} (NumPy)"
        if self.torch is not None:
            text += f", {max_abs_diff(self.torch[key_a], self.torch[key_b]):.2e} (PyTorch)"
        self.line()
        self.line("  " + text)

    def heatmap(self, stem, title, key, index=()):
        self.heatmaps.append((stem, title, self.np[key][index]))


def _signed(x, precision):
    """A factor of a written-out product: negative numbers in parentheses."""
    text = _fmt(x, precision)
    return f"({text})" if text.startswith("-") else text


def _vec(v, precision):
    return "[" + ", ".join(_fmt(x, precision) for x in v) + "]"


def _worked_dot_products(p, inputs):
    """Step 5's focus: the query of one token against every key, by hand, from the NumPy side."""
    r, prec, i = p.np, p.precision, inputs.focus
    name = inputs.labels[i]
    q = r["q"][i]
    p.line()
    p.line(f"  {p.style('bold', f'Follow {name!r}')} (position {i}, --focus): q_{name} = x_{name} @ W_query = {_vec(q, prec)}")
    shown = min(len(q), 4)            # write out at most four products per dot product
    terms = []
    for j in range(len(inputs.labels)):
        k = r["k"][j]
        text = " + ".join(f"{_signed(a, prec)}*{_signed(b, prec)}" for a, b in zip(q[:shown], k[:shown], strict=True))
        terms.append(text + (" + ..." if len(q) > shown else ""))
    lw = max(len(label) for label in inputs.labels)
    tw = max(len(t) for t in terms)
    nw = max(len(_fmt(v, prec)) for v in np.concatenate([r["s5_scores"][i], r["s5_scaled"][i]]))
    for j, label in enumerate(inputs.labels):
        p.line(f"    q_{name} . k_{label:<{lw}} = {terms[j]:<{tw}} = {_fmt(r['s5_scores'][i, j], prec):>{nw}}"
               f"   / sqrt({inputs.d_out}) = {_fmt(r['s5_scaled'][i, j], prec):>{nw}}"
               f"   weight {_fmt(r['s5_weights'][i, j], prec)}")
    weights = r["s5_weights"][i]
    p.line(f"    weights = softmax(scaled scores) = {_vec(weights, prec)}  (sum {_fmt(weights.sum(dtype=np.float64), prec)})")
    sum_terms = " + ".join(f"{_fmt(w, prec)}*v_{label}" for w, label in zip(weights, inputs.labels, strict=True))
    p.line(f"    context z_{name} = {sum_terms}")
    p.line(f"             = {_vec(r['s5_context'][i], prec)}")
    if p.torch is not None:
        p.line(f"    PyTorch z_{name} = {_vec(p.torch['s5_context'][i], prec)}")
        p.diff(f"context of {name!r}", r["s5_context"][i], p.torch["s5_context"][i])


def _print_steps(p, inputs):
    tok = inputs.labels
    chan = [f"c{j}" for j in range(inputs.C)]
    dcol = [f"d{j}" for j in range(inputs.d_out)]
    T, C, nh = len(tok), inputs.C, inputs.num_heads
    hs = C // nh

    p.step(1, "GPT-2 tokenization", "tokenizer.encode -> np.ndarray of int64",
           "none: torch has no tokenizer; torch.from_numpy(ids) takes the same ids")
    p.note("token strings: " + " ".join(repr(s) for s in inputs.pieces))
    p.table("ids", "ids = encode(text)", tok, ["id"])

    p.step(2, "Embedding lookup", "embedding.embedding_forward(ids, wte)", "embedding.embedding(ids, wte)")
    for text in inputs.notes:
        p.note(text)
    p.table("tok", f"x = wte[ids], C = {C} (--dim)", tok, chan)

    if inputs.positional:
        p.step(3, "Sinusoidal positions, added (--no-positional leaves them out)",
               "positional.sinusoidal_encoding(T, C)", "positional.sinusoidal_encoding(T, C)")
        p.note("PE[t, 2i] = sin(t / 10000^(2i/C)), PE[t, 2i+1] = cos(t / 10000^(2i/C))")
        p.table("pe", "PE, sin on even channels, cos on odd", tok, chan)
        p.table("x", "x = x + PE, the input of attention", tok, chan)
    else:
        p.step(3, "Sinusoidal positions: skipped (--positional adds them)", "-", "-")
        p.note("attention's input is the embeddings alone" +
               (", as in the source's example" if inputs.source else ""))

    p.step(4, "Weight-free self-attention",
           "linear.linear_forward (a matmul), softmax.softmax_forward, attention.scaled_dot_product_attention_forward",
           "linear.linear, softmax.softmax, attention.scaled_dot_product_attention")
    p.note("every token's input is its own query, key and value; no weights, no scaling")
    p.table("s4_scores", "scores = x @ x.T", tok, tok)
    p.table("s4_weights", "weights = softmax(scores), each row sums to 1", tok, tok, sums=True)
    p.heatmap("step4_weight_free", "Step 4: weight-free self-attention weights", "s4_weights")
    p.table("s4_context", "context = weights @ x", tok, chan)
    p.same("scaled_dot_product_attention(x, x, x, scale=1) gives the same context", "s4_context", "s4_sdpa")

    p.step(5, f"Trainable projections to d = {inputs.d_out} (--d-out)",
           "linear.linear_forward, softmax.softmax_forward, attention.scaled_dot_product_attention_forward",
           "linear.linear, softmax.softmax, attention.scaled_dot_product_attention")
    p.table("q", "queries = x @ W_query", tok, dcol)
    p.table("k", "keys = x @ W_key", tok, dcol)
    p.table("v", "values = x @ W_value", tok, dcol)
    p.table("s5_scores", "scores = queries @ keys.T", tok, tok)
    p.table("s5_scaled", f"scaled scores = scores / sqrt({inputs.d_out})", tok, tok)
    p.table("s5_weights", "weights = softmax(scaled scores)", tok, tok, sums=True)
    p.heatmap("step5_qkv", f"Step 5: weights of softmax(q k^T / sqrt({inputs.d_out}))", "s5_weights")
    p.table("s5_context", "context = weights @ values", tok, dcol)
    p.same("scaled_dot_product_attention(q, k, v) gives the same context", "s5_context", "s5_sdpa")
    _worked_dot_products(p, inputs)

    p.step(6, "The causal mask", "np.tri, np.where, softmax.softmax_forward, attention.scaled_dot_product_attention_forward(..., is_causal=True)",
           "torch.ones(T, T).tril(), masked_fill, softmax.softmax, attention.scaled_dot_product_attention(..., is_causal=True)")
    p.note("a decoder predicts token t+1 from tokens 0..t, so query t must not see the keys after t")
    p.table("s6_mask", "mask: 1 where query (row) may attend to key (column)", tok, tok)
    p.table("s6_masked", "masked scores: -inf above the diagonal", tok, tok)
    p.table("s6_weights", "causal weights = softmax(masked scores)", tok, tok, sums=True)
    p.heatmap("step6_causal", "Step 6: causal attention weights", "s6_weights")
    p.table("s6_context", "causal context = causal weights @ values", tok, dcol)
    p.table("s6_change", "what the mask changed: causal context - step 5 context", tok, dcol)
    p.note(f"the last row ({tok[-1]!r}) sees every key and is unchanged; the first sees only itself")
    p.same("is_causal=True in one call gives the same context", "s6_context", "s6_sdpa")

    p.step(7, f"Multi-head attention, {nh} heads of size {hs} (--heads), causal",
           "linear.linear_forward, multi_head.split_heads / merge_heads, attention.scaled_dot_product_attention_forward, "
           "multi_head.multi_head_attention_forward",
           "linear.linear, multi_head.split_heads / merge_heads, attention.scaled_dot_product_attention, "
           "multi_head.multi_head_attention")
    p.note(f"parameters from multi_head.init_multi_head_params({C}, rng): q, k, v, o each w ({C}, {C}), b ({C},)")
    head_cols = [f"h{h}.{j}" if hs > 1 else f"h{h}" for h in range(nh) for j in range(hs)]
    p.table("mh_q", "Q = x @ Wq + bq, columns grouped by head", tok, head_cols, index=0)
    p.table("mh_k", "K = x @ Wk + bk", tok, head_cols, index=0)
    p.table("mh_v", "V = x @ Wv + bv", tok, head_cols, index=0)
    p.line()
    p.line(f"  split_heads(Q, {nh}): (1, {T}, {C}) -> (1, {nh}, {T}, {hs}); head h takes columns "
           f"h*{hs} .. (h+1)*{hs}-1 of Q, K and V")
    for h in range(nh):
        p.table("mh_weights", f"head {h}: causal weights = softmax(Q_h K_h^T / sqrt({hs}))", tok, tok,
                sums=True, index=(0, h))
        p.heatmap(f"step7_head{h}", f"Step 7: head {h} of {nh}, causal weights", "mh_weights", (0, h))
    p.table("mh_merged", f"merge_heads(head outputs): (1, {nh}, {T}, {hs}) -> (1, {T}, {C})", tok, head_cols, index=0)
    p.table("mh_out", "out = merged @ Wo + bo", tok, chan, index=0)
    p.same("multi_head_attention_forward(x, params, num_heads, is_causal=True) in one call gives the same out",
           "mh_out", "mh_one_call")


def _summary(p):
    p.line()
    if p.torch is None:
        p.line(p.style("title", "Done: the NumPy side alone (--no-torch)."))
        return
    worst = max(p.diffs, key=lambda d: d[2])
    kind = "good" if worst[2] <= p.tolerance else "bad"
    p.line(p.style("title", f"Done: {len(p.diffs)} tables computed by NumPy and by PyTorch."))
    p.line("  " + p.style(kind, f"largest |NumPy - PyTorch| over all steps = {worst[2]:.2e}") +
           f" (step {worst[0]}, {worst[1]}; {p.inputs.dtype.name})")


# ---------------------------------------------------------------------------------------------
# Heatmaps.

def check_plot_dir(path):
    """Create ``path`` if needed and make sure a file can be written there; ValueError if not."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install matplotlib (the 'plots' extra)") from None
    import tempfile

    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        raise ValueError(f"cannot write plots to {path!r}: {err.strerror or err}") from None


def write_heatmaps(heatmaps, labels, path, precision=2):
    """One PNG per heatmap (matplotlib's Agg canvas, no display needed); returns the file paths."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    T = len(labels)
    size = 2.4 + 0.35 * T
    written = []
    for stem, title, w in heatmaps:
        fig = Figure(figsize=(size + 1.0, size), dpi=80, layout="constrained")
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        image = ax.imshow(w, cmap="viridis", vmin=0.0, vmax=max(float(w.max()), 1e-6))
        fig.colorbar(image, ax=ax, label="attention weight")
        ax.set_xticks(range(T), labels, rotation=45, ha="right")
        ax.set_yticks(range(T), labels)
        ax.set_xlabel("key")
        ax.set_ylabel("query")
        ax.set_title(title, fontsize=9)
        if T <= 12:
            for i in range(T):
                for j in range(T):
                    ax.text(j, i, f"{w[i, j]:.{precision}f}", ha="center", va="center", fontsize=7,
                            color="black" if w[i, j] > 0.6 * w.max() else "white")
        file = os.path.join(path, f"{stem}.png")
        try:
            fig.savefig(file)
        except OSError as err:
            raise ValueError(f"cannot write {file!r}: {err.strerror or err}") from None
        written.append(file)
    return written


# ---------------------------------------------------------------------------------------------

def run(args, out=None, color=False):
    """The command: prepare, run both sides, print, plot. Returns the exit status."""
    out = sys.stdout if out is None else out
    if args.plot is not None:
        check_plot_dir(args.plot)
    inputs = prepare(args)
    sides = [_NumpySide()]
    torch_missing = False
    if not args.no_torch:
        try:
            sides.append(_TorchSide())
        except ImportError:
            torch_missing = True
    results = {side.name: _pipeline(side, inputs) for side in sides}
    width = shutil.get_terminal_size((10**4, 24)).columns if out.isatty() else 10**4
    precision = 4 if args.precision is None else args.precision
    p = Printer(inputs, results, out, _Style(color), precision, width)
    p.line(p.style("title", f"numpy-attn walkthrough of {inputs.text!r}") +
           (" (--example source: the source's worked example)" if inputs.source else ""))
    p.line(f"  {len(inputs.ids)} GPT-2 tokens, C = {inputs.C} (--dim), d = {inputs.d_out} (--d-out), "
           f"{inputs.num_heads} heads (--heads), {inputs.dtype.name}, seed {inputs.seed}")
    p.line(f"  positions {'added' if inputs.positional else 'left out'} (--positional), "
           f"focus {inputs.labels[inputs.focus]!r} (--focus)")
    if len(sides) == 2:
        p.line("  Every step runs twice: numpy_attn (backward by hand) on the left,")
        p.line("  torch_attn (autograd) on the right, and the largest difference below.")
    elif torch_missing:
        p.line("  " + p.style("bad", "PyTorch is not installed, so only the NumPy side runs: "
                                     "pip install -c constraints.txt -e '.[torch]' to see both."))
    else:
        p.line("  The NumPy side alone (--no-torch): torch is not imported.")
    _print_steps(p, inputs)
    _summary(p)
    if args.plot is not None:
        files = write_heatmaps(p.heatmaps, inputs.labels, args.plot)
        p.line(f"  {len(files)} heatmaps written to {args.plot}: " + ", ".join(os.path.basename(f) for f in files))
    return 0
