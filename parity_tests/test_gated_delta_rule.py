"""Parity tests for numpy_attn/gated_delta_rule.py and torch_attn/gated_delta_rule.py: the gated
delta rule with one decay per head (Gated DeltaNet) or one per key channel (Kimi Delta Attention),
against its twin and autograd, finite differences, its own parallel (UT) form, and transformers'
recurrent fallbacks (torch_recurrent_gated_delta_rule, recurrent_kimi_delta_attention)."""


import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from transformers.models.kimi_linear.modeling_kimi_linear import recurrent_kimi_delta_attention
from transformers.models.qwen3_5.modeling_qwen3_5 import torch_recurrent_gated_delta_rule

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
    assert_bad_dout_refused,
    assert_close,
    assert_error_budget,
    directional_derivative,
    directional_tol,
    ramp,
    round_to,
    to_numpy,
    to_torch,
)
from torch_attn.gated_delta_rule import gated_delta_rule, gated_delta_rule_parallel

INPUTS = ("q", "k", "v", "g", "beta", "initial_state")


def _unit_rows(x):
    """Rows of length 1 (at most 1 for a row near 0), as the models' L2 norm makes q and k."""
    norm = np.sqrt((x * x).sum(axis=-1, keepdims=True))
    return (x / np.maximum(norm, x.dtype.type(0.5))).astype(x.dtype)


@st.composite
def delta_rules(draw, dtype=np.float64, per_channel=None, initial=None, masked=None):
    """A case: q, k (B, nh, T, dk) of unit rows, v (B, nh, T, dv) with dv != dk, g <= 0 of shape
    (B, nh, T) or (B, nh, T, dk), beta in [0, 1] (B, nh, T), an initial state or None, a (B, T)
    bool mask or None, and the upstream gradients do and dstate."""
    B, nh, T, dk = draw(S.dim(1, 2)), draw(S.dim(1, 2)), draw(S.dim(1, 6)), draw(S.dim(1, 4))
    dv = draw(st.sampled_from([d for d in range(1, 6) if d != dk]))
    per_channel = draw(st.booleans()) if per_channel is None else per_channel
    initial = draw(st.booleans()) if initial is None else initial
    masked = draw(st.booleans()) if masked is None else masked
    case = dict(q=_unit_rows(draw(S.arrays(dtype, (B, nh, T, dk)))),
                k=_unit_rows(draw(S.arrays(dtype, (B, nh, T, dk)))),
                v=draw(S.arrays(dtype, (B, nh, T, dv))),
                g=-np.abs(draw(S.arrays(dtype, (B, nh, T, dk) if per_channel else (B, nh, T)))),
                beta=np.abs(draw(S.arrays(dtype, (B, nh, T), 1.0))),
                initial_state=draw(S.arrays(dtype, (B, nh, dk, dv), 2.0)) if initial else None,
                mask=draw(hnp.arrays(np.bool_, (B, T))) if masked else None)
    case["do"] = draw(S.arrays(dtype, (B, nh, T, dv)))
    case["dstate"] = draw(S.arrays(dtype, (B, nh, dk, dv)))
    return case


def _edge_case(per_channel, T=1):
    """One token, one head (T = 1 pinned), dk = 3 != dv = 2, g = 0 (no decay) at the first step."""
    B, nh, dk, dv = 1, 1, 3, 2
    g = -np.abs(ramp(B, nh, T, dk) if per_channel else ramp(B, nh, T))
    g[:, :, :1] = 0
    return dict(q=_unit_rows(ramp(B, nh, T, dk)), k=_unit_rows(ramp(B, nh, T, dk) + 0.5), v=ramp(B, nh, T, dv),
                g=g, beta=np.abs(ramp(B, nh, T)), initial_state=ramp(B, nh, dk, dv), mask=None,
                do=ramp(B, nh, T, dv), dstate=ramp(B, nh, dk, dv))


def _inputs(case):
    return {name: case[name] for name in INPUTS}


def _tol(case, dtype):
    """(forward, backward) absolute tolerances for two computations of the recurrence that round
    differently (another summation order, another einsum kernel).

    A sum of n terms rounds, in any order, to within n u sum |terms| (u the unit roundoff). One
    step's sums (S^T k_t, S^T q_t) run over the dk rows of S, and sum |S_ij k_i| <= |S|_F |k| by
    Cauchy-Schwarz, with |q_t|, |k_t| <= 1 (unit rows); the delta u_t adds |v_t| and the update,
    decay and output one rounding each. So a step adds at most about c n u (M_S + m) to the state
    and the output, in Frobenius norm, with n = dk + 1, M_S the largest |S_t|_F, m the largest |v|
    and c = 8 for the chain of roundings. Earlier errors do not grow: with |k_t| <= 1,
    0 <= beta_t <= 1 and g <= 0 each step's map S -> (I - beta_t k_t k_t^T) D_t S has norm at most 1,
    so after T steps the errors only add up: at most linearly in T. The backward runs the adjoint
    maps, of the same norm, on dS (M_dS = |dstate|_F + sum_t scale |q_t| |do_t| bounds every
    |dS_t|_F); its sums run over dv (dq, dk), dk (du) and, for a scalar g, all dk dv entries of
    dS * S, whose terms sum to at most |dS|_F (M_S + m): n = dk dv + 1 and M_dS (M_S + m)."""
    q, v = case["q"], case["v"]
    B, nh, T, dk = q.shape
    dv = v.shape[-1]
    u = np.finfo(dtype).eps
    wide = {name: None if x is None else x.astype(np.float64) for name, x in _inputs(case).items()}
    _, _, cache = gated_delta_rule_forward(**wide, mask=case["mask"])
    M_S = max(1.0, float(np.sqrt((cache.states ** 2).sum(axis=(-2, -1))).max()))
    m = max(1.0, float(np.abs(v).max(initial=0)))
    reads = np.sqrt((case["do"].astype(np.float64) ** 2).sum(axis=-1) * (wide["q"] ** 2).sum(axis=-1))
    M_dS = max(1.0, float((np.sqrt((case["dstate"].astype(np.float64) ** 2).sum(axis=(-2, -1)))
                           + dk ** -0.5 * reads.sum(axis=-1)).max()))
    forward = 8 * (T + 1) * (dk + 1) * u * (M_S + m)
    backward = 8 * (T + 1) * (dk * dv + 1) * u * M_dS * (M_S + m)
    return dict(rtol=0, atol=forward), dict(rtol=0, atol=backward)


def _twin(case, requires_grad=True):
    """The torch twin on the case's inputs: (o, state, {name: leaf tensor})."""
    leaves = {name: None if x is None else to_torch(x, requires_grad) for name, x in _inputs(case).items()}
    mask = None if case["mask"] is None else torch.from_numpy(case["mask"])
    o, state = gated_delta_rule(**leaves, mask=mask)
    return o, state, leaves


def _assert_matches_twin(case, label):
    """Our forward and hand-written backward against the twin's forward and autograd, through
    (o * do).sum() + (state * dstate).sum()."""
    o, state, cache = gated_delta_rule_forward(**_inputs(case), mask=case["mask"])
    grads = gated_delta_rule_backward(case["do"], case["dstate"], cache)
    twin_o, twin_state, leaves = _twin(case)
    ((twin_o * to_torch(case["do"])).sum() + (twin_state * to_torch(case["dstate"])).sum()).backward()
    fwd, bwd = _tol(case, o.dtype)
    assert_close(f"{label}.o", o, to_numpy(twin_o), **fwd)
    assert_close(f"{label}.state", state, to_numpy(twin_state), **fwd)
    for name in INPUTS:
        if case[name] is None:
            assert grads[name] is None, f"{label}.d{name}: no input, no gradient"
        else:
            assert_close(f"{label}.d{name}", grads[name], to_numpy(leaves[name].grad), **bwd)


# -- forward and backward match the twin and autograd ---------------------------------------------

@pytest.mark.twin_parity
@given(case=delta_rules())
@example(case=_edge_case(per_channel=False))
@example(case=_edge_case(per_channel=True))
def test_gated_delta_rule_matches_twin_and_autograd(case):
    """float64, both kinds of g, with and without an initial state and a mask: o, the final state
    and every input's gradient (q, k, v, g, beta, initial_state)."""
    _assert_matches_twin(case, "gated_delta_rule")


@given(case=delta_rules(dtype=np.float32))
def test_float32_matches_twin_and_autograd(case):
    """float32 stays float32, to the same error analysis with float32's unit roundoff."""
    _assert_matches_twin(case, "gated_delta_rule")


def test_dstate_none_is_zeros():
    case = _edge_case(per_channel=True, T=3)
    _, _, cache = gated_delta_rule_forward(**_inputs(case))
    zeros = gated_delta_rule_backward(case["do"], np.zeros_like(case["dstate"]), cache)
    none = gated_delta_rule_backward(case["do"], None, cache)
    for name in INPUTS:
        np.testing.assert_array_equal(none[name], zeros[name], err_msg=f"d{name}")


def test_no_steps_return_the_initial_state_as_a_new_array():
    """T = 0: the final state equals initial_state, in a new array in both twins, so that a caller
    updating the state it got back in place leaves the one it passed untouched."""
    case = _edge_case(per_channel=False, T=0)
    state = case["initial_state"]
    _, final, _ = gated_delta_rule_forward(**_inputs(case))
    np.testing.assert_array_equal(final, state)
    assert not np.shares_memory(final, state), "the final state is the caller's initial_state"
    torch_state = to_torch(state)
    _, final = gated_delta_rule(*(to_torch(case[name]) for name in ("q", "k", "v", "g", "beta")),
                                initial_state=torch_state)
    assert torch.equal(final, torch_state) and final.data_ptr() != torch_state.data_ptr()


# -- the twin matches transformers' fallbacks --------------------------------------------------

def _heads_second(x):
    """(B, nh, T, ...) -> transformers' (B, T, nh, ...)."""
    return x.transpose(0, 2, 1, *range(3, x.ndim))


@given(case=delta_rules(dtype=np.float32, masked=False))
def test_matches_transformers_recurrent_fallbacks(case):
    """float32 against torch_recurrent_gated_delta_rule (scalar g; as many value heads as key heads)
    and recurrent_kimi_delta_attention (per-channel g), with q and k normalised here and
    use_qk_l2norm_in_kernel=False: outputs and final state. Both compute in float32 and each is
    within _tol's forward bound of the exact result, so they are within twice it of each other
    (transformers scales q before the loop, we scale each output: a different rounding, no more)."""
    o, state, _ = gated_delta_rule_forward(**_inputs(case))
    twin_o, twin_state, _ = _twin(case, requires_grad=False)
    theirs = recurrent_kimi_delta_attention if case["g"].ndim == 4 else torch_recurrent_gated_delta_rule
    args = [torch.from_numpy(np.ascontiguousarray(_heads_second(case[name]))) for name in ("q", "k", "v", "g", "beta")]
    init = None if case["initial_state"] is None else torch.from_numpy(case["initial_state"])
    their_o, their_state = theirs(*args, initial_state=init, output_final_state=True, use_qk_l2norm_in_kernel=False)
    their_o = _heads_second(to_numpy(their_o))
    fwd, _ = _tol(case, np.float32)
    both = dict(rtol=0, atol=2 * fwd["atol"])
    name = theirs.__name__
    assert_close(f"gated_delta_rule.o vs {name}", o, their_o, **both)
    assert_close(f"gated_delta_rule.state vs {name}", state, to_numpy(their_state), **both)
    assert_close(f"twin gated_delta_rule.o vs {name}", to_numpy(twin_o), their_o, **both)
    assert_close(f"twin gated_delta_rule.state vs {name}", to_numpy(twin_state), to_numpy(their_state), **both)


# -- properties ---------------------------------------------------------------------------------

@given(case=delta_rules(masked=False))
@example(case=_edge_case(per_channel=False))
@example(case=_edge_case(per_channel=True, T=4))
def test_parallel_form_equals_the_recurrence(case):
    """The UT form over the whole sequence (a triangular solve and pairwise decays, no loop over
    time) gives the loop's outputs and final state, in NumPy and in torch. Its error is the loop's
    bound of _tol times the growth of the triangular solve: (I + L)^(-1), L strictly lower with
    entries of at most 1 in size, has entries up to 2^(T - 1), so the solve may multiply the
    roundings of its right-hand side by up to 2^T."""
    o, state, _ = gated_delta_rule_forward(**_inputs(case))
    fwd, _ = _tol(case, o.dtype)
    tol = dict(rtol=0, atol=fwd["atol"] * 2.0 ** case["q"].shape[2])
    par_o, par_state = gated_delta_rule_parallel_forward(**_inputs(case))
    assert_close("gated_delta_rule_parallel.o", par_o, o, **tol)
    assert_close("gated_delta_rule_parallel.state", par_state, state, **tol)
    twin_o, twin_state = gated_delta_rule_parallel(**{name: None if x is None else to_torch(x)
                                                     for name, x in _inputs(case).items()})
    assert_close("twin gated_delta_rule_parallel.o", to_numpy(twin_o), o, **tol)
    assert_close("twin gated_delta_rule_parallel.state", to_numpy(twin_state), state, **tol)


@given(case=delta_rules(masked=False), pad=st.integers(1, 3), seed=st.integers(0, 2**32 - 1))
def test_left_padding_never_reaches_the_state(case, pad, seed):
    """The same sequences behind ``pad`` steps of padding (random q, k, v, g and beta there, masked
    out) give the unpadded outputs after the padding, zeros on it, the same final state and the
    same gradients; the padding's inputs get none. A padded step multiplies S by exp(0) = 1 and adds
    k (0 * delta) = 0, so the state is carried exactly; the rest is the unpadded computation with
    its steps' shapes, summed in the same order."""
    rng = np.random.default_rng(seed)
    B, nh, T, dk = case["q"].shape

    def padded(name, x):
        junk = rng.uniform(-1, 1, x.shape[:2] + (pad,) + x.shape[3:])
        junk = -np.abs(junk) if name == "g" else np.abs(junk) if name == "beta" else junk
        return np.concatenate([junk, x], axis=2)

    long = {name: padded(name, case[name]) for name in ("q", "k", "v", "g", "beta", "do")}
    mask = np.arange(pad + T) >= pad
    mask = np.broadcast_to(mask, (B, pad + T)).copy()
    o, state, cache = gated_delta_rule_forward(**_inputs(case))
    grads = gated_delta_rule_backward(case["do"], case["dstate"], cache)
    long_o, long_state, long_cache = gated_delta_rule_forward(
        long["q"], long["k"], long["v"], long["g"], long["beta"], case["initial_state"], mask=mask)
    long_grads = gated_delta_rule_backward(long["do"], case["dstate"], long_cache)
    fwd, bwd = _tol(case, o.dtype)
    np.testing.assert_array_equal(long_o[:, :, :pad], 0, err_msg="padded steps' outputs")
    assert_close("gated_delta_rule padded.o", long_o[:, :, pad:], o, **fwd)
    assert_close("gated_delta_rule padded.state", long_state, state, **fwd)
    for name in ("q", "k", "v", "g", "beta"):
        np.testing.assert_array_equal(long_grads[name][:, :, :pad], 0, err_msg=f"padded steps' d{name}")
        assert_close(f"gated_delta_rule padded.d{name}", long_grads[name][:, :, pad:], grads[name], **bwd)
    if case["initial_state"] is not None:
        assert_close("gated_delta_rule padded.dinitial_state", long_grads["initial_state"],
                     grads["initial_state"], **bwd)


@given(case=delta_rules(masked=False))
def test_a_scalar_decay_is_a_per_channel_decay_equal_on_every_channel(case):
    """Gated DeltaNet is Kimi Delta Attention with every channel's decay equal; dg of the scalar is
    the sum of the per-channel dg over the key channels."""
    g = case["g"] if case["g"].ndim == 3 else case["g"][..., 0]
    dk = case["q"].shape[-1]
    scalar = {**_inputs(case), "g": g}
    wide = {**_inputs(case), "g": np.repeat(g[..., None], dk, axis=-1)}
    o, state, cache = gated_delta_rule_forward(**scalar)
    wide_o, wide_state, wide_cache = gated_delta_rule_forward(**wide)
    fwd, bwd = _tol(case, o.dtype)
    assert_close("gated_delta_rule scalar g vs per-channel.o", o, wide_o, **fwd)
    assert_close("gated_delta_rule scalar g vs per-channel.state", state, wide_state, **fwd)
    dg = gated_delta_rule_backward(case["do"], case["dstate"], cache)["g"]
    wide_dg = gated_delta_rule_backward(case["do"], case["dstate"], wide_cache)["g"]
    assert_close("gated_delta_rule scalar dg vs per-channel", dg, wide_dg.sum(axis=-1), **bwd)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_computes_in_float32_and_rounds_once(dtype):
    """float16 and bfloat16 come back in their dtype: the float32 computation on the same values,
    rounded once."""
    low = np.dtype(np.float16) if dtype == "float16" else BFLOAT16
    case = _edge_case(per_channel=True, T=3)
    rounded = {name: x.astype(low) for name, x in case.items() if isinstance(x, np.ndarray)}
    o, state, cache = gated_delta_rule_forward(**{name: rounded[name] for name in INPUTS})
    grads = gated_delta_rule_backward(rounded["do"], rounded["dstate"], cache)
    single = {name: x.astype(np.float32) for name, x in rounded.items()}
    o32, state32, cache32 = gated_delta_rule_forward(**{name: single[name] for name in INPUTS})
    grads32 = gated_delta_rule_backward(single["do"], single["dstate"], cache32)
    np.testing.assert_array_equal(o, o32.astype(low), err_msg="o")
    np.testing.assert_array_equal(state, state32.astype(low), err_msg="state")
    for name in INPUTS:
        assert grads[name].dtype == low, f"d{name}: {grads[name].dtype}"
        np.testing.assert_array_equal(grads[name], grads32[name].astype(low), err_msg=f"d{name}")



# -- float16 and bfloat16: FlashAttention's error rule against PyTorch's low-precision runs -------

@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@given(case=delta_rules(masked=False))
@example(case=_edge_case(per_channel=False, T=3))
@example(case=_edge_case(per_channel=True, T=3))
def test_low_precision_meets_the_error_budget(dtype, case):
    """Ours and the twin in float16 and bfloat16 against the twin in float64 on the same rounded
    inputs, do and dstate (the truth), within twice the error of PyTorch's runs of the recurrence in
    the low dtype: transformers' fallback for the kind of g, and for ours the twin too (each casts up
    to float32 and rounds once), for o, the final state and every input's gradient."""
    rounded = {name: None if x is None else round_to(x, dtype) for name, x in case.items() if name != "mask"}
    arrays = _inputs(rounded)
    o, state, cache = gated_delta_rule_forward(**arrays)
    ours = (o, state, gated_delta_rule_backward(rounded["do"], rounded["dstate"], cache))
    twin = autograd_both(gated_delta_rule, arrays, rounded["do"], rounded["dstate"])
    theirs = autograd_both(transformers_delta_rule(), arrays, rounded["do"], rounded["dstate"])
    wide = {name: None if x is None else x.astype(np.float64) for name, x in rounded.items()}
    truth = autograd_both(gated_delta_rule, _inputs(wide), wide["do"], wide["dstate"])
    for who, (got, yardsticks) in {"numpy": (ours, [theirs, twin]), "twin": (twin, [theirs])}.items():
        assert_error_budget(f"gated_delta_rule[{who}]", dtype, budget_tensors(got, yardsticks, truth))


# -- finite differences (no torch) ----------------------------------------------------------------

@given(case=delta_rules(initial=True), seed=st.integers(0, 2**32 - 1))
@example(case=_edge_case(per_channel=False, T=2), seed=0)
@example(case=_edge_case(per_channel=True, T=2), seed=1)
def test_gated_delta_rule_backward_matches_finite_differences(case, seed):
    """Each input's gradient (q, k, v, g, beta, initial_state) against the directional derivative of
    sum(o * do) + sum(state * dstate) along a random direction in that input alone. g is kept 1e-3
    below 0 so that the stencil's steps (up to 2e-4) stay where g is allowed."""
    rng = np.random.default_rng(seed)
    inputs = {**_inputs(case), "g": np.minimum(case["g"], -1e-3)}
    _, _, cache = gated_delta_rule_forward(**inputs, mask=case["mask"])
    grads = gated_delta_rule_backward(case["do"], case["dstate"], cache)

    def f(tree):
        o, state, _ = gated_delta_rule_forward(**{**inputs, **tree}, mask=case["mask"])
        return np.sum(o * case["do"]) + np.sum(state * case["dstate"])

    for name in INPUTS:
        tree = {name: inputs[name]}
        direction = {name: rng.uniform(-1, 1, inputs[name].shape)}
        assert_close(f"gated_delta_rule.d{name} directional derivative vs finite differences",
                     np.float64(np.sum(grads[name] * direction[name])),
                     np.float64(directional_derivative(f, tree, direction)),
                     **directional_tol({name: grads[name]}, direction))


# -- bad input --------------------------------------------------------------------------------------

def _good():
    case = _edge_case(per_channel=False, T=3)
    return _inputs(case)


@pytest.mark.parametrize("name, value, message", [
    ("q", np.zeros((1, 1, 3)), r"^q must have shape \(B, nh, T, dk\), got \(1, 1, 3\)$"),
    ("k", np.zeros((1, 1, 3, 2)), r"^k must have shape \(1, 1, 3, 3\) to match q \(1, 1, 3, 3\), got \(1, 1, 3, 2\)$"),
    ("v", np.zeros((1, 1, 2, 2)), r"^v must have shape \(1, 1, 3, 2\) to match q .*, got \(1, 1, 2, 2\)$"),
    ("v", np.zeros((1, 1, 3)), r"^v must have shape \(1, 1, 3, dv\) to match q .*, got \(1, 1, 3\)$"),
    ("g", np.zeros((1, 1, 3, 2)),
     r"^g must have shape \(1, 1, 3\) or \(1, 1, 3, 3\) to match q .*, got \(1, 1, 3, 2\)$"),
    ("beta", np.zeros((1, 1, 3, 1)), r"^beta must have shape \(1, 1, 3\) to match q .*, got \(1, 1, 3, 1\)$"),
    ("initial_state", np.zeros((1, 1, 2, 3)),
     r"^initial_state must have shape \(1, 1, 3, 2\) to match q .*, got \(1, 1, 2, 3\)$"),
    ("g", np.array([[[0.0, 0.5, -1.0]]]), r"^g, the log of the decay, must be <= 0 .*largest value .*0\.5"),
    ("q", np.full((1, 1, 3, 3), np.nan), r"^q of shape \(1, 1, 3, 3\) holds NaN or inf$"),
    ("k", np.full((1, 1, 3, 3), np.inf), r"^k of shape \(1, 1, 3, 3\) holds NaN or inf$"),
    ("v", np.full((1, 1, 3, 2), np.nan), r"^v of shape \(1, 1, 3, 2\) holds NaN or inf$"),
    ("g", np.array([[[0.0, -np.inf, -1.0]]]), r"^g of shape \(1, 1, 3\) holds NaN or inf$"),
    ("beta", np.array([[[0.5, np.nan, 1.0]]]), r"^beta of shape \(1, 1, 3\) holds NaN or inf$"),
    ("initial_state", np.full((1, 1, 3, 2), np.inf), r"^initial_state of shape \(1, 1, 3, 2\) holds NaN or inf$"),
])
def test_bad_values_are_refused_naming_them(name, value, message):
    with pytest.raises(ValueError, match=message):
        gated_delta_rule_forward(**{**_good(), name: value})
    if name != "q" or value.ndim == 4:
        with pytest.raises(ValueError, match=message):
            gated_delta_rule_parallel_forward(**{**_good(), name: value})


def test_bad_types_mask_and_scale_are_refused():
    good = _good()
    with pytest.raises(TypeError, match=r"^arrays must share one dtype: q is float64, k is float64, v is float32"):
        gated_delta_rule_forward(**{**good, "v": good["v"].astype(np.float32)})
    with pytest.raises(TypeError, match=r"^beta must be float16, bfloat16, float32 or float64, got dtype int64$"):
        gated_delta_rule_forward(**{**good, "beta": np.zeros((1, 1, 3), np.int64)})
    with pytest.raises(TypeError, match=r"^initial_state must be a NumPy array, got list$"):
        gated_delta_rule_forward(**{**good, "initial_state": [[0.0]]})
    with pytest.raises(ValueError, match=r"^mask must have shape \(B, T\) = \(1, 3\) to match q \(1, 1, 3, 3\), "
                                         r"got \(1, 1, 3\)$"):
        gated_delta_rule_forward(**good, mask=np.ones((1, 1, 3), bool))
    with pytest.raises(TypeError, match=r"^mask must be a bool NumPy array \(B, T\), False at padding, got int64$"):
        gated_delta_rule_forward(**good, mask=np.ones((1, 3), np.int64))
    with pytest.raises(ValueError, match=r"^gated_delta_rule: scale must be a finite number or None, got nan$"):
        gated_delta_rule_forward(**good, scale=float("nan"))


def test_bad_do_and_dstate_are_refused():
    good = _good()
    o, state, cache = gated_delta_rule_forward(**good)
    assert_bad_dout_refused("gated_delta_rule", o, lambda do, cache: gated_delta_rule_backward(do, None, cache),
                            cache, dout_name="do")
    assert_bad_dout_refused("gated_delta_rule", state,
                            lambda dstate, cache: gated_delta_rule_backward(np.zeros_like(o), dstate, cache),
                            cache, dout_name="dstate")
