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
import html
import importlib.util
import re
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


def operations():
    """Every operation, leaf to root: a module comes after the operations it imports."""
    torch_dir = _torch_dir()
    stems = sorted(p.stem for p in NUMPY_DIR.glob("*.py")
                   if not p.stem.startswith("_") and (torch_dir / p.name).is_file())
    trees = {stem: ast.parse((NUMPY_DIR / f"{stem}.py").read_text(encoding="utf-8")) for stem in stems}
    deps = {stem: _imported_ops(tree, set(stems)) - {stem} for stem, tree in trees.items()}
    ordered, placed = [], set()
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


def _wrap(pieces, width):
    """Split one line's pieces into chunks of at most ``width`` characters."""
    chunks, current, used = [], [], 0
    for kind, text in pieces:
        while text:
            take = text[: width - used]
            current.append((kind, take))
            used += len(take)
            text = text[len(take):]
            if used == width and text:
                chunks.append(current)
                current, used = [], 0
    chunks.append(current)
    return chunks


def _ansi(pieces, color):
    if not color:
        return "".join(text for _, text in pieces)
    return "".join(f"\x1b[{ANSI[kind]}m{text}\x1b[0m" if kind else text for kind, text in pieces)


# ---------------------------------------------------------------------------------------------
# Terminal.

MARKS = {"same": "=", "twin": "~", "numpy": " ", "torch": " ", "blank": " "}


def render_terminal(op, color=False, width=None):
    """The operation as text lines: NumPy left, torch right, a mark between them
    ("=" the same once normalised, "~" a mirrored line)."""
    root = NUMPY_DIR.parent
    left_src = op.numpy_path.read_text(encoding="utf-8")
    right_src = op.torch_path.read_text(encoding="utf-8")
    left, right = highlight(left_src), highlight(right_src)
    rows = align(left_src.splitlines(), right_src.splitlines())
    nw = len(str(max(len(left), len(right), 1)))
    col = max((sum(len(t) for _, t in line) for line in left), default=0)
    rcol = max((sum(len(t) for _, t in line) for line in right), default=0)
    if width is not None:                 # a terminal: both halves fit its width, long lines wrap
        col = max(20, min(col, (width - 2 * nw - 6) // 2))
        rcol = max(20, width - 2 * nw - 6 - col)
    dim = (lambda s: f"\x1b[2m{s}\x1b[0m" if s.strip() else s) if color else (lambda s: s)
    title_l = f"{op.numpy_path.relative_to(root)}: {', '.join(op.numpy_functions)}"
    title_r = f"{op.torch_path.relative_to(root)}: {', '.join(op.torch_functions)} (autograd: backward)"
    out = [f"{'':{nw}} {title_l[:col]:<{col}}   {'':{nw}} {title_r[:rcol]}"]
    out.append(f"{'':{nw}} {'-' * col}   {'':{nw}} {'-' * min(rcol, len(title_r))}")
    for i, j, kind in rows:
        lchunks = _wrap(left[i], col) if i is not None else [[]]
        rchunks = _wrap(right[j], rcol) if j is not None else [[]]
        for k in range(max(len(lchunks), len(rchunks))):
            lp = lchunks[k] if k < len(lchunks) else []
            rp = rchunks[k] if k < len(rchunks) else []
            ln = f"{i + 1:>{nw}}" if i is not None and k == 0 else " " * nw
            rn = f"{j + 1:>{nw}}" if j is not None and k == 0 else " " * nw
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

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
nav ol { columns: 3; }
/* The two files share the window's width: a fixed layout gives each code column half of what the
   line numbers leave, and a long line wraps inside its cell (continuations indented), so the page
   never scrolls sideways. */
table.twins { border-collapse: collapse; width: 100%; table-layout: fixed;
              font: 12px/1.45 ui-monospace, Menlo, Consolas, monospace; }
table.twins col.ln { width: 3.5em; } table.twins col.mark { width: 1.5em; }
table.twins th { text-align: left; padding: 4px 8px; background: #eef; font-weight: 600;
                 overflow-wrap: anywhere; }
table.twins td { padding: 0 8px; vertical-align: top; }
table.twins td.code { white-space: pre-wrap; overflow-wrap: anywhere; padding-left: 2.5em;
                      text-indent: -2em; }
td.ln { color: #999; text-align: right; user-select: none; }
td.mark { color: #999; text-align: center; }
tr.same td.code, tr.twin td.code { background: #f5fbf5; }
tr.numpy td.code:first-of-type { background: #fbf7ef; }
.kw { color: #a626a4; font-weight: 600; } .fn { color: #986801; font-weight: 600; }
.bi { color: #0184bc; } .str { color: #50a14f; } .com { color: #8a8a8a; font-style: italic; }
.num { color: #0184bc; }
"""


def _html_line(pieces):
    return "".join(f'<span class="{kind}">{html.escape(text)}</span>' if kind else html.escape(text)
                   for kind, text in pieces)


def render_html(ops):
    root = NUMPY_DIR.parent
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
        left_src = op.numpy_path.read_text(encoding="utf-8")
        right_src = op.torch_path.read_text(encoding="utf-8")
        left, right = highlight(left_src), highlight(right_src)
        parts.append(f'<section id="op-{op.name}"><h2>{op.name}</h2>')
        parts.append('<table class="twins"><colgroup><col class="ln"><col class="code">'
                     '<col class="mark"><col class="ln"><col class="code"></colgroup><tr>'
                     f'<th colspan="2">{op.numpy_path.relative_to(root)}</th><th></th>'
                     f'<th colspan="2">{op.torch_path.relative_to(root)}</th></tr>')
        for i, j, kind in align(left_src.splitlines(), right_src.splitlines()):
            parts.append(f'<tr class="{kind}">')
            parts.append(f'<td class="ln">{"" if i is None else i + 1}</td>')
            parts.append(f'<td class="code">{"" if i is None else _html_line(left[i])}</td>')
            parts.append(f'<td class="mark">{MARKS[kind]}</td>')
            parts.append(f'<td class="ln">{"" if j is None else j + 1}</td>')
            parts.append(f'<td class="code">{"" if j is None else _html_line(right[j])}</td>')
            parts.append("</tr>")
        parts.append('</table><p><a href="#">back to the top</a></p></section>')
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
