"""Tests of numpy_attn/testing.py: check passes numpy_attn's operations and torch_attn's twins, and
catches bugs planted in implementations written here, its report naming the output or gradient
that is wrong."""

import ast
import contextlib
import functools
import io
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings

import numpy_attn
import torch_attn.attention as tw_attention
import torch_attn.flash_attention as tw_flash_attention
import torch_attn.gelu as tw_gelu
import torch_attn.layer_norm as tw_layer_norm
import torch_attn.linear as tw_linear
import torch_attn.multi_head as tw_multi_head
import torch_attn.rms_norm as tw_rms_norm
import torch_attn.softmax as tw_softmax
from attn_cli import cli
from numpy_attn.attention import scaled_dot_product_attention_backward, scaled_dot_product_attention_forward
from numpy_attn.flash_attention import flash_attention_backward, flash_attention_forward
from numpy_attn.gelu import gelu_backward, gelu_forward
from numpy_attn.layer_norm import layer_norm_backward, layer_norm_forward
from numpy_attn.linear import linear_backward, linear_forward
from numpy_attn.multi_head import multi_head_attention_backward, multi_head_attention_forward
from numpy_attn.rms_norm import rms_norm_backward, rms_norm_forward
from numpy_attn.softmax import softmax_backward, softmax_forward
from numpy_attn.testing import OPERATIONS, CheckFailure, arrays, check, floats

# Few examples per call: each planted bug below fails on most inputs, and the passing checks run
# every operation's strategies in full (python -m numpy_attn.testing's default is 50).
FEW = 12

NUMPY = {
    "softmax": (softmax_forward, softmax_backward),
    "linear": (linear_forward, linear_backward),
    "layer_norm": (layer_norm_forward, layer_norm_backward),
    "rms_norm": (rms_norm_forward, rms_norm_backward),
    "gelu": (gelu_forward, gelu_backward),
    "attention": (scaled_dot_product_attention_forward, scaled_dot_product_attention_backward),
    "flash_attention": (flash_attention_forward, flash_attention_backward),
    "multi_head": (multi_head_attention_forward, multi_head_attention_backward),
}
TWINS = {
    "softmax": tw_softmax.softmax,
    "linear": tw_linear.linear,
    "layer_norm": tw_layer_norm.layer_norm,
    "rms_norm": tw_rms_norm.rms_norm,
    "gelu": tw_gelu.gelu,
    "attention": tw_attention.scaled_dot_product_attention,
    "flash_attention": tw_flash_attention.flash_attention,
    "multi_head": tw_multi_head.multi_head_attention,
}


def wrong(report):
    """The names of the outputs and gradients a report says are wrong."""
    return set(re.findall(r"^  wrong: ([\w.]+):", report, flags=re.M))


def failing(op, forward, backward=None, **options):
    """The report of check(op, ...), which must fail."""
    with pytest.raises(CheckFailure) as info:
        check(op, forward, backward, examples=FEW, seed=1, **options)
    return str(info.value)


# -- the operations themselves pass ---------------------------------------------------------------

def test_every_operation_has_a_pair_here():
    assert sorted(NUMPY) == sorted(TWINS) == sorted(OPERATIONS)


def counted(fn):
    """``fn`` with a count of its calls (``.calls``), its signature kept: the tests below see that
    check ran the function under test on examples, not only that it raised nothing."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        wrapper.calls += 1
        return fn(*args, **kwargs)
    wrapper.calls = 0
    return wrapper


@pytest.mark.parametrize("op", sorted(OPERATIONS))
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_numpy_attn_passes(op, dtype):
    forward, backward = (counted(f) for f in NUMPY[op])
    assert check(op, forward, backward, examples=FEW, seed=2, dtype=dtype, framework="numpy") is None
    assert forward.calls >= 1 and backward.calls >= 1


@pytest.mark.parametrize("op", sorted(OPERATIONS))
@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_torch_twin_passes(op, dtype):
    """A torch function is recognised as such, autograd gives its backward."""
    twin = counted(TWINS[op])
    assert check(op, twin, examples=FEW, seed=3, dtype=dtype, framework="torch") is None
    assert twin.calls >= 1


def test_pytorch_builtin_attention_passes():
    """F.scaled_dot_product_attention (fully masked rows give 0 there too), grouped heads through
    enable_gqa."""
    def sdpa(q, k, v, **options):
        sdpa.calls += 1
        return F.scaled_dot_product_attention(q, k, v, **options, enable_gqa=q.shape[:-2] != k.shape[:-2])
    sdpa.calls = 0
    assert check("attention", sdpa, examples=FEW, seed=4) is None
    assert sdpa.calls >= 1


def test_torch_softmax_differs_on_fully_masked_rows():
    """torch.softmax gives NaN on a row of -inf, numpy_attn 0 (docs/design.md): check says so, and
    passes it on rows with a finite entry (masked=False)."""
    report = failing("softmax", lambda x, dim=-1: torch.softmax(x, dim))
    assert wrong(report) == {"out", "dx"} and "got nan, expected 0" in report, report
    check("softmax", lambda x, dim=-1: torch.softmax(x, dim), examples=FEW, masked=False)


# -- an implementation written here, with bugs to plant ---------------------------------------------

def softmax_rows(s):
    """Softmax over the last axis; a row of -inf gives 0."""
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isneginf(m), 0, m))
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total == 0, 1, total)


def user_softmax(bug=None):
    def forward(x):
        y = softmax_rows(np.moveaxis(x, 0, -1)).swapaxes(0, -1) if bug == "axis" else softmax_rows(x)
        return y, y

    def backward(dy, y):
        if bug == "term":                                   # the - sum(dy * y) term forgotten
            return y * dy
        return y * (dy - (dy * y).sum(axis=-1, keepdims=True))
    return forward, backward


def user_linear(bug=None):
    def forward(x, w, b=None):
        return x @ w + (0 if b is None else b), (x, w, b is not None)

    def backward(dout, cache):
        x, w, has_b = cache
        rows_x, rows_d = x.reshape(-1, x.shape[-1]), dout.reshape(-1, dout.shape[-1])
        dw = rows_d.T @ rows_x if bug == "transpose" else rows_x.T @ rows_d
        db = rows_d[-1] if bug == "sum" else rows_d.sum(axis=0)         # "sum": db of the last row only
        return dout @ w.T, ({"w": dw, "b": db} if has_b else {"w": dw})
    return forward, backward


def user_attention(bug=None):
    """Attention with masks, is_causal (top-left) and grouped heads, in NumPy."""
    def forward(q, k, v, attn_mask=None, is_causal=False, scale=None):
        T, hs = q.shape[-2:]
        S = k.shape[-2]
        scale = (1 / hs if bug == "scale" else 1 / np.sqrt(hs)) if scale is None else scale
        g = q.shape[-3] // k.shape[-3] if q.ndim >= 3 else 1
        kr, vr = np.repeat(k, g, axis=-3) if g > 1 else k, np.repeat(v, g, axis=-3) if g > 1 else v
        s = (q * scale) @ kr.swapaxes(-1, -2)
        mask = np.tri(T, S, dtype=bool) if is_causal else attn_mask
        if mask is not None and bug != "mask":
            s = s + (np.where(mask, 0, -np.inf) if mask.dtype == np.bool_ else mask)
        w = softmax_rows(s)
        return w @ vr, (q, kr, vr, w, scale, g)

    def backward(dout, cache):
        q, kr, vr, w, scale, g = cache
        dv = w.swapaxes(-1, -2) @ dout
        dw = dout @ vr.swapaxes(-1, -2)
        ds = w * (dw - (dw * w).sum(axis=-1, keepdims=True))
        dq = ds @ kr * scale
        dk = ds.swapaxes(-1, -2) @ q * scale
        if g > 1 and bug != "group sum":       # each key/value head sums the gradients of its g query heads
            dk, dv = (d.reshape(d.shape[:-3] + (-1, g) + d.shape[-2:]).sum(axis=-3) for d in (dk, dv))
        return dq, dk, dv
    return forward, backward


def torch_attention_without_mask(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """The twin with attn_mask forgotten."""
    return tw_attention.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)


def test_the_implementation_written_here_passes():
    for op, (forward, backward), options in (("softmax", user_softmax(), {"axis": -1}), ("linear", user_linear(), {}),
                                              ("attention", user_attention(), {})):
        forward, backward = counted(forward), counted(backward)
        assert check(op, forward, backward, examples=FEW, framework="numpy", **options) is None
        assert forward.calls >= 1 and backward.calls >= 1, op


# -- planted bugs are caught, and the report names what is wrong -------------------------------------

def test_wrong_scale():
    """1 / hs in place of 1 / sqrt(hs); the report read whole: operation, options, the function,
    the index, the tolerance and why, the smallest input with its values, how to reproduce."""
    report = failing("attention", user_attention("scale")[0], scale=False)
    assert wrong(report) == {"out"}, report
    assert report.startswith("attention: the function under test disagrees with numpy_attn's (float64, seed 1")
    for text in ("options: scale=False\n", "user_attention.<locals>.forward (NumPy, forward only)",
                 "out: at index (", "tolerance there: atol 1e-12 + rtol 1e-10",
                 "why this tolerance: float64's rtol 1e-10, atol 1e-12 (two correct",
                 "smallest failing input found (after shrinking):", "    q (", " float64 =\n",
                 "reproduce: check('attention', ..., examples=12, seed=1"):
        assert text in report, (text, report)


def test_softmax_over_the_wrong_axis():
    report = failing("softmax", *user_softmax("axis"), axis=-1, masked=False)
    assert wrong(report) >= {"out"}, report


def test_missing_mask():
    report = failing("attention", user_attention("mask")[0], masks=("bool", "float", "causal"))
    assert wrong(report) == {"out"}, report
    # With autograd: the weights are wrong, so out = weights @ v or dv = weights^T @ dout is (the
    # shrinker may pick v = 0 or dout = 0, leaving one of them right).
    report = failing("attention", torch_attention_without_mask, masks=("bool", "float"))
    assert wrong(report) & {"out", "dv"} and wrong(report) <= {"out", "dq", "dk", "dv"}, report


def test_gradient_off_by_a_transpose():
    report = failing("linear", *user_linear("transpose"))
    assert wrong(report) == {"dw"}, report


def test_missing_sum_over_an_axis():
    report = failing("linear", *user_linear("sum"), bias=True)
    assert wrong(report) == {"db"}, report
    report = failing("attention", *user_attention("group sum"))
    assert wrong(report) == {"dk", "dv"} and "shape" in report, report


def test_the_tanh_approximation_for_the_exact_gelu():
    """GELU's tanh form differs from the exact one by up to 5e-4: far beyond float64's tolerance."""
    def gelu_tanh(x, approximate="none"):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))), None
    report = failing("gelu", gelu_tanh, approximate=("none",))
    assert wrong(report) == {"out"}, report
    check("gelu", gelu_tanh, examples=FEW, approximate=("tanh",), framework="numpy")


def test_missing_term():
    report = failing("softmax", *user_softmax("term"), axis=-1)
    assert wrong(report) == {"dx"}, report


# -- multi_head with dropout (a replayed keep-mask) and grouped heads -----------------------------------

def multi_head_twin(bug=None):
    """torch_attn's multi-head attention as a user's, with a bug planted on request: "own mask"
    draws its own keep-mask instead of the one given, "scale" scales the kept weights by
    1 / (1 - p/2) for 1 / (1 - p), "tiled" repeats the key/value heads k0 k1 k0 k1 for k0 k0 k1 k1."""
    def forward(x, params, num_heads, *, attn_mask=None, is_causal=False, dropout_p=0.0, keep=None, kv=None):
        if bug == "own mask" and keep is not None:
            keep = torch.rand(keep.shape, generator=torch.Generator().manual_seed(0)) < 1 - dropout_p
        if bug == "scale":
            dropout_p = dropout_p / 2
        if bug != "tiled":
            return tw_multi_head.multi_head_attention(x, params, num_heads, attn_mask=attn_mask, is_causal=is_causal,
                                                      dropout_p=dropout_p, keep=keep, kv=kv)
        src = x if kv is None else kv
        hs = x.shape[-1] // num_heads
        nkv = params["k"]["w"].shape[-1] // hs
        q = tw_multi_head.split_heads(tw_linear.linear(x, **params["q"]), num_heads)     # (B, nh, T, hs)
        k = tw_multi_head.split_heads(tw_linear.linear(src, **params["k"]), nkv)         # (B, nkv, S, hs)
        v = tw_multi_head.split_heads(tw_linear.linear(src, **params["v"]), nkv)
        k, v = k.repeat(1, num_heads // nkv, 1, 1), v.repeat(1, num_heads // nkv, 1, 1)  # planted: tiled
        y, _ = tw_attention.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
        return tw_linear.linear(tw_multi_head.merge_heads(y), **params["o"])
    return forward


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_multi_head_with_dropout_and_grouped_heads_passes(dtype):
    """numpy_attn's forward replays the keep-mask from the seeded rng it gets (a NumPy forward
    without keep=), the twin takes the mask as keep=; in float32 a NumPy forward must take keep."""
    if dtype == "float64":
        forward, backward = (counted(f) for f in NUMPY["multi_head"])
        assert check("multi_head", forward, backward, examples=FEW, dropout=True, dtype=dtype) is None
        assert forward.calls >= 1 and backward.calls >= 1
    twin = counted(multi_head_twin())
    assert check("multi_head", twin, examples=FEW, dropout=True, groups=3, dtype=dtype) is None
    assert twin.calls >= 1


@settings(max_examples=FEW, deadline=None)
@given(case=OPERATIONS["multi_head"].cases(dropout=True))
def test_the_keep_mask_given_is_the_one_numpy_attn_draws(case):
    """The keep-mask a torch function gets is the one numpy_attn's forward draws from the seeded rng
    it gets: the reference and the function under test drop the same weights."""
    _, cache = OPERATIONS["multi_head"].call(multi_head_attention_forward, case.inputs, case.options, False)
    assert case.options["keep"].dtype == np.bool_
    assert np.array_equal(cache.attention.keep, case.options["keep"])
    assert cache.attention.keep_scale == 1 / (1 - case.options["dropout_p"])


@pytest.mark.parametrize("bug, options", [("own mask", dict(dropout=True)), ("scale", dict(dropout=True)),
                                          ("tiled", dict(groups=3))])
def test_multi_head_bugs_of_dropout_and_grouped_heads_are_caught(bug, options):
    report = failing("multi_head", multi_head_twin(bug), **options)
    assert wrong(report), report
    if bug == "tiled":      # the order matters with two key/value heads of two query heads each, at least
        nh = int(re.search(r"^    num_heads (\d+)$", report, flags=re.M).group(1))
        C, kv_width = map(int, re.search(r"^    params\.k\.w \((\d+), (\d+)\)", report, flags=re.M).groups())
        nkv = kv_width // (C // nh)
        assert nkv >= 2 and nh // nkv >= 2, report
    else:
        assert "dropout_p" in report and "keep (" in report, report


def attention_twin(bug=None):
    """torch_attn's attention as a user's, with multi_head_twin's dropout bugs on request ("own mask",
    "scale")."""
    def forward(q, k, v, attn_mask=None, is_causal=False, scale=None, dropout_p=0.0, keep=None):
        if bug == "own mask" and keep is not None:
            keep = torch.rand(keep.shape, generator=torch.Generator().manual_seed(0)) < 1 - dropout_p
        if bug == "scale":
            dropout_p = dropout_p / 2
        return tw_attention.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                                         scale=scale, dropout_p=dropout_p, keep=keep)
    return forward


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_attention_with_dropout_passes(dtype):
    """As multi_head's: numpy_attn's forward draws the keep-mask from the seeded rng it gets, the
    twin takes it as keep=."""
    if dtype == "float64":
        forward, backward = (counted(f) for f in NUMPY["attention"])
        assert check("attention", forward, backward, examples=FEW, dropout=True, dtype=dtype) is None
        assert forward.calls >= 1 and backward.calls >= 1
    twin = counted(attention_twin())
    assert check("attention", twin, examples=FEW, dropout=True, dtype=dtype) is None
    assert twin.calls >= 1


@settings(max_examples=FEW, deadline=None)
@given(case=OPERATIONS["attention"].cases(dropout=True))
def test_the_keep_mask_given_to_attention_is_the_one_numpy_attn_draws(case):
    _, cache = OPERATIONS["attention"].call(scaled_dot_product_attention_forward, case.inputs, case.options, False)
    assert case.options["keep"].dtype == np.bool_
    assert np.array_equal(cache.keep, case.options["keep"])
    assert cache.keep_scale == 1 / (1 - case.options["dropout_p"])


@pytest.mark.parametrize("bug", ["own mask", "scale"])
def test_attention_bugs_of_dropout_are_caught(bug):
    report = failing("attention", attention_twin(bug), dropout=True)
    assert wrong(report), report
    assert "dropout_p" in report and "keep (" in report, report


@pytest.mark.parametrize("p", [0, 0.0])
def test_a_dropout_of_zero_is_no_dropout(p):
    """dropout=0 is a probability like any other: the check runs, passing no dropout_p or keep."""
    reference, backward = NUMPY["attention"]

    @functools.wraps(reference)
    def without_dropout(*args, **kwargs):
        assert "keep" not in kwargs and "dropout_p" not in kwargs, sorted(kwargs)
        return reference(*args, **kwargs)

    forward, backward = counted(without_dropout), counted(backward)
    assert check("attention", forward, backward, examples=3, dropout=p) is None
    assert forward.calls >= 1 and backward.calls >= 1


def test_dropout_needs_keep_in_float32_and_is_refused_in_float16():
    with pytest.raises(TypeError, match=re.escape("with dropout in float32, a NumPy forward must take keep=")):
        check("multi_head", *NUMPY["multi_head"], dropout=True, dtype="float32")
    with pytest.raises(ValueError, match=re.escape("dropout is checked in float64 and float32, not float16")):
        check("multi_head", multi_head_twin(), dropout=True, dtype="float16")


@pytest.mark.parametrize("axis", [0, 2, -3])
def test_softmax_over_a_given_axis_passes(axis):
    """An axis given as an option: every input drawn has that axis (0 and 2 counted from the front,
    -3 from the back), so numpy_attn's own softmax passes."""
    forward, backward = (counted(f) for f in NUMPY["softmax"])
    assert check("softmax", forward, backward, examples=FEW, axis=axis) is None
    assert forward.calls >= 1


@pytest.mark.parametrize("causal", [True, False])
def test_flash_attention_checked_with_the_causality_given(causal):
    """causal=True (False) fixes is_causal: a forward that computes only that kind passes."""
    reference, backward = NUMPY["flash_attention"]

    @functools.wraps(reference)
    def one_kind(q, k, v, is_causal=False, scale=None):
        return reference(q, k, v, is_causal=causal, scale=scale)

    forward = counted(one_kind)
    assert check("flash_attention", forward, backward, examples=FEW, causal=causal) is None
    assert forward.calls >= 1


@settings(deadline=None)
@given(x=floats(np.float32, 3.0), a=arrays(np.float32, (2, 3), 3.0))
def test_float32_strategies_draw_float32_values(x, a):
    """floats and arrays of float32 draw values that float32 holds exactly, within the bound."""
    assert float(np.float32(x)) == x and abs(x) <= 3, x   # float(): np.float32(x) == x compares in float32
    assert a.dtype == np.float32 and a.shape == (2, 3) and np.abs(a).max() <= 3


# -- the report ------------------------------------------------------------------------------------

def test_the_same_seed_gives_the_same_report():
    assert failing("softmax", *user_softmax("term"), axis=-1) == failing("softmax", *user_softmax("term"), axis=-1)


def test_the_tolerance_is_the_dtypes():
    report = failing("softmax", *user_softmax("term"), axis=-1, dtype="float32")
    assert "why this tolerance: float32's rtol 0.0001, atol 1e-05 (float32 carries" in report, report
    report = failing("softmax", *user_softmax("term"), axis=-1, dtype="float16")
    assert wrong(report) == {"dx"} and "tolerance: 2 x numpy_attn's own float16 error" in report, report
    # ml_dtypes' bfloat16 x @ w comes out float32: dtype in is dtype out.
    report = failing("linear", *user_linear(), dtype="bfloat16")
    assert "wrong: out: dtype float32, expected bfloat16 (dtype in is dtype out)" in report, report


def test_a_forward_that_raises_is_reported():
    def broken(x):
        raise RuntimeError("not written yet")
    report = failing("softmax", broken)
    assert "failed: forward raised RuntimeError: not written yet" in report, report


def test_a_forward_that_returns_no_cache_is_reported():
    report = failing("softmax", lambda x: softmax_forward(x)[0], softmax_backward)
    assert "forward must return (out, cache), got ndarray" in report, report


@pytest.mark.parametrize("op, forward, backward, options, error, message", [
    ("attn", softmax_forward, None, {}, ValueError,
     "unknown operation 'attn': check knows softmax, linear, layer_norm, rms_norm, gelu, attention, flash_attention, "
     "multi_head"),
    ("softmax", None, None, {}, TypeError, "forward must be a function, got NoneType"),
    ("softmax", softmax_forward, None, {"examples": 0}, ValueError, "examples must be a positive integer, got 0"),
    ("softmax", softmax_forward, None, {"dtype": "int8"}, ValueError,
     "dtype must be float64, float32, float16 or bfloat16, got 'int8'"),
    ("softmax", softmax_forward, None, {"dims": 2}, TypeError,
     "softmax has no option 'dims': its options are axis, masked, framework, device"),
    ("softmax", tw_softmax.softmax, softmax_backward, {"framework": "torch"}, TypeError,
     "a torch forward's backward is autograd's"),
    ("multi_head", tw_multi_head.multi_head_attention, None, {"dropout": 1.5}, ValueError,
     "dropout must be True, False or a probability in [0, 1), got 1.5"),
    ("attention", *NUMPY["attention"], {"dropout": 1}, ValueError,
     "dropout must be True, False or a probability in [0, 1), got 1"),
    ("attention", *NUMPY["attention"], {"dropout": -0.1}, ValueError,
     "dropout must be True, False or a probability in [0, 1), got -0.1"),
])
def test_bad_arguments_are_refused(op, forward, backward, options, error, message):
    with pytest.raises(error, match=re.escape(message)):
        check(op, forward, backward, **options)


# -- numpy-attn check ----------------------------------------------------------------------------------

MINE = '''
import numpy as np


def softmax_forward(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    y = e / e.sum(axis=-1, keepdims=True)
    return y, y


def softmax_backward(dy, y):
    return y * (dy - (dy * y).sum(axis=-1, keepdims=True))


def softmax_backward_wrong(dy, y):
    return y * dy
'''


def run_check(tmp_path, *argv):
    """(exit status, stdout, stderr) of numpy-attn check on a file of softmax functions."""
    (tmp_path / "mine.py").write_text(MINE)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli.main(["check", *[a.replace("DIR", str(tmp_path)) for a in argv]])
        except SystemExit as exit_info:                      # argparse's own usage errors
            status = exit_info.code
    return status, out.getvalue(), err.getvalue()


def test_the_command_passes_what_agrees(tmp_path):
    status, out, _ = run_check(tmp_path, "DIR/mine.py:softmax_forward", "--op", "softmax", "--backward",
                               "softmax_backward", "--examples", "10", "--option", "axis=-1", "--option",
                               "masked=False")
    assert status == 0, out
    assert out == (f"softmax: {tmp_path}/mine.py:softmax_forward with softmax_backward agrees with "
                   "numpy_attn's on 10 examples (float64, seed 0)\n")


def test_the_command_reports_what_does_not(tmp_path):
    """Exit status 1 and the report."""
    status, out, _ = run_check(tmp_path, "DIR/mine.py:softmax_forward", "--op", "softmax", "--backward",
                               "softmax_backward_wrong", "--examples", "10", "--dtype", "float32", "--seed", "3",
                               "--option", "axis=-1", "--option", "masked=False")
    assert status == 1
    assert out.startswith("softmax: the function under test disagrees with numpy_attn's (float32, seed 3, "
                          "examples 10)"), out
    assert wrong(out) == {"dx"} and "  right: out\n" in out, out
    status, out, _ = run_check(tmp_path, "DIR/mine.py:softmax_forward", "--op", "softmax", "--examples", "10")
    assert status == 1 and "forward raised TypeError" in out and "an option fixes it, e.g. axis=-1" in out, out


@pytest.mark.parametrize("argv, message", [
    (["DIR/mine.py:softmax_forward", "--op", "softmx"],
     "numpy-attn check: error: --op 'softmx' is not an operation check knows: softmax, linear, layer_norm, "
     "rms_norm, gelu, attention, flash_attention, multi_head"),
    (["DIR/absent.py:f", "--op", "softmax"], "numpy-attn check: error: no file 'DIR/absent.py'"),
    (["DIR/mine.py:softmax", "--op", "softmax"],
     "numpy-attn check: error: DIR/mine.py has no function 'softmax' (it defines softmax_backward, "
     "softmax_backward_wrong, softmax_forward)"),
    (["DIR/mine.py:softmax_forward", "--op", "softmax", "--backward", "back"],
     "numpy-attn check: error: DIR/mine.py has no function 'back'"),
    (["DIR/mine.py", "--op", "softmax"],
     "numpy-attn check: error: expected FILE:FUNCTION, e.g. mine.py:softmax_forward, got 'DIR/mine.py'"),
    (["DIR/mine.py:softmax_forward", "--op", "softmax", "--examples", "0"],
     "numpy-attn check: error: --examples must be a positive integer, got 0"),
    (["DIR/mine.py:softmax_forward", "--op", "softmax", "--dtype", "int8"],
     "numpy-attn check: error: argument --dtype: invalid choice: 'int8'"),
    (["DIR/mine.py:softmax_forward"], "numpy-attn check: error: give the operation FUNCTION implements: --op OP, "
                                      "one of softmax, linear, layer_norm, rms_norm, gelu, attention, "
                                      "flash_attention, multi_head"),
    (["DIR/mine.py:softmax_forward", "--op", "softmax", "--option", "axis"],
     "numpy-attn check: error: --option must be NAME=VALUE, e.g. axis=-1, got 'axis'"),
    (["DIR/mine.py:softmax_forward", "--op", "softmax", "--option", "dims=2"],
     "numpy-attn check: error: softmax has no option 'dims': its options are axis, masked, framework, device"),
])
def test_bad_usage_exits_2_naming_the_value(tmp_path, argv, message):
    status, out, err = run_check(tmp_path, *argv)
    assert status == 2 and out == "", (out, err)
    assert message.replace("DIR", str(tmp_path)) in err, err


# -- docs/testing.md ---------------------------------------------------------------------------------

PAGE = Path(numpy_attn.__file__).resolve().parent.parent / "docs" / "testing.md"


def page_of_check():
    """docs/testing.md up to its section on whole models (test_testing_model.py checks that one)."""
    return PAGE.read_text(encoding="utf-8").split("\n## Checking a whole model", 1)[0]


def run_page(folder):
    """Run docs/testing.md's Python examples in order as one script in ``folder``, as a user would
    (Hypothesis mixes the constants of the modules loaded, the script's own among them, into its
    draws: a seed gives the same inputs to the same program). Returns the process's result and the
    report of the CheckFailure it ends with."""
    blocks = re.findall(r"```python\n(.*?)```", page_of_check(), flags=re.S)
    assert len(blocks) == 3, "the softmax example, the attention kernel, the failing example"
    (folder / "mine.py").write_text("\n\n".join(blocks), encoding="utf-8")
    result = subprocess.run([sys.executable, "mine.py"], capture_output=True, text=True, cwd=folder, timeout=300)
    return result, result.stderr.partition("numpy_attn.testing.CheckFailure: ")[2].rstrip("\n")


def test_the_page_runs_and_its_last_example_fails(tmp_path):
    """The examples' own functions pass (torch recognised through a function of the script that the
    failing one calls), and the last raises CheckFailure with a report that reads as the page's. The
    input it shrinks to can differ from the page's where the modules loaded differ (Hypothesis
    draws constants from them): test_the_pages_report_holds checks the page's own figures."""
    result, report = run_page(tmp_path)
    assert result.returncode == 1 and result.stdout == ("my softmax agrees with numpy_attn's\n"
                                                        "my attention agrees with numpy_attn's\n"), result
    shown = shown_report()
    assert report.splitlines()[:3] == shown.splitlines()[:3], report
    assert report.splitlines()[-1] == shown.splitlines()[-1], report
    assert wrong(report) and "smallest failing input found (after shrinking):" in report, report


def shown_report():
    page = page_of_check()
    return page.split("raises `CheckFailure`:\n\n```text\n", 1)[1].split("```", 1)[0].rstrip("\n")


def shown_input(report):
    """{name: array} of the smallest failing input a report prints (shape, dtype and values)."""
    section = report.split("(after shrinking):\n", 1)[1].split("  reproduce:", 1)[0]
    found = {}
    for name, shape, dtype, values in re.findall(r"^    (\w+) \(([\d, ]*)\) (\w+) =\n((?:      .*\n?)+)",
                                                 section, flags=re.M):
        shape = tuple(int(n) for n in shape.replace(",", " ").split())
        found[name] = np.array(ast.literal_eval(" ".join(values.split())), dtype=dtype).reshape(shape)
    return found


def test_the_pages_report_holds():
    """Every figure of the page's report, recomputed from the input it shows: the wrong function's
    gradient (autograd) and numpy_attn's at the index named, the difference and the tolerance, and
    the outputs and gradients it calls right are within theirs."""
    page = page_of_check()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    namespace = {"__name__": "page"}
    for block in blocks:                                   # the functions, without running the checks
        exec(compile("\n".join(line for line in block.splitlines() if not line.startswith(("check(", "print("))),
                     str(PAGE), "exec"), namespace)
    report = shown_report()
    case = shown_input(report)
    assert set(case) == {"q", "k", "v", "dout"} and all(a.size <= 24 for a in case.values()), case
    out, cache = scaled_dot_product_attention_forward(case["q"], case["k"], case["v"])
    expected = dict(zip(("out", "dq", "dk", "dv"), (out, *scaled_dot_product_attention_backward(case["dout"], cache)),
                        strict=True))
    tensors = {n: torch.from_numpy(case[n]).requires_grad_(True) for n in "qkv"}
    got_out = namespace["my_attention_wrong_scale"](**tensors)
    (got_out * torch.from_numpy(case["dout"])).sum().backward()
    got = {"out": got_out.detach().numpy(), **{f"d{n}": t.grad.numpy() for n, t in tensors.items()}}
    for name, index, value, truth, off, bound in re.findall(
            r"wrong: (\w+): at index \(([\d, ]*)\) got (\S+), expected (\S+) \(numpy_attn's\), off by (\S+)\n"
            r"    tolerance there: atol \S+ \+ rtol \S+ x \|expected\| = (\S+);", report):
        at = tuple(int(n) for n in index.replace(",", " ").split())
        # The report prints the values to 6 digits, the difference to 3.
        np.testing.assert_allclose([got[name][at], expected[name][at]], [float(value), float(truth)], rtol=1e-5,
                                   err_msg=name)
        np.testing.assert_allclose(abs(got[name][at] - expected[name][at]), float(off), rtol=1e-2, err_msg=name)
        assert abs(got[name][at] - expected[name][at]) > float(bound) * 1e6, f"{name}: a bug, not rounding"
    right = report.split("  right: ", 1)[1].split("\n", 1)[0].split(", ")
    assert sorted(right + sorted(wrong(report))) == sorted(expected), report
    for name in right:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-10, atol=1e-12, err_msg=name)


def test_the_readme_points_to_the_page():
    readme = (PAGE.parent.parent / "README.md").read_text(encoding="utf-8")
    assert "(docs/testing.md)" in readme and "numpy-attn check" in readme
