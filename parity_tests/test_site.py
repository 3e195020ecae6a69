"""Tests for ``numpy-attn site`` (attn_cli/site.py, attn_cli/mathml.py): one page per operation in
the reading order, readable offline, equations as MathML, the backward step by step, the errors
of the suite's report, the pictures, the two files side by side; the folder is written so that an
interruption leaves the previous site or the new one, and a user's folder is never replaced."""

import ast
import contextlib
import html
import io
import json
import re
from pathlib import Path

import pytest

import numpy_attn
from attn_cli import cli, mathml, show, site

ROOT = Path(numpy_attn.__file__).resolve().parent.parent


def docstring_order():
    lines = numpy_attn.__doc__.split("Reading order, leaf to root:")[1].split("\n\n")[1].splitlines()
    return [line.split()[0] for line in lines]


def fake_report(path, rows=None):
    """A test-errors.json with one row per operation's test file (or the rows given)."""
    rows = rows if rows is not None else [
        dict(test_file=f"parity_tests/test_{name}.py", name=f"{name}.out", dtype="float64",
             max_abs_error=1e-15 * (k + 1), tolerance_used=0.01 * (k + 1))
        for k, name in enumerate(docstring_order())]
    path.write_text(json.dumps(rows))
    return path


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(["site", *argv])
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The site built once, strictly, from a report that covers every operation."""
    tmp = tmp_path_factory.mktemp("site")
    status, out, err = run(str(tmp / "site"), "--errors", str(fake_report(tmp / "errors.json")), "--strict")
    assert status == 0, err
    assert "wrote" in out and not err, err
    return tmp / "site"


def page(built, name):
    return (built / f"{name}.html").read_text(encoding="utf-8")


def test_one_page_per_operation_in_the_reading_order(built):
    order = docstring_order()
    assert sorted(p.stem for p in built.glob("*.html")) == sorted(order + ["index"])
    index = page(built, "index")
    assert re.findall(r'<li><a href="(\w+)\.html"><b>', index) == order, "the index's order"
    for name in order:
        nav = page(built, name).split('<nav class="ops">')[1].split("</nav>")[0]
        assert re.findall(r'href="(\w+)\.html"', nav) == order, f"{name}: the side list's order"
    assert [op.name for op in show.operations()] == order


def test_nothing_is_fetched_when_reading(built):
    """No script, no font, no style sheet from elsewhere: every reference is a file of the site."""
    for path in built.rglob("*"):
        if path.suffix not in (".html", ".css"):
            continue
        text = path.read_text(encoding="utf-8")
        assert "<script" not in text.lower() and "@import" not in text and "@font-face" not in text
        assert not re.search(r"https?://", text), f"{path.name} names a URL"
        for ref in re.findall(r'(?:src|href)="([^"#]+)', text) + re.findall(r"url\(([^)]*)\)", text):
            assert (path.parent / ref).is_file(), f"{path.name}: {ref} is not in the site"


def formula_lines(op_name):
    """Lines of the module docstring indented four or more that hold an "=" (not code: code calls
    np., carries a # comment, or is one line of a call whose brackets close on another): found
    here by reading the file, independently of the site."""
    source = (ROOT / "numpy_attn" / f"{op_name}.py").read_text()
    first = ast.parse(source).body[0]
    lines = source.splitlines()[first.lineno - 1:first.end_lineno]

    def code(line):
        return ("np." in line or "#" in line or line.count("(") != line.count(")")
                or line.count("[") != line.count("]"))

    return [line for line in lines if line.startswith("    ") and "=" in line and not code(line)]


def test_equations_are_typeset_as_mathml(built):
    counted = 0
    for name in docstring_order():
        text = page(built, name)
        for line in formula_lines(name):
            counted += 1
            first = mathml.segments(line)[0][0]
            assert mathml.to_mathml(first) in text, f"{name}: {line.strip()!r} not typeset"
        if formula_lines(name):
            assert "<math" in text and "<code>" not in text.split("The equations")[1].split("</table>")[0]
    assert counted >= 40


def test_mathml_of_a_formula():
    m = mathml.to_mathml("softmax(x)_i = exp(x_i - m) / sum_j exp(x_j - m)")
    assert m.startswith('<math display="block">') and m.count("<msub>") == 3
    assert '<munder><mo movablelimits="false">∑</mo><mi>j</mi></munder>' in m
    assert "<msqrt><mi>hs</mi></msqrt>" in mathml.to_mathml("scale = 1 / sqrt(hs)")
    assert "<msup><mi>k</mi><mi>T</mi></msup>" in mathml.to_mathml("q @ k^T")
    assert "<mtext>\u00a0unless given\u00a0</mtext>" in mathml.to_mathml("1 / sqrt(hs) unless given")
    with pytest.raises(ValueError, match="no closing"):
        mathml.to_mathml("exp(x")


def test_the_backward_step_by_step(built):
    """softmax's backward: each comment of the function above the lines it explains, in order."""
    text = html.unescape(page(built, "softmax"))
    steps = text.split("<h3><code>softmax_backward</code></h3>")[1].split("</ol>")[0]
    comment = steps.index("Undoes y = e / s")
    code = steps.index("dx = y * (dy - (dy * y).sum(axis=axis, keepdims=True))")
    assert comment < code
    assert "<h3><code>log_softmax_backward</code></h3>" in text
    assert "Backward: dx = y * (dy - sum(dy * y)) for softmax" in text, "the module docstring's derivation"


def test_errors_come_from_the_report(tmp_path):
    rows = [dict(test_file="parity_tests/test_softmax.py", name="softmax.dx", dtype="float32",
                 max_abs_error=1.234e-07, tolerance_used=0.0421),
            dict(test_file="parity_tests/test_linear.py", name="linear.dw", dtype="float64",
                 max_abs_error=9.876e-15, tolerance_used=0.5)]
    status, _, err = run(str(tmp_path / "s"), "--errors", str(fake_report(tmp_path / "e.json", rows)))
    assert status == 0
    softmax = page(tmp_path / "s", "softmax")
    assert "1.23e-07" in softmax and "4.2%" in softmax and "softmax.dx" in softmax
    assert "9.88e-15" not in softmax, "linear's error is linear's"
    assert "9.88e-15" in page(tmp_path / "s", "linear")
    assert "Not measured in this run" in page(tmp_path / "s", "rope")
    assert "warning: rope: test-errors.json holds nothing from parity_tests/test_rope.py" in err


@pytest.mark.slow
def test_without_a_report_strict_refuses_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(site, "DEFAULT_ERRORS", tmp_path / "none.json")    # a checkout never tested
    status, _, err = run(str(tmp_path / "s"), "--strict")
    assert status == 2 and "warnings and --strict: nothing written" in err
    assert not (tmp_path / "s").exists()
    status, _, err = run(str(tmp_path / "s"))
    assert status == 0 and "no test-errors.json" in err
    assert "Not measured: the site was built without" in page(tmp_path / "s", "softmax")
    status, _, err = run(str(tmp_path / "t"), "--errors", str(tmp_path / "none.json"))
    assert status == 2 and f"--errors '{tmp_path / 'none.json'}': no such file" in err
    assert not (tmp_path / "t").exists()


def test_a_bad_report_is_named(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    status, _, err = run(str(tmp_path / "s"), "--errors", str(bad))
    assert status == 2 and f"--errors '{bad}' is not a test-errors.json" in err
    bad.write_text("{not json")
    status, _, err = run(str(tmp_path / "s"), "--errors", str(bad))
    assert status == 2 and "is not a test-errors.json" in err


def test_pictures_are_copied_beside_their_page(built):
    text = page(built, "flex_attention")
    for picture in sorted((ROOT / "docs" / "images").glob("flex_mask_*.png")):
        assert f'src="images/{picture.name}"' in text
        assert (built / "images" / picture.name).read_bytes() == picture.read_bytes()
    assert 'src="images/rope_rotation.png"' in page(built, "rope")
    assert "<figcaption>" in text


def test_both_files_side_by_side(built):
    text = {html.unescape(re.sub(r"<[^>]+>", "", line)) for line in page(built, "attention").splitlines()}
    for folder in ("numpy_attn", "torch_attn"):
        for line in (ROOT / folder / "attention.py").read_text().splitlines():
            if line.strip():
                assert line in text, f"{folder}/attention.py: {line!r} missing"


def test_the_page_prose_is_wrapped_by_the_browser(built):
    """Docstring paragraphs are one cell each (wrapped at word boundaries), never one line a cell."""
    text = page(built, "softmax")
    cells = re.findall(r'<td class="code prose">(.*?)</td>', text, flags=re.S)
    assert any("Subtracting the row maximum m" in c and "for log-softmax." in c for c in cells)


# ---------------------------------------------------------------------------------------------
# Writing the folder.

def files(tag):
    return {"index.html": f"index {tag}".encode(), "a.html": f"a {tag}".encode(),
            "images/p.png": f"png {tag}".encode(), site.MARKER: b"marker\n"}


def contents(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_folder_it_did_not_write_is_refused(tmp_path):
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "thesis.txt").write_text("my own words")
    with pytest.raises(ValueError, match="exists and is not a site numpy-attn site wrote"):
        site.write_site(files("new"), mine)
    assert contents(mine) == {"thesis.txt": b"my own words"}
    (tmp_path / "plain-file").write_text("mine")
    with pytest.raises(ValueError, match="exists and is not a site"):
        site.write_site(files("new"), tmp_path / "plain-file")
    assert (tmp_path / "plain-file").read_text() == "mine"
    with pytest.raises(ValueError, match="does not exist"):
        site.write_site(files("new"), tmp_path / "no" / "such")


def test_an_earlier_site_is_replaced_whole(tmp_path):
    out = tmp_path / "site"
    site.write_site(files("old"), out)
    (out / "stale.html").write_bytes(b"from an older version")
    site.write_site(files("new"), out)
    assert contents(out) == {k: v for k, v in files("new").items()}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"], "no folder left beside it"


@pytest.mark.parametrize("signal", [KeyboardInterrupt, SystemExit])
def test_an_interruption_at_any_step_leaves_the_old_site_or_the_new(tmp_path, monkeypatch, signal):
    """Interrupted at each file operation in turn: the user's file beside it is untouched, and the
    folder holds the previous site or the new one, whole."""
    steps, stop = [], {"at": None}

    def interrupting(real):
        def call(*args, **kwargs):
            steps.append(real.__name__)
            if len(steps) == stop["at"]:
                raise signal
            return real(*args, **kwargs)
        return call

    for name, owner in (("replace", site.os), ("new_file", site), ("rmtree", site.shutil)):
        monkeypatch.setattr(owner, name, interrupting(getattr(owner, name)))
    monkeypatch.setattr(Path, "mkdir", interrupting(Path.mkdir))
    out, mine = tmp_path / "site", tmp_path / "mine.txt"
    new_files = {**files("new"), "images/q.png": ROOT / "docs" / "images" / "rope_rotation.png"}
    expected_new = {**files("new"), "images/q.png": new_files["images/q.png"].read_bytes()}
    site.write_site(files("old"), out)
    steps.clear()
    site.write_site(new_files, out)
    total = len(steps)
    assert total >= 8, steps
    for stop_at in range(1, total + 1):
        stop["at"] = None
        site.write_site(files("old"), out)
        mine.write_text("my file")
        steps.clear()
        stop["at"] = stop_at
        with pytest.raises(signal):
            site.write_site(new_files, out)
        stop["at"] = None
        assert mine.read_text() == "my file", f"stopped at step {stop_at}"
        assert contents(out) in (files("old"), expected_new), f"stopped at step {stop_at} ({steps})"
        leftovers = [p for p in tmp_path.iterdir() if p.name not in ("site", "mine.txt")]
        if leftovers:                     # only an interrupted clean-up leaves the old copy
            assert [p.name for p in leftovers] == [f".site.old-{site.os.getpid()}"], leftovers
            assert contents(out) == expected_new and steps[-1] == "rmtree"
            site.shutil.rmtree(leftovers[0])


@pytest.mark.slow
def test_the_suite_writes_the_report_the_site_reads():
    """A run of the suite (here one test of test_softmax.py) writes test-errors.json, whose rows
    name their test file: the softmax page shows them. The checkout's own reports are put back
    afterwards, byte for byte."""
    import os
    import subprocess
    import sys

    reports = {name: (ROOT / name).read_bytes() if (ROOT / name).is_file() else None
               for name in ("test-errors.json", "test-errors.txt")}
    try:
        result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                 "parity_tests/test_softmax.py", "-k", "test_forward_matches_twin"],
                                capture_output=True, text=True, cwd=ROOT, timeout=300,
                                env={**os.environ, "HYPOTHESIS_PROFILE": "default"})
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        rows = site.read_errors(ROOT / "test-errors.json")
    finally:
        for name, content in reports.items():
            if content is None:
                (ROOT / name).unlink(missing_ok=True)
            else:
                (ROOT / name).write_bytes(content)
    assert rows and all(r["test_file"] == "parity_tests/test_softmax.py" for r in rows), rows[:3]
    op = next(o for o in show.operations() if o.name == "softmax")
    assert site.errors_of(op, rows)[0]["name"].startswith(("softmax", "log_softmax"))
