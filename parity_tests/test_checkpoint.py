"""Tests for attn_cli/checkpoint.py: a run's files are written into the user's --out folder all or
none, whatever is interrupted when, and nothing else there is ever touched; checkpoints are read
from their headers, and sizes checked, before anything is allocated.

The guarantee tested (the module docstring states it): after an exception or a signal at any
file-system call of a save, model.npz, config.json and loss.png hold the whole old run or the whole
new one, and every other entry under the folders involved is as it was, by content, mode and link
target; --out stays the folder (or the symlink) it was.
"""

import dataclasses
import io
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_cli import checkpoint, cli
from numpy_attn._tree import flatten
from numpy_attn.gpt import GPTConfig, init_gpt_params
from parity_tests import interrupt_kit
from parity_tests.interrupt_kit import Interrupter
from parity_tests.interrupt_kit import snapshot as _snapshot

ROOT = Path(__file__).resolve().parent.parent
CONFIG = GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=4)
RUN_FILES = ("model.npz", "config.json", "loss.png")


@pytest.fixture
def ctrl_c_raises():
    """SIGINT raises KeyboardInterrupt for one test, and in the commands it starts (the kit says why)."""
    with interrupt_kit.default_signals():
        yield


def _run(seed, plot=b"plot", steps=1):
    """(arguments of save_checkpoint, plot function, {name: bytes} they write) of a tiny model
    drawn from ``seed``; ``plot`` the bytes of loss.png (None: no plot)."""
    params = init_gpt_params(CONFIG, np.random.default_rng(seed), np.float32)
    draw = None if plot is None else (lambda file: file.write(plot))
    args = (params, CONFIG, np.arange(5) * 7, np.float32, {"steps": steps})
    return args, draw, checkpoint.run_files(*args, plot=draw)


def _save(out, seed, force=True, plot=b"plot", steps=1):
    """save_checkpoint of ``_run(seed, plot, steps)`` into ``out``; the files it writes."""
    args, draw, files = _run(seed, plot, steps)
    checkpoint.save_checkpoint(str(out), *args, force=force, plot=draw)
    return files


def _users_files(folder):
    """Files of the user's beside a run: one named like a run file in a subfolder, one named like
    the save's own hidden files, a link, an empty folder."""
    (folder / "notes.txt").write_text("mine")
    (folder / "sub").mkdir()
    (folder / "sub" / "model.npz").write_bytes(b"the user's own model.npz")
    (folder / "sub" / "config.json").write_text('{"mine": true}')
    (folder / "model.npz.bak").write_bytes(b"a backup of the user's")
    (folder / ".model.npz.0123abcd.new").write_bytes(b"named like a new file of the save")
    (folder / ".config.json.0123abcd.old").write_bytes(b"named like a kept file of the save")
    (folder / ".run.lock").write_text("named like the old lock file")
    (folder / "empty").mkdir()
    os.symlink("notes.txt", folder / "notes-link")


def _check_after(out, before, old, new, where, hit):
    """Every entry but the run files as in ``before``; the run files exactly ``old`` or ``new``
    ({name: bytes}); nothing else, but the hidden file of an interrupted unlink of the save's."""
    after = _snapshot(out)
    run = {n: after.pop(n)[1] for n in RUN_FILES if n in after}
    assert run == old or run == new, f"{where}: the run files are a mixture {sorted(run)}"
    left = {p: v for p, v in after.items() if before.get(p) != v}
    if hit is not None and hit[0] == "unlink" and left:
        # Cleanup of the save's own hidden file was cut: that one file may stay behind.
        assert list(left) == [os.path.basename(hit[1][0])], f"{where}: {sorted(left)}"
        del after[list(left)[0]]
        left = {}
    assert not left, f"{where}: entries added or changed: {sorted(left)}"
    missing = sorted(set(before) - set(after) - set(RUN_FILES))
    assert not missing, f"{where}: the user's entries {missing} are gone"


@pytest.mark.parametrize("case", ["run folder", "symlinked --out", "--out .", "first run", "no hard links",
                                  "new run has no plot"])
def test_an_interruption_at_every_step_keeps_every_file(tmp_path, monkeypatch, case):
    """KeyboardInterrupt instead of the k-th file-system call of a save, for every k until a save
    completes: the user's files are untouched, and the run is the old one or the new one whole."""
    k = 0
    while True:
        k += 1
        base = tmp_path / str(k)
        real = base / "store" / "real"
        real.parents[0].mkdir(parents=True)
        real.mkdir()
        _users_files(real)
        (base / "store" / "beside.txt").write_text("beside the run folder")
        old = {} if case == "first run" else _save(real, seed=1, plot=b"old plot")
        out = {"symlinked --out": base / "link", "--out .": "."}.get(case, real)
        if case == "symlinked --out":
            os.symlink(real, base / "link")
        before = _snapshot(base)
        before_out = _snapshot(real)
        for name in RUN_FILES:
            before_out.pop(name, None)
        mode = os.stat(real).st_mode
        args, draw, new = _run(seed=2, plot=None if case == "new run has no plot" else b"new plot", steps=2)
        with monkeypatch.context() as m:
            m.chdir(real)
            if case == "no hard links":
                m.setattr(os, "link", _no_links)
            interrupter = Interrupter(m, k)
            try:
                checkpoint.save_checkpoint(str(out), *args, force=True, plot=draw)
                done = True
            except KeyboardInterrupt:
                done = False
            assert os.path.samefile(os.getcwd(), real), "the working folder is still --out"
        where = f"{case}, interrupted at call {k} ({interrupter.hit and interrupter.hit[0]})"
        _check_after(real, before_out, old, new, where, interrupter.hit)
        assert os.stat(real).st_mode == mode, f"{where}: the mode of --out changed"
        outside = {p: v for p, v in _snapshot(base).items() if not p.startswith(os.path.join("store", "real"))}
        assert outside == {p: v for p, v in before.items() if not p.startswith(os.path.join("store", "real"))}, \
            f"{where}: something beside --out changed"
        if not done:
            _save(real, seed=3)                        # and the next save works
            assert checkpoint.load_checkpoint(str(real))[1] == CONFIG
            assert (real / "notes.txt").read_text() == "mine"
        if done:
            break
    kinds = {name for name, _ in interrupter.calls}
    assert {"open", "write", "fsync", "replace", "close"} <= kinds, kinds
    assert ("link" in kinds or case in ("first run", "no hard links")), kinds
    assert k > 15, f"only {k - 1} file-system calls: the harness does not see the save"


def test_an_interruption_at_every_step_into_a_missing_out(tmp_path, monkeypatch):
    """A missing --out is created for the run: after an interruption at any call k it is gone
    again (an empty folder only where its own rmdir was the call cut) or holds the whole run."""
    k = 0
    while True:
        k += 1
        out = tmp_path / str(k) / "run"
        out.parent.mkdir()
        (out.parent / "beside.txt").write_text("beside the run folder")
        args, draw, new = _run(seed=2)
        with monkeypatch.context() as m:
            interrupter = Interrupter(m, k)
            try:
                checkpoint.save_checkpoint(str(out), *args, plot=draw)
                done = True
            except KeyboardInterrupt:
                done = False
        where = f"interrupted at call {k} ({interrupter.hit and interrupter.hit[0]})"
        assert (out.parent / "beside.txt").read_text() == "beside the run folder", where
        assert sorted(os.listdir(out.parent)) in (["beside.txt"], ["beside.txt", "run"]), where
        if out.exists():
            _check_after(out, {}, {} if interrupter.hit and interrupter.hit[0] == "rmdir" else None, new,
                         where, interrupter.hit)
        if done:
            break
    assert ("mkdir", (str(out),)) in interrupter.calls and k > 15, interrupter.calls


def _no_links(src, dst):
    raise PermissionError(1, "this file system has no hard links")


def test_ctrl_c_just_after_the_new_run_is_moved_in(tmp_path, monkeypatch):
    """The issue's case: the first rename into --out goes through, the next call is interrupted;
    the old run and the user's files are all there (the earlier writer deleted them all)."""
    out = tmp_path / "run"
    out.mkdir()
    old = _save(out, seed=1, force=False)
    for i in range(20):
        (out / f"user{i}.txt").write_text(f"file {i}")
    before = _snapshot(out)
    moved = []
    real_rename, real_replace = os.rename, os.replace

    def once(real):
        def call(a, b, **kw):
            moved.append(b)
            if len(moved) == 2:                         # the call after the first move
                raise KeyboardInterrupt("Ctrl-C")
            return real(a, b, **kw)
        return call

    monkeypatch.setattr(os, "rename", once(real_rename))
    monkeypatch.setattr(os, "replace", once(real_replace))
    with pytest.raises(KeyboardInterrupt):
        _save(out, seed=2)
    monkeypatch.undo()
    assert moved, "nothing was moved in"
    _check_after(out, {p: v for p, v in before.items() if p not in RUN_FILES}, old, None, "Ctrl-C", None)
    assert {n: (out / n).read_bytes() for n in RUN_FILES} == old, "the old run is back whole"


def test_a_signal_during_the_save_is_held_until_it_ends(tmp_path, monkeypatch, ctrl_c_raises):
    """A real SIGINT, and SIGTERM with train's handler, sent before the k-th file-system call of a
    save, for every k: once the save has begun it ends whole, and the signal then acts (Ctrl-C
    raises KeyboardInterrupt, SIGTERM SystemExit); before, the old run stays."""
    real_kill = os.kill
    for signum, exc in ((signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, SystemExit)):
        k, held = 0, []
        while True:
            k += 1
            out = tmp_path / f"{signum}-{k}"
            out.mkdir()
            _users_files(out)
            old = _save(out, seed=1)
            args, draw, new = _run(seed=2, steps=2)
            raised = None
            with monkeypatch.context() as m, checkpoint.termination_raises():
                unheld = signal.getsignal(signum)

                def send(held=held, signum=signum, unheld=unheld):
                    held.append(signal.getsignal(signum) != unheld)
                    real_kill(os.getpid(), signum)

                interrupter = Interrupter(m, k, act=send)
                try:
                    checkpoint.save_checkpoint(str(out), *args, force=True, plot=draw)
                    time.sleep(0.1)                     # a signal sent arrives by now at the latest
                except exc as err:
                    raised = err
            if interrupter.hit is None:                 # the save made fewer than k calls
                assert raised is None
                break
            where = f"signal {signum} before call {k} ({interrupter.hit[0]})"
            assert raised is not None, f"{where} was lost"
            run = {n: (out / n).read_bytes() for n in RUN_FILES}
            assert run == new if held[-1] else run in (old, new), where
            assert (out / "notes.txt").read_text() == "mine", where
        # Held from the first file written to the last rename: unheld are only the checks and the
        # lock before (three calls) and the lock's release after (one).
        pattern = "".join("h" if h else "-" for h in held)
        assert k > 15 and re.fullmatch("-{0,3}h+-?", pattern), pattern


# -- the folder --out names ---------------------------------------------------------------------

def test_out_dot_keeps_the_current_folder(tmp_path, monkeypatch, capsys):
    """`cd proj && numpy-attn train --out .` writes into proj; the folder is never replaced."""
    proj = tmp_path / "proj"
    proj.mkdir()
    os.chmod(proj, 0o755)
    _users_files(proj)
    (proj / "corpus.txt").write_text("The cat sat on the mat. The dog sat on the log. " * 20)
    monkeypatch.chdir(proj)
    ino = os.stat(".").st_ino
    before = _snapshot(proj)
    argv = ["train", "--text", "corpus.txt", "--out", ".", "--steps", "2", "--batch-size", "2",
            "--block-size", "8", "--n-layer", "1", "--n-head", "2", "--n-embd", "8"]
    assert cli.main(argv) == 2, "a folder of other files needs --force"
    assert "holding other files" in capsys.readouterr().err
    assert _snapshot(proj) == before
    assert cli.main([*argv, "--force"]) == 0, capsys.readouterr().err
    assert os.stat(os.getcwd()).st_ino == ino, "the current folder was replaced"
    assert stat.S_IMODE(os.stat(proj).st_mode) == 0o755
    after = _snapshot(proj)
    assert {p: v for p, v in after.items() if p not in RUN_FILES} == before, "a user's file changed"
    assert checkpoint.load_checkpoint(".")[1].n_embd == 8


def test_an_existing_folder_is_written_into_not_replaced(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    os.chmod(out, 0o750)
    ino = os.stat(out).st_ino
    _save(out, seed=1, force=False)                     # an empty folder needs no --force
    _save(out, seed=2)
    assert os.stat(out).st_ino == ino and stat.S_IMODE(os.stat(out).st_mode) == 0o750
    assert sorted(os.listdir(tmp_path)) == ["run"], "nothing is left beside --out (no lock file)"


def test_a_symlinked_out_stays_a_link(tmp_path):
    real = tmp_path / "store" / "real"
    real.mkdir(parents=True)
    _save(real, seed=1)
    (real / "other.txt").write_text("kept")
    os.symlink(real, tmp_path / "link")
    new = _save(tmp_path / "link", seed=2)
    assert os.path.islink(tmp_path / "link") and os.readlink(tmp_path / "link") == str(real)
    assert sorted(os.listdir(tmp_path)) == ["link", "store"], "a dangling .link.new-* is left"
    assert (real / "other.txt").read_text() == "kept"
    assert {n: (real / n).read_bytes() for n in RUN_FILES} == new


def test_a_missing_out_is_created_with_the_umask_and_removed_if_nothing_was_written(tmp_path):
    old = os.umask(0o022)
    try:
        with checkpoint.writer_lock(str(tmp_path / "new")):
            assert stat.S_IMODE(os.stat(tmp_path / "new").st_mode) == 0o755
        assert not (tmp_path / "new").exists(), "an empty folder this run made is removed"
        with checkpoint.writer_lock(str(tmp_path / "new")):
            (tmp_path / "new" / "mine.txt").write_text("put there while it ran")
        assert (tmp_path / "new" / "mine.txt").read_text() == "put there while it ran"
    finally:
        os.umask(old)


@pytest.mark.parametrize("make, force, message", [
    (lambda d: (d / "config.json").write_text('{"model_type": "gpt2"}'), True, "no config.json of numpy-attn train"),
    (lambda d: (d / "model.npz").write_bytes(b"the user's"), True, "no config.json of numpy-attn train"),
    (lambda d: (d / "loss.png").write_bytes(b"the user's"), True, "no config.json of numpy-attn train"),
    (lambda d: (d / "config.json").mkdir(), True, "config.json, which is not a regular file"),
    (lambda d: os.symlink("elsewhere.npz", d / "model.npz"), True, "model.npz, which is not a regular file"),
    (lambda d: (d / "notes.txt").write_text("x"), False, "is a folder holding other files (1, such as 'notes.txt')"),
])
def test_a_folder_of_the_users_is_refused(tmp_path, make, force, message):
    """A file of a run's name that no run wrote is never replaced, even with --force; a folder of
    other files needs --force. Nothing is written either way."""
    out = tmp_path / "out"
    out.mkdir()
    make(out)
    before = _snapshot(tmp_path)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _save(out, seed=1, force=force)
    assert _snapshot(tmp_path) == before


def test_a_dangling_symlink_out_is_refused(tmp_path):
    os.symlink(tmp_path / "gone", tmp_path / "link")
    with pytest.raises(ValueError, match="is a symlink to .*gone, which does not exist"):
        _save(tmp_path / "link", seed=1)
    assert sorted(os.listdir(tmp_path)) == ["link"]


# -- interrupting a real `numpy-attn train` -------------------------------------------------------

@pytest.mark.parametrize("signum, status", [(signal.SIGINT, -signal.SIGINT),     # KeyboardInterrupt
                                            (signal.SIGTERM, 128 + signal.SIGTERM)])  # SystemExit
def test_a_signal_to_train_keeps_the_old_run_and_leaves_nothing(tmp_path, signum, status, ctrl_c_raises):
    out = tmp_path / "run"
    out.mkdir()
    old = _save(out, seed=1)
    _users_files(out)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The cat sat on the mat. The dog sat on the log. " * 40, encoding="utf-8")
    before = _snapshot(tmp_path)
    proc = subprocess.Popen([sys.executable, "-u", "-m", "attn_cli.cli", "train", "--text", str(corpus),
                             "--out", str(out), "--force", "--steps", "100000", "--batch-size", "2",
                             "--block-size", "8", "--n-layer", "1", "--n-head", "2", "--n-embd", "8"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout.readline().startswith("corpus"), proc.stderr.read()
    proc.send_signal(signum)
    proc.wait(timeout=120)
    assert proc.returncode == status, (proc.returncode, proc.stderr.read())
    assert {n: (out / n).read_bytes() for n in RUN_FILES} == old
    assert _snapshot(tmp_path) == before, "an entry was added, changed or removed"


def test_sigterm_removes_the_folder_the_run_created(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The cat sat on the mat. The dog sat on the log. " * 40, encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-u", "-m", "attn_cli.cli", "train", "--text", str(corpus),
                             "--out", str(tmp_path / "new"), "--steps", "100000", "--batch-size", "2",
                             "--block-size", "8", "--n-layer", "1", "--n-head", "2", "--n-embd", "8"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout.readline().startswith("corpus"), proc.stderr.read()
    assert (tmp_path / "new").is_dir(), "--out is made (and locked) while it trains"
    proc.terminate()
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM, proc.stderr.read()
    assert sorted(os.listdir(tmp_path)) == ["corpus.txt"]


# -- reading --------------------------------------------------------------------------------------

@settings(max_examples=30, deadline=None)
@given(n_layer=st.integers(0, 3), n_kv=st.integers(1, 3), groups=st.integers(1, 2), hs=st.integers(1, 3),
       bias=st.booleans(), tie=st.booleans(), learned=st.booleans(), dtype=st.sampled_from(["float32", "float64"]))
def test_expected_arrays_are_init_gpt_params_shapes(n_layer, n_kv, groups, hs, bias, tie, learned, dtype):
    nh = n_kv * groups
    config = GPTConfig(vocab_size=7, block_size=5, n_layer=n_layer, n_head=nh, n_kv_head=n_kv,
                       n_embd=nh * hs, bias=bias, tie_weights=tie,
                       positions="learned" if learned else "sinusoidal")
    params = flatten(init_gpt_params(config, np.random.default_rng(0), np.dtype(dtype)))
    expected = checkpoint._expected_arrays(config, np.dtype(dtype))
    assert expected.pop("vocab") == ((7,), np.dtype(np.int64))
    assert expected == {k: (v.shape, v.dtype) for k, v in params.items()}


def _claim(folder, **gpt):
    """A run folder whose config.json claims the sizes ``gpt`` over the tiny model's model.npz."""
    _save(folder, seed=1)
    meta = json.loads((folder / "config.json").read_text())
    meta["gpt"].update(gpt)
    (folder / "config.json").write_text(json.dumps(meta))


def test_a_config_claiming_a_large_model_is_refused_before_allocating(tmp_path):
    """2 blocks of width 1024 (100 MB of weights) over a 10 kB model.npz: refused from the sizes,
    while less than 1 MB is allocated (the earlier reader drew the whole model to learn its shapes)."""
    _claim(tmp_path, n_layer=2, n_embd=1024, n_head=8)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"model.npz is damaged or not this run's: it is [\d,]+ bytes, "
                                             r"and .* describes [\d,]+ bytes of arrays \(2 blocks of width 1024"):
            checkpoint.load_checkpoint(str(tmp_path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak} bytes allocated"


def test_the_largest_config_is_refused_within_a_small_address_space(tmp_path):
    """The issue's case, 64 blocks of width 4096 (51 GB), read under a 2 GiB address-space limit."""
    pytest.importorskip("resource")
    _claim(tmp_path, n_layer=64, n_embd=4096, n_head=64)
    code = ("import resource, sys\nresource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
            "from attn_cli import checkpoint\n"
            "try:\n    checkpoint.load_checkpoint(sys.argv[1])\nexcept ValueError as err:\n    print(err)\n")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                            timeout=120, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1"))
    assert "64 blocks of width 4096" in result.stdout, (result.stdout, result.stderr[-2000:])


def _rewrite_member(npz, name, data, compress=zipfile.ZIP_STORED):
    """Replace the member ``name`` of the zip ``npz`` by ``data``."""
    with zipfile.ZipFile(npz) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    members[name] = data
    with zipfile.ZipFile(npz, "w", compress) as z:
        for member, content in members.items():
            z.writestr(member, content)


@pytest.mark.parametrize("how, message", [
    ("header claims more than its data", r"claims shape \(5, 4\) float32 \(80 bytes\) but holds 8 bytes"),
    ("compressed member", "is compressed"),
    ("another run's model.npz", "is damaged or from another run"),
])
def test_model_npz_is_checked_against_its_headers_and_config(tmp_path, how, message):
    _save(tmp_path, seed=1)
    npz = tmp_path / "model.npz"
    if how == "header claims more than its data":
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (5, 4)})
        _rewrite_member(npz, "wte.npy", header.getvalue() + b"\0" * 8)        # 8 of its 80 bytes
    elif how == "compressed member":
        with zipfile.ZipFile(npz) as z:
            members = {i.filename: z.read(i) for i in z.infolist()}
        with zipfile.ZipFile(npz, "w", zipfile.ZIP_DEFLATED) as z:
            for member, content in members.items():
                z.writestr(member, content)
    else:
        other = tmp_path / "other"
        other.mkdir()
        _save(other, seed=2)
        npz.write_bytes((other / "model.npz").read_bytes())
    with pytest.raises(ValueError, match=message):
        checkpoint.load_checkpoint(str(tmp_path))


_WRONG = {"int": ["4", 1.5, True, None], "float": ["0.1", True, float("nan"), None], "bool": [1, "true", None],
          "str": [3, None], "int | None": ["4", 1.5]}


@pytest.mark.parametrize("field, value", [(f.name, v) for f in dataclasses.fields(GPTConfig)
                                          for v in _WRONG[getattr(f.type, "__name__", str(f.type))]])
def test_every_config_field_of_the_wrong_kind_is_named(tmp_path, field, value):
    """Each GPTConfig field (a new one included: _WRONG must then say what is wrong for its type)
    given a value of the wrong kind in config.json: a ValueError naming gpt.<field>, never a
    traceback (n_kv_head's "int | None" type made the message itself fail)."""
    _claim(tmp_path, **{field: value})
    with pytest.raises(ValueError, match=rf"config.json: gpt.{field} must be [A-Za-z |]+, got "):
        checkpoint.load_checkpoint(str(tmp_path))


def test_a_model_npz_far_larger_than_its_config_is_refused_unread(tmp_path, monkeypatch):
    """A model.npz a megabyte longer than the arrays of config.json plus their headers: refused
    from the sizes alone, before its zip directory is parsed."""
    _save(tmp_path, seed=1)
    with open(tmp_path / "model.npz", "ab") as f:
        f.write(b"\0" * (1 << 20))
    monkeypatch.setattr(zipfile, "ZipFile", None)          # any parse would raise TypeError
    with pytest.raises(ValueError, match=r"model.npz is damaged or not this run's: it is 1,0[\d,]+ bytes"):
        checkpoint.load_checkpoint(str(tmp_path))
