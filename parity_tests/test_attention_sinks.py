"""Parity tests for numpy_attn/attention_sinks.py and torch_attn/attention_sinks.py.

The op on its own (against the twin and autograd, the sink column written out, finite
differences), then attention with sinks as the models compose it, attention then attention_sinks
through attention's log-sum-exp (test_attention's numpy_forward, numpy_backward and twin_fn),
against the twin, a softmax over the scores with the sink column, transformers' gpt-oss
attention and finite differences.
"""

import math
import re

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import torch_attn.attention_sinks as tw
from numpy_attn.attention import scaled_dot_product_attention_forward
from numpy_attn.attention_sinks import attention_sinks_backward, attention_sinks_forward
from parity_tests import strategies as S
from parity_tests.attention_kit import (
    SINK_EDGE_CASES,
    additive_mask,
    as_heads,
    attention_inputs,
    gradient_tols,
    make_case,
    numpy_backward,
    numpy_forward,
    qkv,
    sink_case,
    sink_grads,
    sink_tol,
    twin_fn,
)
from parity_tests.helpers import FD_TOL, TOLERANCES, assert_close, autograd, numerical_grad, to_numpy, to_torch


@st.composite
def sinks_inputs(draw, dtype=None, bound=4.0):
    """out (..., nh, T, hv), lse (..., nh, T) with some rows -inf (fully masked: out 0 there),
    sinks (nh,) in [-8, 8], and dout."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    lead = draw(st.sampled_from(((), (2,), (1,)))) + (draw(S.dim(1, 3)),)
    T, hv = draw(S.dim(1, 4)), draw(S.dim(1, 4))
    out = draw(S.arrays(dtype, lead + (T, hv), bound))
    compute = np.float64 if out.dtype == np.float64 else np.float32   # lse is attention's, in the dtype it computed in
    lse = draw(S.arrays(np.float64, lead + (T,), 8.0)).astype(compute)
    masked = draw(hnp.arrays(np.bool_, lead + (T,)))                 # fully masked rows: lse -inf, out 0
    lse[masked] = -np.inf
    out[masked] = 0
    sinks = draw(S.arrays(dtype, lead[-1:], 8.0))
    return dict(out=out, lse=lse, sinks=sinks, dout=draw(S.arrays(dtype, lead + (T, hv))))


# -- the op: out * sigmoid(lse - s_h) ----------------------------------------------------------------

@pytest.mark.twin_parity
@given(case=sinks_inputs())
def test_attention_sinks_matches_twin_and_autograd(case):
    """attention_sinks_forward against the twin, and its backward (dout, dlse, dsinks) against
    autograd through the twin."""
    got, cache = attention_sinks_forward(case["out"], case["lse"], case["sinks"])
    inputs = {n: case[n] for n in ("out", "lse", "sinks")}
    expected, grads = autograd(lambda **t: tw.attention_sinks(**t), inputs, case["dout"])
    assert_close("attention_sinks.out", got, expected)
    for name, d in zip(("out", "lse", "sinks"), attention_sinks_backward(case["dout"], cache), strict=True):
        assert d.shape == case[name].shape, f"attention_sinks.d{name} shape {d.shape}"
        assert_close(f"attention_sinks.d{name}", d, grads[name], **(dsinks_tol(case) if name == "sinks" else {}))


def dsinks_tol(case):
    """dsinks_h sums the R rows of head h, each a sum of hv terms of at most G = max|dout| max|out|:
    the dtype's atol times R hv G."""
    tol = TOLERANCES[np.dtype(case["out"].dtype)]
    R = case["lse"].size // case["sinks"].size
    G = float(np.abs(case["dout"]).max(initial=0)) * float(np.abs(case["out"]).max(initial=0))
    return dict(rtol=tol["rtol"], atol=tol["atol"] * max(1.0, R * case["out"].shape[-1] * G))


@given(case=sinks_inputs(dtype=np.float64))
def test_attention_sinks_equals_the_sink_column(case):
    """With Z = exp(lse): out * Z / (Z + exp(s_h)) is the weight the softmax over [scores, s_h]
    leaves the keys, times out: the identity the module's docstring derives, written directly."""
    got, cache = attention_sinks_forward(case["out"], case["lse"], case["sinks"])
    Z = np.exp(case["lse"])
    total = Z / (Z + np.exp(case["sinks"])[:, None])               # (..., nh, T)
    assert_close("attention_sinks.share vs Z / (Z + exp(s))", cache.share, total)
    assert_close("attention_sinks.out vs out * Z / (Z + exp(s))", got, case["out"] * total[..., None])


@given(case=sinks_inputs(dtype=np.float64, bound=1.0))
def test_attention_sinks_backward_matches_finite_differences(case):
    """dout, dlse (finite rows) and dsinks against finite differences of the forward."""
    _, cache = attention_sinks_forward(case["out"], case["lse"], case["sinks"])
    grads = dict(zip(("out", "lse", "sinks"), attention_sinks_backward(case["dout"], cache), strict=True))
    finite = np.isfinite(case["lse"])
    for name in ("out", "lse", "sinks"):
        a = case[name].copy()
        if name == "lse":
            a[~finite] = 0.0                                     # -inf has no neighbourhood; its gradient is 0
            expected = numerical_grad(lambda a: attention_sinks_forward(case["out"], np.where(finite, a, -np.inf),
                                                                        case["sinks"])[0], a, case["dout"])
            expected[~finite] = 0.0
        else:
            expected = numerical_grad(lambda a, name=name: attention_sinks_forward(
                **{**{n: case[n] for n in ("out", "lse", "sinks")}, name: a})[0], a, case["dout"])
        assert_close(f"attention_sinks.d{name} vs finite differences", grads[name], expected, **FD_TOL)


def test_attention_returns_lse_and_takes_dlse():
    """cache.lse is each row's log-sum-exp (-inf for a fully masked row), as torch.logsumexp, and
    the twin's with return_lse=True; a dlse adds weights * dlse to dscores: the gradient of
    sum(lse * dlse) is that of autograd."""
    import torch_attn.attention as tw_attn
    from numpy_attn.attention import scaled_dot_product_attention_backward

    q, k, v = S.ramp(2, 3, 4), S.ramp(2, 5, 4), S.ramp(2, 5, 3)
    mask = np.array([[False] * 5, [True, False, True, True, True], [True] * 5])
    out, cache = scaled_dot_product_attention_forward(q, k, v, attn_mask=mask)
    scores = (q / 2) @ k.swapaxes(-1, -2) + np.where(mask, 0, -np.inf)
    assert_close("attention.lse vs torch.logsumexp", cache.lse, to_numpy(torch.logsumexp(to_torch(scores), -1)))
    dlse = S.ramp(2, 3) - 1
    dq, dk, dv = scaled_dot_product_attention_backward(np.zeros_like(out), cache, dlse)
    _, grads = autograd(lambda q, k, v: tw_attn.scaled_dot_product_attention(
        q, k, v, attn_mask=to_torch(mask), return_lse=True)[2], {"q": q, "k": k, "v": v}, dlse)
    for name, d in (("q", dq), ("k", dk), ("v", dv)):
        assert_close(f"attention.d{name} from dlse", d, grads[name])
    with pytest.raises(ValueError, match=re.escape("dlse must be an array of lse's shape (2, 3), got shape (3,)")):
        scaled_dot_product_attention_backward(np.zeros_like(out), cache, np.zeros(3))


# -- attention with sinks: attention, then attention_sinks through its log-sum-exp ----------------------

@given(case=attention_inputs(sinks=True), softcap=st.none() | st.sampled_from((0.5, 2.0, 50.0)) | st.floats(0.2, 60.0))
@example(case=SINK_EDGE_CASES[0], softcap=None)
@example(case=SINK_EDGE_CASES[1], softcap=None)
def test_sinks_match_twin_and_autograd(case, softcap):
    """With sinks (and a softcap, masks, dropout, grouped-query heads as drawn): output and weights
    equal the twin's, dq, dk, dv and dsinks equal autograd's. A softcap goes through flex
    attention, which has no dropout: a capped case has none."""
    if softcap is not None:
        case = {**case, "softcap": softcap, "dropout_p": 0.0}
    out, cache = numpy_forward(case)
    fn = twin_fn(case, cache.keep)
    out_t, weights_t = fn(**{k: to_torch(a) for k, a in qkv(case).items()})
    assert_close("sdpa[sinks].out", out, to_numpy(out_t))
    assert_close("sdpa[sinks].weights", cache.weights, to_numpy(weights_t))
    _, expected = autograd(lambda **t: fn(**t)[0], {**qkv(case), "sinks": case["sinks"]}, case["dout"])
    grads = sink_grads(case, cache)
    tols = {**gradient_tols(case, cache), "sinks": sink_tol(case, cache)}
    for name in ("q", "k", "v", "sinks"):
        assert_close(f"sdpa[sinks].d{name}", grads[name], expected[name], **tols[name])


def direct_sink_attention(q, k, v, sinks, mask, scale):
    """Attention with sinks written as the formula, in torch, with no appended column:
    weights = exp(scores - m) / (sum exp(scores - m) + exp(s_h - m)), m = max(max scores, s_h);
    ``mask`` additive (-inf where masked) or None; k, v repeated for grouped-query heads."""
    g = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(g, dim=-3), v.repeat_interleave(g, dim=-3)
    scores = q @ k.transpose(-1, -2) * scale
    if mask is not None:
        scores = scores + mask
    s = sinks[:, None, None]                                      # (nh, 1, 1): broadcasts over rows
    m = torch.maximum(scores.amax(dim=-1, keepdim=True), s).detach()
    e = torch.exp(scores - m)
    weights = e / (e.sum(dim=-1, keepdim=True) + torch.exp(s - m))
    return weights @ v, weights


@given(case=attention_inputs(sinks=True, dropout=False))
@example(case=SINK_EDGE_CASES[0])
def test_sinks_twin_matches_direct_formula(case):
    """The twin (a column appended to the scores, softmax, the column dropped) equals the formula
    written out with the sink in the maximum and the denominator: output, weights, and the
    gradients of q, k, v and the sinks."""
    mask = additive_mask(case)
    scale = 1 / math.sqrt(case["q"].shape[-1]) if case["scale"] is None else case["scale"]
    inputs = {**qkv(case), "sinks": case["sinks"]}
    twin = twin_fn(case, None)
    mask_t = None if mask is None else to_torch(mask)
    out_d, grads_d = autograd(lambda **t: direct_sink_attention(**t, mask=mask_t, scale=scale)[0], inputs, case["dout"])
    out_t, grads_t = autograd(lambda **t: twin(**t)[0], inputs, case["dout"])
    assert_close("sdpa[sinks] twin.out vs formula", out_t, out_d)
    weights_d = direct_sink_attention(*(to_torch(inputs[n]) for n in ("q", "k", "v", "sinks")), mask_t, scale)[1]
    weights_t = twin(*(to_torch(inputs[n]) for n in ("q", "k", "v", "sinks")))[1]
    assert_close("sdpa[sinks] twin.weights vs formula", to_numpy(weights_t), to_numpy(weights_d))
    _, cache = numpy_forward(case)
    tols = {**gradient_tols(case, cache), "sinks": sink_tol(case, cache)}
    for name in ("q", "k", "v", "sinks"):
        assert_close(f"sdpa[sinks] twin.d{name} vs formula", grads_t[name], grads_d[name], **tols[name])


@given(case=attention_inputs(sinks=True, kinds=("none", "causal", "float"), dropout=False))
@example(case={**SINK_EDGE_CASES[1], "dropout_p": 0.0})
def test_sinks_twin_matches_gpt_oss_eager_attention(case):
    """transformers' gpt-oss attention (its eager_attention_forward, reading module.sinks: scores
    times scaling, the additive mask, the sink column, softmax, the column dropped) gives the
    twin's output and autograd's gradients of q, k, v and the sinks, in float64 and float32 (its
    softmax runs in the scores' dtype); fully masked rows included."""
    gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
    from types import SimpleNamespace

    mask = additive_mask(case)
    T, S_ = case["q"].shape[-2], case["k"].shape[-2]
    lead = as_heads(case["q"]).shape[:-2]                           # (B', nh)
    mask4 = None if mask is None else to_torch(np.broadcast_to(mask, case["q"].shape[:-1] + (S_,)).reshape(
        lead + (T, S_)))
    scale = 1 / math.sqrt(case["q"].shape[-1]) if case["scale"] is None else case["scale"]
    out_shape = case["dout"].shape

    def eager(q, k, v, sinks):
        module = SimpleNamespace(num_key_value_groups=q.shape[-3] // k.shape[-3], training=False, sinks=sinks)
        out, _ = gpt_oss.eager_attention_forward(module, as_heads(q), as_heads(k), as_heads(v), mask4, scaling=scale)
        return out.transpose(1, 2).reshape(out_shape)               # (B', T, nh, hv) -> the case's (..., T, hv)
    inputs = {**qkv(case), "sinks": case["sinks"]}
    out_e, grads_e = autograd(eager, inputs, case["dout"])
    twin = twin_fn(case, None)
    out_t, grads_t = autograd(lambda **t: twin(**t)[0], inputs, case["dout"])
    assert_close("sdpa[sinks] twin.out vs gpt-oss eager", out_t, out_e)
    _, cache = numpy_forward(case)
    tols = {**gradient_tols(case, cache), "sinks": sink_tol(case, cache)}
    for name in ("q", "k", "v", "sinks"):
        assert_close(f"sdpa[sinks] twin.d{name} vs gpt-oss eager", grads_t[name], grads_e[name], **tols[name])


@given(case=attention_inputs(dtype=np.float64, sinks=True, bound=1.0))
@example(case=SINK_EDGE_CASES[0])
@example(case=SINK_EDGE_CASES[1])
def test_sinks_backward_matches_finite_differences(case):
    """dq, dk, dv and dsinks against finite differences of the NumPy forward. A sink's weight is
    a logistic function of it, whose fifth derivative is below 1: the stencil's truncation error
    stays near h^4 = 1e-12 whatever sink is drawn."""
    grads = sink_grads(case, numpy_forward(case)[1])
    for name in ("q", "k", "v", "sinks"):
        a = case[name].copy()
        expected = numerical_grad(lambda a, name=name: numpy_forward(case, **{name: a})[0], a, case["dout"])
        assert_close(f"sdpa[sinks].d{name} vs finite differences", grads[name], expected, **FD_TOL)


# Three equal weights 1/3 on equal values: the sum rounds differently depending on how matmul
# reads the weights (a strided view of the S + 1 softmax columns, or a contiguous array).
EQUAL_WEIGHTS_SINK_CASE = sink_case(np.zeros((1, 2, 1), np.float32), np.zeros((1, 3, 1), np.float32),
                                    np.full((1, 3, 1), 3.6456072, np.float32), np.zeros((1, 2, 1), np.float32),
                                    np.zeros(1, np.float32))


@given(case=attention_inputs(sinks=True, dropout=False))
@example(case=SINK_EDGE_CASES[0])
@example(case=EQUAL_WEIGHTS_SINK_CASE)
def test_sink_rescales_each_row_without_reshaping_it(case):
    """A sink only takes a share of its row: the weights with sinks are those without, each row
    times its own total (which is below one); and a sink of -1e4, whose exp is 0 beside any score,
    gives the output without sinks exactly as computed: the weights are the same bits, and the
    forward hands them to matmul in the same (contiguous) layout."""
    _, cache = numpy_forward(case)
    _, plain = numpy_forward({**case, "sinks": None})
    total = cache.weights.sum(axis=-1, keepdims=True)
    assert np.all(total < 1 + 1e-6), "sdpa[sinks]: a row's weights sum to more than one"
    assert_close("sdpa[sinks].weights vs weights without sinks times the row's total", cache.weights,
                 plain.weights * total)
    silent = np.full_like(case["sinks"], -1e4)
    assert np.array_equal(numpy_forward(case, sinks=silent)[0], numpy_forward({**case, "sinks": None})[0]), \
        "sdpa: a sink of -1e4 changed the output"


@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
def test_fully_masked_row_with_sink_gives_zeros(dtype):
    """A query row whose keys are all masked: weight 1 on the sink, so weights 0 and output 0, no
    NaN; its dout reaches no input (dq of the row 0, dk, dv as if the row were absent) and adds 0
    to dsinks."""
    case = {**SINK_EDGE_CASES[0]}
    case = {**case, **{n: case[n].astype(dtype) for n in ("q", "k", "v", "dout", "sinks")}}
    out, cache = numpy_forward(case)
    assert np.all(out[:, 0] == 0) and np.all(cache.weights[:, 0] == 0), f"masked row: out {out[:, 0]}"
    grads = sink_grads(case, cache)
    assert all(np.isfinite(g).all() for g in grads.values()), "sdpa[sinks]: NaN in the gradients"
    assert np.all(grads["q"][:, 0] == 0), f"sdpa[sinks].dq of the masked row {grads['q'][:, 0]}"
    rest = {**case, "q": case["q"][:, 1:], "dout": case["dout"][:, 1:], "attn_mask": case["attn_mask"][1:]}
    expected = sink_grads(rest, numpy_forward(rest)[1])
    for name in ("k", "v", "sinks"):
        assert_close(f"sdpa[sinks].d{name} without the masked row", grads[name], expected[name])


@given(case=attention_inputs(groups=(2, 3), sinks=True))
def test_sinks_with_grouped_query_heads_equal_repeated_heads(case):
    """One sink per query head under grouped-query attention: the same as ordinary attention with
    each key/value head repeated g times and the same sinks; dsinks equal."""
    g = case["q"].shape[-3] // case["k"].shape[-3]
    repeated = {name: np.repeat(case[name], g, axis=-3) for name in ("k", "v")}
    out, cache = numpy_forward(case)
    out_r, cache_r = numpy_forward(case, **repeated)
    assert_close("sdpa[sinks].out gqa vs repeated heads", out, out_r)
    dsinks, dsinks_r = sink_grads(case, cache)["sinks"], sink_grads({**case, **repeated}, cache_r)["sinks"]
    assert_close("sdpa[sinks].dsinks gqa vs repeated heads", dsinks, dsinks_r, **sink_tol(case, cache))


# FlashAttention-4's test of its float32 sink gradient (Dao et al., flash-attention's tests/cute):
# the error against a float64 truth on the same rounded inputs within twice the error of the
# plain PyTorch computation in float32, plus 2 ulp of the largest |truth|.
FA4_CASES = [(seed, options) for seed in (0, 1) for options in (
    {}, {"is_causal": True, "window": 9}, {"attn_mask": "padding"}, {"softcap": 3.0})]


@pytest.mark.parametrize("seed, options", FA4_CASES)
def test_dsinks_float32_meets_flash_attention_4_rule(seed, options):
    """|dsinks32 - truth64| <= 2 |twin32 - truth64| + 2 ulp (largest errors over the tensor), at
    B = 2, 8 query heads on 2 key/value heads, T = S = 40, hs = 16, N(0, 1) inputs and sinks: our
    float32 backward against the twin's float32 autograd, the truth the twin's autograd in float64
    on the float32 inputs widened. dq, dk and dv meet the same rule."""
    rng = np.random.default_rng(seed)
    B, nh, nkv, T, hs = 2, 8, 2, 40, 16
    case32 = sink_case(*(rng.standard_normal(shape).astype(np.float32) for shape in (
        (B, nh, T, hs), (B, nkv, T, hs), (B, nkv, T, hs), (B, nh, T, hs), (nh,))), **{
        k: v for k, v in options.items() if k in ("is_causal",)})
    case32["window"], case32["softcap"] = options.get("window"), options.get("softcap")
    if options.get("attn_mask") == "padding":   # sequence 0 ends after 30 keys: its queries see no more
        mask = np.ones((B, 1, T, T), bool)
        mask[0, :, :, 30:] = False
        mask[0, :, 35:] = False                  # and its last 5 queries see nothing at all
        case32["attn_mask"] = mask
    case64 = {n: a.astype(np.float64) if isinstance(a, np.ndarray) and a.dtype == np.float32 else a
              for n, a in case32.items()}
    ours = sink_grads(case32, numpy_forward(case32)[1])
    inputs = lambda case: {**qkv(case), "sinks": case["sinks"]}   # noqa: E731
    _, twin32 = autograd(lambda **t: twin_fn(case32, None)(**t)[0], inputs(case32), case32["dout"])
    _, truth = autograd(lambda **t: twin_fn(case64, None)(**t)[0], inputs(case64), case64["dout"])
    for name in ("sinks", "q", "k", "v"):
        twin_err = float(np.abs(twin32[name].astype(np.float64) - truth[name]).max())
        bound = 2 * twin_err + 2 * float(np.spacing(np.float32(np.abs(truth[name]).max())))
        assert_close(f"sdpa[sinks].d{name} float32 vs float64 truth (FlashAttention-4 rule)",
                     ours[name].astype(np.float64), truth[name], rtol=0, atol=bound)


def test_backward_returns_dsinks_last():
    """No sinks: (dq, dk, dv) as before; sinks: (dq, dk, dv, dsinks); with attn_mask_grad too:
    (dq, dk, dv, dattn_mask, dsinks), each in its input's shape and dtype (attention's backward,
    then attention_sinks' dsinks)."""
    q, k, v = S.ramp(2, 3, 4), S.ramp(2, 5, 4), S.ramp(2, 5, 3)
    dout, mask, sinks = S.ramp(2, 3, 3), S.ramp(3, 5), S.ramp(2)
    case = make_case(q, k, v, dout)

    def back(dout, cache):
        return numpy_backward(dout, cache)

    def sdpa(q, k, v, attn_mask=None, attn_mask_grad=False, sinks=None):
        return numpy_forward({**case, "attn_mask": attn_mask, "attn_mask_grad": attn_mask_grad, "sinks": sinks})
    assert len(back(dout, sdpa(q, k, v)[1])) == 3
    shapes = [g.shape for g in back(dout, sdpa(q, k, v, sinks=sinks)[1])]
    assert shapes == [q.shape, k.shape, v.shape, sinks.shape], shapes
    shapes = [g.shape for g in back(dout, sdpa(q, k, v, attn_mask=mask, attn_mask_grad=True, sinks=sinks)[1])]
    assert shapes == [q.shape, k.shape, v.shape, mask.shape, sinks.shape], shapes


BAD_SINKS = [
    (np.zeros(3), ValueError, "sinks must have shape (nh,) = (2,), one per query head (q (2, 3, 4)), got shape (3,)"),
    (np.zeros((2, 1)), ValueError,
     "sinks must have shape (nh,) = (2,), one per query head (q (2, 3, 4)), got shape (2, 1)"),
    (np.zeros(2, np.float32), TypeError, "sinks must have q's dtype float64, got dtype float32: "),
    (np.zeros(2, np.int64), TypeError, "sinks must have q's dtype float64, got dtype int64"),
    ([0.0, 0.0], TypeError, "sinks must be a NumPy array (nh,) or None, got list [0.0, 0.0]"),
    (np.array([0.0, np.nan]), ValueError, "sinks must be finite, got array([ 0., nan])"),
    (np.array([np.inf, 1.0]), ValueError, "sinks must be finite, got array([inf,  1.])"),
]


@pytest.mark.parametrize("sinks, error, message", BAD_SINKS)
def test_bad_sinks_are_refused(sinks, error, message):
    q, k = np.zeros((2, 3, 4)), np.zeros((2, 5, 4))
    out, cache = scaled_dot_product_attention_forward(q, k, k)
    with pytest.raises(error, match=re.escape(message)):
        attention_sinks_forward(out, cache.lse, sinks)


def test_sinks_without_a_head_axis_are_refused():
    q = np.zeros((3, 4))
    out, cache = scaled_dot_product_attention_forward(q, q, q)
    with pytest.raises(ValueError, match=re.escape("sinks (shape (1,)) need a head axis, one sink per query head; "
                                                   "out (3, 4) has none")):
        attention_sinks_forward(out, cache.lse, np.zeros(1))



@pytest.mark.parametrize("lse, got", [(np.zeros((2, 2, 3)), "shape (2, 2, 3)"),
                                      (np.zeros((1, 2, 2)), "shape (1, 2, 2)"),
                                      (np.zeros(3), "shape (3,)"), ([0.0], "list")])
def test_an_lse_not_of_outs_rows_is_refused_naming_both(lse, got):
    """lse must be (..., nh, T), out's shape without its last axis: the message gives that shape
    (here (1, 2, 3), of out (1, 2, 3, 4)) and what came, a shape larger or smaller (a row short)."""
    q = np.zeros((1, 2, 3, 4))
    out, _ = scaled_dot_product_attention_forward(q, q, q)
    with pytest.raises(ValueError, match=re.escape(f"attention_sinks: lse must be an array of shape (1, 2, 3) "
                                                   f"(out's rows), got {got}")):
        attention_sinks_forward(out, lse, np.zeros(2))
