"""Tests of numpy-attn exercise (attn_cli/exercise.py) and of numpy-attn check grading its files: each
exercise runs as is, filled with numpy_attn's own backward it passes, filled with a wrong one the
report names the wrong gradient; unfilled, the report says so. Writing never loses a file of the
user's, interrupted at any file-system call."""

import ast
import contextlib
import inspect
import io
import itertools
import os
import re
import signal
import time

import pytest

from attn_cli import check, cli, exercise
from numpy_attn.testing import OPERATIONS, CheckFailure
from numpy_attn.testing import check as check_op
from parity_tests import interrupt_kit
from parity_tests.interrupt_kit import Interrupter, snapshot

# Each check below draws few inputs: a filled exercise is numpy_attn's own backward, or one with a
# bug that fails on most inputs.
FEW = 10


def numpy_attn(*argv):
    """(exit status, stdout, stderr) of the numpy-attn command."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli.main([str(a) for a in argv])
        except SystemExit as exit_info:                      # argparse's own usage errors
            status = exit_info.code
    return status, out.getvalue(), err.getvalue()


def wrong(report):
    """The names of the outputs and gradients a report says are wrong."""
    return set(re.findall(r"^  wrong: ([\w.]+):", report, flags=re.M))


# -- the exercises ---------------------------------------------------------------------------------

def test_the_ladder_is_of_operations_check_knows():
    assert set(exercise.LADDER) <= set(OPERATIONS)
    assert list(exercise.LADDER) == ["softmax", "linear", "layer_norm", "attention", "multi_head", "flash_attention"]


@pytest.mark.parametrize("op", list(exercise.LADDER))
def test_the_exercise_runs_as_is_and_its_forward_is_numpy_attns(op, tmp_path):
    """The file runs on its own (numpy_attn installed); its forward passes the check; its backward
    raises NotImplementedError; it holds numpy_attn's forward verbatim and the hints of its
    backward's steps; the file is valid for ruff's line length."""
    status, out, err = numpy_attn("exercise", op, tmp_path)
    assert status == 0 and err == "", err
    path = tmp_path / f"{op}.py"
    assert out == f"wrote {path}: fill in {exercise.names(op)[1]}, then run  numpy-attn check {path}\n"
    text = path.read_text()
    forward, backward = OPERATIONS[op].forward, OPERATIONS[op].backward
    assert inspect.getsource(forward) in text
    assert f'OPERATION = "{op}"' in text
    assert max(len(line) for line in text.splitlines()) <= 120
    found_op, mine_forward, _ = check.load_exercise(str(path))
    assert found_op == op
    check_op(op, mine_forward, examples=FEW, framework="numpy")           # the forward alone agrees
    # The hints: one per "Undoes" comment of numpy_attn's backward; the end: NotImplementedError.
    undoes = sum("undoes" in line.lower() and "#" in line for line in inspect.getsource(backward).splitlines())
    skeleton = text.split(f"def {backward.__name__}(", 1)[1].split("\n\n\n", 1)[0]
    assert skeleton.splitlines()[-1].strip() == (f'raise NotImplementedError("write this backward, then grade it: '
                                                 f'numpy-attn check {op}.py")'), skeleton
    assert skeleton.count("# ") - skeleton.count("# To write") >= undoes >= 1, skeleton


# The bugs planted in numpy_attn's own backward: (its text, the wrong text, the gradients named).
BUGS = {
    "softmax": ("dx = y * (dy - (dy * y).sum(axis=axis, keepdims=True))", "dx = y * dy", {"dx"}),   # a term
    "linear": ("dw = xf.reshape(-1, C_in).T @ doutf.reshape(-1, C_out)",                 # a transposed product
               "dw = doutf.reshape(-1, C_out).T @ xf.reshape(-1, C_in)", {"dw"}),
    "layer_norm": ("\n                 - xhat * (dxhat * xhat).mean(axis=axes, keepdims=True))", ")", {"dx"}),
    "attention": (".sum(axis=-3) for d in (dk, dv))", ".sum(axis=-4) for d in (dk, dv))", {"dk", "dv"}),   # axis
    "multi_head": ("dx = dx + dsrc", "dx = dx", {"dx"}),                                  # the k and v paths
    "flash_attention": ("dq[..., i0:i1, :] += scale * (ds @ k[..., j0:j1, :])",          # a factor
                        "dq[..., i0:i1, :] += ds @ k[..., j0:j1, :]", {"dq"}),
}


def fill(path, op, bug=False):
    """Put numpy_attn's own backward of ``op`` (with BUGS[op] planted) in place of the exercise's."""
    backward = OPERATIONS[op].backward
    code = inspect.getsource(backward)
    if bug:
        old, new, _ = BUGS[op]
        assert code.count(old) == 1, old
        code = code.replace(old, new)
    text = path.read_text()
    node, = (n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == backward.__name__)
    lines = text.splitlines()
    lines[node.lineno - 1:node.end_lineno] = code.rstrip("\n").splitlines()
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("op", list(exercise.LADDER))
def test_filled_with_numpy_attns_backward_it_passes_and_with_a_bug_it_fails(op, tmp_path):
    """Every rung: the names the backward needs are in the file (numpy_attn's backward runs there
    unchanged), and a planted bug gives exit status 1 and a report naming the wrong gradient."""
    assert numpy_attn("exercise", op, tmp_path)[0] == 0
    path = tmp_path / f"{op}.py"
    fill(path, op)
    status, out, err = numpy_attn("check", path, "--examples", FEW)
    assert status == 0, out + err
    forward, backward = exercise.names(op)
    assert out == (f"{op}: {path}'s {forward} and {backward} agree with numpy_attn's on {FEW} examples "
                   "(float64, seed 0)\n")
    fill(path, op, bug=True)
    status, out, err = numpy_attn("check", path, "--examples", FEW)
    assert status == 1 and err == "", err
    assert out.startswith(f"{op}: the function under test disagrees with numpy_attn's (float64, seed 0, "
                          f"examples {FEW})"), out
    # The report names the shrunk example's wrong gradients: some of those the bug touches, never others
    # (attention's group sum reaches dk and dv, but where the example has v = 0, dk is 0 either way).
    assert wrong(out) and wrong(out) <= BUGS[op][2], out
    assert "  right: out" in out, out


def test_an_unfilled_backward_is_reported_as_not_written(tmp_path):
    """No traceback: the report says the backward is still to write, and that the forward is right."""
    numpy_attn("exercise", "softmax", tmp_path)
    status, out, err = numpy_attn("check", tmp_path / "softmax.py", "--examples", FEW)
    assert status == 1 and err == "", err
    assert out.startswith("softmax: the backward is not written yet: write it, then check again (float64, seed 0, "
                          f"examples {FEW})"), out
    assert "  failed: the backward is not written yet: softmax_backward raised NotImplementedError" in out, out
    assert "  right: out\n" in out and "Traceback" not in out, out
    # The same through check() itself: a backward of one's own raising NotImplementedError.
    _, forward, backward = check.load_exercise(str(tmp_path / "softmax.py"))
    with pytest.raises(CheckFailure, match="the backward is not written yet"):
        check_op("softmax", forward, backward, examples=FEW)


@pytest.mark.parametrize("argv, message", [
    (["DIR/softmax.py", "--op", "linear"],
     "numpy-attn check: error: DIR/softmax.py is the exercise of softmax, not --op linear: leave --op out"),
    (["DIR/softmax.py", "--backward", "b"],
     "numpy-attn check: error: DIR/softmax.py is an exercise: its backward is softmax_backward; leave --backward "
     "out"),
    (["DIR/mine.py"], "numpy-attn check: error: give the operation FUNCTION implements: --op OP"),
    (["DIR/mine.py", "--op", "softmax"],
     "numpy-attn check: error: expected FILE:FUNCTION, e.g. mine.py:softmax_forward, got 'DIR/mine.py' (or an "
     "exercise file that numpy-attn exercise wrote, alone: it sets OPERATION)"),
    (["DIR/other.py"], "numpy-attn check: error: DIR/other.py sets OPERATION = 'sofmax', not an operation check "
                       "knows: softmax, linear"),
    (["DIR/broken.py"], "numpy-attn check: error: DIR/broken.py could not be run: NameError: name 'undefined' is "
                        "not defined"),
])
def test_grading_bad_files_exits_2_naming_them(tmp_path, argv, message):
    numpy_attn("exercise", "softmax", tmp_path)
    (tmp_path / "mine.py").write_text("def f(x):\n    return x, x\n")
    (tmp_path / "other.py").write_text('OPERATION = "sofmax"\n')
    (tmp_path / "broken.py").write_text('OPERATION = "softmax"\nundefined\n')
    status, out, err = numpy_attn("check", *[a.replace("DIR", str(tmp_path)) for a in argv])
    assert status == 2 and out == "", out
    assert message.replace("DIR", str(tmp_path)) in err, err


# -- the ladder --------------------------------------------------------------------------------------

def test_list_shows_the_ladder_and_what_is_done(tmp_path):
    status, out, _ = numpy_attn("exercise", "--list")
    assert status == 0
    rows = [line.split() for line in out.splitlines()[1:]]
    assert [r[:3] for r in rows] == [[f"{i}.", op, exercise.names(op)[1]] for i, op in enumerate(exercise.LADDER, 1)]
    for op in ("softmax", "linear", "layer_norm"):
        numpy_attn("exercise", op, tmp_path)
    fill(tmp_path / "softmax.py", "softmax")
    fill(tmp_path / "linear.py", "linear", bug=True)
    text = exercise.listing(str(tmp_path), examples=FEW)
    states = {line.split()[1]: line.split(None, 3)[3] for line in text.splitlines()[1:-1]}
    assert states == {"softmax": "done", "linear": "wrong: dw", "layer_norm": "to do: the backward is not written yet",
                      "attention": "not started", "multi_head": "not started", "flash_attention": "not started"}, text
    assert text.splitlines()[-1] == (f"1 of 6 done in {tmp_path}; next: write linear_backward in "
                                     f"{tmp_path}/linear.py, then numpy-attn check {tmp_path}/linear.py")
    (tmp_path / "linear.py").unlink()
    assert exercise.listing(str(tmp_path), examples=FEW).splitlines()[-1] == (
        f"1 of 6 done in {tmp_path}; next: numpy-attn exercise linear {tmp_path}")


@pytest.mark.parametrize("argv, message", [
    (["exercise", "--list", "TMP/none"], "--list TMP/none: no such folder (numpy-attn exercise OP TMP/none writes one "
                                         "there)"),
    (["exercise", "--list", "x", "softmax"], "--list takes no OP ('softmax'): numpy-attn exercise --list [DIR]"),
    (["exercise", "softmax"], "give the operation and the folder: numpy-attn exercise OP DIR, OP one of softmax, "
                              "linear, layer_norm, attention, multi_head, flash_attention (--list shows them)"),
    (["exercise", "sofmax", "TMP"], "OP 'sofmax' is not an exercise: softmax, linear, layer_norm, attention, "
                                    "multi_head, flash_attention"),
    (["exercise", "softmax", "TMP/missing/ex"], "DIR TMP/missing/ex: the folder TMP/missing does not exist: choose "
                                                "another DIR"),
    (["exercise", "softmax", "TMP/file"], "DIR TMP/file is a file, not a folder: choose another DIR"),
    (["exercise", "softmax", "TMP/dangling"], "DIR TMP/dangling is a symlink to TMP/nowhere, which does not exist: "
                                              "choose another DIR"),
    (["exercise", "softmax", "TMP/ex"], "TMP/ex/softmax.py exists (your work?): it is never written over; pass "
                                        "--force to start it again, or choose another DIR"),
    (["exercise", "linear", "TMP/ex", "--force"], "TMP/ex/linear.py is not a file: numpy-attn exercise writes only a "
                                                  "file there; move it away or choose another DIR"),
    (["exercise", "layer_norm", "TMP/ex", "--force"], "TMP/ex/layer_norm.py is a symlink to TMP/gone, which does not "
                                                      "exist: remove the link or choose another DIR"),
])
def test_bad_usage_exits_2_naming_the_path_and_the_fix(tmp_path, argv, message):
    (tmp_path / "file").write_text("a file")
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    (tmp_path / "ex").mkdir()
    (tmp_path / "ex" / "softmax.py").write_text("my work")
    (tmp_path / "ex" / "linear.py").mkdir()
    os.symlink(tmp_path / "gone", tmp_path / "ex" / "layer_norm.py")
    before = snapshot(tmp_path)
    status, out, err = numpy_attn(*[a.replace("TMP", str(tmp_path)) for a in argv])
    assert status == 2 and out == "", out
    assert err == f"numpy-attn exercise: error: {message.replace('TMP', str(tmp_path))}\n", err
    assert snapshot(tmp_path) == before


# -- writing -------------------------------------------------------------------------------------------

def test_force_writes_over_the_exercise_and_nothing_else(tmp_path):
    (tmp_path / "softmax.py").write_text("my work")
    os.chmod(tmp_path / "softmax.py", 0o600)
    (tmp_path / "notes.txt").write_text("mine")
    assert numpy_attn("exercise", "softmax", tmp_path, "--force")[0] == 0
    assert (tmp_path / "softmax.py").read_text() == exercise.source("softmax")
    assert os.stat(tmp_path / "softmax.py").st_mode & 0o777 == 0o600, "the mode of the file it replaced"
    assert sorted(os.listdir(tmp_path)) == ["notes.txt", "softmax.py"]


def test_a_symlinked_dir_stays_a_link_and_a_missing_one_is_made(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink("real", tmp_path / "link")
    assert numpy_attn("exercise", "softmax", tmp_path / "link")[0] == 0
    assert os.readlink(tmp_path / "link") == "real"
    assert (tmp_path / "real" / "softmax.py").read_text() == exercise.source("softmax")
    assert numpy_attn("exercise", "linear", tmp_path / "new")[0] == 0
    assert os.listdir(tmp_path / "new") == ["linear.py"]


def _users_files(folder):
    """Work of the user's beside the exercise: another exercise, files named like the writer's hidden
    ones, a link, a subfolder."""
    folder.mkdir(exist_ok=True)
    (folder / "linear.py").write_text("my linear, half written")
    (folder / ".softmax.py.0123abcd.new").write_text("named like the writer's new file")
    (folder / "notes.txt").write_text("mine")
    os.symlink("notes.txt", folder / "notes-link")
    (folder / "sub").mkdir()
    (folder / "sub" / "softmax.py").write_text("another softmax of mine")


@pytest.mark.parametrize("case", ["new file", "--force", "symlinked DIR", "missing DIR", "no hard links"])
def test_an_interruption_at_every_step_keeps_every_file(tmp_path, monkeypatch, case):
    """KeyboardInterrupt in place of the k-th file-system call of the write, for every k until it
    completes: every file of the user's is as it was, softmax.py is the old one (or absent) or the
    whole exercise, and nothing is left but the hidden file of a cut removal of the writer's own."""
    new = exercise.source("softmax").encode()
    k = 0
    while True:
        k += 1
        base = tmp_path / str(k)
        base.mkdir()
        real = base / "real"
        if case != "missing DIR":
            _users_files(real)
        if case == "--force":
            (real / "softmax.py").write_text("my softmax, half written")
        folder = real
        if case == "symlinked DIR":
            os.symlink("real", base / "link")
            folder = base / "link"
        before = snapshot(base)
        with monkeypatch.context() as m:
            if case == "no hard links":
                m.setattr(os, "link", _no_links)
            interrupter = Interrupter(m, k)
            try:
                exercise.write("softmax", str(folder), force=case == "--force")
                done = True
            except KeyboardInterrupt:
                done = False
        where = f"{case}, interrupted at call {k} ({interrupter.hit and interrupter.hit[0]})"
        after = snapshot(base)
        if case == "missing DIR" and not os.path.exists(real):
            assert after == before, where
        else:
            name = os.path.join("real", "softmax.py")
            got = after.pop(name, ("file", None))[1]
            assert got in (before.get(name, ("file", None))[1], new), f"{where}: softmax.py is a mixture"
            assert got == new or not done, where
            left = {p: v for p, v in after.items() if before.get(p) != v}
            if case == "missing DIR":
                left.pop("real", None)
            if interrupter.hit and interrupter.hit[0] == "unlink" and left:
                # The removal of the writer's own hidden file was cut: that one file may stay.
                assert [os.path.basename(p) for p in left] == [os.path.basename(interrupter.hit[1][0])], where
                left = {}
            assert not left, f"{where}: entries added or changed: {sorted(left)}"
            missing = sorted(set(before) - set(after) - {name})
            assert not missing, f"{where}: the user's entries {missing} are gone"
        if done:
            break
    kinds = {name for name, _ in interrupter.calls}
    assert {"open", "write", "fsync", "close"} <= kinds, kinds
    assert ("replace" if case == "--force" else "link") in kinds or case == "no hard links", kinds
    assert k > 5, f"only {k - 1} file-system calls: the harness does not see the write"


def _sigint_before_call(monkeypatch, k, write):
    """(the call before which SIGINT was sent, None when ``write`` made fewer than k file-system
    calls; whether it ended in KeyboardInterrupt) of ``write()``."""
    with monkeypatch.context() as m:
        interrupter = Interrupter(m, k, act=lambda: os.kill(os.getpid(), signal.SIGINT))
        try:
            write()
            time.sleep(0.1)                              # a signal sent arrives by now at the latest
        except KeyboardInterrupt:
            return interrupter.hit, True
    return interrupter.hit, False


def test_a_signal_during_the_write_is_held_until_it_ends(tmp_path, monkeypatch):
    """A real SIGINT sent before the k-th file-system call of the write (new, then --force over the
    user's file), for every k: the write ends whole, then Ctrl-C acts (KeyboardInterrupt); nothing
    but softmax.py is left beside the user's file."""
    new = exercise.source("softmax").encode()
    with interrupt_kit.default_signals():
        for force in (False, True):
            for k in itertools.count(1):
                folder = tmp_path / f"{force}-{k}"
                folder.mkdir()
                (folder / "notes.txt").write_text("mine")
                if force:
                    (folder / "softmax.py").write_text("my softmax")
                hit, interrupted = _sigint_before_call(
                    monkeypatch, k, lambda folder=folder, force=force: exercise.write("softmax", str(folder), force))
                if hit is None:
                    assert not interrupted and k > 5, k
                    break
                where = f"{'--force, ' if force else ''}SIGINT before call {k} ({hit[0]})"
                assert interrupted, f"{where} was lost"
                assert (folder / "softmax.py").read_bytes() == new, where
                assert sorted(os.listdir(folder)) == ["notes.txt", "softmax.py"], where
                assert (folder / "notes.txt").read_text() == "mine", where


def _no_links(src, dst):
    raise PermissionError(1, "this file system has no hard links")


# -- docs/testing.md ---------------------------------------------------------------------------------

def test_the_pages_exercise_commands_run(tmp_path, monkeypatch):
    """docs/testing.md's Exercises commands, in a fresh folder: each exits as the page says (the
    check of the unfilled exercise with 1 and the report), and the last lists softmax as to do."""
    from pathlib import Path

    page = (Path(exercise.__file__).resolve().parent.parent / "docs" / "testing.md").read_text(encoding="utf-8")
    section = page.split("## Exercises\n", 1)[1].split("\n## ", 1)[0]
    block, = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    commands = [line.split("#", 1)[0].split() for line in block.splitlines()]
    assert [c[:2] for c in commands] == [["numpy-attn", "exercise"]] * 2 + [["numpy-attn", "check"],
                                                                           ["numpy-attn", "exercise"]], commands
    monkeypatch.chdir(tmp_path)
    results = [numpy_attn(*command[1:]) for command in commands]
    assert [status for status, _, _ in results] == [0, 0, 1, 0], results
    assert "the backward is not written yet" in results[2][1]
    assert re.search(r"^  1\. softmax +softmax_backward +to do: the backward is not written yet$", results[3][1],
                     flags=re.M), results[3][1]
