"""Every figure the commands draw: the walkthrough's attention heatmaps and train's loss curve.

matplotlib is imported inside each function (it is an optional dependency) and drawn on its Agg
canvas, so no display is needed. Text that comes from the user (token labels) is drawn as plain
text: a "$" in a token is a dollar sign, not the start of a formula.

``heatmap_svg`` draws a heatmap as inline SVG text instead, with NumPy and the standard library
alone: each cell carries its value as a tooltip, for the site and for notebooks, with nothing to
fetch and no script.
"""

import html
import math
import os
import textwrap

import numpy as np

from attn_cli.term import fmt


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


# ---------------------------------------------------------------------------------------------
# Heatmaps as inline SVG: no matplotlib, no script, nothing fetched.

# Colour scales as a few stops, interpolated in RGB: viridis (weights, 0 to 1), as the PNGs draw
# them, and a red-blue scale through white (gradients, symmetric about 0), as RdBu_r.
SEQUENTIAL = ((0x44, 0x01, 0x54), (0x3b, 0x52, 0x8b), (0x21, 0x91, 0x8c), (0x5e, 0xc9, 0x62), (0xfd, 0xe7, 0x25))
DIVERGING = ((0x21, 0x66, 0xac), (0x92, 0xc5, 0xde), (0xf7, 0xf7, 0xf7), (0xf4, 0xa5, 0x82), (0xb2, 0x18, 0x2b))
MASKED_FILL = "#d9d9d9"
_CELL, _FONT, _CHAR = 48, 13, 7.5      # cell side, label font size, a label character's width (SVG units)


def heatmap_svg(values, row_labels, col_labels, *, title, signed=False, masked=None, precision=4):
    """A heatmap of ``values`` (R, S) as an SVG document (a str), to inline in a page or to show in
    a notebook (``IPython.display.SVG(heatmap_svg(...))``; where a notebook shows SVG as an image,
    without tooltips, ``IPython.display.HTML`` keeps them).

    One ``<rect>`` per cell, each with a ``<title>`` the browser shows on hover, such as
    ``query 'cat' -> key 'The': 0.4123``: row i is the query ``row_labels[i]``, column j the key
    ``col_labels[j]``, and the value is written with ``precision`` decimals as the walkthrough
    prints its tables (4 by default, as for float32). Weights (``signed`` False) are coloured on
    viridis from 0 to 1 (widened to the values' range if they leave it), so that heads compare;
    gradients (``signed`` True) red for positive and blue for negative, on a scale symmetric about
    0 up to their largest magnitude. ``masked`` (R, S) booleans, True where a query may not
    attend: those cells are grey, their titles say "(masked)", and only they may hold -inf.
    The numbers are also written in the cells up to 12 x 12. The figure scales to its container's
    width (a viewBox, width 100%), up to its natural size.
    """
    values, masked, precision = _check_heatmap(values, row_labels, col_labels, title, masked, precision)
    R, S = values.shape
    w = values.astype(np.float64)                               # colours only; the text formats ``values``
    shown = w[~masked]
    if signed:
        top = float(np.abs(shown).max(initial=0.0)) or 1.0      # all zero: any scale will do
        lo, hi, stops = -top, top, DIVERGING
    else:
        lo, hi, stops = min(0.0, float(shown.min(initial=0.0))), max(1.0, float(shown.max(initial=1.0))), SEQUENTIAL
    rows = [str(x) for x in row_labels]
    cols = [str(x) for x in col_labels]
    left = 28 + _CHAR * max(map(len, rows)) + 8                 # the axis name, then the row labels
    scale = f"{fmt(lo, precision)} to {fmt(hi, precision)}"
    legend = [f"gradient: {scale}, blue to red" if signed else f"weight: {scale}"]
    legend += ["masked: not attended"] if masked.any() else []
    width = left + max(S * _CELL, 18 + 6.2 * max(map(len, legend))) + 16
    # The title in lines as wide as the figure (a bold character about 8 units), the figure
    # widened to the longest word: figures of one size stay one size.
    lines = [part for line in title.splitlines() or [""]
             for part in textwrap.wrap(line, max(24, int((width - 16) / 8)), break_long_words=False) or [""]]
    width = max(width, 8 * max(map(len, lines)) + 16)
    top_edge = 10 + 20 * len(lines)
    under = 8 + 0.71 * _CHAR * max(map(len, cols)) + 14         # column labels at 45 degrees
    height = top_edge + R * _CELL + under + 26 + 18 * (len(legend) + 1) + 8    # the axis name, the legend
    numbers = R <= 12 and S <= 12

    def e(text):                                                # text between tags: &, < and > escaped
        return html.escape(text, quote=False)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:g} {height:g}" width="100%" '
           f'style="max-width: {width:g}px; height: auto" role="img" '
           f'aria-label="{html.escape(_heatmap_summary(lines, w, masked))}" '
           f'font-family="system-ui, sans-serif" font-size="{_FONT}">',
           f"<title>{e(' '.join(lines))}</title>"]
    out += [f'<text x="{width / 2:g}" y="{18 + 20 * k}" text-anchor="middle" font-weight="600">{e(line)}</text>'
            for k, line in enumerate(lines)]
    for i in range(R):
        y = top_edge + i * _CELL
        out.append(f'<text x="{left - 6:g}" y="{y + _CELL / 2 + 4:g}" text-anchor="end">{e(rows[i])}</text>')
        for j in range(S):
            x = left + j * _CELL
            number = fmt(values[i, j], precision)               # as the walkthrough's tables print it
            if masked[i, j]:
                fill, cls, text = MASKED_FILL, ' class="masked"', f"{number} (masked)"
            else:
                fill, cls, text = _colour(stops, (w[i, j] - lo) / (hi - lo)), "", number
            out.append(f'<rect x="{x:g}" y="{y:g}" width="{_CELL}" height="{_CELL}" fill="{fill}"{cls}>'
                       f"<title>query {e(repr(rows[i]))} -&gt; key {e(repr(cols[j]))}: {e(text)}</title></rect>")
            if numbers and not masked[i, j]:
                ink = "#ffffff" if _dark(fill) else "#000000"
                out.append(f'<text x="{x + _CELL / 2:g}" y="{y + _CELL / 2 + 4:g}" text-anchor="middle" '
                           f'font-size="11" fill="{ink}" pointer-events="none">{e(number)}</text>')
    bottom = top_edge + R * _CELL
    for j in range(S):
        x = left + j * _CELL + _CELL / 2
        out.append(f'<text x="{x:g}" y="{bottom + 14:g}" text-anchor="end" '
                   f'transform="rotate(-45 {x:g} {bottom + 14:g})">{e(cols[j])}</text>')
    middle = top_edge + R * _CELL / 2
    out.append(f'<text x="{left + S * _CELL / 2:g}" y="{bottom + under + 6:g}" text-anchor="middle" '
               f'fill="#57606a">key (attended to)</text>')
    out.append(f'<text x="16" y="{middle:g}" text-anchor="middle" fill="#57606a" '
               f'transform="rotate(-90 16 {middle:g})">query (attending)</text>')
    out += _legend(stops, legend, left, bottom + under + 22)
    out.append("</svg>")
    return "\n".join(out)


def _legend(stops, texts, x, y):
    """The colour scale as ten swatches, ``texts[0]`` (its two ends) under them; under it, if
    there is a ``texts[1]``, the masked cells' grey and what it means."""
    out = []
    for k in range(10):
        fill = _colour(stops, (k + 0.5) / 10)
        out.append(f'<rect x="{x + 12 * k:g}" y="{y:g}" width="12" height="12" fill="{fill}"/>')
    out.append(f'<text x="{x:g}" y="{y + 28:g}" font-size="11" fill="#57606a">{texts[0]}</text>')
    if len(texts) > 1:
        out.append(f'<rect x="{x:g}" y="{y + 36:g}" width="12" height="12" fill="{MASKED_FILL}"/>')
        out.append(f'<text x="{x + 18:g}" y="{y + 46:g}" font-size="11" fill="#57606a">{texts[1]}</text>')
    return out


def _heatmap_summary(lines, w, masked):
    """The figure in words, for a screen reader: what, how big, the range of its values."""
    R, S = w.shape
    shown = w[~masked]
    text = f"{' '.join(lines)}: heatmap of {R} queries by {S} keys"
    if shown.size:
        text += f", values {shown.min():.3g} to {shown.max():.3g}"
    return text + (f", {int(masked.sum())} cells masked" if masked.any() else "")


def _colour(stops, t):
    """The colour at ``t`` in 0..1 on the scale ``stops``, as #rrggbb."""
    t = min(max(float(t), 0.0), 1.0) * (len(stops) - 1)
    k = min(int(t), len(stops) - 2)
    a, b = stops[k], stops[k + 1]
    return "#" + "".join(f"{round(p + (q - p) * (t - k)):02x}" for p, q in zip(a, b, strict=True))


def _dark(colour):
    """Whether white text reads better than black on ``colour`` (#rrggbb): its relative luminance."""
    r, g, b = (int(colour[k:k + 2], 16) / 255 for k in (1, 3, 5))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.45


def _check_heatmap(values, row_labels, col_labels, title, masked, precision):
    """heatmap_svg's arguments checked: (values, masked (R, S) booleans, precision)."""
    values = np.asarray(values)
    if values.dtype.kind not in "biuf" and values.dtype.name != "bfloat16":
        raise TypeError(f"values must be an array of numbers, got dtype {values.dtype}")
    if values.ndim != 2 or 0 in values.shape:
        raise ValueError(f"values must be a non-empty (R, S) matrix, got shape {values.shape}")
    R, S = values.shape
    for name, labels, n in (("row_labels", row_labels, R), ("col_labels", col_labels, S)):
        if isinstance(labels, str) or len(labels) != n:
            raise ValueError(f"{name} must give one label per {'row' if n == R else 'column'} ({n}), got "
                             f"{labels!r}")
    if not isinstance(title, str):
        raise TypeError(f"title must be a str, got {type(title).__name__}")
    if masked is None:
        masked = np.zeros((R, S), dtype=bool)
    else:
        masked = np.asarray(masked)
        if masked.dtype != bool:
            raise TypeError(f"masked must be booleans (True where a query may not attend), got dtype {masked.dtype}")
        if masked.shape != (R, S):
            raise ValueError(f"masked must have the shape of values {(R, S)}, got {masked.shape}")
    bad = ~np.isfinite(values.astype(np.float64)) & ~masked
    if bad.any():
        i, j = map(int, np.argwhere(bad)[0])
        raise ValueError(f"values[{i}, {j}] is {values[i, j]}: only a masked cell may hold a value that is "
                         "not finite (pass masked=)")
    if isinstance(precision, bool) or not isinstance(precision, int | np.integer) or not 0 <= precision <= 12:
        raise ValueError(f"precision must be an integer in 0..12, got {precision!r}")
    return values, masked, int(precision)


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
