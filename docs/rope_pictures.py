"""The two pictures of docs/rope.md, made with numpy_attn.rope itself.

Regenerates docs/images/rope_rotation.png and docs/images/rope_relative_scores.png. Run from the
repository root with matplotlib installed ('.[tests]' has it):

    python docs/rope_pictures.py

1. One channel pair of a query, rotated at positions 0..7 by rope_forward: the point turns by the
   same angle f_j per position (fast for pair 0, slower for later pairs) and keeps its length.
2. The score q_i . k_j of one rotated query and one rotated key at every pair of positions (i, j):
   constant along every diagonal i - j = const, because the score depends only on i - j.
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from numpy_attn.rope import rope_forward, rope_frequencies  # noqa: E402

IMAGES = Path(__file__).parent / "images"
HS = 8            # head size: four pairs
POSITIONS = 8


def rotation_picture(path):
    x = np.tile(np.array([1.0, 0.8, 0.0, 0.0, 0.3, -0.4, 0.0, 0.0]), (POSITIONS, 1))   # (T, hs)
    out, _ = rope_forward(x, np.arange(POSITIONS), theta=10.0, layout="half")
    inv_freq = rope_frequencies(HS, theta=10.0)
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.4))
    for ax, j in zip(axes, (0, 1), strict=True):
        a, b = out[:, j], out[:, j + HS // 2]            # "half" layout: pair j is channels j, j + hs/2
        ax.add_patch(plt.Circle((0, 0), np.hypot(a[0], b[0]), fill=False, ls=":", color="grey"))
        for p in range(POSITIONS):
            ax.annotate("", xy=(a[p], b[p]), xytext=(0, 0),
                        arrowprops=dict(arrowstyle="->", color=plt.cm.viridis(p / POSITIONS)))
            ax.text(1.12 * a[p], 1.12 * b[p], str(p), ha="center", va="center", fontsize=9)
        r = 1.3 * np.hypot(a[0], b[0])
        ax.set(xlim=(-r, r), ylim=(-r, r), aspect="equal",
               title=f"pair {j}: {inv_freq[j]:.2f} rad per position",
               xlabel=f"channel {j}", ylabel=f"channel {j + HS // 2}")
    fig.suptitle("RoPE turns each channel pair of q (or k) by position x frequency; lengths stay")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def relative_scores_picture(path):
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal(HS), rng.standard_normal(HS)
    positions = np.arange(POSITIONS)
    rq, _ = rope_forward(np.tile(q, (POSITIONS, 1)), positions)   # (T, hs): q placed at every position
    rk, _ = rope_forward(np.tile(k, (POSITIONS, 1)), positions)   # (T, hs): k likewise
    scores = rq @ rk.T                                             # (T, T): query at i, key at j
    fig, ax = plt.subplots(figsize=(5.6, 4.6))
    image = ax.imshow(scores, cmap="coolwarm")
    for i in range(POSITIONS):
        for j in range(POSITIONS):
            ax.text(j, i, f"{scores[i, j]:.1f}", ha="center", va="center", fontsize=7)
    ax.set(xlabel="key position j", ylabel="query position i",
           title="q_i . k_j after RoPE: constant along i - j")
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return scores


if __name__ == "__main__":
    IMAGES.mkdir(exist_ok=True)
    rotation_picture(IMAGES / "rope_rotation.png")
    scores = relative_scores_picture(IMAGES / "rope_relative_scores.png")
    spread = max(np.ptp(np.diagonal(scores, d)) for d in range(-POSITIONS + 1, POSITIONS))
    print("wrote docs/images/rope_rotation.png and docs/images/rope_relative_scores.png; "
          f"largest spread along a diagonal of the scores: {spread:.1e}")
