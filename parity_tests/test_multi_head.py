"""Parity tests for numpy_attn/multi_head.py and torch_attn/multi_head.py."""

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import torch_attn.multi_head as tw
from benchmarks import convert
from numpy_attn.kv_cache import init_kv_cache
from numpy_attn.multi_head import (
    init_multi_head_params,
    merge_heads,
    multi_head_attention_backward,
    multi_head_attention_forward,
    split_heads,
)
from numpy_attn.testing import multi_head_cancelled_size as cancelled_size
from parity_tests import strategies as S
from parity_tests.attention_kit import (
    assert_attention_budget,
    assert_dout_refused,
    four_axes,
    rounded,
    torch_or_none,
    widened,
)
from parity_tests.helpers import (
    FD_TOL,
    LOW_DTYPES,
    TOLERANCES,
    assert_close,
    assert_tree_close,
    autograd,
    numerical_grad,
    randomly_rounded,
    round_to,
    to_numpy,
    to_torch,
    tree_leaves,
    tree_map,
    tree_to_torch,
    ulp,
)

TORCH_DTYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}


@st.composite
def mha_inputs(draw, dtype=None, kinds=S.MASK_KINDS, dropout=True, max_heads=3, max_hs=3, bound=2.0):
    """A case: the forward's keyword arguments (``seed`` standing in for rng) and a drawn ``dout``.

    Self-attention or cross-attention over kv (B, S, C), with or without biases; weights are
    bounded by 1 so that the scores stay moderate. Masks broadcast to (B, nh, T, S).
    """
    dtype = draw(S.dtypes) if dtype is None else dtype
    B, T, nh, hs = draw(S.dim(1, 2)), draw(S.dim(1, 4)), draw(S.dim(1, max_heads)), draw(S.dim(1, max_hs))
    C = nh * hs
    cross = draw(st.booleans())
    S_ = draw(S.dim(1, 4)) if cross else T
    params = draw(S.linear_params(dtype, [(name, C, C) for name in "qkvo"], bias=draw(st.booleans())))
    case = dict(
        x=draw(S.arrays(dtype, (B, T, C), bound)),
        params=params,
        num_heads=nh,
        dropout_p=draw(st.sampled_from((0.0, 0.3, 0.75))) if dropout else 0.0,
        seed=draw(st.integers(0, 2**32 - 1)),
        kv=draw(S.arrays(dtype, (B, S_, C), bound)) if cross else None,
    )
    case["attn_mask"], case["is_causal"] = draw(S.attention_masks(dtype, (B, nh, T, S_), kinds))
    case["dout"] = draw(S.arrays(dtype, (B, T, C)))
    return case


def hand_params(C, bias=True, dtype=np.float64):
    return {name: {"w": S.ramp(C, C, dtype=dtype) * (i + 1) / 4, **({"b": S.ramp(C, dtype=dtype)} if bias else {})}
            for i, name in enumerate("qkvo")}


# T = 1 and one head, with that one query row masked entirely; cross-attention without biases,
# a float mask that hides a whole row, and dropout.
EDGE_CASES = [
    dict(x=S.ramp(1, 1, 2), params=hand_params(2), num_heads=1, attn_mask=np.zeros((1, 1), dtype=bool),
         is_causal=False, dropout_p=0.0, seed=0, kv=None, dout=S.ramp(1, 1, 2)),
    dict(x=S.ramp(2, 3, 4), params=hand_params(4, bias=False), num_heads=2,
         attn_mask=np.array([[0.0, -np.inf], [-np.inf, -np.inf], [1.0, 0.5]]), is_causal=False,
         dropout_p=0.5, seed=3, kv=S.ramp(2, 2, 4) / 2, dout=S.ramp(2, 3, 4)),
]


def numpy_forward(case, **changes):
    """Run the NumPy forward on a case (with ``changes``); returns (out, cache)."""
    c = {**case, **changes}
    return multi_head_attention_forward(
        c["x"], c["params"], c["num_heads"], attn_mask=c["attn_mask"], is_causal=c["is_causal"],
        dropout_p=c["dropout_p"], rng=np.random.default_rng(c["seed"]), kv=c["kv"])


def numpy_backward(case, cache):
    """(dx, dparams, dkv) from the NumPy backward; dkv is None for self-attention."""
    grads = multi_head_attention_backward(case["dout"], cache)
    assert len(grads) == (3 if case["kv"] is not None else 2), "one gradient per input given"
    return grads if len(grads) == 3 else (*grads, None)


def twin_fn(case, keep):
    """The torch twin as a function of (x, params, kv), with the case's masks and ``keep``."""
    mask = None if case["attn_mask"] is None else to_torch(case["attn_mask"])
    keep = None if keep is None else to_torch(keep)

    def fn(x, params, kv=None):
        return tw.multi_head_attention(
            x, params, case["num_heads"], attn_mask=mask, is_causal=case["is_causal"],
            dropout_p=case["dropout_p"], keep=keep, kv=kv)
    return fn


def gradient_tol(x, params, kv, dout, cache):
    """The dtype's tolerance for every gradient, atol scaled by the size of the terms that cancel.

    As in test_attention.gradient_tols: the heads' dq and dk are what is left of subtracting terms
    up to D * |k| * scale and D * |q| * scale, D = hs max|dy| max|v| / (1 - p) with dy the gradient
    after the output projection; the projections' backward multiplies them by |x|, |kv| or |w|.
    Hypothesis found float32 dWq entries of 0.011 off by 2.2e-5 against nn.MultiheadAttention.
    """
    tol = TOLERANCES[np.dtype(x.dtype)]
    return dict(rtol=tol["rtol"], atol=tol["atol"] * cancelled_size(x, params, kv, dout, cache))


def differentiable(case):
    return {"x": case["x"], "params": case["params"], "kv": case["kv"]}


# -- forward matches the twin -------------------------------------------------------------------

@given(case=mha_inputs())
@example(case=EDGE_CASES[0])
@example(case=EDGE_CASES[1])
def test_forward_matches_twin(case):
    out, cache = numpy_forward(case)
    inputs = {k: tree_to_torch(a) if a is not None else None for k, a in differentiable(case).items()}
    out_t, weights_t = twin_fn(case, cache.attention.keep)(**inputs)
    assert_close("mha.out", out, to_numpy(out_t))
    assert_close("mha.weights", cache.weights, to_numpy(weights_t))


@given(x=S.dtypes.flatmap(lambda d: S.arrays(d, (2, 3, 6))), num_heads=st.sampled_from((1, 2, 3, 6)))
def test_split_and_merge_heads_match_twin(x, num_heads):
    heads = split_heads(x, num_heads)
    assert_close("split_heads", heads, to_numpy(tw.split_heads(to_torch(x), num_heads)))
    assert_close("merge_heads", merge_heads(heads), to_numpy(tw.merge_heads(to_torch(heads))))


# -- backward matches autograd --------------------------------------------------------------------

@pytest.mark.twin_parity
@given(case=mha_inputs())
@example(case=EDGE_CASES[0])
@example(case=EDGE_CASES[1])
def test_backward_matches_autograd(case):
    _, cache = numpy_forward(case)
    dx, dparams, dkv = numpy_backward(case, cache)
    fn = twin_fn(case, cache.attention.keep)
    _, grads = autograd(lambda **t: fn(**t)[0], differentiable(case), case["dout"])
    tol = gradient_tol(case["x"], case["params"], case["kv"], case["dout"], cache)
    assert_close("mha.dx", dx, grads["x"], **tol)
    assert_tree_close("mha.dparams", dparams, grads["params"], **tol)
    if case["kv"] is not None:
        assert_close("mha.dkv", dkv, grads["kv"], **tol)


# -- the twin matches PyTorch's built-in ------------------------------------------------------------

def params_from_torch_mha(in_proj_weight, in_proj_bias, out_proj_weight, out_proj_bias):
    """Our {"q", "k", "v", "o"} parameter dict from nn.MultiheadAttention's four tensors.

    ``in_proj_weight`` (3C, C) stacks Wq, Wk, Wv in nn.Linear's (C_out, C_in) layout: split it
    into three (C, C) chunks and transpose each to our (C_in, C_out); ``in_proj_bias`` (3C,) splits
    the same way; ``out_proj.weight`` is transposed too. Biases are None without bias, and then get
    no "b" key. Works as well on the tensors' gradients, which have the same layout.
    """
    state = {"in_proj_weight": in_proj_weight, "in_proj_bias": in_proj_bias,
             "out_proj.weight": out_proj_weight, "out_proj.bias": out_proj_bias}
    return tree_map(lambda t: to_numpy(t).copy(), convert.from_mha(state))


def attn_mask_from_torch_mha(attn_mask, key_padding_mask):
    """Our attn_mask (True = may attend) from nn.MultiheadAttention's bool masks (True = ignore):
    attn_mask (T, S) and key_padding_mask (B, S), either None -> (T, S), (B, 1, 1, S),
    (B, 1, T, S) or None. The one place where the two conventions meet."""
    allowed = None
    if attn_mask is not None:
        allowed = ~attn_mask                                      # (T, S)
    if key_padding_mask is not None:
        keys = ~key_padding_mask[:, None, None, :]                # (B, S) -> (B, 1, 1, S)
        allowed = keys if allowed is None else allowed & keys     # (B, 1, T, S)
    return allowed


@st.composite
def torch_mha_inputs(draw):
    """nn.MultiheadAttention's parameters and masks in its own layout and conventions.

    Key 0 is never masked: nn.MultiheadAttention returns NaN on a fully masked row (we return
    zeros; test_attention compares those rows with F.scaled_dot_product_attention, which agrees).
    """
    dtype = draw(S.dtypes)
    B, T, nh, hs = draw(S.dim(1, 2)), draw(S.dim(1, 4)), draw(S.dim(1, 3)), draw(S.dim(1, 3))
    C = nh * hs
    cross = draw(st.booleans())
    S_ = draw(S.dim(1, 4)) if cross else T
    bias = draw(st.booleans())
    masks = {}
    for name, shape in (("attn_mask", (T, S_)), ("key_padding_mask", (B, S_))):
        if draw(st.booleans()):
            mask = draw(hnp.arrays(np.bool_, shape))
            mask[:, 0] = False
            masks[name] = mask
        else:
            masks[name] = None
    return dict(
        dtype=dtype, num_heads=nh, bias=bias,
        in_proj_weight=draw(S.arrays(dtype, (3 * C, C), 1.0)),
        in_proj_bias=draw(S.arrays(dtype, (3 * C,), 1.0)) if bias else None,
        out_proj_weight=draw(S.arrays(dtype, (C, C), 1.0)),
        out_proj_bias=draw(S.arrays(dtype, (C,), 1.0)) if bias else None,
        x=draw(S.arrays(dtype, (B, T, C), 2.0)),
        kv=draw(S.arrays(dtype, (B, S_, C), 2.0)) if cross else None,
        average_attn_weights=draw(st.booleans()),
        dout=draw(S.arrays(dtype, (B, T, C))),
        **masks,
    )


@given(case=torch_mha_inputs())
def test_twin_matches_builtin(case):
    """Equal to torch.nn.MultiheadAttention(batch_first=True): output, weights (averaged over the
    heads or not), dx, dkv and every parameter gradient, through the two helpers above."""
    C = case["x"].shape[-1]
    mha = torch.nn.MultiheadAttention(C, case["num_heads"], bias=case["bias"], batch_first=True,
                                      dtype=TORCH_DTYPES[case["x"].dtype])
    torch_params = (mha.in_proj_weight, mha.in_proj_bias, mha.out_proj.weight, mha.out_proj.bias)
    with torch.no_grad():
        names = ("in_proj_weight", "in_proj_bias", "out_proj_weight", "out_proj_bias")
        for p, name in zip(torch_params, names, strict=True):
            if p is not None:
                p.copy_(to_torch(case[name]))
    x_b = to_torch(case["x"], requires_grad=True)
    kv_b = x_b if case["kv"] is None else to_torch(case["kv"], requires_grad=True)
    torch_masks = {name: None if case[name] is None else to_torch(case[name])
                   for name in ("attn_mask", "key_padding_mask")}
    out_b, weights_b = mha(x_b, kv_b, kv_b, need_weights=True,
                           average_attn_weights=case["average_attn_weights"], **torch_masks)
    (out_b * to_torch(case["dout"])).sum().backward()

    params = params_from_torch_mha(*torch_params)
    mask = attn_mask_from_torch_mha(case["attn_mask"], case["key_padding_mask"])
    x_t = to_torch(case["x"], requires_grad=True)
    kv_t = None if case["kv"] is None else to_torch(case["kv"], requires_grad=True)
    params_t = tree_to_torch(params, requires_grad=True)
    out_t, weights_t = tw.multi_head_attention(x_t, params_t, case["num_heads"],
                                               attn_mask=None if mask is None else to_torch(mask), kv=kv_t)
    (out_t * to_torch(case["dout"])).sum().backward()

    assert_close("mha.out vs builtin", to_numpy(out_t), to_numpy(out_b))
    if case["average_attn_weights"]:
        weights_t = weights_t.mean(dim=1)                         # (B, nh, T, S) -> (B, T, S)
    assert_close("mha.weights vs builtin", to_numpy(weights_t), to_numpy(weights_b))
    _, cache = multi_head_attention_forward(case["x"], params, case["num_heads"], attn_mask=mask, kv=case["kv"])
    tol = gradient_tol(case["x"], params, case["kv"], case["dout"], cache)
    assert_close("mha.dx vs builtin", to_numpy(x_t.grad), to_numpy(x_b.grad), **tol)
    if kv_t is not None:
        assert_close("mha.dkv vs builtin", to_numpy(kv_t.grad), to_numpy(kv_b.grad), **tol)
    grads_b = params_from_torch_mha(*(None if p is None else p.grad for p in torch_params))
    grads_t = {name: {k: to_numpy(t.grad) for k, t in leaf.items()} for name, leaf in params_t.items()}
    assert_tree_close("mha.dparams vs builtin", grads_t, grads_b, **tol)


# -- properties ---------------------------------------------------------------------------------

@given(x=S.dtypes.flatmap(lambda d: S.arrays(d, (2, 3, 12))), num_heads=st.sampled_from((1, 2, 3, 4, 6, 12)),
       data=st.data())
def test_split_then_merge_is_the_identity(x, num_heads, data):
    """Merge undoes split and split undoes merge; head i holds channels i*hs .. (i+1)*hs; and each
    is the other's transpose, <split(x), y> = <x, merge(y)>, which makes it the other's backward."""
    hs = x.shape[-1] // num_heads
    heads = split_heads(x, num_heads)
    assert np.array_equal(merge_heads(heads), x), "merge_heads(split_heads(x)) != x"
    assert np.array_equal(split_heads(merge_heads(heads), num_heads), heads), "split(merge(h)) != h"
    for i in range(num_heads):
        assert np.array_equal(heads[:, i], x[:, :, i * hs:(i + 1) * hs]), f"head {i} has the wrong channels"
    y = data.draw(S.arrays(x.dtype, heads.shape), label="y")
    assert_close("<split(x), y> vs <x, merge(y)>", np.sum(heads * y, dtype=np.float64),
                 np.sum(x * merge_heads(y), dtype=np.float64))


@given(case=mha_inputs(kinds=("causal",), dropout=False), data=st.data())
def test_causal_output_ignores_later_inputs(case, data):
    """Self-attention with is_causal: out[:, :t+1] does not depend on x[:, t+1:] (nor on kv[:, t+1:])."""
    t = data.draw(st.integers(0, case["x"].shape[1] - 1), label="t")
    changed = {}
    for name in ("x", "kv"):
        if case[name] is not None:
            a = case[name].copy()
            a[:, t + 1:] = data.draw(S.arrays(a.dtype, a[:, t + 1:].shape), label=name)
            changed[name] = a
    out, _ = numpy_forward(case)
    out_changed, _ = numpy_forward(case, **changed)
    assert_close("mha.out[:, :t+1] after changing inputs after t", out_changed[:, :t + 1], out[:, :t + 1])


@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
@pytest.mark.parametrize("bias", [True, False])
def test_init_multi_head_params(dtype, bias):
    """U(-1/sqrt(C), 1/sqrt(C)) weights (C_in, C_out), zero biases, reproducible from the seed."""
    C = 64
    params = init_multi_head_params(C, np.random.default_rng(0), bias=bias, dtype=dtype)
    again = init_multi_head_params(C, np.random.default_rng(0), bias=bias, dtype=dtype)
    assert sorted(params) == ["k", "o", "q", "v"], f"params keys {sorted(params)}"
    bound = 1 / np.sqrt(C)
    for name, p in params.items():
        assert sorted(p) == (["b", "w"] if bias else ["w"]), f"params[{name!r}] keys {sorted(p)}"
        assert p["w"].shape == (C, C) and p["w"].dtype == dtype, f"{name}.w {p['w'].shape} {p['w'].dtype}"
        assert np.all(np.abs(p["w"]) <= bound), f"{name}.w outside +-1/sqrt(C)"
        # The standard deviation of U(-a, a) is a / sqrt(3); with 4096 draws the sample's is
        # within 3% of it far beyond 5 sigma (its relative standard error is about 1%).
        assert abs(p["w"].std() / (bound / np.sqrt(3)) - 1) < 0.03, f"{name}.w std {p['w'].std()}"
        if bias:
            assert p["b"].shape == (C,) and p["b"].dtype == dtype and not p["b"].any(), f"{name}.b"
    assert not np.array_equal(params["q"]["w"], params["k"]["w"]), "q and k weights are equal"
    assert_tree_close("init_multi_head_params with the same seed", params, again)


# -- finite differences (no torch) ----------------------------------------------------------------

@given(case=mha_inputs(dtype=np.float64, max_heads=2, max_hs=2, bound=1.0))
@example(case=EDGE_CASES[1])
def test_backward_matches_finite_differences(case):
    """Every gradient, x, kv and each parameter, against finite differences of the NumPy forward
    alone. The stencil perturbs each array in place, and the forward reads it from the case."""
    _, cache = numpy_forward(case)
    dx, dparams, dkv = numpy_backward(case, cache)
    grads = [("x", case["x"], dx)] + [(f"params.{path}", leaf, dict(tree_leaves(dparams))[path])
                                       for path, leaf in tree_leaves(case["params"])]
    if case["kv"] is not None:
        grads.append(("kv", case["kv"], dkv))
    for name, array, grad in grads:
        expected = numerical_grad(lambda _: numpy_forward(case)[0], array, case["dout"])
        assert_close(f"mha.d{name} vs finite differences", grad, expected, **FD_TOL)


# -- float16 and bfloat16: FlashAttention's error rule -------------------------------------------

def torch_program(case, backend):
    """Multi-head attention as PyTorch code writes it, no twin: F.linear for each projection (our
    (C_in, C_out) weights transposed), heads by view and transpose, F.scaled_dot_product_attention
    on ``backend`` alone (an SDPBackend), heads merged, F.linear; a function of (x, params, kv)."""
    from torch.nn.attention import sdpa_kernel

    mask, nh = four_axes(torch_or_none(case["attn_mask"])), case["num_heads"]

    def fn(x, params, kv=None):
        B, T, C = x.shape
        src = x if kv is None else kv

        def project(name, a):                                     # (B, L, C) -> (B, nh, L, hs)
            return F.linear(a, params[name]["w"].T, params[name].get("b")).view(B, -1, nh, C // nh).transpose(1, 2)
        with sdpa_kernel([backend]):
            y = F.scaled_dot_product_attention(project("q", x), project("k", src), project("v", src),
                                               attn_mask=mask, is_causal=case["is_causal"])
        y = y.transpose(1, 2).reshape(B, T, C)                    # (B, nh, T, hs) -> (B, T, C)
        return F.linear(y, params["o"]["w"].T, params["o"].get("b"))
    return fn


def mha_budget_tensors(out, dx, dparams, dkv):
    """{"out", "dx", "dq.w", ..., "dkv"} from the forward's output and the backward's gradients."""
    return {"out": out, "dx": dx, **{f"d{path}": g for path, g in tree_leaves(dparams)},
            **({} if dkv is None else {"dkv": dkv})}


@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@given(case=mha_inputs(dtype=np.float64, dropout=False))
@example(case=EDGE_CASES[0])
@example(case={**EDGE_CASES[1], "dropout_p": 0.0})
def test_low_precision_meets_the_error_budget(dtype, case):
    """Ours and the twin in float16 and bfloat16 against float64 truth (the PyTorch program below
    on the same rounded inputs, sdpa's math backend), within twice the error of that program run
    in the low dtype, its attention on sdpa's CPU flash kernel (PyTorch's default there): out, dx,
    every parameter's gradient and dkv, self- and cross-attention, masks as drawn."""
    from torch.nn.attention import SDPBackend

    case = rounded({**case, "params": tree_map(lambda a: round_to(a, dtype), case["params"])}, dtype)
    out, cache = numpy_forward(case)
    ours = mha_budget_tensors(out, *numpy_backward(case, cache))
    sides = {}
    truth_inputs = {**widened(differentiable(case)), "params": tree_map(lambda a: a.astype(np.float64), case["params"])}
    for name, fn, inputs, dout in (
            ("twin", lambda **t: twin_fn(case, None)(**t)[0], differentiable(case), case["dout"]),
            ("torch", torch_program(case, SDPBackend.FLASH_ATTENTION), differentiable(case), case["dout"]),
            ("truth", torch_program(widened(case), SDPBackend.MATH), truth_inputs, case["dout"].astype(np.float64))):
        o, grads = autograd(fn, inputs, dout)
        sides[name] = mha_budget_tensors(o, grads["x"], grads["params"], grads.get("kv"))
    # Projections around attention, as a block's: helpers.RANDOM_ROUNDINGS says why these runs.
    runs = [mha_budget_tensors(o, grads["x"], grads["params"], grads.get("kv"))
               for o, grads in randomly_rounded(lambda: autograd(torch_program(widened(case), SDPBackend.MATH),
                                                                 truth_inputs, case["dout"].astype(np.float64)), dtype)]
    wide = widened({n: case[n] for n in ("x", "kv", "dout")})
    size = cancelled_size(wide["x"], tree_map(lambda a: a.astype(np.float64), case["params"]), wide["kv"],
                          wide["dout"], cache)
    terms = {name: size for name in ours if name != "out"}        # every gradient cancels terms that large
    if "dk.b" in ours:
        # dk.b is 0 for every input: the key bias adds q_t . b_k to every score of row t, which softmax
        # ignores; its truth is float64 noise and the rule has nothing to measure. Each side sums the
        # B * S entries of dk rounded to the low dtype (PyTorch's program too: sdpa rounds dk before
        # F.linear's backward sums it), each entry off by at most u |dk| <= u * 2 T size (|dscores| <= 2 D,
        # unit roundoff u), so that |dk.b| <= B S * 2 T u size.
        B, T, C = case["x"].shape
        S_ = T if case["kv"] is None else case["kv"].shape[1]
        bound = B * S_ * 2 * T * ulp(1.0, dtype) / 2 * size
        for who, got in {"numpy": ours, "twin": sides["twin"]}.items():
            assert_close(f"multi_head[{who}] dk.b ({dtype}), 0 for every input", got.pop("dk.b").astype(np.float64),
                         sides["truth"]["dk.b"], rtol=0, atol=bound)
        del sides["torch"]["dk.b"], sides["truth"]["dk.b"]
        for r in runs:
            del r["dk.b"]
    assert_attention_budget("multi_head", dtype, ours, sides["twin"], sides["torch"], sides["truth"], terms, runs)


@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_low_precision_dtype_is_preserved_and_mixes_are_refused(dtype):
    """float16 and bfloat16 stay themselves through every step, gradients included; a float32
    kv or weight beside a low-precision x is refused, naming both."""
    low = LOW_DTYPES[dtype][0]
    x, params = S.ramp(2, 3, 4, dtype=low), hand_params(4, dtype=low)
    case = dict(x=x, params=params, num_heads=2, attn_mask=S.ramp(3, 2, dtype=low), is_causal=False,
                dropout_p=0.25, seed=0, kv=S.ramp(2, 2, 4, dtype=low), dout=S.ramp(2, 3, 4, dtype=low))
    out, cache = numpy_forward(case)
    dx, dparams, dkv = numpy_backward(case, cache)
    for name, a in [("out", out), ("weights", cache.weights), ("dx", dx), ("dkv", dkv), *tree_leaves(dparams)]:
        assert a.dtype == low, f"mha.{name} dtype {a.dtype}"
    with pytest.raises(TypeError, match=f"x is {dtype}, kv is float32"):
        multi_head_attention_forward(x, params, 2, kv=case["kv"].astype(np.float32))
    wide_q = {**params, "q": {**params["q"], "w": params["q"]["w"].astype(np.float32)}}
    with pytest.raises(TypeError, match=re.escape(f'x is {dtype}, params["q"]["w"] is float32')):
        multi_head_attention_forward(x, wide_q, 2)


# -- dtype preservation -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
@pytest.mark.parametrize("cross", [False, True])
def test_dtype_is_preserved(dtype, cross):
    case = dict(x=S.ramp(2, 3, 4, dtype=dtype), params=hand_params(4, dtype=dtype), num_heads=2,
                attn_mask=S.ramp(3, 2 if cross else 3, dtype=dtype), is_causal=False, dropout_p=0.25,
                seed=0, kv=S.ramp(2, 2, 4, dtype=dtype) if cross else None, dout=S.ramp(2, 3, 4, dtype=dtype))
    out, cache = numpy_forward(case)
    dx, dparams, dkv = numpy_backward(case, cache)
    arrays = [("out", out), ("weights", cache.weights), ("dx", dx), *tree_leaves(dparams)]
    if cross:
        arrays.append(("dkv", dkv))
    for name, a in arrays:
        assert a.dtype == dtype, f"mha.{name} dtype {a.dtype}"


# -- bad input --------------------------------------------------------------------------------------

def test_bad_input():
    x, params = np.zeros((2, 3, 6)), hand_params(6)
    with pytest.raises(ValueError, match=r"C = 6 of x \(2, 3, 6\) is not divisible by num_heads = 4"):
        multi_head_attention_forward(x, params, 4)
    with pytest.raises(ValueError, match=r"C = 6 of x \(2, 3, 6\) is not divisible by num_heads = 0"):
        split_heads(x, 0)
    with pytest.raises(ValueError, match=r"kv must have shape \(B, S, C\) = \(2, S, 6\) to match "
                                         r"x \(2, 3, 6\), got \(2, 5, 4\)"):
        multi_head_attention_forward(x, params, 2, kv=np.zeros((2, 5, 4)))
    with pytest.raises(ValueError, match=r"x must have 3 dimensions, got shape \(3, 6\)"):
        multi_head_attention_forward(x[0], params, 2)
    with pytest.raises(ValueError, match=r"x must have 4 dimensions, got shape \(2, 3, 6\)"):
        merge_heads(x)
    with pytest.raises(ValueError, match=r"attn_mask of shape \(3, 4\) does not broadcast to the "
                                         r"scores' shape \(2, 3, 3, 3\)"):
        multi_head_attention_forward(x, params, 3, attn_mask=np.ones((3, 4), dtype=bool))
    with pytest.raises(TypeError, match="dropout_p = 0.1 needs rng"):
        multi_head_attention_forward(x, params, 3, dropout_p=0.1)


def test_bad_input_names_the_callers_argument():
    """Errors name what the caller passed (x, kv, params["k"]["w"]), not the projected q, k, v."""
    x, params = np.zeros((2, 3, 6)), hand_params(6)
    with pytest.raises(TypeError, match=r"kv must be float16, bfloat16, float32 or float64, got dtype int64"):
        multi_head_attention_forward(x, params, 2, kv=np.zeros((2, 5, 6), dtype=np.int64))
    with pytest.raises(TypeError, match=r"x is float64, kv is float32"):
        multi_head_attention_forward(x, params, 2, kv=np.zeros((2, 5, 6), dtype=np.float32))
    with pytest.raises(TypeError, match=r'x is float64, .*params\["v"\]\["w"\] is float32'):
        multi_head_attention_forward(x, {**params, "v": {"w": params["v"]["w"].astype(np.float32)}}, 2)
    with pytest.raises(ValueError, match=r'params\["o"\]\["b"\] must have shape \(6,\) for C = 6 '
                                         r"of x \(2, 3, 6\), got \(5,\)"):
        multi_head_attention_forward(x, {**params, "o": {"w": params["o"]["w"], "b": np.zeros(5)}}, 2)
    with pytest.raises(TypeError, match=r'params must be a dict with keys "q", "k", "v", "o"'):
        multi_head_attention_forward(x, {"q": params["q"]}, 2)
    for name in ("x", "kv"):
        arrays = {"x": x.copy(), "kv": np.zeros((2, 4, 6))}
        arrays[name][1, 2, 3] = np.nan
        with pytest.raises(ValueError, match=rf"{name} of shape \(2, \d, 6\) holds NaN or inf"):
            multi_head_attention_forward(arrays["x"], params, 2, kv=arrays["kv"])
    bad = hand_params(6)
    bad["k"]["w"][0, 0] = np.inf
    with pytest.raises(ValueError, match=r'params\["k"\]\["w"\] of shape \(6, 6\) holds NaN or inf'):
        multi_head_attention_forward(x, bad, 2)
    # Every weight's NaN or -inf is named, decoding one token (its projection is read, not the
    # weight) or three (the projection is larger, and the weight is read).
    for name in ("q", "k", "v", "o"):
        for key, where in (("w", (5, 1)), ("b", (4,))):
            for T in (1, 3):
                bad = hand_params(6)
                bad[name][key][where] = np.nan if T == 1 else -np.inf
                with pytest.raises(ValueError, match=rf'params\["{name}"\]\["{key}"\] of shape \({6}'):
                    multi_head_attention_forward(np.ones((2, T, 6)), bad, 2, is_causal=True)


@pytest.mark.parametrize("q", [np.zeros((6, 6)), {"b": np.zeros(6)}, {"w": np.zeros((6, 6)), "bias": np.zeros(6)}])
def test_a_projection_that_is_not_a_dict_with_w_is_refused(q):
    """params["q"] must be {"w": (C, C), "b": (C,) optional}: an array, a dict without "w", or
    one with another key is a TypeError that shows the expected layout and what was given."""
    x, params = np.zeros((2, 3, 6)), hand_params(6)
    got = "ndarray" if isinstance(q, np.ndarray) else re.escape(str(sorted(q)))
    with pytest.raises(TypeError, match=rf'params\["q"\] must be a dict \{{"w": \(6, 6\), "b": \(6,\) optional\}}, '
                                        rf"got {got}"):
        multi_head_attention_forward(x, {**params, "q": q}, 2)


@pytest.mark.parametrize("width", [4, 3])
def test_key_value_heads_must_divide_the_query_heads(width):
    """k and v of width 4 make 2 key/value heads of hs = 2, which do not divide 3 query heads;
    width 3 is not a whole number of heads: both are refused naming params["k"]["w"]."""
    x, params = np.zeros((2, 3, 6)), hand_params(6)
    for name in "kv":
        params[name] = {"w": np.zeros((6, width)), "b": np.zeros(width)}
    with pytest.raises(ValueError, match=rf'params\["k"\]\["w"\] of shape \(6, {width}\) must be \(C, nkv \* hs\) '
                                         r"with hs = 2 and nkv dividing num_heads = 3"):
        multi_head_attention_forward(x, params, 3)


def test_grouped_query_heads_run_as_the_twin_and_their_shapes_are_checked():
    """k and v of width nkv * hs < C (3 query heads of hs = 2 over 1 key/value head): the output
    equals the twin's, and a v of another width is refused naming its expected (C, nkv * hs)."""
    rng = np.random.default_rng(0)
    x, params = rng.standard_normal((2, 3, 6)), init_multi_head_params(6, rng, dtype=np.float64, kv_width=2)
    out, _ = multi_head_attention_forward(x, params, 3, is_causal=True)
    twin, _ = tw.multi_head_attention(to_torch(x), tree_to_torch(params), 3, is_causal=True)
    assert_close("multi_head.out (grouped-query heads)", out, twin)
    params["v"] = {"w": np.zeros((6, 4)), "b": np.zeros(4)}
    with pytest.raises(ValueError, match=r'^params\["v"\]\["w"\] must have shape \(6, 2\)'):
        multi_head_attention_forward(x, params, 3)


def test_cross_attention_at_a_real_models_width_runs_as_the_twin():
    """C = 768 (GPT-2's), past the integers Python keeps one object for (-5 to 256): the width
    checks compare values, so x over kv of that width runs, as the twin does."""
    rng = np.random.default_rng(0)
    x, kv, params = rng.standard_normal((1, 1, 768)), rng.standard_normal((1, 2, 768)), \
        init_multi_head_params(768, rng, dtype=np.float64)
    out, _ = multi_head_attention_forward(x, params, 12, kv=kv)
    twin, _ = tw.multi_head_attention(to_torch(x), tree_to_torch(params), 12, kv=to_torch(kv))
    assert_close("multi_head.out (C = 768, over kv)", out, twin)


def test_backward_after_a_cached_forward_is_refused_with_its_counts():
    """Two tokens attended over three cached ones: the backward has no input for the cached three,
    and says so with the counts (5 keys attended, 2 of them from its input)."""
    rng = np.random.default_rng(0)
    params, cache = init_multi_head_params(6, rng, dtype=np.float64), init_kv_cache(1, 2, 3, 5, 2, np.float64)
    multi_head_attention_forward(rng.standard_normal((2, 3, 6)), params, 3, kv_cache=cache.layer(0))
    out, step = multi_head_attention_forward(rng.standard_normal((2, 2, 6)), params, 3, is_causal="bottom_right",
                                             kv_cache=cache.layer(0))
    with pytest.raises(ValueError, match=r"^multi_head_attention_backward: the forward attended over 5 keys of which "
                                         r"only 2 came from its input; the rest came from a key/value cache, which "
                                         r"is for inference only$"):
        multi_head_attention_backward(np.ones_like(out), step)


def test_a_width_of_one_is_the_smallest_model():
    """C = 1, one head of one channel: every weight from U(-1, 1) (bound 1 / sqrt(1)), biases 0."""
    params = init_multi_head_params(1, np.random.default_rng(0), dtype=np.float64)
    for name in "qkvo":
        assert params[name]["w"].shape == (1, 1) and abs(params[name]["w"][0, 0]) <= 1
        assert params[name]["b"].shape == (1,) and params[name]["b"][0] == 0


@pytest.mark.parametrize("C, error, message", [
    (0, ValueError, "C must be a positive integer"), (-4, ValueError, "C must be a positive integer"),
    (2.5, TypeError, "C must be a positive integer"), (None, TypeError, "C must be a positive integer"),
])
def test_init_multi_head_params_bad_width(C, error, message):
    with pytest.raises(error, match=message):
        init_multi_head_params(C, np.random.default_rng(0))


@given(case=mha_inputs(), data=st.data())
def test_bad_dout_is_refused(case, data):
    out, cache = numpy_forward(case)
    assert_dout_refused("multi_head_attention", multi_head_attention_backward, cache, out.shape, out.dtype, data)


@given(case=mha_inputs(dropout=False))
def test_changing_out_leaves_gradients_alone(case):
    """The cache does not hold ``out``: writing into it after the forward changes no gradient."""
    out, cache = numpy_forward(case)
    grads = numpy_backward(case, cache)
    out[...] = 7.0
    again = numpy_backward(case, cache)
    for name, a, b in zip(("dx", "dparams", "dkv"), again, grads, strict=True):
        if name == "dparams":
            assert_tree_close("mha.dparams after writing into out", a, b, rtol=0, atol=0)
        elif a is not None:
            assert np.array_equal(a, b), f"mha.{name} changed after writing into out"


@given(case=mha_inputs(kinds=("float",)))
@example(case=EDGE_CASES[1])
def test_float_mask_gradient_matches_autograd(case):
    """attn_mask_grad=True passes the float mask's gradient through: the backward returns it
    last, in the mask's shape, equal to autograd's through the twin."""
    out, cache = multi_head_attention_forward(
        case["x"], case["params"], case["num_heads"], attn_mask=case["attn_mask"],
        dropout_p=case["dropout_p"], rng=np.random.default_rng(case["seed"]), kv=case["kv"],
        attn_mask_grad=True)
    grads = multi_head_attention_backward(case["dout"], cache)
    assert len(grads) == (4 if case["kv"] is not None else 3), "one gradient per input, then dattn_mask"
    dmask = grads[-1]
    keep = None if cache.attention.keep is None else to_torch(cache.attention.keep)

    def fn(x, params, attn_mask, kv=None):
        return tw.multi_head_attention(x, params, case["num_heads"], attn_mask=attn_mask,
                                       dropout_p=case["dropout_p"], keep=keep, kv=kv)[0]
    _, expected = autograd(fn, {**differentiable(case), "attn_mask": case["attn_mask"]}, case["dout"])
    assert dmask.shape == case["attn_mask"].shape, f"dattn_mask {dmask.shape}, mask {case['attn_mask'].shape}"
    # As gradient_tol, times the number of scores each mask entry sums.
    tol = gradient_tol(case["x"], case["params"], case["kv"], case["dout"], cache)
    tol["atol"] *= cache.weights.size // case["attn_mask"].size
    assert_close("mha.dattn_mask", dmask, expected["attn_mask"], **tol)


@given(case=mha_inputs(kinds=("none",)))
def test_bottom_right_causal_passes_through(case):
    """is_causal="bottom_right" reaches the heads' attention: no weight above the bottom-right
    diagonal, and the twin agrees, forward and backward."""
    case = {**case, "is_causal": "bottom_right"}
    out, cache = numpy_forward(case)
    dx, dparams, dkv = numpy_backward(case, cache)
    T, S_ = cache.weights.shape[-2:]
    allowed = np.arange(S_)[None, :] <= np.arange(T)[:, None] + S_ - T       # (T, S)
    assert np.all(cache.weights[..., ~allowed] == 0), "mha.weights nonzero above the bottom-right diagonal"
    fn = twin_fn(case, cache.attention.keep)
    out_t, grads = autograd(lambda **t: fn(**t)[0], differentiable(case), case["dout"])
    assert_close("mha.out bottom-right", out, out_t)
    tol = gradient_tol(case["x"], case["params"], case["kv"], case["dout"], cache)
    assert_close("mha.dx bottom-right", dx, grads["x"], **tol)
    assert_tree_close("mha.dparams bottom-right", dparams, grads["params"], **tol)
    if case["kv"] is not None:
        assert_close("mha.dkv bottom-right", dkv, grads["kv"], **tol)
