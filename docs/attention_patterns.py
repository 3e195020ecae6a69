"""The picture and the table of docs/attention_patterns.md: one head's attention weights four ways.

Regenerates docs/images/attention_patterns.png (or the PNG named by --out) and prints the page's
table. Run from the repository root with matplotlib installed ('.[tests]' has it) and GPT-2's
vocabulary (offline: TIKTOKEN_CACHE_DIR, see the README's "The tokenizer offline"):

    python docs/attention_patterns.py [--out PATH]

The head is head 0 of the first layer of a one-layer Qwen3 (numpy_attn/qwen3.py) with random
weights: init_llama_params' draws (seed 0), the q and k projections then multiplied by GROWTH so
that the scores reach about 20, the size at which training without QK-norm or a cap has been seen
to make the softmax one-hot. Its q, k and v for the sentence's GPT-2 tokens go through the same
rotation (numpy_attn/rope.py) and attention (numpy_attn/attention.py) four times:

1. plain: causal softmax of q k^T / sqrt(hs);
2. softcap: the scores capped at SOFTCAP * tanh(scores / SOFTCAP) first (flex attention's ``soft_cap``);
3. window: each query sees its last WINDOW keys only (masks.sliding_window_mask as attn_mask);
4. QK-norm: q and k RMS-normed per head before the rotation (numpy_attn/llama.py's
   qk_norm_forward, with the norms' initial weights of 1), as Qwen3 and Gemma 3 do.

Everything is NumPy: numpy_attn's operations, no torch.
"""

import argparse
import os
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np

from attn_cli import tokenizer
from numpy_attn.attention import scaled_dot_product_attention_forward
from numpy_attn.embedding import embedding_forward
from numpy_attn.flex_attention import create_block_mask, flex_attention_forward, soft_cap
from numpy_attn.linear import linear_forward
from numpy_attn.masks import causal_mask, sliding_window_mask
from numpy_attn.qk_norm import qk_norm_forward
from numpy_attn.qwen3 import Qwen3Config, init_qwen3_params
from numpy_attn.rms_norm import rms_norm_forward
from numpy_attn.rope import rope_forward

IMAGE = Path(__file__).parent / "images" / "attention_patterns.png"
SENTENCE = "The cat sat on the mat because it was tired, so the cat slept on the mat."
# GPT-2's vocabulary; 4 query heads sharing 2 key/value heads of size hs = 16; tied head.
CONFIG = Qwen3Config(vocab_size=50257, n_layer=1, n_head=4, n_kv_head=2, n_embd=64, head_dim=16, hidden=128,
                     tie_weights=True)
SEED = 0
# With init_qwen3_params' std of 0.02 the scores stay below 0.1 and every row is near uniform:
# neither a cap nor QK-norm would have anything to bound. 16 x 0.02 = 0.32 makes them reach ~20.
GROWTH = 16.0
# Gemma 2's c = 50 would leave scores of at most ~20 as they are; c = 5, below their standard
# deviation here (6.8), squashes the largest together (tanh(x / c) ~ 1 for x >> c) and passes the
# small ones (tanh(x / c) ~ x / c for |x| << c).
SOFTCAP = 5.0
WINDOW = 4
TITLES = {"plain": "plain causal", "softcap": f"softcap c = {SOFTCAP:g}", "window": f"window w = {WINDOW}",
          "qk_norm": "QK-norm (weights 1)"}


class Panel(NamedTuple):
    """One way of attending: the scores softmax saw (after any cap, before the mask), its weights
    and the keys each query may see."""

    scores: np.ndarray      # (T, S) with S = T
    weights: np.ndarray     # (T, S), rows summing to 1, 0 where the mask hides the key
    visible: np.ndarray     # (T, S) bool: the causal mask, or the sliding window's


def head_inputs(ids, growth=GROWTH):
    """q, k, v (T, hs) of head 0 of the first layer for token ids (T,), before the rotation, and
    that layer's attention parameters."""
    params = init_qwen3_params(CONFIG, np.random.default_rng(SEED), dtype=np.float64)
    block = params["blocks"]["0"]
    attn = block["attn"]
    hs = CONFIG.hs
    x, _ = embedding_forward(ids, params["wte"])                              # (T,) -> (T, C)
    h, _ = rms_norm_forward(x, block["attn_norm"]["w"], CONFIG.rms_eps)        # (T, C)
    q, _ = linear_forward(h, attn["q"]["w"] * growth)                          # (T, C) -> (T, nh*hs)
    k, _ = linear_forward(h, attn["k"]["w"] * growth)                          # (T, C) -> (T, nkv*hs)
    v, _ = linear_forward(h, attn["v"]["w"])                                   # (T, C) -> (T, nkv*hs)
    # Query head 0 reads key/value head 0 (the first of its group of nh / nkv = 2).
    return q[:, :hs], k[:, :hs], v[:, :hs], attn                               # (T, hs) each


def attend(q, k, v, softcap=None, window=None):
    """Rotate q and k (T, hs) by their positions and attend causally, capped or windowed -> Panel."""
    T = q.shape[0]
    positions = np.arange(T)
    q, _ = rope_forward(q, positions, CONFIG.rope_theta)                        # (T, hs)
    k, _ = rope_forward(k, positions, CONFIG.rope_theta)                        # (T, hs)
    visible = causal_mask(T, T) if window is None else sliding_window_mask(T, T, window)   # (T, S)
    scores = (q * q.dtype.type(1 / np.sqrt(q.shape[-1]))) @ k.T                 # (T, hs) @ (hs, S) -> (T, S)
    if softcap is None:
        _, cache = scaled_dot_product_attention_forward(q, k, v, attn_mask=visible)
        return Panel(scores, cache.weights, visible)
    # The cap is a score modifier: flex attention with soft_cap, the mask its block mask; the
    # weights are exp(capped score - lse) where a query may attend.
    block_mask = create_block_mask(lambda b, h, q_idx, kv_idx: visible[q_idx, kv_idx], None, None, T, T)
    (_, lse), _ = flex_attention_forward(q[None, None], k[None, None], v[None, None], score_mod=soft_cap(softcap),
                                         block_mask=block_mask, return_lse=True)   # lse (1, 1, T)
    scores = softcap * np.tanh(scores / softcap)                                # (T, S) the capped scores
    weights = np.where(visible, np.exp(scores - lse[0, 0, :, None]), 0)         # (T, S)
    return Panel(scores, weights, visible)


def panels(ids, growth=GROWTH):
    """The four panels for token ids (T,): {"plain", "softcap", "window", "qk_norm"} -> Panel."""
    q, k, v, attn = head_inputs(ids, growth)
    q_normed, k_normed, _ = qk_norm_forward(q, k, attn, CONFIG.rms_eps)   # (T, hs) each, width hs
    return {"plain": attend(q, k, v),
            "softcap": attend(q, k, v, softcap=SOFTCAP),
            "window": attend(q, k, v, window=WINDOW),
            "qk_norm": attend(q_normed, k_normed, v)}


def qk_norm_bound(ids):
    """The largest |score| QK-norm allows: |q.k| / sqrt(hs) <= (sqrt(hs) max|w_q|) (sqrt(hs) max|w_k|) / sqrt(hs),
    since an RMS-normed row has length at most sqrt(hs) before its weights (and the rotation keeps lengths)."""
    attn = head_inputs(ids)[3]
    return np.sqrt(CONFIG.hs) * np.abs(attn["q_norm"]["w"]).max() * np.abs(attn["k_norm"]["w"]).max()


def tokens(ids):
    """Each id's text, its spaces stripped (a label)."""
    return [tokenizer.decode([i]).strip() for i in ids]


def table(words, result):
    """The page's Markdown table: each query's largest weight per panel, then the largest |score|."""
    head = "| query | " + " | ".join(TITLES[name] for name in result) + " |"
    lines = [head, "|---|" + "---:|" * len(result)]
    for i, word in enumerate(words):
        row = " | ".join(f"{panel.weights[i].max():.2f}" for panel in result.values())
        lines.append(f"| {i} `{word}` | {row} |")
    means = " | ".join(f"{panel.weights.max(axis=-1).mean():.2f}" for panel in result.values())
    lines.append(f"| mean of the rows | {means} |")
    largest = " | ".join(f"{np.abs(panel.scores[panel.visible]).max():.3f}" for panel in result.values())
    lines.append(f"| largest \\|score\\| | {largest} |")
    return "\n".join(lines)


def draw(words, result, path):
    """One PNG at ``path``: the four weight matrices side by side on one colour scale, 0 to 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    T = len(words)
    cmap = plt.get_cmap("viridis").with_extremes(bad="white")   # masked keys: white
    fig, axes = plt.subplots(1, len(result), figsize=(17, 5.2), layout="constrained")
    for ax, (name, panel) in zip(axes, result.items(), strict=True):
        image = ax.imshow(np.ma.masked_where(~panel.visible, panel.weights), cmap=cmap, vmin=0, vmax=1,
                          interpolation="nearest")
        ax.set_title(f"{TITLES[name]}\nmean largest weight per row {panel.weights.max(axis=-1).mean():.2f}",
                     fontsize=10)
        ax.set_xticks(range(T), words, rotation=90, fontsize=7)
        ax.set_yticks(range(T), words if ax is axes[0] else [], fontsize=7)
        ax.set_xlabel("key")
    axes[0].set_ylabel("query")
    fig.colorbar(image, ax=axes, shrink=0.8, label="attention weight (one scale; white: masked)")
    save_png(fig, path)
    plt.close(fig)


def save_png(fig, path):
    """Write the figure to ``path`` through a temporary file beside it, renamed over it at the end:
    an interruption leaves the old file whole and no temporary behind."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        fig.savefig(partial, format="png", dpi=90)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Draw docs/images/attention_patterns.png and print the table.")
    parser.add_argument("--out", type=Path, default=IMAGE, help=f"the PNG to write (default {IMAGE})")
    args = parser.parse_args(argv)
    if not args.out.parent.is_dir():
        parser.error(f"--out {str(args.out)!r}: no folder {str(args.out.parent)!r}")
    try:
        ids = np.array(tokenizer.encode(SENTENCE))
        words = tokens(ids)
    except tokenizer.TokenizerUnavailable as err:
        sys.exit(str(err))
    result = panels(ids)
    draw(words, result, args.out)
    print(f"wrote {args.out}\n")
    print(table(words, result))


if __name__ == "__main__":
    main()
