"""Parity tests for numpy_attn/flex_attention.py and torch_attn/flex_attention.py.

torch.nn.attention.flex_attention runs on the CPU in eager mode for the forward only (torch 2.13
refuses a backward on the CPU: "FlexAttention does not support backward on CPU"), so the built-in
checks outputs and lse; the gradients are checked against the twin's autograd, against
F.scaled_dot_product_attention with the equivalent boolean mask, and against finite differences.
"""

import math
import warnings

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
from parity_tests.helpers import (
    FD_TOL,
    TOLERANCES,
    assert_close,
    numerical_grad,
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
                   scale=c["scale"], enable_gqa=gqa(c), return_lse=True)


def numpy_grads(case, cache):
    """{"q", "k", "v", and the score_mod's parameter name}: the hand-written gradients."""
    dq, dk, dv, dparams = nf.flex_attention_backward(case["dout"], cache, dlse=case["dlse"])
    return {"q": dq, "k": dk, "v": dv, **dparams}


def twin_grads(case):
    """((out, lse), grads) of the twin: autograd of sum(out * dout) + sum(lse * dlse)."""
    t = {n: to_torch(case[n], requires_grad=True) for n in ("q", "k", "v")}
    param = case["param"]
    if case["score"] in PARAMS:
        param = t[PARAMS[case["score"]]] = to_torch(param, requires_grad=True)
    out, lse = tf.flex_attention(t["q"], t["k"], t["v"], build_score(tf, case, param),
                                 torch_block_mask(case), scale=case["scale"], enable_gqa=gqa(case),
                                 return_lse=True)
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
    _, cache = numpy_forward(case)
    grads = numpy_grads(case, cache)
    dlse = np.zeros(cache.lse.shape) if case["dlse"] is None else case["dlse"]
    dlse = np.where(np.isneginf(cache.lse), 0, dlse)
    names = ["q", "k", "v"] + ([PARAMS[case["score"]]] if case["score"] in PARAMS else [])

    def f(name):
        def loss(a):                            # a is the array numerical_grad moves in place
            (out, lse), _ = numpy_forward(case, **({"param": a} if name not in "qkv" else {name: a}))
            return np.sum(out * case["dout"]) + np.sum(np.where(np.isneginf(lse), 0, lse) * dlse)
        return loss
    for name in names:
        a = (case["param"] if name not in "qkv" else case[name]).copy()
        expected = numerical_grad(f(name), a, np.ones(()))
        assert_close(f"flex.d{name} ({case['score']}) vs finite differences", grads[name], expected, **FD_TOL)


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
