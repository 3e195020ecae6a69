"""The notebooks run as a user gets them: notebooks/*.py (jupytext's percent format, the kept
source) turned into .ipynb by the README's jupytext command, then executed in a Jupyter kernel of
this environment. The walkthrough prints the numbers numpy-attn walkthrough prints; the exercises,
their backwards left to write, print each rung's report and go on, and filled with numpy_attn's own
backwards say that each holds."""

import contextlib
import inspect
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import nbclient
import nbformat
import pytest

from attn_cli import cli, exercise, walkthrough
from numpy_attn.testing import NOT_WRITTEN, OPERATIONS
from parity_tests.helpers import heatmap_cells, needs_vocab

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
KERNEL = "numpy-attn-tests"


@pytest.fixture(scope="module")
def notebooks(tmp_path_factory):
    """{stem: path of the .ipynb} made by the README's command from copies of the sources, and a
    kernel spec that starts this interpreter (not whichever python a machine's own spec names)."""
    folder = tmp_path_factory.mktemp("notebooks")
    sources = []
    for path in sorted(NOTEBOOKS.glob("*.py")):
        sources.append(folder / path.name)
        sources[-1].write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    subprocess.run([sys.executable, "-m", "jupytext", "--to", "ipynb", *map(str, sources)], check=True,
                   capture_output=True, timeout=120)
    spec = folder / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "numpy-attn tests", "language": "python"}))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JUPYTER_PATH", str(folder / "jupyter"))
        # The kernels' connection files and IPython's profile, here rather than in the home folder.
        patch.setenv("JUPYTER_RUNTIME_DIR", str(folder / "runtime"))
        patch.setenv("IPYTHONDIR", str(folder / "ipython"))
        yield {path.stem: path.with_suffix(".ipynb") for path in sources}


def execute(nb, folder):
    """Run every cell of ``nb`` in a fresh kernel, in ``folder``; a cell that raises fails the test."""
    nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=300,
                            resources={"metadata": {"path": str(folder)}}).execute()
    return nb


def printed(cell):
    """What a code cell printed (its stdout)."""
    return "".join(o["text"] for o in cell.get("outputs", []) if o["output_type"] == "stream" and o["name"] == "stdout")


def test_the_sources_are_the_notebooks():
    assert sorted(p.name for p in NOTEBOOKS.iterdir()) == ["exercises.py", "walkthrough.py"]
    for path in NOTEBOOKS.iterdir():
        assert path.read_text(encoding="utf-8").startswith("# %% [markdown]\n# # "), path


# -- the walkthrough --------------------------------------------------------------------------------

def tables(text):
    """[(title, rows of numbers)] of the tables ``text`` prints as numpy-attn walkthrough does: a title
    with its shape (on the next line when the title is long), an "undoes" line or none, the column
    labels, then each row's label and numbers."""
    lines, found, i = text.splitlines(), [], 0
    while i < len(lines):
        inline = re.match(r"  (\S.*?)  shape \(", lines[i])
        below = i + 1 < len(lines) and re.match(r"  \S", lines[i]) and lines[i + 1].startswith("    shape (")
        if not inline and not below:
            i += 1
            continue
        title, i = (inline.group(1), i + 1) if inline else (lines[i].strip(), i + 2)
        while lines[i].startswith("    undoes "):
            i += 1
        rows, i = [], i + 1                                   # past the column labels
        while i < len(lines) and lines[i].startswith("    ") and lines[i].strip():
            rows.append([float(cell) for cell in lines[i].split()[1:]])
            i += 1
        found.append((title, rows))
    return found


def decoding_rows(text):
    """Step 8's rows: (t, token, cache length, bytes, max |out_t - row t of step 7's out|)."""
    return [(int(t), token, int(length), int(size), float(diff)) for t, token, length, size, diff in
            re.findall(r"^ +(\d+) +(\S+) +(\d+) +(\d+) +(\d\.\d\de[-+]\d+)$", text, flags=re.M)]


@needs_vocab
@pytest.mark.parametrize("options", [[], ["--example", "source"]], ids=["default", "source"])
def test_the_walkthrough_prints_the_numbers_of_the_command(notebooks, tmp_path, options):
    """Every table of numpy-attn walkthrough's NumPy side, in its order, with the same numbers
    (both computed here, on this machine, by the same operations), the loss and the decoding rows;
    a heatmap for each of the command's figures. The options go in the notebook's OPTIONS: the
    source example has no positions and heads of one channel."""
    nb = nbformat.read(notebooks["walkthrough"], as_version=4)
    setup = next(cell for cell in nb.cells if "\nOPTIONS = []" in cell.source)
    setup.source = setup.source.replace("\nOPTIONS = []", f"\nOPTIONS = {options!r}")
    text = "".join(printed(cell) for cell in execute(nb, tmp_path).cells)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["walkthrough", *options, "--no-torch", "--color", "never"]) == 0
    command = out.getvalue()
    mine, theirs = tables(text), tables(command)
    assert [title for title, _ in mine] == [title for title, _ in theirs]
    for (title, rows), (_, expected) in zip(mine, theirs, strict=True):
        assert rows == expected and rows, title
    loss = re.compile(r"L = sum\(context \* G\) = (\S+)")
    assert float(loss.search(text).group(1)) == float(loss.search(command).group(1))
    assert decoding_rows(text) == decoding_rows(command) and len(decoding_rows(text)) == 6
    # The heatmaps: hoverable SVG, one per panel of each of the command's figures; each cell's
    # title says the value the tables print (step 5's weights checked number for number), and
    # the causal steps' masked cells are exactly those above the diagonal.
    svgs = [o["data"]["text/html"] for cell in nb.cells for o in cell.get("outputs", [])
            if "<svg" in o.get("data", {}).get("text/html", "")]
    steps = [re.search(r"<title>(Step \d)", svg).group(1) for svg in svgs]
    assert sorted(set(steps)) == [f"Step {n}" for n in (4, 5, 6, 7, 9)] and len(walkthrough.PLOT_FILES) == 5
    weights = dict(mine)["weights = softmax(scaled scores)"]
    T = len(weights)
    for step, svg in zip(steps, svgs, strict=True):
        cells = heatmap_cells(svg)
        assert len(cells) == T * T, step
        masked = [[cells[i * T + j][3] for j in range(T)] for i in range(T)]
        causal = step in ("Step 6", "Step 7")
        assert masked == [[causal and j > i for j in range(T)] for i in range(T)], step
        if step == "Step 5":
            assert [[float(c[2]) for c in cells[i * T:(i + 1) * T]] for i in range(T)] == \
                [row[:T] for row in weights], "step 5's hover values are not the weights the table prints"


def test_the_table_reader_reads_both_layouts():
    text = ("  a title  shape (2, 1)\n            c0\n    x   1.0000\n    y  -inf\n\n"
            "  a title too long for one line\n    shape (1, 2), showing [0]\n    undoes y = f(x)\n"
            "           c0      c1\n    x  0.5000  2.0000\n  prose\n")
    assert tables(text) == [("a title", [[1.0], [float("-inf")]]), ("a title too long for one line", [[0.5, 2.0]])]


# -- the exercises ----------------------------------------------------------------------------------

def rungs(nb):
    """[(the backward's cell, its grading cell)] of the exercises notebook, in its order."""
    cells = nb.cells
    return [(cell, cells[i + 1]) for i, cell in enumerate(cells) if "backward" in cell.metadata.get("tags", [])]


def test_each_rung_is_the_exercise_of_its_operation(notebooks):
    """The ladder's operations in its order; each backward to write is numpy-attn exercise's (so it
    follows numpy_attn's as the exercise files do), graded against numpy_attn's forward."""
    nb = nbformat.read(notebooks["exercises"], as_version=4)
    found = rungs(nb)
    assert len(found) == len(exercise.LADDER)
    for op, (backward, grading) in zip(exercise.LADDER, found, strict=True):
        assert backward.source == exercise.backward_cell(op).rstrip("\n"), (
            f"the {op} cell differs from exercise.backward_cell({op!r}): put that in notebooks/exercises.py")
        forward, name = exercise.names(op)
        assert grading.source == f'grade("{op}", {forward}, {name})'


@needs_vocab
def test_unwritten_each_grading_prints_its_report_and_the_notebook_goes_on(notebooks, tmp_path):
    nb = execute(nbformat.read(notebooks["exercises"], as_version=4), tmp_path)
    for op, (_, grading) in zip(exercise.LADDER, rungs(nb), strict=True):
        report = printed(grading)
        assert report.startswith(f"{op}: {NOT_WRITTEN}: write it, then check again (float64, seed 0, examples 50)\n"
                                 ), report
        assert "smallest failing input found" in report and "reproduce: check(" in report, report


@needs_vocab
def test_filled_with_numpy_attns_backwards_each_grading_says_it_holds(notebooks, tmp_path):
    """Each cell's imports kept, its function replaced by numpy_attn's backward: the names it needs
    are there, and each rung agrees. Graded again at the end, the first rung's name is numpy_attn's
    own softmax_backward, which attention's cell imports: the grading says so, not that it agrees."""
    nb = nbformat.read(notebooks["exercises"], as_version=4)
    for op, (backward, _) in zip(exercise.LADDER, rungs(nb), strict=True):
        imports, sep, _ = backward.source.partition("\n\n\ndef ")
        assert sep, backward.source
        backward.source = f"{imports}\n\n\n{inspect.getsource(OPERATIONS[op].backward)}"
    again = nbformat.v4.new_code_cell(rungs(nb)[0][1].source)
    nb.cells.append(again)
    execute(nb, tmp_path)
    for op, (_, grading) in zip(exercise.LADDER, rungs(nb), strict=True):
        name = exercise.names(op)[1]
        assert printed(grading) == f"{op}: {name} agrees with numpy_attn's on 50 examples (float64, seed 0)\n"
    assert printed(again).startswith("softmax: softmax_backward is numpy_attn's own, imported by a later "), again


def test_the_sources_leave_no_notebook_beside_them():
    """The .ipynb made beside the sources are the user's (the exercises hold their work): git leaves
    them out."""
    ignored = subprocess.run(["git", "check-ignore", "-q", "notebooks/exercises.ipynb"], cwd=NOTEBOOKS.parent,
                             capture_output=True)
    if ignored.returncode == 128:
        pytest.skip("not a git checkout")
    assert ignored.returncode == 0, ".gitignore does not leave notebooks/*.ipynb out"
