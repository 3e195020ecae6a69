"""Every figure the commands draw: the walkthrough's attention heatmaps and train's loss curve.

matplotlib is imported inside each function (it is an optional dependency) and drawn on its Agg
canvas, so no display is needed. Text that comes from the user (token labels) is drawn as plain
text: a "$" in a token is a dollar sign, not the start of a formula.
"""

import math
import os

import numpy as np


def check_plot_dir(path, option="--plot"):
    """Create ``path`` if needed and make sure a file can be written there; ValueError if not."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError(f"{option} needs matplotlib: pip install matplotlib (the 'plots' extra)") from None
    import tempfile

    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        raise ValueError(f"cannot write plots to {path!r}: {err.strerror or err}") from None


def _figure(figsize):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig, file):
    try:
        fig.savefig(file)
    except OSError as err:
        raise ValueError(f"cannot write {file!r}: {err.strerror or err}") from None
    return file


def _plain(texts):
    """Turn off mathtext on matplotlib Text objects (tick labels made from tokens)."""
    for text in texts:
        text.set_parse_math(False)


def write_heatmaps(heatmaps, labels, path, precision=2):
    """One PNG per figure of ``heatmaps``, [(file stem, title, [(panel title, values (T, T))],
    signed)], each drawn by ``heatmap_figure``. Returns the file paths."""
    return [_save(heatmap_figure(title, panels, labels, signed, precision), os.path.join(path, f"{stem}.png"))
            for stem, title, panels, signed in heatmaps]


def heatmap_figure(title, panels, labels, signed=False, precision=2):
    """A figure holding one heatmap per panel (e.g. every head of a step), panels [(panel title,
    values (T, T))], rows and columns labelled by the tokens ``labels``.

    Weights (``signed`` False) are drawn on a scale fixed to 0..1 in every panel, so that colours
    compare across steps and heads; a weight that is exactly zero above the diagonal of a causal
    step is masked, drawn hatched grey with no number. Gradients (``signed`` True) are drawn red for
    positive and blue for negative on a scale symmetric about 0, up to their largest magnitude,
    with one more decimal.
    """
    from matplotlib.colors import Normalize

    T = len(labels)
    cell = 0.42 if T <= 12 else 0.25
    side = 1.6 + cell * T                      # inches per panel
    n = len(panels)
    ncols = min(n, 4)
    nrows = math.ceil(n / ncols)
    fig = _figure((side * ncols + 1.2, side * nrows + 0.6))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    if signed:
        top = max(float(np.abs(w).max()) for _, w in panels) or 1.0    # all zero: any scale will do
        norm, cmap, digits, label = Normalize(-top, top), "RdBu_r", precision + 1, "gradient (red +, blue -)"
    else:
        norm, cmap, digits, label = Normalize(0.0, 1.0), "viridis", precision, "attention weight (0 to 1)"
    image = None
    for ax, (name, w) in zip(axes.flat, panels, strict=False):
        w = np.asarray(w, dtype=np.float64)
        masked = np.triu(np.ones_like(w, dtype=bool), 1) & (w == 0) & _is_causal(w) & (not signed)
        ax.set_facecolor("#d9d9d9")
        ax.add_patch(_hatch(ax, T))
        image = ax.imshow(np.ma.masked_array(w, masked), cmap=cmap, norm=norm)
        ax.set_xticks(range(T), labels, rotation=45, ha="right", fontsize=10)
        ax.set_yticks(range(T), labels, fontsize=10)
        _plain(ax.get_xticklabels() + ax.get_yticklabels())
        ax.set_xlabel("key (attended to)", fontsize=10)
        ax.set_ylabel("query (attending)", fontsize=10)
        if name:
            ax.set_title(name, fontsize=11)
        if T <= 12:
            # White text on dark cells: the low end of viridis, both ends of RdBu.
            white = np.abs(norm(w) - 0.5) > 0.3 if signed else w <= 0.6
            for i in range(T):
                for j in range(T):
                    if not masked[i, j]:
                        ax.text(j, i, f"{w[i, j]:.{digits}f}", ha="center", va="center", fontsize=8,
                                color="white" if white[i, j] else "black")
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    fig.colorbar(image, ax=axes, label=label, shrink=0.9)
    fig.suptitle(title, fontsize=12)
    return fig


def _is_causal(w):
    """Whether ``w`` looks causally masked: every weight above the diagonal is exactly zero."""
    return bool(np.all(np.triu(w, 1) == 0)) and w.shape[0] > 1


def _hatch(ax, T):
    """A hatched grey square behind the image: it shows through the masked cells."""
    from matplotlib.patches import Rectangle

    return Rectangle((-0.5, -0.5), T, T, facecolor="#d9d9d9", edgecolor="#9a9a9a", hatch="//",
                     linewidth=0, zorder=0)


def smooth(values, window):
    """Trailing mean of ``values`` over up to ``window`` points (the first points average fewer)."""
    values = np.asarray(values, dtype=np.float64)
    sums = np.cumsum(np.concatenate([[0.0], values]))
    idx = np.arange(1, len(values) + 1)
    lo = np.maximum(idx - window, 0)
    return (sums[idx] - sums[lo]) / (idx - lo)


def write_loss_plot(losses, held_out, path, twin_losses=(), title="training the mini GPT"):
    """Loss against step: each training batch faint, their trailing mean, the held-out points.

    ``held_out`` is [(step, loss)]. Returns ``path``.
    """
    steps = np.arange(1, len(losses) + 1)
    window = max(1, len(losses) // 20)
    fig = _figure((7, 4.2))
    ax = fig.add_subplot()
    ax.plot(steps, losses, color="tab:blue", alpha=0.25, linewidth=0.8, label="training batch")
    ax.plot(steps, smooth(losses, window), color="tab:blue", linewidth=2,
            label=f"training batch, mean of the last {window} steps")
    if len(twin_losses):
        ax.plot(steps, smooth(twin_losses, window), "--", color="tab:orange", linewidth=1.5,
                label="torch twin, same mean")
    if held_out:
        at, val = zip(*held_out, strict=True)
        ax.plot(at, val, "o-", color="tab:red", markersize=5, label="held-out text (no dropout)")
    ax.set_xlabel("step", fontsize=10)
    ax.set_ylabel("cross-entropy loss (nats per token)", fontsize=10)
    ax.set_title(title, fontsize=12)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    return _save(fig, path)
