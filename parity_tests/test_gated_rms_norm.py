"""Parity tests for numpy_attn/gated_rms_norm.py and torch_attn/gated_rms_norm.py: the RMS norm of
the delta rule's output gated by SiLU (Qwen3.5's Qwen3_5RMSNormGated) or the sigmoid (Kimi Linear's
KimiLinearRMSNormGated)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given
from hypothesis import strategies as st
from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearRMSNormGated
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNormGated

from numpy_attn.gated_rms_norm import gated_rms_norm_backward, gated_rms_norm_forward
from parity_tests import strategies as S
from parity_tests.helpers import (
    FD_TOL,
    LOW_DTYPES,
    assert_bad_dout_refused,
    assert_close,
    assert_error_budget,
    assert_tree_close,
    autograd,
    layer_norm_tol,
    numerical_grad,
    round_to,
    to_numpy,
    to_torch,
)
from torch_attn.gated_rms_norm import gated_rms_norm

acts = st.sampled_from(["silu", "sigmoid"])
# Each Hugging Face module with the gate it uses.
HF = {"silu": Qwen3_5RMSNormGated, "sigmoid": KimiLinearRMSNormGated}


@st.composite
def rows(draw, dtype=None):
    """(x, z, w, dout, eps, act): x, z and dout (..., C) with 0 to 2 leading dims (the rows of
    (B, T, nh, hv)), w (C,)."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    shape = draw(S.batch_shapes()) + (draw(S.dim(1, 8)),)
    x, z, dout = (draw(S.arrays(dtype, shape)) for _ in range(3))
    w = draw(S.arrays(dtype, shape[-1:]))
    return x, z, w, dout, draw(st.sampled_from([1e-6, 1e-5])), draw(acts)


# A zero row (rstd = 1000), a tiny row and an ordinary one, gated by a large, a zero and a
# negative z.
ZERO_ROW = (np.array([[0.0, 0.0, 0.0], [1e-3, -2e-3, 0.0], [-1.0, 0.5, 3.0]]),
            np.array([[4.0, 0.0, -4.0], [0.0, 1.0, -1.0], [2.0, -3.0, 0.5]]),
            np.array([1.5, -0.5, 2.0]), S.ramp(3, 3), 1e-6, "silu")


def _tol(cache, dtype):
    """The RMS norm's tolerance (layer_norm_tol: its backward's cancellation times rstd), with
    atol also times the largest |act(z)|: the gate scales the gradient entering the norm's
    backward, and so its cancellation error, as w does; the product n * act(z) and act's
    gradient add a few ulps relative, which rtol covers."""
    tol = layer_norm_tol([cache.norm[1]], dtype)
    return dict(rtol=tol["rtol"], atol=tol["atol"] * max(1.0, float(np.abs(cache.g).max(initial=0))))


def ours(x, z, w, dout, eps, act, round_norm=True):
    out, cache = gated_rms_norm_forward(x, z, w, eps, act, round_norm)
    dx, dz, dparams = gated_rms_norm_backward(dout, cache)
    return out, {"x": dx, "z": dz, **dparams}, cache


# -- forward and backward match the twin and autograd ------------------------------------------------

# The sigmoid's gradient at z = 0 exactly (1/4), where autograd through exp(-|z|) would give 0.
SIGMOID_AT_ZERO = (np.array([1.0, 1.0]), np.array([0.0, 0.0]), np.array([1.0, 0.0]), np.array([1.0, 0.0]),
                   1e-6, "sigmoid")


@pytest.mark.twin_parity
@given(case=rows())
@example(case=ZERO_ROW)
@example(case=SIGMOID_AT_ZERO)
def test_matches_twin_and_autograd(case):
    x, z, w, dout, eps, act = case
    out, grads, cache = ours(*case)
    twin_out, twin_grads = autograd(lambda **kw: gated_rms_norm(**kw, eps=eps, act=act), {"x": x, "z": z, "w": w}, dout)
    tol = _tol(cache, x.dtype)
    assert_close(f"gated_rms_norm[{act}].out", out, twin_out, **tol)
    assert_tree_close(f"gated_rms_norm[{act}].grads", grads, twin_grads, **tol)


# -- the twin matches PyTorch's built-ins and Hugging Face's modules ----------------------------------

@given(case=rows(dtype=np.float64))
@example(case=ZERO_ROW)
def test_twin_matches_builtins(case):
    """F.rms_norm(x) times F.silu(z) or torch.sigmoid(z): the same products, rounded in their order."""
    x, z, w, dout, eps, act = case
    gate = {"silu": F.silu, "sigmoid": torch.sigmoid}[act]
    twin_out, twin_grads = autograd(lambda **kw: gated_rms_norm(**kw, eps=eps, act=act), {"x": x, "z": z, "w": w}, dout)
    built_out, built_grads = autograd(lambda x, z, w: F.rms_norm(x, x.shape[-1:], w, eps) * gate(z),
                                      {"x": x, "z": z, "w": w}, dout)
    tol = _tol(gated_rms_norm_forward(x, z, w, eps, act)[1], x.dtype)
    assert_close(f"gated_rms_norm[{act}].out vs F.rms_norm * gate", twin_out, built_out, **tol)
    assert_tree_close(f"gated_rms_norm[{act}].grads vs F.rms_norm * gate", twin_grads, built_grads, **tol)


def _hf_module(act, w, eps):
    """Hugging Face's gated norm for ``act`` in w's dtype holding w, as a function of (x, z, w)."""
    def f(x, z, w):
        module = HF[act](w.shape[0], eps=eps).to(w.dtype)
        del module.weight                                   # a Parameter would be a new leaf, without w's grad
        module.weight = w                                   # the leaf autograd differentiates
        return module(x, z)
    return f


@given(case=rows())
@example(case=ZERO_ROW)
def test_matches_hugging_face_gated_norms(case):
    """Qwen3_5RMSNormGated (SiLU) and KimiLinearRMSNormGated (sigmoid), output and every gradient.
    Both cast x and z to float32 whatever their dtype: in float32 they are our computation in
    another rounding order (rsqrt for 1 / sqrt), in float64 they keep float32's digits only, so
    both dtypes are held to float32's tolerance, atol scaled by the largest value compared."""
    x, z, w, dout, eps, act = case
    out, grads, cache = ours(x, z, w, dout, eps, act, round_norm=act == "silu")
    their_out, their_grads = autograd(_hf_module(act, w, eps), {"x": x, "z": z, "w": w}, dout)
    tol = _tol(cache, np.float32)
    name = f"gated_rms_norm[{act}] vs {HF[act].__name__} ({x.dtype})"
    for label, mine, theirs in [("out", out, their_out), *((k, grads[k], their_grads[k]) for k in "xzw")]:
        assert_close(f"{name}.{label}", mine, theirs,
                     rtol=tol["rtol"], atol=tol["atol"] * max(1.0, float(np.abs(theirs).max(initial=0))))


def test_default_eps_is_hugging_faces():
    """Without eps, both twins use 1e-6, Qwen3_5RMSNormGated's default: rows of mean square 1e-6,
    where the eps is half the denominator, come out as with eps=1e-6 given, bit for bit (the same
    program), and as Hugging Face's module built without an eps, within float32's tolerance."""
    rng = np.random.default_rng(0)
    x, z, w = 1e-3 * rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 3, 8)), rng.standard_normal(8)
    out, cache = gated_rms_norm_forward(x, z, w)
    given_eps, _ = gated_rms_norm_forward(x, z, w, eps=1e-6)
    assert np.array_equal(out, given_eps)
    assert np.array_equal(to_numpy(gated_rms_norm(to_torch(x), to_torch(z), to_torch(w))), to_numpy(
        gated_rms_norm(to_torch(x), to_torch(z), to_torch(w), eps=1e-6)))
    hf = Qwen3_5RMSNormGated(8)
    with torch.no_grad():
        hf.weight.copy_(torch.from_numpy(w))
        theirs = hf(torch.from_numpy(x).float(), gate=torch.from_numpy(z).float()).double().numpy()
    tol = _tol(cache, np.float32)                            # Hugging Face's float32, as the test above
    assert_close("gated_rms_norm default eps vs Qwen3_5RMSNormGated()", out, theirs, rtol=tol["rtol"],
                 atol=tol["atol"] * max(1.0, float(np.abs(theirs).max())))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_default_rounds_the_norm_in_low_precision(dtype):
    """Without round_norm, the norm is rounded to x's dtype before the gate (Qwen3.5's module casts
    it back to the input dtype first): the same bits as round_norm=True, and here not those of
    round_norm=False, so the default is seen."""
    dtype = LOW_DTYPES[dtype][0]
    rng = np.random.default_rng(0)
    x, z, w = (rng.standard_normal(shape).astype(dtype) for shape in ((2, 3, 8), (2, 3, 8), (8,)))
    out, _ = gated_rms_norm_forward(x, z, w)
    assert out.dtype == dtype and np.array_equal(out, gated_rms_norm_forward(x, z, w, round_norm=True)[0])
    assert not np.array_equal(out, gated_rms_norm_forward(x, z, w, round_norm=False)[0])


# -- properties ---------------------------------------------------------------------------------

@given(case=rows())
def test_the_gate_scales_the_plain_rms_norm(case):
    """The gate multiplies each entry of the plain RMS norm by act(z): a zero gate (sigmoid's limit
    as z -> -inf, SiLU's at z = 0) closes it, and z = 0 under the sigmoid halves it."""
    x, _, w, _, eps, _ = case
    zeros = np.zeros_like(x)
    plain = to_numpy(F.rms_norm(to_torch(x), x.shape[-1:], to_torch(w), eps))
    assert_close("gated_rms_norm[sigmoid] at z = 0 vs half the plain norm",
                 gated_rms_norm_forward(x, zeros, w, eps, "sigmoid")[0], plain / 2,
                 **_tol(gated_rms_norm_forward(x, zeros, w, eps, "sigmoid")[1], x.dtype))
    np.testing.assert_array_equal(gated_rms_norm_forward(x, zeros, w, eps, "silu")[0], zeros,
                                  err_msg="gated_rms_norm[silu] at z = 0")


# -- finite differences (no torch) ----------------------------------------------------------------

@given(case=rows(dtype=np.float64))
@example(case=ZERO_ROW)
def test_backward_matches_finite_differences(case):
    x, z, w, dout, eps, act = case
    _, grads, cache = ours(*case)
    # As test_rms_norm.py: the norm bends on the scale sqrt(ms + eps), down to 1e-3 on a zero row, so
    # step 1e-5 and atol scaled by rstd (the gates are smooth on the scale of 1).
    f = {"x": lambda a: gated_rms_norm_forward(a, z, w, eps, act)[0],
         "z": lambda a: gated_rms_norm_forward(x, a, w, eps, act)[0],
         "w": lambda a: gated_rms_norm_forward(x, z, a, eps, act)[0]}
    fd = {name: numerical_grad(f[name], a.copy(), dout, h=1e-5) for name, a in (("x", x), ("z", z), ("w", w))}
    rstd = max(1.0, float(cache.norm[1].max()))
    assert_tree_close(f"gated_rms_norm[{act}] vs finite differences", grads, fd,
                      rtol=FD_TOL["rtol"], atol=FD_TOL["atol"] * rstd)


# -- float16 and bfloat16: FlashAttention's error rule -------------------------------------------

@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@given(case=rows(dtype=np.float64))
@example(case=ZERO_ROW)
@example(case=SIGMOID_AT_ZERO)
def test_low_precision_meets_the_error_budget(dtype, case):
    """Ours (round_norm as each module) and the twin against float64 truth (F.rms_norm times the
    gate), out and every gradient, within twice the error of the Hugging Face module of that gate
    run in the low dtype: Qwen3_5RMSNormGated rounds the norm before its float32 gate,
    KimiLinearRMSNormGated keeps it in float32."""
    x, z, w, dout = (round_to(a, dtype) for a in case[:4])
    eps, act = case[4:]
    out, grads, cache = ours(x, z, w, dout, eps, act, round_norm=act == "silu")
    inputs = {"x": x, "z": z, "w": w}
    twin_out, twin_grads = autograd(lambda **kw: gated_rms_norm(**kw, eps=eps, act=act, round_norm=act == "silu"),
                                    inputs, dout)
    torch_out, torch_grads = autograd(_hf_module(act, w, eps), inputs, dout)
    gate = {"silu": F.silu, "sigmoid": torch.sigmoid}[act]
    truth_out, truth_grads = autograd(lambda x, z, w: F.rms_norm(x, x.shape[-1:], w, eps) * gate(z),
                                      {k: v.astype(np.float64) for k, v in inputs.items()}, dout.astype(np.float64))
    # dx = rstd * (dxhat - xhat * mean(dxhat * xhat)) cancels to nearly nothing where dxhat is
    # parallel to xhat (one column), and float32's own rounding is what is left: the mean off by
    # C eps32 max|dxhat| (|xhat| <= sqrt(C) but its mean square is below 1), the product and the
    # difference by 2 eps32 max|dxhat| more, all times rstd; |dxhat| <= |dout| |act(z)| |w|.
    # PyTorch's error may be 0 there by luck (test_rms_norm.py leaves such cases out instead).
    big = np.abs(dout.astype(np.float64)).max() * np.abs(cache.g).max() * np.abs(w.astype(np.float64)).max()
    extra = {"dx": (x.shape[-1] + 2) * float(np.finfo(np.float32).eps) * float(cache.norm[1].max()) * float(big)}
    for who, (o, g) in {"numpy": (out, grads), "twin": (twin_out, twin_grads)}.items():
        assert_error_budget(f"gated_rms_norm[{act}][{who}]", dtype, {
            "out": (o, torch_out, truth_out),
            **{f"d{k}": (g[k], torch_grads[k], truth_grads[k]) for k in "xzw"}}, extra=extra)


# -- dtype preservation -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
@pytest.mark.parametrize("act", ["silu", "sigmoid"])
def test_dtype_is_preserved(dtype, act):
    x, z = S.ramp(2, 3, dtype=dtype), S.ramp(2, 3, dtype=dtype) * dtype(2)
    out, cache = gated_rms_norm_forward(x, z, np.full(3, 1.5, dtype), eps=np.float64(1e-6), act=act)
    dx, dz, dparams = gated_rms_norm_backward(S.ramp(2, 3, dtype=dtype), cache)
    for name, a in [("out", out), ("dx", dx), ("dz", dz), ("dw", dparams["w"])]:
        assert a.dtype == dtype, f"gated_rms_norm.{name} dtype {a.dtype}"


# -- bad input --------------------------------------------------------------------------------------

def test_bad_input_is_refused_naming_it():
    x, w = np.zeros((2, 3)), np.ones(3)
    with pytest.raises(TypeError, match="^z must be a NumPy array, got list$"):
        gated_rms_norm_forward(x, x.tolist(), w)
    with pytest.raises(TypeError, match="^z must be float16, bfloat16, float32 or float64, got dtype int64$"):
        gated_rms_norm_forward(x, x.astype(np.int64), w)
    with pytest.raises(ValueError, match=r"^z must have x's shape \(2, 3\), got \(3, 2\)$"):
        gated_rms_norm_forward(x, x.T, w)
    with pytest.raises(ValueError, match=r"^z must have x's shape \(2, 3\), got \(1, 3\)$"):   # would broadcast
        gated_rms_norm_forward(x, x[:1], w)
    with pytest.raises(TypeError, match="^arrays must share one dtype: x is float64, z is float32, w is float64$"):
        gated_rms_norm_forward(x, x.astype(np.float32), w)
    with pytest.raises(TypeError, match="^arrays must share one dtype: x is float32, z is float32, w is float64$"):
        gated_rms_norm_forward(x.astype(np.float32), x.astype(np.float32), w, round_norm=False)
    with pytest.raises(ValueError, match=r"^act must be one of \['sigmoid', 'silu'\], got 'gelu'$"):
        gated_rms_norm_forward(x, x, w, act="gelu")
    with pytest.raises(TypeError, match="^round_norm must be a bool, got str 'no'$"):
        gated_rms_norm_forward(x, x, w, round_norm="no")
    # The norm's own checks, through rms_norm_forward.
    with pytest.raises(ValueError, match=r"^w must have shape \(3,\) to match x \(2, 3\), got \(4,\)$"):
        gated_rms_norm_forward(x, x, np.ones(4))
    with pytest.raises(ValueError, match="^eps must be a number >= 0, got -1$"):
        gated_rms_norm_forward(x, x, w, eps=-1)


@given(case=rows())
def test_bad_dout_is_refused(case):
    x, z, w, _, eps, act = case
    out, cache = gated_rms_norm_forward(x, z, w, eps, act)
    assert_bad_dout_refused("gated_rms_norm", out, gated_rms_norm_backward, cache)
