"""Terminal output shared by every command: the colour decision, styles, widths, wrapped prose,
number tables (side by side when they fit, else one above the other) and a progress bar.

Piped output is laid out for 80 columns, so that ``numpy-attn walkthrough | less`` reads as it
does on a terminal of that width.
"""

import os
import shutil
import sys
import textwrap
import time

import numpy as np

PIPE_WIDTH = 80


def use_color(mode, stream):
    """Colour on ``always``; on ``auto`` only for a terminal and when NO_COLOR is unset or empty."""
    if mode == "always":
        return True
    if mode == "never" or os.environ.get("NO_COLOR"):
        return False
    return stream.isatty()


def add_color_option(parser):
    parser.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                        help="colour: auto (default) uses it on a terminal unless NO_COLOR is set")


def describe(parser, description, examples):
    """A command's description, and its examples kept as written below the options."""
    import argparse

    parser.description = description
    parser.epilog = examples
    parser.formatter_class = argparse.RawDescriptionHelpFormatter


def output(args, out=None, color=None):
    """(stream, colour on?) of a command: stdout unless given, colour by --color unless given."""
    out = sys.stdout if out is None else out
    return out, use_color(args.color, sys.stdout) if color is None else color


def width_of(stream):
    """Columns to lay text out in: the terminal's width, or PIPE_WIDTH when not a terminal."""
    isatty = getattr(stream, "isatty", lambda: False)
    return shutil.get_terminal_size((PIPE_WIDTH, 24)).columns if isatty() else PIPE_WIDTH


def ansi(code, text):
    """``text`` in the ANSI style ``code`` (e.g. "1;36"), reset after it; unchanged without a code
    or a text."""
    return f"\x1b[{code}m{text}\x1b[0m" if code and text else text


class Style:
    """ANSI styles, or nothing when colour is off."""

    CODES = dict(title="1;36", bold="1", dim="2", good="32", bad="1;31", note="33")

    def __init__(self, enabled):
        self.enabled = enabled

    def __call__(self, kind, text):
        return ansi(self.CODES[kind], text) if self.enabled and kind else text


def wrap(text, width, indent="", more=4):
    """``text`` as lines of at most ``width`` columns, each starting with ``indent``; the lines
    after the first are indented ``more`` further. Words longer than a line are split."""
    width = max(width, len(indent) + more + 20)
    return textwrap.wrap(text, width, initial_indent=indent,
                         subsequent_indent=indent + " " * more, break_on_hyphens=False,
                         drop_whitespace=True) or [indent.rstrip()]


def wrap_pieces(pieces, width, indent="", more=4):
    """Like ``wrap``, but lines break only between ``pieces`` (a piece is split only when it is
    longer than a line): a written-out sum breaks between its terms, never inside a number."""
    text = " ".join(piece.replace(" ", "\xa0") for piece in pieces)   # textwrap keeps \xa0 inside a word
    return [line.replace("\xa0", " ") for line in wrap(text, width, indent, more)]


def printable(text):
    """``text`` with control characters (newlines, tabs, escapes) written as escapes."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)


def fmt(value, precision):
    """One table cell: booleans as 0/1, integers as they are, -inf spelled out, no "-0.0000"."""
    if isinstance(value, np.bool_ | bool):
        return "1" if value else "0"
    if isinstance(value, np.integer | int):
        return str(int(value))
    if np.isneginf(value):
        return "-inf"
    text = f"{value:.{precision}f}"
    return text[1:] if text.startswith("-") and not text.strip("-0.") else text


def _table_cells(a, cols, precision, sums):
    """(column labels, rows of cells) of a 2-D array as text; ``sums`` adds a column of row sums."""
    cells = [[fmt(v, precision) for v in row] for row in a]
    cols = list(cols)
    if sums:
        cols.append("sum")
        for cell_row, row in zip(cells, a, strict=True):
            cell_row.append(fmt(row.sum(dtype=np.float64), precision))
    return cols, cells


def _table_text(rows, cols, cells, widths, keep):
    """The lines of a table: the columns ``keep`` only, each right-aligned to its width."""
    lw = max(len(r) for r in rows)
    lines = [" " * lw + "".join(f"  {cols[j]:>{widths[j]}}" for j in keep)]
    for label, cell_row in zip(rows, cells, strict=True):
        lines.append(f"{label:<{lw}}" + "".join(f"  {cell_row[j]:>{widths[j]}}" for j in keep))
    return lines


def _column_widths(cols, *cell_tables):
    return [max([len(c)] + [len(r[j]) for cells in cell_tables for r in cells]) for j, c in enumerate(cols)]


def table_lines(a, rows, cols, precision, sums=False):
    """Right-aligned text rows of a 2-D array, rows and columns labelled; ``sums`` adds row sums."""
    cols, cells = _table_cells(a, cols, precision, sums)
    return _table_text(rows, cols, cells, _column_widths(cols, cells), range(len(cols)))


def column_groups(arrays, rows, cols, precision, width, sums=False):
    """Tables of ``arrays`` (one shape) too wide for ``width`` columns, cut between whole columns.

    Returns [(labels of the group's columns, [lines of each array's table])]: every group at
    most ``width`` wide (one column at least, whatever its width), its row labels repeated, and
    the same column widths in every array's table, so that their lines compare one under another.
    """
    tables = [_table_cells(a, cols, precision, sums) for a in arrays]
    labels = tables[0][0]
    widths = _column_widths(labels, *(cells for _, cells in tables))
    lw = max(len(r) for r in rows)                # the row labels, repeated in every group

    def cut(limit):                               # as many columns per group as fit ``limit``
        groups, start = [], 0
        while start < len(labels):
            end = start + 1
            while end < len(labels) and lw + sum(2 + w for w in widths[start:end + 1]) <= limit:
                end += 1
            groups.append(range(start, end))
            start = end
        return groups

    # The fewest groups, and of those the narrowest cut: 12 columns as 6 + 6 rather than 8 + 4.
    groups = cut(width)
    while width > 1 and len(cut(width - 1)) == len(groups):
        width -= 1
        groups = cut(width)
    return [([labels[j] for j in keep], [_table_text(rows, labels, cells, widths, keep) for _, cells in tables])
            for keep in groups]


def side_by_side(blocks, width, style, indent="    "):
    """Labelled blocks of lines beside each other, split by " | ", when they fit ``width``;
    otherwise one above the other, each under its label."""
    widths = [max(len(s) for s in lines) for _, lines in blocks]
    if len(indent) + sum(widths) + 5 * (len(blocks) - 1) <= width:
        first = [f"{label:<{w}}" for (label, _), w in zip(blocks, widths, strict=True)]
        out = [indent + style("dim", "  |  ".join(first).rstrip())]
        for row in zip(*(lines for _, lines in blocks), strict=True):
            out.append(indent + "  |  ".join(f"{s:<{w}}" for s, w in zip(row, widths, strict=True)).rstrip())
        return out
    out = []
    for label, lines in blocks:
        out.append(indent + style("dim", label))
        out += [indent + text for text in lines]
    return out


class Progress:
    """A progress bar on stderr, for every command (train, python -m benchmarks): redrawn in place
    on a terminal, a line per step otherwise (logs and captured output stay readable), with the
    time so far and an estimate of the time left."""

    def __init__(self, total, enabled=True, stream=None, width=28):
        self.total, self.done, self.width = max(total, 1), 0, width
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled
        self.tty = getattr(self.stream, "isatty", lambda: False)()
        self.start = time.monotonic()

    def step(self, label):
        """Count one finished step, described by ``label``."""
        self.done += 1
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.start
        eta = elapsed / self.done * (self.total - self.done)
        filled = round(self.width * self.done / self.total)
        text = (f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} "
                f"{elapsed:5.0f}s (eta {eta:.0f}s) {label}")
        if self.tty:
            self.stream.write("\r\033[K" + text + ("\n" if self.done >= self.total else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
