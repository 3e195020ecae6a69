"""Parity tests for numpy_attn/swiglu.py and torch_attn/swiglu.py (SwiGLU and GeGLU), against Hugging
Face's LlamaMLP and Gemma2MLP."""

from functools import partial

import numpy as np
import pytest
import torch.nn.functional as F
from hypothesis import example, given
from hypothesis import strategies as st
from transformers import Gemma2Config, LlamaConfig
from transformers.models.gemma2.modeling_gemma2 import Gemma2MLP
from transformers.models.llama.modeling_llama import LlamaMLP

from numpy_attn._tree import tree_map
from numpy_attn.swiglu import (
    init_swiglu_params,
    silu_backward,
    silu_forward,
    swiglu_backward,
    swiglu_forward,
)
from parity_tests import strategies as S
from parity_tests.helpers import (
    FD_TOL,
    LOW_DTYPES,
    TOLERANCES,
    assert_bad_dout_refused,
    assert_close,
    assert_drawn_like_nn_linear,
    assert_error_budget,
    assert_tree_close,
    assert_tree_error_budget,
    autograd,
    linear_grads,
    load_linears,
    numerical_grads,
    round_to,
    rounded_case,
    to_numpy,
    to_torch,
    tree_leaves,
)
from torch_attn.swiglu import silu, swiglu

# The gate's activation: SiLU (SwiGLU, Llama) or the tanh GELU (GeGLU, Gemma).
acts = st.sampled_from(["silu", "gelu_tanh"])
# The largest slope of each: silu' peaks at 1.0998, gelu_tanh' at 1.1290 (both near |g| = 2.4).
MAX_SLOPE = {"silu": 1.1, "gelu_tanh": 1.13}


@st.composite
def networks(draw, dtype=None, max_C=6, max_H=8, max_dims=2):
    """(x, params, dout): x (..., C), params for C -> H -> C with or without biases."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    lead = draw(S.batch_shapes(max_dims=max_dims))
    C, H = draw(S.dim(1, max_C)), draw(S.dim(1, max_H))
    params = draw(S.linear_params(dtype, (("gate", C, H), ("up", C, H), ("down", H, C)), bias=draw(st.booleans())))
    return draw(S.arrays(dtype, lead + (C,))), params, draw(S.arrays(dtype, lead + (C,)))


def _terms_tol(x, params, dout, act="silu"):
    """The dtype's tolerance with atol scaled by the largest sum of absolute terms behind any
    compared value: out sums |a| |down.w|; the gradients carry |dout| |down.w| back through
    |u| and the activation's slope (MAX_SLOPE) or |act(g)| <= |g|, then through |gate.w| + |up.w|
    or |x|. A result that cancels to near zero keeps the rounding error of those terms."""
    C, H = params["gate"]["w"].shape
    xs = np.abs(x).reshape(-1, C).astype(np.float64)
    g = xs @ np.abs(params["gate"]["w"]) + sum(np.abs(params[n].get("b", 0)) for n in ("gate",))
    u = xs @ np.abs(params["up"]["w"]) + np.abs(params["up"].get("b", 0))
    a = g * u                                                              # |silu(g)| <= |g|
    da = np.abs(dout).reshape(-1, C) @ np.abs(params["down"]["w"]).T       # (N, C) -> (N, H)
    dgu = da * (MAX_SLOPE[act] * u + g)                                    # (N, H)
    scales = [a @ np.abs(params["down"]["w"]), dgu @ (np.abs(params["gate"]["w"]) + np.abs(params["up"]["w"])).T,
              xs.T @ dgu, a.T @ np.abs(dout).reshape(-1, C), dgu.sum(axis=0)]
    tol = TOLERANCES[x.dtype]
    return dict(rtol=tol["rtol"], atol=tol["atol"] * max(1.0, max(float(s.max(initial=0)) for s in scales)))


# -- forward matches the twin -----------------------------------------------------------------

@given(case=networks(), act=acts)
def test_forward_matches_twin(case, act):
    x, params, dout = case
    out, _ = swiglu_forward(x, params, act)
    twin_out, _ = autograd(partial(swiglu, act=act), {"x": x, "params": params}, dout)
    assert_close(f"swiglu[{act}].out", out, twin_out, **_terms_tol(x, params, dout, act))


# -- backward matches autograd ----------------------------------------------------------------

@pytest.mark.twin_parity
@given(case=networks(), act=acts)
def test_backward_matches_autograd(case, act):
    x, params, dout = case
    _, cache = swiglu_forward(x, params, act)
    dx, dparams = swiglu_backward(dout, cache)
    _, grads = autograd(partial(swiglu, act=act), {"x": x, "params": params}, dout)
    tol = _terms_tol(x, params, dout, act)
    assert_close(f"swiglu[{act}].dx", dx, grads["x"], **tol)
    assert_tree_close(f"swiglu[{act}]", dparams, grads["params"], **tol)


@given(x=S.arrays(np.float64, (7,), bound=40.0) | S.arrays(np.float32, (7,), bound=40.0), data=st.data())
@example(x=np.array([-1000.0, -40.0, -1.0, 0.0, 1.0, 40.0, 1000.0]), data=None)
def test_silu_matches_twin_and_f_silu(x, data):
    dout = S.ramp(7, dtype=x.dtype) if data is None else data.draw(S.arrays(x.dtype, (7,)))
    with np.errstate(over="raise", invalid="raise"):   # no overflow or NaN, whatever the sign
        out, cache = silu_forward(x)
        dx = silu_backward(dout, cache)
    twin_out, twin = autograd(silu, {"x": x}, dout)
    builtin_out, builtin = autograd(lambda x: F.silu(x), {"x": x}, dout)
    assert_close("silu.out", out, twin_out)
    assert_close("silu.dx", dx, twin["x"])
    assert_close("silu.out vs F.silu", twin_out, builtin_out)
    assert_close("silu.dx vs F.silu", twin["x"], builtin["x"])


# -- the twin matches Hugging Face's LlamaMLP ---------------------------------------------------

@given(case=networks())
def test_twin_matches_llama_mlp(case):
    x, params, dout = case
    C, H = params["gate"]["w"].shape
    bias = "b" in params["gate"]
    config = LlamaConfig(hidden_size=C, intermediate_size=H, mlp_bias=bias,
                                      hidden_act="silu", num_attention_heads=1, head_dim=2)
    _check_against_hf_mlp("silu", "LlamaMLP", LlamaMLP(config), x, params, dout)


@given(case=networks())
def test_twin_matches_gemma2_mlp(case):
    """GeGLU: Gemma2MLP with Gemma's gelu_pytorch_tanh, which has no biases."""
    x, params, dout = case
    params = {name: {"w": layer["w"]} for name, layer in params.items()}
    C, H = params["gate"]["w"].shape
    config = Gemma2Config(hidden_size=C, intermediate_size=H, hidden_activation="gelu_pytorch_tanh",
                          num_attention_heads=1, head_dim=2)
    _check_against_hf_mlp("gelu_tanh", "Gemma2MLP", Gemma2MLP(config), x, params, dout)


def _check_against_hf_mlp(act, module_name, mlp, x, params, dout):
    """Hugging Face's MLP module holding params: its out, dx and every parameter gradient equal
    the twin's (with ``act``)."""
    mlp = mlp.to(to_torch(x).dtype)
    layers = {"gate": mlp.gate_proj, "up": mlp.up_proj, "down": mlp.down_proj}
    load_linears(layers, params)
    xt = to_torch(x, requires_grad=True)
    out = mlp(xt)
    (out * to_torch(dout)).sum().backward()
    theirs = linear_grads(layers)
    twin_out, twin_grads = autograd(partial(swiglu, act=act), {"x": x, "params": params}, dout)
    tol = _terms_tol(x, params, dout, act)
    assert_close(f"swiglu[{act}].out vs {module_name}", twin_out, to_numpy(out), **tol)
    assert_close(f"swiglu[{act}].dx vs {module_name}", twin_grads["x"], to_numpy(xt.grad), **tol)
    assert_tree_close(f"swiglu[{act}] vs {module_name}", twin_grads["params"], theirs, **tol)


# -- float16 and bfloat16: FlashAttention's error rule -------------------------------------------

def _plain_mlp(act):
    """LlamaMLP's (act "silu") or Gemma2MLP's (act "gelu_tanh") five ops in plain torch: in a low
    dtype each F.linear, the activation and the product round, as those modules do in bfloat16."""
    activation = {"silu": F.silu, "gelu_tanh": partial(F.gelu, approximate="tanh")}[act]

    def mlp(x, params):
        def lin(name, a):
            return F.linear(a, params[name]["w"].T, params[name].get("b"))
        return lin("down", activation(lin("gate", x)) * lin("up", x))
    return mlp


@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@given(case=networks(dtype=np.float64), act=acts)
def test_low_precision_meets_the_error_budget(dtype, case, act):
    """Ours and the twin against float64 truth, within twice the error of the MLP written with
    PyTorch's built-ins in the low dtype: out, dx and every weight's and bias's gradient (x, the
    parameters and dout rounded first: every side sees them)."""
    (x, params, dout), (x64, params64, dout64) = rounded_case(case, dtype)
    out, cache = swiglu_forward(x, params, act)
    dx, dparams = swiglu_backward(dout, cache)
    twin_out, twin_grads = autograd(partial(swiglu, act=act), {"x": x, "params": params}, dout)
    torch_out, torch_grads = autograd(_plain_mlp(act), {"x": x, "params": params}, dout)
    truth_out, truth_grads = autograd(_plain_mlp(act), {"x": x64, "params": params64}, dout64)
    for who, (o, g) in {"numpy": (out, {"x": dx, "params": dparams}), "twin": (twin_out, twin_grads)}.items():
        assert_tree_error_budget(f"swiglu[{act}][{who}]", dtype, {"out": o, "d": g},
                                 {"out": torch_out, "d": torch_grads}, {"out": truth_out, "d": truth_grads})


@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@given(x=S.arrays(np.float64, (7,), bound=40.0), dout=S.arrays(np.float64, (7,)))
def test_silu_low_precision_meets_the_error_budget(dtype, x, dout):
    """SiLU alone, ours and the twin, within twice F.silu's own low-precision error."""
    x, dout = round_to(x, dtype), round_to(dout, dtype)
    out, cache = silu_forward(x)
    dx = silu_backward(dout, cache)
    twin_out, twin_grads = autograd(silu, {"x": x}, dout)
    torch_out, torch_grads = autograd(lambda x: F.silu(x), {"x": x}, dout)
    truth_out, truth_grads = autograd(lambda x: F.silu(x), {"x": x.astype(np.float64)}, dout.astype(np.float64))
    for who, (o, g) in {"numpy": (out, dx), "twin": (twin_out, twin_grads["x"])}.items():
        assert_error_budget(f"silu[{who}]", dtype, {"out": (o, torch_out, truth_out),
                                                     "dx": (g, torch_grads["x"], truth_grads["x"])})


@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_mixed_low_precision_dtypes_are_refused(dtype):
    """A low-precision x with one float32 weight is a mix, refused before anything is cast up."""
    params = tree_map(lambda p: round_to(p, dtype), init_swiglu_params(3, 4, np.random.default_rng(0)))
    params["up"]["w"] = params["up"]["w"].astype(np.float32)
    with pytest.raises(TypeError, match=f"share one dtype: x is {dtype}, w is float32"):
        swiglu_forward(round_to(S.ramp(2, 3), dtype), params)
    with pytest.raises(TypeError, match=f"share one dtype: x is float32, w is {dtype}"):
        swiglu_forward(S.ramp(2, 3, dtype=np.float32), tree_map(lambda p: round_to(p, dtype), params))


# -- properties ---------------------------------------------------------------------------------

@given(case=networks(), data=st.data())
def test_positions_are_independent(case, data):
    x, params, _ = case
    rows = x.reshape(-1, x.shape[-1])
    perm = data.draw(st.permutations(range(rows.shape[0])))
    out, _ = swiglu_forward(rows, params)
    out_perm, _ = swiglu_forward(rows[perm], params)
    assert_close("swiglu.out of permuted rows", out_perm, out[perm])


@given(case=networks(), act=acts)
def test_closed_gate_blocks_everything(case, act):
    """With gate.w = 0 (and no gate bias) every gate is act(0) = 0: out is down.b or zero."""
    x, params, _ = case
    closed = {**params, "gate": {"w": np.zeros_like(params["gate"]["w"])}}
    out, _ = swiglu_forward(x, closed, act)
    expected = np.broadcast_to(params["down"].get("b", np.zeros(x.shape[-1], x.dtype)), x.shape)
    assert_close("swiglu.out with a closed gate", out, np.ascontiguousarray(expected))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
def test_init_shapes_dtype_and_range(dtype, bias):
    C, H = 8, 22
    params = init_swiglu_params(C, H, np.random.default_rng(0), bias=bias, dtype=dtype)
    shapes = {"gate.w": (C, H), "up.w": (C, H), "down.w": (H, C)}
    if bias:
        shapes.update({"gate.b": (H,), "up.b": (H,), "down.b": (C,)})
    leaves = dict(tree_leaves(params))
    assert {k: v.shape for k, v in leaves.items()} == shapes, "init_swiglu_params shapes"
    for path, leaf in leaves.items():
        bound = 1 / np.sqrt(H if path.startswith("down") else C)
        assert leaf.dtype == dtype, f"{path} dtype {leaf.dtype}"
        assert np.abs(leaf).max() <= bound, f"{path} exceeds the nn.Linear bound {bound}"
    # No biases unless asked for, as LlamaMLP (mlp_bias False by default).
    assert all("b" not in layer for layer in init_swiglu_params(C, H, np.random.default_rng(0)).values())


@pytest.mark.parametrize("bias", [True, False])
def test_init_statistics_match_nn_linear(bias):
    """init_swiglu_params draws like nn.Linear's default, as its docstring says (Hugging Face's
    LlamaMLP builds its three projections as nn.Linear): mean, spread, sign balance and range."""
    C, H = 64, 172
    params = init_swiglu_params(C, H, np.random.default_rng(0), bias=bias, dtype=np.float64)
    assert_drawn_like_nn_linear(params, (("gate", C, H), ("up", C, H), ("down", H, C)), bias)
    assert not np.array_equal(params["gate"]["w"], params["up"]["w"]), "gate.w and up.w are the same draw"


# -- finite differences (no torch) ----------------------------------------------------------------

@given(case=networks(dtype=np.float64, max_C=2, max_H=3, max_dims=1), act=acts)
def test_backward_matches_finite_differences(case, act):
    x, params, dout = case
    _, cache = swiglu_forward(x, params, act)
    dx, dparams = swiglu_backward(dout, cache)
    expected = numerical_grads(lambda x, params: swiglu_forward(x, params, act)[0], x, params, dout)
    assert_tree_close("swiglu vs finite differences", {"x": dx, **dparams}, expected, **FD_TOL)


# -- dtype preservation -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
def test_dtype_is_preserved(dtype):
    params = init_swiglu_params(4, 6, np.random.default_rng(0), dtype=dtype)
    x = S.ramp(2, 3, 4, dtype=dtype)
    out, cache = swiglu_forward(x, params)
    dx, dparams = swiglu_backward(S.ramp(2, 3, 4, dtype=dtype), cache)
    assert out.dtype == dtype, f"swiglu.out dtype {out.dtype}"
    assert dx.dtype == dtype, f"swiglu.dx dtype {dx.dtype}"
    for path, leaf in tree_leaves(dparams):
        assert leaf.dtype == dtype, f"swiglu.{path} gradient dtype {leaf.dtype}"


# -- bad input --------------------------------------------------------------------------------------

def test_bad_input():
    params = init_swiglu_params(4, 6, np.random.default_rng(0), dtype=np.float64)
    with pytest.raises(ValueError, match=r"gate.w must have shape \(3, 6\) for x \(2, 3\), got \(4, 6\)"):
        swiglu_forward(np.zeros((2, 3)), params)
    with pytest.raises(ValueError, match=r"down.w must have shape \(6, 4\) for x \(2, 4\), got \(5, 4\)"):
        swiglu_forward(np.zeros((2, 4)), {**params, "down": {"w": np.zeros((5, 4))}})
    with pytest.raises(ValueError, match=r"keys 'gate', 'up', 'down', got \['down', 'gate'\]"):
        swiglu_forward(np.zeros((2, 4)), {"gate": params["gate"], "down": params["down"]})
    with pytest.raises(ValueError, match=r"keys 'gate', 'up', 'down', got \['down', 'extra', 'gate', 'up'\]"):
        swiglu_forward(np.zeros((2, 4)), {**params, "extra": params["up"]})   # a key too many, not only too few
    with pytest.raises(TypeError, match="x is float32, w is float64"):
        swiglu_forward(np.zeros((2, 4), np.float32), params)
    with pytest.raises(TypeError, match="^init_swiglu_params needs rng: rng must be a np.random.Generator, got int$"):
        init_swiglu_params(4, 6, 0)
    # The wrong kind of input: integers would run through the matmuls and come out int64 or float64.
    with pytest.raises(TypeError, match="^x must be float16, bfloat16, float32 or float64, got dtype int64$"):
        swiglu_forward(np.zeros((2, 4), np.int64), params)
    with pytest.raises(TypeError, match="^x must be a NumPy array, got list$"):
        swiglu_forward([[0.0] * 4], params)
    for name in ("gate", "up", "down"):
        with pytest.raises(TypeError,
                           match=f"^{name}.w must be float16, bfloat16, float32 or float64, got dtype int32$"):
            swiglu_forward(np.zeros((2, 4)), {**params, name: {"w": params[name]["w"].astype(np.int32)}})
        for layer, got in (({"w": params[name]["w"].tolist()}, "list"), ({}, "NoneType")):
            with pytest.raises(TypeError, match=f"^{name}.w must be a NumPy array, got {got}$"):
                swiglu_forward(np.zeros((2, 4)), {**params, name: layer})
    with pytest.raises(ValueError, match=r"^gate.w must have shape \(4, None\) for x \(2, 4\), got \(\)$"):
        swiglu_forward(np.zeros((2, 4)), {**params, "gate": {"w": np.zeros(())}})
    with pytest.raises(ValueError, match=r"^gate.w must have shape \(4, 6\) for x \(2, 4\), got \(6,\)$"):
        swiglu_forward(np.zeros((2, 4)), {**params, "gate": {"w": np.zeros(6)}})   # H read from its last axis
    with pytest.raises(ValueError, match=r"^params must be a dict with keys 'gate', 'up', 'down', got list$"):
        swiglu_forward(np.zeros((2, 4)), [params["gate"]])
    for x, got in ((np.arange(3), "got dtype int64"), (np.zeros(3, np.complex64), "got dtype complex64")):
        with pytest.raises(TypeError, match=f"^x must be float16, bfloat16, float32 or float64, {got}$"):   # silu alone
            silu_forward(x)
    with pytest.raises(TypeError, match="^x must be a NumPy array, got list$"):
        silu_forward([0.5])
    with pytest.raises(ValueError, match=r"act must be one of \['gelu_tanh', 'silu'\], got 'gelu'"):
        swiglu_forward(np.zeros((2, 4)), params, act="gelu")
    _, cache = swiglu_forward(np.zeros((2, 4)), params)
    with pytest.raises(ValueError, match=r"swiglu: dout must have the shape .* \(2, 4\), got \(2, 6\)"):
        swiglu_backward(np.zeros((2, 6)), cache)


# -- bad upstream gradients --------------------------------------------------------------------------

@given(case=networks())
def test_bad_dout_is_refused(case):
    """swiglu's and silu's backward refuse a dout of another shape, layout, dtype or type, naming
    themselves; a NaN in a right one flows on as in autograd."""
    x, params, dout = case
    out, cache = swiglu_forward(x, params)
    assert_bad_dout_refused("swiglu", out, swiglu_backward, cache)
    s, silu_cache = silu_forward(x)
    assert_bad_dout_refused("silu", s, silu_backward, silu_cache)
    dout.flat[0] = np.nan
    dx, dparams = swiglu_backward(dout, cache)
    _, grads = autograd(swiglu, {"x": x, "params": params}, dout)
    assert_close("swiglu.dx with a NaN in dout", dx, grads["x"])
    assert_tree_close("swiglu with a NaN in dout", dparams, grads["params"])
