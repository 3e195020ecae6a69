"""Parity tests for numpy_attn/chunked_delta_rule.py and torch_attn/chunked_delta_rule.py: the gated
delta rule a chunk at a time, with a scalar decay per head (Gated DeltaNet) or one per key channel
(Kimi Delta Attention), against the twin and autograd, finite differences, the recurrence itself
(chunk size 1: each chunk one step), left padding, and transformers' chunked fallbacks."""

from functools import partial

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from transformers.models.kimi_linear.modeling_kimi_linear import chunk_kimi_delta_attention
from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

from numpy_attn.chunked_delta_rule import chunked_delta_rule_backward, chunked_delta_rule_forward
from numpy_attn.gated_delta_rule import (
    gated_delta_rule_backward,
    gated_delta_rule_forward,
    gated_delta_rule_parallel_forward,
)
from parity_tests import strategies as S
from parity_tests.delta_kit import autograd_both, budget_tensors, transformers_delta_rule
from parity_tests.helpers import (
    BFLOAT16,
    LOW_DTYPES,
    assert_close,
    assert_error_budget,
    directional_derivative,
    directional_tol,
    round_to,
    to_numpy,
    to_torch,
    tree_dot,
)
from torch_attn.chunked_delta_rule import chunked_delta_rule

NAMES = ("q", "k", "v", "g", "beta", "initial_state")


def l2_normalised(x):
    """Rows of length at most 1, as the models feed q and k (transformers' l2norm, eps 1e-6)."""
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + x.dtype.type(1e-6))


@st.composite
def delta_cases(draw, dtype=None, T=None, chunk_size=None):
    """A dict of the op's arguments plus do and dstate: q, k (B, nh, T, dk) L2-normalised, v
    (B, nh, T, dv) with dv drawn apart from dk, g (B, nh, T) or (B, nh, T, dk) in [-3, 0], beta
    (B, nh, T) in [0, 1], maybe an initial state, maybe a (B, T) mask, a chunk size from 1 to
    past T."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    B, nh, dk, dv = draw(S.dim(1, 2)), draw(S.dim(1, 2)), draw(S.dim(1, 4)), draw(S.dim(1, 4))
    T = draw(S.dim(1, 9)) if T is None else T
    per_channel = draw(st.booleans())
    case = dict(q=l2_normalised(draw(S.arrays(dtype, (B, nh, T, dk)))),
                k=l2_normalised(draw(S.arrays(dtype, (B, nh, T, dk)))),
                v=draw(S.arrays(dtype, (B, nh, T, dv), 2.0)),
                g=-np.abs(draw(S.arrays(dtype, (B, nh, T, dk) if per_channel else (B, nh, T), 3.0))),
                beta=np.abs(draw(S.arrays(dtype, (B, nh, T), 1.0))),
                initial_state=draw(st.none() | S.arrays(dtype, (B, nh, dk, dv), 2.0)),
                mask=draw(st.none() | hnp.arrays(np.bool_, (B, T))),
                chunk_size=draw(st.integers(1, T + 3)) if chunk_size is None else chunk_size)
    case["do"] = draw(S.arrays(dtype, (B, nh, T, dv), 1.0))
    case["dstate"] = draw(st.none() | S.arrays(dtype, (B, nh, dk, dv), 1.0))
    return case


def inputs(case):
    """The op's arguments of a case, do and dstate left out."""
    return {name: value for name, value in case.items() if name not in ("do", "dstate")}


def numpy_run(case, **change):
    """(o, state, grads by input name) of the NumPy op on ``case`` with ``change``d arguments."""
    args = {**inputs(case), **change}
    o, state, cache = chunked_delta_rule_forward(**args)
    return o, state, chunked_delta_rule_backward(case["do"], case["dstate"], cache)


def rounding_tol(case, chunk_size=None):
    """How far two correct float programs of the chunked delta rule may differ on ``case``.

    With |k_t| <= 1 and beta_t in [0, 1] each step's map of the state, (I - beta k k^T) D, has
    norm <= 1, so every state, u_t and output stays within M = |S_0| + sum_t beta_t |v_t| (times
    scale |q| <= scale for o). The backward's adjoint is the transposed contraction plus one
    scale q do^T per step, so it stays within M' = |dstate| + T scale max|do_t|, and every gradient
    is a sum of products of the two: within M (1 + M'). Each value is a chain of at most
    n = T (C + dk + dv) roundings (per step a dot over dk or dv, per chunk a sum over its C steps),
    and a sum of terms bounded by X computed in any order moves by at most n u X, u the unit
    roundoff: each side is off by that much from the exact value, so the two differ by at most
    2 n u M (1 + M').
    """
    q, v, beta = case["q"], case["v"], case["beta"]
    B, nh, T, dk = q.shape
    C = max(case["chunk_size"], chunk_size or 1)
    u = float(np.finfo(q.dtype).eps) / 2
    s0 = 0.0 if case["initial_state"] is None else float(np.sqrt((case["initial_state"].astype(float) ** 2)
                                                                  .sum((-1, -2))).max())
    M = s0 + float((beta * np.sqrt((v.astype(float) ** 2).sum(-1))).sum(-1).max())
    ds = 0.0 if case["dstate"] is None else float(np.sqrt((case["dstate"].astype(float) ** 2).sum((-1, -2))).max())
    M_adjoint = ds + T * dk ** -0.5 * float(np.sqrt((case["do"].astype(float) ** 2).sum(-1)).max())
    n = T * (C + dk + v.shape[-1])
    return dict(rtol=0.0, atol=2 * n * u * max(M, 1.0) * (1 + M_adjoint))


# -- forward and backward match the twin and autograd ---------------------------------------------

@pytest.mark.twin_parity
@given(case=delta_cases())
@example(case=dict(q=S.ramp(1, 1, 1, 2), k=l2_normalised(S.ramp(1, 1, 1, 2)), v=S.ramp(1, 1, 1, 3),
                   g=-np.ones((1, 1, 1)), beta=np.full((1, 1, 1), 0.5), initial_state=S.ramp(1, 1, 2, 3),
                   mask=None, chunk_size=4, do=S.ramp(1, 1, 1, 3), dstate=None)).via("T = 1, dk != dv")
def test_chunked_delta_rule_matches_twin_and_autograd(case):
    """The forward's o and final state against the twin's, and every gradient of the hand-written
    backward against autograd through (o * do).sum() + (state * dstate).sum()."""
    o, state, grads = numpy_run(case)
    tensors = {name: to_torch(value, requires_grad=True) for name, value in inputs(case).items()
               if isinstance(value, np.ndarray) and name != "mask"}
    mask = None if case["mask"] is None else to_torch(case["mask"])
    twin_o, twin_state = chunked_delta_rule(**tensors, mask=mask, chunk_size=case["chunk_size"])
    loss = (twin_o * to_torch(case["do"])).sum()
    if case["dstate"] is not None:
        loss = loss + (twin_state * to_torch(case["dstate"])).sum()
    loss.backward()
    tol = rounding_tol(case)
    assert_close("chunked_delta_rule.o", o, to_numpy(twin_o), **tol)
    assert_close("chunked_delta_rule.state", state, to_numpy(twin_state), **tol)
    for name in NAMES:
        if name in tensors:
            assert_close(f"chunked_delta_rule.d{name}", grads[name], to_numpy(tensors[name].grad), **tol)
    assert (grads["initial_state"] is None) == (case["initial_state"] is None), "dinitial_state iff given"


# -- the twin matches transformers' chunked fallbacks ----------------------------------------------

def transformers_run(case):
    """(o, state) of transformers' torch_chunk_gated_delta_rule (scalar g) or chunk_kimi_delta_attention
    (per-channel g) on the case's float32 inputs, in their layout (B, T, nh, d); q and k as given."""
    fn = chunk_kimi_delta_attention if case["g"].ndim == 4 else torch_chunk_gated_delta_rule
    q, k, v, g, beta = (to_torch(case[name]).transpose(1, 2) for name in ("q", "k", "v", "g", "beta"))
    initial_state = None if case["initial_state"] is None else to_torch(case["initial_state"])
    o, state = fn(q, k, v, g, beta, chunk_size=case["chunk_size"], initial_state=initial_state,
                  output_final_state=True, use_qk_l2norm_in_kernel=False)
    return to_numpy(o.transpose(1, 2)), to_numpy(state)


@given(case=delta_cases(dtype=np.float32).map(lambda case: {**case, "mask": None}),
       T=st.integers(1, 70), transformers_chunk=st.sampled_from([None, 64]))
def test_twin_and_numpy_match_transformers_in_float32(case, T, transformers_chunk):
    """Outputs and final state of ours in float32 (NumPy and the twin) against transformers' float32
    fallbacks, on their chunk sizes (the drawn one, or their default 64 with lengths past it)."""
    if transformers_chunk is not None:   # their default chunk, over a length of up to 70 steps
        rng = np.random.default_rng(T)
        B, nh, _, dk = case["q"].shape
        dv, per_channel = case["v"].shape[-1], case["g"].ndim == 4
        f32 = np.float32
        case = {**case, "chunk_size": transformers_chunk, "do": np.zeros((B, nh, T, dv), f32),
                "q": l2_normalised(rng.uniform(-1, 1, (B, nh, T, dk)).astype(f32)),
                "k": l2_normalised(rng.uniform(-1, 1, (B, nh, T, dk)).astype(f32)),
                "v": rng.uniform(-2, 2, (B, nh, T, dv)).astype(f32),
                "g": -rng.uniform(0, 3, (B, nh, T, dk) if per_channel else (B, nh, T)).astype(f32),
                "beta": rng.uniform(0, 1, (B, nh, T)).astype(f32)}
    theirs_o, theirs_state = transformers_run(case)
    o, state, _ = chunked_delta_rule_forward(**inputs(case))
    tensors = {name: to_torch(case[name]) for name in NAMES if case[name] is not None}
    twin_o, twin_state = chunked_delta_rule(**tensors, chunk_size=case["chunk_size"])
    # Each float32 program is within n u M of the exact values (rounding_tol, forward only: do and
    # dstate play no part), so any two within twice that: rounding_tol's 2 n u M with M' = 0.
    tol = rounding_tol({**case, "do": np.zeros_like(case["do"]), "dstate": None})
    for who, (ours_o, ours_state) in {"numpy": (o, state), "twin": (to_numpy(twin_o), to_numpy(twin_state))}.items():
        assert_close(f"chunked_delta_rule.o ({who}) vs transformers", ours_o, theirs_o, **tol)
        assert_close(f"chunked_delta_rule.state ({who}) vs transformers", ours_state, theirs_state, **tol)


# -- properties -----------------------------------------------------------------------------------

@given(case=delta_cases(dtype=np.float64), data=st.data())
def test_every_chunk_size_is_the_recurrence(case, data):
    """Chunk size 1 is the recurrence itself (each chunk one step, the UT transform a 1 x 1 identity):
    any chunk size gives its outputs, final state and every gradient, to float64 rounding. A chunk
    size that does not divide T (or exceeds it) pads the tail with identity steps, which chunk size
    1 never has: the equal final states show that the padding never reaches the state."""
    one = numpy_run(case, chunk_size=1)
    other = numpy_run(case, chunk_size=data.draw(st.integers(1, case["q"].shape[2] + 3), label="chunk_size"))
    tol = rounding_tol(case, chunk_size=max(case["chunk_size"], case["q"].shape[2] + 3))
    assert_close("chunked_delta_rule.o, chunk size vs 1", other[0], one[0], **tol)
    assert_close("chunked_delta_rule.state, chunk size vs 1", other[1], one[1], **tol)
    for name in NAMES:
        if case.get(name) is not None and name != "mask":
            assert_close(f"chunked_delta_rule.d{name}, chunk size vs 1", other[2][name], one[2][name], **tol)


@given(case=delta_cases(dtype=np.float64))
def test_the_chunks_equal_the_recurrence_and_the_parallel_form(case):
    """The anchor of the test above, by two other programs: numpy_attn/gated_delta_rule.py's loop
    over time (S <- exp(g) S, u = beta (v - S^T k), S <- S + k u^T, o = scale S^T q, and its own
    backward through time) gives the same outputs, final state and every gradient, padding mask
    included; its parallel form (one triangular solve over the whole sequence, no mask) the same
    outputs and state. The parallel form's solve may grow roundings by up to 2^T (its entries of
    (I + L)^-1 reach 2^(T - 1)), hence that factor on its bound."""
    o, state, grads = numpy_run(case)
    args = {name: case[name] for name in (*NAMES, "mask")}
    want_o, want_state, cache = gated_delta_rule_forward(**args)
    want_grads = gated_delta_rule_backward(case["do"], case["dstate"], cache)
    tol = rounding_tol(case)
    assert_close("chunked_delta_rule.o vs the recurrence", o, want_o, **tol)
    assert_close("chunked_delta_rule.state vs the recurrence", state, want_state, **tol)
    for name in NAMES:
        if case[name] is not None:
            assert_close(f"chunked_delta_rule.d{name} vs the recurrence", grads[name], want_grads[name], **tol)
    if case["mask"] is None:
        par_o, par_state = gated_delta_rule_parallel_forward(**{name: case[name] for name in NAMES})
        par_tol = dict(rtol=0.0, atol=tol["atol"] * 2.0 ** case["q"].shape[2])
        assert_close("chunked_delta_rule.o vs the parallel form", o, par_o, **par_tol)
        assert_close("chunked_delta_rule.state vs the parallel form", state, par_state, **par_tol)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_computes_in_float32_and_rounds_once(dtype):
    """float16 and bfloat16 come back in their dtype: the float32 computation on the same values,
    each output and gradient rounded once."""
    low = np.dtype(np.float16) if dtype == "float16" else BFLOAT16
    rng = np.random.default_rng(0)
    B, nh, T, dk, dv = 2, 1, 5, 4, 3
    case = dict(q=l2_normalised(rng.uniform(-1, 1, (B, nh, T, dk))),
                k=l2_normalised(rng.uniform(-1, 1, (B, nh, T, dk))),
                v=rng.uniform(-2, 2, (B, nh, T, dv)), g=-rng.uniform(0, 3, (B, nh, T, dk)),
                beta=rng.uniform(0, 1, (B, nh, T)), initial_state=rng.uniform(-1, 1, (B, nh, dk, dv)),
                chunk_size=2, do=rng.uniform(-1, 1, (B, nh, T, dv)), dstate=rng.uniform(-1, 1, (B, nh, dk, dv)))
    rounded = {name: x.astype(low) if isinstance(x, np.ndarray) and x.dtype.kind == "f" else x
               for name, x in case.items()}
    single = {name: x.astype(np.float32) if isinstance(x, np.ndarray) and x.dtype.kind == "f" else x
              for name, x in rounded.items()}
    o, state, grads = numpy_run(rounded)
    o32, state32, grads32 = numpy_run(single)
    np.testing.assert_array_equal(o, o32.astype(low), err_msg="o")
    np.testing.assert_array_equal(state, state32.astype(low), err_msg="state")
    for name in NAMES:
        assert grads[name].dtype == low, f"d{name}: {grads[name].dtype}"
        np.testing.assert_array_equal(grads[name], grads32[name].astype(low), err_msg=f"d{name}")



@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@given(case=delta_cases(dtype=np.float64).map(lambda case: {**case, "mask": None}))
def test_low_precision_meets_the_error_budget(dtype, case):
    """Ours and the twin in float16 and bfloat16 against the twin in float64 on the same rounded
    inputs, do and dstate (zeros where none was drawn) (the truth), within twice the error of
    PyTorch's chunked runs in the low dtype: transformers' fallback for the kind of g at the same
    chunk size, and for ours the twin too (each casts up to float32 and rounds once), for o, the
    final state and every input's gradient."""
    B, nh, _, dk = case["q"].shape
    if case["dstate"] is None:
        case = {**case, "dstate": np.zeros((B, nh, dk, case["v"].shape[-1]))}
    C = case["chunk_size"]
    rounded = {name: x if name == "chunk_size" or x is None else round_to(x, dtype) for name, x in case.items()}
    arrays = {name: rounded[name] for name in NAMES}
    ours = numpy_run(rounded)
    twin = autograd_both(partial(chunked_delta_rule, chunk_size=C), arrays, rounded["do"], rounded["dstate"])
    theirs = autograd_both(transformers_delta_rule(C), arrays, rounded["do"], rounded["dstate"])
    wide = {name: None if x is None else x.astype(np.float64) for name, x in arrays.items()}
    truth = autograd_both(partial(chunked_delta_rule, chunk_size=C), wide, rounded["do"].astype(np.float64),
                          rounded["dstate"].astype(np.float64))
    for who, (got, yardsticks) in {"numpy": (ours, [theirs, twin]), "twin": (twin, [theirs])}.items():
        assert_error_budget(f"chunked_delta_rule[{who}]", dtype, budget_tensors(got, yardsticks, truth))

@given(case=delta_cases(dtype=np.float64).map(lambda case: {**case, "mask": None}), data=st.data())
def test_left_padding_never_reaches_the_state(case, data):
    """Each sequence b keeps its last L_b steps, the ones before padding (mask False) holding other
    values: its outputs there and its final state are those of the real steps run alone, its
    padding's outputs are 0 and the padding gets no gradient at all."""
    B, nh, T, _ = case["q"].shape
    lengths = data.draw(st.lists(st.integers(1, T), min_size=B, max_size=B), label="real lengths")
    mask = np.arange(T) >= T - np.array(lengths)[:, None]                  # (B, T), False on the left
    o, state, grads = numpy_run(case, mask=mask)
    # What each sequence's real steps give run alone, put where they stand, zeros at the padding.
    want_o, want_state = np.zeros_like(o), np.zeros_like(state)
    want_grads = {name: np.zeros_like(grads[name]) for name in NAMES[:5]}
    for b, L in enumerate(lengths):
        alone = {name: None if value is None else value[b:b + 1] for name, value in case.items()
                 if name in NAMES + ("do", "dstate")}
        alone = {name: value if name in ("initial_state", "dstate") or value is None else value[:, :, T - L:]
                 for name, value in alone.items()}
        o_b, want_state[b:b + 1], grads_b = numpy_run({**case, **alone, "mask": None})
        want_o[b:b + 1, :, T - L:] = o_b
        for name in NAMES[:5]:
            want_grads[name][b:b + 1, :, T - L:] = grads_b[name]
    tol = rounding_tol(case)
    assert_close("chunked_delta_rule.o after left padding", o, want_o, **tol)
    assert_close("chunked_delta_rule.state after left padding", state, want_state, **tol)
    for name in NAMES[:5]:
        assert_close(f"chunked_delta_rule.d{name} after left padding", grads[name], want_grads[name], **tol)
    assert np.all(o[~np.broadcast_to(mask[:, None, :], o.shape[:3])] == 0), "padding's outputs are 0"
    for name in NAMES[:5]:
        pad = ~np.broadcast_to(mask[:, None, :], grads[name].shape[:3])
        assert np.all(grads[name][pad] == 0), f"d{name} at padding is 0"


# -- finite differences (no torch) ----------------------------------------------------------------

@given(case=delta_cases(dtype=np.float64), seed=st.integers(0, 2**32 - 1))
def test_chunked_delta_rule_backward_matches_finite_differences(case, seed):
    """One directional derivative of sum(o * do) + sum(state * dstate) along a random direction in
    q, k, v, g, beta and the initial state; g kept below 0 by 0.01 so that the stencil's steps
    stay log-decays."""
    case = {**case, "g": case["g"] - 0.01}
    rng = np.random.default_rng(seed)
    tree = {name: case[name] for name in NAMES if case[name] is not None}
    direction = {name: rng.uniform(-1, 1, x.shape) for name, x in tree.items()}
    _, _, grads = numpy_run(case)
    grads = {name: grads[name] for name in tree}

    def f(t):
        o, state, _ = chunked_delta_rule_forward(**{**inputs(case), **t})
        dstate = np.zeros_like(state) if case["dstate"] is None else case["dstate"]
        return np.sum(o * case["do"]) + np.sum(state * dstate)

    h = 1e-4 / 4      # g's steps 2h stay below its 0.01 margin
    assert_close("chunked_delta_rule directional derivative vs finite differences",
                 np.float64(tree_dot(grads, direction)), np.float64(directional_derivative(f, tree, direction, h=h)),
                 **directional_tol(grads, direction))


# -- bad input --------------------------------------------------------------------------------------

def bad_input_case():
    B, nh, T, dk, dv = 2, 1, 3, 4, 2
    return dict(q=np.zeros((B, nh, T, dk)), k=np.zeros((B, nh, T, dk)), v=np.zeros((B, nh, T, dv)),
                g=np.zeros((B, nh, T)), beta=np.zeros((B, nh, T)))


@pytest.mark.parametrize("change, error, message", [
    (dict(chunk_size=0), ValueError, r"^chunk_size must be an integer >= 1, got 0$"),
    (dict(chunk_size=-3), ValueError, r"^chunk_size must be an integer >= 1, got -3$"),
    (dict(chunk_size=2.0), TypeError, r"^chunk_size must be an integer >= 1, got float 2\.0$"),
    (dict(chunk_size=True), TypeError, r"^chunk_size must be an integer >= 1, got bool True$"),
    (dict(g=np.full((2, 1, 3), 0.5)), ValueError, r"^g, the log of the decay, must be <= 0 \(a decay of at most "
                                                  r"1\), got a largest value 0\.5 in g of shape \(2, 1, 3\)$"),
    (dict(g=np.zeros((2, 1, 3, 2))), ValueError, r"^g must have shape \(2, 1, 3\) or \(2, 1, 3, 4\) to match q "
                                                 r"\(2, 1, 3, 4\), got \(2, 1, 3, 2\)$"),
    (dict(g=np.full((2, 1, 3), -np.inf)), ValueError, r"^g of shape \(2, 1, 3\) holds NaN or inf$"),
    (dict(v=np.full((2, 1, 3, 2), np.nan)), ValueError, r"^v of shape \(2, 1, 3, 2\) holds NaN or inf$"),
    (dict(beta=np.full((2, 1, 3), np.inf)), ValueError, r"^beta of shape \(2, 1, 3\) holds NaN or inf$"),
    (dict(initial_state=np.full((2, 1, 4, 2), np.nan)), ValueError, r"^initial_state of shape .* holds NaN or inf$"),
    (dict(q=np.zeros((2, 1, 3, 3))), ValueError, r"^k must have shape \(2, 1, 3, 3\) to match q \(2, 1, 3, 3\), "
                                                 r"got \(2, 1, 3, 4\)$"),
    (dict(k=np.zeros((2, 3, 4))), ValueError, r"^k must have shape \(2, 1, 3, 4\) to match q .*got \(2, 3, 4\)$"),
    (dict(q=np.zeros((2, 1, 0, 4)), k=np.zeros((2, 1, 0, 4)), v=np.zeros((2, 1, 0, 2)), g=np.zeros((2, 1, 0)),
          beta=np.zeros((2, 1, 0))), ValueError, r"^q must hold at least one step, .* got \(2, 1, 0, 4\)$"),
    (dict(v=np.zeros((2, 1, 4, 2))), ValueError, r"^v must have shape \(2, 1, 3, 2\) to match q .*got \(2, 1, 4, 2\)$"),
    (dict(beta=np.zeros((2, 1, 3, 1))), ValueError, r"^beta must have shape \(2, 1, 3\) to match q .*got"),
    (dict(initial_state=np.zeros((2, 1, 2, 4))), ValueError, r"^initial_state must have shape \(2, 1, 4, 2\) to "
                                                             r"match q .*got \(2, 1, 2, 4\)$"),
    (dict(mask=np.ones((2, 3), np.int64)), TypeError, r"^mask must be a bool NumPy array \(B, T\), False at "
                                                      r"padding, got int64$"),
    (dict(mask=np.ones((3, 2), bool)), ValueError, r"^mask must have shape \(B, T\) = \(2, 3\) to match q "
                                                   r".*got \(3, 2\)$"),
    (dict(scale=float("nan")), ValueError, r"^chunked_delta_rule: scale must be a finite number or None, got nan$"),
    (dict(beta=np.zeros((2, 1, 3), np.float32)), TypeError, r"arrays must share one dtype: .* beta is float32"),
])
def test_bad_input_is_refused_naming_it(change, error, message):
    with pytest.raises(error, match=message):
        chunked_delta_rule_forward(**{**bad_input_case(), **change})


def test_bad_upstream_gradients_are_refused_naming_them():
    o, state, cache = chunked_delta_rule_forward(**bad_input_case())
    with pytest.raises(ValueError, match=r"^chunked_delta_rule: do must have the shape of the forward's output, "
                                         r"\(2, 1, 3, 2\), got \(2, 1, 2, 3\)$"):
        chunked_delta_rule_backward(np.zeros((2, 1, 2, 3)), None, cache)
    with pytest.raises(ValueError, match=r"^chunked_delta_rule: dstate must have the shape .* \(2, 1, 4, 2\), "
                                         r"got \(2, 1, 2, 4\)$"):
        chunked_delta_rule_backward(o, np.zeros((2, 1, 2, 4)), cache)
    with pytest.raises(TypeError, match=r"^chunked_delta_rule: do must have the dtype of the forward's output, "
                                        r"float64, got float32"):
        chunked_delta_rule_backward(o.astype(np.float32), state, cache)
