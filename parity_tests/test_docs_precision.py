"""docs/precision.md and its script: the script runs on small sizes without touching the committed
picture, the page names the machine it measured on, its table says for every op what the script
finds (the verdicts of kernels that take another path on another CPU, on the page's machine
only), the baseline and attention rows the small run shares with the page are the page's up to
what another machine's summation order moves, and an interrupted write leaves the old picture whole."""

import hashlib
import math
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import numpy_attn
from parity_tests import conftest

ROOT = Path(numpy_attn.__file__).resolve().parent.parent
SCRIPT = ROOT / "docs" / "precision_measure.py"
PAGE = ROOT / "docs" / "precision.md"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# The script's names, as run by `python docs/precision_measure.py` but without calling main().
measure = SimpleNamespace(**runpy.run_path(str(SCRIPT), run_name="precision_measure"))


def table_rows(text, columns):
    """The rows of every markdown table in ``text`` with ``columns`` cells, header and rule left out."""
    found = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if len(cells) == columns and not set(cells[0]) <= set("-") and cells[0] not in ("op", "dtype"):
            found.append(tuple(cells))
    return found


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("precision")
    mine = folder / "notes.txt"
    mine.write_text("the user's own file\n")
    out, attention = folder / "picture.png", folder / "attention.png"
    command = [sys.executable, str(SCRIPT), "--small", "--out", str(out), "--attention-out", str(attention)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=folder, timeout=600)
    assert done.returncode == 0, done.stderr
    return folder, done.stdout


def test_the_script_writes_only_its_out(small_run):
    folder, _ = small_run
    assert sorted(p.name for p in folder.iterdir()) == ["attention.png", "notes.txt", "picture.png"]
    assert (folder / "notes.txt").read_text() == "the user's own file\n"
    assert (folder / "picture.png").read_bytes().startswith(PNG_SIGNATURE), "--out holds no PNG"
    assert (folder / "attention.png").read_bytes().startswith(PNG_SIGNATURE), "--attention-out holds no PNG"


@pytest.mark.parametrize("option", ["--out", "--attention-out"])
def test_an_out_in_no_folder_is_refused_naming_it(tmp_path, option):
    out = tmp_path / "missing" / "picture.png"
    done = subprocess.run([sys.executable, str(SCRIPT), "--small", option, str(out)], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr
    assert option in done.stderr and str(out) in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def machine_line(text):
    """The line naming the machine measured on (the script's first; the page's above its table)."""
    lines = [line for line in text.splitlines() if line.startswith(measure.MACHINE)]
    assert len(lines) == 1, f"{len(lines)} lines start with {measure.MACHINE!r}"
    return lines[0]


def verdicts(text):
    """{(op, torch call, tensor, dtype): verdict} of the table of verdicts in ``text``; the shares
    themselves move with the sizes."""
    return {row[:4]: row[7] for row in table_rows(text, 8)}


def machine_verdicts(key):
    """The verdicts this row's op may show from one machine to another, its kernel taking another
    path by the CPU (Op.machine_verdicts, which says why); () where every machine shows one."""
    return next(op.machine_verdicts for op in measure.OPS if op.name == key[0])


def test_the_page_names_the_machine_it_measured_on(small_run):
    """Above its table, in the form the script prints it: CPU, vector extensions, torch's CPU
    capability and oneDNN's low-precision arithmetic, NumPy's BLAS kernel."""
    _, printed = small_run
    form = re.compile(r"Measured on: .+ \(.*\); torch \S+, CPU capability \w+, oneDNN arithmetic in "
                      r"float16 (yes|no|unknown), bfloat16 (yes|no|unknown); NumPy \S+, BLAS .+; one thread")
    page = PAGE.read_text(encoding="utf-8")
    for where, line in (("the script's", machine_line(printed)), ("the page's", machine_line(page))):
        assert form.fullmatch(line), f"{where} machine line: {line}"
    assert page.index(machine_line(page)) < page.index("| op | torch | tensor | dtype |"), \
        "the machine line stands above the table of verdicts"


def test_the_pages_verdicts_are_what_the_script_finds(small_run):
    """Every verdict that no machine changes is the script's, on any machine. One of an op whose
    kernel takes another path on another CPU must be among the verdicts that op may show, on both
    sides; whether it is the page's, the next test checks on the page's machine."""
    _, printed = small_run
    found, shown = verdicts(printed), verdicts(PAGE.read_text(encoding="utf-8"))
    assert found, "the script printed no table"
    assert sorted(shown) == sorted(found), "the page's rows are not the ops and tensors the script measures"
    assert any(machine_verdicts(key) for key in found), "no op's verdicts follow the machine: Op.machine_verdicts"
    differ = {key: (shown[key], found[key]) for key in found if not machine_verdicts(key) and shown[key] != found[key]}
    assert not differ, f"page verdict vs the script's at small sizes: {differ}"
    outside = {key: (shown[key], found[key]) for key in found
               if machine_verdicts(key) and not {shown[key], found[key]} <= set(machine_verdicts(key))}
    assert not outside, f"verdicts outside those their op may show on any machine: {outside}"


def test_the_machine_s_verdicts_are_the_pages_on_the_pages_machine(small_run):
    """The verdicts of the ops whose kernels take another path on another CPU (Op.machine_verdicts)
    are the page's where the machine is the page's; on another they may differ, and the skip says how."""
    _, printed = small_run
    found, shown = verdicts(printed), verdicts(PAGE.read_text(encoding="utf-8"))
    differ = {key: (shown[key], found[key]) for key in found if machine_verdicts(key) and shown[key] != found[key]}
    here, there = machine_line(printed), machine_line(PAGE.read_text(encoding="utf-8"))
    if differ and here != there:
        pytest.skip(f"another machine: the page's verdicts were measured on {there!r}, this run on {here!r}; "
                    f"the verdicts that follow the machine and differ (page, here): {differ}")
    assert not differ, f"on the page's own machine ({here}), page verdict vs the script's: {differ}"


def test_the_page_names_the_backend_the_script_finds_by_default(small_run):
    _, printed = small_run
    line = next(line for line in printed.splitlines() if "default on CPU" in line)
    assert line in PAGE.read_text(encoding="utf-8"), f"the page lacks the script's line: {line}"


def test_every_op_is_measured_in_both_dtypes(small_run):
    _, printed = small_run
    rows = table_rows(printed, 8)
    for op in measure.OPS:
        for dtype in measure.LOWP:
            tensors = {row[2] for row in rows if row[0] == op.name and row[3] == dtype}
            wanted = {"out"} | {"d" + name for name in op.grads if name}
            assert tensors == wanted, f"{op.name} in {dtype}: measured {tensors}, wanted {wanted}"


def test_the_pages_baseline_rows_are_the_scripts(small_run):
    """Every row of the small run's baseline table is on the page: op, dtype and T as printed, the
    two errors within one ulp of the dtype at the largest |truth|. Both are max |result - truth| on
    the same rounded inputs, the truth float64; torch's op and float32-then-round compute in float32
    and round to the dtype at the end, and another machine's kernel (another vector width, another
    blocking) moves a float32 result by a few float32 ulps, which flips that rounding by one ulp of
    the dtype where it lies that close to a boundary: the largest error moves by at most one ulp at
    the largest |truth|. (The flash kernel also rounds its probabilities before P @ V; one of them
    flipped the same way moves an output by its ulp times |v|, a flip as rare as the others, and
    none has shown between the machines measured.) The ratio follows the two and is not compared."""
    _, printed = small_run
    found = table_rows(printed, 6)
    section = PAGE.read_text(encoding="utf-8").split("## The baseline of FlashAttention's error rule")[1]
    shown = {row[:3]: row for row in table_rows(section, 6)}
    assert len(found) == 2 * len(measure.LOWP) * len(measure.SMALL_LENGTHS), f"the small run's baseline: {found}"
    largest = {(op, dtype, str(T)): top for op, dtype, T, _, _, top in measure.baseline(measure.SMALL_LENGTHS)}
    for row in found:
        page = shown.get(row[:3])
        assert page is not None, f"the page lacks the baseline row {row}"
        one_ulp = measure.ulp(largest[row[:3]], row[1])
        for column, name in ((3, "torch's error"), (4, "float32 once's error")):
            assert abs(float(page[column]) - float(row[column])) <= one_ulp, \
                f"{name}: page {page} vs the script's {row}, more than one ulp ({one_ulp:.3g}) apart"


def test_the_pages_attention_rows_are_the_scripts(small_run):
    """Every row of the small run's attention table is on the page: dtype, T, max |truth| and its
    ulp as printed; ours and torch's error to within what another machine's kernels can move them.
    Both compute in float32 for all three dtypes, and a kernel that sums a dot product in another
    order (another BLAS kernel for ours, another vector width or blocking for torch's flash kernel)
    changes a float32 result by a few float32 ulps: rounded to float16 or bfloat16 that flips at
    most one rounding by one ulp of the dtype (at most one ulp at max |truth| on the maximum; the
    flash kernel's rounded probabilities as in the baseline test above); unrounded, in float32, the
    P @ V sum over T keys moves by up to about log2(T) ulps."""
    _, printed = small_run
    found = table_rows(printed, 7)
    shown = {row[:2]: row for row in table_rows(PAGE.read_text(encoding="utf-8"), 7)}
    assert len(found) == len(measure.EPS) * len(measure.SMALL_LENGTHS), f"the small run's attention rows: {found}"
    for row in found:
        page = shown.get(row[:2])
        assert page is not None, f"the page lacks the attention row {row}"
        assert page[2:4] == row[2:4], f"page {page} vs the script's {row}"
        dtype, T, one_ulp = row[0], int(row[1]), float(row[3])
        allowed = one_ulp * (math.log2(T) if dtype == "float32" else 1)
        for column, name in ((4, "ours"), (5, "torch's")):
            assert abs(float(page[column]) - float(row[column])) <= allowed, \
                f"{name}: page {page[column]} vs the script's {row[column]} ({dtype}, T = {T})"


def test_the_page_links_the_pictures_and_the_readme_links_the_page():
    linked = re.findall(r"!\[[^\]]+\]\(([^)]+)\)", PAGE.read_text(encoding="utf-8"))
    for name in ("precision_error.png", "precision_attention.png"):
        assert f"images/{name}" in linked, f"the page's images: {linked}"
        assert (PAGE.parent / "images" / name).read_bytes().startswith(PNG_SIGNATURE)
    assert "(docs/precision.md)" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_verdict_follows_the_shares():
    assert measure.verdict(1.0, 0.2) == "float32, rounded once"
    assert measure.verdict(0.3, 1.0) == "each step rounded"
    assert measure.verdict(1.0, 1.0) == "either: float32, rounded once / each step rounded"
    assert measure.verdict(0.5, 0.2, 1.0, "third") == "third"
    assert measure.verdict(0.95, 0.2) == "float32, rounded once (nearly)"
    assert measure.verdict(0.5, 0.6, 0.7, "third") == "none of these"


def test_the_sequential_sum_rounds_every_partial_sum():
    import torch

    # 2048 + 1 + 1 in float16 (spacing 2 above 2048): each 2049 rounds back to 2048 (ties to
    # even), where float32 gives 2050.
    x = torch.tensor([[2048.0, 1.0, 1.0]], dtype=torch.float16)
    assert measure.seq_sum(x).item() == 2048.0, "seq_sum summed in more than float16"
    assert x.float().sum().item() == 2050.0


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("picture", ["error", "attention"])
@pytest.mark.parametrize("step", ["savefig", "replace"])
def test_an_interrupted_write_leaves_the_old_picture_whole(tmp_path, monkeypatch, step, picture):
    old = tmp_path / "precision_error.png"
    old.write_bytes(PNG_SIGNATURE + b"the old picture")
    mine = tmp_path / "notes.txt"
    mine.write_text("the user's own file\n")
    before = digest(old)

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    def interrupt_half_written(fig, file, *args, **kwargs):
        Path(file).write_bytes(PNG_SIGNATURE + b"half a pict")
        raise KeyboardInterrupt

    if step == "savefig":
        from matplotlib.figure import Figure

        monkeypatch.setattr(Figure, "savefig", interrupt_half_written)
    else:
        monkeypatch.setattr(measure.os, "replace", interrupt)
    with pytest.raises(KeyboardInterrupt):
        if picture == "error":
            measure.draw([("attention", "float16", 64, 1e-4, 1e-4), ("softmax", "float16", 64, 1e-4, 1e-4)], old)
        else:
            measure.draw_attention([(dtype, 64, 1.0, eps, eps, eps) for dtype, eps in measure.EPS.items()], old)
    assert digest(old) == before, "the old picture changed"
    assert mine.read_text() == "the user's own file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "precision_error.png"], "a temporary remains"


# -- the table of multiples (docs/precision_table.py) ---------------------------------------------

TABLE_SCRIPT = ROOT / "docs" / "precision_table.py"
table = SimpleNamespace(**runpy.run_path(str(TABLE_SCRIPT), run_name="precision_table"))
OUT_CELL = re.compile(r"\d+\.\d\d( \([a-ce-z][\w.]*\))?|—")        # "out" unnamed, another output by its name
GRAD_CELL = re.compile(r"\d+\.\d\d \(d[\w.]+\)|—")


def committed_table():
    """The rows of the page's section between the markers, header and rule checked."""
    text = PAGE.read_text(encoding="utf-8")
    assert text.count(table.BEGIN) == 1 and text.count(table.END) == 1, "the page's table markers"
    lines = text.split(table.BEGIN)[1].split(table.END)[0].strip().splitlines()
    assert "\n".join(lines[:2]) == table.HEADER, f"the table's header: {lines[:2]}"
    return [[cell.strip() for cell in line.strip().split("|")[1:-1]] for line in lines[2:]]


def test_the_committed_table_is_well_formed():
    rows = committed_table()
    assert rows, "the table has no rows"
    seen = set()
    for row in rows:
        assert len(row) == 6, f"a row of {len(row)} cells: {row}"
        op, dtype, *cells = row
        assert dtype in table.DTYPES, f"{op}: dtype {dtype!r}"
        assert (op, dtype) not in seen, f"{op} {dtype} twice"
        seen.add((op, dtype))
        for cell, pattern in zip(cells, (OUT_CELL, GRAD_CELL) * 2, strict=True):
            assert pattern.fullmatch(cell), f"{op} {dtype}: cell {cell!r}"
        assert any(cell != table.NONE for cell in cells), f"{op} {dtype}: no multiple at all"


# A run of every budget test (CI's, and the script's --run) checks the committed page against its
# records through page_problems; here the check itself, the marker's enforcement and when a run
# counts as one of every budget test.

def records(*rows, test_file="parity_tests/test_softmax.py"):
    return [dict(op=op, tensor=tensor, dtype=dtype, multiple=multiple, test_file=test_file)
            for op, tensor, dtype, multiple in rows]


def test_the_page_must_have_a_row_for_every_recorded_op_and_no_other():
    page = f"mine\n{table.BEGIN}\n{table.HEADER}\n| softmax | float16 | 1.00 | — | — | — |\n" \
           f"| linear | float16 | 1.00 | — | — | — |\n{table.END}\n"
    found = records(("softmax[numpy]", "out", "float16", 1.0), ("softmax[twin]", "dx", "float16", None))
    assert table.page_rows(page) == [("softmax", "float16"), ("linear", "float16")]
    assert table.page_problems(found + records(("linear[twin]", "out", "float16", 0.5)), page) == ""
    assert table.page_problems(found + records(("gelu[tanh][numpy]", "out", "bfloat16", 1.0)), page) == (
        "no row for: gelu[tanh] (bfloat16); rows that no budget test records: linear (float16)")


BUDGET_TESTS = """
import numpy as np
import pytest

from parity_tests.helpers import assert_error_budget

THIRD = np.array([1 / 3])          # float16 rounds it: PyTorch's error, and ours, are one rounding


def check(op):
    assert_error_budget(op, "float16", {"out": (THIRD.astype(np.float16), THIRD.astype(np.float16), THIRD)})


def test_unmarked_calls():
    check("demo[numpy]")


@pytest.mark.error_budget
def test_marked_never_calls():
    pass


@pytest.mark.error_budget
def test_marked_calls_through_a_helper():
    check("demo[twin]")


def test_unmarked_never_calls():
    pass


@pytest.mark.error_budget
@pytest.mark.parametrize("n", [1, 2])
def test_marked_calls_then_fails(n):
    check("demo[numpy]")
    assert n == 1, "its own failure"
"""


def test_a_budget_test_without_the_marker_fails_and_a_marker_without_one_too(tmp_path):
    (tmp_path / "test_budget_demo.py").write_text(BUDGET_TESTS)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
                           "-p", "parity_tests.conftest", "test_budget_demo.py"], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    outcomes = {name: outcome for outcome, name in re.findall(r"^(PASSED|FAILED) test_budget_demo\.py::(\S+)",
                                                              done.stdout, re.M)}
    assert outcomes == {"test_unmarked_calls": "FAILED", "test_marked_never_calls": "FAILED",
                        "test_marked_calls_through_a_helper": "PASSED", "test_unmarked_never_calls": "PASSED",
                        "test_marked_calls_then_fails[1]": "PASSED", "test_marked_calls_then_fails[2]": "FAILED"}, \
        done.stdout + done.stderr
    assert "test_unmarked_calls calls assert_error_budget but lacks @pytest.mark.error_budget" in done.stdout
    assert "test_marked_never_calls has @pytest.mark.error_budget but never called assert_error_budget" \
        in done.stdout
    assert "its own failure" in done.stdout, "a budget test's own failure is reported as it was"
    # Not a run of every budget test (one file of its own): no records written, the page not checked.
    assert not (tmp_path / "test-precision.json").exists()
    assert "docs/precision.md is not" not in done.stdout


def test_only_a_run_of_every_budget_test_counts_as_complete():
    every = set(conftest.TESTS.glob("test_*.py"))
    run = dict(files=every, pending=set(), left_out=[], failed=[])
    assert conftest.every_budget_test_passed(run)
    for change in (dict(files=every - {conftest.TESTS / "test_softmax.py"}), dict(pending={"a budget test not run"}),
                   dict(left_out=["a budget test deselected"]), dict(failed=["a budget test that failed"])):
        assert not conftest.every_budget_test_passed({**run, **change}), change


def test_the_table_takes_the_forward_and_the_largest_gradient():
    found = records(("softmax[numpy]", "out", "float16", 0.5), ("softmax[numpy]", "dx", "float16", 1.25),
                    ("softmax[numpy]", "dw", "float16", 1.5), ("softmax[twin]", "out", "float16", 1.0),
                    ("softmax[twin]", "lse", "float16", 1.5), ("softmax[twin]", "dx", "float16", None),
                    ("softmax[numpy]", "dx", "bfloat16", 0.75), ("softmax[twin]", "dx", "bfloat16", 2.5))
    lines = table.render(found).splitlines()
    assert lines[:2] == table.HEADER.splitlines()
    assert lines[2:] == ["| softmax | float16 | 0.50 | 1.50 (dw) | 1.50 (lse) | — |",
                         "| softmax | bfloat16 | — | 0.75 (dx) | — | 2.50 (dx) |"]
    with pytest.raises(table.TableError, match=r"no records for: linear \(bfloat16\)"):
        table.render(found + records(("linear[numpy]", "out", "float16", 1.0)))
    with pytest.raises(table.TableError, match=r"PyTorch's error was 0 in every case of: erf \(bfloat16\)"):
        table.render(found + records(("erf[numpy]", "out", "float16", 1.0), ("erf[twin]", "out", "bfloat16", None)))


def test_a_label_names_the_op_and_the_implementation():
    assert table.split_label("gelu[tanh][twin]") == ("gelu[tanh]", "twin")
    assert table.split_label("softmax[numpy] dtype=") == ("softmax dtype=", "numpy")
    assert table.split_label("flash_attention[kernel]") == ("flash_attention[kernel]", "numpy")


def test_the_rows_follow_the_reading_order_of_the_test_files():
    """numpy_attn/__init__.py's order of the files that checked the ops (test_decode.py, of no
    op's stem, after them), then the names; an op checked in two files goes where it comes first."""
    both = [("out", "float16", 1.0), ("out", "bfloat16", 1.0)]

    def checked(op, test_file):
        return records(*[(op, *row) for row in both], test_file=f"parity_tests/{test_file}")
    found = (checked("gpt decode", "test_decode.py") + checked("multi_head[numpy]", "test_multi_head.py")
             + checked("softmax", "test_softmax.py") + checked("log_softmax[twin]", "test_softmax.py")
             + checked("gelu[tanh]", "test_gelu.py") + checked("softmax", "test_decode.py")
             + checked("embedding", "test_embedding.py"))
    assert table.ops_in_order(found) == ["embedding", "log_softmax", "softmax", "multi_head", "gelu[tanh]",
                                         "gpt decode"]
    assert [line.split(" | ")[0] for line in table.render(found).splitlines()[2::2]] == [
        "| embedding", "| log_softmax", "| softmax", "| multi_head", "| gelu[tanh]", "| gpt decode"]


def test_only_the_section_between_the_markers_changes():
    page = f"# title\n\nbefore\n{table.BEGIN}\nold rows\n{table.END}\nafter\n"
    assert table.replace_section(page, "NEW") == f"# title\n\nbefore\n{table.BEGIN}\nNEW\n{table.END}\nafter\n"
    for broken in (page.replace(table.END, ""), page + table.BEGIN, f"{table.END}\n{table.BEGIN}\n"):
        with pytest.raises(table.TableError, match="must hold"):
            table.replace_section(broken, "NEW")


def test_a_missing_or_bad_record_file_leaves_the_page_as_it_was(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"mine\n{table.BEGIN}\nold\n{table.END}\n")
    bad = tmp_path / "bad.json"
    bad.write_text('[{"op": "softcap[numpy]"}]')
    for json_file, message in ((tmp_path / "none.json", "cannot read"), (bad, "is not a list of")):
        done = subprocess.run([sys.executable, str(TABLE_SCRIPT), "--json", str(json_file), "--page", str(page)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 1 and message in done.stderr and str(json_file) in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert page.read_text() == f"mine\n{table.BEGIN}\nold\n{table.END}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "page.md"]


@pytest.mark.parametrize("step", ["write", "replace"])
def test_an_interrupted_table_write_leaves_the_old_page_whole(tmp_path, monkeypatch, step):
    page = tmp_path / "precision.md"
    page.write_text("the old page\n")
    mine = tmp_path / "notes.txt"
    mine.write_text("the user's own file\n")

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    if step == "write":
        real_fdopen = table.os.fdopen

        class HalfWritten:
            def __init__(self, *args, **kwargs):
                self.file = real_fdopen(*args, **kwargs)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.file.close()

            def write(self, text):
                self.file.write(text[:5])
                raise KeyboardInterrupt
        monkeypatch.setattr(table.os, "fdopen", HalfWritten)
    else:
        monkeypatch.setattr(table.os, "replace", interrupt)
    with pytest.raises(KeyboardInterrupt):
        table.write_page(page, "the new page\n")
    assert page.read_text() == "the old page\n", "the old page changed"
    assert mine.read_text() == "the user's own file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "precision.md"], "a temporary remains"
