"""Parity tests for numpy_attn/feed_forward.py and torch_attn/feed_forward.py."""

import numpy as np
import pytest
import torch.nn.functional as F
from hypothesis import example, given
from hypothesis import strategies as st
from torch import nn

from numpy_attn._tree import tree_map
from numpy_attn.feed_forward import (
    feed_forward_backward,
    feed_forward_forward,
    init_feed_forward_params,
)
from parity_tests import strategies as S
from parity_tests.helpers import (
    FD_TOL,
    LOW_DTYPES,
    TOLERANCES,
    assert_bad_dout_refused,
    assert_close,
    assert_drawn_like_nn_linear,
    assert_tree_close,
    assert_tree_error_budget,
    autograd,
    gelu_truth,
    linear_grads,
    load_linears,
    numerical_grads,
    round_to,
    rounded_case,
    to_numpy,
    to_torch,
    tree_leaves,
)
from torch_attn.feed_forward import feed_forward

approximations = st.sampled_from(["none", "tanh"])


@st.composite
def networks(draw, dtype=None, max_C=6, max_dims=2):
    """(x, params, dout): x (..., C) with 0 to max_dims leading dims, params for C -> H = 4C -> C."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    lead = draw(S.batch_shapes(max_dims=max_dims))
    C = draw(S.dim(1, max_C))
    H = 4 * C
    params = draw(S.linear_params(dtype, (("fc", C, H), ("proj", H, C)), bias=draw(st.booleans())))
    return draw(S.arrays(dtype, lead + (C,))), params, draw(S.arrays(dtype, lead + (C,)))


def _terms_tol(x, params, dout):
    """The dtype's tolerance with atol scaled by the size of the terms summed into dx and the fc
    gradients: dout through |proj.w| and |fc.w| with GELU's slope (at most 1.13) taken as 1.

    Those gradients pass through GELU's derivative, which float32 computes from a rounded tanh or
    erf; where 1 - tanh^2 is small, one ulp of tanh is a large relative error, and the twins round
    it differently (Hypothesis found 5e-4 relative on a dx of 0.04 summed from terms of 10).
    """
    C, H = params["fc"]["w"].shape
    da = np.abs(dout).reshape(-1, C) @ np.abs(params["proj"]["w"]).T       # (N, C) -> (N, H)
    scales = [da @ np.abs(params["fc"]["w"]).T,                            # dx, (N, C)
              np.abs(x).reshape(-1, C).T @ da,                             # fc.w, (C, H)
              da.sum(axis=0)]                                              # fc.b, (H,)
    tol = TOLERANCES[x.dtype]
    return dict(rtol=tol["rtol"], atol=tol["atol"] * max(1.0, max(float(a.max()) for a in scales)))


# -- forward matches the twin -----------------------------------------------------------------

@given(approximate=approximations, case=networks())
def test_forward_matches_twin(approximate, case):
    x, params, dout = case
    out, _ = feed_forward_forward(x, params, approximate)
    twin_out, _ = autograd(lambda **kw: feed_forward(**kw, approximate=approximate),
                           {"x": x, "params": params}, dout)
    assert_close(f"feed_forward[{approximate}].out", out, twin_out)


# -- backward matches autograd ----------------------------------------------------------------

# Found by Hypothesis: every hidden unit at h = -3.75, where tanh-GELU's slope is computed from
# 1 - tanh^2 = 2.4e-4 in float32.
STEEP_TANH = (np.array([2.0, 4.0, 0.0, 0.0], np.float32),
              {"fc": {"w": np.full((4, 16), -0.625, np.float32), "b": np.zeros(16, np.float32)},
               "proj": {"w": np.ones((16, 4), np.float32), "b": np.zeros(4, np.float32)}},
              np.array([0.5, -1.0, 2.0, 1.5], np.float32))


@pytest.mark.twin_parity
@given(approximate=approximations, case=networks())
@example(approximate="tanh", case=STEEP_TANH)
def test_backward_matches_autograd(approximate, case):
    x, params, dout = case
    _, cache = feed_forward_forward(x, params, approximate)
    dx, dparams = feed_forward_backward(dout, cache)
    _, grads = autograd(lambda **kw: feed_forward(**kw, approximate=approximate),
                        {"x": x, "params": params}, dout)
    tol = _terms_tol(x, params, dout)
    assert_close(f"feed_forward[{approximate}].dx", dx, grads["x"], **tol)
    assert_tree_close(f"feed_forward[{approximate}]", dparams, grads["params"], **tol)


# -- the twin matches PyTorch's built-in --------------------------------------------------------

def _sequential(params, approximate):
    """nn.Sequential(Linear, GELU, Linear) holding our parameters (weights transposed)."""
    (C, H), bias = params["fc"]["w"].shape, "b" in params["fc"]
    dtype = to_torch(params["fc"]["w"]).dtype
    seq = nn.Sequential(nn.Linear(C, H, bias=bias, dtype=dtype), nn.GELU(approximate),
                        nn.Linear(H, C, bias=bias, dtype=dtype))
    load_linears({"fc": seq[0], "proj": seq[2]}, params)
    return seq


@given(approximate=approximations, case=networks())
def test_twin_matches_builtin(approximate, case):
    x, params, dout = case
    twin_out, twin_grads = autograd(lambda **kw: feed_forward(**kw, approximate=approximate),
                                    {"x": x, "params": params}, dout)
    seq = _sequential(params, approximate)
    xt = to_torch(x, requires_grad=True)
    out = seq(xt)
    (out * to_torch(dout)).sum().backward()
    builtin_grads = linear_grads({"fc": seq[0], "proj": seq[2]})
    label = f"feed_forward[{approximate}]"
    assert_close(f"{label}.out vs nn.Sequential", twin_out, to_numpy(out))
    tol = _terms_tol(x, params, dout)
    assert_close(f"{label}.dx vs nn.Sequential", twin_grads["x"], to_numpy(xt.grad), **tol)
    assert_tree_close(f"{label} vs nn.Sequential", twin_grads["params"], builtin_grads, **tol)


# -- float16 and bfloat16: FlashAttention's error rule -------------------------------------------


# Every hidden unit at gelu_tanh(-4.74), about -5e-6 (float16 subnormals): (1 + tanh) / 2 computed in
# float32 kept tanh's rounding near -1 whole, 3% of the value, and d proj.w came out 1.15x past the budget.
TAIL_CASE = (np.full(2, -3.314453125), {"fc": {"w": np.full((2, 8), 0.7152)}, "proj": {"w": np.zeros((8, 2))}},
             np.full(2, 4.0))


@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@given(approximate=approximations, case=networks(dtype=np.float64))
@example(approximate="tanh", case=TAIL_CASE)
def test_low_precision_meets_the_error_budget(dtype, approximate, case):
    """Ours and the twin against float64 truth, within twice the error of F.linear, F.gelu,
    F.linear in the low dtype (each rounding, as nn.Sequential does): out, dx and every weight's
    and bias's gradient."""
    (x, params, dout), (x64, params64, dout64) = rounded_case(case, dtype)

    def builtin(x, params):
        fc, proj = params["fc"], params["proj"]
        return F.linear(F.gelu(F.linear(x, fc["w"].T, fc.get("b")), approximate=approximate),
                        proj["w"].T, proj.get("b"))

    out, cache = feed_forward_forward(x, params, approximate)
    dx, dparams = feed_forward_backward(dout, cache)
    twin_out, twin_grads = autograd(lambda **kw: feed_forward(**kw, approximate=approximate),
                                    {"x": x, "params": params}, dout)
    def truth(x, params):                # helpers.gelu_truth: F.gelu's float64 cancels where x << 0
        fc, proj = params["fc"], params["proj"]
        return F.linear(gelu_truth(F.linear(x, fc["w"].T, fc.get("b")), approximate), proj["w"].T, proj.get("b"))

    torch_out, torch_grads = autograd(builtin, {"x": x, "params": params}, dout)
    truth_out, truth_grads = autograd(truth, {"x": x64, "params": params64}, dout64)
    for who, (o, g) in {"numpy": (out, {"x": dx, "params": dparams}), "twin": (twin_out, twin_grads)}.items():
        assert_tree_error_budget(f"feed_forward[{approximate}][{who}]", dtype, {"out": o, "d": g},
                                 {"out": torch_out, "d": torch_grads}, {"out": truth_out, "d": truth_grads})


@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_mixed_low_precision_dtypes_are_refused(dtype):
    """A low-precision x with a float32 bias (or a float32 x with low weights) is a mix, refused
    before anything is cast up, with linear's message."""
    params = tree_map(lambda p: round_to(p, dtype), init_feed_forward_params(3, np.random.default_rng(0)))
    x = round_to(S.ramp(2, 3), dtype)
    with pytest.raises(TypeError, match=f"share one dtype: x is {dtype}, w is {dtype}, b is float32"):
        feed_forward_forward(x, {**params, "proj": {**params["proj"], "b": params["proj"]["b"].astype(np.float32)}})
    with pytest.raises(TypeError, match=f"share one dtype: x is float32, w is {dtype}"):
        feed_forward_forward(x.astype(np.float32), params)


# -- properties ---------------------------------------------------------------------------------

@given(approximate=approximations, case=networks(), data=st.data())
def test_positions_are_independent(approximate, case, data):
    """Position-wise: permuting the positions (rows) permutes the outputs the same way."""
    x, params, _ = case
    rows = x.reshape(-1, x.shape[-1])
    perm = data.draw(st.permutations(range(rows.shape[0])))
    out, _ = feed_forward_forward(rows, params, approximate)
    out_perm, _ = feed_forward_forward(rows[perm], params, approximate)
    assert_close(f"feed_forward[{approximate}].out of permuted rows", out_perm, out[perm])


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
def test_init_shapes_dtype_and_range(dtype, bias):
    C = 8
    params = init_feed_forward_params(C, np.random.default_rng(0), dtype=dtype, bias=bias)
    shapes = {"fc.w": (C, 4 * C), "proj.w": (4 * C, C)}
    if bias:
        shapes.update({"fc.b": (4 * C,), "proj.b": (C,)})
    leaves = dict(tree_leaves(params))
    assert {k: v.shape for k, v in leaves.items()} == shapes, "init_feed_forward_params shapes"
    for path, leaf in leaves.items():
        bound = 1 / np.sqrt(C if path.startswith("fc") else 4 * C)
        assert leaf.dtype == dtype, f"{path} dtype {leaf.dtype}"
        assert np.abs(leaf).max() <= bound, f"{path} exceeds the nn.Linear bound {bound}"
        # Uniform on (-bound, bound): the largest of 32+ draws is close to the bound.
        assert np.abs(leaf).max() > bound / 2, f"{path} is not spread over (-{bound}, {bound})"
    again = init_feed_forward_params(C, np.random.default_rng(0), dtype=dtype, bias=bias)
    assert_tree_close("init_feed_forward_params with the same seed", again, params, rtol=0, atol=0)


# -- finite differences (no torch) ----------------------------------------------------------------

# Small sizes: every element of x and of the 8C^2 + 5C parameters costs four forward passes.
@given(approximate=approximations, case=networks(dtype=np.float64, max_C=2, max_dims=1))
def test_backward_matches_finite_differences(approximate, case):
    x, params, dout = case
    _, cache = feed_forward_forward(x, params, approximate)
    dx, dparams = feed_forward_backward(dout, cache)
    expected = numerical_grads(lambda x, params: feed_forward_forward(x, params, approximate)[0], x, params, dout)
    assert_tree_close(f"feed_forward[{approximate}] vs finite differences",
                      {"x": dx, **dparams}, expected, **FD_TOL)


# -- dtype preservation -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
def test_dtype_is_preserved(dtype):
    params = init_feed_forward_params(4, np.random.default_rng(0), dtype=dtype)
    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(dtype)
    out, cache = feed_forward_forward(x, params)
    dx, dparams = feed_forward_backward(np.full_like(out, 0.5), cache)
    assert out.dtype == dtype, f"feed_forward.out dtype {out.dtype}"
    assert dx.dtype == dtype, f"feed_forward.dx dtype {dx.dtype}"
    for path, leaf in tree_leaves(dparams):
        assert leaf.dtype == dtype, f"feed_forward.{path} gradient dtype {leaf.dtype}"


# -- bad input --------------------------------------------------------------------------------------

def test_bad_input():
    params = init_feed_forward_params(4, np.random.default_rng(0), dtype=np.float64)
    with pytest.raises(ValueError, match=r"fc.w \(4, 16\) and proj.w \(16, 4\) must be .* C = 3 from x \(2, 3\)"):
        feed_forward_forward(np.zeros((2, 3)), params)
    # fc.w too narrow for x while proj.w fits it: fc's own check refuses it, not linear's
    with pytest.raises(ValueError, match=r"^fc.w \(4, 16\) and proj.w \(16, 5\) must be .* C = 5 from x \(2, 5\)$"):
        feed_forward_forward(np.zeros((2, 5)), {"fc": {"w": params["fc"]["w"]}, "proj": {"w": np.zeros((16, 5))}})
    # proj.w wider than x: the output would come out (2, 5) for x (2, 4)
    with pytest.raises(ValueError, match=r"^fc.w \(4, 16\) and proj.w \(16, 5\) must be .* C = 4 from x \(2, 4\)$"):
        feed_forward_forward(np.zeros((2, 4)), {"fc": {"w": params["fc"]["w"]}, "proj": {"w": np.zeros((16, 5))}})
    bad = {"fc": params["fc"], "proj": {"w": np.zeros((8, 4))}}
    with pytest.raises(ValueError, match=r"proj.w \(8, 4\)"):
        feed_forward_forward(np.zeros((2, 4)), bad)
    with pytest.raises(ValueError, match=r"x must have shape \(..., C\), got \(\)"):
        feed_forward_forward(np.array(1.0), params)
    with pytest.raises(TypeError, match="x is float32, w is float64"):
        feed_forward_forward(np.zeros((2, 4), np.float32), params)
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh', got 'relu'"):
        feed_forward_forward(np.zeros((2, 4)), params, approximate="relu")
    with pytest.raises(TypeError, match="^init_feed_forward_params needs rng: rng must be a np.random.Generator, "
                                        "got int$"):
        init_feed_forward_params(4, 0)
    # The wrong kind of input: integers would run through the matmuls and come out int64 or float64.
    with pytest.raises(TypeError, match="^x must be float16, bfloat16, float32 or float64, got dtype int64$"):
        feed_forward_forward(np.zeros((2, 4), np.int64), params)
    with pytest.raises(TypeError, match="^x must be a NumPy array, got list$"):
        feed_forward_forward([[0.0] * 4], params)
    for name in ("fc", "proj"):
        for w, got in ((params[name]["w"].astype(np.int32), "got dtype int32"), (params[name]["w"].tolist(),
                                                                                "a NumPy array, got list")):
            with pytest.raises(TypeError, match=f"^{name}.w must be (float16, bfloat16, float32 or float64, )?{got}$"):
                feed_forward_forward(np.zeros((2, 4)), {**params, name: {**params[name], "w": w}})
    with pytest.raises(ValueError, match=r"^fc.w \(16,\) and proj.w \(16, 4\) must be \(C, H\) and \(H, C\) "
                                         r"with C = 4 from x \(2, 4\)$"):
        feed_forward_forward(np.zeros((2, 4)), {**params, "fc": {"w": np.zeros(16)}})
    with pytest.raises(ValueError, match=r"^fc.w \(\) and proj.w \(16, 4\) must be"):
        feed_forward_forward(np.zeros((2, 4)), {**params, "fc": {"w": np.zeros(())}})
    with pytest.raises(TypeError, match="^params must be a dict .*, got list$"):
        feed_forward_forward(np.zeros((2, 4)), [params["fc"], params["proj"]])
    with pytest.raises(ValueError, match=r"^params must hold proj: .* got keys \['fc'\] with proj = None$"):
        feed_forward_forward(np.zeros((2, 4)), {"fc": params["fc"]})
    with pytest.raises(ValueError, match=r"^params must hold fc: .* got keys \['fc', 'proj'\] with fc = \{'b'"):
        feed_forward_forward(np.zeros((2, 4)), {**params, "fc": {"b": params["fc"]["b"]}})
    with pytest.raises(ValueError, match=r"^b must have shape \(16,\) to match w \(4, 16\), got \(4,\)$"):
        feed_forward_forward(np.zeros((2, 4)), {**params, "fc": {**params["fc"], "b": np.zeros(4)}})


# -- bad upstream gradients --------------------------------------------------------------------------

@given(approximate=approximations, case=networks())
def test_bad_dout_is_refused(approximate, case):
    """A dout of another shape, layout, dtype or type is refused, by feed_forward_backward itself
    (not by a linear inside it); a NaN in a right one flows on as in autograd."""
    x, params, dout = case
    out, cache = feed_forward_forward(x, params, approximate)
    assert_bad_dout_refused("feed_forward_backward", out, feed_forward_backward, cache)
    # The backward's error analysis (_terms_tol), taken before the NaN goes in: the rows without
    # it are test_backward_matches_autograd's comparison (Hypothesis found tanh-GELU's slope at
    # h = -5.25, 1e-4 here and 0 in torch's float32, within it but not within the default).
    tol = _terms_tol(x, params, dout)
    dout.flat[0] = np.nan
    dx, dparams = feed_forward_backward(dout, cache)
    _, grads = autograd(lambda x, params: feed_forward(x, params, approximate), {"x": x, "params": params}, dout)
    assert_close("feed_forward.dx with a NaN in dout", dx, grads["x"], **tol)
    assert_tree_close("feed_forward with a NaN in dout", dparams, grads["params"], **tol)


@pytest.mark.parametrize("bias", [True, False])
def test_init_statistics_match_nn_linear(bias):
    """init_feed_forward_params draws like nn.Linear's default, as its docstring says."""
    C = 128
    params = init_feed_forward_params(C, np.random.default_rng(0), dtype=np.float64, bias=bias)
    assert_drawn_like_nn_linear(params, (("fc", C, 4 * C), ("proj", 4 * C, C)), bias)
