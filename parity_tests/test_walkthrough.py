"""Tests for ``numpy-attn walkthrough`` (attn_cli/walkthrough.py): it runs end to end, both sides
agree, the source's worked example prints the numbers an independent computation gives, the
heatmaps are real PNGs, ``--no-torch`` leaves torch out, and bad input gets a message, not a traceback.
"""

import bisect
import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attn_cli import cli, term
from attn_cli.source_example import SOURCE_EXAMPLE
from parity_tests.helpers import BFLOAT16, assert_close, needs_vocab, tree_leaves

pytestmark = needs_vocab

DIFF = re.compile(r"max \|NumPy - PyTorch\| = (\S+)")

# The source example's inputs (typed in once, in attn_cli/source_example.py); what the walkthrough
# prints from them is checked against a computation made here.
X = np.array(SOURCE_EXAMPLE["embeddings"])
W_QUERY = np.array(SOURCE_EXAMPLE["w_query"])
W_KEY = np.array(SOURCE_EXAMPLE["w_key"])
W_VALUE = np.array(SOURCE_EXAMPLE["w_value"])
TOKENS = ["The", "cat", "sat", "on", "the", "mat"]


def run(*argv):
    """Run the command in this process; return (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(["walkthrough", *argv])
    return status, out.getvalue(), err.getvalue()


def run_subprocess(*argv, env=None):
    return subprocess.run([sys.executable, "-m", "attn_cli.cli", "walkthrough", *argv],
                          capture_output=True, text=True, env=env, timeout=120)


def numpy_table(out, title):
    """The NumPy side (left of '|') of the first table whose title starts with ``title``:
    {row label: [numbers]}."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(title))
    rows = {}
    for line in lines[start + 1:]:
        if not line.strip() or "max |" in line:
            break
        label, *cells = line.split("|")[0].split()
        try:
            rows[label] = [float(c) for c in cells]
        except ValueError:                  # "NumPy | PyTorch" and the column labels
            continue
    return {label: numbers for label, numbers in rows.items() if numbers}
    return rows


def softmax(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.fixture(scope="module")
def default_run():
    return run()


def test_every_step_runs_with_shapes_and_small_differences(default_run):
    status, out, err = default_run
    assert status == 0, err
    for n, title in enumerate(["GPT-2 tokenization", "Embedding lookup", "Sinusoidal positions",
                               "Weight-free self-attention", "Trainable projections",
                               "The causal mask", "Multi-head attention"], start=1):
        assert f"Step {n}. {title}" in out, f"step {n} missing"
    for shape in ["(6,)", "(6, 4)", "(6, 6)", "(6, 2)", "(1, 6, 4)", "(1, 2, 6, 6)"]:
        assert f"shape {shape}" in out, f"no table of shape {shape}"
    diffs = [float(d) for d in DIFF.findall(out)]
    assert len(diffs) >= 27, f"only {len(diffs)} compared tables"     # 25 + one per head
    assert max(diffs) < 1e-5, f"float32 twins differ by {max(diffs)}"
    assert "Follow 'cat'" in out, "the default focus is the second token"


def test_float64_differences_are_at_rounding_level():
    status, out, _ = run("--dtype", "float64", "--seed", "7")
    assert status == 0
    diffs = [float(d) for d in DIFF.findall(out)]
    assert len(diffs) >= 27 and max(diffs) < 1e-12, f"float64 twins differ by {max(diffs)}"


def test_weight_tables_have_rows_summing_to_one(default_run):
    _, out, _ = default_run
    for title in ["weights = softmax(scores)", "weights = softmax(scaled scores)", "causal weights"]:
        rows = numpy_table(out, title)
        assert list(rows) == TOKENS, title
        for label, numbers in rows.items():
            assert numbers[-1] == 1.0, f"{title}: row {label} sums to {numbers[-1]}"
            assert abs(sum(numbers[:-1]) - 1) < 6 * 0.5e-4, f"{title}: row {label}"
    causal = numpy_table(out, "causal weights")
    assert causal["The"][1:6] == [0.0] * 5, "the first token attends to itself only"


def test_example_source_matches_an_independent_computation():
    status, out, err = run("--example", "source", "--no-torch")
    assert status == 0, err
    assert "positions left out" in out
    # Embeddings are typed in, not drawn.
    np.testing.assert_array_equal(np.array(list(numpy_table(out, "x = wte[ids]").values())), X)
    # (a) weight-free: scores x x^T, softmax, context.
    w = softmax(X @ X.T)
    np.testing.assert_allclose(list(numpy_table(out, "weights = softmax(scores)").values()),
                               np.c_[w, w.sum(1)], atol=1e-4, err_msg="step 4 weights")
    np.testing.assert_allclose(list(numpy_table(out, "context = weights @ x").values()), w @ X,
                               atol=1e-4, err_msg="step 4 context")
    # (b) trainable projections, scale 1/sqrt(2), and the context vector of "cat".
    q, k, v = X @ W_QUERY, X @ W_KEY, X @ W_VALUE
    scaled = q @ k.T / np.sqrt(2)
    np.testing.assert_allclose(numpy_table(out, "scaled scores")["cat"], scaled[1], atol=1e-4,
                               err_msg="scaled scores of 'cat'")
    z_cat = softmax(scaled[1]) @ v
    np.testing.assert_allclose(numpy_table(out, "context = weights @ values")["cat"], z_cat,
                               atol=1e-4, err_msg="context vector of 'cat'")
    assert f"= [{z_cat[0]:.4f}, {z_cat[1]:.4f}]" in out, "the worked dot product ends in z_cat"
    # The causal context of "cat" sees "The" and "cat" only.
    causal_cat = softmax(scaled[1, :2]) @ v[:2]
    np.testing.assert_allclose(numpy_table(out, "causal context")["cat"], causal_cat, atol=1e-4,
                               err_msg="causal context of 'cat'")


def test_example_source_both_sides_agree():
    status, out, _ = run("--example", "source")
    diffs = [float(d) for d in DIFF.findall(out)]
    assert status == 0 and len(diffs) >= 26 and max(diffs) < 1e-5


def test_options_change_the_output():
    status, out, _ = run("A dog ran", "--dim", "4", "--d-out", "3", "--focus", "ran",
                         "--precision", "2", "--no-positional", "--no-torch")
    assert status == 0
    assert "Step 3. Sinusoidal positions: skipped" in out
    assert "2 heads of size 2" in out, "4 channels split into 2 heads by default"
    assert "Follow 'ran'" in out
    context = numpy_table(out, "context = weights @ values")
    assert list(context) == ["A", "dog", "ran"] and all(len(r) == 3 for r in context.values())
    assert re.search(r"\s-?\d\.\d\d\s", out) and not re.search(r"\d\.\d{3}", out), "2 decimals"


def test_color_only_when_asked_or_on_a_terminal(monkeypatch):
    _, plain, _ = run("--no-torch", "--example", "source")
    _, colored, _ = run("--no-torch", "--example", "source", "--color", "always")
    assert "\x1b[" not in plain, "no colour when stdout is not a terminal"
    assert "\x1b[" in colored

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert term.use_color("auto", Terminal())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not term.use_color("auto", Terminal()), "NO_COLOR is respected"


def test_plots_are_written_and_readable(tmp_path):
    from matplotlib.image import imread

    folder = tmp_path / "plots" / "new"            # created on demand
    status, out, err = run("--plot", str(folder), "--no-torch")
    assert status == 0, err
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["step4_weight_free.png", "step5_qkv.png", "step6_causal.png",
                     "step7_heads.png", "step9_dscores.png"], \
        "one figure per step, every head of step 7 in one, step 9's gradient"
    for name in names:
        image = imread(folder / name)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100, name
        assert image[..., :3].std() > 0.05, f"{name} is blank"
    assert "5 heatmaps written" in out
    for name in names:
        assert f"wrote {folder / name}" in out, f"{name} is not announced"


def test_no_torch_does_not_import_torch():
    code = ("import sys\nfrom attn_cli import cli\n"
            "status = cli.main(['walkthrough', '--no-torch'])\n"
            "print('torch imported' if 'torch' in sys.modules else 'torch not imported', status)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "Step 7. Multi-head attention" in result.stdout
    assert result.stdout.strip().endswith("torch not imported 0"), result.stdout[-300:]


@pytest.mark.parametrize("argv, message", [
    ([""], "TEXT is empty"),
    (["   "], "TEXT is empty"),
    (["word " * 40], "takes at most 32 tokens"),
    (["--focus", "dog"], "--focus 'dog' is neither a position nor a token"),
    (["--focus", "9"], "--focus 9 is out of range"),
    (["--dim", "3", "--heads", "2"], "--heads 2 does not divide --dim 3"),
    (["A dog", "--example", "source"], "--example source replays"),
    (["--example", "source", "--dim", "4"], "--dim must be 3"),
    (["--dim", "0"], "--dim must lie in 1..64"),
])
def test_bad_input_exits_with_a_message(argv, message):
    status, out, err = run(*argv, "--no-torch")      # an exception here would fail the test
    assert status != 0
    assert "numpy-attn walkthrough: error:" in err and message in err, err
    assert out == ""


def test_bad_input_in_a_real_process_has_no_traceback():
    result = run_subprocess("", "--no-torch")
    assert result.returncode == 2
    assert result.stderr.startswith("numpy-attn walkthrough: error: TEXT is empty"), result.stderr
    assert "Traceback" not in result.stderr


def test_unwritable_plot_folder_exits_with_a_message(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    result = run_subprocess("--plot", str(blocker / "plots"), "--no-torch")
    assert result.returncode != 0
    assert "cannot write plots to" in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_without_torch_installed_the_numpy_side_still_runs():
    """A fresh `pip install -e .` has no torch: the walkthrough says so and runs NumPy alone."""
    code = ("import sys\nsys.modules['torch'] = None   # as if torch were not installed\n"
            "from attn_cli import cli\nsys.exit(cli.main(['walkthrough']))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "PyTorch is not installed, so only the NumPy side runs" in result.stdout
    assert "Step 7. Multi-head attention" in result.stdout and "max |NumPy" not in result.stdout


def test_tables_stack_when_the_terminal_is_too_narrow(monkeypatch):
    from attn_cli import walkthrough

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    args = cli.build_parser().parse_args(["walkthrough", "--example", "source"])
    wide, narrow = Terminal(), Terminal()
    monkeypatch.setenv("COLUMNS", "200")
    assert walkthrough.run(args, out=wide) == 0
    monkeypatch.setenv("COLUMNS", "80")
    assert walkthrough.run(args, out=narrow) == 0
    side_by_side = "\n    NumPy                                                        |  PyTorch\n"
    assert side_by_side in wide.getvalue(), "6 x 6 weights with sums fit beside each other in 200 columns"
    assert side_by_side not in narrow.getvalue() and "\n    PyTorch\n" in narrow.getvalue()
    tables = [line for line in narrow.getvalue().splitlines() if re.match(r"    \S+\s+-?\d", line)]
    assert tables and max(len(line) for line in tables) <= 80


def test_piped_output_fits_80_columns(default_run):
    _, out, _ = default_run                          # stdout is not a terminal here
    long = [line for line in out.splitlines() if len(line) > 80]
    assert not long, long[:3]


class Terminal(io.StringIO):
    """A stdout that says it is a terminal: the walkthrough lays it out for COLUMNS."""

    def isatty(self):
        return True


SIXTEEN_TOKENS = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen"
LONG_TOKENS = "Extraordinarily interconnected representations: hypothesis"   # labels cut at 10 characters


@pytest.mark.parametrize("argv", [
    ("--dim", "12"),                                                   # 126 lines over 80 before
    (SIXTEEN_TOKENS,),                                                 # 340 lines over 80, up to 154
    (SIXTEEN_TOKENS + " seventeen eighteen", "--dim", "9", "--heads", "3", "--d-out", "5"),
    (LONG_TOKENS, "--dim", "16", "--heads", "4", "--precision", "8", "--focus", "2"),
    ("--example", "source", "--precision", "12"),
], ids=["dim12", "16tokens", "18tokens-dim9", "long-labels-dim16", "source-12-decimals"])
@pytest.mark.parametrize("brief", [False, True], ids=["full", "brief"])
@pytest.mark.parametrize("width", [60, 80, 120])
def test_every_line_fits_the_width(argv, brief, width, monkeypatch):
    """Tables too wide are cut between columns and written-out sums wrapped between terms, for any
    --dim, sentence length and width (down to 60): 80 columns when piped, COLUMNS on a terminal."""
    from attn_cli import walkthrough

    argv = (*argv, "--brief") if brief else argv
    if width == 80:
        status, out, err = run(*argv)               # stdout is a pipe here: 80 columns
    else:
        monkeypatch.setenv("COLUMNS", str(width))
        stream = Terminal()
        status, err = walkthrough.run(cli.build_parser().parse_args(["walkthrough", *argv]), out=stream), ""
        out = stream.getvalue()
    assert status == 0, err
    lines = out.splitlines()
    long = [line for line in lines if len(line) > width]
    assert not long, f"{len(long)} lines over {width} columns, the first: {long[:3]}"
    assert max(len(line) for line in lines) > width - 25, "the width is used, not a fixed narrower one"
    assert len(DIFF.findall(out)) >= 6, "tables are still compared"


def test_brief_prints_each_step_s_key_table_only():
    status, out, err = run("--brief")
    assert status == 0, err
    titles = [line.strip().split("  shape")[0] for line in out.splitlines() if "  shape (" in line]
    assert titles == ["ids = encode(text)", "x = wte[ids], C = 4 (--dim)",
                      "x = x + PE, the input of attention",
                      "weights = softmax(scores), each row sums to 1",
                      "weights = softmax(scaled scores)", "causal weights = softmax(masked scores)",
                      "out = merged @ Wo + bo",
                      "dscores = weights * (dweights - rowsum(weights * dweights))"], titles
    assert "Done: 37 tables computed by NumPy and by PyTorch." in out, "every table still compared"
    assert max(len(line) for line in out.splitlines()) <= 80


def test_brief_says_which_tables_stand_for_both_sides():
    """Under "NumPy left and PyTorch right", --brief's single tables are labelled as both sides'."""
    status, out, err = run("--brief")
    assert status == 0, err
    assert "digits printed" not in out.split("Step 1.")[1], "the old label 'NumPy, and PyTorch to the digits printed'"
    assert out.count("\n    NumPy and PyTorch alike\n") >= 5, "the tables both sides print alike"
    header = " ".join(out.split("Step 1.")[0].split())
    assert 'a table whose two sides print the same digits is shown once, under "NumPy and PyTorch alike"' in header


# ---------------------------------------------------------------------------------------------
# Step 8: decoding with a key/value cache.

KV_ROW = re.compile(r"^    (\d+)  (\S+)\s+(\d+)\s+(\d+)\s+(\S+)(?:\s+(\S+))?$")


def kv_table(out):
    """Step 8's table: [(t, token, length, bytes, NumPy difference, PyTorch difference or None)]."""
    section = out.split("Step 8. Decoding with a KV cache")[1]
    rows = []
    for line in section.splitlines():
        m = KV_ROW.match(line)
        if m:
            t, label, length, nbytes, d_np, d_torch = m.groups()
            rows.append((int(t), label, int(length), int(nbytes), float(d_np),
                         None if d_torch is None else float(d_torch)))
    return rows


def walk_results(*argv, torch_side=True):
    """(inputs, {side: results}) of the walkthrough's pipeline for these arguments."""
    from attn_cli import walk_steps

    args = cli.build_parser().parse_args(["walkthrough", *argv])
    inputs = walk_steps.prepare(args)
    sides = [walk_steps.NumpySide()] + ([walk_steps.TorchSide()] if torch_side else [])
    return inputs, {side.name: walk_steps.pipeline(side, inputs) for side in sides}


def reference_causal_multi_head(inputs):
    """Step 7's causal multi-head out (T, C), in float64 from the walkthrough's inputs, written
    here from the formulas and not with numpy_attn."""
    x = inputs.wte[inputs.ids].astype(np.float64)                  # (T, C)
    T, C = x.shape
    if inputs.positional:
        pos = np.arange(T)[:, None]
        freq = 10000.0 ** (-(np.arange(C) // 2 * 2) / C)           # channel 2i and 2i+1 share one
        x = x + np.where(np.arange(C) % 2 == 0, np.sin(pos * freq), np.cos(pos * freq))
    nh = inputs.num_heads
    hs = C // nh
    p = {name: {key: a.astype(np.float64) for key, a in inputs.params[name].items()}
         for name in "qkvo"}
    q, k, v = (x @ p[n]["w"] + p[n]["b"] for n in "qkv")           # (T, C) each
    heads = []
    for h in range(nh):
        cols = slice(h * hs, (h + 1) * hs)
        scores = q[:, cols] @ k[:, cols].T / np.sqrt(hs)           # (T, T)
        scores[np.triu_indices(T, 1)] = -np.inf                    # query t sees keys 0..t
        heads.append(softmax(scores) @ v[:, cols])                 # (T, hs)
    return np.concatenate(heads, axis=1) @ p["o"]["w"] + p["o"]["b"]   # (T, C)


def test_kv_decoding_step_prints_rounding_level_differences_and_the_growing_cache(default_run):
    status, out, err = default_run
    assert status == 0, err
    rows = kv_table(out)
    assert [r[1] for r in rows] == TOKENS, rows
    # Cache after token t: t + 1 tokens of 2 (k, v) x 1 layer x 2 kv heads x head size 2 x 4 bytes.
    assert [r[2] for r in rows] == list(range(1, 7)), "cache length after each token"
    assert [r[3] for r in rows] == [32 * n for n in range(1, 7)], "cache bytes after each token"
    # float32: the decoded and the full outputs differ only in the order of a few sums of O(1)
    # numbers (one-row against six-row matmuls, softmax over t + 1 keys against masked ones), a
    # few units of 2^-24 each; 1e-5 leaves a wide margin and still catches a wrong row (O(0.1)).
    for t, label, _, _, d_np, d_torch in rows:
        assert d_np < 1e-5, f"NumPy out of {label!r} differs from step 7's row {t} by {d_np}"
        assert d_torch is not None and d_torch < 1e-5, f"PyTorch out of {label!r}: {d_torch}"


def test_kv_decoding_step_float64_differences_at_rounding_level():
    status, out, _ = run("A dog ran after the cat", "--dtype", "float64", "--seed", "3")
    assert status == 0
    rows = kv_table(out)
    assert [r[2] for r in rows] == list(range(1, len(rows) + 1)) and len(rows) == 6
    assert [r[3] for r in rows] == [2 * 1 * 2 * 2 * 8 * r[2] for r in rows], "float64: 8 bytes a number"
    diffs = [d for r in rows for d in r[4:]]
    assert None not in diffs and max(diffs) < 1e-12, f"float64 decode differs by {max(diffs)}"


@pytest.mark.parametrize("argv", [
    (),
    ("--dtype", "float64"),
    ("A dog ran", "--dim", "6", "--heads", "3", "--no-positional", "--seed", "5"),
    ("Attention is all you need, they said; then came the cache.", "--dim", "8", "--heads", "1"),
    ("x", "--dim", "4", "--heads", "4"),
])
def test_kv_decoded_rows_equal_an_independent_full_computation(argv):
    inputs, results = walk_results(*argv)
    T = len(inputs.ids)
    expected = reference_causal_multi_head(inputs)
    for side, r in results.items():
        # Each decoded token's out is row t of the full causal computation (float32: the float64
        # reference rounded once, plus a few roundings of O(1) sums: within assert_close's
        # float32 tolerance; float64: within its float64 one).
        assert_close(f"{side} decoded out", r["kv_out"][0], expected.astype(inputs.dtype))
        assert r["kv_length"][-1] == T, f"{side}: cache holds {r['kv_length'][-1]} tokens, text has {T}"
        np.testing.assert_array_equal(r["kv_length"], np.arange(1, T + 1), err_msg=f"{side} kv_length")
        hs = inputs.C // inputs.num_heads
        bytes_per_token = 2 * 1 * inputs.num_heads * hs * inputs.dtype.itemsize
        np.testing.assert_array_equal(r["kv_bytes"], np.arange(1, T + 1) * bytes_per_token,
                                      err_msg=f"{side} kv_bytes")
        assert r["kv_k"].shape == (1, inputs.num_heads, T, hs), f"{side} cached keys {r['kv_k'].shape}"


def test_kv_decoding_step_in_brief_and_without_torch():
    status, out, err = run("--brief", "--no-torch")
    assert status == 0, err
    section = out.split("Step 8. Decoding with a KV cache")[1]
    assert "init_kv_cache(" not in section and "cached keys" not in section, "brief: the table only"
    rows = kv_table(out)
    assert len(rows) == 6 and all(r[5] is None for r in rows), "no PyTorch column with --no-torch"
    assert max(len(line) for line in out.splitlines()) <= 80


# ---------------------------------------------------------------------------------------------
# Step 9: the backward of step 5.

def side_tables(out, title):
    """Both sides of the first table whose title starts with ``title``, in any layout (beside each
    other, one under another, in groups of columns, or once for both): {side: {row: [numbers]}}."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(title))
    tables, sides, header = {}, None, None
    for line in lines[start + 1:]:
        text = line.strip()
        if not text or text.startswith("max |"):
            break
        if text.startswith(("shape", "undoes")):
            continue
        if text.startswith(("NumPy", "PyTorch", "column")):        # a label: which side, which columns
            sides = [["NumPy", "PyTorch"] if part.strip().startswith("NumPy and PyTorch") else
                     ["NumPy" if part.strip().startswith("column") else part.strip().split(",")[0]]
                     for part in text.split("|")]
            header = None
            continue
        cells = [part.split() for part in line.split("|")]
        if header is None:                                        # the column labels follow the label
            header = cells
            continue
        for names, columns, (label, *numbers) in zip(sides, header, cells, strict=True):
            for side in names:
                tables.setdefault(side, {}).setdefault(label, {}).update(zip(columns, map(float, numbers),
                                                                             strict=True))
    return {side: {label: list(row.values()) for label, row in rows.items()} for side, rows in tables.items()}


def reference_gradients(inputs, r):
    """Step 9's gradients computed here: numpy_attn's attention backward and, apart, torch's
    autograd through torch.nn.functional, from the walkthrough's inputs. {side: {name: array}}."""
    import torch

    from numpy_attn.attention import (
        scaled_dot_product_attention_backward,
        scaled_dot_product_attention_forward,
    )
    from numpy_attn.softmax import softmax_backward

    x, g = r["x"] if inputs.positional else r["tok"], inputs.upstream
    q, k, v = x @ inputs.w_query, x @ inputs.w_key, x @ inputs.w_value
    _, cache = scaled_dot_product_attention_forward(q, k, v)
    dq, dk, dv = scaled_dot_product_attention_backward(g, cache)
    dweights = g @ v.T
    by_hand = dict(dweights=dweights, dscores=softmax_backward(dweights, cache.softmax_cache), dq=dq, dk=dk,
                   dv=dv, dw_query=x.T @ dq, dw_key=x.T @ dk, dw_value=x.T @ dv,
                   loss=(cache.weights @ v * g).sum())
    xt = torch.from_numpy(x)
    w = {name: torch.tensor(getattr(inputs, f"w_{name}"), requires_grad=True) for name in ("query", "key", "value")}
    qt, kt, vt = (xt @ w[name] for name in ("query", "key", "value"))
    scaled = qt @ kt.T / np.sqrt(inputs.d_out)
    weights = torch.softmax(scaled, dim=-1)
    context = torch.nn.functional.scaled_dot_product_attention(qt[None], kt[None], vt[None])[0]
    for t in (qt, kt, vt, scaled, weights):
        t.retain_grad()
    loss = (context * torch.from_numpy(g)).sum()
    loss.backward(retain_graph=True)
    autograd = {name: t.detach().clone() for name, t in dict(   # copies: the next backward adds to .grad
        dq=qt.grad, dk=kt.grad, dv=vt.grad, dw_query=w["query"].grad, dw_key=w["key"].grad,
        dw_value=w["value"].grad, loss=loss).items()}
    # dweights and dscores from the weights' own graph (F.scaled_dot_product_attention hides its own).
    (weights @ vt.detach() * torch.from_numpy(g)).sum().backward()
    autograd.update(dweights=weights.grad, dscores=scaled.grad)
    return {"NumPy": by_hand, "PyTorch": {name: t.detach().numpy() for name, t in autograd.items()}}


GRADIENT_TABLES = [("dweights", "dweights = G @ values.T"), ("dv", "dv = weights.T @ G"),
                   ("dscores", "dscores = weights * (dweights"), ("dq", "dq = dscores @ keys"),
                   ("dk", "dk = dscores.T @ queries"), ("dw_query", "dW_query = x.T @ dq"),
                   ("dw_key", "dW_key = x.T @ dk"), ("dw_value", "dW_value = x.T @ dv")]


@pytest.mark.parametrize("argv", [(), ("--example", "source"), ("A dog ran after the cat", "--dim", "6", "--d-out", "3",
                                                                 "--seed", "9", "--dtype", "float64")])
def test_backward_step_prints_the_gradients_of_numpy_attn_and_of_autograd(argv):
    status, out, err = run(*argv)
    assert status == 0, err
    inputs, results = walk_results(*argv, torch_side=False)
    expected = reference_gradients(inputs, results["NumPy"])
    tok = inputs.labels
    dcol_rows = tok
    # Printed with 4 decimals: within half a unit of the last digit of the exact value, plus the
    # float32 error of the computation (a few units of 2^-24 on O(1) sums, under 1e-6).
    tolerance = 0.5e-4 + 1e-6
    for name, title in GRADIENT_TABLES:
        printed = side_tables(out, title)
        assert set(printed) == {"NumPy", "PyTorch"}, f"{title}: sides {set(printed)}"
        rows = [f"c{j}" for j in range(inputs.C)] if name.startswith("dw_") else dcol_rows
        for side, table in printed.items():
            assert list(table) == rows, f"{side} {title}: rows {list(table)}"
            numbers = np.array(list(table.values()))
            want = expected[side][name]
            if name == "dscores":                                # the last column: each row's sum, 0
                np.testing.assert_allclose(numbers[:, -1], 0, atol=tolerance, err_msg=f"{side} {title}: row sums")
                numbers = numbers[:, :-1]
            np.testing.assert_allclose(numbers, want, rtol=0, atol=tolerance, err_msg=f"{side} {title}")
    loss = re.search(r"L = sum\(context \* G\) = (\S+) \(NumPy\), (\S+) \(PyTorch\)", out)
    assert loss, "the loss is printed, both sides"
    for side, text in zip(("NumPy", "PyTorch"), loss.groups(), strict=True):
        assert abs(float(text) - float(expected[side]["loss"])) <= tolerance, f"{side} loss {text}"
    g = side_tables(out, "G = dL/dcontext")
    np.testing.assert_allclose(np.array(list(g["NumPy"].values())), inputs.upstream, atol=0.5e-4,
                               err_msg="G as printed")
    assert g["NumPy"] == g["PyTorch"], "G is one input shared by both sides"
    assert len(np.unique(inputs.upstream)) > inputs.upstream.size // 2, "G is drawn, not constant (never ones)"


WORKED_DW = re.compile(r"^    dw_(\S+)\s+= G_\S+ \. v_\S+\s+= .* =\s+(\S+)$")
WORKED_DSCORE = re.compile(r"^    dscore_(\S+)\s+= w_\S+\s+\(dw_\S+\s+- sum\) = "
                           r"(\S+)\*\((\S+) - \(?(\S+?)\)?\)\s+=\s+(\S+)$")


def test_backward_step_works_the_focus_token_through_the_softmax_jacobian_by_hand():
    status, out, err = run("--example", "source")
    assert status == 0, err
    section = out.split("Step 9.")[1]
    assert "Follow 'cat' back (--focus): G_cat = dL/dz_cat = [0.9900, -0.2900]" in section
    dw = {m[1]: float(m[2]) for m in map(WORKED_DW.match, section.splitlines()) if m}
    scores = [WORKED_DSCORE.match(line) for line in section.splitlines()]
    scores = [m.groups() for m in scores if m]
    assert list(dw) == TOKENS and [s[0] for s in scores] == TOKENS, (dw, scores)
    tables = side_tables(out, "dscores = weights * (dweights")["NumPy"]
    dweights = side_tables(out, "dweights = G @ values.T")["NumPy"]
    weights = numpy_table(out, "weights = softmax(scaled scores)")["cat"][:-1]
    total = float(re.search(r"\n    sum_k w_k dw_k = [^\n]*(?:\n        [^\n]*)* = (\S+)\n", section)[1])
    for j, (label, w, dw_j, sum_text, ds) in enumerate(scores):
        assert float(w) == weights[j], f"w_{label} is the weight of step 5"
        assert float(dw_j) == dw[label] == dweights["cat"][j], f"dw_{label} is row 'cat' of dweights"
        assert float(sum_text) == total
        # The product of the printed (rounded) factors against the printed result: w is within
        # 0.5e-4 of its value, dw - sum within 1e-4 (two roundings) and the result within 0.5e-4,
        # so they differ by at most 0.5e-4 |dw - sum| + w 1e-4 + 0.5e-4 (w <= 1), plus 0.5e-8.
        bound = 0.5e-4 * abs(float(dw_j) - total) + 1e-4 + 0.5e-4 + 1e-8
        assert abs(float(w) * (float(dw_j) - total) - float(ds)) <= bound, label
        assert float(ds) == tables["cat"][j], f"dscore_{label} is row 'cat' of dscores"
    dq = re.search(r"\n\s+= \[(\S+), (\S+)\]\n    PyTorch dq_cat = \[(\S+), (\S+)\]", section)
    assert dq and [float(v) for v in dq.groups()[:2]] == side_tables(out, "dq = dscores @ keys")["NumPy"]["cat"]


def test_backward_step_in_brief_is_one_gradient_table_and_the_header_claim_is_shown():
    status, out, err = run("--brief")
    assert status == 0, err
    section = out.split("Step 9. The backward of step 5")[1]
    assert section.count("shape (") == 1 and "dscores = weights * (dweights - rowsum" in section, section
    status, full, err = run()
    assert status == 0, err
    header = " ".join(full.split("Step 1.")[0].split())
    assert "numpy_attn (backward by hand: step 9)" in header
    step9 = " ".join(full.split("Step 9.")[1].split())
    assert "NumPy (numpy_attn): linear.linear_backward, softmax.softmax_backward, " \
           "attention.scaled_dot_product_attention_backward" in step9
    assert "PyTorch (torch_attn): loss.backward() (autograd)" in step9
    assert step9.count("undoes ") == 8, "each gradient says the forward line it undoes"
    assert re.search(r"scaled_dot_product_attention_backward\(G, cache\) in one call gives the same dq, dk, dv: "
                     r"max \|difference\| = (\S+) \(NumPy\)", step9)


def test_backward_heatmap_is_signed(tmp_path):
    from matplotlib.image import imread

    status, out, err = run("--plot", str(tmp_path), "--example", "source", "--no-torch")
    assert status == 0, err
    image = imread(tmp_path / "step9_dscores.png")[..., :3]
    red = (image[..., 0] > 0.6) & (image[..., 2] < 0.35)
    blue = (image[..., 2] > 0.6) & (image[..., 0] < 0.35)
    assert red.sum() > 500 and blue.sum() > 500, "positive gradients red, negative blue"


# What the excerpt's numbers may be on another machine. A figure ("max |NumPy - PyTorch| =
# 2.98e-08", "max |difference| = ...") measures rounding: another BLAS kernel, vector width or
# thread count sums in another order and prints another one, so a figure is held to the bound
# under which the walkthrough marks it good (walk_render.tolerance), on both sides, not to its
# digits. A table value or a worked number is a float32 result printed to fixed decimals: the
# other machine's result lies within that bound of this one's, and where it lies that close to a
# rounding boundary (a 5 in the next decimal) it prints the neighbouring last digit. float32's
# bound, 1e-4, is one unit of the fourth decimal, so the two print at most one unit apart: a fixed
# number is held to its decimals and to one unit of its last digit. Everything else is text and
# must be equal.
FIGURE = re.compile(r"\d\.\d\de[+-]\d\d")
NUMBER = re.compile(rf"{FIGURE.pattern}|-?\d+\.\d+")


def _masked(text):
    """``text`` with each figure and fixed-decimal number replaced by NUL, and those numbers in order."""
    numbers = []

    def keep(match):
        numbers.append(match[0])
        return "\0"
    return NUMBER.sub(keep, text), numbers


def _number_problem(shown, printed, bound):
    """Why the excerpt's ``shown`` is not what the command's ``printed`` may be (see above), or None."""
    if FIGURE.fullmatch(shown) or FIGURE.fullmatch(printed):
        if not (FIGURE.fullmatch(shown) and FIGURE.fullmatch(printed)):
            return f"{shown} where the command prints {printed}"
        over = [f"{who} {text}" for who, text in (("the excerpt's", shown), ("the command's", printed))
                if float(text) > bound]
        return f"figure above its bound {bound:.0e}: {', '.join(over)}" if over else None
    decimals = [len(text.split(".")[1]) for text in (shown, printed)]
    units = abs(int(shown.replace(".", "")) - int(printed.replace(".", "")))
    if decimals[0] != decimals[1] or units > 1:
        return f"{shown} where the command prints {printed}"
    return None


def excerpt_problems(excerpt, out, bound):
    """What keeps ``excerpt``'s pieces (between "[...]" lines) from standing in ``out`` in order,
    their text equal and their numbers as another machine may print them (see above): [] if nothing."""
    masked_out, printed = _masked(out)
    holes = [i for i, c in enumerate(masked_out) if c == "\0"]
    at = 0
    for piece in excerpt.rstrip("\n").split("\n[...]\n"):
        masked, shown = _masked(piece)
        found, problems = masked_out.find(masked + "\n", at), None
        while found >= 0:                  # the first place whose numbers agree too
            first = bisect.bisect_left(holes, found)
            differ = [problem for s, p in zip(shown, printed[first:first + len(shown)], strict=True)
                      if (problem := _number_problem(s, p, bound))]
            if not differ:
                break
            problems = problems or [f"{problem}, in: {piece[:200]}" for problem in differ]
            found = masked_out.find(masked + "\n", found + 1)
        if found < 0:
            return problems or [f"not in the output (numbers aside): {piece[:300]}"]
        at = found + len(masked)
    return []


@pytest.fixture(scope="module")
def source_run():
    """The excerpt, the output of the command it quotes, and the bound of that run's figures."""
    from pathlib import Path

    from attn_cli import walk_render

    excerpt = (Path(__file__).parent.parent / "docs" / "walkthrough_excerpt.txt").read_text()
    status, out, err = run("--example", "source", "--color", "never")
    assert status == 0, err
    inputs, results = walk_results("--example", "source", torch_side=False)
    return excerpt, out, walk_render.tolerance(inputs.dtype, results["NumPy"])


def test_the_documented_excerpt_is_what_the_command_prints(source_run):
    """docs/walkthrough_excerpt.txt (written by docs/regenerate_walkthrough.sh) is not stale: its
    pieces, between "[...]", stand in the output of the command it quotes, in order, as this or
    any other machine prints them (the figures within their bound, table values within one unit
    of their last digit: see excerpt_problems)."""
    excerpt, out, bound = source_run
    assert excerpt.count("\n[...]\n") == 3 and "Follow 'cat' back" in excerpt, \
        "the excerpt shows the header, step 5's context, step 9's loss and the backward worked by hand"
    problems = excerpt_problems(excerpt, out, bound)
    assert not problems, "\n".join(problems)


def test_a_stale_excerpt_is_told_from_another_machine_s_rounding(source_run):
    """The comparison still fails on a changed word, a table value two units off and a figure above
    its bound; it lets through a figure within its bound and a last digit one unit off."""
    excerpt, out, bound = source_run
    assert excerpt_problems(excerpt, out, bound) == []
    figure = FIGURE.search(excerpt.split("\n[...]\n")[1])[0]          # step 5's context, e.g. 1.19e-07
    assert bound == 1e-4, "the float32 bound the cases below are written for"
    stale = {"a word": excerpt.replace("sum_k w_k dw_k", "sum_j w_j dw_j", 1),
             "a table value": excerpt.replace("0.2283", "0.2285", 1),
             "a figure above its bound": excerpt.replace(f"= {figure}", "= 1.10e-04", 1)}
    for what, text in stale.items():
        assert text != excerpt, what
        assert excerpt_problems(text, out, bound), f"{what} changed and the excerpt still passes"
    rounding = {"a figure within its bound": excerpt.replace(f"= {figure}", "= 9.90e-05", 1),
                "a last digit one unit off": excerpt.replace("0.2283", "0.2284", 1)}
    for what, text in rounding.items():
        assert text != excerpt, what
        assert excerpt_problems(text, out, bound) == [], f"{what} is another machine's rounding"


def test_help_says_how_to_keep_colour_through_a_pager():
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        cli.main(["walkthrough", "--help"])
    text = " ".join(out.getvalue().split())
    assert "through a pager, pass --color always (less -R)" in text
    assert "numpy-attn walkthrough --color always | less -R" in text


# -- --dtype bfloat16 and float16 -------------------------------------------------------------------

LOW = {"float16": np.dtype(np.float16), "bfloat16": BFLOAT16}


def _decimals(out, title):
    """The decimals of every number in the NumPy side of the first table titled ``title``."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(title))
    found = set()
    for line in lines[start + 2:]:
        if not line.strip() or "max |" in line:
            break
        found |= {len(cell.split(".")[1]) for cell in line.split("|")[0].split()[1:] if "." in cell}
    return found


@pytest.mark.parametrize("dtype, decimals, bits", [("float32", 4, None), ("float16", 3, 11), ("bfloat16", 2, 8)])
def test_the_printed_digits_follow_the_dtype(dtype, decimals, bits):
    """Four decimals for float32; for the low dtypes the digits they keep near 1, and one line that
    says so: bfloat16's numbers in [1, 2) are 2^-7 = 0.008 apart, float16's 2^-10 = 0.001."""
    status, out, err = run("--dtype", dtype)
    assert status == 0, err
    for title in ("x = wte[ids]", "weights = softmax(scaled scores)", "dscores = weights"):
        assert _decimals(out, title) == {decimals}, (dtype, title, _decimals(out, title))
    text = " ".join(out.split())
    if bits is None:
        assert "significant bits" not in text, text
    else:
        assert f"{dtype} keeps {bits} significant bits, about {bits * np.log10(2):.1f} decimal digits" in text, text
        assert f"{decimals} decimals are printed" in text, text
    assert re.search(rf"largest \|NumPy - PyTorch\| over all steps = \S+ \(step \d+, .*; {dtype}\)", text), text


def test_precision_still_overrides_the_dtype_s_decimals():
    status, out, err = run("--dtype", "bfloat16", "--precision", "5", "--no-torch")
    assert status == 0, err
    assert _decimals(out, "x = wte[ids]") == {5}, _decimals(out, "x = wte[ids]")


def test_bad_dtype_is_refused_by_argparse():
    result = run_subprocess("--dtype", "int8", "--no-torch")
    assert result.returncode == 2 and result.stdout == "", result
    assert "argument --dtype: invalid choice: 'int8'" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def _within_one_ulp(label, actual, expected, dtype, scale=None):
    """|actual - expected| <= one ulp of ``dtype`` at the larger of the two, entry by entry, or at
    ``scale`` (equal infinities, the masked scores, count as equal)."""
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    same = a == e
    with np.errstate(invalid="ignore"):
        err = np.where(same, 0.0, np.abs(a - e))
    at = np.maximum(np.abs(a), np.abs(e)) if scale is None else np.full(a.shape, scale)
    one_ulp = np.spacing(at.astype(dtype)).astype(np.float64)
    worst = np.max(err / np.where(same, 1.0, one_ulp), initial=0.0)
    assert worst <= 1, f"{label}: {worst:.2f} ulps of {dtype} from the float32 computation, rounded"


@pytest.mark.parametrize("dtype", LOW)
def test_low_precision_inputs_are_the_float32_walkthrough_s_rounded(dtype):
    """The embeddings, weights and G of --dtype bfloat16/float16 are exactly the float32
    walkthrough's rounded; so are step 2's rows (a lookup), and step 3's PE is float32's PE rounded
    to one ulp (computed in float32 inside, rounded once: a float32 sin/cos a few float32 ulps from
    the truth can fall on the other side of a rounding boundary)."""
    low = LOW[dtype]
    f32, (results32,) = _inputs_and_numpy_results()
    ins, (results,) = _inputs_and_numpy_results("--dtype", dtype)
    pairs = [("wte rows", f32.wte[f32.ids], ins.wte[ins.ids]), ("W_query", f32.w_query, ins.w_query),
             ("W_key", f32.w_key, ins.w_key), ("W_value", f32.w_value, ins.w_value), ("G", f32.upstream, ins.upstream),
             ("x = wte[ids]", results32["tok"], results["tok"])]
    pairs += [(f"params {path}", p32, p) for (path, p32), (_, p) in zip(tree_leaves(f32.params),
                                                                       tree_leaves(ins.params), strict=True)]
    for label, a32, a in pairs:
        assert a.dtype == low, f"{label} is {a.dtype}, not {dtype}"
        np.testing.assert_array_equal(a, a32.astype(low), err_msg=f"{dtype} {label} vs the float32 one, rounded")
    _within_one_ulp(f"{dtype} PE", results["pe"], results32["pe"].astype(low), low)


def _inputs_and_numpy_results(*argv):
    inputs, results = walk_results(*argv, torch_side=False)
    return inputs, (results["NumPy"],)


def _rounded_float32(fn, low):
    """``fn`` run in float32 on float32 copies of its low-precision arrays, every array it returns
    (at any depth of a tuple) rounded to ``low``; a ``dtype`` argument becomes float32."""
    def up(a):
        if isinstance(a, dict):                                   # the multi-head parameters
            return {k: up(v) for k, v in a.items()}
        return a.astype(np.float32) if isinstance(a, np.ndarray) and a.dtype == low else a

    def down(a):
        if isinstance(a, tuple) and not hasattr(a, "_fields"):
            return tuple(down(x) for x in a)
        return a.astype(low) if isinstance(a, np.ndarray) and a.dtype == np.float32 else a

    def wrapped(*args, **kwargs):
        kwargs = {k: np.float32 if k == "dtype" else up(v) for k, v in kwargs.items()}
        result = down(fn(*(up(a) for a in args), **kwargs))
        if fn.__name__ == "softmax_forward":   # its backward reads the output it handed out, rounded
            result = result[0], result[1]._replace(y=result[0].astype(np.float32))
        return result

    return wrapped


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("argv", [(), ("--example", "source")], ids=["default", "source"])
def test_each_step_is_float32_rounded_once(dtype, argv, monkeypatch):
    """Every table of --dtype bfloat16/float16 is what the same step computes in float32 from the
    same (low-precision) inputs, rounded once to the dtype: the walkthrough run again with each
    numpy_attn operation it calls replaced by the float32 one on float32 copies, its outputs
    rounded. Equal up to one ulp at the table's largest value: a float32 result near a rounding
    boundary may round either way when the low-precision operation sums in another order inside,
    and where a table's entries cancel (dW sums T products of either sign) that order moves a small
    entry by a fraction of an ulp of the terms, not of itself (measured: every table equal bit for
    bit but dW_key and dW_value, within half an ulp at their largest value)."""
    from attn_cli import walk_steps
    from numpy_attn import multi_head

    low = LOW[dtype]
    _, (results,) = _inputs_and_numpy_results("--dtype", dtype, *argv)
    # The operations, where the walkthrough calls them and where multi-head attention does.
    for module, names in ((walk_steps, ("embedding_forward", "sinusoidal_encoding", "linear_forward",
                                        "linear_backward", "softmax_forward", "softmax_backward",
                                        "scaled_dot_product_attention_forward",
                                        "scaled_dot_product_attention_backward")),
                          (multi_head, ("linear_forward", "scaled_dot_product_attention_forward"))):
        for name in names:
            monkeypatch.setattr(module, name, _rounded_float32(getattr(module, name), low))
    _, (expected,) = _inputs_and_numpy_results("--dtype", dtype, *argv)
    for key, value in results.items():
        if value.dtype == low:
            rounded = expected[key].astype(low)
            finite = np.abs(rounded[np.isfinite(rounded)].astype(np.float64))
            _within_one_ulp(f"{dtype} {key}", value, rounded, low, scale=np.max(finite, initial=0.0))


@pytest.mark.parametrize("dtype", LOW)
def test_low_precision_sides_agree_within_the_printed_tolerance(dtype):
    """NumPy and PyTorch in the low dtype, every table, within render's tolerance (two ulps at the
    largest value shown: its docstring says why)."""
    from attn_cli import walk_render

    inputs, results = walk_results("--dtype", dtype)
    tol = walk_render.tolerance(inputs.dtype, results["NumPy"])
    for key, a in results["NumPy"].items():
        if a.dtype == LOW[dtype]:
            d = walk_render.max_abs_diff(a, results["PyTorch"][key])
            assert d <= tol, f"{dtype} {key}: |NumPy - PyTorch| = {d:.3g} > {tol:.3g}"



def test_the_documented_keyword_arguments_are_the_ones_the_command_prints(default_run):
    """docs/walkthrough.md's step list names the calls each step makes; every keyword argument it
    writes out for step n (``is_causal="bottom_right"``, ``kv_cache=cache.layer(0)``) must be one
    the command prints under "Step n.", so that the page cannot say ``is_causal=True`` where the
    step passes "bottom_right"."""
    status, out, err = default_run
    assert status == 0, err
    page = (Path(__file__).parent.parent / "docs" / "walkthrough.md").read_text()
    listed = page[page.index("1. GPT-2 tokenization"):page.index("9. the backward")]
    printed = {int(n): " ".join(text.split())
               for n, text in re.findall(r"^Step (\d)\.(.*?)(?=^Step \d\.|\Z)", out, re.M | re.S)}
    checked = 0
    for n, text in re.findall(r"^(\d)\. (.*?)(?=^\d\. |\Z)", listed, re.M | re.S):
        for kw in re.findall(r"\b(\w+=[^\s,)`]+)", " ".join(text.split())):
            assert kw in printed[int(n)], f"docs/walkthrough.md names {kw} in step {n}, which it does not print"
            checked += 1
    assert checked >= 2, "the step list names too few keyword arguments: the test reads nothing"
