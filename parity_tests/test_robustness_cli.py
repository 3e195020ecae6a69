"""The commands fail early and clearly: closed pipes, control characters, plain-text plot labels,
numeric options out of range, outputs checked before work and never overwritten without --force,
checkpoints written whole and read safely, benchmark workers that die with their parent."""

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from attn_cli import checkpoint, cli
from numpy_attn.gpt import GPTConfig, init_gpt_params
from parity_tests.helpers import needs_vocab

ROOT = Path(__file__).resolve().parent.parent


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(list(argv))
    return status, out.getvalue(), err.getvalue()


# -- closed pipes and terminal text ---------------------------------------------------------------

@needs_vocab
def test_a_closed_pipe_exits_quietly():
    """`numpy-attn walkthrough | head -1`: the reader leaves, the command ends with status 0."""
    proc = subprocess.Popen([sys.executable, "-m", "attn_cli.cli", "walkthrough", "--no-torch"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, err
    assert first.startswith("numpy-attn walkthrough of")
    assert err == "", err


@needs_vocab
def test_control_characters_are_shown_escaped():
    status, out, err = run("walkthrough", "red \x1b[31mtext\x07 here", "--no-torch", "--color", "never")
    assert status == 0, err
    assert "\x1b" not in out and "\x07" not in out, "a control character reached the terminal"
    assert "\\x1b" in out


@needs_vocab
def test_token_labels_are_plain_text_in_plots(tmp_path):
    status, out, err = run("walkthrough", "pay $$ now", "--no-torch", "--plot", str(tmp_path))
    assert status == 0, err
    assert (tmp_path / "step5_qkv.png").stat().st_size > 1000


@needs_vocab
def test_walkthrough_plot_is_not_overwritten_without_force(tmp_path):
    assert run("walkthrough", "--no-torch", "--plot", str(tmp_path))[0] == 0
    before = (tmp_path / "step4_weight_free.png").stat().st_mtime_ns
    status, out, err = run("walkthrough", "--no-torch", "--plot", str(tmp_path))
    assert status == 2 and "pass --force" in err and out == "", err
    assert (tmp_path / "step4_weight_free.png").stat().st_mtime_ns == before
    assert run("walkthrough", "--no-torch", "--plot", str(tmp_path), "--force")[0] == 0


# -- numeric options --------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["train", "--steps", "0"], "--steps must be at least 1, got 0"),
    (["train", "--batch-size", "0"], "--batch-size must be at least 1, got 0"),
    (["train", "--seed", "-1"], "--seed must be at least 0, got -1"),
    (["train", "--block-size", "0"], "--block-size must be at least 1"),
    (["train", "--n-head", "3"], "--n-embd 32 is not divisible by --n-head 3"),
    (["train", "--dropout", "1"], "--dropout must lie in [0, 1)"),
    (["train", "--lr", "nan"], "--lr must be a finite number >= 0"),
    (["train", "--threads", "0"], "--threads must be at least 1"),
    (["generate", "--prompt", "x", "--seed", "-1"], "--seed must be at least 0"),
    (["generate", "--prompt", "x", "--top-k", "0"], "--top-k must be at least 1"),
    (["generate", "--prompt", "x", "--temperature", "-1"], "--temperature must be a finite number"),
    (["walkthrough", "--seed", "-1", "--no-torch"], "--seed must be at least 0, got -1"),
])
def test_numeric_options_are_checked_by_name(argv, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                     # generate's default run folder is absent
    status, out, err = run(*argv, *(["--out", str(tmp_path / "run")] if argv[0] == "train" else []))
    assert status == 2, (out, err)
    assert message in err, err
    assert not (tmp_path / "run").exists(), "nothing is written for a refused run"


def test_train_refuses_an_out_that_is_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    status, _, err = run("train", "--out", str(tmp_path / "f"))
    assert status == 2 and "is a file, not a folder" in err, err


def test_generate_without_a_run_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, _, err = run("generate", "--prompt", "The")
    assert status == 2 and "run numpy-attn train first" in err, err


def test_generate_names_a_checkpoint_that_does_not_exist(tmp_path):
    status, _, err = run("generate", "--checkpoint", str(tmp_path / "nowhere"), "--prompt", "The")
    assert status == 2, err
    assert f"--checkpoint {tmp_path / 'nowhere'}: no such folder" in err, err


@pytest.mark.slow
@needs_vocab
def test_the_help_examples_of_generate_print_words(tmp_path, monkeypatch):
    """Each train-checkpoint example of ``generate --help``, run on a default ``numpy-attn train``
    run, continues its prompt with words (greedy decoding of that model printed a line of
    spaces): at least three runs of two or more letters after the prompt."""
    import re
    import shlex

    from attn_cli import generate

    monkeypatch.chdir(tmp_path)
    assert run("train")[0] == 0, "the default training run failed"
    # An example is the command, then (after two or more spaces) what it shows.
    examples = [shlex.split(re.split(r"\s{2,}", line.strip())[0])[1:] for line in generate.EXAMPLES.splitlines()
                if line.strip().startswith("numpy-attn generate") and "--hf" not in line]
    assert len(examples) >= 2, generate.EXAMPLES
    for argv in examples:
        argv = [checkpoint.DEFAULT_OUT if a == "my-run" else a for a in argv]
        status, out, err = run(*argv)
        prompt = argv[argv.index("--prompt") + 1]
        assert status == 0 and out.startswith(prompt), (argv, out, err)
        words = re.findall(r"[A-Za-z]{2,}", out[len(prompt):])
        assert len(words) >= 3, f"numpy-attn {' '.join(argv)} printed {out!r}"


# -- checkpoints ------------------------------------------------------------------------------------

def _small_run(folder, **overrides):
    config = GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=4)
    params = init_gpt_params(config, np.random.default_rng(0), np.float32)
    for key, value in overrides.items():
        params[key] = value
    checkpoint.save_checkpoint(str(folder), params, config, np.arange(5) * 7, np.float32,
                               {"steps": 1})
    return params


def test_checkpoint_round_trip_and_refusal(tmp_path):
    params = _small_run(tmp_path / "run")
    loaded, config, vocab = checkpoint.load_checkpoint(str(tmp_path / "run"))
    np.testing.assert_array_equal(loaded["wte"], params["wte"], err_msg="wte")
    with pytest.raises(ValueError, match="pass --force"):
        _small_run(tmp_path / "run")
    assert sorted(os.listdir(tmp_path)) == [".run.lock", "run"] or sorted(os.listdir(tmp_path)) == ["run"], \
        "no temporary folder is left beside the run"


def test_a_crash_while_writing_leaves_the_old_run_whole(tmp_path, monkeypatch):
    old = _small_run(tmp_path / "run")
    before = {f: (tmp_path / "run" / f).read_bytes() for f in ("model.npz", "config.json")}

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed while writing")

    monkeypatch.setattr(checkpoint, "move_into_place", crash)
    config = GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=4)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_checkpoint(str(tmp_path / "run"), init_gpt_params(config, np.random.default_rng(1)),
                                   config, np.arange(5), np.float32, {}, force=True)
    after = {f: (tmp_path / "run" / f).read_bytes() for f in ("model.npz", "config.json")}
    assert after == before, "the old run was touched"
    assert [p for p in os.listdir(tmp_path) if ".new-" in p] == [], "the half-written run is removed"
    np.testing.assert_array_equal(checkpoint.load_checkpoint(str(tmp_path / "run"))[0]["wte"], old["wte"])


def test_a_second_writer_is_refused(tmp_path):
    with checkpoint.writer_lock(str(tmp_path / "run")):
        code = ("import sys\nfrom attn_cli import checkpoint\n"
                "try:\n    with checkpoint.writer_lock(sys.argv[1]): print('got the lock')\n"
                "except ValueError as err: print(err)\n")
        result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")],
                                capture_output=True, text=True, timeout=60)
    assert "another numpy-attn train is writing" in result.stdout, result


def _damage(folder, how):
    npz, cfg = folder / "model.npz", folder / "config.json"
    if how == "truncated":
        npz.write_bytes(npz.read_bytes()[: npz.stat().st_size // 2])
    elif how == "empty":
        npz.write_bytes(b"")
    elif how == "flipped":
        data = bytearray(npz.read_bytes())
        with zipfile.ZipFile(npz) as z:
            info = z.getinfo("wte.npy")
        data[info.header_offset + 30 + len(info.filename) + 140] ^= 0xFF   # inside the array data
        npz.write_bytes(bytes(data))
    elif how == "not json":
        cfg.write_text("{ not json")
    elif how == "string size":
        meta = json.loads(cfg.read_text())
        meta["gpt"]["n_embd"] = "4"
        cfg.write_text(json.dumps(meta))
    elif how == "huge vocab":
        meta = json.loads(cfg.read_text())
        meta["gpt"]["vocab_size"] = 10**12
        cfg.write_text(json.dumps(meta))
    elif how == "bad dtype":
        meta = json.loads(cfg.read_text())
        meta["dtype"] = "object"
        cfg.write_text(json.dumps(meta))


@pytest.mark.parametrize("how, message", [
    ("truncated", "is damaged"),
    ("empty", "is damaged"),
    ("flipped", "is damaged"),
    ("not json", "is not valid JSON"),
    ("string size", "gpt.n_embd must be int"),
    ("huge vocab", "gpt.vocab_size = 1000000000000 is out of range"),
    ("bad dtype", "dtype must be one of"),
])
def test_damaged_checkpoints_give_a_clear_error(tmp_path, how, message):
    _small_run(tmp_path / "run")
    _damage(tmp_path / "run", how)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        checkpoint.load_checkpoint(str(tmp_path / "run"))


def test_nan_weights_are_refused(tmp_path):
    config = GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=4)
    wte = init_gpt_params(config, np.random.default_rng(0), np.float32)["wte"]
    wte[0, 0] = np.nan
    _small_run(tmp_path / "run", wte=wte)
    with pytest.raises(ValueError, match="NaN or infinite weights in wte"):
        checkpoint.load_checkpoint(str(tmp_path / "run"))


def test_wrong_shape_is_found_from_the_headers(tmp_path):
    _small_run(tmp_path / "run", wte=np.zeros((5, 3), np.float32))
    with pytest.raises(ValueError, match=r"wte has shape \(5, 3\) float32, the config needs \(5, 4\)"):
        checkpoint.load_checkpoint(str(tmp_path / "run"))


# -- benchmarks ------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["--min-time", "1e9"], "must be at most 600"),
    (["--seq-lens", "10000000"], "must be at most 65536"),
    (["--seed", "-1"], "must be at least 0"),
])
def test_benchmark_options_are_bounded(argv, message, capsys):
    from benchmarks import cli as bench

    with pytest.raises(SystemExit) as exit_:
        bench.main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_a_benchmark_whose_scores_exceed_memory_is_refused_naming_the_options(capsys, monkeypatch):
    """Each option has its own bound, their product none: --seq-lens 65536 asks for 4 x 8 x 65536^2
    float32 scores (512 GiB), refused before any allocation; flash attention holds a tile, not them."""
    from benchmarks import cli as bench

    monkeypatch.setattr(bench, "memory_limits", lambda: {"this machine's memory": 64 * 2**30})
    assert bench.main(["--ops", "attention", "--impls", "numpy", "--seq-lens", "65536"]) == 2
    err = capsys.readouterr().err
    assert "--batch 4 x --heads 8 x --seq-lens 65536 x 65536 (T x S) x 4 bytes" in err, err
    assert f"{4 * 8 * 65536**2 * 4:,} bytes (512.0 GiB)" in err and "lower --seq-lens, --batch or --heads" in err, err
    args = bench.build_parser().parse_args(["--seq-lens", "65536", "--dtype", "float64", "--batch", "1",
                                            "--heads", "1"])
    bench.check_scores_fit(bench.registry.select(["flash_attention", "flex_sliding_window", "flex_document"]), args)
    with pytest.raises(ValueError, match="x 8 bytes .* flex_document_dense"):   # float64: 32 GiB, 2**33 left
        monkeypatch.setattr(bench, "memory_limits", lambda: {"the memory left under this cgroup's limit": 2**33})
        bench.check_scores_fit(bench.registry.select(["flash_attention", "flex_document_dense"]), args)


def test_benchmark_outputs_are_not_overwritten_without_force(tmp_path, capsys):
    from benchmarks import cli as bench

    (tmp_path / "r.json").write_text("{}")
    with pytest.raises(SystemExit):
        bench.main(["--quick", "--json", str(tmp_path / "r.json")])
    assert "exists; pass --force" in capsys.readouterr().err
    assert (tmp_path / "r.json").read_text() == "{}"


def _alive(pid):
    """Whether ``pid`` runs (a zombie, exited but not yet reaped by its new parent, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_benchmark_worker_dies_with_its_parent():
    """The parent is killed outright (no cleanup runs); its worker notices and exits."""
    code = ("import os, subprocess, sys, time\n"
            "p = subprocess.Popen([sys.executable, '-c', 'from benchmarks._worker import "
            "_die_with_parent; import time; _die_with_parent(); time.sleep(60)'],\n"
            "    env=dict(os.environ, NUMPY_ATTN_BENCH_PARENT=str(os.getpid())))\n"
            "print(p.pid, flush=True)\ntime.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    worker = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    for _ in range(300):                          # it may still be importing NumPy on a busy machine
        if not _alive(worker):
            break
        time.sleep(0.1)
    outlived = _alive(worker)
    if outlived:
        os.kill(worker, signal.SIGKILL)
    assert not outlived, "the worker outlived its parent by 30 s"


def test_threads_are_refused_not_ignored_without_threadpoolctl(tmp_path):
    """--threads is honoured or the run stops saying why; never silently ignored."""
    code = ("import sys\nsys.modules['threadpoolctl'] = None   # as if it were not installed\n"
            "from attn_cli import cli\nsys.exit(cli.main(['train', '--out', sys.argv[1]]))\n")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "needs threadpoolctl" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
@needs_vocab
def test_the_same_seed_gives_the_same_losses_whatever_the_thread_variables(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The cat sat on the mat. The dog sat on the log. " * 40, encoding="utf-8")
    losses = []
    for n, threads in enumerate(("1", "2")):
        env = dict(os.environ, OMP_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads,
                   MKL_NUM_THREADS=threads)
        out = tmp_path / f"run{n}"
        result = subprocess.run([sys.executable, "-m", "attn_cli.cli", "train", "--text", str(corpus),
                                 "--out", str(out), "--steps", "5", "--batch-size", "4",
                                 "--block-size", "16", "--n-embd", "64"],
                                capture_output=True, text=True, timeout=300, env=env)
        assert result.returncode == 0, result.stderr
        losses.append(json.loads((out / "config.json").read_text())["final_loss"])
    assert losses[0] == losses[1], f"losses {losses} differ with the thread variables"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="atomic exchange is Linux's")
def test_the_new_run_replaces_the_old_in_one_step(tmp_path, monkeypatch):
    """Between any two system calls of the replacement, --out holds a whole run."""
    _small_run(tmp_path / "run")
    (tmp_path / "run" / "notes.txt").write_text("mine")
    seen = []

    def watching(real):
        def rename(a, b):
            seen.append(sorted(os.listdir(tmp_path / "run")) if (tmp_path / "run").exists() else None)
            real(a, b)
        return rename

    monkeypatch.setattr(os, "rename", watching(os.rename))
    monkeypatch.setattr(os, "replace", watching(os.replace))   # the writer renames with os.replace
    config = GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=4)
    new = init_gpt_params(config, np.random.default_rng(9))
    checkpoint.save_checkpoint(str(tmp_path / "run"), new, config, np.arange(5), np.float32, {},
                               force=True)
    assert seen and None not in seen, "--out was missing between two renames"
    np.testing.assert_array_equal(checkpoint.load_checkpoint(str(tmp_path / "run"))[0]["wte"],
                                  new["wte"], err_msg="wte")
    assert (tmp_path / "run" / "notes.txt").read_text() == "mine", "the user's file is kept"
