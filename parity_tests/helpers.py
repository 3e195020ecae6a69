"""Shared test helpers: NumPy <-> torch conversion, autograd gradients, labelled comparisons,
finite differences, and a record of the largest error seen per compared tensor.

Tolerances. float64 carries about 16 significant digits; the twins do the same arithmetic in a
possibly different order (BLAS blocking, reduction order), so they differ by a few ulps times
the length of the longest sum: rtol 1e-10 leaves ample room and still catches any real bug.
float32 carries about 7 digits, and a sum of n terms of mixed sign can lose log10(n) of them
to cancellation relative to the largest term, hence rtol 1e-4 with an atol of 1e-5 times the
scale of the values compared (elements are drawn bounded, so the scale is known).
"""

import ast
import importlib.util
import math
import os
import re
import xml.etree.ElementTree as ET
from collections import defaultdict

import ml_dtypes
import numpy as np
import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from numpy_attn._tree import flatten, leaves, tree_map
from numpy_attn.testing import TOLERANCES, layer_norm_tol, to_numpy, to_torch
from parity_tests.strategies import ramp

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
# The two low-precision dtypes, as NumPy and torch name them.
LOW_DTYPES = {"float16": (np.dtype(np.float16), torch.float16), "bfloat16": (BFLOAT16, torch.bfloat16)}

# TOLERANCES (float64 and float32, derived in this docstring) live in numpy_attn/testing.py, which
# offers the suite's error rule to users.

# (test label, dtype) -> (largest absolute error, largest share of the tolerance used)
_WORST = defaultdict(lambda: (0.0, 0.0))
_WORST_BY_FILE = defaultdict(lambda: (0.0, 0.0))


def tree_to_torch(tree, requires_grad=False):
    """Convert a nested dict of arrays into the same nested dict of tensors."""
    return tree_map(lambda a: to_torch(a, requires_grad), tree)


def tree_leaves(tree):
    """(path, leaf) pairs of a nested dict, paths written ``q.w``."""
    return leaves(tree)


def autograd(fn, inputs, dout):
    """Run the torch twin and backpropagate ``(out * dout).sum()``.

    ``inputs`` is a dict of keyword arguments; arrays (and nested dicts of arrays) become tensors
    that require grad, anything else is passed through. Returns ``(out, grads)`` as NumPy, grads
    with the same keys and nesting as the array inputs.
    """
    tensors = {
        k: tree_to_torch(v, requires_grad=True) if isinstance(v, np.ndarray | dict) else v
        for k, v in inputs.items()
    }
    out = fn(**tensors)
    (out * to_torch(dout)).sum().backward()
    grads = {k: _grad_tree(v) for k, v in tensors.items() if isinstance(inputs[k], np.ndarray | dict)}
    return to_numpy(out), grads


def _grad_tree(tree):
    return tree_map(lambda t: np.zeros(tuple(t.shape), dtype=to_numpy(t).dtype) if t.grad is None
                    else to_numpy(t.grad), tree)


def assert_close(name, actual, expected, rtol=None, atol=None):
    """Assert two arrays agree to the tolerance of their dtype; the message names the tensor.

    The dtype is checked too: a float32 result must not come back as float64. ``name`` is also the
    label under which the largest error is recorded for the end-of-run report: a bare tensor path
    ("sdpa.dq") for a result against the twin's or autograd's, else what is compared, " vs ", and
    what it is compared with ("sdpa.dq vs finite differences"). numpy-attn site draws an operation's
    largest errors from its comparisons with PyTorch only, which it tells by the label
    (attn_cli/site.py, parity_comparison).
    """
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.dtype == expected.dtype, f"{name}: dtype {actual.dtype} != expected {expected.dtype}"
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != expected {expected.shape}"
    tol = TOLERANCES[expected.dtype] if expected.dtype in TOLERANCES else dict(rtol=0, atol=0)
    rtol = tol["rtol"] if rtol is None else rtol
    atol = tol["atol"] if atol is None else atol
    _record(name, actual, expected, rtol, atol)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=name, strict=True)


def assert_tree_close(name, actual, expected, **tol):
    """assert_close on every leaf of two nested dicts with the same keys, labelled by path."""
    a_leaves, e_leaves = dict(tree_leaves(actual)), dict(tree_leaves(expected))
    assert a_leaves.keys() == e_leaves.keys(), f"{name}: keys {sorted(a_leaves)} != {sorted(e_leaves)}"
    for path, leaf in e_leaves.items():
        assert_close(f"{name}.{path}", a_leaves[path], leaf, **tol)


def _keep_worst(table, key, err, used):
    old_err, old_used = table[key]
    table[key] = (max(old_err, err), max(old_used, used))


def _record(name, actual, expected, rtol, atol):
    """Keep the largest error, and the largest share of the tolerance it used (1 = failing)."""
    finite = np.isfinite(expected) & np.isfinite(actual)
    if not finite.any():
        return
    a = actual[finite].astype(np.float64)
    e = expected[finite].astype(np.float64)
    diff = np.abs(a - e)
    err = float(diff.max())
    bound = atol + rtol * np.abs(e)
    used = float(np.max(diff / np.where(bound > 0, bound, np.inf))) if err > 0 else 0.0
    key = (name, str(expected.dtype))
    _keep_worst(_WORST, key, err, used)
    # The same, per test file, for the site's pages (numpy-attn site): which operation measured it.
    test_file = os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[0]
    _keep_worst(_WORST_BY_FILE, (test_file, *key), err, used)
    _target(used, f"{name} {expected.dtype} share of tolerance")


# (op, tensor, dtype) -> the largest multiple of PyTorch's error ours reached, for docs/precision.md
# (None while PyTorch's error has been 0 in every case), and op -> the first test file, by name, that
# checked it (the table's order; by name, so that it is the same however pytest-xdist shares out
# the tests). The node ids of the tests that called assert_error_budget: the conftest
# holds each to the error_budget marker, which `docs/precision_table.py --run` selects by.
_BUDGET = {}
_BUDGET_FILES = {}
_BUDGET_TESTS = set()


def round_to(x, dtype):
    """``x`` (float64) rounded to the low-precision NumPy ``dtype`` ("float16" or "bfloat16")."""
    return np.asarray(x).astype(LOW_DTYPES[dtype][0])


def ulp(value, dtype):
    """The spacing of the low-precision ``dtype`` at ``|value|`` (its ulp there), as a float."""
    return float(np.abs(np.spacing(np.abs(np.asarray(value, dtype=LOW_DTYPES[dtype][0])))))


def assert_error_budget(op, dtype, tensors, multiple=2.0, extra=None):
    """FlashAttention's error rule: for each named ``(ours, torch_lowp, truth)`` of ``tensors``,
    max |ours - truth| <= multiple * max |torch_lowp - truth| + one ulp of max |truth|
    (+ ``extra[name]`` where given: an error of the float32 computation that the low dtype's
    rounding does not cover, which must be derived in a comment at the call).

    ``ours`` must come back in the low ``dtype``; ``torch_lowp`` is PyTorch computing the same
    thing in that dtype (NumPy array, from to_numpy); ``truth`` is float64 on the same rounded
    inputs. A fourth element, a list of randomly_rounded()'s results for that name, makes PyTorch's
    error the largest of its run's and theirs (RANDOM_ROUNDINGS says when and why). Non-finite
    truth entries (masked -inf) must be matched exactly and are left out of the maxima. The
    multiple reached is recorded per (op, tensor, dtype) for the end-of-run report. A ``multiple``
    other than 2 must be explained by a comment at the call.
    """
    low = LOW_DTYPES[dtype][0]
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]     # "file::test[id] (call)"
    _BUDGET_TESTS.add(test)
    test_file = test.split("::")[0]
    _BUDGET_FILES[op] = min(_BUDGET_FILES.get(op, test_file), test_file)
    for name, (ours, theirs, truth, *rounded) in tensors.items():
        label = f"{op} {name} ({dtype})"
        ours, theirs, truth = np.asarray(ours), np.asarray(theirs), np.asarray(truth, dtype=np.float64)
        assert ours.dtype == low, f"{label}: came back as {ours.dtype}, not {low}"
        assert ours.shape == truth.shape == theirs.shape, f"{label}: shapes {ours.shape}, {theirs.shape}, {truth.shape}"
        finite = np.isfinite(truth)
        o64 = ours.astype(np.float64)
        assert np.array_equal(o64[~finite], truth[~finite]), f"{label}: non-finite entries differ from the truth's"
        if not finite.any():
            continue
        err_ours = float(np.max(np.abs(o64[finite] - truth[finite])))
        err_torch = float(np.max(np.abs(theirs.astype(np.float64)[finite] - truth[finite])))
        err_runs = max((float(np.max(np.abs(np.asarray(r, dtype=np.float64)[finite] - truth[finite])))
                        for r in (rounded[0] if rounded else [])), default=0.0)
        err_ref = max(err_torch, err_runs)
        one_ulp = ulp(np.max(np.abs(truth[finite])), dtype)
        allowance = float((extra or {}).get(name, 0.0))
        bound = multiple * err_ref + one_ulp + allowance
        key = (op, name, dtype)
        # The multiple recorded counts only what the allowance does not cover.
        _keep_multiple(key, max(err_ours - allowance, 0) / err_ref if err_ref > 0 else None)
        _target(err_ours / bound, f"{label} share of budget")
        runs = (f" (the largest of its run's {err_torch:.3g} and {len(rounded[0])} randomly rounded runs' "
                f"{err_runs:.3g})" if rounded else "")
        assert err_ours <= bound, (
            f"{label}: max |ours - truth| = {err_ours:.3g} exceeds {multiple:g} x PyTorch's "
            f"{err_ref:.3g}{runs} + one ulp {one_ulp:.3g} = {bound:.3g}")


# -- PyTorch's error beyond its one run: randomly rounded runs of its program (Monte Carlo arithmetic)
#
# Some drawn cases are ill-conditioned: the softmax backward's cancellation (dS = P * (dP - rowsum(P * dP)))
# amplifies whatever roundings a run makes at its operations' outputs tens of times, and the error of
# one low-precision run is one draw from a wide range. PyTorch's run can land low by chance. Measured
# on a drawn two-layer GPT in float16 (test_gpt's budget test; T = 6, sinusoidal positions): PyTorch's
# dblocks.0.attn.k.w was off by 0.026, eight randomly rounded runs of the same program by 0.05 to 0.17,
# ours by 0.30 (ours in float32 on the same inputs is 1e-6 off: the program is not less accurate, the
# case amplifies a rounding). A test that holds a whole block or model to the rule therefore passes,
# beside PyTorch's run, RANDOM_ROUNDINGS runs of PyTorch's float64 program under RandomRounding: each
# one rounds every operation's output to the low dtype, as PyTorch's own run does, with the rounding
# errors drawn at random; PyTorch's error is the largest of them all.
RANDOM_ROUNDINGS = 8


class RandomRounding(TorchFunctionMode):
    """Every float64 result of a torch function that autograd tracks is multiplied by 1 + e, e uniform
    in [-u/2, u/2] (u the low dtype's unit roundoff), and rounded to the low dtype and back: PyTorch's
    program in float64 run as if each operation rounded its output to the low dtype, a little more
    coarsely than rounding to nearest and at random. Autograd's backward of each cast rounds the
    gradient to the low dtype too, as a low-precision backward does. ``seed`` fixes the draws."""

    def __init__(self, dtype, seed):
        super().__init__()
        self.low = LOW_DTYPES[dtype][1]
        self.half_u = torch.finfo(self.low).eps / 4          # eps is 2u
        self.generator = torch.Generator().manual_seed(seed)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # Untracked results (inputs, constants) and a function returning its argument stay as they are.
        if (isinstance(out, torch.Tensor) and out.dtype == torch.float64 and out.grad_fn is not None
                and not any(a is out for a in args)):
            e = (2 * torch.rand(out.shape, generator=self.generator, dtype=torch.float64) - 1) * self.half_u
            out = (out * (1 + e)).to(self.low).to(torch.float64)
        return out


def randomly_rounded(program, dtype, runs=RANDOM_ROUNDINGS):
    """``program()``, PyTorch's float64 program (the one that gives the truth), run ``runs`` times
    under RandomRounding (seeds 0, 1, ...): the list of its results."""
    results = []
    for seed in range(runs):
        with RandomRounding(dtype, seed):
            results.append(program())
    return results


def gelu_truth(x, approximate):
    """GELU in float64 for a truth, where F.gelu's float64 loses the value: x Phi(x) with Phi from
    torch.special.ndtr, and the tanh form as x sigmoid(2 u), u = sqrt(2/pi) (x + 0.044715 x^3), the
    same function as x (1 + tanh(u)) / 2. F.gelu forms 1 + erf and 1 + tanh, which cancel where x << 0:
    at x = -8 its tanh form gives 0 for -3.1e-21 (tanh(u) rounds to -1), whole in float16's range."""
    if approximate == "none":
        return x * torch.special.ndtr(x)
    return x * torch.sigmoid(2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))


def assert_one_input_budget(op, dtype, ours, twin, builtin, inputs, dout, extra=None, truth=None):
    """assert_error_budget for an op of one differentiable input, for numpy_attn (``op[numpy]``)
    and for the twin (``op[twin]``): ``inputs`` is that input {name: array} and ``dout`` the
    upstream gradient, both already rounded to the low ``dtype`` (every side shares them); ``ours``
    is numpy_attn's (out, d<name>) from them; ``twin`` and ``builtin`` are functions of the input
    by its name (for autograd), the latter PyTorch's own in the low dtype and, run in float64 on
    the same rounded values, the truth (``truth``, a function as ``builtin``, in its place if given).
    Each side is held to it for out and d<name>, with ``extra`` passed on."""
    (name, x), = inputs.items()
    twin_out, twin_grads = autograd(twin, inputs, dout)
    torch_out, torch_grads = autograd(builtin, inputs, dout)
    truth_out, truth_grads = autograd(truth or builtin, {name: x.astype(np.float64)}, dout.astype(np.float64))
    for who, (o, g) in {"numpy": ours, "twin": (twin_out, twin_grads[name])}.items():
        assert_error_budget(f"{op}[{who}]", dtype, {"out": (o, torch_out, truth_out),
                                                     f"d{name}": (g, torch_grads[name], truth_grads[name])},
                            extra=extra)


def _keep_multiple(key, multiple):
    """The largest multiple recorded for ``key``; None (PyTorch's error 0) only while every one was."""
    old = _BUDGET.get(key)
    _BUDGET[key] = old if multiple is None else max(old or 0.0, multiple)


def budget_rows():
    """The multiples recorded by assert_error_budget, as rows for the conftest's JSON: the multiple
    None where PyTorch's error was 0 in every case, test_file the first by name that checked the op."""
    return [dict(op=op, tensor=name, dtype=dtype, multiple=value, test_file=_BUDGET_FILES[op])
            for (op, name, dtype), value in sorted(_BUDGET.items())]


def budget_tests():
    """The node ids of the tests that have called assert_error_budget in this run."""
    return set(_BUDGET_TESTS)


def _target(value, label):
    """Let Hypothesis steer towards larger errors (only inside a @given test)."""
    from hypothesis import target
    from hypothesis.control import currently_in_test_context

    if currently_in_test_context() and math.isfinite(value):
        target(value, label=label)


def error_report(most=None):
    """One line per compared tensor and dtype: the largest errors recorded this run, by name; with
    ``most``, only that many lines, those that used the largest share of their tolerance first."""
    rows = sorted(_WORST.items())
    if most is not None:
        rows = sorted(rows, key=lambda row: -row[1][1])[:most]
    width = max((len(name) for (name, _), _ in rows), default=0)
    return [
        f"{name:<{width}}  {dtype:<8} max abs error {err:9.2e}   tolerance used {used:6.1%}"
        for (name, dtype), (err, used) in rows
    ]


def error_rows():
    """The largest errors per test file, compared tensor and dtype, as rows for ERROR_JSON."""
    return [dict(test_file=test_file, name=name, dtype=dtype, max_abs_error=err, tolerance_used=used)
            for (test_file, name, dtype), (err, used) in sorted(_WORST_BY_FILE.items())]


def merged_error_rows(old, new):
    """ERROR_JSON's rows after a run: the run's ``new`` rows, and those of ``old`` (the file's rows
    before it) whose test file the run measured nothing of. A run of some test files so updates
    theirs and keeps every other file's last measurement, for the site's pages."""
    measured = {row["test_file"] for row in new}
    kept = [row for row in old if row["test_file"] not in measured]
    return sorted(kept + new, key=lambda row: (row["test_file"], row["name"], row["dtype"]))


def records():
    """Everything this process recorded (largest errors, budget multiples, budget tests), as lists
    that pytest-xdist can send: a worker sends its records to the controller, which merges them
    (merge_records) and writes the reports from the whole run."""
    return {"worst": [[*key, *value] for key, value in _WORST.items()],
            "worst_by_file": [[*key, *value] for key, value in _WORST_BY_FILE.items()],
            "budget": [[*key, value] for key, value in _BUDGET.items()],
            "budget_files": sorted(_BUDGET_FILES.items()),
            "budget_tests": sorted(_BUDGET_TESTS)}


def merge_records(found):
    """Fold another process's ``records()`` into this one's, as if its comparisons had run here."""
    for *key, err, used in found["worst"]:
        _keep_worst(_WORST, tuple(key), err, used)
    for *key, err, used in found["worst_by_file"]:
        _keep_worst(_WORST_BY_FILE, tuple(key), err, used)
    for *key, multiple in found["budget"]:
        _keep_multiple(tuple(key), multiple)
    for op, test_file in found["budget_files"]:
        _BUDGET_FILES[op] = min(_BUDGET_FILES.get(op, test_file), test_file)
    _BUDGET_TESTS.update(found["budget_tests"])


def numerical_grad(f, x, dout, h=1e-3):
    """Finite-difference gradient of ``sum(f(x) * dout)`` with respect to ``x`` (float64, no torch).

    The five-point central stencil [-g(x+2h) + 8g(x+h) - 8g(x-h) + g(x-2h)] / 12h has truncation
    error O(h^4) (about 1e-12 at h = 1e-3 for smooth f) and rounding error about
    1e-16 * |sum| / h (1e-10 for sums of a few hundred): far below FD_TOL. The plain two-point
    stencil needs h near 1e-6 and then loses 1e-8 to rounding, which Hypothesis finds.
    """
    assert x.dtype == np.float64, "finite differences need float64"
    grad = np.zeros_like(x)
    flat_x, flat_g = x.reshape(-1), grad.reshape(-1)   # views: writing them writes x and grad

    def g(i, step):
        flat_x[i] = old + step
        return np.sum(f(x) * dout)

    for i in range(flat_x.size):
        old = flat_x[i]
        flat_g[i] = (-g(i, 2 * h) + 8 * g(i, h) - 8 * g(i, -h) + g(i, -2 * h)) / (12 * h)
        flat_x[i] = old
    return grad


# Finite differences agree with the exact gradient to about 1e-10 (see numerical_grad): far looser
# than float64 round-off, far tighter than any real bug.
FD_TOL = dict(rtol=1e-6, atol=1e-8)


def _vocabulary_available():
    from attn_cli import tokenizer

    try:
        tokenizer.get_encoding()
    except tokenizer.TokenizerUnavailable:
        return False
    return True


# Tests that need GPT-2's vocabulary skip without it on a developer's machine, but never in CI,
# where .ci/run provides it and a skip would hide a broken tokenizer.
needs_vocab = pytest.mark.skipif(
    not os.environ.get("CI") and not _vocabulary_available(),
    reason="GPT-2 vocabulary unavailable: set TIKTOKEN_CACHE_DIR (README, 'Tokenizer offline')",
)


# A cell's tooltip in plots.heatmap_svg: "query 'cat' -> key 'The': 0.4123", " (masked)" after a masked one.
HEATMAP_TITLE = re.compile(r"query (?P<query>'.*'|\".*\") -> key (?P<key>'.*'|\".*\"): "
                           r"(?P<number>\S+)(?P<masked> \(masked\))?")


def heatmap_cells(svg):
    """The cells of a heatmap drawn by plots.heatmap_svg (an SVG document, or an <svg> element
    inlined in a page without its namespace), read back as XML: [(query, key, number as written,
    masked, x, y, fill, class)] in the document's order, one per <rect> with a <title>."""
    root = ET.fromstring(svg)
    cells = []
    for rect in root.iter():
        title = rect.find("{*}title")
        if rect.tag.rpartition("}")[2] != "rect" or title is None:
            continue
        match = HEATMAP_TITLE.fullmatch(title.text)
        assert match, f"a cell's title does not say query, key and value: {title.text!r}"
        cells.append((ast.literal_eval(match["query"]), ast.literal_eval(match["key"]), match["number"],
                      bool(match["masked"]), float(rect.get("x")), float(rect.get("y")), rect.get("fill"),
                      rect.get("class")))
    return cells


def load_docs_script(path):
    """A docs/ script (not a package module) imported from its file, for a test to call its functions."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tree_dot(a, b):
    """The sum over all leaves of sum(a * b): a directional derivative from a gradient tree."""
    return sum(float(np.sum(x * dict(tree_leaves(b))[path])) for path, x in tree_leaves(a))


def directional_derivative(f, tree, direction, h=1e-4):
    """Finite-difference derivative of the scalar ``f(tree)`` along ``direction`` (float64).

    One number checks every gradient of a large model at once: it must equal
    ``tree_dot(grads, direction)``; four evaluations of f however many parameters there are. The
    five-point stencil of numerical_grad, with a smaller default step: moving every parameter at
    once makes the fifth derivative along the direction, and so the O(h^4) truncation error, far
    larger than along one coordinate (the thorough profile found 1.3e-6 relative at h = 1e-3 in a
    two-layer GPT). At h = 1e-4 truncation is negligible and rounding about 1e-16 * |f| / h stays
    near 1e-12 * |f|: FD_TOL applies.
    """
    assert all(x.dtype == np.float64 for _, x in tree_leaves(tree)), "finite differences need float64"

    def g(step):
        return f(tree_map(lambda x, d: x + step * d, tree, direction))

    return (-g(2 * h) + 8 * g(h) - 8 * g(-h) + g(-2 * h)) / (12 * h)


def decode_in_steps(step, ids, sizes):
    """Logits (B, T, V) of feeding ids (B, T) to ``step`` in chunks of ``sizes`` tokens, in order:
    ``step(chunk)`` runs one forward with a KV cache and returns that chunk's logits."""
    chunks, start = [], 0
    for n in sizes:
        chunks.append(step(ids[:, start:start + n]))
        start += n
    return np.concatenate(chunks, axis=1)


def reorder_tol(rstds, dtype):
    """How far two runs of one model may differ when only the order of some sums differs (cached
    decoding against the full forward: a softmax over past + T entries instead of T with exact
    zeros at the masked ones, BLAS blocking a matmul of 1 row differently from one of T rows).

    A reordered sum of n terms moves by at most n * eps times the sum of its |terms|: a few ulps
    of every value, which each norm multiplies by its rstd (see layer_norm_tol). float64: rtol
    1e-12 (a few thousand ulps of 1.1e-16) times the largest rstd. float32: layer_norm_tol, the
    bound already used for two float32 programs that differ only in rounding order.
    """
    rstds = list(rstds)
    rstd = max([1.0] + [float(r.max()) for r in rstds])
    if np.dtype(dtype) == np.float64:
        return dict(rtol=1e-12 * rstd, atol=1e-12 * rstd)
    return layer_norm_tol(rstds, dtype)


def directional_tol(grads, direction):
    """FD_TOL for a directional derivative, its atol relative to sum |grad| * |direction|.

    The derivative is a dot product of many terms; when they cancel to a small result, the
    finite difference's error is still relative to the terms (the thorough profile finds terms
    of 300 from a layer norm on a constant row summing to 0.6), not to the sum.
    """
    scale = tree_dot(tree_map(np.abs, grads), tree_map(np.abs, direction))
    return dict(rtol=FD_TOL["rtol"], atol=FD_TOL["atol"] + FD_TOL["rtol"] * scale)


def elementwise_fd_tol(f, x, dout, h=1e-3):
    """FD_TOL for ``numerical_grad(f, x, dout, h)`` of an elementwise ``f`` whose outputs may be
    huge (dropout's 1 / (1 - p) reaches 9e15 as p nears 1), its atol widened by the stencil's
    rounding error.

    Each of the stencil's four sums of n terms f(x)_i * dout_i is computed with at most
    (rounds + log2 n) roundings per term (``rounds`` = 4 covers an elementwise f of up to three
    roundings and the product; NumPy's pairwise sum adds log2 n), so each is off by at most
    (rounds + log2 n) * eps * sum |f(x) * dout|; the stencil's weights (1 + 8 + 8 + 1) / 12h
    carry that into the gradient. For every entry, even one whose exact gradient is 0: a dropped
    element's finite difference is noise of that size, however exact the backward.
    """
    rounds = 4
    n = max(x.size, 1)
    terms = float(np.sum(np.abs(f(x) * dout)))
    rounding = 1.5 / h * (rounds + np.log2(n)) * np.finfo(np.float64).eps * terms
    return dict(rtol=FD_TOL["rtol"], atol=FD_TOL["atol"] + rounding)


def assert_bad_dout_refused(backward_name, out, backward, cache, dout_name="dout"):
    """``backward(dout, cache)`` refuses an upstream gradient unlike the forward's output ``out``:
    one more entry along the last axis, the last two axes swapped (where that changes the shape)
    and a 0-d one for a non-0-d output (ValueError); the other float dtype, integers and a nested
    list (TypeError). Each message names the backward, the argument and the expected and received
    shape or dtype."""
    other = np.float32 if out.dtype == np.float64 else np.float64
    longer = out.shape[:-1] + (out.shape[-1] + 1,) if out.ndim else (1,)
    cases = [(ValueError, np.zeros(longer, out.dtype), (str(out.shape), str(longer))),
             (TypeError, np.zeros(out.shape, other), (str(out.dtype), str(np.dtype(other)))),
             (TypeError, np.zeros(out.shape, np.int64), (str(out.dtype), "int64")),
             (TypeError, np.zeros(out.shape).tolist() if out.ndim else [0.0], (str(out.shape), "list"))]
    if out.ndim:
        cases.append((ValueError, np.zeros((), out.dtype), (str(out.shape), "()")))
    if out.ndim >= 2 and out.shape[-1] != out.shape[-2]:
        swapped = np.zeros(out.shape, out.dtype).swapaxes(-1, -2)
        cases.append((ValueError, swapped, (str(out.shape), str(swapped.shape))))
    for error, dout, mentions in cases:
        with pytest.raises(error) as info:
            backward(dout, cache)
        message = str(info.value)
        missing = [m for m in (f"{backward_name}: {dout_name}",) + mentions if m not in message]
        assert not missing, \
            f"{backward_name} given {type(dout).__name__} {np.shape(dout)}: {missing} not in {message!r}"


def assert_normal_draws(name, w, std):
    """``w`` (at least 1024 draws, any dtype) looks drawn from N(0, std^2): its sample mean within 5
    standard errors (std / sqrt(n)) of 0, its sample std within 10% of std, which for n >= 1024 is
    at least 4.5 of the sample std's standard errors (std / sqrt(2 n)). A mean or spread moved by
    a fraction of std fails; a fixed seed's draws pass or fail alike on every machine."""
    w = np.asarray(w, np.float64).ravel()
    assert w.size >= 1024, f"{name}: {w.size} draws are too few to tell the spread within 10%"
    mean, sample_std = w.mean(), w.std()
    assert abs(mean) < 5 * std / np.sqrt(w.size) and abs(sample_std - std) < 0.1 * std, \
        f"{name}: mean {mean:.3g}, std {sample_std:.3g}, drawn from N(0, {std}^2)?"


def moved_off_init(params, rng):
    """``params`` (a nested dict) with every leaf moved by U(-0.5, 0.5) drawn from ``rng``, in its
    own dtype: so that norms, biases and embeddings are not at their initial 1s, 0s and near-0s."""
    return tree_map(lambda p: (p + rng.uniform(-0.5, 0.5, p.shape)).astype(p.dtype), params)


def layer_norm_rstds(cache):
    """The rstd of every layer norm of a gpt_forward cache (the norms' caches are (xhat, rstd, w)):
    ln_f's, then each block's ln1 and ln2."""
    return [cache.ln_f[1]] + [r for c in cache.blocks for r in (c.ln1[1], c.ln2[1])]


def assert_backward_matches_finite_differences(name, forward, backward, tree, dout, seed, rstds=None):
    """One directional derivative of sum(out * dout) along a random direction (from ``seed``) in
    every leaf of ``tree``: ``forward(tree) -> (out, cache)`` and ``backward(dout, cache)``, whose
    gradients have ``tree``'s nesting, against directional_derivative, to directional_tol.

    ``rstds(cache)`` lists the rstd arrays of the model's norms. A norm varies on the scale of its
    row's spread sqrt(var + eps) = 1 / rstd, as small as sqrt(eps) = 3e-3 on a constant row; the
    step shrinks with the narrowest row so that the stencil's truncation error stays that of unit
    rows (its rounding error grows by rstd <= 316, still below FD_TOL).
    """
    rng = np.random.default_rng(seed)
    direction = tree_map(lambda p: rng.uniform(-1, 1, p.shape), tree)
    _, cache = forward(tree)
    grads = backward(dout, cache)
    exact = tree_dot(grads, direction)
    h = 1e-4 / max([1.0] + [float(r.max()) for r in (rstds(cache) if rstds else [])])
    numeric = directional_derivative(lambda t: np.sum(forward(t)[0] * dout), tree, direction, h=h)
    assert_close(f"{name} directional derivative vs finite differences", np.float64(exact),
                 np.float64(numeric), **directional_tol(grads, direction))


def decode_with_cache(forward, new_kv_cache, config, params, ids, sizes):
    """Logits (B, T, V) of decoding ids (B, T) in steps of ``sizes`` tokens through
    ``forward(chunk, params, config, kv_cache=...) -> (logits, cache)`` with one cache from
    ``new_kv_cache(config, B, dtype)``, and that cache."""
    kv_cache = new_kv_cache(config, ids.shape[0], params["wte"].dtype)
    logits = decode_in_steps(lambda chunk: forward(chunk, params, config, kv_cache=kv_cache)[0], ids, sizes)
    return logits, kv_cache


def twin_decode_with_cache(twin, new_kv_cache, config, params, ids, sizes):
    """decode_with_cache for a torch twin ``twin(chunk, params, config, kv_cache=...) -> logits``:
    its logits (B, T, V) as a NumPy array, and its cache."""
    tparams = tree_map(to_torch, params)
    kv_cache = new_kv_cache(config, ids.shape[0], tparams["wte"].dtype)
    logits = decode_in_steps(lambda chunk: to_numpy(twin(to_torch(chunk), tparams, config, kv_cache=kv_cache)),
                             ids, sizes)
    return logits, kv_cache


def assert_twin_cache_equal(name, twin_cache, kv_cache, end, tol):
    """The twin's key/value cache holds the NumPy cache's lengths, and its keys and values at the
    first ``end`` positions (the rest is never written)."""
    assert twin_cache.lengths == kv_cache.lengths.tolist(), f"{name} cache lengths"
    assert_close(f"{name}.cache.k", to_numpy(twin_cache.k)[..., :end, :], kv_cache.k[..., :end, :], **tol)
    assert_close(f"{name}.cache.v", to_numpy(twin_cache.v)[..., :end, :], kv_cache.v[..., :end, :], **tol)


def assert_bad_ids_refused(forward, params, config):
    """``forward(ids, params, config)`` refuses ids longer than block_size, an id outside the
    vocabulary and float ids, each message naming the ids and what was wrong."""
    T, V = config.block_size + 1, config.vocab_size
    with pytest.raises(ValueError, match=rf"sequence length T = {T} of ids \(1, {T}\) exceeds "
                                         rf"block_size = {T - 1}"):
        forward(np.zeros((1, T), int), params, config)
    with pytest.raises(ValueError, match=rf"token id {V} is out of range for a vocabulary of size V = {V}"):
        forward(np.array([[0, V]]), params, config)
    with pytest.raises(TypeError, match=r"token ids must be integers, got dtype float64"):
        forward(np.zeros((1, 2)), params, config)


def numerical_grads(forward, x, params, dout):
    """numerical_grad of sum(forward(x, params) * dout) with respect to x and to every leaf of
    ``params`` ({layer: {"w": ..., "b": ...}}), as {"x": dx, layer: {key: gradient}}."""
    expected = {"x": numerical_grad(lambda x: forward(x, params), x.copy(), dout)}
    for name, layer in params.items():
        expected[name] = {}
        for key, leaf in layer.items():
            def f(value, name=name, key=key):
                return forward(x, {**params, name: {**params[name], key: value}})
            expected[name][key] = numerical_grad(f, leaf.copy(), dout)
    return expected


def load_linears(layers, params):
    """Copy our linear layers ``params`` ({name: {"w": (C_in, C_out), "b"}}) into the nn.Linear
    modules ``layers`` ({name: module}), which store w as (C_out, C_in)."""
    with torch.no_grad():
        for name, layer in layers.items():
            layer.weight.copy_(to_torch(params[name]["w"].T))
            if "b" in params[name]:
                layer.bias.copy_(to_torch(params[name]["b"]))


def linear_grads(layers):
    """The gradients of the nn.Linear modules ``layers`` ({name: module}) in our nesting and
    orientation: {name: {"w": (C_in, C_out), "b": (C_out,) where the module has a bias}}."""
    return {name: {"w": to_numpy(layer.weight.grad).T,
                   **({"b": to_numpy(layer.bias.grad)} if layer.bias is not None else {})}
            for name, layer in layers.items()}


def assert_logits_match_twin(name, forward, twin, params, dout, tol):
    """A model's logits, ``forward(params) -> (logits, cache)``, equal its torch twin's,
    ``twin(params) -> logits``, to ``tol(cache, dtype)``; labelled ``name``.logits."""
    logits, cache = forward(params)
    twin_logits, _ = autograd(twin, {"params": params}, dout)
    assert_close(f"{name}.logits", logits, twin_logits, **tol(cache, logits.dtype))


def assert_grads_match_autograd(name, forward, backward, twin, params, dout, tol):
    """Every gradient of a model's ``params``, ``backward(dout, cache)``, equals autograd's
    through its twin (as in assert_logits_match_twin), labelled by path under ``name``."""
    _, cache = forward(params)
    dparams = backward(dout, cache)
    _, grads = autograd(twin, {"params": params}, dout)
    assert_tree_close(name, dparams, grads["params"], **tol(cache, dout.dtype))


def assert_bad_config_rng_and_dlogits_refused(backward_name, forward, backward, init_params, params, config):
    """A model refuses a config of another type (a dict), an rng that is not a np.random.Generator
    and dlogits (1, 3, 4) for logits (1, 3, V), each message naming what is wrong."""
    ids = np.zeros((1, 3), np.int64)
    with pytest.raises(TypeError, match=f"config must be a {type(config).__name__}, got dict"):
        forward(ids, params, {})
    with pytest.raises(TypeError, match="rng must be a np.random.Generator, got int"):
        init_params(config, 0)
    _, cache = forward(ids, params, config)
    with pytest.raises(ValueError, match=rf"{backward_name}: dlogits must have the shape .* "
                                         rf"\(1, 3, {config.vocab_size}\), got \(1, 3, 4\)"):
        backward(np.zeros((1, 3, 4)), cache)


def assert_model_keeps_dtype(name, forward, backward, params, config, dtype):
    """A model's logits for ids (1, 3), and every gradient of ``params``, come back in ``dtype``."""
    logits, cache = forward(np.array([[1, 2, 2]]), params, config)
    grads = backward(ramp(*logits.shape, dtype=dtype), cache)
    assert logits.dtype == dtype, f"{name}.logits dtype {logits.dtype}"
    for path, g in tree_leaves(grads):
        assert g.dtype == dtype, f"{name}.{path} gradient dtype {g.dtype}"


def assert_tree_error_budget(op, dtype, ours, theirs, truth):
    """assert_error_budget over every leaf of matching trees {name: array or {name: ...}}."""
    ours, theirs, truth = flatten(ours), flatten(theirs), flatten(truth)
    assert ours.keys() == theirs.keys() == truth.keys(), f"{op}: {sorted(ours)} vs {sorted(truth)}"
    assert_error_budget(op, dtype, {k: (ours[k], theirs[k], truth[k]) for k in ours})


def rounded_case(case, dtype):
    """(x, params, dout) rounded to the low ``dtype``, and the same rounded values in float64."""
    low = tuple(tree_map(lambda a: round_to(a, dtype), part) for part in case)
    return low, tuple(tree_map(lambda a: a.astype(np.float64), part) for part in low)


def assert_same_distribution(name, ours, theirs):
    """Assert two samples of initial weights agree in mean, spread and sign balance to 5 standard
    errors (a false alarm about once in 3.5 million per statistic; the seeds are fixed, so the
    test is deterministic). The standard error of a sample's standard deviation s from n draws is
    s * sqrt((kurtosis - 1) / (4 n)), with the kurtosis estimated from the sample."""
    ours, theirs = np.asarray(ours, np.float64).ravel(), np.asarray(theirs, np.float64).ravel()
    mean_ours, mean_theirs = ours.mean(), theirs.mean()
    s, t = ours.std(), theirs.std()
    se_mean = np.sqrt(s**2 / ours.size + t**2 / theirs.size)
    assert abs(mean_ours - mean_theirs) <= 5 * se_mean, \
        f"{name}: mean {mean_ours:.3g} vs the built-in's {mean_theirs:.3g} (5 se {5 * se_mean:.2g})"

    def se_std(x, sd):
        kurtosis = np.mean((x - x.mean()) ** 4) / sd**4
        return sd * np.sqrt((kurtosis - 1) / (4 * x.size))

    se = np.hypot(se_std(ours, s), se_std(theirs, t))
    assert abs(s - t) <= 5 * se, f"{name}: spread {s:.4g} vs the built-in's {t:.4g} (5 se {5 * se:.2g})"
    for label, x in (("ours", ours), ("built-in", theirs)):
        positive = np.mean(x > 0)
        assert abs(positive - 0.5) <= 5 * 0.5 / np.sqrt(x.size), \
            f"{name} ({label}): {positive:.4f} of the entries are positive, not half"


def assert_drawn_like_nn_linear(params, layers, bias):
    """Every layer ``name`` of ``layers`` ((name, C_in, C_out), ...) of ``params`` is drawn like
    nn.Linear's default (kaiming_uniform with a = sqrt(5), i.e. U(-1/sqrt(C_in), 1/sqrt(C_in)), and
    the same for the bias): mean, spread, sign balance and range of every leaf against an
    nn.Linear of the same size; no "b" without ``bias``."""
    torch.manual_seed(0)
    for name, C_in, C_out in layers:
        builtin = nn.Linear(C_in, C_out, bias=bias, dtype=torch.float64)
        bound = 1 / np.sqrt(C_in)
        pairs = [("w", params[name]["w"], to_numpy(builtin.weight))]
        if bias:
            pairs.append(("b", params[name]["b"], to_numpy(builtin.bias)))
        else:
            assert "b" not in params[name], f"{name}.b exists without bias"
        for key, ours, theirs in pairs:
            assert_same_distribution(f"{name}.{key}", ours, theirs)
            assert np.abs(ours).max() <= bound, f"{name}.{key} leaves (-{bound}, {bound})"
            # The largest |entry| of n uniform draws falls short of the bound by about bound / n.
            assert np.abs(ours).max() >= bound * (1 - 20 / ours.size), f"{name}.{key} does not reach the bound"
