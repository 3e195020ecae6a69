"""Tests for attn_cli/train.py, generate.py and checkpoint.py: training and generation end to end on a tiny model, the
vocabulary remapping, checkpoints, and the errors for bad input."""

import contextlib
import io
import json
import os
import re

import numpy as np
import pytest

from attn_cli import checkpoint, cli, generate, train
from numpy_attn import optim
from numpy_attn.gpt import GPTConfig, init_gpt_params
from parity_tests.helpers import assert_tree_close, needs_vocab, ulp

TEXT = ("The cat sat on the mat. The dog sat on the log. " * 20)
TINY = ["--steps", "4", "--batch-size", "2", "--block-size", "8", "--n-layer", "1",
        "--n-head", "2", "--n-embd", "8"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny run with --compare-torch: (folder, its stdout)."""
    folder = tmp_path_factory.mktemp("run")
    corpus = folder / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli.main(["train", "--text", str(corpus), "--out", str(folder / "out"),
                         "--compare-torch", *TINY])
    assert rc == 0, out.getvalue()
    return folder / "out", out.getvalue()


# -- data -------------------------------------------------------------------------------------------

def test_vocab_remapping_round_trips():
    gpt2_ids = [50, 7, 50, 9000, 7]
    vocab, ids = train.build_vocab(gpt2_ids)
    np.testing.assert_array_equal(vocab, [7, 50, 9000])
    np.testing.assert_array_equal(ids, [1, 0, 1, 2, 0])
    np.testing.assert_array_equal(vocab[ids], gpt2_ids)
    np.testing.assert_array_equal(train.to_model_ids([9000, 7], vocab), [2, 0])


def test_batches_are_windows_and_their_next_tokens():
    data = np.arange(100)
    ids, targets = train.get_batch(data, 3, 5, np.random.default_rng(0))
    assert ids.shape == targets.shape == (3, 5), (ids.shape, targets.shape)
    np.testing.assert_array_equal(targets, ids + 1)       # data[i] = i: the next token is i + 1


# -- generation -------------------------------------------------------------------------------------

def test_top_1_sampling_is_greedy_and_seeds_repeat():
    config = GPTConfig(vocab_size=7, block_size=4, n_layer=1, n_head=1, n_embd=4)
    params = init_gpt_params(config, np.random.default_rng(0), np.float64)
    params["wte"] *= 50                                    # confident logits, so greedy is not flat
    greedy = generate.generate(params, config, [1, 2], 6, temperature=0)
    top1 = generate.generate(params, config, [1, 2], 6, temperature=1.0, top_k=1,
                          rng=np.random.default_rng(0))
    assert greedy == top1, (greedy, top1)
    first, again = (generate.generate(params, config, [1], 6, 1.0, None, np.random.default_rng(5))
                    for _ in range(2))
    assert first == again, "the same seed must give the same sample"
    assert len(first) == 7 and all(0 <= i < 7 for i in first), first


# -- end to end -------------------------------------------------------------------------------------

@needs_vocab
def test_train_writes_a_checkpoint_that_loads(run):
    folder, stdout = run
    params, config, vocab = checkpoint.load_checkpoint(str(folder))
    assert config.n_embd == 8 and config.vocab_size == len(vocab), config
    meta = json.loads((folder / "config.json").read_text())
    assert meta["dtype"] == "float32" and meta["steps"] == 4, meta
    template = init_gpt_params(config, np.random.default_rng(0), np.float32)
    assert_tree_close("checkpoint vs itself reloaded", params, checkpoint.load_checkpoint(
        str(folder / "model.npz"))[0])
    assert {k for k in params} == {k for k in template}, params.keys()
    assert "torch" in stdout and "tokens/s" in stdout, stdout
    # --compare-torch prints both losses; on step 1 they agree to float32 rounding
    step1 = next(line for line in stdout.splitlines() if line.startswith("step     1"))
    assert abs(float(step1.split("diff")[1])) < 1e-4, step1


@needs_vocab
def test_generate_continues_a_prompt(run, capsys):
    folder, _ = run
    assert cli.main(["generate", "--checkpoint", str(folder), "--prompt", "The cat",
                       "--temperature", "0", "--max-new-tokens", "5"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("The cat") and len(text) > len("The cat\n"), text


# -- bad input ----------------------------------------------------------------------------------------

@needs_vocab
def test_nothing_is_overwritten_without_force(run, capsys):
    folder, _ = run
    before = (folder / "model.npz").read_bytes()
    assert cli.main(["train", "--out", str(folder), *TINY]) == 2
    assert "already holds model.npz" in capsys.readouterr().err
    assert (folder / "model.npz").read_bytes() == before


@needs_vocab
@pytest.mark.parametrize("prompt, message", [
    (" cat" * 9, "the prompt is 9 tokens, longer than the context of block_size = 8"),
    ("Schwarzwald", "is not in the checkpoint's vocabulary"),
    ("", "the prompt is empty"),
])
def test_bad_prompts(run, capsys, prompt, message):
    folder, _ = run
    assert cli.main(["generate", "--checkpoint", str(folder), "--prompt", prompt]) == 2
    assert message in capsys.readouterr().err


@needs_vocab
def test_checkpoint_that_does_not_match_its_config(run, tmp_path):
    folder, _ = run
    (tmp_path / "model.npz").write_bytes((folder / "model.npz").read_bytes())
    meta = json.loads((folder / "config.json").read_text())
    meta["gpt"]["n_layer"] = 2
    (tmp_path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"does not match config.json: missing blocks.1.ln1.w"):
        checkpoint.load_checkpoint(str(tmp_path))


def test_empty_corpus(tmp_path, capsys):
    (tmp_path / "empty.txt").write_text(" \n")
    assert cli.main(["train", "--text", str(tmp_path / "empty.txt"), "--out", str(tmp_path)]) == 2
    assert "is empty" in capsys.readouterr().err


@needs_vocab
def test_corpus_too_short_for_the_context(tmp_path, capsys):
    (tmp_path / "short.txt").write_text("just a few words")
    assert cli.main(["train", "--text", str(tmp_path / "short.txt"), "--out", str(tmp_path),
                       *TINY]) == 2
    assert "too few for windows of block_size + 1 = 9" in capsys.readouterr().err


@needs_vocab
def test_a_diverging_run_says_so_and_keeps_the_good_run(run, tmp_path, capsys):
    """--lr 1000 overflows the weights within a few steps: the error names the step, the loss and
    --lr (it was "x of shape (8, 2, 32, 32) holds NaN or +inf" from inside attention), exit 2, and
    the good run in --out is left as it was."""
    folder, _ = run
    out = tmp_path / "good"
    out.mkdir()
    for name in ("model.npz", "config.json", "loss.png"):
        (out / name).write_bytes((folder / name).read_bytes())
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    argv = ["train", "--text", str(corpus), "--out", str(out), "--force", *TINY, "--steps", "50", "--lr", "1000"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert re.search(r"the loss diverged at step \d+ \(loss [^)]+, from [\d.]+ at step 1\)", err), err
    assert "Lower --lr (now 1000; the default is 1e-2)" in err and "nothing was written" in err, err
    assert "holds NaN" not in err and "RuntimeWarning" not in err, err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before, "the good run was touched"


@pytest.mark.parametrize("content, message", [
    (None, "--text {path} cannot be read: No such file or directory"),
    (b"caf\xe9 au lait", "--text {path} is not UTF-8 text (invalid continuation byte at byte 3)"),
])
def test_a_text_that_cannot_be_read_is_named(tmp_path, capsys, content, message):
    path = tmp_path / "corpus.txt"
    if content is not None:
        path.write_bytes(content)
    assert cli.main(["train", "--text", str(path), "--out", str(tmp_path / "run"), *TINY]) == 2
    err = capsys.readouterr().err
    assert message.format(path=path) in err and "Errno" not in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
@needs_vocab
def test_an_out_that_cannot_be_written_is_named(tmp_path, capsys):
    """/proc takes no new folder: the error names --out and the path, not an internal lock file."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    assert cli.main(["train", "--text", str(corpus), "--out", "/proc/foo", *TINY]) == 2
    err = capsys.readouterr().err
    assert "--out /proc/foo cannot be written: cannot create the folder /proc/foo" in err, err
    assert ".lock" not in err, err


def test_help_explains_why_the_held_out_loss_is_lower(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "the training text is measured the same way (no dropout, the same number of windows)" in text
    assert "42% whitespace-only tokens (indentation, blank lines), against 23% in the rest" in text


@needs_vocab
def test_the_held_out_text_of_the_default_corpus_is_the_whitespace_help_says():
    """The shares train --help quotes, counted on the default corpus and its 90/10 split."""
    from attn_cli import tokenizer

    ids = np.asarray(tokenizer.encode(train.load_corpus()[0]))
    pieces = np.array(tokenizer.token_strings(np.unique(ids).tolist()), dtype=object)
    blank = np.array([p.strip() == "" for p in pieces])[np.searchsorted(np.unique(ids), ids)]
    split = int(0.9 * len(ids))
    assert round(100 * blank[split:].mean()) == 42 and round(100 * blank[:split].mean()) == 23, \
        (blank[split:].mean(), blank[:split].mean())


@needs_vocab
def test_the_end_of_a_run_compares_like_with_like(run):
    _, stdout = run
    text = " ".join(stdout.split())
    assert re.search(r"held-out loss [\d.]+; the training text measured the same way [\d.]+", text), text



# -- --compare-torch: what it says to expect, and whether the run met it ----------------------------

def _spacing_at(value, dtype):
    """The spacing (ulp) of ``dtype`` at ``value``."""
    if dtype in train.MIXED:
        return ulp(value, dtype)
    return float(np.spacing(np.abs(np.asarray(value, dtype=dtype))))


def _agreement_claim(stdout):
    """(spacings, step, bound, verdict) of the summary's check of the first steps."""
    text = " ".join(stdout.split())
    found = re.search(r"differ by at most ([\d.e+-]+) spacings of the \w+ loss \(step (\d+)\), "
                      r"(within|more than) the (\d+) that rounding allows", text)
    assert found, text
    return float(found[1]), int(found[2]), int(found[4]), found[3]


@needs_vocab
def test_compare_torch_says_what_to_expect_and_whether_the_run_met_it(run):
    """The note before training states AGREEMENT's bound; the summary measures the run's first
    steps against that same bound, in spacings of each step's loss recomputed from the per-step
    lines, and calls the run within it."""
    _, stdout = run
    steps, allowed = train.AGREEMENT["float32"]
    text = " ".join(stdout.split())
    assert f"agree within {allowed} spacings (ulps) of the float32 loss for the first {steps} steps" in text, text
    spacings, step, bound, verdict = _agreement_claim(stdout)
    assert bound == allowed and verdict == "within" and "as expected" in text, text
    lines = re.findall(r"^step +(\d+)  loss \S+  torch \S+  diff (\S+)", stdout, re.M)
    diffs = {int(n): abs(float(d)) for n, d in lines}
    losses = _step_losses(stdout)
    recomputed = [diffs[n] / _spacing_at(losses[n][0], "float32") for n in sorted(diffs)[:steps]]
    # The per-step lines round the difference to 3 digits and the loss to 4 decimals.
    assert abs(spacings - max(recomputed)) <= 0.01 * max(recomputed) + 1e-9, (spacings, recomputed)
    assert step == 1 + int(np.argmax(recomputed)), (step, recomputed)


@needs_vocab
def test_compare_torch_calls_a_disagreeing_twin_so(tmp_path, monkeypatch):
    """A torch twin whose loss is off by 1e-4 (about 200 float32 spacings of a loss near 4) from
    step 1 is reported as disagreeing, not as the expected drift."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    step = train._TorchTwin.step
    monkeypatch.setattr(train._TorchTwin, "step", lambda self, *a: step(self, *a) + 1e-4)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["train", "--text", str(corpus), "--out", str(tmp_path / "out"),
                         "--compare-torch", *TINY]) == 0
    spacings, _, bound, verdict = _agreement_claim(out.getvalue())
    assert verdict == "more than" and spacings > bound, out.getvalue()
    assert "the twins disagree" in " ".join(out.getvalue().split())


@pytest.mark.parametrize("dtype", train.DTYPES)
def test_the_note_and_the_check_use_one_bound(dtype):
    """_drift_note states the bound _agreement checks, for every dtype; differences just within
    and just beyond it get the two verdicts."""
    steps, allowed = train.AGREEMENT[dtype]
    note = " ".join(train._drift_note(dtype).split())
    assert f"within {allowed} spacings" in note, note
    assert (f"the first {steps} steps" if steps > 1 else "step 1") in note, note
    loss = 5.0                                            # spacing: eps x 4
    spacing = _spacing_at(loss, dtype)
    ours = [loss] * (steps + 10)
    late = [loss] * steps + [loss + 0.5] * 10             # drift after the window is not judged
    for shift, verdict in ((allowed * 0.9, "within"), (allowed * 1.5, "more than")):
        twin = [x + shift * spacing for x in late[:steps]] + late[steps:]
        assert f"{verdict} the {allowed} that rounding allows" in train._agreement(ours, twin, dtype)


# -- mixed precision: --dtype bfloat16 and float16 ------------------------------------------------

MIXED_STEPS = 20


def _tiny_model(seed=0):
    config = GPTConfig(vocab_size=11, block_size=6, n_layer=1, n_head=2, n_embd=8)
    rng = np.random.default_rng(seed)
    params = init_gpt_params(config, rng, np.float32)
    ids = rng.integers(0, 11, (2, 6))
    return config, params, ids, np.roll(ids, -1, axis=1)




@pytest.fixture(scope="module", params=train.MIXED)
def mixed_run(request, tmp_path_factory):
    """A short mixed-precision run with --compare-torch: (dtype, folder, its stdout)."""
    folder = tmp_path_factory.mktemp(f"mixed-{request.param}")
    corpus = folder / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    out = io.StringIO()
    # Wider than TINY and on 4 windows a step: TINY's 8 channels plateau near the unigram loss.
    argv = ["train", "--text", str(corpus), "--out", str(folder / "out"), "--compare-torch",
            "--dtype", request.param, "--steps", str(MIXED_STEPS), "--batch-size", "4", "--block-size", "8",
            "--n-layer", "1", "--n-head", "2", "--n-embd", "16"]
    with contextlib.redirect_stdout(out):
        rc = cli.main(argv)
    assert rc == 0, out.getvalue()
    return request.param, folder / "out", out.getvalue()


def _step_losses(stdout):
    """{step: (ours, torch's)} of --compare-torch's per-step lines."""
    found = re.findall(r"^step +(\d+)  loss ([\d.]+)(?:  \(skipped[^)]*\))?  torch ([\d.]+)", stdout, re.M)
    return {int(n): (float(a), float(b)) for n, a, b in found}


@needs_vocab
def test_mixed_precision_trains_and_saves_float32_masters(mixed_run):
    dtype, folder, stdout = mixed_run
    meta = json.loads((folder / "config.json").read_text())
    assert meta["dtype"] == "float32" and meta["compute_dtype"] == dtype, (meta["dtype"], meta["compute_dtype"])
    params, _, _ = checkpoint.load_checkpoint(str(folder))
    wrong = [path for path, p in checkpoint.flatten(params).items() if p.dtype != np.float32]
    assert not wrong, f"{dtype} run saved non-float32 masters: {wrong}"
    losses = _step_losses(stdout)
    assert sorted(losses) == list(range(1, MIXED_STEPS + 1)), sorted(losses)
    ours = [losses[n][0] for n in sorted(losses)]
    theirs = [losses[n][1] for n in sorted(losses)]
    for who, curve in (("ours", ours), ("torch's", theirs)):
        assert np.mean(curve[-4:]) < np.mean(curve[:4]) - 0.5, f"{dtype} {who} loss did not fall: {curve}"
    held = [loss for _, loss in meta["held_out"]]
    assert held[-1] < held[0], f"{dtype} held-out loss did not fall: {held}"
    if dtype == "float16":
        assert re.search(r"loss scaling \(float16\): the scale went from 32768 to \d+; \d+ of 20 steps skipped",
                         " ".join(stdout.split())), stdout
        assert meta["loss_scale"]["final"] > 0 and isinstance(meta["loss_scale"]["skipped_steps"], list), meta
    assert "GradScaler" in stdout if dtype == "float16" else "GradScaler" not in stdout, stdout


@needs_vocab
def test_mixed_precision_step_1_agrees_with_torch_autocast(mixed_run):
    """Step 1: the same weights and batch; ours rounds every operation's output to the low dtype,
    torch's autocast the matmuls' inputs. Our loss is a low-precision number, within half a
    spacing (ulp) of the float32 mean it rounds (torch's comes out in float32); the logits differ
    by the roundings on the way, relative 2^-8 (bfloat16) or 2^-11 (float16) per rounding, and
    move the mean cross-entropy by at most 2 max|dlogit|, below one more ulp for these small
    initial logits (|z| < 1 at init, loss about ln V = 3.4). So: at most 2 ulps of the loss."""
    dtype, _, stdout = mixed_run
    ours, theirs = _step_losses(stdout)[1]
    spacing = float(ulp(ours, dtype))
    assert abs(ours - theirs) <= 2 * spacing, (dtype, ours, theirs, spacing)


@pytest.mark.parametrize("dtype", train.MIXED)
def test_a_mixed_step_steps_the_float32_masters_on_the_low_precision_gradients(dtype):
    """The recipe, written out: cast the masters down, forward and backward there, the gradients up
    to float32 and divided by the loss scale, AdamW in float32."""
    config, masters, ids, targets = _tiny_model()
    low = train.compute_dtype(dtype)
    hyper = dict(lr=1e-2, weight_decay=0.01)
    scaler = optim.loss_scale_init() if dtype == "float16" else None
    scale = 1.0 if scaler is None else scaler["scale"]
    state = optim.adamw_init(masters)
    new, new_state, new_scaler, loss, _, skipped = train.step(masters, state, scaler, config, ids, targets,
                                                              None, hyper, low)
    model = train.model_weights(masters, low)
    expected_loss, grads, _ = train.loss_and_grads(model, config, ids, targets, loss_scale=scale)
    assert all(g.dtype == low for g in checkpoint.flatten(grads).values()), "the backward ran in another dtype"
    grads = {k: g.astype(np.float32) / np.float32(scale) for k, g in checkpoint.flatten(grads).items()}
    expected, expected_state = optim.adamw_step(masters, checkpoint.unflatten(grads), state, **hyper)
    assert not skipped and loss == expected_loss, (skipped, loss, expected_loss)
    for tree, label in ((new, "masters"), (new_state["m"], "m"), (new_state["v"], "v")):
        wrong = [path for path, p in checkpoint.flatten(tree).items() if p.dtype != np.float32]
        assert not wrong, f"{dtype} step left {label} {wrong} not float32"
    assert_tree_close(f"{dtype} mixed step's masters", new, expected)
    assert_tree_close(f"{dtype} mixed step's moments", new_state["v"], expected_state["v"])
    assert new_scaler == (None if scaler is None else {**scaler, "clean_steps": 1}), new_scaler


def test_a_float16_overflow_skips_the_step_and_halves_the_scale():
    """A scale of 2^16 is beyond float16 (its largest number is 65504): the scaled gradient of the
    loss is already inf, every gradient overflows, and the step must leave the masters and the
    moments as they were."""
    config, masters, ids, targets = _tiny_model()
    state = optim.adamw_init(masters)
    scaler = optim.loss_scale_init(init_scale=2.0**16)
    new, new_state, new_scaler, loss, _, skipped = train.step(masters, state, scaler, config, ids, targets,
                                                              None, dict(lr=1e-2, weight_decay=0.01),
                                                              np.dtype(np.float16))
    assert skipped and np.isfinite(loss), (skipped, loss)
    assert new_scaler["scale"] == 2.0**15 and new_scaler["clean_steps"] == 0, new_scaler
    assert new is masters and new_state is state, "a skipped step changed the masters or the moments"
    _, _, again, _, _, skipped = train.step(masters, state, new_scaler, config, ids, targets, None,
                                            dict(lr=1e-2, weight_decay=0.01), np.dtype(np.float16))
    assert not skipped and again["scale"] == 2.0**15, (skipped, again)


def test_a_weight_decay_that_makes_the_weights_grow_is_named(tmp_path, capsys):
    """AdamW multiplies every weight by 1 - lr x weight_decay a step: --weight-decay 1e30 (x the
    default --lr 1e-2) makes them grow without bound; the divergence names --weight-decay, not --lr."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    argv = ["train", "--text", str(corpus), "--out", str(tmp_path / "run"), "--dtype", "float16",
            "--weight-decay", "1e30", *TINY]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "1 - --lr x --weight-decay = -1e+28" in err, err
    assert "Lower --weight-decay (now 1e+30; the default is 0.01)" in err, err
    assert "Lower --lr" not in err and not (tmp_path / "run").exists(), err


def test_a_float16_run_whose_held_out_loss_overflows_says_so(tmp_path, capsys):
    """--lr 100 in float16: the step's loss is finite, the held-out loss with the stepped weights
    overflows float16; the message says that, and blames --lr."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    argv = ["train", "--text", str(corpus), "--out", str(tmp_path / "run"), "--dtype", "float16", "--lr", "100", *TINY]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert re.search(r"the loss diverged at step 1 \(loss [\d.]+, from [\d.]+ at step 1\): the held-out loss, "
                     r"with the weights after that step, overflowed float16; the steps were too large", err), err
    assert "Lower --lr (now 100;" in err and not (tmp_path / "run").exists(), err
