"""Parity tests for numpy_attn/causal_conv1d.py and torch_attn/causal_conv1d.py: the short causal
convolution before the delta rule, against F.conv1d and Hugging Face's causal_conv1d_fn and
causal_conv1d_update (Qwen3.5's and Kimi Linear's), and decoding one token at a time against the
full forward."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given
from hypothesis import strategies as st
from transformers.models.kimi_linear import modeling_kimi_linear as kimi
from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen3_5

from numpy_attn.causal_conv1d import causal_conv1d_backward, causal_conv1d_forward
from parity_tests import strategies as S
from parity_tests.helpers import (
    FD_TOL,
    LOW_DTYPES,
    TOLERANCES,
    assert_bad_dout_refused,
    assert_close,
    assert_error_budget,
    assert_tree_close,
    autograd,
    numerical_grad,
    round_to,
    to_numpy,
    to_torch,
)
from torch_attn.causal_conv1d import causal_conv1d

activations = st.sampled_from([None, "silu"])
# Both Hugging Face models define the two functions; each is checked.
HF = {"qwen3_5": qwen3_5, "kimi_linear": kimi}


@st.composite
def convs(draw, dtype=None, min_K=1):
    """(inputs, dout): inputs {"x": (B, T, C), "w": (C, K), "b": (C,) or absent, "state": (B, C, K-1)
    or absent, "activation": None or "silu"}, dout (B, T, C)."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    B, T, C, K = draw(S.dim(1, 2)), draw(S.dim(1, 6)), draw(S.dim(1, 4)), draw(S.dim(min_K, 4))
    inputs = {"x": draw(S.arrays(dtype, (B, T, C))), "w": draw(S.arrays(dtype, (C, K)))}
    if draw(st.booleans()):
        inputs["b"] = draw(S.arrays(dtype, (C,)))
    if draw(st.booleans()):
        inputs["state"] = draw(S.arrays(dtype, (B, C, K - 1)))
    inputs["activation"] = draw(activations)
    return inputs, draw(S.arrays(dtype, (B, T, C)))


# T = 1 with a state (one decoding step), K = 4 as in the models, a bias and SiLU.
ONE_STEP = ({"x": S.ramp(1, 1, 3), "w": S.ramp(3, 4), "b": S.ramp(3), "state": S.ramp(1, 3, 3),
             "activation": "silu"}, S.ramp(1, 1, 3))


def arrays_of(inputs):
    return {k: v for k, v in inputs.items() if k != "activation" and v is not None}


def _tol(inputs, dout):
    """Every value compared is a sum of at most n = max(K + 1, B*T) terms (out: K taps and the
    bias; dx and dstate: at most K taps; dw and db: B*T steps), each at most big^2, with big the
    largest |entry| of x, the state, w, b and dout (times 1.1, SiLU's largest slope). A sum of n terms
    rounded in any order (NumPy's pairwise sums, torch's vectorised ones, or the taps in turn) moves
    by at most n u sum|terms| <= n^2 u big^2, u the unit roundoff: that is the atol. rtol is the
    dtype's usual one, for SiLU's few ulps relative."""
    dtype = inputs["x"].dtype
    B, T, _ = inputs["x"].shape
    n = max(inputs["w"].shape[1] + 1, B * T)
    big = max(1.0, *(float(np.abs(a).max(initial=0)) for a in arrays_of(inputs).values()),
              1.1 * float(np.abs(dout).max(initial=0)))
    return dict(rtol=TOLERANCES[dtype]["rtol"], atol=n * n * float(np.finfo(dtype).eps) / 2 * big * big)


def ours(inputs, dout):
    """numpy_attn's out and new_state, and its gradients by argument name."""
    out, new_state, cache = causal_conv1d_forward(**inputs)
    dx, dparams, dstate = causal_conv1d_backward(dout, cache)
    grads = {"x": dx, **dparams, **({} if dstate is None else {"state": dstate})}
    return out, new_state, grads


# -- forward and backward match the twin and autograd ------------------------------------------------

@pytest.mark.twin_parity
@given(case=convs())
@example(case=ONE_STEP)
def test_matches_twin_and_autograd(case):
    inputs, dout = case
    out, new_state, grads = ours(inputs, dout)
    twin_out, twin_grads = autograd(lambda **kw: causal_conv1d(**kw)[0], inputs, dout)
    twin_state = to_numpy(causal_conv1d(**{k: to_torch(v) if k != "activation" else v
                                           for k, v in inputs.items()})[1])
    tol = _tol(inputs, dout)
    assert_close("causal_conv1d.out", out, twin_out, **tol)
    np.testing.assert_array_equal(new_state, twin_state, err_msg="causal_conv1d.new_state")
    assert_tree_close("causal_conv1d.grads", grads, twin_grads, **tol)


# -- the twin matches F.conv1d and Hugging Face's causal_conv1d_fn and causal_conv1d_update -----------

@given(case=convs())
def test_twin_matches_f_conv1d(case):
    """nn.Conv1d's layout (B, C, T), weight (C, 1, K), groups=C, K-1 zeros of padding on each
    side and the first T outputs kept: the causal convolution from the start of a sequence."""
    inputs, dout = case
    inputs = {**inputs, "state": None}
    C, K = inputs["w"].shape

    def builtin(x, w, b=None, state=None, activation=None):
        y = F.conv1d(x.transpose(1, 2), w.unsqueeze(1), b, padding=K - 1, groups=C)[..., :x.shape[1]]
        y = y.transpose(1, 2)
        return F.silu(y) if activation == "silu" else y

    twin_out, twin_grads = autograd(lambda **kw: causal_conv1d(**kw)[0], inputs, dout)
    built_out, built_grads = autograd(builtin, inputs, dout)
    tol = _tol(inputs, dout)
    assert_close("causal_conv1d.out vs F.conv1d", twin_out, built_out, **tol)
    assert_tree_close("causal_conv1d.grads vs F.conv1d", twin_grads, built_grads, **tol)


@pytest.mark.parametrize("model", HF)
@given(case=convs())
def test_matches_hugging_face_causal_conv1d_fn(model, case):
    """causal_conv1d_fn (the prefill from the start of a sequence), x given as (B, C, T), forward
    and every gradient, float32 and float64: in these dtypes it computes in the input's dtype, as
    we do (F.conv1d and then SiLU)."""
    inputs, dout = case
    inputs = {**inputs, "state": None}

    def theirs(x, w, b=None, state=None, activation=None):
        return HF[model].causal_conv1d_fn(x.transpose(1, 2), w, b, activation).transpose(1, 2)

    out, _, grads = ours(inputs, dout)
    their_out, their_grads = autograd(theirs, inputs, dout)
    their_grads.pop("state", None)
    tol = _tol(inputs, dout)
    assert_close(f"causal_conv1d.out vs {model} causal_conv1d_fn", out, their_out, **tol)
    assert_tree_close(f"causal_conv1d.grads vs {model} causal_conv1d_fn", grads, their_grads, **tol)


@pytest.mark.parametrize("model", HF)
@given(case=convs(min_K=2))
@example(case=ONE_STEP)
def test_matches_hugging_face_causal_conv1d_update(model, case):
    """causal_conv1d_update (decoding with a state), x given as (B, C, T): the same output, and
    the state it writes in place is the one we hand on. (With K = 1 there is no state, and its
    slice [-0:] takes every column; it is left out.)"""
    inputs, dout = case
    x, w = inputs["x"], inputs["w"]
    B, T, C = x.shape
    state = inputs.get("state", np.zeros((B, C, w.shape[1] - 1), x.dtype))
    inputs = {**inputs, "state": state}
    out, new_state, _ = causal_conv1d_forward(**inputs)
    their_state = to_torch(state)
    b = inputs.get("b")
    their_out = HF[model].causal_conv1d_update(to_torch(x).transpose(1, 2), their_state, to_torch(w),
                                               None if b is None else to_torch(b), inputs["activation"])
    assert_close(f"causal_conv1d.out vs {model} causal_conv1d_update", out,
                 to_numpy(their_out.transpose(1, 2)), **_tol(inputs, dout))
    np.testing.assert_array_equal(new_state, to_numpy(their_state),
                                  err_msg=f"causal_conv1d.new_state vs {model} causal_conv1d_update")


# -- properties ---------------------------------------------------------------------------------

@given(case=convs(), sizes=st.data())
def test_prefill_then_decoding_equals_the_full_forward(case, sizes):
    """Feeding x in pieces (a prefill, then one or a few tokens at a time), each call given the
    state the previous one handed on, gives the full forward's output and final state: the sum of
    each output's K terms is the same sum in the same order, so the results are equal to the bit."""
    inputs, _ = case
    x = inputs["x"]
    full, full_state, _ = causal_conv1d_forward(**inputs)
    pieces, state, start = [], inputs.get("state"), 0
    for n in sizes.draw(S.splits(x.shape[1])):
        out, state, _ = causal_conv1d_forward(**{**inputs, "x": x[:, start:start + n], "state": state})
        pieces.append(out)
        start += n
    np.testing.assert_array_equal(np.concatenate(pieces, axis=1), full, err_msg="causal_conv1d.out in pieces")
    np.testing.assert_array_equal(state, full_state, err_msg="causal_conv1d.new_state in pieces")


@given(case=convs(dtype=np.float64), t=st.integers(0, 5))
def test_no_output_sees_a_later_input(case, t):
    """Changing the input at step t changes no output before t (causal), and the state only
    the outputs of the first K-1 steps."""
    inputs, _ = case
    x = inputs["x"]
    t = min(t, x.shape[1] - 1)
    out, _, _ = causal_conv1d_forward(**inputs)
    moved = x.copy()
    moved[:, t] += 1.0
    out_moved, _, _ = causal_conv1d_forward(**{**inputs, "x": moved})
    np.testing.assert_array_equal(out_moved[:, :t], out[:, :t], err_msg="outputs before the changed step")
    K = inputs["w"].shape[1]
    state = inputs.get("state", np.zeros((x.shape[0], x.shape[2], K - 1)))
    out_state, _, _ = causal_conv1d_forward(**{**inputs, "state": state + 1.0})
    np.testing.assert_array_equal(out_state[:, K - 1:], out[:, K - 1:], err_msg="outputs past the state's reach")


# -- finite differences (no torch) ----------------------------------------------------------------

@given(case=convs(dtype=np.float64))
@example(case=ONE_STEP)
def test_backward_matches_finite_differences(case):
    """Each gradient (x, w, b, state) against numerical_grad: the output is a polynomial in them,
    then SiLU, smooth at every scale, so the default step holds."""
    inputs, dout = case
    _, _, grads = ours(inputs, dout)
    fd = {name: numerical_grad(lambda a, name=name: causal_conv1d_forward(**{**inputs, name: a})[0],
                               inputs[name].copy(), dout)
          for name in arrays_of(inputs)}
    assert_tree_close("causal_conv1d vs finite differences", grads, fd, **FD_TOL)


# -- float16 and bfloat16: FlashAttention's error rule -------------------------------------------

def conv1d_of_the_padded_input(x, w, b=None, state=None, activation=None):
    """PyTorch's own: F.conv1d (groups=C, no padding) over the state and x joined along time, in
    nn.Conv1d's layout, then F.silu; each op rounded to the inputs' dtype, as Hugging Face's
    causal_conv1d_fn and causal_conv1d_update round (they take no state gradient: in place)."""
    B, T, C = x.shape
    past = x.new_zeros((B, C, w.shape[1] - 1)) if state is None else state
    y = F.conv1d(torch.cat([past, x.transpose(1, 2)], dim=2), w.unsqueeze(1), b, groups=C)
    y = y.transpose(1, 2)
    return F.silu(y) if activation == "silu" else y


@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@given(case=convs(dtype=np.float64))
@example(case=ONE_STEP)
def test_low_precision_meets_the_error_budget(dtype, case):
    """Ours and the twin against float64 truth (the same PyTorch ops in float64 on the rounded
    inputs), out and every gradient, within twice the error of PyTorch's convolution and SiLU
    in the low dtype."""
    inputs, dout = case
    inputs = {k: v if k == "activation" else round_to(v, dtype) for k, v in inputs.items()}
    dout = round_to(dout, dtype)
    out, _, grads = ours(inputs, dout)
    twin_out, twin_grads = autograd(lambda **kw: causal_conv1d(**kw)[0], inputs, dout)
    torch_out, torch_grads = autograd(conv1d_of_the_padded_input, inputs, dout)
    truth_out, truth_grads = autograd(conv1d_of_the_padded_input,
                                      {k: v if k == "activation" else v.astype(np.float64) for k, v in inputs.items()},
                                      dout.astype(np.float64))
    for who, (o, g) in {"numpy": (out, grads), "twin": (twin_out, twin_grads)}.items():
        assert_error_budget(f"causal_conv1d[{who}]", dtype, {
            "out": (o, torch_out, truth_out),
            **{f"d{k}": (g[k], torch_grads[k], truth_grads[k]) for k in g}})


# -- dtype preservation -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
def test_dtype_is_preserved(dtype):
    inputs = {k: v.astype(dtype) for k, v in arrays_of(ONE_STEP[0]).items()}
    out, new_state, cache = causal_conv1d_forward(**inputs, activation="silu")
    dx, dparams, dstate = causal_conv1d_backward(ONE_STEP[1].astype(dtype), cache)
    for name, a in [("out", out), ("new_state", new_state), ("dx", dx), ("dstate", dstate), *dparams.items()]:
        assert a.dtype == dtype, f"causal_conv1d.{name} dtype {a.dtype}"


# -- bad input --------------------------------------------------------------------------------------

def test_bad_input_is_refused_naming_it():
    x, w = np.zeros((2, 5, 3)), np.ones((3, 4))
    with pytest.raises(TypeError, match="^x must be a NumPy array, got list$"):
        causal_conv1d_forward(x.tolist(), w)
    with pytest.raises(TypeError, match="^w must be float16, bfloat16, float32 or float64, got dtype int64$"):
        causal_conv1d_forward(x, w.astype(np.int64))
    with pytest.raises(ValueError, match=r"^x must have shape \(B, T, C\), got \(5, 3\)$"):
        causal_conv1d_forward(x[0], w)
    with pytest.raises(ValueError, match=r"^w must have shape \(C, K\) = \(3, K\) with K >= 1 to match x "
                                         r"\(2, 5, 3\), got \(4, 3\)$"):
        causal_conv1d_forward(x, w.T)
    with pytest.raises(ValueError, match=r"^w must have shape .* got \(3, 0\)$"):
        causal_conv1d_forward(x, np.ones((3, 0)))
    with pytest.raises(ValueError, match=r"^b must have shape \(3,\) to match x \(2, 5, 3\), got \(4,\)$"):
        causal_conv1d_forward(x, w, b=np.ones(4))
    with pytest.raises(ValueError, match=r"^state must have shape \(B, C, K-1\) = \(2, 3, 3\) to match x "
                                         r"\(2, 5, 3\) and w \(3, 4\), got \(2, 3, 4\)$"):
        causal_conv1d_forward(x, w, state=np.zeros((2, 3, 4)))
    with pytest.raises(TypeError, match="^arrays must share one dtype: x is float64, w is float64, state is float32$"):
        causal_conv1d_forward(x, w, state=np.zeros((2, 3, 3), np.float32))
    with pytest.raises(TypeError, match="^b must be a NumPy array, got list$"):
        causal_conv1d_forward(x, w, b=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="^activation must be None or 'silu', got 'gelu'$"):
        causal_conv1d_forward(x, w, activation="gelu")


@given(case=convs())
def test_bad_dout_is_refused(case):
    inputs, _ = case
    out, _, cache = causal_conv1d_forward(**inputs)
    assert_bad_dout_refused("causal_conv1d", out, causal_conv1d_backward, cache)
