"""Parity tests for numpy_attn/optim.py and torch_attn/optim.py: several steps of AdamW and SGD."""

import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from numpy_attn import optim
from parity_tests import strategies as S
from parity_tests.helpers import (
    LOW_DTYPES,
    assert_close,
    assert_error_budget,
    assert_tree_close,
    round_to,
    to_numpy,
    to_torch,
    tree_leaves,
    tree_map,
    tree_to_torch,
)
from torch_attn import optim as torch_optim

STEPS = 4


@st.composite
def trees(draw, dtype=None, steps=STEPS):
    """(params, [grads] * steps): a nested dict like a model's, {"lin": {"w", "b"}, "ln": {"w"}, "wte"}."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    C_in, C_out, V = draw(S.dim(1, 5)), draw(S.dim(1, 5)), draw(S.dim(1, 4))
    shapes = {"lin": {"w": (C_in, C_out), "b": (C_out,)}, "ln": {"w": (C_out,)}, "wte": (V, C_in)}

    def tree(shapes):
        return tree_map(lambda shape: draw(S.arrays(dtype, shape)), shapes)

    return tree(shapes), [tree(shapes) for _ in range(steps)]


ADAMW_FIELDS = {
    "lr": st.floats(0, 0.1),
    "betas": st.tuples(st.floats(0, 0.99), st.floats(0, 0.999)),
    "eps": st.sampled_from([1e-8, 1e-6, 1e-3]),
    "weight_decay": st.floats(0, 0.1),
}
adamw_hyper = st.fixed_dictionaries(ADAMW_FIELDS)

# Against torch.optim.AdamW: torch updates m with lerp, m + (1 - b1) * (g - m), which for b1 near 0
# cancels and differs from ours by ulps of m. AdamW divides m by sqrt(v) + eps, which stays bounded
# only when b1 < sqrt(b2); outside (b2 = 0 and a zero gradient: v = 0, the step is lr * m / eps),
# those ulps become lr-sized differences (the thorough profile found 0.08). So b2 >= 0.9 > b1^2 here.
bounded_adamw_hyper = st.fixed_dictionaries(
    {**ADAMW_FIELDS, "betas": st.tuples(st.floats(0, 0.9), st.floats(0.9, 0.999))})

sgd_hyper = st.fixed_dictionaries({
    "lr": st.floats(0, 0.1),
    "momentum": st.sampled_from([0.0, 0.5, 0.9]),
    "dampening": st.sampled_from([0.0, 0.25]),
    "weight_decay": st.floats(0, 0.1),
}).flatmap(lambda h: st.fixed_dictionaries({
    **{k: st.just(v) for k, v in h.items()},
    # torch refuses nesterov without momentum or with dampening
    "nesterov": st.booleans() if h["momentum"] > 0 and h["dampening"] == 0 else st.just(False),
}))

CASES = [("adamw", adamw_hyper), ("sgd", sgd_hyper)]

OPTIMIZERS = {
    "adamw": (optim.adamw_init, optim.adamw_step, torch_optim.adamw_init, torch_optim.adamw_step,
              torch.optim.AdamW),
    "sgd": (optim.sgd_init, optim.sgd_step, torch_optim.sgd_init, torch_optim.sgd_step,
            torch.optim.SGD),
}

HAND_PICKED = ({"lin": {"w": np.array([[1.0, -2.0]]), "b": np.array([0.5, 0.0])},
                "ln": {"w": np.array([1.0, 1.0])}, "wte": np.array([[3.0]])},
               [{"lin": {"w": np.array([[0.5, -1.0]]), "b": np.array([0.0, 2.0])},
                 "ln": {"w": np.array([-0.25, 1.0])}, "wte": np.array([[s]])} for s in (1.0, -1.0, 0.0, 2.0)])


def _draw(data, hyper):
    """(params, [grads] * STEPS, hyperparameters) drawn inside a test."""
    params, grads_seq = data.draw(trees(), label="trees")
    return params, grads_seq, data.draw(hyper, label="hyper")


def _run_numpy(name, params, grads_seq, hyper):
    init, step, *_ = OPTIMIZERS[name]
    state = init(params)
    history = []
    for grads in grads_seq:
        params, state = step(params, grads, state, **hyper)
        history.append((params, state))
    return history


def _run_twin(name, params, grads_seq, hyper):
    *_, init, step, _ = OPTIMIZERS[name]
    params = tree_to_torch(params)
    state = init(params)
    history = []
    for grads in grads_seq:
        params, state = step(params, tree_to_torch(grads), state, **hyper)
        history.append((params, state))
    return history


def _numpy_tree(tree):
    return tree_map(to_numpy, tree)


def _stacked(trees):
    """One tree whose leaves stack the leaves of ``trees`` along a new first axis (the step), so
    each tensor is compared once for all steps (Hypothesis's target takes one value per label)."""
    return tree_map(lambda *leaves: np.stack([to_numpy(t) if isinstance(t, torch.Tensor) else t
                                              for t in leaves]), *trees)


def _split(history):
    """(params, moments, step counters) of a history, params and moments stacked over the steps."""
    return (_stacked([p for p, _ in history]),
            _stacked([{k: v for k, v in s.items() if k != "step"} for _, s in history]),
            [s["step"] for _, s in history])


# -- NumPy matches the twin, step after step -----------------------------------------------------

@pytest.mark.twin_parity
@pytest.mark.parametrize("name, hyper", CASES)
@given(data=st.data())
def test_matches_twin(name, hyper, data):
    """Parameters and state after each step; axis 0 of a failing tensor is the step."""
    params, grads_seq, hyper = _draw(data, hyper)
    p, m, steps = _split(_run_numpy(name, params, grads_seq, hyper))
    tp, tm, twin_steps = _split(_run_twin(name, params, grads_seq, hyper))
    assert_tree_close(f"{name}.params", p, tp)
    assert_tree_close(f"{name}.state", m, tm)
    assert steps == twin_steps == list(range(1, STEPS + 1)), f"{name} steps {steps}, {twin_steps}"


# -- the twin matches PyTorch's built-in ---------------------------------------------------------

def _builtin_history(name, params, grads_seq, hyper):
    """torch.optim's parameters after each step, stacked: {path: (steps, ...)}, in params' dtype."""
    leaves = [to_torch(leaf, requires_grad=True) for _, leaf in tree_leaves(params)]
    builtin = OPTIMIZERS[name][-1](leaves, **hyper)
    history = []
    for grads in grads_seq:
        for leaf, (_, g) in zip(leaves, tree_leaves(grads), strict=True):
            leaf.grad = to_torch(g)
        builtin.step()
        history.append([to_numpy(leaf).copy() for leaf in leaves])
    return {path: np.stack([step[i] for step in history]) for i, (path, _) in enumerate(tree_leaves(params))}


def _assert_matches_builtin(label, name, params, stacked, grads_seq, hyper):
    """``stacked`` (parameters stacked over the steps) equals torch.optim.AdamW / SGD run on the
    same leaves, fed the same gradients, step after step."""
    builtin = _builtin_history(name, params, grads_seq, hyper)
    for path, leaf in tree_leaves(stacked):
        assert_close(f"{label} {path} vs torch.optim", leaf, builtin[path])


@pytest.mark.parametrize("name, hyper", [("adamw", bounded_adamw_hyper), ("sgd", sgd_hyper)])
@given(data=st.data())
def test_twin_matches_builtin(name, hyper, data):
    """torch.optim.AdamW / SGD on the same leaves, fed the same gradients, step after step."""
    params, grads_seq, hyper = _draw(data, hyper)
    twin_params, _, _ = _split(_run_twin(name, params, grads_seq, hyper))
    _assert_matches_builtin(name, name, params, twin_params, grads_seq, hyper)


# -- float16 and bfloat16: FlashAttention's error rule -------------------------------------------

# torch.optim.AdamW on float16 parameters adds eps in float16, where 1e-8 is 0 (the smallest
# float16 number is 6e-8): a zero gradient then steps by 0 / 0 = NaN (the test below). The
# budget is measured where torch's own step is finite: eps that float16 holds.
low_precision_adamw_hyper = st.fixed_dictionaries({**ADAMW_FIELDS, "eps": st.sampled_from([1e-6, 1e-3]),
                                                   "betas": st.tuples(st.floats(0, 0.9), st.floats(0.9, 0.999))})


@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@pytest.mark.parametrize("name, hyper", [("adamw", low_precision_adamw_hyper), ("sgd", sgd_hyper)])
@settings(max_examples=20)       # four steps of three optimisers per example: the file stays fast
@given(data=st.data())
def test_low_precision_meets_the_error_budget(dtype, name, hyper, data):
    """The parameters after each step, ours and the twin's, against float64 truth, within twice
    the error of torch.optim itself on low-precision parameters (its single-tensor path computes
    in the parameters' dtype, rounding at every operation)."""
    params64, grads64, hyper = _draw(data, hyper)
    params = tree_map(lambda a: round_to(a, dtype), params64)              # the inputs every side shares
    grads_seq = [tree_map(lambda a: round_to(a, dtype), g) for g in grads64]
    widen = lambda tree: tree_map(lambda a: a.astype(np.float64), tree)    # noqa: E731
    truth = _builtin_history(name, widen(params), [widen(g) for g in grads_seq], hyper)
    theirs = _builtin_history(name, params, grads_seq, hyper)
    for who, history in {"numpy": _run_numpy(name, params, grads_seq, hyper),
                         "twin": _run_twin(name, params, grads_seq, hyper)}.items():
        ours = dict(tree_leaves(_split(history)[0]))
        assert_error_budget(f"optim.{name}[{who}]", dtype,
                            {path: (ours[path], theirs[path], truth[path]) for path in truth})


def test_float16_adamw_keeps_eps_where_torch_loses_it():
    """eps = 1e-8 rounds to 0 in float16; computed in float32, it keeps a zero gradient's step 0."""
    params, grads = {"w": np.ones(3, np.float16)}, {"w": np.zeros(3, np.float16)}
    new, state = optim.adamw_step(params, grads, optim.adamw_init(params), lr=0.1, weight_decay=0.0)
    np.testing.assert_array_equal(new["w"], params["w"], err_msg="adamw float16 w after a zero gradient")
    assert new["w"].dtype == state["v"]["w"].dtype == np.float16, (new["w"].dtype, state["v"]["w"].dtype)
    w = to_torch(params["w"], requires_grad=True)
    w.grad = to_torch(grads["w"])
    torch.optim.AdamW([w], lr=0.1, weight_decay=0.0).step()
    assert torch.isnan(w).all(), "torch.optim.AdamW in float16: 0 / (0 + fp16(1e-8)) is no longer NaN"


# Hyperparameters at the bounds torch.optim accepts (and beyond, where it sets none): both twins
# take them and follow it. The drawn strategies stay inside (dampening < 1, weight_decay < 1).
AT_THE_BOUNDS = [
    ("sgd", {"lr": 0.1, "momentum": 0.9, "dampening": 1.0}),      # buf = mu * buf: the gradient enters once
    ("sgd", {"lr": 0.1, "momentum": 0.5, "dampening": 0.0}),
    ("sgd", {"lr": 0.1, "weight_decay": 1.0}),                    # g + p: decay as strong as the gradient
    ("sgd", {"lr": 0.1, "momentum": 0.9, "dampening": 0.5, "weight_decay": 1.0}),
    ("sgd", {"lr": 0.1, "weight_decay": 5.0}),
    ("sgd", {"lr": 0.1, "momentum": 1.0}),
    ("sgd", {"lr": 0.1, "momentum": 1.5, "nesterov": True}),
    ("sgd", {"lr": 0.0, "momentum": 0.9, "weight_decay": 0.5}),
    ("adamw", {"lr": 0.1, "weight_decay": 1.0}),                  # p * (1 - lr): decay by lr itself
    ("adamw", {"lr": 0.5, "weight_decay": 2.0}),                  # p * 0: the decay wipes p first
    ("adamw", {"lr": 0.1, "weight_decay": 5.0}),
    ("adamw", {"lr": 0.1, "betas": (0.0, 0.0), "eps": 1e-8}),
    ("adamw", {"lr": 0.1, "betas": (0.9, 0.999), "eps": 0.0}),
    ("adamw", {"lr": 0.0, "weight_decay": 0.5}),
]


@pytest.mark.parametrize("name, hyper", AT_THE_BOUNDS)
def test_bounds_torch_accepts_are_accepted_and_match(name, hyper):
    """The NumPy optimiser and its twin equal torch.optim at its bounds, over four steps of
    nonzero gradients (eps = 0 divides by sqrt(v), which nonzero gradients keep above 0)."""
    params, grads_seq = HAND_PICKED
    grads_seq = [tree_map(lambda g: g + 0.125, grads) for grads in grads_seq]   # no zero gradient
    p, _, _ = _split(_run_numpy(name, params, grads_seq, hyper))
    tp, _, _ = _split(_run_twin(name, params, grads_seq, hyper))
    _assert_matches_builtin(f"{name} {hyper}", name, params, p, grads_seq, hyper)
    _assert_matches_builtin(f"twin {name} {hyper}", name, params, tp, grads_seq, hyper)


# Just past the bounds torch.optim sets: it refuses each (ValueError), and so do we, naming the field.
PAST_THE_BOUNDS = [
    ("sgd", {"lr": -1e-300}, r"lr must be >= 0, got -1e-300"),
    ("sgd", {"momentum": -1e-300}, r"momentum must be >= 0, got -1e-300"),
    ("sgd", {"weight_decay": -1e-300}, r"weight_decay must be >= 0, got -1e-300"),
    ("sgd", {"momentum": 0.9, "dampening": 1e-300, "nesterov": True}, "nesterov needs momentum > 0 and dampening 0"),
    ("sgd", {"momentum": 0.0, "nesterov": True}, "nesterov needs momentum > 0 and dampening 0"),
    ("adamw", {"lr": -1e-300}, r"lr must be >= 0, got -1e-300"),
    ("adamw", {"eps": -1e-300}, r"eps must be >= 0, got -1e-300"),
    ("adamw", {"weight_decay": -1e-300}, r"weight_decay must be >= 0, got -1e-300"),
    ("adamw", {"betas": (1.0, 0.999)}, r"betas\[0\] must lie in \[0, 1\), got 1.0"),
    ("adamw", {"betas": (0.9, 1.0)}, r"betas\[1\] must lie in \[0, 1\), got 1.0"),
    ("adamw", {"betas": (-1e-300, 0.999)}, r"betas\[0\] must lie in \[0, 1\), got -1e-300"),
    ("adamw", {"betas": (0.9, -1e-300)}, r"betas\[1\] must lie in \[0, 1\), got -1e-300"),
    ("adamw", {"eps": float("nan")}, "eps must be >= 0, got nan"),
    ("adamw", {"weight_decay": float("nan")}, "weight_decay must be >= 0, got nan"),
]


@pytest.mark.parametrize("name, hyper, message", PAST_THE_BOUNDS)
def test_bounds_torch_refuses_are_refused(name, hyper, message):
    init, step, *_ = OPTIMIZERS[name]
    params = {"w": np.zeros(2)}
    with pytest.raises(ValueError, match="Invalid|Nesterov"):
        OPTIMIZERS[name][-1]([to_torch(params["w"], requires_grad=True)], **{"lr": 1e-3, **hyper})
    with pytest.raises(ValueError, match=f"^{message}"):
        step(params, params, init(params), **hyper)


@pytest.mark.parametrize("hyper, message", [
    ({"lr": float("nan")}, "lr must be >= 0, got nan"),
    ({"momentum": float("nan")}, "momentum must be >= 0, got nan"),
    ({"weight_decay": float("nan")}, "weight_decay must be >= 0, got nan"),
    ({"momentum": 0.9, "dampening": float("nan")}, r"dampening must lie in \[0, 1\], got nan"),
    ({"momentum": 0.9, "dampening": 1 + 1e-9}, r"dampening must lie in \[0, 1\], got 1.000000001"),
    ({"momentum": 0.9, "dampening": -1e-300}, r"dampening must lie in \[0, 1\], got -1e-300"),
])
def test_sgd_refuses_what_torch_takes_without_a_check(hyper, message):
    """Where torch.optim.SGD sets no bound we refuse, as optim.py's docstring says: a NaN turns
    every parameter into NaN, and a dampening outside [0, 1] scales the gradient by 1 - dampening
    outside [0, 1] (a negative factor climbs the loss)."""
    params = {"w": np.zeros(2)}
    torch.optim.SGD([to_torch(params["w"], requires_grad=True)], **{"lr": 1e-3, **hyper})   # accepted there
    with pytest.raises(ValueError, match=f"^{message}$"):
        optim.sgd_step(params, params, optim.sgd_init(params), **hyper)


# -- properties ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["adamw", "sgd"])
@given(case=trees(steps=2))
def test_zero_grads_and_no_decay_change_nothing(name, case):
    params, _ = case
    zeros = optim._tree_map(np.zeros_like, params)
    hyper = {"lr": 0.1, "weight_decay": 0.0}
    if name == "sgd":
        hyper["momentum"] = 0.9
    p, _ = _run_numpy(name, params, [zeros, zeros], hyper)[-1]
    for path, leaf in tree_leaves(params):
        np.testing.assert_array_equal(dict(tree_leaves(p))[path], leaf, err_msg=f"{name} {path}")


@pytest.mark.parametrize("name", ["adamw", "sgd"])
@given(case=trees(steps=1), lr=st.floats(0.001, 0.1), wd=st.floats(0.001, 0.1))
def test_weight_decay_alone_shrinks_by_lr_wd(name, case, lr, wd):
    """With zero gradients both decay p to p * (1 - lr * wd): AdamW directly, SGD through wd * p."""
    params, _ = case
    zeros = optim._tree_map(np.zeros_like, params)
    p, _ = _run_numpy(name, params, [zeros], {"lr": lr, "weight_decay": wd})[-1]
    expected = optim._tree_map(lambda x: x * (1 - lr * wd), params)
    assert_tree_close(f"{name} decayed", p, expected)


@given(case=trees(steps=1), lr=st.floats(0.001, 0.1))
def test_first_adamw_step_is_lr_times_sign(case, lr):
    """At step 1 the bias-corrected moments are g and g^2, so the step is lr * g / (|g| + eps):
    lr * sign(g) once |g| >> eps. Gradients below 1e-3 are zeroed: in float32 a tiny g squares
    to 0 and eps takes over."""
    params, (grads,) = case
    grads = optim._tree_map(lambda g: np.where(np.abs(g) < 1e-3, np.zeros_like(g), g), grads)
    p, _ = _run_numpy("adamw", params, [grads], {"lr": lr, "eps": 1e-30, "weight_decay": 0.0})[-1]
    for (path, new), (_, old), (_, g) in zip(tree_leaves(p), tree_leaves(params),
                                             tree_leaves(grads), strict=True):
        # old - new carries the rounding of new, one ulp of |p| <= 4: allow a few such ulps
        atol = 8 * 4 * float(np.finfo(g.dtype).eps)
        assert_close(f"adamw first step {path}", old - new, (lr * np.sign(g)).astype(g.dtype),
                     atol=atol)


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_inputs_are_not_modified(name):
    params, grads_seq = HAND_PICKED
    before = [(path, leaf.copy()) for path, leaf in tree_leaves(params) + tree_leaves(grads_seq[0])]
    init, step, *_ = OPTIMIZERS[name]
    state = init(params)
    new_params, new_state = step(params, grads_seq[0], state, lr=0.1, weight_decay=0.1)
    after = tree_leaves(params) + tree_leaves(grads_seq[0])
    for (path, old), (_, leaf) in zip(before, after, strict=True):
        np.testing.assert_array_equal(leaf, old, err_msg=f"{name} modified its input {path}")
    assert state["step"] == 0, f"{name} modified its input state"
    for (path, new), (_, old) in zip(tree_leaves(new_params), tree_leaves(params), strict=True):
        assert not np.shares_memory(new, old), f"{name} returned the input array {path}"


def _state_leaves(state):
    """(path, array) for every array of an optimiser state (the step counter is an int)."""
    return [(f"state.{path}", a) for path, a in tree_leaves({k: v for k, v in state.items() if k != "step"})]


@pytest.mark.parametrize("name, hyper", [("adamw", {}), ("sgd", {}), ("sgd", {"momentum": 0.9}),
                                         ("sgd", {"momentum": 0.9, "nesterov": True})])
def test_results_share_no_memory_with_inputs_or_state(name, hyper):
    """Over two steps, every new parameter and state array is fresh: never a parameter, a gradient
    or an array of the old state. SGD without momentum carries a buffer it never reads (returning
    the old one would alias it); with momentum the first buffer holds the gradient's values, not
    the gradient array. A caller that updates one in place must not change the others."""
    params, grads_seq = HAND_PICKED
    init, step, *_ = OPTIMIZERS[name]
    state = init(params)
    for i, grads in enumerate(grads_seq[:2]):
        new_params, new_state = step(params, grads, state, lr=0.1, **hyper)
        inputs = ([(f"params.{p}", a) for p, a in tree_leaves(params)]
                  + [(f"grads.{p}", a) for p, a in tree_leaves(grads)] + _state_leaves(state))
        outputs = [(f"new params.{p}", a) for p, a in tree_leaves(new_params)] + _state_leaves(new_state)
        for out_path, out in outputs:
            for in_path, a in inputs:
                assert not np.shares_memory(out, a), \
                    f"{name} {hyper} step {i + 1}: {out_path} shares memory with {in_path}"
        params, state = new_params, new_state


# -- dtype preservation --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_dtype_is_preserved(name, dtype):
    params = {"a": {"w": np.ones((2, 3), dtype)}, "b": np.ones(3, dtype)}
    grads = {"a": {"w": np.full((2, 3), 0.5, dtype)}, "b": np.full(3, -0.5, dtype)}
    hyper = {"lr": 0.1, "weight_decay": 0.1} | ({"momentum": 0.9} if name == "sgd" else {})
    for p, s in _run_numpy(name, params, [grads, grads], hyper):
        for path, leaf in tree_leaves(p) + tree_leaves({k: v for k, v in s.items() if k != "step"}):
            assert leaf.dtype == dtype, f"{name} {path} dtype {leaf.dtype}"


# -- bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_bad_input(name):
    init, step, *_ = OPTIMIZERS[name]
    params = {"lin": {"w": np.zeros((2, 3)), "b": np.zeros(3)}}
    state = init(params)
    with pytest.raises(ValueError, match=r"trees differ at 'lin': keys \['b', 'w'\] != \['w'\]"):
        step(params, {"lin": {"w": np.zeros((2, 3))}}, state)
    with pytest.raises(ValueError, match=r"'lin.w' has shape \(2, 3\) float64 in the parameters but "
                                         r"\(3, 2\) float64 in argument 1"):
        step(params, {"lin": {"w": np.zeros((3, 2)), "b": np.zeros(3)}}, state)
    with pytest.raises(ValueError, match=r"'lin.b' has shape \(3,\) float64 in the parameters but "
                                         r"\(3,\) float32 in argument 1"):
        step(params, {"lin": {"w": np.zeros((2, 3)), "b": np.zeros(3, np.float32)}}, state)
    with pytest.raises(TypeError, match="lin.w must be a NumPy array, got list"):
        step(params, {"lin": {"w": [[0.0] * 3] * 2, "b": np.zeros(3)}}, state)
    with pytest.raises(ValueError, match=r"lr must be >= 0, got -0.1"):
        step(params, params, state, lr=-0.1)
    with pytest.raises(ValueError, match=r"weight_decay must be >= 0, got nan"):
        step(params, params, state, weight_decay=float("nan"))


def test_bad_hyperparameters():
    params = {"w": np.zeros(2)}
    for betas, i, value in (((1.0, 0.999), 0, "1.0"), ((0.9, -0.1), 1, "-0.1")):
        with pytest.raises(ValueError, match=rf"betas\[{i}\] must lie in \[0, 1\), got {value}"):
            optim.adamw_step(params, params, optim.adamw_init(params), betas=betas)
    with pytest.raises(ValueError, match="eps must be >= 0, got -1e-08"):
        optim.adamw_step(params, params, optim.adamw_init(params), eps=-1e-8)
    with pytest.raises(ValueError, match="^nesterov needs momentum > 0 and dampening 0, "
                                         "got momentum=0.0, dampening=0.0$"):
        optim.sgd_step(params, params, optim.sgd_init(params), nesterov=True)
    with pytest.raises(ValueError, match="dampening must lie in \\[0, 1\\], got 2"):
        optim.sgd_step(params, params, optim.sgd_init(params), momentum=0.9, dampening=2)


@pytest.mark.parametrize("name", ["adamw", "sgd"])
@pytest.mark.parametrize("scalar", [np.float64, np.float32])
def test_numpy_scalar_hyperparameters_keep_float32(name, scalar):
    """A NumPy float64 scalar is strongly typed (NEP 50): lr=np.float64(1e-3) once turned every
    float32 parameter and moment into float64. Every hyper-parameter given as a NumPy scalar."""
    init, step, *_ = OPTIMIZERS[name]
    params = {"lin": {"w": np.full((2, 3), 0.5, np.float32)}}
    grads = {"lin": {"w": np.full((2, 3), -0.25, np.float32)}}
    if name == "adamw":
        hyper = {"lr": scalar(1e-3), "betas": (scalar(0.9), scalar(0.999)), "eps": scalar(1e-8),
                 "weight_decay": scalar(0.01)}
    else:
        hyper = {"lr": scalar(1e-3), "momentum": scalar(0.9), "dampening": scalar(0.1),
                 "weight_decay": scalar(0.01)}
    state = init(params)
    for _ in range(2):
        params, state = step(params, grads, state, **hyper)
        for path, leaf in tree_leaves(params) + tree_leaves({k: v for k, v in state.items() if k != "step"}):
            assert leaf.dtype == np.float32, f"{name} {path} dtype {leaf.dtype} with {scalar.__name__} hyper-parameters"
    # The same step with Python floats gives the same numbers: only the types changed.
    python = {k: tuple(map(float, v)) if isinstance(v, tuple) else float(v) for k, v in hyper.items()}
    p = {"lin": {"w": np.full((2, 3), 0.5, np.float32)}}
    s = init(p)
    for _ in range(2):
        p, s = step(p, grads, s, **python)
    assert_close(f"{name} lin.w with {scalar.__name__} vs Python float hyper-parameters",
                 params["lin"]["w"], p["lin"]["w"], rtol=0, atol=0)


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_hyperparameter_types(name):
    init, step, *_ = OPTIMIZERS[name]
    params = {"w": np.zeros(2)}
    state = init(params)
    with pytest.raises(TypeError, match="lr must be a real number, got str '0.1'"):
        step(params, params, state, lr="0.1")
    with pytest.raises(TypeError, match="weight_decay must be a real number, got bool True"):
        step(params, params, state, weight_decay=True)
    if name == "adamw":
        with pytest.raises(TypeError, match="betas must be a pair of numbers, got float 0.9"):
            step(params, params, state, betas=0.9)
        with pytest.raises(ValueError, match=r"betas must be a pair of numbers, got 1: \(0.9,\)"):
            step(params, params, state, betas=(0.9,))
        with pytest.raises(ValueError, match=r"^betas must be a pair of numbers, got 3: \(0.9, 0.999, 0.5\)$"):
            step(params, params, state, betas=(0.9, 0.999, 0.5))     # a third beta is refused, not ignored
    else:
        with pytest.raises(TypeError, match="nesterov must be a bool, got str 'yes'"):
            step(params, params, state, momentum=0.9, nesterov="yes")


@pytest.mark.parametrize("name, hyper", [
    ("adamw", {}), ("adamw", {"lr": 0.0, "weight_decay": 0.0}),
    ("sgd", {}), ("sgd", {"momentum": 0.9}), ("sgd", {"momentum": 0.9, "nesterov": True}),
    ("sgd", {"lr": 0.0, "momentum": 0.5, "dampening": 0.5, "weight_decay": 0.1}),
])
def test_returned_arrays_are_fresh(name, hyper):
    """Over two steps (the first momentum step copies the gradient), no returned parameter or
    state array shares memory with the parameters, gradients or state passed in, or with
    another returned array: a caller updating one in place cannot corrupt another."""
    init, step, *_ = OPTIMIZERS[name]
    rng = np.random.default_rng(0)
    params = {"lin": {"w": rng.standard_normal((2, 3)), "b": rng.standard_normal(3)}}
    state = init(params)
    for _ in range(2):
        grads = tree_map(lambda p: rng.standard_normal(p.shape), params)
        given_in = [(f"params.{p}", a) for p, a in tree_leaves(params)] + \
                   [(f"grads.{p}", a) for p, a in tree_leaves(grads)] + \
                   [(f"state.{p}", a) for p, a in tree_leaves({k: v for k, v in state.items() if k != "step"})]
        new_params, new_state = step(params, grads, state, **hyper)
        returned = [(f"new params.{p}", a) for p, a in tree_leaves(new_params)] + \
                   [(f"new state.{p}", a) for p, a in tree_leaves({k: v for k, v in new_state.items() if k != "step"})]
        for i, (out_name, out) in enumerate(returned):
            for in_name, a in given_in + returned[:i]:
                assert not np.shares_memory(out, a), f"{name}: {out_name} shares memory with {in_name}"
        params, state = new_params, new_state


# -- dynamic loss scaling (float16 mixed precision) ----------------------------------------------

SCALERS = {"numpy": optim, "twin": torch_optim}


@pytest.mark.parametrize("who", SCALERS)
def test_an_overflow_skips_the_step_and_halves_the_scale(who):
    ops = SCALERS[who]
    state = ops.loss_scale_init(init_scale=1024.0, growth_interval=3)
    state, skip = ops.loss_scale_update(state, found_inf=False)
    assert not skip and state["scale"] == 1024.0 and state["clean_steps"] == 1, state
    state, skip = ops.loss_scale_update(state, found_inf=True)
    assert skip, "a step whose gradients overflowed must be skipped"
    assert state["scale"] == 512.0 and state["clean_steps"] == 0, state
    state, skip = ops.loss_scale_update(state, found_inf=True)
    assert skip and state["scale"] == 256.0, state


@pytest.mark.parametrize("who", SCALERS)
def test_the_scale_doubles_after_growth_interval_clean_steps(who):
    ops = SCALERS[who]
    state = ops.loss_scale_init(init_scale=8.0, growth_interval=3)
    scales = []
    for found_inf in (False, False, False, False, True, False, False, False):
        state, skip = ops.loss_scale_update(state, found_inf)
        assert skip == found_inf, (found_inf, skip)
        scales.append(state["scale"])
    # grown after steps 1-3; the overflow at step 5 halves it and restarts the count: 6-8 grow it again
    assert scales == [8.0, 8.0, 16.0, 16.0, 8.0, 8.0, 8.0, 16.0], scales


@given(overflows=st.lists(st.booleans(), min_size=1, max_size=12), interval=st.integers(1, 4),
       init=st.sampled_from([1.0, 2.0**15, 2.0**127]))
def test_loss_scaling_matches_torch_grad_scaler(overflows, interval, init):
    """Step by step, the scale and the skipped steps of torch.amp.GradScaler("cpu") on a parameter
    whose gradient is made infinite where ``overflows`` says; 2^127 tests the float32 ceiling."""
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=init, growth_interval=interval)
    state = optim.loss_scale_init(init_scale=init, growth_interval=interval)
    twin_state = torch_optim.loss_scale_init(init_scale=init, growth_interval=interval)
    for step, overflow in enumerate(overflows):
        before = p.detach().clone()
        loss = (p * (float("inf") if overflow else 1.0)).sum()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        torch_skipped = bool(torch.equal(p.detach(), before))
        state, skip = optim.loss_scale_update(state, overflow)
        twin_state, twin_skip = torch_optim.loss_scale_update(twin_state, overflow)
        assert skip == twin_skip == torch_skipped == overflow, (step, skip, twin_skip, torch_skipped)
        assert state["scale"] == twin_state["scale"] == scaler.get_scale(), (
            step, state["scale"], twin_state["scale"], scaler.get_scale())


@pytest.mark.parametrize("who", SCALERS)
def test_unscaled_gradients_are_float32_and_overflow_is_found(who):
    ops = SCALERS[who]
    g = np.array([[3.0, -0.5], [65504.0, 2.0**-10]], np.float16)
    grads = {"a": {"w": g}, "b": np.array([1.0], np.float16)}
    convert = (lambda t: t) if who == "numpy" else tree_to_torch
    unscaled, found_inf = ops.unscale_grads(convert(grads), 1024.0)
    w = unscaled["a"]["w"] if who == "numpy" else to_numpy(unscaled["a"]["w"])
    assert w.dtype == np.float32 and not found_inf, (w.dtype, found_inf)
    np.testing.assert_array_equal(w, g.astype(np.float32) / 1024, err_msg="unscaled w: g / 2^10 is exact")
    for bad in (np.inf, -np.inf, np.nan):
        grads["b"] = np.array([bad], np.float16)
        assert ops.unscale_grads(convert(grads), 1024.0)[1], f"{bad} in the gradients not found"


@pytest.mark.parametrize("field, value, message", [
    ("init_scale", 0.0, "init_scale must be a finite number above 0, got 0.0"),
    ("init_scale", float("inf"), "init_scale must be a finite number above 0, got inf"),
    ("growth_factor", 1.0, "growth_factor must be a finite number above 1, got 1.0"),
    ("backoff_factor", 1.0, r"backoff_factor must lie in \(0, 1\), got 1.0"),
    ("backoff_factor", 0.0, r"backoff_factor must lie in \(0, 1\), got 0.0"),    # one overflow: scale 0, 1/0
    ("growth_interval", 0, "growth_interval must be an integer >= 1, got 0"),
    ("growth_interval", 2.5, "growth_interval must be an integer >= 1, got 2.5"),
])
def test_bad_loss_scaling_is_refused(field, value, message):
    with pytest.raises(ValueError, match=message):
        optim.loss_scale_init(**{field: value})


@pytest.mark.parametrize("dampening", [-1e-300, 1.0 + 2**-52, float("nan")])
def test_dampening_outside_0_1_is_refused(dampening):
    """dampening scales the new gradient by 1 - dampening: above 1 it would enter with the wrong
    sign, below 0 amplified (PyTorch takes both without a word); 1 itself is allowed."""
    init, step, *_ = OPTIMIZERS["sgd"]
    params = {"w": np.zeros(2)}
    with pytest.raises(ValueError, match=rf"^dampening must lie in \[0, 1\], got {re.escape(repr(dampening))}$"):
        step(params, params, init(params), lr=0.1, momentum=0.9, dampening=dampening)
