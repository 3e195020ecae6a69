"""The ``numpy-attn show`` command: an operation's NumPy file beside its torch twin.

An operation is any ``numpy_attn/<op>.py`` that has a twin ``torch_attn/<op>.py``; both folders are
read as text (nothing is imported, so neither torch nor the operation runs), which is how a new
operation appears here without anyone registering it. Operations are listed leaf to root: an
operation comes after those it imports.

Lines are aligned where the twins mirror each other: both files are normalised (comments dropped,
NumPy spellings turned into torch ones: ``np.`` -> ``torch.``, ``axis`` -> ``dim``, ...), matched
with ``difflib.SequenceMatcher``, and inside each differing stretch paired by similarity. The
NumPy backward, which torch leaves to autograd, stands opposite blank lines. Syntax colours come
from pygments when it is installed (an optional import); without it the code is printed plain.
"""

import ast
import difflib
import functools
import html
import importlib.util
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from attn_cli import term

NUMPY_DIR = Path(__file__).resolve().parent.parent / "numpy_attn"

# NumPy spelling -> torch spelling, applied to NumPy lines before they are compared.
SPELLINGS = [
    (r"\bnp\.", "torch."), (r"\baxis\b", "dim"), (r"\bkeepdims\b", "keepdim"),
    (r"\.swapaxes\(", ".transpose("), (r"\.max\(", ".amax("), (r"_forward\(", "("),
    (r"\bnumpy_attn\b", "torch_attn"), (r"^return (.+), cache$", r"return \1"),
]


# ---------------------------------------------------------------------------------------------
# Discovery.

@dataclass
class Operation:
    name: str
    numpy_path: Path
    torch_path: Path
    numpy_functions: list     # public top-level functions
    torch_functions: list


def _torch_dir():
    """torch_attn's folder: beside numpy_attn in a checkout, else wherever Python finds it
    (located, not imported)."""
    sibling = NUMPY_DIR.parent / "torch_attn"
    if sibling.is_dir():
        return sibling
    spec = importlib.util.find_spec("torch_attn")
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    raise ValueError("torch_attn is not installed beside numpy_attn: show needs both folders")


def _public_functions(tree):
    return [node.name for node in tree.body
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")]


def _imported_ops(tree, names):
    """The operations among ``names`` that a module imports (``from numpy_attn.x import ...``)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            if parts[0] == "numpy_attn" and len(parts) == 2 and parts[1] in names:
                found.add(parts[1])
            if parts == ["numpy_attn"]:
                found.update(alias.name for alias in node.names if alias.name in names)
    return found


def reading_list():
    """(operation, what it is) in the order numpy_attn's docstring lists them under "Reading
    order, leaf to root:" (one indented line each, the operation first): the order of the README's
    table, of ``show --list``, of the HTML page and of the site. Read as text, not imported."""
    doc = ast.get_docstring(ast.parse((NUMPY_DIR / "__init__.py").read_text(encoding="utf-8"))) or ""
    entries, inside = [], False
    for line in doc.splitlines():
        if line.startswith("Reading order"):
            inside = True
        elif inside and line.startswith(" ") and line.strip():
            name, _, what = line.strip().partition(" ")
            entries.append((name, what.strip()))
        elif inside and entries:         # the blank line or text after the list ends it
            break
    return entries


def reading_order():
    return [name for name, _ in reading_list()]


def operations():
    """Every operation in the reading order (``reading_order``); any it does not name come last,
    leaf to root (a module after the operations it imports)."""
    torch_dir = _torch_dir()
    stems = sorted(p.stem for p in NUMPY_DIR.glob("*.py")
                   if not p.stem.startswith("_") and (torch_dir / p.name).is_file())
    trees = {stem: ast.parse((NUMPY_DIR / f"{stem}.py").read_text(encoding="utf-8")) for stem in stems}
    deps = {stem: _imported_ops(tree, set(stems)) - {stem} for stem, tree in trees.items()}
    ordered = [name for name in reading_order() if name in trees]
    placed = set(ordered)
    while len(ordered) < len(stems):     # alphabetical among those whose imports are all placed
        ready = [s for s in stems if s not in placed and deps[s] <= placed]
        ready = ready or [next(s for s in stems if s not in placed)]     # an import cycle: break it
        ordered.append(ready[0])
        placed.add(ready[0])
    ops = []
    for stem in ordered:
        torch_tree = ast.parse((torch_dir / f"{stem}.py").read_text(encoding="utf-8"))
        ops.append(Operation(stem, NUMPY_DIR / f"{stem}.py", torch_dir / f"{stem}.py",
                             _public_functions(trees[stem]), _public_functions(torch_tree)))
    return ops


def find_operation(name, ops):
    by_name = {op.name: op for op in ops}
    if name in by_name:
        return by_name[name]
    for op in ops:                     # a function's name finds its file: log_softmax -> softmax
        if name in op.torch_functions or name in op.numpy_functions or f"{name}_forward" in op.numpy_functions:
            return op
    close = difflib.get_close_matches(name, list(by_name), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"unknown operation {name!r}.{hint} The operations are: {', '.join(by_name)} "
                     "(numpy-attn show --list)")


# ---------------------------------------------------------------------------------------------
# Alignment.

def normalise(line, numpy_side):
    """A line reduced to what the twins share: no trailing comment, no indentation, torch spellings.

    A line that is only a comment keeps its text, so that it pairs with a similar comment only.
    """
    text = line.strip()
    if not text.startswith("#"):
        text = re.sub(r"\s+#.*$", "", text)
    if numpy_side:
        for pattern, torch_spelling in SPELLINGS:
            text = re.sub(pattern, torch_spelling, text)
    return text


def _similarity(a, b):
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio() if a and b else 0.0


def _pair_by_similarity(left, right, lo, ro, threshold=0.55):
    """Pair the lines of two differing stretches in order, maximising total similarity
    (a small dynamic programme); the unpaired lines stand alone."""
    n, m = len(left), len(right)
    sim = [[_similarity(a, b) for b in right] for a in left]
    best = [[0.0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            best[i][j] = max(best[i + 1][j], best[i][j + 1],
                             sim[i][j] + best[i + 1][j + 1] if sim[i][j] >= threshold else 0.0)
    rows, i, j = [], 0, 0
    while i < n or j < m:
        if i < n and j < m and sim[i][j] >= threshold and best[i][j] == sim[i][j] + best[i + 1][j + 1]:
            rows.append((lo + i, ro + j, "twin"))
            i, j = i + 1, j + 1
        elif j == m or (i < n and best[i][j] == best[i + 1][j]):
            rows.append((lo + i, None, "numpy"))
            i += 1
        else:
            rows.append((None, ro + j, "torch"))
            j += 1
    return rows


def align(numpy_lines, torch_lines):
    """Rows (NumPy index or None, torch index or None, kind); kind is "same" (equal once
    normalised), "twin" (similar), "numpy" or "torch" (one side only)."""
    a = [normalise(line, True) for line in numpy_lines]
    b = [normalise(line, False) for line in torch_lines]
    rows = []
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            rows += [(i1 + k, j1 + k, "same" if a[i1 + k] else "blank") for k in range(i2 - i1)]
        else:
            rows += _pair_by_similarity(a[i1:i2], b[j1:j2], i1, j1)
    return rows


# ---------------------------------------------------------------------------------------------
# Syntax colours: each line as a list of (kind, text), kind one of the keys of ANSI or None.

ANSI = {"kw": "1;35", "fn": "1;33", "bi": "36", "str": "32", "com": "2;37", "num": "36"}


def _kind(ttype):
    from pygments import token

    for parent, kind in ((token.Comment, "com"), (token.String, "str"), (token.Number, "num"),
                         (token.Keyword, "kw"), (token.Operator.Word, "kw"),
                         (token.Name.Function, "fn"), (token.Name.Class, "fn"),
                         (token.Name.Builtin, "bi"), (token.Name.Decorator, "fn")):
        if ttype in parent:
            return kind
    return None


def highlight(source):
    """The lines of ``source`` as lists of (kind, text) pieces; plain when pygments is missing."""
    lines = source.splitlines()
    try:
        from pygments.lexers import PythonLexer
    except ImportError:
        return [[(None, line)] for line in lines]
    out = [[]]
    for ttype, value in PythonLexer(stripnl=False, ensurenl=False).get_tokens(source):
        kind = _kind(ttype)
        for k, part in enumerate(value.split("\n")):
            if k:
                out.append([])
            if part:
                out[-1].append((kind, part))
    out = out[:len(lines)]
    return out + [[] for _ in range(len(lines) - len(out))]


def _ansi(pieces, color):
    """The pieces' text, each in its syntax colour when ``color``."""
    return "".join(term.ansi(ANSI[kind] if color and kind else None, text) for kind, text in pieces)


# ---------------------------------------------------------------------------------------------
# Layout: the rows of ``align`` as cells, each a code line, a docstring or comment paragraph
# (prose, reflowed at word boundaries), or a pre-formatted docstring line (a formula or a diagram,
# kept as written).

@dataclass
class Cell:
    lines: list          # 0-based indices of the source lines shown: one, or a paragraph's
    role: str            # "code", "prose", "pre", or "" for an empty side
    pieces: list         # (kind, text) pieces; a paragraph's lines joined into one


EMPTY = Cell([], "", [])


def line_roles(source):
    """(role, paragraph) of every line of ``source``. Role "prose": a docstring line, or a line
    that is only a comment; consecutive ones form a paragraph (a blank line, a deeper indentation or
    a "- " bullet starts a new one). Role "pre": a docstring line indented four or more further
    than its docstring, written to be read as laid out. Role "code": everything else."""
    lines = source.splitlines()
    roles, paragraphs, number = ["code"] * len(lines), [None] * len(lines), 0

    def indent(k):
        return len(lines[k]) - len(lines[k].lstrip())

    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef) and node.body):
            continue
        first = node.body[0]
        if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)):
            continue
        base, previous = indent(first.lineno - 1), False
        for k in range(first.lineno - 1, first.end_lineno):
            text = lines[k].strip()
            if text in ("", '"""'):
                previous = False
            elif indent(k) >= base + 4:
                roles[k], previous = "pre", False
            else:
                number += not previous or text.startswith(("- ", "* "))
                roles[k], paragraphs[k], previous = "prose", number, True
    for k, line in enumerate(lines):
        if roles[k] == "code" and line.lstrip().startswith("#"):
            same = k > 0 and roles[k - 1] == "prose" and lines[k - 1].lstrip().startswith("#") \
                and indent(k - 1) == indent(k)
            number += not same
            roles[k], paragraphs[k] = "prose", number
    return list(zip(roles, paragraphs, strict=True))


def _joined(pieces_per_line, texts):
    """One paragraph's lines as one line: the first line's indentation, then the words; a comment
    keeps a single "#"."""
    kind = next((k for line in pieces_per_line for k, t in line if t.strip()), None)
    comment = texts[0].lstrip().startswith("#")
    words = [texts[0].strip()] + [t.strip().removeprefix("#").strip() if comment else t.strip()
                                  for t in texts[1:]]
    lead = texts[0][: len(texts[0]) - len(texts[0].lstrip())]
    return [(kind, lead + " ".join(w for w in words if w))]


@functools.lru_cache(maxsize=64)      # the site, the HTML page and the terminal ask more than once
def _aligned(numpy_source, torch_source):
    return tuple(align(numpy_source.splitlines(), torch_source.splitlines()))


def layout(numpy_source, torch_source, reflow=True, comments=True):
    """(left cell, right cell, kind) rows, from ``align``'s. With ``reflow``, consecutive rows
    that hold one side's lines of one paragraph (the other side empty) become one row, its
    paragraph joined so that it can be wrapped at word boundaries; ``comments=False`` leaves
    comment paragraphs line by line."""
    sources = numpy_source.splitlines(), torch_source.splitlines()
    highlighted = highlight(numpy_source), highlight(torch_source)
    roles = line_roles(numpy_source), line_roles(torch_source)

    def cell(side, k):
        return EMPTY if k is None else Cell([k], roles[side][k][0], highlighted[side][k])

    out = []
    for i, j, kind in _aligned(numpy_source, torch_source):
        side, k = (0, i) if j is None else (1, j) if i is None else (None, None)
        previous = out[-1] if out else None
        if (reflow and side is not None and roles[side][k][0] == "prose" and previous is not None
                and previous[2] == kind and (comments or not sources[side][k].lstrip().startswith("#"))):
            last = previous[side]
            if last.role == "prose" and roles[side][last.lines[-1]][1] == roles[side][k][1]:
                lines = last.lines + [k]
                joined = _joined([highlighted[side][n] for n in lines], [sources[side][n] for n in lines])
                merged = Cell(lines, "prose", joined)
                out[-1] = (merged, EMPTY, kind) if side == 0 else (EMPTY, merged, kind)
                continue
        out.append((cell(0, i), cell(1, j), kind))
    return _side_by_side(out) if reflow else out


def _side_by_side(rows):
    """A run of NumPy-only paragraphs followed by a run of torch-only ones (two docstrings that
    differ), put beside each other, one paragraph per row, instead of one below the other."""
    out, k = [], 0
    while k < len(rows):
        n = k
        while n < len(rows) and rows[n][0].role == "prose" and rows[n][2] == "numpy":
            n += 1
        m = n
        while m < len(rows) and rows[m][1].role == "prose" and rows[m][2] == "torch":
            m += 1
        if n > k and m > n:
            left, right = [r[0] for r in rows[k:n]], [r[1] for r in rows[n:m]]
            pad = max(len(left), len(right))
            out += [(a, b, "numpy") for a, b in zip(left + [EMPTY] * (pad - len(left)),
                                                    right + [EMPTY] * (pad - len(right)), strict=True)]
            k = m
        else:
            out.append(rows[k])
            k += 1
    return out


def _slice(pieces, start, end):
    """The characters start..end of a line given as pieces, as pieces."""
    out, pos = [], 0
    for kind, text in pieces:
        a, b = max(start - pos, 0), min(end - pos, len(text))
        if a < b:
            out.append((kind, text[a:b]))
        pos += len(text)
    return out


def wrap_pieces(pieces, width, more=4, gaps=False):
    """One line's pieces as lines of at most ``width`` characters, cut at spaces (inside a word
    only where a word is longer than a line); a continuation is indented ``more`` past the line's
    own indentation. With ``gaps`` (a pre-formatted line), a run of spaces that separates columns
    is the first choice of cut."""
    text = "".join(t for _, t in pieces)
    if len(text) <= width:
        return [pieces]
    lead = len(text) - len(text.lstrip(" "))
    if lead > width // 2:                 # a continuation aligned far right: room for its words
        pieces, text, lead = _slice(pieces, lead - width // 2, len(text)), text[lead - width // 2:], width // 2
    hang = min(lead + more, width // 2)
    chunks, start, room = [], 0, width
    while len(text) - start > room:
        lo, hi = start + 1 if chunks else lead + 1, start + room + 1
        cut = text.rfind("   ", lo, hi) if gaps else -1
        cut = cut if cut > start else text.rfind(" ", lo, hi)
        if cut <= start:                  # no space within reach: the word is cut
            cut = start + room
        chunks.append(_slice(pieces, start, cut))
        start = cut
        while start < len(text) and text[start] == " ":
            start += 1
        room = width - hang
    chunks.append(_slice(pieces, start, len(text)))
    return chunks[:1] + [[(None, " " * hang)] + chunk for chunk in chunks[1:]]


def wrap_prose(cell, width):
    """A paragraph's text as lines of at most ``width``, cut at word boundaries; a comment's
    continuations start with "# ", a bullet's are indented under its text."""
    kind = next((k for k, t in cell.pieces if t.strip()), None)
    text = "".join(t for _, t in cell.pieces)
    lead = text[: len(text) - len(text.lstrip())]
    body = text.lstrip()
    more = "# " if body.startswith("#") else "  " if body.startswith(("- ", "* ")) else ""
    lines = textwrap.wrap(body, max(width - len(lead), 10), subsequent_indent=more,
                          break_on_hyphens=False) or [""]
    return [[(kind, lead + line)] for line in lines]


def cell_chunks(cell, width):
    """A cell as lines of pieces, each at most ``width`` characters (``None``: no limit)."""
    if not cell.role:
        return [[]]
    if width is None:
        return [cell.pieces]
    if cell.role == "prose":
        return wrap_prose(cell, width)
    return wrap_pieces(cell.pieces, width, gaps=cell.role == "pre")


# ---------------------------------------------------------------------------------------------
# Terminal.

MARKS = {"same": "=", "twin": "~", "numpy": " ", "torch": " ", "blank": " "}


def _title_lines(op, col, rcol, nw, width):
    """The header: each file and its functions, in its column when both fit, else each on lines of
    its own across the whole width (never cut)."""
    root = NUMPY_DIR.parent
    title_l = f"{op.numpy_path.relative_to(root)}: {', '.join(op.numpy_functions)}"
    title_r = f"{op.torch_path.relative_to(root)}: {', '.join(op.torch_functions)} (autograd: backward)"
    rule = f"{'':{nw}} {'-' * col}   {'':{nw}} {'-' * min(rcol, len(title_r))}"
    if width is None or (len(title_l) <= col and len(title_r) <= rcol):
        return [f"{'':{nw}} {title_l:<{col}}   {'':{nw}} {title_r}".rstrip(), rule]
    lines = []
    for side, title in (("left", title_l), ("right", title_r)):
        lines += textwrap.wrap(f"{side}: {title}", width, subsequent_indent="    ", break_on_hyphens=False)
    return lines + [rule]


def render_terminal(op, color=False, width=None):
    """The operation as text lines: NumPy left, torch right, a mark between them
    ("=" the same once normalised, "~" a mirrored line). With ``width``, lines fit it: code
    wraps at spaces, docstring and comment paragraphs are reflowed, and a pre-formatted line
    (a diagram) too wide for its half but with nothing beside it runs on across the other half."""
    left_src = op.numpy_path.read_text(encoding="utf-8")
    right_src = op.torch_path.read_text(encoding="utf-8")
    rows = layout(left_src, right_src, reflow=width is not None)
    nw = len(str(max(len(left_src.splitlines()), len(right_src.splitlines()), 1)))

    def length(cell):
        return sum(len(t) for _, t in cell.pieces)

    col = max((length(a) for a, _, _ in rows), default=0)
    rcol = max((length(b) for _, b, _ in rows), default=0)
    if width is not None:                 # a terminal: both halves fit its width
        col = max(20, min(col, (width - 2 * nw - 6) // 2))
        rcol = max(20, width - 2 * nw - 6 - col)
    whole = col + rcol + nw + 4           # the text's room when a line runs across both halves
    dim = (lambda s: term.ansi("2", s) if s.strip() else s) if color else (lambda s: s)
    out = _title_lines(op, col, rcol, nw, width)
    for a, b, kind in rows:
        if width is not None and a.role == "pre" and not b.role and col < length(a) <= whole:
            out.append(f"{dim(f'{a.lines[0] + 1:>{nw}}')} {_ansi(a.pieces, color)}".rstrip())
            continue
        if width is not None and b.role == "pre" and not a.role and rcol < length(b) <= whole:
            start = nw + 1 + min(col + 3 + nw + 1, whole - length(b))   # as far right as it fits
            out.append(f"{' ' * (start - nw - 1)}{dim(f'{b.lines[0] + 1:>{nw}}')} {_ansi(b.pieces, color)}")
            continue
        lchunks, rchunks = cell_chunks(a, col if width else None), cell_chunks(b, rcol if width else None)
        for k in range(max(len(lchunks), len(rchunks))):
            lp = lchunks[k] if k < len(lchunks) else []
            rp = rchunks[k] if k < len(rchunks) else []
            ln = f"{a.lines[0] + 1:>{nw}}" if a.lines and k == 0 else " " * nw
            rn = f"{b.lines[0] + 1:>{nw}}" if b.lines and k == 0 else " " * nw
            pad = " " * (col - sum(len(t) for _, t in lp))
            mark = MARKS[kind] if k == 0 else " "
            out.append(f"{dim(ln)} {_ansi(lp, color)}{pad} {mark} {dim(rn)} {_ansi(rp, color)}".rstrip())
    return out


def _code_lines(source):
    """Indices of the lines that are code: not blank, not a comment, not an import, not a
    docstring (imports differ by nature: NumPy against torch)."""
    lines = source.splitlines()
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                docstrings.update(range(first.lineno - 1, first.end_lineno))
    return {i for i, line in enumerate(lines) if line.strip() and i not in docstrings
            and not line.strip().startswith(("#", "import ", "from "))}


def pairing_share(op):
    """(paired, total): how many of the twin's code lines ``align`` pairs, in order, with an
    equal or similar NumPy line, out of all its code lines. How closely the twin mirrors."""
    numpy_source = op.numpy_path.read_text(encoding="utf-8")
    torch_source = op.torch_path.read_text(encoding="utf-8")
    rows = align(numpy_source.splitlines(), torch_source.splitlines())
    paired = {j for i, j, kind in rows if i is not None and j is not None and kind in ("same", "twin")}
    code = _code_lines(torch_source)
    return len(paired & code), len(code)


def render_list(ops):
    width = max(len(op.name) for op in ops)
    lines = [f"{len(ops)} operations (numpy_attn/<op>.py with a twin torch_attn/<op>.py), leaf to "
             "root; the share of the twin's code lines that pair with a NumPy line:"]
    for op in ops:
        paired, total = pairing_share(op)
        lines.append(f"  {op.name:<{width}}  {100 * paired / max(total, 1):3.0f}%  "
                     f"{', '.join(op.numpy_functions)}  |  {', '.join(op.torch_functions)}")
    return lines


# ---------------------------------------------------------------------------------------------
# HTML: one self-contained page, inline CSS, no script, no external resource.

TWINS_CSS = """
/* The two files share the window's width: a fixed layout gives each code column half of what the
   line numbers leave. A code line wraps inside its cell at spaces (continuations indented); a
   docstring paragraph is one cell whose words the browser wraps; a pre-formatted docstring line
   (a formula, a diagram) keeps its spaces and, with nothing beside it, runs on across the other
   file's empty half. The page never scrolls sideways. */
table.twins { border-collapse: collapse; width: 100%; table-layout: fixed;
              font: 12px/1.45 ui-monospace, Menlo, Consolas, monospace; }
table.twins col.ln { width: 3.5em; } table.twins col.mark { width: 1.5em; }
table.twins th { text-align: left; padding: 4px 8px; background: #eef; font-weight: 600;
                 overflow-wrap: anywhere; }
table.twins td { padding: 0 8px; vertical-align: top; }
table.twins td.code { white-space: pre-wrap; overflow-wrap: break-word; padding-left: 2.5em;
                      text-indent: -2em; }
table.twins td.prose { white-space: normal; text-indent: 0; padding: 0 8px 0.4em 8px; }
table.twins td.pre { white-space: pre; overflow-x: auto; text-indent: 0; padding-left: 8px; }
td.ln { color: #999; text-align: right; user-select: none; }
td.mark { color: #999; text-align: center; }
tr.same td.code, tr.twin td.code { background: #f5fbf5; }
tr.numpy td.code:first-of-type { background: #fbf7ef; }
.kw { color: #a626a4; font-weight: 600; } .fn { color: #986801; font-weight: 600; }
.bi { color: #0184bc; } .str { color: #50a14f; } .com { color: #8a8a8a; font-style: italic; }
.num { color: #0184bc; }
"""

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
nav ol { columns: 3; }
""" + TWINS_CSS


def _html_line(pieces):
    return "".join(f'<span class="{kind}">{html.escape(text)}</span>' if kind else html.escape(text)
                   for kind, text in pieces)


def _html_cell(cell, highlighted, colspan=1):
    """A cell's line-number and code columns. A paragraph's source lines stand one per line of the
    HTML, which the browser joins and wraps as one paragraph."""
    number = f'<td class="ln">{cell.lines[0] + 1 if cell.lines else ""}</td>'
    role = {"prose": "code prose", "pre": "code pre"}.get(cell.role, "code")
    span = f' colspan="{colspan}"' if colspan > 1 else ""
    body = "\n".join(_html_line(highlighted[n]) for n in cell.lines)
    return f'{number}\n<td class="{role}"{span}>{body}</td>'


def html_twins(op):
    """The operation's two files side by side as one HTML table (styled by TWINS_CSS)."""
    root = NUMPY_DIR.parent
    left_src = op.numpy_path.read_text(encoding="utf-8")
    right_src = op.torch_path.read_text(encoding="utf-8")
    highlighted = highlight(left_src), highlight(right_src)
    parts = ['<table class="twins"><colgroup><col class="ln"><col class="code">'
             '<col class="mark"><col class="ln"><col class="code"></colgroup><tr>'
             f'<th colspan="2">{op.numpy_path.relative_to(root)}</th><th></th>'
             f'<th colspan="2">{op.torch_path.relative_to(root)}</th></tr>']
    for a, b, kind in layout(left_src, right_src, comments=False):
        parts.append(f'<tr class="{kind}">')
        if a.role == "pre" and not b.role:      # a diagram with nothing beside it: the whole width
            parts.append(_html_cell(a, highlighted[0], colspan=4))
        else:
            parts.append(_html_cell(a, highlighted[0]))
            parts.append(f'<td class="mark">{MARKS[kind]}</td>')
            parts.append(_html_cell(b, highlighted[1]))
        parts.append("</tr>")
    parts.append("</table>")
    return "\n".join(parts)


def render_html(ops):
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             "<title>numpy-attn: every operation, NumPy beside torch</title>",
             f"<style>{CSS}</style></head><body>",
             "<h1>numpy-attn: every operation, NumPy beside torch</h1>",
             "<p>Left: <code>numpy_attn</code>, forward and hand-written backward. Right: its twin in "
             "<code>torch_attn</code>, whose backward autograd supplies. <code>=</code> marks lines "
             "that are the same once NumPy's spellings are turned into torch's, <code>~</code> lines "
             "that mirror each other. Generated by <code>numpy-attn show --html</code>.</p>",
             "<nav><h2>Operations, leaf to root</h2><ol>"]
    parts += [f'<li><a href="#op-{op.name}">{op.name}</a></li>' for op in ops]
    parts.append("</ol></nav>")
    for op in ops:
        parts.append(f'<section id="op-{op.name}"><h2>{op.name}</h2>')
        parts.append(html_twins(op))
        parts.append('<p><a href="#">back to the top</a></p></section>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------------------------------------

HELP = "an operation's NumPy forward and backward beside its torch twin"

EXAMPLES = """examples:
  numpy-attn show --list                 the operations, leaf to root
  numpy-attn show softmax                numpy_attn/softmax.py beside torch_attn/softmax.py
  numpy-attn show log_softmax            a function's name finds its file
  numpy-attn show --html ops.html        every operation on one self-contained page
"""


def add_arguments(p):
    term.describe(p, ("Print numpy_attn/OP.py beside torch_attn/OP.py, lines aligned where the twins "
                     "mirror each other (\"=\" the same once NumPy's spellings are turned into "
                     "torch's, \"~\" a mirrored line), or write every operation to one HTML page."), EXAMPLES)
    p.add_argument("op", metavar="OP", nargs="?", default=None,
                   help="an operation, e.g. softmax, or one of its functions, e.g. log_softmax (see --list)")
    p.add_argument("--list", action="store_true", help="list the operations and exit")
    p.add_argument("--html", metavar="FILE", default=None,
                   help="write every operation, side by side, to one self-contained HTML page")
    p.add_argument("--width", type=int, default=None,
                   help="columns to lay the two files out in, long lines wrapped (default: the "
                        "terminal's width, 80 when piped; 0: no limit, every line whole, e.g. for grep)")
    term.add_color_option(p)


def run(args, out=None, color=None):
    """The command. Returns the exit status."""
    out, color = term.output(args, out, color)
    ops = operations()
    if args.list:
        print("\n".join(render_list(ops)), file=out)
        return 0
    if args.op is None and args.html is None:
        raise ValueError("give an operation, e.g. numpy-attn show softmax (--list lists them), or --html FILE")
    if args.width is not None and args.width != 0 and not 60 <= args.width <= 1000:
        raise ValueError(f"--width must be 0 (no limit) or lie in 60..1000, got {args.width}")
    op = find_operation(args.op, ops) if args.op is not None else None
    if args.html is not None:
        try:
            Path(args.html).write_text(render_html(ops), encoding="utf-8")
        except OSError as err:
            raise ValueError(f"cannot write {args.html!r}: {err.strerror or err}") from None
        print(f"wrote {args.html} ({len(ops)} operations)", file=out)
    if op is not None:
        width = term.width_of(out) if args.width is None else args.width or None
        print("\n".join(render_terminal(op, color=color, width=width)), file=out)
    return 0
