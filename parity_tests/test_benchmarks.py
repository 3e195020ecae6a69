"""Smoke tests of ``python -m benchmarks``: a tiny run end to end, its files, and its errors.

The run is smaller than ``--quick`` (two tiny sizes, softmax, which exists at every commit) so
that it stays well under a minute on a busy two-core machine; it still spawns the real timing
workers, checks parity and writes JSON, CSV, Markdown and a PNG.
"""

import contextlib
import csv
import dataclasses
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch

from benchmarks import _worker, calls, cli, measure, parity, registry, report, workers
from benchmarks.registry import Size
from parity_tests.interrupt_kit import Interrupter, default_signals, snapshot

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--quick", "--ops", "softmax", "--seq-lens", "8", "16", "--batch", "1", "--heads", "2",
        "--head-size", "4", "--repeats", "2", "--min-time", "0.001", "--peak-size", "64",
        "--no-progress"]


def _benchmarks(*args):
    """Run ``python -m benchmarks`` in a subprocess; the CompletedProcess."""
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One tiny run in-process, writing every kind of file: (exit status, stdout, paths)."""
    out = tmp_path_factory.mktemp("bench")
    paths = {kind: out / f"run.{kind}" for kind in ("json", "csv", "md", "png")}
    argv = TINY + ["--json", str(paths["json"]), "--csv", str(paths["csv"]),
                   "--markdown", str(paths["md"]), "--plot", str(paths["png"])]
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        status = cli.main(argv)
    return status, stdout.getvalue(), paths


def test_tiny_run_json_has_every_row_measured_and_checked(tiny_run):
    status, _, paths = tiny_run
    assert status == 0
    results = json.loads(paths["json"].read_text())
    assert {"machine", "versions", "config", "peaks", "workers", "rows", "flops_convention"} <= set(results)
    assert results["config"]["threads"] == 1 and results["config"]["seq_lens"] == [8, 16]
    ok = [r for r in results["rows"] if r["status"] == "ok"]
    measured = {(r["impl"], r["device"], r["mode"], r["T"]) for r in ok}
    assert measured == {(i, "cpu", m, T) for i in ("numpy", "twin", "builtin")
                        for m in ("fwd", "fwd+bwd") for T in (8, 16)}
    for r in ok:
        assert r["parity"]["ok"] and r["parity"]["max_rel_err"] <= r["parity"]["tol"], r
        assert 0 < r["time_s"]["min"] <= r["time_s"]["median"] <= r["time_s"]["max"], r
        assert r["time_s"]["samples"] >= 2, r
        assert r["gflops"] == pytest.approx(r["flops"] / r["time_s"]["median"] / 1e9)
        assert r["peak_fraction"] > 0 and r["numpy_over_this"] > 0
        assert (r["peak_mem_bytes"] > 0) if r["impl"] == "numpy" else r["peak_mem_bytes"] is None
    # softmax counts 5 FLOPs per element forward and 0.8x that for the backward
    row = next(r for r in ok if (r["T"], r["mode"]) == (16, "fwd+bwd"))
    assert row["flops"] == round(5 * 1 * 2 * 16 * 16 * 1.8)
    assert {(p["library"], p["device"]) for p in results["peaks"]} == {("numpy", "cpu"), ("torch", "cpu")}
    assert all(p["gflops"] > 0 for p in results["peaks"])
    numpy_env = next(w for w in results["workers"] if w["library"] == "numpy")
    assert any(p["user_api"] == "blas" and p["num_threads"] == 1 for p in numpy_env["threadpools"])


def test_tiny_run_json_names_its_machine_and_its_peak(tiny_run):
    """The file --json writes holds what --from-json asks of it (CPU, vector extensions, BLAS
    kernel, threads, load), and each peak the matmul shapes it took the fastest of."""
    results = json.loads(tiny_run[2]["json"].read_text())
    assert report.missing_machine_facts(results) == []
    for peak in results["peaks"]:
        assert peak["gflops"] == max(s["gflops"] for s in peak["shapes"]) and len(peak["shapes"]) > 1, peak
    ok = [r for r in results["rows"] if r["status"] == "ok"]
    assert all(r["peak_fraction"] == report.peak_share(r, results["peaks"]) for r in ok)


def test_tiny_run_reports_cuda_rows_instead_of_dropping_them(tiny_run):
    _, stdout, paths = tiny_run
    results = json.loads(paths["json"].read_text())
    cuda = [r for r in results["rows"] if r["device"] == "cuda"]
    if torch.cuda.is_available():
        assert all(r["status"] == "ok" for r in cuda) and cuda
    else:
        assert {(r["impl"], r["status"]) for r in cuda} == {("twin", "not available"),
                                                            ("builtin", "not available")}
        assert "not available: torch.cuda.is_available() is False" in stdout


def test_tiny_run_table_csv_markdown_and_plot(tiny_run):
    _, stdout, paths = tiny_run
    assert "machine:" in stdout and re.search(r"numpy cpu( \(CPUs [\d,]+\))?: BLAS", stdout)
    assert "median ms" in stdout and "softmax" in stdout
    ratio_header = next(line for line in stdout.splitlines() if line.startswith("op ") and "T=8" in line)
    assert ratio_header.split() == ["op", "mode", "vs", "T=8", "T=16"]
    results = json.loads(paths["json"].read_text())
    with open(paths["csv"], newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(results["rows"])
    assert {"op", "T", "impl", "device", "median_s", "gflops", "parity_max_rel_err"} <= set(rows[0])
    numpy_rows = [r for r in rows if r["impl"] == "numpy"]
    assert len(numpy_rows) == 4 and all(float(r["median_s"]) > 0 for r in numpy_rows)
    md = paths["md"].read_text().splitlines()
    assert md[0].startswith("- machine:") and any(line.startswith("| softmax |") for line in md)
    assert "| op | mode | vs | T=8 | T=16 |" in md
    png = paths["png"].read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(paths["png"]).shape
    assert width > 500 and height > 300


# Committed results that lack part of their machine description, and what: nothing in them gives it.
INCOMPLETE = {"cpu-avx2-decode.json": "no BLAS kernel, load"}


@pytest.mark.parametrize("path", sorted((ROOT / "benchmarks" / "results").glob("*.json")),
                         ids=lambda path: path.name)
def test_every_committed_result_renders_again(path, capsys, tmp_path):
    """--from-json reads every kind saved in benchmarks/results (op sweeps, decode, the flash
    breakdown, the former interleaved flash tool) and prints what the run printed then: the
    report beside it in the .txt (or its Markdown), where its format has not changed since."""
    if path.name in INCOMPLETE:                    # saved before its machine was recorded: refused, named
        assert cli.main(["--from-json", str(path)]) == 2
        assert INCOMPLETE[path.name] in capsys.readouterr().err
        return
    assert report.missing_machine_facts(json.loads(path.read_text())) == []
    if not path.with_suffix(".txt").exists():
        assert cli.main(["--from-json", str(path), "--markdown", str(tmp_path / "again.md")]) == 0
        def tables(md):                            # the header lines have grown since
            return [line for line in md.read_text().splitlines() if line.startswith("|")]
        assert tables(tmp_path / "again.md") == tables(path.with_suffix(".md"))
        return
    assert cli.main(["--from-json", str(path)]) == 0
    printed = capsys.readouterr().out.splitlines()
    saved = path.with_suffix(".txt").read_text().splitlines()
    if "breakdown" in path.name:                   # lines of the kernel now, groups of a copy then
        groups = json.loads(path.read_text())["instrumented"]["forward"]["groups"]
        assert all(any(line.strip().startswith(name) for line in printed) for name in groups)
    else:
        if not any(line.startswith("causal speed-up:") for line in saved):   # printed since 2026-12
            block = [i for i, line in enumerate(printed) if line.startswith("causal speed-up:")]
            printed = [line for i, line in enumerate(printed) if not block or not block[0] - 1 <= i <= block[-1]]
        start = saved.index(printed[0])
        assert saved[start:start + len(printed)] == printed


def _worktrees():
    """The folders of the repository's worktrees (their commits move as others commit)."""
    listing = subprocess.run(["git", "worktree", "list", "--porcelain"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout
    return {line for line in listing.splitlines() if line.startswith("worktree ")}


@pytest.mark.slow
def test_interleaved_run_against_a_revision_pairs_every_row(tmp_path, capsys):
    """--interleave: every row gets one sample per round and, against NumPy, a paired ratio;
    --against HEAD times the numpy_attn of a git worktree at HEAD, removed afterwards."""
    before = _worktrees()
    out = tmp_path / "run.json"
    status = cli.main(TINY + ["--seq-lens", "8", "--interleave", "3", "--against", "HEAD",
                              "--json", str(out)])
    assert status == 0
    results = json.loads(out.read_text())
    ok = [r for r in results["rows"] if r["status"] == "ok"]
    assert {(r["impl"], r["revision"], r["mode"]) for r in ok} == {
        (i, rev, m) for i, rev in (("numpy", None), ("numpy", "HEAD"), ("twin", None), ("builtin", None))
        for m in ("fwd", "fwd+bwd")}
    numpy = {r["mode"]: r["time_s"]["rounds"] for r in ok if r["impl"] == "numpy" and not r["revision"]}
    for r in ok:
        rounds = r["time_s"]["rounds"]
        assert len(rounds) == 3 == r["time_s"]["samples"] and min(rounds) > 0, r
        if (r["impl"], r["revision"]) == ("numpy", None):
            continue
        paired = r["numpy_over_this_paired"]
        ratios = sorted(a / b for a, b in zip(numpy[r["mode"]], rounds, strict=True))
        assert paired["median"] == pytest.approx(ratios[1]) and paired["q25"] <= paired["median"] <= paired["q75"]
    revision_env = next(w for w in results["workers"] if w["revision"] == "HEAD")
    here = next(w for w in results["workers"] if w["library"] == "numpy" and not w["revision"])
    assert Path(here["numpy_attn_path"]) == ROOT / "numpy_attn"
    assert Path(revision_env["numpy_attn_path"]) != ROOT / "numpy_attn"     # the worktree's own
    assert not Path(revision_env["numpy_attn_path"]).exists(), "the worktree was not removed"
    assert _worktrees() == before
    assert "numpy@HEAD" in capsys.readouterr().out


def test_causal_speed_up_is_reported_per_implementation():
    """An op timed plain and causal gets a line per implementation and mode: the plain time over
    the causal one, of the medians and paired within rounds; an op without its causal twin none."""
    def row(op, impl, rounds, revision=None):
        return dict(op=op, mode="fwd", T=64, impl=impl, device="cpu", revision=revision, status="ok",
                    time_s=dict(median=sorted(rounds)[1], rounds=rounds))
    results = {"rows": [row("flash_attention", "numpy", [3.0, 6.0, 4.0]),
                        row("flash_attention_causal", "numpy", [2.0, 2.0, 1.0]),
                        row("flash_attention", "numpy", [4.0, 4.0, 4.0], revision="abc"),
                        row("flash_attention_causal", "numpy", [2.0, 2.0, 2.0], revision="abc"),
                        row("softmax", "numpy", [1.0, 1.0, 1.0])]}
    lines = report.causal_speedup_lines(results)
    # medians 4 / 2; paired ratios 1.5, 3, 4: median 3, quartiles 2.25 and 3.5
    assert lines == ["causal speed-up: flash_attention fwd T=64 numpy cpu: causal 2.00x faster than without the "
                     "mask (time without / with 2.00, above 1: causal faster; paired 3.000, IQR 2.250-3.500)",
                     "causal speed-up: flash_attention fwd T=64 numpy@abc cpu: causal 2.00x faster than without the "
                     "mask (time without / with 2.00, above 1: causal faster; paired 2.000, IQR 2.000-2.000)"]


@pytest.mark.parametrize("step", ["worktree add", "after worktree add", "helper", "symlink", "body"])
def test_revision_tree_cleans_up_when_interrupted(monkeypatch, step):
    """Ctrl-C at every step of --against's set-up and while it is used: the worktree is
    unregistered, its folder gone, and the checkout (its files, its status) as it was."""
    before, status = _worktrees(), subprocess.run(["git", "status", "--porcelain"], cwd=ROOT,
                                                  capture_output=True, text=True).stdout
    made = []
    real_mkdtemp, real_run = workers.tempfile.mkdtemp, workers.subprocess.run
    monkeypatch.setattr(workers.tempfile, "mkdtemp", lambda **kw: made.append(real_mkdtemp(**kw)) or made[-1])

    def run(command, **kw):
        if command[:3] == ["git", "worktree", "add"]:
            if step == "worktree add":
                raise KeyboardInterrupt
            result = real_run(command, **kw)
            if step == "after worktree add":
                raise KeyboardInterrupt
            return result
        return real_run(command, **kw)

    monkeypatch.setattr(workers.subprocess, "run", run)
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    if step == "symlink":
        monkeypatch.setattr(Path, "symlink_to", interrupt)
    if step == "helper":                           # HEAD has every helper: lend one regardless
        monkeypatch.setattr(workers, "HARNESS_HELPERS", ("not_there_yet.py",))
        monkeypatch.setattr(workers.shutil, "copyfile", interrupt)
    with pytest.raises(KeyboardInterrupt), workers.revision_tree("HEAD") as folder:
        assert (Path(folder) / "numpy_attn" / "__init__.py").is_file()
        raise KeyboardInterrupt
    assert made and not Path(made[0]).exists()
    assert _worktrees() == before
    assert real_run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout == status


STOP_AT = """
import os, signal, sys
from pathlib import Path
from benchmarks import cli, workers
step, signum = sys.argv[1], getattr(signal, sys.argv[2])

def fire(at):
    if step == at:
        os.kill(os.getpid(), signum)

real_run, real_mkdtemp = workers.subprocess.run, workers.tempfile.mkdtemp
real_symlink, real_worker = Path.symlink_to, workers.Worker.__init__

def run(command, **kw):
    fire(" ".join(command[:3]))                    # "git worktree add", "git worktree remove"
    result = real_run(command, **kw)
    fire("after " + " ".join(command[:3]))
    return result

def mkdtemp(**kw):
    fire("mkdtemp")
    return real_mkdtemp(**kw)

def symlink_to(self, *args, **kw):
    fire("symlink")
    return real_symlink(self, *args, **kw)

def worker(self, job, progress=None, pythonpath=None, label=None):
    real_worker(self, job, progress, pythonpath, label)
    if pythonpath:
        fire("timing")                             # the revision's worker is running

workers.subprocess.run, workers.tempfile.mkdtemp = run, mkdtemp
Path.symlink_to, workers.Worker.__init__ = symlink_to, worker
sys.exit(cli.main(sys.argv[3:]))
"""


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_at_every_step_of_against_cleans_up(tmp_path, signame):
    """The review's case (SIGTERM left a registered worktree and a temporary folder; Ctrl-C a
    traceback): a real run sent the signal at each step of --against, from the temporary folder's
    creation to the worktree's removal. It ends with one line and status 128 + the signal; no
    worktree is registered, no temporary folder or output left, the checkout as it was."""
    signum = getattr(signal, signame)
    before, status = _worktrees(), subprocess.run(["git", "status", "--porcelain"], cwd=ROOT,
                                                  capture_output=True, text=True).stdout
    steps = ["mkdtemp", "git worktree add", "after git worktree add", "symlink", "timing", "git worktree remove"]
    for step in steps:
        tmp = tmp_path / step.replace(" ", "-")
        tmp.mkdir()
        (tmp / "notes.txt").write_text("mine")
        with default_signals():
            result = subprocess.run([sys.executable, "-c", STOP_AT, step, signame, *TINY, "--seq-lens", "8",
                                     "--impls", "numpy", "--against", "HEAD", "--json", str(tmp / "run.json")],
                                    capture_output=True, text=True, cwd=ROOT, timeout=300,
                                    env={**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT)})
        where = f"{signame} at {step}"
        assert result.returncode == 128 + signum, (where, result.returncode, result.stderr[-3000:])
        assert "Traceback" not in result.stderr, (where, result.stderr[-3000:])
        assert result.stderr.splitlines()[-1] == (
            f"python -m benchmarks: stopped by {signame}; nothing is left half-written (temporary "
            "worktree and files removed)"), where
        assert sorted(os.listdir(tmp)) == ["notes.txt"], where
        # Other checkouts of the repository may add and remove worktrees meanwhile: only ours count.
        assert not [w for w in _worktrees() - before if str(tmp) in w], where
    assert subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout == status


@pytest.mark.parametrize("inside", ["another repository", "no repository"])
def test_against_outside_its_own_repository_is_refused(tmp_path, inside):
    """A copy of the project without .git: inside another repository, --against checked out that
    repository's revision; now either is refused in one line, and nothing is registered."""
    outer = tmp_path / "outer"
    outer.mkdir()
    if inside == "another repository":
        git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(outer)]
        subprocess.run([*git, "init", "-q"], check=True)
        (outer / "README").write_text("another project")
        subprocess.run([*git, "add", "README"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", "another project"], check=True)
    copy = outer / "copy"
    for package in ("attn_cli", "benchmarks", "numpy_attn", "torch_attn"):
        shutil.copytree(ROOT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__"))
    result = subprocess.run([sys.executable, "-m", "benchmarks", *TINY, "--against", "HEAD"], cwd=copy,
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(copy), "GIT_CEILING_DIRECTORIES": str(tmp_path)})
    err = _one_line_error(result)
    assert f"--against checks out a revision of this checkout's own git repository, and {copy} is not the top " \
           "of one" in err, err
    assert ("it lies inside the repository at " + str(outer)) in err if inside == "another repository" \
        else "it has no .git" in err
    if inside == "another repository":
        listing = subprocess.run(["git", "-C", str(outer), "worktree", "list"], capture_output=True, text=True)
        assert len(listing.stdout.splitlines()) == 1, listing.stdout


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("kind, write_step", [
    ("json", (json, "dumps")),
    ("csv", (csv.DictWriter, "writerow")),         # after the header: a part of the file written
    ("md", (report, "table_lines")),
])
@pytest.mark.parametrize("step", ["open", "chmod", "write", "os.write", "fsync", "close", "replace", None])
def test_outputs_replace_a_users_file_whole_or_not_at_all(tiny_run, tmp_path, monkeypatch, kind,
                                                          write_step, step):
    """--force over the user's own file, Ctrl-C at every step of the write: the file holds its
    old content or the new one, the user's other files are untouched, no temporary file stays."""
    results = json.loads(tiny_run[2]["json"].read_text())
    write = {"json": report.write_json, "csv": report.write_csv, "md": report.write_markdown}[kind]
    target, other = tmp_path / f"mine.{kind}", tmp_path / "notes.txt"
    target.write_text("the user's old results\n")
    target.chmod(0o640)
    other.write_text("the user's notes\n")
    # The content, then each system call of the writer (attn_cli/checkpoint.py's replace_file).
    patches = {"write": write_step, "os.write": (os, "write"),
               **{name: (os, name) for name in ("open", "chmod", "fsync", "close", "replace")}}
    if step is not None:
        with monkeypatch.context() as m:
            m.setattr(*patches[step], _interrupt)
            with pytest.raises(KeyboardInterrupt):
                write(results, target)
        assert target.read_text() == "the user's old results\n"
    else:
        write(results, target)
        new = target.read_text()
        assert new != "the user's old results\n" and new.endswith("\n")
        if kind == "json":
            assert json.loads(new) == results
        assert target.stat().st_mode & 0o777 == 0o640
    assert other.read_text() == "the user's notes\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, other.name])


def test_the_outputs_folder_holds_the_outputs_only(tiny_run):
    """The writability probes and the temporary files of the writes leave nothing behind."""
    folder = tiny_run[2]["json"].parent
    assert sorted(p.name for p in folder.iterdir()) == ["run.csv", "run.json", "run.md", "run.png"]


def test_from_json_rerenders_without_measuring(tiny_run, tmp_path, capsys):
    _, _, paths = tiny_run
    assert cli.main(["--from-json", str(paths["json"]), "--csv", str(tmp_path / "again.csv")]) == 0
    assert (tmp_path / "again.csv").read_text() == paths["csv"].read_text()
    assert "softmax" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--dtype", "int8"], "invalid choice: 'int8'"),
    (["--seq-lens", "0"], "'0' must be at least 1"),
    (["--device", "tpu"], "invalid choice: 'tpu'"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--csv", "parity_tests/test_benchmarks.py/x.csv"], "cannot create the folder"),   # a file
])
def test_bad_options_fail_with_a_clear_message(args, message):
    result = _benchmarks(*args)
    assert result.returncode == 2, result
    assert message in result.stderr and "usage: python -m benchmarks" in result.stderr


def _one_line_error(result):
    """The stderr of a run refused with exit status 2 in one line, without the usage."""
    assert result.returncode == 2, result
    assert "usage:" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    return result.stderr


def test_unknown_op_is_one_line_naming_every_valid_op():
    """No usage before it, and decode (not an op of the registry) among the choices."""
    err = _one_line_error(_benchmarks("--ops", "nope"))
    assert "unknown op 'nope'; choose from: softmax" in err
    listed = err.split("choose from: ")[1].split(" (")[0].strip().split(", ")
    assert listed == [*registry.OPS, *cli.DECODE_RUNS]


@pytest.mark.parametrize("args, message", [
    (["--ops", "decode", "softmax"], "--ops decode runs alone"),
    (["--ops", "decode", "--interleave", "2"], "--interleave and --against time ops"),
    (["--ops", "softmax", "--against", "no-such-revision"], "--against no-such-revision: not a commit"),
    (["--ops", "decode_mla", "--dtype", "bfloat16"], "--ops decode_mla times float32 and float64 only, not --dtype"),
])
def test_options_that_cannot_go_together_are_one_line(args, message):
    assert message in _one_line_error(_benchmarks(*args))


def test_list_into_a_closed_pipe_exits_0():
    """``--list | head -1``: the reader has gone; like the numpy-attn commands, exit 0, quietly."""
    read_end, write_end = os.pipe()
    os.close(read_end)                             # every write now fails with EPIPE
    try:
        result = subprocess.run([sys.executable, "-m", "benchmarks", "--list"], cwd=ROOT,
                                stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert result.returncode == 0 and result.stderr == "", result.stderr


@pytest.mark.parametrize("content, message", [
    (None, "cannot read --from-json {path}: No such file or directory"),
    ("{not json", "--from-json {path} is not JSON"),
    ('{"rows": "no"}', "--from-json {path} is not a results file of python -m benchmarks --json"),
])
def test_from_json_of_a_file_it_cannot_use_is_one_line(tmp_path, content, message):
    path = tmp_path / "missing.json"
    if content is not None:
        path.write_text(content)
    err = _one_line_error(_benchmarks("--from-json", str(path)))
    assert message.format(path=path) in err


@pytest.mark.parametrize("option", ["--json", "--csv", "--markdown", "--plot"])
def test_unwritable_output_is_refused_before_measuring(monkeypatch, capsys, option):
    """/proc exists and os.access calls it writable for root; nothing can be created there."""
    measured = []
    monkeypatch.setattr(cli, "measure", lambda *a: measured.append(a) or {})
    with pytest.raises(SystemExit) as exit_info:
        cli.main(TINY + [option, "/proc/x.out"])
    assert exit_info.value.code == 2 and measured == []
    assert "cannot write /proc/x.out" in capsys.readouterr().err


def _op_run():
    """A committed op run (it has CSV rows and a Markdown table), to re-render."""
    return next(p for p in sorted((ROOT / "benchmarks" / "results").glob("*.json"))
                if report.is_op_run(json.loads(p.read_text())))


@pytest.mark.parametrize("second", ["same path", "through a link", "through ..", "hard link"])
@pytest.mark.parametrize("first_option, second_option", [("--json", "--markdown"), ("--csv", "--json"),
                                                         ("--markdown", "--csv")])
def test_two_outputs_to_one_file_are_refused(tmp_path, monkeypatch, capsys, first_option, second_option, second):
    """The review's case, --from-json R --json F --markdown F, wrote F twice and lost the JSON:
    refused before anything is written, naming both options; the file there is kept."""
    first = tmp_path / "out" / "F"
    first.parent.mkdir()
    first.write_text("the user's file\n")
    other = {"same path": first, "through a link": tmp_path / "link",
             "through ..": tmp_path / "out" / ".." / "out" / "F", "hard link": tmp_path / "hard"}[second]
    if second == "through a link":
        os.symlink(first, other)
    elif second == "hard link":
        os.link(first, other)
    before = snapshot(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--from-json", str(_op_run()), first_option, str(first), second_option, str(other), "--force"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    named = sorted([f"{first_option} {first}", f"{second_option} {other}"], key=lambda o: err.index(o))
    assert f"error: {named[0]} and {named[1]} are one file: the second would replace the first" in err, err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("option", ["--json", "--markdown", "--csv"])
def test_an_output_over_the_file_from_json_reads_is_refused(tmp_path, capsys, option):
    saved = tmp_path / "run.json"
    saved.write_bytes(_op_run().read_bytes())
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--from-json", str(saved), option, str(saved), "--force"])
    assert exit_info.value.code == 2
    assert f"{option} {saved} is the file --from-json reads" in capsys.readouterr().err
    assert saved.read_bytes() == _op_run().read_bytes()


def test_an_interruption_at_every_step_of_the_outputs_keeps_every_file(tmp_path, monkeypatch, capsys):
    """KeyboardInterrupt instead of the k-th file-system call of --json, --csv and --markdown over
    the user's files, for every k: each holds its old content or its new one whole (each file is
    written alone, one after the other), the saved run read and every other file are kept, and
    nothing is left but the one file whose clean-up was cut."""
    saved = tmp_path / "saved.json"
    saved.write_bytes(_op_run().read_bytes())
    argv = ["--from-json", str(saved), "--force"]
    outs = {"--json": tmp_path / "o" / "run.json", "--csv": tmp_path / "o" / "run.csv",
            "--markdown": tmp_path / "o" / "run.md"}
    outs["--json"].parent.mkdir()
    for option, path in outs.items():
        argv += [option, str(path)]
    assert cli.main(argv) == 0
    new = {option: path.read_bytes() for option, path in outs.items()}
    k = 0
    while True:
        k += 1
        for option, path in outs.items():
            path.write_text(f"the user's old {option}\n")
        (tmp_path / "o" / "notes.txt").write_text("mine")
        before = snapshot(tmp_path)
        with monkeypatch.context() as m:
            interrupter = Interrupter(m, k)
            status = cli.main(argv)            # KeyboardInterrupt: one line, status 130
        assert status in (0, 128 + signal.SIGINT), status
        done = status == 0
        err = capsys.readouterr().err
        assert "Traceback" not in err and ("stopped by SIGINT" in err) != done, err
        where = f"interrupted at call {k} ({interrupter.hit and interrupter.hit[0]})"
        after = snapshot(tmp_path)
        for option, path in outs.items():
            rel = os.path.relpath(path, tmp_path)
            assert after.pop(rel)[1] in (before.pop(rel)[1], new[option]), f"{where}: {option} is a mixture"
        left = {p: v for p, v in after.items() if before.get(p) != v}
        if interrupter.hit and interrupter.hit[0] == "unlink":
            left.pop(os.path.relpath(interrupter.hit[1][0], tmp_path), None)
        assert not left and set(before) <= set(after), f"{where}: {sorted(left)}, {sorted(set(before) - set(after))}"
        if done:
            break
    assert k > 12, f"only {k - 1} calls: the harness does not see the writes"


def test_help_explains_every_option():
    result = _benchmarks("--help")
    assert result.returncode == 0
    for option in ("--ops", "--seq-lens", "--batch", "--heads", "--head-size", "--dtype",
                   "--threads", "--device", "--quick", "--json", "--csv", "--plot", "--repeats"):
        assert option in result.stdout


def _softmax_with_builtin(change):
    """softmax whose built-in output goes through ``change``: a bug parity must catch."""
    op = registry.OPS["softmax"]
    return dataclasses.replace(op, name="broken",
                               call_builtin=lambda t, static: change(op.call_builtin(t, static)))


def _raise(y):
    raise ValueError("cannot run here")


@pytest.mark.parametrize("change, message", [
    (lambda y: y * 1.01, r"builtin cpu out: relative error .* > 1e-04"),
    (lambda y: y.double(), "builtin cpu out is torch.float64, not float32"),   # silent upcast
    (_raise, "builtin cpu raised ValueError: cannot run here"),
])
def test_parity_check_rejects_a_wrong_implementation(change, message):
    op = _softmax_with_builtin(change)
    with pytest.raises(parity.ParityError, match=message):
        parity.check(op, Size(B=1, nh=2, T=8, hs=4), np.float32, 0, [("twin", "cpu"), ("builtin", "cpu")])


def test_parity_failure_exits_1_before_timing(monkeypatch, capsys):
    monkeypatch.setitem(registry.OPS, "broken", _softmax_with_builtin(lambda y: y * 1.01))
    status = cli.main(TINY[:1] + ["--ops", "broken", "--seq-lens", "8", "--no-progress"])
    captured = capsys.readouterr()
    assert status == 1
    assert "parity failed for broken" in captured.err and "median ms" not in captured.out


@pytest.mark.parametrize("name", list(registry.OPS))
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, ml_dtypes.bfloat16])
def test_every_registered_op_passes_parity_at_a_tiny_size(name, dtype):
    """The registry's inputs, grads order and built-in wiring agree with the NumPy pair."""
    op = registry.OPS[name]
    if op.missing("numpy"):
        pytest.skip(op.missing("numpy"))                 # its module has not landed yet
    targets = [(impl, "cpu") for impl in ("twin", "builtin") if not op.missing(impl)]
    results = parity.check(op, Size(B=2, nh=2, T=8, hs=4), dtype, 0, targets)
    assert set(results) == {("numpy", "cpu"), *targets}
    assert all(r["ok"] for r in results.values())


def test_failed_timing_worker_exits_1(monkeypatch, capfd):
    """An op known only to this process passes parity here, then breaks the fresh worker."""
    monkeypatch.setitem(registry.OPS, "only_here", dataclasses.replace(registry.OPS["softmax"], name="only_here"))
    status = cli.main(TINY[:1] + ["--ops", "only_here", "--seq-lens", "8", "--impls", "numpy",
                                  "--no-progress"])
    err = capfd.readouterr().err
    assert status == 1
    assert "KeyError: 'only_here'" in err and "the numpy cpu timing worker failed with exit status 1" in err


def test_op_without_module_is_not_available():
    ghost = dataclasses.replace(registry.OPS["softmax"], name="ghost", stem="no_such_stem")
    assert "No module named 'numpy_attn.no_such_stem'" in ghost.missing("numpy")
    assert registry.OPS["softmax"].missing("twin") is None
    assert "no built-in" in dataclasses.replace(ghost, stem="softmax", call_builtin=None).missing("builtin")


def test_flop_counts_follow_the_stated_convention():
    z = Size(B=4, nh=8, T=512, hs=64)
    attention = registry.OPS["attention"]
    assert attention.count_flops(z, "fwd") == 4 * 4 * 8 * 512 * 512 * 64
    assert attention.count_flops(z, "fwd+bwd") == 3 * attention.count_flops(z, "fwd")
    assert registry.OPS["attention_causal"].count_flops(z, "fwd") == attention.count_flops(z, "fwd") // 2
    assert [op.name for op in registry.select(["attention"])] == ["attention", "attention_causal"]
    C = 8 * 64
    assert registry.OPS["block"].count_flops(z, "fwd") == 24 * 4 * 512 * C * C + 2 * 4 * 512 * 512 * C



def test_linear_attention_rows_count_their_flops_and_hold_what_decoding_holds():
    """The chunked delta rule's prefill counts its padded chunks; a decode step of softmax attention
    reads the T tokens held, the delta rule's step the same (hs, hs) state whatever T."""
    z = Size(B=4, nh=8, T=1000, hs=64)
    steps = 16 * registry.DELTA_CHUNK                         # 1000 steps padded to 16 chunks of 64
    assert registry.OPS["delta_rule"].count_flops(z, "fwd") == 4 * 8 * steps * (8 * 64 * 64 + 6 * 64 * 64)
    assert registry.OPS["decode_step_attention"].count_flops(z, "fwd") == 4 * 4 * 8 * 1000 * 64
    assert registry.OPS["decode_step_delta_rule"].count_flops(z, "fwd") == 7 * 4 * 8 * 64 * 64
    rng = np.random.default_rng(0)
    for T in (8, 32):
        small = Size(B=1, nh=2, T=T, hs=4)
        attention, _ = registry.OPS["decode_step_attention"].inputs(small, np.float32, rng)
        delta, _ = registry.OPS["decode_step_delta_rule"].inputs(small, np.float32, rng)
        assert attention["q"].shape == (1, 2, 1, 4) and attention["k"].shape == attention["v"].shape == (1, 2, T, 4)
        assert {k: a.shape for k, a in delta.items()} == dict(q=(1, 2, 1, 4), k=(1, 2, 1, 4), v=(1, 2, 1, 4),
                                                                g=(1, 2, 1), beta=(1, 2, 1), initial_state=(1, 2, 4, 4))
    prefill, _ = registry.OPS["delta_rule"].inputs(Size(B=2, nh=2, T=16, hs=4), np.float64, rng)
    np.testing.assert_allclose(np.linalg.norm(prefill["k"], axis=-1), 1.0)     # as the models normalise them
    assert (prefill["g"] < 0).all() and ((prefill["beta"] > 0) & (prefill["beta"] < 1)).all()

def test_the_dsa_rows_count_their_flops_and_leave_the_indexer_undifferentiated():
    """mla_dense counts every causal pair, dsa min(t + 1, DSA_TOPK) pairs per query and the
    indexer's q . k over every causal pair; the indexer's parameters are static inputs, so
    no gradient of them is asked of either side (the main loss gives them none)."""
    z = Size(B=1, nh=2, T=200, hs=8)
    config = registry._dsa_config(z)
    projections = registry.OPS["mla_dense"].count_flops(z, "fwd") - 2 * 2 * (200 * 201 // 2) * (8 + 4 + 8)
    assert projections == registry._mla_projection_flops(z) > 0
    kept = 64 * 65 // 2 + (200 - 64) * 64
    assert registry.OPS["dsa"].count_flops(z, "fwd") == (projections + 2 * 2 * kept * (8 + 4 + 8)
                                                          + 2 * 4 * (200 * 201 // 2) * config.index_head_dim)
    diff, static = registry.OPS["dsa"].inputs(Size(B=1, nh=2, T=8, hs=4), np.float64, np.random.default_rng(0))
    assert "indexer" not in diff["params"] and set(static["indexer"]) == {"wq_b", "wk", "k_norm", "weights_proj"}
    forward, backward = registry.OPS["dsa"].numpy_functions()
    out, cache = forward(**diff, **static)
    dx, dparams = backward(np.ones_like(out), cache)
    assert [p for p, _ in calls.leaves(dparams)] == [p for p, _ in calls.leaves(diff["params"])]


@pytest.mark.parametrize("T", [8, 72])
def test_dsa_equals_dense_mla_while_every_key_is_kept(T):
    """Up to DSA_TOPK keys a query keeps them all, so DSA is dense MLA; past it, the rows differ."""
    z = Size(B=1, nh=2, T=T, hs=4)
    diff, static = registry.OPS["dsa"].inputs(z, np.float64, np.random.default_rng(0))
    dense = registry.OPS["mla_dense"].numpy_functions()[0](**diff, **static)[0]
    sparse = registry.OPS["dsa"].numpy_functions()[0](**diff, **static)[0]
    np.testing.assert_array_equal(sparse[:, :registry.DSA_TOPK], dense[:, :registry.DSA_TOPK])
    assert T <= registry.DSA_TOPK or not np.allclose(sparse[:, registry.DSA_TOPK:], dense[:, registry.DSA_TOPK:])


def test_static_parameter_dicts_reach_the_twin_as_tensors_without_grad():
    seen = {}
    op = dataclasses.replace(registry.OPS["softmax"], twin=lambda x, extra: seen.update(extra) or x * 2)
    tensors = calls.to_device({"x": np.ones((1, 1, 2, 2), np.float32)}, "cpu")
    fwd, _ = calls.torch_calls(op, "twin", tensors, {"extra": {"a": {"w": np.ones(3, np.float32)}}}, None)
    fwd()
    assert isinstance(seen["a"]["w"], torch.Tensor) and not seen["a"]["w"].requires_grad


def test_numpy_worker_never_imports_torch():
    """The NumPy timing process must not load torch: its thread pool would disturb the timings."""
    job = dict(library="numpy", device="cpu", threads=1, dtype="float32", seed=0, repeats=2,
               min_time=0.0, warmup=1, modes=["fwd"], peak_n=32, size=dict(B=1, nh=1, hs=4),
               cases=[dict(op="softmax", T=4, impls=["numpy"])])
    code = ("import sys; from benchmarks import _worker; _worker.main(); "
            "sys.stderr.write('torch loaded' if 'torch' in sys.modules else 'torch not loaded')")
    result = subprocess.run([sys.executable, "-c", code], input=json.dumps(job), cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr.endswith("torch not loaded")
    kinds = [json.loads(line.removeprefix("BENCH "))["kind"] for line in result.stdout.splitlines()]
    assert kinds == ["env", "peak", "row"]


def test_worker_whose_parent_stopped_reading_ends_quietly():
    """A timing process whose parent was stopped (its pipe closed) while it ran ends with status 3, as
    when it sees the parent gone, and no traceback reaches the terminal they share."""
    job = dict(library="numpy", device="cpu", threads=1, dtype="float32", seed=0, repeats=2,
               min_time=0.0, warmup=1, modes=["fwd"], peak_n=32, size=dict(B=1, nh=1, hs=4),
               cases=[dict(op="softmax", T=4, impls=["numpy"])])
    read, write = os.pipe()
    os.close(read)                                    # the parent is gone before the first record
    try:
        result = subprocess.run([sys.executable, "-m", "benchmarks._worker"], input=json.dumps(job) + "\n",
                                stdout=write, stderr=subprocess.PIPE, cwd=ROOT, text=True, timeout=60,
                                env={**os.environ, workers.PARENT_VAR: str(os.getpid())})
    finally:
        os.close(write)
    assert result.returncode == 3 and result.stderr == "", (result.returncode, result.stderr)


def test_torch_grads_come_back_in_the_numpy_structure():
    diff = {"x": np.ones((2, 3), np.float32), "params": {"w": np.ones(3, np.float32)}}
    paths = [path for path, _ in calls.leaves(diff)]
    assert paths == ["x", "params.w"]
    assert calls.rebuild(diff, iter([1, 2])) == {"x": 1, "params": {"w": 2}}


def test_missing_measuring_dependency_is_named(monkeypatch, capsys):
    """Installed without the benchmarks extra: a message that says what to install, exit 2."""
    real_find_spec = cli.importlib.util.find_spec
    monkeypatch.setattr(cli.importlib.util, "find_spec",
                        lambda name: None if name == "threadpoolctl" else real_find_spec(name))
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--quick", "--ops", "softmax", "--no-progress"])
    assert exit_info.value.code == 2
    assert "measuring needs threadpoolctl" in capsys.readouterr().err


def test_install_hints_fit_where_the_code_runs(monkeypatch, tmp_path):
    """From a checkout, the pinned editable install; from an installed package (no setup.cfg
    beside it), the published extra, never ``-e .``, which would need a checkout."""
    assert cli.install_hint("benchmarks") == "pip install -c constraints.txt -e '.[benchmarks]'"
    monkeypatch.setattr(cli, "ROOT", tmp_path)
    assert cli.install_hint("benchmarks") == "pip install 'numpy-attn[benchmarks]'"
    real_find_spec = cli.importlib.util.find_spec
    monkeypatch.setattr(cli.importlib.util, "find_spec",
                        lambda name: None if name == "torch" else real_find_spec(name))
    result = io.StringIO()
    with pytest.raises(SystemExit), contextlib.redirect_stderr(result):
        cli.main(["--quick", "--ops", "softmax", "--no-progress"])
    assert "measuring needs torch: pip install 'numpy-attn[benchmarks]'" in result.getvalue()


# -- float16 and bfloat16 ----------------------------------------------------------------------------

LOW = ["float16", "bfloat16"]

# An op outside the registry whose NumPy module computes the low dtypes in float32: the wiring
# (conversions, tolerance, dtype checks) is tested on it whichever registered ops are converted.
SOFTCAP = registry.Op(
    "softcap", stem="softcap", forward="logit_softcap_forward", backward="logit_softcap_backward",
    twin="logit_softcap", builtin="c * torch.tanh(x / c)",
    inputs=lambda z, dtype, rng: ({"x": (3 * rng.standard_normal((z.B, z.T))).astype(dtype)}, {"softcap": 2.0}),
    flops=lambda z: 3 * z.B * z.T, call_builtin=lambda t, s: s["softcap"] * torch.tanh(t["x"] / s["softcap"]))


def test_the_low_precision_tolerance_is_eight_ulps_at_one():
    assert parity.TOLERANCE[np.dtype(np.float16)] == 8 * np.finfo(np.float16).eps
    assert parity.TOLERANCE[calls.dtype_of("bfloat16")] == 8 * float(ml_dtypes.finfo(ml_dtypes.bfloat16).eps)


@pytest.mark.parametrize("dtype", LOW)
def test_low_precision_parity_keeps_the_dtype_on_every_side(dtype):
    results = parity.check(SOFTCAP, Size(B=4, nh=1, T=64, hs=1), calls.dtype_of(dtype), 0,
                           [("twin", "cpu"), ("builtin", "cpu")])
    assert set(results) == {("numpy", "cpu"), ("twin", "cpu"), ("builtin", "cpu")}
    assert all(r["ok"] and r["tol"] == parity.TOLERANCE[calls.dtype_of(dtype)] for r in results.values())
    # torch's three low-precision steps round twice more than ours: not bit for bit, within a few ulps
    assert 0 < results["builtin", "cpu"]["max_rel_err"] <= 4 * results["builtin", "cpu"]["tol"] / 8


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("change, message", [
    (lambda y: y * 1.1, r"builtin cpu out: relative error .* > "),
    (lambda y: y.float(), "builtin cpu out is torch.float32, not {dtype}"),    # a silent upcast
])
def test_low_precision_parity_rejects_a_wrong_implementation(dtype, change, message):
    op = dataclasses.replace(SOFTCAP, call_builtin=lambda t, s: change(SOFTCAP.call_builtin(t, s)))
    with pytest.raises(parity.ParityError, match=message.format(dtype=dtype)):
        parity.check(op, Size(B=4, nh=1, T=64, hs=1), calls.dtype_of(dtype), 0, [("builtin", "cpu")])


def test_a_numpy_op_that_refuses_the_dtype_is_a_parity_failure_not_a_traceback():
    def refuse(x, softcap):
        raise TypeError("x must be float32 or float64, got dtype bfloat16")
    op = dataclasses.replace(SOFTCAP, forward=refuse)
    message = "softcap B=1 nh=1 T=8 hs=1 bfloat16:\n  numpy raised TypeError: x must"
    with pytest.raises(parity.ParityError, match=message):
        parity.check(op, Size(B=1, nh=1, T=8, hs=1), calls.dtype_of("bfloat16"), 0, [("twin", "cpu")])


@pytest.mark.parametrize("dtype", LOW)
def test_the_timing_worker_runs_each_library_in_the_dtype(monkeypatch, dtype):
    """The calls a worker times take and return the low dtype: bfloat16 crosses to torch as its bits."""
    monkeypatch.setitem(registry.OPS, "softcap", SOFTCAP)
    job = dict(device="cpu", dtype=dtype, seed=0, modes=["fwd", "fwd+bwd"], size=dict(B=2, nh=1, hs=1))
    numpy_fns = _worker._prepare(dict(job, library="numpy"), SOFTCAP, 8, ["numpy"])
    out, dx = numpy_fns["numpy", "fwd+bwd"]()
    assert out.dtype.name == dx.dtype.name == dtype
    torch_fns = _worker._prepare(dict(job, library="torch"), SOFTCAP, 8, ["twin", "builtin"])
    for impl in ("twin", "builtin"):
        out, (dx,) = torch_fns[impl, "fwd+bwd"]()
        assert out.dtype == dx.dtype == getattr(torch, dtype), impl
        assert np.array_equal(out.detach().double().numpy(), torch_fns[impl, "fwd"]().detach().double().numpy())
    numpy_peak = measure.matmul_peak("numpy", [(1, 16, 16, 16)], calls.dtype_of(dtype), "cpu", 1, 0.0, 1)
    torch_peak = measure.matmul_peak("torch", [(2, 16, 8, 16)], calls.dtype_of(dtype), "cpu", 1, 0.0, 1)
    assert (numpy_peak["dtype"], torch_peak["dtype"]) == ("float32", dtype)   # what each computes in


@pytest.mark.slow
def test_a_float16_run_says_what_each_library_computes_in(tmp_path):
    path = tmp_path / "run.json"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert cli.main(TINY + ["--seq-lens", "8", "--dtype", "float16", "--json", str(path)]) == 0
    results = json.loads(path.read_text())
    ok = [r for r in results["rows"] if r["status"] == "ok"]
    assert ok and all(r["dtype"] == "float16" and r["parity"]["ok"] for r in ok)
    assert {(p["library"], p["dtype"]) for p in results["peaks"]} == {("numpy", "float32"), ("torch", "float16")}
    assert "float16: numpy_attn casts its inputs to float32" in stdout.getvalue()
