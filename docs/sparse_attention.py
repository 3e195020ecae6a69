"""The grids and numbers of docs/sparse_attention.md: which keys each query of one sentence sees.

Prints the page's blocks (each mask as a grid of 0/1, the indexer's scores, the cache bytes per
token) with NumPy alone; run from the repository root:

    python docs/sparse_attention.py

Every mask comes from the function the models call: masks.causal_mask, masks.sliding_window_mask,
llama4.chunked_causal_mask, and lightning_indexer_forward's ``selected`` for a small indexer drawn
with a fixed seed; the bytes from mla_cache_bytes_per_token and deepseek_v32_kv_cache at
DeepSeek-V3.2's released sizes.
"""

import numpy as np
from ml_dtypes import bfloat16

from numpy_attn.deepseek_v32 import DeepseekV32Config, deepseek_v32_kv_cache
from numpy_attn.lightning_indexer import lightning_indexer_forward
from numpy_attn.llama4 import chunked_causal_mask
from numpy_attn.masks import causal_mask, sliding_window_mask
from numpy_attn.mla import mla_cache_bytes_per_token

WORDS = ("The", "cat", "sat", "on", "the", "mat")
WINDOW = 3            # the sliding window (Gemma 3: 1024, gpt-oss: 128)
CHUNK = 3             # Llama 4's chunk (8192 in the released models)
# The drawn indexer: nh heads of width D, the first ROPE_DIM channels rotated, a query latent of
# width RQ, a model width C; TOP_K keys kept per query. Its weights are N(0, 1), not the 0.02 of
# init_deepseek_v32_params, so that the scores of six tokens spread enough to read.
SEED, C, RQ, NH, D, ROPE_DIM, TOP_K = 0, 8, 4, 2, 4, 2, 2
# DeepSeek-V3.2's released attention sizes (its config.json), one layer, stored in bfloat16.
RELEASED = DeepseekV32Config(n_layer=1, n_embd=7168, n_head=128, q_lora_rank=1536, kv_lora_rank=512,
                             qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, index_n_heads=64,
                             index_head_dim=128, index_topk=2048)
RELEASED_LAYERS = 61


def drawn_indexer():
    """x (1, T, C), the query latent (1, T, RQ) and the indexer's parameters, drawn with SEED."""
    rng = np.random.default_rng(SEED)
    T = len(WORDS)
    x = rng.normal(size=(1, T, C))
    q_latent = rng.normal(size=(1, T, RQ))
    params = {"wq_b": {"w": rng.normal(size=(RQ, NH * D))}, "wk": {"w": rng.normal(size=(C, D))},
              "k_norm": {"w": np.ones(D), "b": np.zeros(D)}, "weights_proj": {"w": rng.normal(size=(C, NH))}}
    return x, q_latent, params


def indexer_selection():
    """The drawn indexer's scores (T, T) (-inf where hidden) and its top-TOP_K selection (T, T) bool."""
    x, q_latent, params = drawn_indexer()
    scores, selected, _ = lightning_indexer_forward(x, q_latent, params, TOP_K, ROPE_DIM)
    return scores[0], selected[0]


def masks():
    """{title: (T, T) bool} of every pattern the page draws, in its order."""
    T = len(WORDS)
    return {"dense causal": causal_mask(T, T),
            f"sliding window w = {WINDOW}": sliding_window_mask(T, T, WINDOW),
            f"chunked, chunk = {CHUNK}": chunked_causal_mask(T, T, CHUNK),
            f"lightning indexer top-{TOP_K}": indexer_selection()[1]}


def grid(mask):
    """A mask as text: a header of keys, then one row per query of 1 (seen) and 0 (hidden)."""
    width = max(len(w) for w in WORDS)
    lines = [" " * width + " " + " ".join(f"{w:>3}" for w in WORDS)]
    for word, row in zip(WORDS, mask, strict=True):
        lines.append(f"{word:<{width}} " + " ".join(f"{int(v):>3}" for v in row))
    return "\n".join(lines)


def score_grid(scores):
    """The indexer's scores as text, two decimals, '-' where the key is hidden."""
    width = max(len(w) for w in WORDS)
    lines = [" " * width + " " + " ".join(f"{w:>6}" for w in WORDS)]
    for word, row in zip(WORDS, scores, strict=True):
        cells = ("-" if np.isneginf(v) else f"{v:.2f}" for v in row)
        lines.append(f"{word:<{width}} " + " ".join(f"{c:>6}" for c in cells))
    return "\n".join(lines)


def cache_bytes():
    """Bytes one token adds to one layer's cache at the released sizes in bfloat16:
    {"full k and v", "mla latent", "mla latent + indexer key"}."""
    per = mla_cache_bytes_per_token(RELEASED.mla, bfloat16)
    cache = deepseek_v32_kv_cache(RELEASED, 1, bfloat16, max_len=1)
    return {"full k and v": per["mla_naive"], "mla latent": per["mla_absorbed"],
            "mla latent + indexer key": cache.bytes_per_token}


def cache_table(sizes):
    """The page's Markdown table of cache_bytes(): bytes per token and layer, for all layers, and the ratio."""
    full = sizes["full k and v"]
    lines = ["| what one token stores | bytes per layer | bytes, all 61 layers | share of the full cache |",
             "|---|---:|---:|---:|"]
    for name, n in sizes.items():
        lines.append(f"| {name} | {n} | {n * RELEASED_LAYERS} | {n / full:.4f} |")
    return "\n".join(lines)


def blocks():
    """Every block the page shows, {name: text}."""
    scores, _ = indexer_selection()
    out = {title: grid(mask) for title, mask in masks().items()}
    out["indexer scores"] = score_grid(scores)
    out["cache bytes"] = cache_table(cache_bytes())
    return out


def main():
    for name, text in blocks().items():
        print(f"{name}:\n{text}\n")


if __name__ == "__main__":
    main()
