"""Parity tests for numpy_attn/flex_attention.py and torch_attn/flex_attention.py.

torch.nn.attention.flex_attention runs on the CPU in eager mode for the forward only (torch 2.13
refuses a backward on the CPU: "FlexAttention does not support backward on CPU"), so the built-in
checks outputs and lse; the gradients are checked against the twin's autograd, against
F.scaled_dot_product_attention with the equivalent boolean mask, and against finite differences.
"""

import inspect
import math
import re
import warnings
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import numpy_attn.flex_attention as nf
import torch_attn.flex_attention as tf
from parity_tests import strategies as S
from parity_tests.attention_kit import assert_fa4_rule, float32_allowance
from parity_tests.helpers import (
    FD_TOL,
    LOW_DTYPES,
    TOLERANCES,
    assert_close,
    assert_error_budget,
    autograd,
    numerical_grad,
    round_to,
    to_numpy,
    to_torch,
)

MASKS = ("none", "causal", "causal_bottom_right", "sliding_window", "prefix_lm", "document",
         "document_causal", "drawn")
SCORES = ("none", "alibi", "relative_position_bias", "learned_bias", "soft_cap")
PARAMS = {"alibi": "slopes", "relative_position_bias": "table", "learned_bias": "table"}


@st.composite
def flex_inputs(draw, dtype=None, max_len=9, max_head=4, bound=4.0, masks=MASKS, scores=SCORES):
    """A case: q, k, v, dout, dlse, the modifiers' names and arguments, the block sizes.

    q may have g times the heads of k and v (grouped-query). Block sizes run from 1 to past the
    lengths. A "drawn" mask is any boolean array over (b, h, q, kv), the same for every batch
    (head) when its batch (head) size is 1: then the block mask is made with B (H) = None.
    """
    dtype = draw(S.dtypes) if dtype is None else dtype
    B, Hkv, g = draw(S.dim(1, 2)), draw(S.dim(1, 2)), draw(S.dim(1, 3))
    Hq = Hkv * g
    L, S_ = draw(S.dim(1, max_len)), draw(S.dim(1, max_len))
    E, Ev = draw(S.dim(1, max_head)), draw(S.dim(1, max_head))
    N = max(L, S_)
    mask = draw(st.sampled_from(masks))
    mask_arg = None
    if mask == "sliding_window":
        mask_arg = draw(st.integers(1, N + 1))
    elif mask == "prefix_lm":
        mask_arg = draw(st.integers(0, S_ + 1))
    elif mask.startswith("document"):
        cuts = draw(st.lists(st.integers(1, N - 1), unique=True)) if N > 1 else []
        mask_arg = np.diff([0, *sorted(cuts), N]).tolist()      # lengths of the packed documents
    elif mask == "drawn":
        mB, mH = draw(st.sampled_from((1, B))), draw(st.sampled_from((1, Hq)))
        mask_arg = draw(hnp.arrays(np.bool_, (mB, mH, L, S_)))
    score = draw(st.sampled_from(scores))
    param = None
    if score == "alibi":
        param = draw(S.arrays(dtype, (Hq,), 1.0))
    elif score == "relative_position_bias":
        param = draw(S.arrays(dtype, (Hq, 2 * N - 1), 2.0))
    elif score == "learned_bias":
        param = draw(S.arrays(dtype, (Hq, L, S_), 2.0))
    elif score == "soft_cap":
        param = draw(st.floats(0.5, 10.0))
    block = draw(st.integers(1, N + 2) | st.tuples(st.integers(1, L + 2), st.integers(1, S_ + 2)))
    return dict(
        q=draw(S.arrays(dtype, (B, Hq, L, E), bound)),
        k=draw(S.arrays(dtype, (B, Hkv, S_, E), bound)),
        v=draw(S.arrays(dtype, (B, Hkv, S_, Ev), bound)),
        dout=draw(S.arrays(dtype, (B, Hq, L, Ev))),
        dlse=draw(st.none() | S.arrays(dtype, (B, Hq, L))),
        mask=mask, mask_arg=mask_arg, score=score, param=param, block=block,
        scale=draw(st.none() | st.floats(0.1, 2.0)),
    )


def ramp(*shape, dtype=np.float64):
    return S.ramp(*shape, dtype=dtype)


def make_case(B, Hq, Hkv, L, S_, E, Ev, mask="none", mask_arg=None, score="none", param=None,
              block=2, dtype=np.float64, dlse=False):
    return dict(q=ramp(B, Hq, L, E, dtype=dtype), k=ramp(B, Hkv, S_, E, dtype=dtype) * 0.7,
                v=ramp(B, Hkv, S_, Ev, dtype=dtype) * 1.3,
                dout=ramp(B, Hq, L, Ev, dtype=dtype) * 0.5,
                dlse=ramp(B, Hq, L, dtype=dtype) * 0.3 if dlse else None,
                mask=mask, mask_arg=mask_arg, score=score, param=param, block=block, scale=None)


# A fully masked row (prefix 0, bottom-right with L > S), GQA with blocks that divide nothing,
# documents with L != S, a drawn per-batch per-head mask, L = S = 1.
EDGE_CASES = [
    make_case(1, 2, 1, 5, 3, 2, 3, "causal_bottom_right", score="alibi", param=np.array([0.5, -0.25]),
              dlse=True),
    make_case(2, 4, 2, 7, 5, 3, 2, "sliding_window", 2, "relative_position_bias",
              ramp(4, 13) * 0.5, block=(3, 2)),
    make_case(1, 1, 1, 6, 9, 2, 2, "document_causal", [2, 3, 4], "soft_cap", 1.5, block=(4, 4)),
    make_case(2, 2, 2, 4, 5, 2, 3, "drawn", ramp(2, 2, 4, 5) > 0.3, "learned_bias",
              ramp(2, 4, 5), block=(2, 3), dlse=True),
    make_case(1, 1, 1, 1, 1, 1, 1, "causal", score="soft_cap", param=0.7, block=1),
]


def build_mask(lib, case):
    """The case's mask_mod written with ``lib`` (numpy_attn's or torch_attn's flex_attention)."""
    kind, arg = case["mask"], case["mask_arg"]
    L, S_ = case["q"].shape[2], case["k"].shape[2]
    if kind == "none":
        return None
    if kind == "drawn":
        keep = arg if lib is nf else torch.from_numpy(arg)
        mB, mH = keep.shape[:2]
        return lambda b, h, q_idx, kv_idx: keep[b % mB, h % mH, q_idx, kv_idx]
    return {"causal": lambda: lib.causal,
            "causal_bottom_right": lambda: lib.causal_bottom_right(L, S_),
            "sliding_window": lambda: lib.sliding_window(arg),
            "prefix_lm": lambda: lib.prefix_lm(arg),
            "document": lambda: lib.document(arg),
            "document_causal": lambda: lib.and_masks(lib.document(arg), lib.causal)}[kind]()


def build_score(lib, case, param):
    """The case's score_mod written with ``lib``, on ``param`` (an array or a tensor)."""
    kind = case["score"]
    return None if kind == "none" else getattr(lib, kind)(param)


def mask_sizes(case):
    """create_block_mask's B and H: None where the mask is the same for every batch (head)."""
    if case["mask"] != "drawn":
        return None, None
    mB, mH = case["mask_arg"].shape[:2]
    return (None if mB == 1 else mB), (None if mH == 1 else mH)


def numpy_block_mask(case):
    mask_mod = build_mask(nf, case)
    if mask_mod is None:
        return None
    L, S_ = case["q"].shape[2], case["k"].shape[2]
    return nf.create_block_mask(mask_mod, *mask_sizes(case), L, S_, BLOCK_SIZE=case["block"])


def torch_block_mask(case):
    from torch.nn.attention.flex_attention import create_block_mask

    mask_mod = build_mask(tf, case)
    if mask_mod is None:
        return None
    L, S_ = case["q"].shape[2], case["k"].shape[2]
    return create_block_mask(mask_mod, *mask_sizes(case), L, S_, device="cpu", BLOCK_SIZE=case["block"])


def gqa(case):
    return case["q"].shape[1] != case["k"].shape[1]


def numpy_forward(case, dense=False, **changes):
    """((out, lse), cache) of the tiled path (or the dense one) on the case."""
    c = {**case, **changes}
    forward = nf.dense_flex_attention_forward if dense else nf.flex_attention_forward
    return forward(c["q"], c["k"], c["v"], build_score(nf, c, c["param"]), numpy_block_mask(c),
                   scale=c["scale"], enable_gqa=gqa(c), return_lse=True, sinks=c.get("sinks"))


def numpy_grads(case, cache):
    """{"q", "k", "v", the score_mod's parameter name, and "sinks" with sinks}: the hand-written
    gradients."""
    dq, dk, dv, dparams, *dsinks = nf.flex_attention_backward(case["dout"], cache, dlse=case["dlse"])
    return {"q": dq, "k": dk, "v": dv, **dparams, **({"sinks": dsinks[0]} if dsinks else {})}


def twin_grads(case):
    """((out, lse), grads) of the twin: autograd of sum(out * dout) + sum(lse * dlse)."""
    t = {n: to_torch(case[n], requires_grad=True) for n in ("q", "k", "v")}
    param = case["param"]
    if case["score"] in PARAMS:
        param = t[PARAMS[case["score"]]] = to_torch(param, requires_grad=True)
    if case.get("sinks") is not None:
        t["sinks"] = to_torch(case["sinks"], requires_grad=True)
    out, lse = tf.flex_attention(t["q"], t["k"], t["v"], build_score(tf, case, param),
                                 torch_block_mask(case), scale=case["scale"], enable_gqa=gqa(case),
                                 return_lse=True, sinks=t.get("sinks"))
    loss = (out * to_torch(case["dout"])).sum()
    if case["dlse"] is not None:      # -inf rows: where() in the twin passes them no gradient
        loss = loss + torch.where(torch.isneginf(lse), 0, lse * to_torch(case["dlse"])).sum()
    loss.backward()
    return (to_numpy(out), to_numpy(lse)), {n: to_numpy(x.grad) for n, x in t.items()}


def builtin_forward(case):
    """torch.nn.attention.flex_attention.flex_attention (eager, CPU, no gradient) -> (out, lse)."""
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention

    param = case["param"]
    if case["score"] in PARAMS:
        param = to_torch(param)
    q, k, v = (to_torch(case[n]) for n in ("q", "k", "v"))
    with warnings.catch_warnings():     # "called without torch.compile()": eager is the point here
        warnings.simplefilter("ignore", UserWarning)
        out, aux = flex_attention(q, k, v, score_mod=build_score(tf, case, param),
                                  block_mask=torch_block_mask(case), scale=case["scale"],
                                  enable_gqa=gqa(case), return_aux=AuxRequest(lse=True))
    return to_numpy(out), to_numpy(aux.lse)


def _scale(case):
    return 1 / math.sqrt(case["q"].shape[-1]) if case["scale"] is None else case["scale"]


def grad_tols(case):
    """assert_close's tolerances per gradient: the dtype's, atol widened for cancellation.

    dS = P * (dP - D) cancels: dP and D are sums of up to Ev terms |dout| |v| (plus |dlse|), and
    dS keeps their rounding, a few ulps of that size G, however small the difference. dq and dk
    sum dS over up to max(L, S) rows (g L for a key) times |k| or |q| and the scale: a few ulps
    of M = scale max|q, k| g max(L, S) G, in any implementation (test_flash_attention.py measured
    up to 4.4 ulps of the same M). A bias table entry sums dS over every (b, head, q, kv) that
    reads it, at most B Hq L S terms of which each row's P sums to 1: B Hq L G; ALiBi's slopes
    weigh each term by a distance below max(L, S). Hence 8 ulps of those; a bug is off by a
    fraction of them.
    """
    q, k, v, dout, dlse = (case[n] for n in ("q", "k", "v", "dout", "dlse"))
    eps = float(np.finfo(q.dtype).eps)
    B, Hq, L, _ = q.shape
    S_, Ev = v.shape[2], v.shape[3]
    g = Hq // k.shape[1]
    G = np.abs(dout).max() * np.abs(v).max() * Ev + (0 if dlse is None else np.abs(dlse).max())
    M = _scale(case) * max(np.abs(q).max(), np.abs(k).max()) * g * max(L, S_) * G
    atol = TOLERANCES[q.dtype]["atol"]
    table = B * Hq * L * G * (max(L, S_) if case["score"] == "alibi" else 1)
    return {"q": dict(atol=max(atol, 8 * eps * M)), "k": dict(atol=max(atol, 8 * eps * M)),
            "v": {}, "slopes": dict(atol=max(atol, 8 * eps * table)),
            "table": dict(atol=max(atol, 8 * eps * table))}


def forward_tol(case):
    """Tolerance of out and lse in float32: exp(s - m) has the relative rounding of s itself,
    up to max |s| ulps (s below scale E max|q| max|k| plus the bias), which out carries as a
    mean of v and lse as a sum of log terms. The dtype's default elsewhere."""
    q = case["q"]
    if q.dtype == np.float64:
        return {}, {}
    bias = {"alibi": lambda p: np.abs(p).max() * max(q.shape[2], case["k"].shape[2]),
            "relative_position_bias": lambda p: np.abs(p).max(),
            "learned_bias": lambda p: np.abs(p).max()}.get(case["score"], lambda p: 0.0)(case["param"])
    largest = _scale(case) * q.shape[-1] * np.abs(q).max() * np.abs(case["k"]).max() + bias
    relative = 4 * float(np.finfo(np.float32).eps) * (1 + largest)
    base = TOLERANCES[q.dtype]
    return (dict(atol=max(base["atol"], relative * np.abs(case["v"]).max())),
            dict(atol=max(base["atol"], relative)))


# -- forward matches the twin ---------------------------------------------------------------------

@given(case=flex_inputs())
@example(case=EDGE_CASES[0])
@example(case=EDGE_CASES[1])
@example(case=EDGE_CASES[3])
def test_forward_matches_twin(case):
    (out, lse), _ = numpy_forward(case)
    (out_t, lse_t), _ = twin_grads(case)
    out_tol, lse_tol = forward_tol(case)
    assert_close("flex.out", out, out_t, **out_tol)
    assert_close("flex.lse", lse, lse_t, **lse_tol)


# -- backward matches autograd --------------------------------------------------------------------

@pytest.mark.twin_parity
@given(case=flex_inputs())
@example(case=EDGE_CASES[0])
@example(case=EDGE_CASES[2])
@example(case=EDGE_CASES[3])
def test_backward_matches_autograd(case):
    _, cache = numpy_forward(case)
    grads = numpy_grads(case, cache)
    _, grads_t = twin_grads(case)
    assert grads.keys() == grads_t.keys(), f"gradients {sorted(grads)} != autograd's {sorted(grads_t)}"
    tols = grad_tols(case)
    for name, d in grads.items():
        assert_close(f"flex.d{name} ({case['score']})", d, grads_t[name], **tols[name])


# -- the twin matches PyTorch's built-ins -----------------------------------------------------------

@given(case=flex_inputs())
@example(case=EDGE_CASES[0])
@example(case=EDGE_CASES[1])
@example(case=EDGE_CASES[2])
@example(case=EDGE_CASES[3])
def test_twin_matches_builtin_flex_attention(case):
    """Output and lse of torch.nn.attention.flex_attention (eager, CPU) with the same modifiers,
    for the twin and (recorded per modifier for the error report) the NumPy tiled path."""
    (out_t, lse_t), _ = twin_grads(case)
    (out, lse), _ = numpy_forward(case)
    out_b, lse_b = builtin_forward(case)
    out_tol, lse_tol = forward_tol(case)
    for label in (f"mask {case['mask']}", f"score_mod {case['score']}"):   # one record per modifier
        assert_close(f"flex.out vs builtin, {label}", out_t, out_b, **out_tol)
        assert_close(f"flex.lse vs builtin, {label}", lse_t, lse_b, **lse_tol)
        assert_close(f"flex.out numpy vs builtin, {label}", out, out_b, **out_tol)
        assert_close(f"flex.lse numpy vs builtin, {label}", lse, lse_b, **lse_tol)
    assert np.array_equal(np.isneginf(lse_t), np.isneginf(lse_b)), "flex.lse: -inf rows differ from builtin"


def dense_mask(kind, arg, L, S_):
    """The named mask as a (L, S) boolean array, built row by row without the mask_mods."""
    keep = np.zeros((L, S_), dtype=bool)
    doc = np.repeat(np.arange(len(arg)), arg) if kind.startswith("document") else None
    for i in range(L):
        if kind == "causal":
            keep[i, :i + 1] = True
        elif kind == "causal_bottom_right":
            keep[i, :max(0, S_ - L + i + 1)] = True
        elif kind == "sliding_window":
            keep[i, max(0, i - arg + 1):i + 1] = True
        elif kind == "prefix_lm":
            keep[i, :max(arg, i + 1)] = True
        else:
            keep[i, :] = doc[i] == doc[:S_]
            if kind == "document_causal":
                keep[i, i + 1:] = False
    return keep


@given(case=flex_inputs(masks=MASKS[1:-1], scores=("none",)))
@example(case={**EDGE_CASES[0], "score": "none", "param": None})
@example(case={**EDGE_CASES[2], "score": "none", "param": None})
def test_named_masks_match_sdpa_with_a_boolean_mask(case):
    """Each named mask gives F.scaled_dot_product_attention's output and gradients with the
    equivalent boolean attn_mask (True = may attend; fully masked rows are zeros in both)."""
    L, S_ = case["q"].shape[2], case["k"].shape[2]
    keep = to_torch(dense_mask(case["mask"], case["mask_arg"], L, S_))
    t = {n: to_torch(case[n], requires_grad=True) for n in ("q", "k", "v")}
    out_b = F.scaled_dot_product_attention(t["q"], t["k"], t["v"], attn_mask=keep, scale=case["scale"],
                                           enable_gqa=gqa(case))
    (out_b * to_torch(case["dout"])).sum().backward()
    (out, _), cache = numpy_forward(case)
    grads = numpy_grads({**case, "dlse": None}, cache)
    tols = grad_tols({**case, "dlse": None})
    assert_close(f"flex.out ({case['mask']}) vs sdpa", out, to_numpy(out_b), **forward_tol(case)[0])
    for name in ("q", "k", "v"):
        assert_close(f"flex.d{name} ({case['mask']}) vs sdpa", grads[name], to_numpy(t[name].grad),
                     **tols[name])


def larger_case(dtype, mask, mask_arg, score, param):
    """L = S = 300 (blocks of 64 that do not divide it), 4 query heads on 2 kv heads, E = 16."""
    rng = np.random.default_rng(300)
    q, k, v, dout = (rng.standard_normal(shape).astype(dtype) for shape in
                     ((1, 4, 300, 16), (1, 2, 300, 16), (1, 2, 300, 8), (1, 4, 300, 8)))
    return dict(q=q, k=k, v=v, dout=dout, dlse=rng.standard_normal((1, 4, 300)).astype(dtype),
                mask=mask, mask_arg=mask_arg, score=score, param=param, block=64, scale=None)


LARGER = [("sliding_window", 50, "alibi", nf.alibi_slopes(4)),
          ("document_causal", [90, 150, 60], "soft_cap", 5.0),
          ("prefix_lm", 70, "relative_position_bias", np.sin(np.arange(4 * 599)).reshape(4, 599))]


@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
@pytest.mark.parametrize("mask, mask_arg, score, param", LARGER)
def test_larger_pinned_cases(dtype, mask, mask_arg, score, param):
    """Hypothesis draws small shapes; these pin a few larger ones, with many tiles of each kind:
    tiled against the twin and its autograd, and against the built-in's output."""
    param = param.astype(dtype) if isinstance(param, np.ndarray) and score != "alibi" else param
    case = larger_case(dtype, mask, mask_arg, score, param)
    (out, lse), cache = numpy_forward(case)
    grads = numpy_grads(case, cache)
    (out_t, lse_t), grads_t = twin_grads(case)
    out_b, _ = builtin_forward(case)
    out_tol, lse_tol = forward_tol(case)
    assert_close(f"flex.out larger ({mask}, {score})", out, out_t, **out_tol)
    assert_close(f"flex.lse larger ({mask}, {score})", lse, lse_t, **lse_tol)
    assert_close(f"flex.out larger vs builtin ({mask}, {score})", out, out_b, **out_tol)
    tols = grad_tols(case)
    for name, d in grads.items():
        assert_close(f"flex.d{name} larger ({mask}, {score})", d, grads_t[name], **tols[name])
    skipped = numpy_block_mask(case).fraction_skipped()
    assert skipped > 0.2, f"{mask}: only {skipped:.0%} of the tiles skipped at L = 300"


# -- the tiled path equals the dense one ------------------------------------------------------------

@given(case=flex_inputs())
@example(case=EDGE_CASES[3])
def test_tiled_equals_dense(case):
    """Visiting only the listed tiles, with mask_mod inside partial ones only, gives the dense
    path's output, lse and gradients for any mask and block size (the dense path is cached
    without block sizes of its own: other blocks, the same result)."""
    (out, lse), cache = numpy_forward(case)
    (out_d, lse_d), cache_d = numpy_forward(case, dense=True)
    out_tol, lse_tol = forward_tol(case)
    assert_close("flex.out tiled vs dense", out, out_d, **out_tol)
    assert_close("flex.lse tiled vs dense", lse, lse_d, **lse_tol)
    grads, grads_d = numpy_grads(case, cache), numpy_grads(case, cache_d)
    tols = grad_tols(case)
    for name, d in grads.items():
        assert_close(f"flex.d{name} tiled vs dense", d, grads_d[name], **tols[name])


@given(case=flex_inputs(masks=MASKS[1:]))
@example(case=EDGE_CASES[1])
@example(case=EDGE_CASES[3])
def test_block_mask_matches_torch(case):
    """create_block_mask gives torch's partial and full block lists, index order included."""
    ours, theirs = numpy_block_mask(case), torch_block_mask(case)
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"):
        assert np.array_equal(getattr(ours, name), to_numpy(getattr(theirs, name))), f"block_mask.{name}"


@given(case=flex_inputs(masks=MASKS[1:]))
@example(case=EDGE_CASES[2])
def test_mask_mod_runs_only_on_partial_tiles(case):
    """The tiled forward and backward call mask_mod only on partial tiles (full and empty ones
    need no mask), and every tile they call it on is partial: some position kept, some masked."""
    block_mask = numpy_block_mask(case)
    calls = []

    def spy(b, h, q_idx, kv_idx):
        keep = np.broadcast_to(block_mask.mask_mod(b, h, q_idx, kv_idx),
                               np.broadcast_shapes(b.shape, h.shape, q_idx.shape, kv_idx.shape))
        calls.append(keep)
        return keep
    spied = block_mask._replace(mask_mod=spy)
    score_mod = build_score(nf, case, case["param"])
    _, cache = nf.flex_attention_forward(case["q"], case["k"], case["v"], score_mod, spied,
                                         scale=case["scale"], enable_gqa=gqa(case))
    forward_calls = len(calls)
    nf.flex_attention_backward(case["dout"], cache)
    partial_tiles = int(block_mask.kv_num_blocks.sum())
    assert forward_calls == partial_tiles, f"mask_mod ran on {forward_calls} tiles, {partial_tiles} are partial"
    assert len(calls) == 2 * partial_tiles, "the backward visits other tiles than the forward"
    BQ, BK = block_mask.BLOCK_SIZE
    for keep in calls:
        # A tile cut short by the end of the sequence is partial by its padding; else it is mixed.
        whole = keep.shape[-2:] == (BQ, BK)
        assert keep.any(axis=(-2, -1)).all() and (not whole or not keep.all()), "mask_mod on a non-partial tile"


# -- finite differences (no torch) ----------------------------------------------------------------

@given(case=flex_inputs(dtype=np.float64, max_len=4, max_head=2, bound=1.0))
@example(case=EDGE_CASES[0])
@example(case=EDGE_CASES[3])
def test_backward_matches_finite_differences(case):
    """Every gradient, the score_mod's parameters included, against the five-point stencil of
    sum(out * dout) + sum(lse * dlse) over rows with a finite lse. Elements bounded by 1 (see
    test_flash_attention.py): it keeps the stencil's truncation error near 1e-12."""
    assert_matches_finite_differences(case)


def assert_matches_finite_differences(case):
    """Every gradient of the case (dsinks too, given sinks) against finite differences (float64)."""
    _, cache = numpy_forward(case)
    grads = numpy_grads(case, cache)
    dlse = np.zeros(cache.lse.shape) if case["dlse"] is None else case["dlse"]
    dlse = np.where(np.isneginf(cache.lse), 0, dlse)
    names = (["q", "k", "v"] + ([PARAMS[case["score"]]] if case["score"] in PARAMS else [])
             + (["sinks"] if case.get("sinks") is not None else []))

    def f(name):
        def loss(a):                            # a is the array numerical_grad moves in place
            change = {"param": a} if name in PARAMS.values() else {name: a}
            (out, lse), _ = numpy_forward(case, **change)
            return np.sum(out * case["dout"]) + np.sum(np.where(np.isneginf(lse), 0, lse) * dlse)
        return loss
    for name in names:
        a = (case["param"] if name in PARAMS.values() else case[name]).copy()
        expected = numerical_grad(f(name), a, np.ones(()))
        assert_close(f"flex.d{name} ({case['score']}) vs finite differences", grads[name], expected, **FD_TOL)


# -- learned attention sinks (gpt-oss): one more softmax column per query head, value 0 ---------------

@st.composite
def sink_inputs(draw, dtype=None, max_len=9, max_head=4, bound=4.0, sink_bound=8.0):
    """A flex_inputs case with sinks (Hq,), one per query head, up to 8: from nothing to nearly
    the whole row."""
    case = draw(flex_inputs(dtype=dtype, max_len=max_len, max_head=max_head, bound=bound))
    return {**case, "sinks": draw(S.arrays(case["q"].dtype, (case["q"].shape[1],), sink_bound), label="sinks")}


# EDGE_CASES[0]: bottom-right with L > S, rows 0 and 1 fully masked, dlse given: lse = s_h there,
# and dsinks takes dlse from them; a drawn per-head mask with a learned bias; L = S = 1.
SINK_EDGES = [{**EDGE_CASES[0], "sinks": np.array([1.5, -2.0])},
              {**EDGE_CASES[3], "sinks": np.array([0.25, 3.0])},
              {**EDGE_CASES[4], "sinks": np.array([-0.5])}]


def sink_tols(case):
    """grad_tols, and for dsinks: dsinks_h = -sum over R = B L rows of p (D - dlse), p <= 1 the
    sink's probability, |D - dlse| <= G (grad_tols' G); each term is off by a few ulps of G plus
    p's relative error, the ulps of its exponent s_h - m, |s_h - m| below max|s_h| + the largest
    score (with the bias, forward_tol's bound); R terms add R ulps. Hence 8 ulps of R G (1 + that)."""
    q, k, v, dout, dlse, sinks = (case[n] for n in ("q", "k", "v", "dout", "dlse", "sinks"))
    eps = float(np.finfo(q.dtype).eps)
    B, _, L, E = q.shape
    G = np.abs(dout).max() * np.abs(v).max() * v.shape[3] + (0 if dlse is None else np.abs(dlse).max())
    bias = np.abs(case["param"]).max() * max(L, k.shape[2]) if case["score"] in PARAMS else 0.0
    largest = _scale(case) * E * np.abs(q).max() * np.abs(k).max() + bias + np.abs(sinks).max()
    atol = max(TOLERANCES[q.dtype]["atol"], 8 * eps * B * L * G * (1 + largest))
    return {**grad_tols(case), "sinks": dict(atol=atol)}


@given(case=sink_inputs(), dense=st.booleans())
@example(case=SINK_EDGES[0], dense=False)
@example(case=SINK_EDGES[1], dense=True)
@example(case=SINK_EDGES[2], dense=False)
def test_sinks_match_twin_and_autograd(case, dense):
    """With sinks, the tiled and the dense path: out and lse equal the twin's; dq, dk, dv, the
    modifier's parameters and dsinks equal autograd's of sum(out dout) + sum(lse dlse)."""
    (out, lse), cache = numpy_forward(case, dense=dense)
    (out_t, lse_t), grads_t = twin_grads(case)
    out_tol, lse_tol = forward_tol(case)
    assert_close("flex[sinks].out", out, out_t, **out_tol)
    assert_close("flex[sinks].lse", lse, lse_t, **lse_tol)
    grads = numpy_grads(case, cache)
    assert grads.keys() == grads_t.keys(), f"gradients {sorted(grads)} != autograd's {sorted(grads_t)}"
    tols = sink_tols(case)
    for name, d in grads.items():
        assert_close(f"flex[sinks].d{name}", d, grads_t[name], **tols[name])


def direct_sinks(case, q, k, v, sinks=None, param=None):
    """The sink as defined, in plain torch: the twin's scores without a sink (its lse gives them
    back only masked; recomputed here), the sink column concatenated, softmax, dropped, times v.
    Without ``sinks``, plain flex attention, a fully masked row giving 0 (its softmax is NaN).
    ``param``: the score_mod's table or slopes as a tensor (the case's, without gradient, if None)."""
    B, Hq, L, E = q.shape
    k, v = (x.repeat_interleave(Hq // x.shape[1], dim=1) for x in (k, v))
    b, h, q_idx, kv_idx = (torch.arange(n).reshape(shape) for n, shape in
                           ((B, (B, 1, 1, 1)), (Hq, (1, Hq, 1, 1)), (L, (1, 1, L, 1)), (k.shape[2], (1, 1, 1, -1))))
    score = (q @ k.transpose(-2, -1)) * _scale(case)
    if param is None:
        param = to_torch(case["param"]) if case["score"] in PARAMS else case["param"]
    score_mod, mask_mod = build_score(tf, case, param), build_mask(tf, case)
    if score_mod is not None:
        score = score_mod(score, b, h, q_idx, kv_idx).to(q.dtype)
    if mask_mod is not None:
        score = torch.where(mask_mod(b, h, q_idx, kv_idx), score, -torch.inf)
    if sinks is None:
        weights = torch.softmax(score, dim=-1)
        return torch.where(torch.isnan(weights), 0, weights) @ v           # fully masked rows: 0
    column = sinks[:, None, None].expand(score.shape[:-1] + (1,))        # (Hq,) -> (B, Hq, L, 1)
    return torch.softmax(torch.cat([score, column], dim=-1), dim=-1)[..., :-1] @ v


@given(case=sink_inputs())
@example(case=SINK_EDGES[0])
def test_sinks_twin_matches_direct_and_builtin(case):
    """The twin's output and gradients (dsinks included) equal the sink column written out in
    torch; its output and lse equal torch.nn.attention.flex_attention's without a sink corrected
    for it: out * sigmoid(lse - s_h) and logaddexp(lse, s_h) (the sink only adds exp(s_h) to the
    denominator exp(lse)); fully masked rows give 0 and s_h in both."""
    inputs = {n: case[n] for n in ("q", "k", "v", "sinks")}
    out_d, grads_d = autograd(lambda **t: direct_sinks(case, **t), inputs, case["dout"])
    no_dlse = {**case, "dlse": None}
    (out_t, lse_t), grads_t = twin_grads(no_dlse)
    out_tol, lse_tol = forward_tol(case)
    assert_close("flex[sinks] twin.out vs direct", out_t, out_d, **out_tol)
    tols = sink_tols(no_dlse)
    for name in ("q", "k", "v", "sinks"):
        assert_close(f"flex[sinks] twin.d{name} vs direct", grads_t[name], grads_d[name], **tols[name])
    out_b, lse_b = (to_torch(a) for a in builtin_forward(case))
    s_h = to_torch(case["sinks"])[:, None]                                 # (Hq, 1)
    assert_close("flex[sinks] twin.out vs builtin", out_t,
                 to_numpy(out_b * torch.sigmoid(lse_b - s_h)[..., None]), **out_tol)
    assert_close("flex[sinks] twin.lse vs builtin", lse_t, to_numpy(torch.logaddexp(lse_b, s_h)), **lse_tol)


@given(case=sink_inputs(dtype=np.float64, max_len=4, max_head=2, bound=1.0, sink_bound=2.0))
@example(case=SINK_EDGES[0])
def test_sinks_backward_matches_finite_differences(case):
    """dsinks and every other gradient with sinks against finite differences, as above."""
    assert_matches_finite_differences(case)


@given(case=sink_inputs(dtype=np.float32))
@example(case={**SINK_EDGES[1], **{n: SINK_EDGES[1][n].astype(np.float32) for n in ("q", "k", "v", "dout", "sinks")},
               "param": SINK_EDGES[1]["param"].astype(np.float32), "dlse": None})
def test_sinks_float32_follow_the_fa4_rule(case):
    """dsinks and out of both paths in float32 against the float64 truth (the sink column
    written out, on the same inputs upcast exactly): within FlashAttention-4's rule of the twin's
    float32 error, plus the roundings the twin does not share (NumPy's exp, tanh and matmul):
    every probability off by 4 eps (1 + 2 |s|) relatively, |s| the largest score with its bias
    or sink (as test_flash_attention.py's test of the rule argues), times sum over the rows of
    |p D| for dsinks_h and max|v| for out."""
    case = {**case, "dlse": None}
    up = {n: case[n].astype(np.float64) for n in ("q", "k", "v", "dout", "sinks")}
    case64 = {**case, **up, "param": case["param"].astype(np.float64) if case["score"] in PARAMS else case["param"]}
    out_64, grads_64 = autograd(lambda **t: direct_sinks(case64, **t), {n: case64[n] for n in ("q", "k", "v", "sinks")},
                                case64["dout"])
    (out_t, _), grads_t = twin_grads(case)
    _, cache_64 = numpy_forward(case64)
    pD = np.abs(cache_64.sink_p * (case64["dout"] * cache_64.out).sum(axis=-1)).sum(axis=(0, 2))   # (Hq,)
    B, _, L, E = case["q"].shape
    bias = np.abs(case["param"]).max() * max(L, case["k"].shape[2]) if case["score"] in PARAMS else 0.0
    largest = max(_scale(case) * E * np.abs(case["q"]).max() * np.abs(case["k"]).max() + bias,
                  np.abs(case["sinks"]).max())
    relative = 4 * float(np.finfo(np.float32).eps) * (1 + 2 * float(largest))
    for dense in (False, True):
        (out, _), cache = numpy_forward(case, dense=dense)
        dsinks = numpy_grads(case, cache)["sinks"]
        assert_fa4_rule(f"flex[sinks] dense={dense}.dsinks float32", dsinks, grads_t["sinks"], grads_64["sinks"],
                        extra=relative * pD)
        assert_fa4_rule(f"flex[sinks] dense={dense}.out float32", out, out_t, out_64,
                        extra=relative * float(np.abs(case["v"]).max()))


def test_sinks_fully_masked_rows_give_zeros():
    """A fully masked row (bottom-right, L > S) holds its sink alone: output 0 (not NaN), lse =
    s_h, no gradient to q; dsinks then gets dlse from it (d lse / d s_h = p = 1), and a row that
    sees keys sums its weights to 1 - p."""
    case = SINK_EDGES[0]
    for dense in (False, True):
        (out, lse), cache = numpy_forward(case, dense=dense)
        grads = numpy_grads(case, cache)
        assert np.all(out[:, :, :2] == 0) and np.all(grads["q"][:, :, :2] == 0), f"flex[sinks] dense={dense}"
        assert_close("flex[sinks].lse of fully masked rows", lse[:, :, :2],
                     np.broadcast_to(case["sinks"][None, :, None], lse[:, :, :2].shape))
        without = nf.flex_attention_backward(case["dout"], cache, dlse=np.where(np.arange(5) < 2, 0, case["dlse"]))
        assert_close("flex[sinks].dsinks from fully masked rows", grads["sinks"] - without[4],
                     case["dlse"][..., :2].sum(axis=(0, 2)))
        (out_1, lse_1), _ = numpy_forward({**case, "v": np.ones_like(case["v"])}, dense=dense)
        assert_close("flex[sinks] weights sum to 1 - p", out_1[..., 2:, 0],
                     1 - np.exp(case["sinks"][None, :, None] - lse_1[..., 2:]))


BAD_SINKS = [   # (sinks, error, what the message must say)
    (np.zeros(2), ValueError, "flex_attention: sinks must have shape (nh,) = (4,), one per query head "
                              "(q (2, 4, 3, 8)), got shape (2,)"),
    (np.zeros(4, np.float32), TypeError, "flex_attention: sinks must have q's dtype float64, got dtype float32"),
    ((0.0,) * 4, TypeError, "flex_attention: sinks must be a NumPy array (nh,) or None, got tuple"),
    (np.array([0, 0, 0, -np.inf]), ValueError,
     "flex_attention: sinks must be finite, got array([  0.,   0.,   0., -inf])"),
]


@pytest.mark.parametrize("forward", [nf.flex_attention_forward, nf.dense_flex_attention_forward])
@pytest.mark.parametrize("sinks, error, message", BAD_SINKS)
def test_bad_sinks_are_refused(forward, sinks, error, message):
    with pytest.raises(error, match=re.escape(message)):
        forward(Q, K, V, enable_gqa=True, sinks=sinks)


# -- properties ---------------------------------------------------------------------------------

@given(case=flex_inputs(masks=("sliding_window",), scores=("none", "alibi", "soft_cap")))
def test_sliding_window_row_sees_only_its_window(case):
    """Row t equals attention of query t over keys t - window + 1 .. t alone: keys outside the
    window, and later queries, have no influence (ALiBi and soft-capping act per score)."""
    (out, lse), _ = numpy_forward(case)
    w, S_ = case["mask_arg"], case["k"].shape[2]
    rows, row_lses = np.zeros_like(out), np.full_like(lse, -np.inf)   # rows with no key: 0, -inf
    score_mod = build_score(nf, case, case["param"])
    for t in range(case["q"].shape[2]):
        lo, hi = max(0, t - w + 1), min(t + 1, S_)
        if lo >= hi:
            continue
        qs, ks, vs = case["q"][..., t:t + 1, :], case["k"][..., lo:hi, :], case["v"][..., lo:hi, :]
        # The window's scores with their true positions: q_idx and kv_idx shifted by t and lo.
        shifted = None if score_mod is None else (
            lambda s, b, h, qi, ki, t=t, lo=lo: score_mod(s, b, h, qi + t, ki + lo))
        (row, row_lse), _ = nf.dense_flex_attention_forward(qs, ks, vs, shifted, scale=case["scale"],
                                                            enable_gqa=gqa(case), return_lse=True)
        rows[..., t:t + 1, :], row_lses[..., t:t + 1] = row, row_lse
    out_tol, lse_tol = forward_tol(case)
    assert_close("flex.out sliding window vs rows alone", out, rows, **out_tol)
    assert_close("flex.lse sliding window vs rows alone", lse, row_lses, **lse_tol)


def test_fraction_skipped_counts_empty_tiles():
    """Causal at 8 x 8 with blocks of 2: 6 of 16 tiles above the diagonal are empty, 4 on it
    partial, 6 below it full."""
    block_mask = nf.create_block_mask(nf.causal, None, None, 8, 8, BLOCK_SIZE=2)
    kinds = block_mask.blocks()[0, 0]
    assert np.array_equal(kinds, np.tril(np.ones((4, 4), np.int8), -1) * 2 + np.eye(4, dtype=np.int8))
    assert block_mask.fraction_skipped() == 6 / 16


@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
@pytest.mark.parametrize("score", SCORES)
def test_dtype_is_preserved(dtype, score):
    """float32 stays float32 with every modifier, even with ALiBi's float64 slopes."""
    param = {"alibi": nf.alibi_slopes(2), "relative_position_bias": ramp(2, 9, dtype=dtype),
             "learned_bias": ramp(2, 5, 4, dtype=dtype), "soft_cap": 2.0}.get(score)
    case = make_case(2, 2, 1, 5, 4, 3, 2, "causal", score=score, param=param, dtype=dtype, dlse=True)
    for dense in (False, True):
        (out, lse), cache = numpy_forward(case, dense=dense)
        for name, a in [("out", out), ("lse", lse), *numpy_grads(case, cache).items()]:
            expected = param.dtype if name in ("slopes", "table") else dtype
            assert a.dtype == expected, f"flex.{name} dtype {a.dtype}, dense={dense}"


# -- bad input --------------------------------------------------------------------------------------

Q, K, V = (np.zeros(shape) for shape in ((2, 4, 3, 8), (2, 2, 5, 8), (2, 2, 5, 6)))
CAUSAL = nf.create_block_mask(nf.causal, None, None, 3, 5)
BAD_INPUTS = [   # (q, k, v, keyword arguments), the error, and what its message must say
    ((Q, K, V, {}), ValueError, "q has 4 heads and k, v 2: pass enable_gqa=True"),
    ((Q, np.zeros((2, 3, 5, 8)), np.zeros((2, 3, 5, 6)), dict(enable_gqa=True)), ValueError,
     "q's 4 heads are not a multiple of k's 3"),
    ((Q, np.zeros((2, 2, 5, 7)), V, dict(enable_gqa=True)), ValueError, r"do not fit: .*k \(2, 2, 5, 7\)"),
    ((Q, K, np.zeros((2, 2, 4, 6)), dict(enable_gqa=True)), ValueError, r"do not fit: .*v \(2, 2, 4, 6\)"),
    ((Q[0], K, V, {}), ValueError, r"q must have 4 dimensions, got shape \(4, 3, 8\)"),
    ((Q.astype(np.float32), K, V, {}), TypeError, "must share one dtype"),
    ((Q.astype(np.int64), K, V, {}), TypeError, "float32 or float64"),
    ((Q, K, V, dict(enable_gqa=True, score_mod=3)), TypeError, "score_mod must be callable"),
    ((Q, K, V, dict(enable_gqa=True, block_mask=np.ones((3, 5), bool))), TypeError,
     "block_mask must be a BlockMask"),
    ((Q, K, V, dict(enable_gqa=True, block_mask=nf.create_block_mask(nf.causal, None, None, 5, 5))),
     ValueError, r"made for \(Q_LEN, KV_LEN\) = \(5, 5\), the inputs have \(3, 5\)"),
    ((Q, K, V, dict(enable_gqa=True, block_mask=nf.create_block_mask(nf.causal, 3, None, 3, 5))),
     ValueError, r"block_mask's \(B, H\) = \(3, 1\)"),
    ((Q, K, V, dict(enable_gqa=True, scale=float("nan"))), ValueError, "scale must be a finite number"),
]


@pytest.mark.parametrize("forward", [nf.flex_attention_forward, nf.dense_flex_attention_forward])
@pytest.mark.parametrize("args, error, message", BAD_INPUTS)
def test_bad_input(forward, args, error, message):
    *arrays, kwargs = args
    with pytest.raises(error, match=message):
        forward(*arrays, **kwargs)


@pytest.mark.parametrize("forward", [nf.flex_attention_forward, nf.dense_flex_attention_forward])
@pytest.mark.parametrize("scale", [np.float32(0.5), np.float64(0.5), np.int64(1)])
def test_numpy_scalar_scales_are_taken(forward, scale):
    """A NumPy scalar scale (what q.dtype.type or a NumPy sum gives) works as the Python number,
    as torch's flex_attention takes it."""
    q, k, v = ramp(1, 2, 3, 4), ramp(1, 2, 5, 4), ramp(1, 2, 5, 2)
    out, _ = forward(q, k, v, block_mask=nf.create_block_mask(nf.causal, None, None, 3, 5), scale=scale)
    expected, _ = forward(q, k, v, block_mask=nf.create_block_mask(nf.causal, None, None, 3, 5),
                          scale=float(scale))
    assert np.array_equal(out, expected), f"flex.out with scale {scale!r}"


@pytest.mark.parametrize("scale, error", [(float("inf"), ValueError), (-float("inf"), ValueError),
                                          ("0.5", TypeError), (True, TypeError)])
def test_bad_scale_is_refused(scale, error):
    with pytest.raises(error, match=r"flex_attention: scale must be a finite number or None, got "):
        nf.flex_attention_forward(Q, K, V, enable_gqa=True, scale=scale)


@pytest.mark.parametrize("kwargs, message", [
    (dict(Q_LEN=0, KV_LEN=4), "Q_LEN must be a positive int, got 0"),
    (dict(Q_LEN=4, KV_LEN=4, BLOCK_SIZE=(2, 0)), r"BLOCK_SIZE must be a positive int or a pair"),
    (dict(Q_LEN=4, KV_LEN=4, B=-1), "B must be a positive int or None, got -1"),
])
def test_bad_block_mask_arguments(kwargs, message):
    args = {"B": None, "H": None, **kwargs}
    with pytest.raises(ValueError, match=message):
        nf.create_block_mask(nf.causal, args.pop("B"), args.pop("H"), args.pop("Q_LEN"),
                             args.pop("KV_LEN"), **args)


@pytest.mark.parametrize("dout, dlse, error, message", [
    (np.zeros((2, 4, 3, 5)), None, ValueError, r"dout must have the shape of the forward's output, \(2, 4, 3, 6\)"),
    (np.zeros((2, 4, 3, 6), np.float32), None, TypeError, "dout must have the dtype"),
    (np.zeros((2, 4, 3, 6)), np.zeros((2, 4, 3, 1)), ValueError, "dlse must have the shape"),
])
def test_bad_dout(dout, dlse, error, message):
    _, cache = nf.flex_attention_forward(Q, K, V, block_mask=CAUSAL, enable_gqa=True)
    with pytest.raises(error, match=message):
        nf.flex_attention_backward(dout, cache, dlse=dlse)


def test_score_mod_without_derivative_is_refused_by_the_backward():
    """A plain function works forward, and equals its ScoreMod; the backward names it and says
    how to declare its derivative, rather than returning a gradient that ignores it."""
    def double(score, b, h, q_idx, kv_idx):
        return 2 * score
    declared = nf.ScoreMod(double, lambda score, b, h, q_idx, kv_idx: np.full((), 2.0))
    out, cache = nf.flex_attention_forward(Q, K + 1, V, double, CAUSAL, enable_gqa=True)
    out_d, cache_d = nf.flex_attention_forward(Q, K + 1, V, declared, CAUSAL, enable_gqa=True)
    assert_close("flex.out plain vs declared score_mod", out, out_d)
    with pytest.raises(TypeError, match="score_mod 'double' declares no derivative; wrap it as ScoreMod"):
        nf.flex_attention_backward(np.ones_like(out), cache)
    dq, _, _, dparams = nf.flex_attention_backward(ramp(*out.shape), cache_d)
    assert dq.shape == Q.shape and dparams == {}


def test_twin_lines_pair_with_numpy_lines():
    """numpy-attn show sets the twins side by side: at least 85% of the torch twin's non-blank
    lines pair with a NumPy line (the NumPy file adds the tiled path and the backward)."""
    from pathlib import Path

    from attn_cli import show

    numpy_lines = Path(nf.__file__).read_text(encoding="utf-8").splitlines()
    torch_lines = Path(tf.__file__).read_text(encoding="utf-8").splitlines()
    rows = show.align(numpy_lines, torch_lines)
    twin = [n for n, t, _ in rows if t is not None and torch_lines[t].strip()]
    share = sum(n is not None for n in twin) / len(twin)
    assert share >= 0.85, f"only {share:.0%} of torch_attn/flex_attention.py pairs with NumPy lines"


# -- hostile user functions -----------------------------------------------------------------------
# Every function the flex API takes from its user, by the parameter or field that takes it, and
# what it returns in each case: refused (the exception, and the words that follow the function's
# name in the message; ``checks`` says which of the result's kind, dtype or shape is at fault) or
# taken (error None: its results equal those of ``same``, a proper function). A new parameter that
# takes a function fails test_every_user_function_has_cases until it has cases here.

HB, HH, HL, HS = 2, 2, 3, 5                                     # B, H, L, S of the hostile cases
HQ, HK, HV = ramp(HB, HH, HL, 4), ramp(HB, HH, HS, 4) * 0.7, ramp(HB, HH, HS, 3) * 1.3
HDOUT = ramp(HB, HH, HL, 3) * 0.5
HTABLE = ramp(HH, HL, HS)                                       # learned_bias's table (H, L, S)


class Hostile(NamedTuple):
    boundary: str           # the parameter or field that takes the function
    label: str
    returns: Callable       # called with the boundary's arguments: what the function returns
    checks: str             # "kind", "dtype" or "shape" at fault; "taken" if it is accepted
    error: type | None = None
    message: str = ""
    same: Callable | None = None


def _mask_cases(boundary):
    """mask_mod(b, h, q_idx, kv_idx) -> bool, True where a query may attend."""
    return [
        Hostile(boundary, "additive float mask", lambda b, h, q, kv: np.where(q >= kv, 0.0, -np.inf), "dtype",
                TypeError, "returned dtype float64; it must return bool"),
        Hostile(boundary, "0/1 integers", lambda b, h, q, kv: (q >= kv).astype(np.int64), "dtype",
                TypeError, "returned dtype int64; it must return bool"),
        Hostile(boundary, "bools in an object array", lambda b, h, q, kv: (q >= kv).astype(object), "dtype",
                TypeError, "returned dtype object"),
        Hostile(boundary, "a Python float", lambda b, h, q, kv: 1.0, "kind", TypeError, "returned float; it must"),
        Hostile(boundary, "nothing (no return)", lambda b, h, q, kv: None, "kind", TypeError, "returned NoneType"),
        Hostile(boundary, "a list", lambda b, h, q, kv: (q >= kv).tolist(), "kind", TypeError, "returned list"),
        Hostile(boundary, "a torch tensor", lambda b, h, q, kv: torch.from_numpy(np.asarray(q >= kv)), "kind",
                TypeError, "returned Tensor"),
        Hostile(boundary, "an extra leading axis", lambda b, h, q, kv: np.stack([q >= kv, q >= kv]), "shape",
                ValueError, r"returned shape \(2, 1, 1, \d+, \d+\), which does not broadcast"),
        Hostile(boundary, "one key too many", lambda b, h, q, kv: np.ones(kv.shape[-1] + 1, bool), "shape",
                ValueError, r"returned shape \(\d+,\), which does not broadcast"),
        Hostile(boundary, "a Python bool", lambda b, h, q, kv: True, "taken",
                same=lambda b, h, q, kv: np.ones((1, 1, 1, 1), bool)),
        Hostile(boundary, "a NumPy bool", lambda b, h, q, kv: np.bool_(True), "taken",
                same=lambda b, h, q, kv: np.ones((1, 1, 1, 1), bool)),
        Hostile(boundary, "fewer axes than the scores", lambda b, h, q, kv: (q >= kv)[0, 0], "taken",
                same=lambda b, h, q, kv: q >= kv),
    ]


def _score_cases(boundary):
    """score_mod(score, b, h, q_idx, kv_idx) -> the new score (dscore: its derivative)."""
    return [
        Hostile(boundary, "a Python float", lambda s, b, h, q, kv: 1.5, "kind", TypeError, "returned float; it must"),
        Hostile(boundary, "a Python int", lambda s, b, h, q, kv: 2, "kind", TypeError, "returned int; it must"),
        Hostile(boundary, "nothing (no return)", lambda s, b, h, q, kv: None, "kind", TypeError, "returned NoneType"),
        Hostile(boundary, "a list", lambda s, b, h, q, kv: s.tolist(), "kind", TypeError, "returned list"),
        Hostile(boundary, "a torch tensor", lambda s, b, h, q, kv: torch.from_numpy(s), "kind", TypeError,
                "returned Tensor"),
        Hostile(boundary, "complex numbers", lambda s, b, h, q, kv: s.astype(np.complex128), "dtype", TypeError,
                "returned dtype complex128; it must return real numbers"),
        Hostile(boundary, "an object array", lambda s, b, h, q, kv: s.astype(object), "dtype", TypeError,
                "returned dtype object"),
        Hostile(boundary, "strings", lambda s, b, h, q, kv: s.astype(str), "dtype", TypeError, "returned dtype <U"),
        Hostile(boundary, "an extra leading axis", lambda s, b, h, q, kv: np.stack([s, s]), "shape", ValueError,
                r"returned shape \(2, \d+, \d+, \d+, \d+\), which does not broadcast"),
        Hostile(boundary, "one key too many", lambda s, b, h, q, kv: np.concatenate([s, s[..., :1]], axis=-1),
                "shape", ValueError, r"returned shape \(\d+, \d+, \d+, \d+\), which does not broadcast"),
        Hostile(boundary, "transposed", lambda s, b, h, q, kv: np.swapaxes(s, -1, -2), "shape", ValueError,
                "which does not broadcast to the scores' shape"),
        Hostile(boundary, "integers", lambda s, b, h, q, kv: s.astype(np.int64) + (kv - q), "taken",
                same=lambda s, b, h, q, kv: (s.astype(np.int64) + (kv - q)).astype(s.dtype)),
        Hostile(boundary, "bools", lambda s, b, h, q, kv: q >= kv, "taken",
                same=lambda s, b, h, q, kv: np.broadcast_to((q >= kv).astype(s.dtype), s.shape)),
        Hostile(boundary, "a NumPy scalar", lambda s, b, h, q, kv: np.float64(0.5), "taken",
                same=lambda s, b, h, q, kv: np.full_like(s, 0.5)),
        Hostile(boundary, "float32 for float64 scores", lambda s, b, h, q, kv: (2 * s).astype(np.float32), "taken",
                same=lambda s, b, h, q, kv: (2 * s).astype(np.float32).astype(s.dtype)),
    ]


def _learned_bias_grad(grad, s, b, h, q, kv):
    return {"table": nf._scatter_add(HTABLE, (h, q, kv), grad)}


DPARAMS_CASES = [   # dparams(grad, score, b, h, q_idx, kv_idx) -> {name: gradient}, params {"table": (H, L, S)}
    Hostile("dparams", "nothing (no return)", lambda *a: None, "kind", TypeError,
            "returned NoneType; it must return a dict"),
    Hostile("dparams", "a bare array", lambda *a: np.zeros(HTABLE.shape), "kind", TypeError, "returned ndarray"),
    Hostile("dparams", "a list of pairs", lambda *a: [("table", np.zeros(HTABLE.shape))], "kind", TypeError,
            "returned list"),
    Hostile("dparams", "a Python float", lambda *a: {"table": 0.0}, "kind", TypeError, "returned float for 'table'"),
    Hostile("dparams", "no gradients", lambda *a: {}, "kind", ValueError,
            r"returned gradients of \[\]; its params are \['table'\]"),
    Hostile("dparams", "a misspelt name", lambda *a: {"tabel": np.zeros(HTABLE.shape)}, "kind", ValueError,
            r"returned gradients of \['tabel'\]"),
    Hostile("dparams", "an extra name", lambda *a: {"table": np.zeros(HTABLE.shape), "bias": np.zeros(2)}, "kind",
            ValueError, r"returned gradients of \['bias', 'table'\]"),
    Hostile("dparams", "integers", lambda *a: {"table": np.zeros(HTABLE.shape, np.int64)}, "dtype", TypeError,
            "returned dtype int64 for 'table'"),
    Hostile("dparams", "complex numbers", lambda *a: {"table": np.zeros(HTABLE.shape, complex)}, "dtype", TypeError,
            "returned dtype complex128 for 'table'"),
    Hostile("dparams", "a row short", lambda *a: {"table": np.zeros(HTABLE.shape[1:])}, "shape", ValueError,
            r"returned shape \(3, 5\) for 'table', whose shape is \(2, 3, 5\)"),
    Hostile("dparams", "an extra axis", lambda *a: {"table": np.zeros((2,) + HTABLE.shape)}, "shape", ValueError,
            r"returned shape \(2, 2, 3, 5\) for 'table'"),
    Hostile("dparams", "float32 for a float64 table", lambda *a: {k: g.astype(np.float32) for k, g in
                                                                   _learned_bias_grad(*a).items()}, "taken",
            same=lambda *a: {k: g.astype(np.float32).astype(np.float64) for k, g in _learned_bias_grad(*a).items()}),
]

HOSTILE = [*_mask_cases("mask_mod"), *_mask_cases("mask_mods"), *_score_cases("score_mod"),
           *_score_cases("fn"), *_score_cases("dscore"), *DPARAMS_CASES]


def _named(label, body):
    """``body`` under a name of its own, which the refusal must quote."""
    def fn(*args):
        return body(*args)
    fn.__name__ = "hostile_" + "_".join(label.replace("/", " ").replace("(", "").replace(")", "").split())
    return fn


def _identity(s, b, h, q, kv):
    return s + HTABLE[h, q, kv]


def _runs(boundary, fn):
    """[(entry point, a call that passes ``fn`` there and returns its results)] for ``boundary``."""
    causal = nf.create_block_mask(nf.causal, None, None, HL, HS, BLOCK_SIZE=2)   # partial tiles on the diagonal
    tiled = lambda score_mod=None, block_mask=causal: nf.flex_attention_forward(   # noqa: E731
        HQ, HK, HV, score_mod, block_mask)
    dense = lambda score_mod=None, block_mask=causal: nf.dense_flex_attention_forward(   # noqa: E731
        HQ, HK, HV, score_mod, block_mask)

    def backward(forward, score_mod):
        _, cache = forward(score_mod)
        dq, dk, dv, dparams = nf.flex_attention_backward(HDOUT, cache)
        return dq, dk, dv, *dparams.values()

    def mask_backward():
        _, cache = tiled()
        return nf.flex_attention_backward(HDOUT, cache._replace(block_mask=causal._replace(mask_mod=fn)))[0]

    blocks = lambda mask_mod: nf.create_block_mask(mask_mod, None, None, HL, HS, BLOCK_SIZE=2).blocks()   # noqa: E731
    return {
        "mask_mod": [("create_block_mask", lambda: blocks(fn)),
                     ("flex_attention_forward", lambda: tiled(block_mask=causal._replace(mask_mod=fn))[0]),
                     ("dense_flex_attention_forward", lambda: dense(block_mask=causal._replace(mask_mod=fn))[0]),
                     ("flex_attention_backward", mask_backward)],
        "mask_mods": [("and_masks", lambda: blocks(nf.and_masks(fn, nf.causal))),
                      ("or_masks", lambda: blocks(nf.or_masks(fn)))],
        "score_mod": [("flex_attention_forward", lambda: tiled(fn)[0]),
                      ("dense_flex_attention_forward", lambda: dense(fn)[0])],
        "fn": [("flex_attention_forward", lambda: tiled(nf.ScoreMod(fn, nf._one))[0]),
               ("dense_flex_attention_forward", lambda: dense(nf.ScoreMod(fn, nf._one))[0])],
        "dscore": [("flex_attention_backward, tiled", lambda: backward(tiled, nf.ScoreMod(_identity, fn))),
                   ("flex_attention_backward, dense", lambda: backward(dense, nf.ScoreMod(_identity, fn)))],
        "dparams": [(f"flex_attention_backward, {name}",
                     lambda forward=forward: backward(forward, nf.ScoreMod(_identity, nf._one, fn, {"table": HTABLE})))
                    for name, forward in (("tiled", tiled), ("dense", dense))],
    }[boundary]


@pytest.mark.parametrize("case", HOSTILE, ids=lambda c: f"{c.boundary}: {c.label}")
def test_hostile_user_function(case):
    """Every entry point that calls the function refuses what it returned, naming the function
    and what was wrong, or takes it and gives what a proper function gives."""
    fn = _named(case.label, case.returns)
    if case.error is None:
        proper = _runs(case.boundary, _named("proper", case.same))
        for (entry, run), (_, run_proper) in zip(_runs(case.boundary, fn), proper, strict=True):
            got, expected = run(), run_proper()
            for i, (a, e) in enumerate(zip(np.atleast_1d(got) if isinstance(got, np.ndarray) else got,
                                           np.atleast_1d(expected) if isinstance(expected, np.ndarray) else expected,
                                           strict=True)):
                assert np.array_equal(a, e), f"{case.boundary} {case.label!r} through {entry}: result {i} differs"
        return
    for entry, run in _runs(case.boundary, fn):
        with pytest.raises(case.error) as info:
            run()
        message = str(info.value)
        assert f"'{fn.__name__}'" in message, f"{entry}: the message does not name the function: {message}"
        assert re.search(case.message, message), f"{entry}: {message!r} does not say {case.message!r}"


def user_function_parameters():
    """Every parameter (of a public function) or field (of a public NamedTuple) of
    numpy_attn/flex_attention.py that takes a function: annotated Callable, or named as the
    modifiers are (``..._mod``, ``..._mods``)."""
    found = set()
    for name, obj in vars(nf).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != nf.__name__ or not callable(obj):
            continue
        if isinstance(obj, type) and hasattr(obj, "_fields"):
            params = {field: obj.__annotations__.get(field) for field in obj._fields}
        elif isinstance(obj, type):
            continue
        else:
            params = {p.name: p.annotation for p in inspect.signature(obj).parameters.values()}
        found |= {p for p, annotation in params.items() if "Callable" in str(annotation) or re.search(r"_mods?$", p)}
    return found


def test_every_user_function_has_cases():
    """The table covers exactly the API's function-taking parameters, and for each the kind, the
    dtype and the shape of what it returns, refused, and at least one accepted return."""
    boundaries = {case.boundary for case in HOSTILE}
    assert user_function_parameters() == boundaries, (
        f"function-taking parameters without hostile cases: {sorted(user_function_parameters() - boundaries)}; "
        f"cases for no such parameter: {sorted(boundaries - user_function_parameters())}")
    for boundary in boundaries:
        checks = {case.checks for case in HOSTILE if case.boundary == boundary}
        assert checks == {"kind", "dtype", "shape", "taken"}, f"{boundary}: only {sorted(checks)} tried"


@pytest.mark.parametrize("run", [
    lambda mod: nf.create_block_mask(mod, None, None, 9, 9),
    lambda mod: nf.dense_flex_attention_forward(ramp(1, 1, 9, 2), ramp(1, 1, 9, 2), ramp(1, 1, 9, 2),
                                                block_mask=nf._one_tile(9, 9, mod)),
], ids=["create_block_mask", "dense_flex_attention_forward"])
def test_document_shorter_than_the_sequence_is_refused(run):
    """Lengths [2, 3] cover 5 positions; asked about 9 the mask would index past its table."""
    with pytest.raises(ValueError, match=r"document: seq_lengths \[2, 3\] cover 5 positions, but the mask is "
                                         r"asked about position 8"):
        run(nf.document([2, 3]))


@pytest.mark.parametrize("lengths", [[2, -1], [[2, 3]], [2.5, 3]])
def test_bad_document_lengths_are_refused(lengths):
    with pytest.raises(ValueError, match="document: seq_lengths must be a list of non-negative integers"):
        nf.document(lengths)


# -- float16 and bfloat16: FlashAttention's error rule ---------------------------------------------

@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@given(case=flex_inputs(dtype=np.float64) | sink_inputs(dtype=np.float64))
@example(case=EDGE_CASES[0])
@example(case=EDGE_CASES[3])
@example(case=SINK_EDGES[1])
def test_low_precision_meets_the_error_budget(dtype, case):
    """The tiled and dense paths and the twin in float16 and bfloat16 against the float64 truth
    on the same rounded inputs (direct_sinks, autograd): within twice PyTorch's own low-precision
    error, out and every gradient (the table's and slopes' too). PyTorch's out is
    torch.nn.attention.flex_attention run eagerly in the low dtype (CPU, forward only; its scores
    float32, its output rounded once) where there is no sink; its gradients, and out with sinks,
    are direct_sinks' plain torch ops in the low dtype, each rounding as a user's code would."""
    case = {"sinks": None, **case, "dlse": None}
    pname = PARAMS.get(case["score"])
    names = ("q", "k", "v") + ((pname,) if pname else ()) + (("sinks",) if case["sinks"] is not None else ())
    arrays = {n: case["param"] if n == pname else case[n] for n in names}
    low = {n: round_to(a, dtype) for n, a in arrays.items()}          # the inputs every side shares
    lcase = {**case, **{n: a for n, a in low.items() if n != pname}, "dout": round_to(case["dout"], dtype),
             "param": low[pname] if pname else case["param"]}

    def formula(q, k, v, sinks=None, **param):
        return direct_sinks(lcase, q, k, v, sinks, param.get(pname))
    truth_out, truth_grads = autograd(formula, {n: a.astype(np.float64) for n, a in low.items()},
                                      lcase["dout"].astype(np.float64))
    torch_out, torch_grads = autograd(formula, low, lcase["dout"])
    if case["sinks"] is None:
        torch_out = builtin_forward(lcase)[0]
    ours = {"twin": twin_grads(lcase)}
    for dense in (False, True):
        (out, lse), cache = numpy_forward(lcase, dense=dense)
        assert lse.dtype == np.float32, f"flex lse ({dtype}) came back {lse.dtype}, not float32"
        ours["dense" if dense else "numpy"] = ((out, lse), numpy_grads(lcase, cache))
    # The float32 analysis of test_flash_attention.py, with the bias in the largest score and
    # grad_tols' analysis for a table or slopes (8 float32 ulps of what they sum).
    eps = float(np.finfo(np.float32).eps)
    extra = float32_allowance({**lcase, "sinks": None if case["sinks"] is None else low["sinks"],
                               "q": low["q"].astype(np.float64), "k": low["k"].astype(np.float64)})
    if pname:
        B, Hq, L, _ = case["q"].shape
        G = float(np.abs(lcase["dout"]).max()) * float(np.abs(low["v"]).max()) * case["v"].shape[3]
        extra[f"d{pname}"] = 8 * eps * B * Hq * L * G * (max(L, case["k"].shape[2]) if pname == "slopes" else 1)
    for who, ((out, _), grads) in ours.items():
        tensors = {"out": (out, torch_out, truth_out)}
        tensors.update({f"d{n}": (grads[n], torch_grads[n], truth_grads[n]) for n in names})
        assert_error_budget(f"flex_attention[{who}]", dtype, tensors, extra=extra)


@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_low_precision_mixed_dtypes_are_refused(dtype):
    """A low-precision q with float32 k and v, or a float32 dout, is refused, as a float32/float64 mix."""
    low = LOW_DTYPES[dtype][0]
    q, k, v = (ramp(1, 2, 3, 4).astype(low), ramp(1, 2, 5, 4).astype(np.float32), ramp(1, 2, 5, 4).astype(np.float32))
    for forward in (nf.flex_attention_forward, nf.dense_flex_attention_forward):
        with pytest.raises(TypeError, match=f"must share one dtype: q is {dtype}, k is float32"):
            forward(q, k, v)
        _, cache = forward(q, k.astype(low), v.astype(low))
        with pytest.raises(TypeError, match=f"dout must have the dtype of the forward's output, {dtype}, got float32"):
            nf.flex_attention_backward(np.zeros((1, 2, 3, 4), np.float32), cache)


def test_scale_and_cap_lost_in_float32_are_refused():
    """scale = 1e300 is inf in float32 (every score inf or NaN), 1e-50 is 0 there; soft_cap does
    not know the scores' dtype and refuses a c that float32, the narrowest computed in, loses."""
    q = S.ramp(1, 2, 3, 4).astype(np.float32)
    for value, what in ((1e300, "overflows to inf"), (1e-50, "underflows to 0")):
        tail = rf"in float32, the dtype it is computed in: %s = {re.escape(repr(value))} {what}$"
        with pytest.raises(ValueError, match=r"^flex_attention: scale must be finite .* " + tail % "scale"):
            nf.flex_attention_forward(q, q, q, scale=value)
        with pytest.raises(ValueError, match=r"^softcap must be finite .* " + tail % "softcap"):
            nf.soft_cap(value)
    out, _ = nf.flex_attention_forward(q.astype(np.float64), q.astype(np.float64), q.astype(np.float64), scale=1e-50)
    assert np.isfinite(out).all(), "float64 holds scale = 1e-50"


def test_alibi_slopes_are_the_papers():
    """ALiBi's slopes (Press et al., 2022): for 8 heads 1/2, 1/4, ..., 1/256, exact in float64; for
    n heads a geometric sequence from 2^(-8/n) to 2^-8, as transformers' Bloom builds them (in
    float32 there, hence its tolerance: a few roundings of float32, 6e-8 each)."""
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    assert np.array_equal(nf.alibi_slopes(8), 0.5 ** np.arange(1, 9))
    for n in (1, 2, 4, 16, 32):
        bloom = build_alibi_tensor(torch.ones(1, 2), n, torch.float32)[:, 0, 1].double().numpy()   # slope x 1
        np.testing.assert_allclose(nf.alibi_slopes(n), bloom, rtol=1e-6, err_msg=f"{n} heads")
