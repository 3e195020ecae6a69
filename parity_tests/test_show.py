"""Tests for ``numpy-attn show`` (attn_cli/show.py): operations are discovered from the files,
twin lines stand side by side, the HTML page holds every operation's NumPy and torch source,
the plain fallback works without pygments, and bad input gets a message, not a traceback.
"""

import contextlib
import html
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

import numpy_attn
from attn_cli import cli, show

ROOT = Path(numpy_attn.__file__).resolve().parent.parent


def expected_operations():
    """Computed here independently: numpy_attn/<op>.py files that have a torch_attn/<op>.py."""
    return {p.stem for p in (ROOT / "numpy_attn").glob("*.py")
            if not p.stem.startswith("_") and (ROOT / "torch_attn" / p.name).is_file()}


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(["show", *argv])
    return status, out.getvalue(), err.getvalue()


def row_with(out, left, right):
    """The output line holding ``left`` (NumPy side) and, further right, ``right`` (torch side)."""
    return [line for line in out.splitlines() if left in line and right in line.split(left, 1)[1]]


def test_list_names_every_operation_with_a_twin():
    status, out, _ = run("--list")
    assert status == 0
    listed = {line.split()[0] for line in out.splitlines()[1:]}
    assert listed == expected_operations()
    for op in ("embedding", "positional", "softmax", "linear"):
        assert op in listed
    assert "tokenizer" not in listed and "cli" not in listed, "no twin, not an operation"


def test_operations_come_leaf_to_root():
    names = [op.name for op in show.operations()]
    for op in show.operations():
        for dependency in show._imported_ops(show.ast.parse(op.numpy_path.read_text()), set(names)):
            if dependency != op.name:
                assert names.index(dependency) < names.index(op.name), f"{dependency} before {op.name}"


def test_softmax_twins_stand_on_the_same_row():
    status, out, _ = run("softmax", "--width", "0")
    assert status == 0
    assert row_with(out, "def softmax_forward(x, axis=-1, dtype=None):", "def softmax(x, dim=-1, dtype=None):")
    assert row_with(out, "e = np.exp(x - m)", "e = torch.exp(x - m)")
    assert row_with(out, "s = e.sum(axis=axis, keepdims=True)", "s = e.sum(dim=dim, keepdim=True)")
    assert row_with(out, "return y, cache", "return y")
    # The backward has no twin: its lines stand alone.
    backward = [line for line in out.splitlines() if "dx = y * (dy - (dy * y).sum(" in line]
    assert len(backward) == 1 and "torch" not in backward[0]
    assert "\x1b[" not in out, "no colour when stdout is not a terminal"


def test_every_line_of_both_files_is_shown():
    _, out, _ = run("linear", "--width", "0")
    for path in (ROOT / "numpy_attn" / "linear.py", ROOT / "torch_attn" / "linear.py"):
        for line in path.read_text().splitlines():
            assert line.strip() in out, f"{path.name}: {line!r} missing"


def test_colour_and_the_plain_fallback_without_pygments(monkeypatch):
    op = next(op for op in show.operations() if op.name == "softmax")
    colored = "\n".join(show.render_terminal(op, color=True))
    assert "\x1b[" in colored
    plain = show.render_terminal(op, color=False)
    monkeypatch.setitem(sys.modules, "pygments", None)          # as if it were not installed
    monkeypatch.setitem(sys.modules, "pygments.lexers", None)
    assert show.highlight("x = 1  # one\n") == [[(None, "x = 1  # one")]]
    undimmed = [re.sub(r"\x1b\[2m(\s*\d*)\x1b\[0m", r"\1", line)       # line numbers stay dim
                for line in show.render_terminal(op, color=True)]
    assert undimmed == plain, "without pygments the code is plain"


def test_narrow_terminal_wraps_instead_of_cutting():
    op = next(op for op in show.operations() if op.name == "linear")
    lines = show.render_terminal(op, width=80)
    assert max(len(line) for line in lines) <= 80
    text = "".join(lines).replace(" ", "")
    assert "F.linear(x,w.T,b)" in text


def test_piped_output_fits_80_columns():
    status, out, _ = run("multi_head")          # stdout is not a terminal here
    assert status == 0
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)
    assert "".join(lines).replace(" ", "").count("defsplit_heads(") == 2, "both twins are shown"


def html_text_lines(page):
    """The page's text, one line per HTML line, tags removed and entities decoded."""
    return {html.unescape(re.sub(r"<[^>]+>", "", line)) for line in page.splitlines()}


@pytest.mark.slow
def test_html_page_holds_every_operation(tmp_path):
    page_path = tmp_path / "ops.html"
    status, out, _ = run("--html", str(page_path))
    assert status == 0 and "wrote" in out
    page = page_path.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert not re.search(r"<script|<link|src=|https?://", page), "self-contained: nothing fetched"
    text = html_text_lines(page)
    ops = expected_operations()
    for op in ops:
        assert f'<a href="#op-{op}">{op}</a>' in page and f'<section id="op-{op}">' in page
        for folder in ("numpy_attn", "torch_attn"):
            for line in (ROOT / folder / f"{op}.py").read_text().splitlines():
                if line.strip():
                    assert line in text, f"{folder}/{op}.py: {line!r} missing from the page"
    assert page.count('<tr class="same">') > 10 * len(ops) // 2, "twin lines are aligned"


def test_html_with_an_operation_also_prints_it(tmp_path):
    status, out, _ = run("embedding", "--html", str(tmp_path / "p.html"))
    assert status == 0 and "wrote" in out and row_with(out, "out = wte[ids]", "out = wte[ids]")


def test_a_function_name_finds_its_operation():
    ops = show.operations()
    assert show.find_operation("log_softmax", ops).name == "softmax"
    assert show.find_operation("embedding_backward", ops).name == "embedding"
    assert show.find_operation("scaled_dot_product_attention", ops).name == "attention"


@pytest.mark.parametrize("argv, message", [
    (["softmx"], "unknown operation 'softmx'. Did you mean 'softmax'?"),
    (["tokenizer"], "unknown operation 'tokenizer'"),
    ([], "give an operation"),
    (["--html", "/nonexistent-folder/x.html"], "cannot write '/nonexistent-folder/x.html'"),
])
def test_bad_input_exits_with_a_message(argv, message):
    status, out, err = run(*argv)
    assert status == 2
    assert err.startswith("numpy-attn show: error:") and message in err, err


def test_unknown_operation_in_a_real_process_has_no_traceback():
    result = subprocess.run([sys.executable, "-m", "attn_cli.cli", "show", "nope"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "unknown operation 'nope'" in result.stderr and "Traceback" not in result.stderr


# embedding's padding row is frozen by its NumPy backward and, for autograd, by a line in the torch
# forward that has no NumPy counterpart: 4 of its 5 code lines pair.
PAIRING_EXCEPTIONS = {"embedding": 0.8}


def test_every_twin_mirrors_its_numpy_file():
    """At least 85 % of each twin's code lines pair, in order, with an equal or similar NumPy line."""
    low = []
    for op in show.operations():
        paired, total = show.pairing_share(op)
        if paired < PAIRING_EXCEPTIONS.get(op.name, 0.85) * total:
            low.append(f"{op.name}: {paired}/{total}")
    assert not low, f"twins that do not mirror their NumPy file: {low}"


def test_pairing_share_counts_a_line_that_has_no_twin():
    """The measure can fail: a torch line with no NumPy counterpart lowers it."""
    op = next(o for o in show.operations() if o.name == "linear")
    paired, total = show.pairing_share(op)
    extra = op.torch_path.read_text(encoding="utf-8") + "\n\ndef _extra(x):\n    return x.flip(0).cumsum(0)\n"
    shadow = show.Operation(op.name, op.numpy_path, op.torch_path, [], [])
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "linear.py"
        path.write_text(extra, encoding="utf-8")
        shadow.torch_path = path
        paired2, total2 = show.pairing_share(shadow)
    assert (paired2, total2) == (paired, total + 2), (paired, total, paired2, total2)


# ---------------------------------------------------------------------------------------------
# Wrapping for a width: words, headers and diagrams whole; paragraphs refilled.

def rendered(op_name, width):
    op = next(o for o in show.operations() if o.name == op_name)
    return op, show.render_terminal(op, width=width)


def source_words(op, longest):
    """Every space-separated word of both files up to ``longest`` characters (longer ones may have
    to be cut to fit a column)."""
    text = op.numpy_path.read_text() + op.torch_path.read_text()
    return {w for w in text.split() if len(w) <= longest}


@pytest.mark.parametrize("op_name", ["softmax", "attention", "multi_head", "flex_attention"])
@pytest.mark.parametrize("width", [80, 160])
def test_lines_break_at_word_boundaries(op_name, width):
    """No word of either file is cut at 80 or 160 columns ("along on / e axis" was)."""
    op, lines = rendered(op_name, width)
    assert max(len(line) for line in lines) <= width, max(lines, key=len)
    shown = set(" ".join(lines).split())
    cut = sorted(source_words(op, 12) - shown)
    assert not cut, f"{op_name} at {width}: words cut across lines: {cut[:10]}"


@pytest.mark.parametrize("width", [60, 80])
def test_header_names_every_function_whole(width):
    for op in show.operations():
        lines = show.render_terminal(op, width=width)
        header = " ".join(lines[: next(k for k, line in enumerate(lines) if "---" in line)])
        words = set(header.replace(",", " ").split())
        for name in op.numpy_functions + op.torch_functions:
            assert name in words, f"{op.name}: {name!r} cut from the header at {width}: {header!r}"
        assert str(op.numpy_path.relative_to(ROOT)) + ":" in words
        assert max(len(line) for line in lines) <= width


def docstring_diagram_lines(path):
    """Lines of a module docstring indented four or more: formulas and diagrams, laid out by hand."""
    doc = ast_docstring_lines(path)
    return [line for line in doc if line.startswith("    ") and line.strip()]


def ast_docstring_lines(path):
    import ast

    tree = ast.parse(path.read_text())
    first = tree.body[0]
    return path.read_text().splitlines()[first.lineno - 1:first.end_lineno]


def test_diagrams_stay_whole_at_80_columns():
    """attention's two mask diagrams stand beside each other, each row as written, not
    interleaved by wrapping; so does every formula of a module docstring that fits the width."""
    op, lines = rendered("attention", 80)
    for row in ("1 0 0 0 0                       1 1 1 0 0", "1 1 1 0 0                       1 1 1 1 1",
                'top-left (True, "top_left")     bottom-right ("bottom_right")'):
        assert any(row in line for line in lines), f"diagram row {row!r} broken"
    for op in show.operations():
        lines = show.render_terminal(op, width=80)
        for pre in docstring_diagram_lines(op.numpy_path):
            if len(pre) <= 70:
                assert any(pre.strip() in line for line in lines), f"{op.name}: {pre!r} broken"


def left_column(lines):
    """The NumPy half of rendered lines: the text after the line number, as wide as the rule."""
    rule = next(line for line in lines if "---" in line)
    start = rule.index("-")
    width = len(rule[start:].split(" ")[0])
    return [line[start:start + width].rstrip() for line in lines[lines.index(rule) + 1:]], width


def test_docstring_paragraphs_are_refilled_at_160_columns():
    """A paragraph is refilled: no line of it ends where the next line's first word would still
    have fitted (wrapping each source line on its own left short, ragged lines)."""
    _, lines = rendered("softmax", 160)
    column, width = left_column(lines)
    first = next(k for k, text in enumerate(column) if text.startswith("Subtracting the row maximum"))
    last = next(k for k in range(first, len(column)) if column[k].endswith("log-softmax."))
    paragraph = column[first:last + 1]
    assert len(paragraph) >= 3
    for text, following in zip(paragraph[:-1], paragraph[1:], strict=True):
        assert len(text) + 1 + len(following.split()[0]) > width, f"ragged: {text!r} / {following!r}"
    words = " ".join(paragraph).split()
    source = " ".join(ast_docstring_lines(ROOT / "numpy_attn" / "softmax.py")).split()
    assert " ".join(words) in " ".join(source), "the paragraph's words, in order"


def test_width_0_keeps_every_line_whole():
    _, lines = rendered("attention", None)
    text = "\n".join(lines)
    for line in (ROOT / "numpy_attn" / "attention.py").read_text().splitlines():
        assert line.strip() in text


# ---------------------------------------------------------------------------------------------
# One reading order everywhere.

def docstring_order():
    """The reading order as numpy_attn's docstring lists it (parsed here, independently)."""
    lines = numpy_attn.__doc__.split("Reading order, leaf to root:")[1].split("\n\n")[1].splitlines()
    return [line.split()[0] for line in lines]


def readme_order():
    """The operations in the order of the README's table, by the NumPy file each row names."""
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## The operations")[1].split("\n\n")[2]
    return re.findall(r"^\| [^|]+ \| `numpy_attn/(\w+)\.py` \|", table, flags=re.M)


def torch_docstring_order():
    import importlib.util

    spec = importlib.util.find_spec("torch_attn")
    text = Path(spec.origin).read_text()
    listed = text.split("Reading order, leaf to root (numpy_attn's):")[1].split(".\n")[0]
    return [name.strip() for name in listed.replace("\n", " ").split(",")]


@pytest.mark.slow
def test_one_reading_order_everywhere(tmp_path):
    order = docstring_order()
    assert set(order) == expected_operations(), "the docstring lists every operation once"
    assert len(order) == len(set(order))
    assert [op.name for op in show.operations()] == order, "show's order"
    _, out, _ = run("--list")
    assert [line.split()[0] for line in out.splitlines()[1:]] == order, "show --list"
    assert readme_order() == order, "the README's table"
    assert torch_docstring_order() == order, "torch_attn's docstring"
    run("--html", str(tmp_path / "ops.html"))
    page = (tmp_path / "ops.html").read_text()
    assert re.findall(r'<section id="op-(\w+)">', page) == order, "the HTML page"


def test_html_page_opens_on_the_first_operation_and_refills_paragraphs(tmp_path):
    run("--html", str(tmp_path / "ops.html"))
    page = (tmp_path / "ops.html").read_text()
    assert page.index('<section id="op-embedding">') < page.index('<section id="op-dropout">')
    cells = re.findall(r'<td class="code prose">(.*?)</td>', page, flags=re.S)
    para = [c for c in cells if "Subtracting the row maximum m" in c]
    assert len(para) == 1 and "for log-softmax." in para[0], "one cell holds the whole paragraph"
    pre = re.findall(r'<td class="code pre" colspan="4">(.*?)</td>', page, flags=re.S)
    assert any("1 0 0 0 0                       1 1 1 0 0" in c for c in pre), "diagram rows whole"
