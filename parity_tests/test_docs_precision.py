"""docs/precision.md and its script: the script runs on small sizes without touching the committed
picture, the page's table says for every op what the script finds, the baseline rows the small
run shares with the page are the page's, and an interrupted write leaves the old picture whole."""

import hashlib
import re
import runpy
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import numpy_attn

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
        if len(cells) == columns and not set(cells[0]) <= set("-") and cells[0] != "op":
            found.append(tuple(cells))
    return found


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("precision")
    mine = folder / "notes.txt"
    mine.write_text("the user's own file\n")
    out = folder / "picture.png"
    done = subprocess.run([sys.executable, str(SCRIPT), "--small", "--out", str(out)], capture_output=True,
                          text=True, cwd=folder, timeout=600)
    assert done.returncode == 0, done.stderr
    return folder, done.stdout


def test_the_script_writes_only_its_out(small_run):
    folder, _ = small_run
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt", "picture.png"]
    assert (folder / "notes.txt").read_text() == "the user's own file\n"
    assert (folder / "picture.png").read_bytes().startswith(PNG_SIGNATURE), "--out holds no PNG"


def test_an_out_in_no_folder_is_refused_naming_it(tmp_path):
    out = tmp_path / "missing" / "picture.png"
    done = subprocess.run([sys.executable, str(SCRIPT), "--small", "--out", str(out)], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "--out" in done.stderr and str(out) in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_pages_verdicts_are_what_the_script_finds(small_run):
    _, printed = small_run
    # op, torch call, tensor, dtype -> verdict; the shares themselves move with the sizes.
    found = {row[:4]: row[7] for row in table_rows(printed, 8)}
    shown = {row[:4]: row[7] for row in table_rows(PAGE.read_text(encoding="utf-8"), 8)}
    assert found, "the script printed no table"
    assert sorted(shown) == sorted(found), "the page's rows are not the ops and tensors the script measures"
    differ = {key: (shown[key], found[key]) for key in found if shown[key] != found[key]}
    assert not differ, f"page verdict vs the script's at small sizes: {differ}"


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
    _, printed = small_run
    found = table_rows(printed, 6)
    shown = set(table_rows(PAGE.read_text(encoding="utf-8"), 6))
    assert len(found) == 2 * len(measure.LOWP) * len(measure.SMALL_LENGTHS), f"the small run's baseline: {found}"
    missing = [row for row in found if row not in shown]
    assert not missing, f"baseline rows the small run prints and the page lacks: {missing}"


def test_the_page_links_the_picture_and_the_readme_links_the_page():
    linked = re.findall(r"!\[[^\]]+\]\(([^)]+)\)", PAGE.read_text(encoding="utf-8"))
    assert "images/precision_error.png" in linked, f"the page's images: {linked}"
    assert (PAGE.parent / "images" / "precision_error.png").read_bytes().startswith(PNG_SIGNATURE)
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


@pytest.mark.parametrize("step", ["savefig", "replace"])
def test_an_interrupted_write_leaves_the_old_picture_whole(tmp_path, monkeypatch, step):
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
    found = [("attention", "float16", 64, 1e-4, 1e-4), ("softmax", "float16", 64, 1e-4, 1e-4)]
    with pytest.raises(KeyboardInterrupt):
        measure.draw(found, old)
    assert digest(old) == before, "the old picture changed"
    assert mine.read_text() == "the user's own file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "precision_error.png"], "a temporary remains"
