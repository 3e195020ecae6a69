"""Pictures of the named masks of numpy_attn/flex_attention.py and of their block masks.

Regenerates docs/images/flex_mask_<name>.png, one per mask. Run from the repository root with
matplotlib installed ('.[tests]' has it):

    python docs/flex_attention_masks.py

Each picture is a 32 x 32 mask (queries down, keys across) in tiles of 8 x 8, as
create_block_mask sees it: a dark cell is a kept (query, key) pair; a tile is shaded green when
it is full (mask_mod is never called there), amber when it is partial (mask_mod decides each
cell) and left white when it is skipped (never computed). The title gives the share skipped.
"""

from pathlib import Path

import numpy as np

from numpy_attn import flex_attention as nf

N, BLOCK = 32, 8
IMAGES = Path(__file__).parent / "images"
MASKS = {
    "causal": nf.causal,
    "causal_bottom_right": nf.causal_bottom_right(24, N),
    "sliding_window": nf.sliding_window(10),
    "prefix_lm": nf.prefix_lm(12),
    "document": nf.document([7, 13, 12]),
    "document_causal": nf.and_masks(nf.document([7, 13, 12]), nf.causal),
}
TITLES = {
    "causal": "causal (top-left)",
    "causal_bottom_right": "causal, bottom-right (24 queries, 32 keys)",
    "sliding_window": "sliding_window(10)",
    "prefix_lm": "prefix_lm(12)",
    "document": "document([7, 13, 12])",
    "document_causal": "and_masks(document, causal)",
}


def draw(name, mask_mod):
    """One PNG: the element mask over the tile classification of its BlockMask."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    L = 24 if name == "causal_bottom_right" else N
    keep = np.broadcast_to(mask_mod(*nf._index_grids(1, 1, L, N)), (1, 1, L, N))[0, 0]
    block_mask = nf.create_block_mask(mask_mod, None, None, L, N, BLOCK_SIZE=BLOCK)
    tiles = block_mask.blocks()[0, 0]                                   # (nq, nk): 0, 1, 2
    fig, ax = plt.subplots(figsize=(3.6, 3.6 * L / N + 0.4), dpi=90)
    shade = np.kron(tiles, np.ones((BLOCK, BLOCK), dtype=np.int8))[:L, :N]
    ax.imshow(shade, cmap=ListedColormap(["white", "#f5c77e", "#a8d5a2"]), vmin=0, vmax=2,
              interpolation="nearest")
    ax.imshow(np.ma.masked_where(~keep, keep), cmap=ListedColormap(["#22313f"]), alpha=0.85,
              interpolation="nearest")
    for edge in range(0, N + 1, BLOCK):
        ax.axvline(edge - 0.5, color="grey", lw=0.6)
    for edge in range(0, L + 1, BLOCK):
        ax.axhline(edge - 0.5, color="grey", lw=0.6)
    ax.set_title(f"{TITLES[name]}\n{block_mask.fraction_skipped():.0%} of tiles skipped", fontsize=9)
    ax.set_xlabel("kv_idx", fontsize=8)
    ax.set_ylabel("q_idx", fontsize=8)
    ax.tick_params(labelsize=7)
    fig.tight_layout()
    path = IMAGES / f"flex_mask_{name}.png"
    fig.savefig(path)
    plt.close(fig)
    return path


if __name__ == "__main__":
    for name, mask_mod in MASKS.items():
        print(draw(name, mask_mod))
