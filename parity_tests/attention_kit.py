"""What the attention tests share (test_attention.py, test_multi_head.py, test_softcap.py,
test_flash_attention.py, test_flex_attention.py): bad caps and windows, the bad-dout refusal, the
low-precision error budget of an attention op and its inputs' rounding, and FlashAttention-4's
rule for float32 results with what a float32 computation may keep beyond it; and attention's
cases (drawn and written out, with sinks and windows), run through ours and the twin
(test_attention.py, test_attention_sinks.py)."""

import math
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np
import pytest
import torch
from hypothesis import assume
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import torch_attn.attention as tw
import torch_attn.attention_sinks as tw_sinks
import torch_attn.flex_attention as tw_flex
from numpy_attn.attention import scaled_dot_product_attention_backward, scaled_dot_product_attention_forward
from numpy_attn.attention_sinks import attention_sinks_backward, attention_sinks_forward
from numpy_attn.flex_attention import (
    ScoreMod,
    create_block_mask,
    flex_attention_backward,
    flex_attention_forward,
    soft_cap,
)
from numpy_attn.masks import causal_mask, sliding_window_mask
from numpy_attn.testing import FLOAT32_NOISE, cancelled_terms
from numpy_attn.testing import flash_cancelled_size as cancelled_size  # test_flash_attention.grad_tol's M
from parity_tests import strategies as S
from parity_tests.helpers import LOW_DTYPES, TOLERANCES, assert_close, assert_error_budget, round_to, to_torch

# Caps and windows refused, with the error and message (test_attention.py, test_softcap.py and
# test_flash_attention.py).
BAD_SOFTCAPS = [(c, error, f"softcap must be a finite number > 0 or None, got {got}")
                for c, error, got in ((0, ValueError, "0"), (-50.0, ValueError, "-50.0"), (math.inf, ValueError, "inf"),
                                      (math.nan, ValueError, "nan"), ("50", TypeError, "str '50'"),
                                      (False, TypeError, "bool False"))]
BAD_WINDOWS = [(w, True, error, f"window must be a positive integer or None, got {got}")
               for w, error, got in ((0, ValueError, "0"), (-3, ValueError, "-3"), (2.0, TypeError, "float 2.0"),
                                     ("4", TypeError, "str '4'"), (True, TypeError, "bool True"))]
BAD_WINDOWS.append((2, False, ValueError, 'window = 2 needs is_causal (True, "top_left" or "bottom_right")'))


def rounded(case, dtype):
    """The case with its float64 arrays (q, k, v, a float mask, the sinks, dout) rounded to the
    low ``dtype``: the inputs every side shares (-inf mask entries stay -inf)."""
    return {n: round_to(a, dtype) if isinstance(a, np.ndarray) and a.dtype == np.float64 else a
            for n, a in case.items()}


def torch_or_none(a):
    """``a`` as a torch tensor, None left alone."""
    return None if a is None else to_torch(a)


def widened(arrays):
    """The same rounded arrays in float64, for the truth (bool masks and None left alone)."""
    return {n: a.astype(np.float64) if isinstance(a, np.ndarray) and a.dtype != np.bool_ else a
            for n, a in arrays.items()}


# FLOAT32_NOISE: the float32 noise of a sum of the few terms drawn here (numpy_attn/testing.py).


def assert_attention_budget(op, dtype, ours, twin, torch_lowp, truth, terms, rounded=None):
    """assert_error_budget for the NumPy side and the twin, each a dict tensor name -> array,
    against the same ``torch_lowp`` and ``truth`` dicts (and ``rounded``, a list of such dicts from
    randomly_rounded runs of the truth's program, where given).

    A gradient whose every true entry lies below the float32 noise FLOAT32_NOISE * terms[name] of
    the terms its computation cancels (v equal along the keys, or dout @ v^T so: dscores is then 0
    exactly) is out of the rule's reach: any float32 program is off by that noise, PyTorch's flash
    kernel can come out exactly 0 there (its dS = P (dP - rowsum(dO O)) cancels exactly), and one
    ulp of a truth near 0 is next to nothing. Such a gradient is held to that noise instead. A
    gradient above it still carries that noise, which a truth not far above it (every entry in
    float16's subnormals, say) leaves uncovered by one ulp: it is the budget's extra."""
    for who, got in {"numpy": ours, "twin": twin}.items():
        budget, extra = {}, {}
        for name in truth:
            noise = FLOAT32_NOISE * terms.get(name, 0.0)
            if np.max(np.abs(truth[name]), initial=0.0) > noise:
                runs = () if rounded is None else ([r[name] for r in rounded],)
                budget[name], extra[name] = (got[name], torch_lowp[name], truth[name], *runs), noise
            else:
                label = f"{op}[{who}] {name} ({dtype}), its truth within float32 noise"
                assert got[name].dtype == LOW_DTYPES[dtype][0], f"{label}: came back as {got[name].dtype}"
                assert_close(label, got[name].astype(np.float64), truth[name], rtol=0, atol=noise)
        assert_error_budget(f"{op}[{who}]", dtype, budget, extra=extra)


def four_axes(mask):
    """A torch mask of three axes given a fourth in front (None stays None): the flash kernel takes
    masks of two or four axes only."""
    return mask.reshape((1,) * (4 - mask.ndim) + mask.shape) if mask is not None and mask.ndim == 3 else mask


@st.composite
def bad_dout(draw, shape, dtype):
    """A dout unlike the forward's output of ``shape`` and ``dtype``, built to differ: another
    shape (one axis longer, or an extra leading axis), the other float dtype, the last two axes
    swapped (a transposed layout, only where that changes the shape), or integers of the right
    shape. Returns (dout, the exception it must raise, the texts its message must hold)."""
    kind = draw(st.sampled_from(("shape", "dtype", "transposed", "int")))
    if kind == "shape":
        axis = draw(st.integers(-1, len(shape) - 1))     # -1: an extra leading axis
        if axis < 0:
            bad = (draw(st.integers(1, 3)),) + shape
        else:
            bad = shape[:axis] + (shape[axis] + draw(st.integers(1, 3)),) + shape[axis + 1:]
    elif kind == "transposed":
        assume(len(shape) >= 2 and shape[-1] != shape[-2])
        bad = shape[:-2] + (shape[-1], shape[-2])
    else:
        bad = shape
    if kind in ("shape", "transposed"):
        return draw(S.arrays(dtype, bad)), ValueError, [str(tuple(shape)), str(bad)]
    bad_dtype = {"dtype": np.float32 if dtype == np.float64 else np.float64, "int": np.int64}[kind]
    return np.zeros(shape, bad_dtype), TypeError, [str(np.dtype(dtype)), str(np.dtype(bad_dtype))]


def assert_dout_refused(op, backward, cache, shape, dtype, data):
    """The backward refuses a drawn bad dout with the right error, naming the op, the expected
    and the received shape or dtype."""
    dout, error, texts = data.draw(bad_dout(tuple(shape), np.dtype(dtype)), label="bad dout")
    with pytest.raises(error) as info:
        backward(dout, cache)
    for text in (op, *texts):
        assert text in str(info.value), f"{op}: {text!r} missing from {str(info.value)!r}"


def dsinks_size(case):
    """test_flash_attention.dsinks_tol's R hv G (1 + the bound on |lse|): the size of dsinks' terms and
    their rounding."""
    q, k, v, dout, sinks = (case[n] for n in ("q", "k", "v", "dout", "sinks"))
    hs, S_, hv = q.shape[-1], k.shape[-2], v.shape[-1]
    scale = 1 / math.sqrt(hs) if case["scale"] is None else case["scale"]
    R = q.size // (hs * q.shape[-3])
    G = float(np.abs(dout).max(initial=0)) * float(np.abs(v).max(initial=0))
    largest = scale * hs * float(np.abs(q).max(initial=0)) * float(np.abs(k).max(initial=0))
    lse_bound = float(np.abs(sinks).max()) + largest + math.log(S_ + 1)
    return R * hv * G * (1 + lse_bound)


# The FlashAttention-4 rule for a float32 result: its error against the float64 truth (computed on
# the same float32 inputs, upcast exactly) is at most twice the torch twin's float32 error plus
# 2 ulps of the largest |truth|. Here the truth is direct_sinks in float64 and autograd.
def assert_fa4_rule(label, ours, twin, truth, extra=0.0):
    """The rule, plus ``extra`` for roundings the twin does not share (see its use)."""
    ulp = float(np.spacing(np.float32(np.abs(truth).max(initial=0))))
    err, err_t = np.abs(ours.astype(np.float64) - truth), np.abs(twin.astype(np.float64) - truth)
    allowed = 2 * err_t + 2 * ulp + extra
    worst = np.unravel_index(np.argmax(err - allowed), err.shape) if err.size else ()
    assert np.all(err <= allowed), (f"{label}{list(worst)}: error {err[worst]:.3g} against float64 > 2 x the "
                                    f"twin's {err_t[worst]:.3g} + 2 ulp {ulp:.3g}")


def float32_allowance(case):
    """{result: what its float32 computation may keep beyond the one rounding to the low dtype}.

    The rule's one ulp of max|truth| covers that rounding, but not where a result cancels to
    (nearly) 0 while its terms do not: equal rows of v make dP - D vanish, so the true dq and dk
    are 0, and a float32 computation keeps a few float32 ulps of the terms (1.2e-7 in a float16
    dq of a 1 x 2 case), where PyTorch's low-precision kernel may be exact by luck (its output
    rounded to the low dtype makes D equal dP). test_flash_attention.py's float32 analyses bound what remains:
    each probability is off by 4 eps (1 + |s|) relatively (lse_allowance), times max|v| for out
    and g T max|dout| for dv; dq and dk keep 8 ulps of grad_tol's M (cancelled_size) more; dsinks
    8 ulps of dsinks_size. eps is float32's: a real bug is off by ulps of the low dtype, 2^13
    (float16) or 2^16 (bfloat16) times more."""
    eps = float(np.finfo(np.float32).eps)
    q, k = case["q"], case["k"]
    scale = 1 / math.sqrt(q.shape[-1]) if case["scale"] is None else case["scale"]
    largest = scale * q.shape[-1] * float(np.abs(q).max()) * float(np.abs(k).max())
    if case["sinks"] is not None:
        largest = max(largest, float(np.abs(case["sinks"]).max()))
    relative = 4 * eps * (1 + largest)
    rows = q.size // q.shape[-1] // max(k.size // k.shape[-1] // k.shape[-2], 1)   # g T per key
    M = cancelled_size(case)
    extra = {"out": relative * float(np.abs(case["v"]).max()),
             "dv": relative * rows * float(np.abs(case["dout"]).max()),
             "dq": (8 * eps + relative) * M, "dk": (8 * eps + relative) * M}
    if case["sinks"] is not None:
        extra["dsinks"] = 8 * eps * dsinks_size(case)
    return extra


# -- attention's cases: drawn, written out, run through ours and the twin ---------------------------

@st.composite
def attention_inputs(draw, dtype=None, kinds=S.MASK_KINDS, groups=(1, 3), dropout=True, bound=4.0,
                     softcap=False, sinks=False):
    """A case: the forward's keyword arguments (``seed`` standing in for rng) and a drawn ``dout``.

    Leading dimensions are (), (nh,) or (B, nh); with grouped-query attention q has g times the
    heads of k and v, g drawn from the range ``groups`` (g > 1 needs a head axis). Masks come
    from S.attention_masks, of ``kinds``. With ``softcap`` a cap c is drawn: small ones saturate
    scores of up to |q| |k| hs scale = 32, Gemma 2's 50 barely bends them. With ``sinks`` there is
    always a head axis and each query head gets a sink logit in [-8, 8]: from negligible beside
    scores of up to 32 to taking nearly all of a row.
    """
    dtype = draw(S.dtypes) if dtype is None else dtype
    min_dims = int(groups[0] > 1 or sinks)                        # a head axis for grouped heads or sinks
    kv_lead = draw(hnp.array_shapes(min_dims=min_dims, max_dims=2, min_side=1, max_side=3))
    g = draw(st.integers(*groups)) if kv_lead else 1             # query heads per key/value head
    q_lead = kv_lead[:-1] + (kv_lead[-1] * g,) if kv_lead else kv_lead
    T, S_, hs, hv = draw(S.dim(1, 5)), draw(S.dim(1, 5)), draw(S.dim(1, 4)), draw(S.dim(1, 4))
    case = dict(
        q=draw(S.arrays(dtype, q_lead + (T, hs), bound)),
        k=draw(S.arrays(dtype, kv_lead + (S_, hs), bound)),
        v=draw(S.arrays(dtype, kv_lead + (S_, hv), bound)),
        scale=draw(st.none() | st.floats(0.1, 2.0)),
        dropout_p=draw(st.sampled_from((0.0, 0.3, 0.75))) if dropout else 0.0,
        seed=draw(st.integers(0, 2**32 - 1)),
    )
    case["attn_mask"], case["is_causal"] = draw(S.attention_masks(dtype, q_lead + (T, S_), kinds))
    case["dout"] = draw(S.arrays(dtype, q_lead + (T, hv)))
    if softcap:   # flex attention carries the cap, and it has no dropout: none beside a cap
        case["softcap"] = draw(st.sampled_from((0.5, 2.0, 50.0)) | st.floats(0.2, 60.0))
        case["dropout_p"] = 0.0
    if sinks:
        case["sinks"] = draw(S.arrays(dtype, q_lead[-1:], 8.0))
    return case


def make_case(q, k, v, dout, attn_mask=None, is_causal=False, scale=None, dropout_p=0.0, seed=0):
    """A case written out by hand, for @example."""
    return dict(q=q, k=k, v=v, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
                dropout_p=dropout_p, seed=seed, dout=dout)


# T = 1 and a single head, with that one query row masked entirely; and GQA with a fully masked
# row in a float mask and dropout.
EDGE_CASES = [
    make_case(S.ramp(1, 1, 1, 2), S.ramp(1, 1, 3, 2), S.ramp(1, 1, 3, 2), S.ramp(1, 1, 1, 2),
              attn_mask=np.zeros((1, 3), dtype=bool)),
    make_case(S.ramp(2, 3, 2), S.ramp(1, 4, 2), S.ramp(1, 4, 3), S.ramp(2, 3, 3),
              attn_mask=np.array([[0.5, -np.inf, 0.0, 1.0], [-np.inf] * 4, [0.0] * 4]),
              dropout_p=0.5, seed=7),
]


def numpy_forward(case, **changes):
    """Run the NumPy forward on a case (with ``changes`` to its arrays); returns (out, cache). A
    ``window`` becomes masks.sliding_window_mask; ``sinks`` compose attention with attention_sinks
    (the cache then a SinksCache)."""
    c = {**case, **changes}
    if c.get("softcap") is not None:   # a score modifier: flex attention carries it
        out, cache = capped_case_forward(c)
    else:
        out, cache = scaled_dot_product_attention_forward(
            c["q"], c["k"], c["v"], scale=c["scale"], dropout_p=c["dropout_p"],
            rng=np.random.default_rng(c["seed"]), attn_mask_grad=c.get("attn_mask_grad", False),
            **causal_or_window(c["q"].shape[-2], c["k"].shape[-2], c["is_causal"], c.get("window"), c["attn_mask"]))
    if c.get("sinks") is None:
        return out, cache
    out, sinks_cache = attention_sinks_forward(out, cache.lse, c["sinks"])
    return out, SinksCache(cache, sinks_cache)


def capped_attention_forward(q, k, v, attn_mask, softcap, scale=None):
    """Attention of q (B, nh, T, hs) over k, v (B, nkv, S, .) with a bool ``attn_mask`` (T, S),
    Gemma 2's cap c * tanh(s / c) on the scaled scores before the mask: flex attention with
    soft_cap(c) and the mask as its block mask; attention itself without a cap. Returns (out, cache)."""
    if softcap is None:
        return scaled_dot_product_attention_forward(q, k, v, attn_mask=attn_mask, scale=scale)
    block_mask = create_block_mask(lambda b, h, q_idx, kv_idx: attn_mask[q_idx, kv_idx], None, None, *attn_mask.shape)
    return flex_attention_forward(q, k, v, score_mod=soft_cap(softcap), block_mask=block_mask, scale=scale,
                                  enable_gqa=True)


# -- a softcap: a score modifier, so flex attention with soft_cap carries it ------------------------

class CappedCache(NamedTuple):
    """flex attention's cache and what the tests read of attention's: the weights, lse, no dropout
    (flex attention has none)."""

    flex: tuple
    weights: np.ndarray      # q's leading axes + (T, S)
    lse: np.ndarray          # q's leading axes + (T,)
    shapes: tuple            # q's, k's and v's shapes, which the 4-D flex call folded
    mask_shape: tuple | None   # the float mask's shape when its gradient is asked for
    keep = None
    keep_scale = 1.0
    scale = property(lambda self: self.flex.scale)


def _as4(x):
    """x (..., n, d) with at most two leading axes -> (B, H, n, d)."""
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


def _case_masks(c, shape):
    """The case's masks over the scores (B, H, T, S): (bool keep or None, float bias or None)."""
    T, S_ = shape[-2:]
    m = causal_or_window(T, S_, c["is_causal"], c.get("window"), c["attn_mask"])
    mask = m["attn_mask"]
    if m.get("is_causal"):
        mask = causal_mask(T, S_, "bottom_right" if m["is_causal"] == "bottom_right" else "top_left")
    if mask is None:
        return None, None
    mask = np.broadcast_to(_as4(mask), shape)
    return (mask, None) if mask.dtype == np.bool_ else (None, mask)


def capped_bias(cap, bias):
    """c * tanh(score / c) + bias[b, h, q_idx, kv_idx]: the cap, then a float mask, whose gradient
    is the score's, not times 1 - tanh^2."""
    def score_mod(score, b, h, q_idx, kv_idx):
        return cap * np.tanh(score / cap) + bias[b, h, q_idx, kv_idx]

    def dscore(score, b, h, q_idx, kv_idx):
        return 1 - np.tanh(score / cap) ** 2

    def dparams(grad, score, b, h, q_idx, kv_idx):
        d = np.zeros(bias.shape, grad.dtype)
        d[b, h, q_idx, kv_idx] = grad
        return {"attn_mask": d}
    return ScoreMod(score_mod, dscore, dparams, {"attn_mask": bias})


def capped_case_forward(c):
    """attention's case with a softcap through flex_attention_forward -> (out, CappedCache)."""
    if c["dropout_p"]:
        raise ValueError("flex attention has no dropout: a softcap case must have dropout_p = 0")
    q, k, v = (_as4(c[n]) for n in "qkv")
    shape = q.shape[:3] + k.shape[2:3]                                        # (B, H, T, S)
    keep, bias = _case_masks(c, shape)
    score_mod = soft_cap(c["softcap"]) if bias is None else capped_bias(c["softcap"], bias)
    block_mask = None if keep is None else create_block_mask(
        lambda b, h, q_idx, kv_idx: keep[b, h, q_idx, kv_idx], *shape)
    (out, lse), cache = flex_attention_forward(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                               scale=c["scale"], enable_gqa=True, return_lse=True)
    # The weights: exp(score - lse) of the modified, masked scores, 0 on a fully masked row.
    qf, kf = cache.q, np.repeat(cache.k, q.shape[1] // k.shape[1], axis=1)
    b, h, q_idx, kv_idx = (np.arange(n).reshape([-1 if i == j else 1 for j in range(4)]) for i, n in enumerate(shape))
    score = score_mod((qf @ kf.swapaxes(-1, -2)) * cache.scale, b, h, q_idx, kv_idx)
    if keep is not None:
        score = np.where(keep, score, -np.inf)
    with np.errstate(invalid="ignore"):
        weights = np.where(np.isneginf(lse)[..., None], 0, np.exp(score - lse[..., None]))
    lead = c["q"].shape[:-1]
    mask_shape = c["attn_mask"].shape if c.get("attn_mask_grad") else None
    shapes = (c["q"].shape, c["k"].shape, c["v"].shape)
    weights = weights.astype(c["q"].dtype).reshape(lead + (shape[-1],))
    weights.flags.writeable = False
    return out.reshape(lead + v.shape[-1:]), CappedCache(cache, weights, lse.reshape(lead), shapes, mask_shape)


def capped_case_backward(dout, cache, dlse=None):
    """flex_attention_backward on a CappedCache -> (dq, dk, dv[, dattn_mask]) in the case's shapes."""
    flex = cache.flex
    dlse = None if dlse is None else dlse.reshape(flex.lse.shape).astype(flex.lse.dtype)
    dq, dk, dv, dparams = flex_attention_backward(dout.reshape(flex.out.shape), flex, dlse)
    grads = tuple(d.reshape(s) for d, s in zip((dq, dk, dv), cache.shapes, strict=True))
    if cache.mask_shape is None:
        return grads
    d = dparams["attn_mask"]                                                  # (B, H, T, S)
    shape4 = (1,) * (4 - len(cache.mask_shape)) + tuple(cache.mask_shape)
    d = d.sum(axis=tuple(i for i in range(4) if shape4[i] == 1 and d.shape[i] != 1), keepdims=True)
    return (*grads, d.reshape(cache.mask_shape).astype(flex.dtype))


def capped_case_twin(case, q, k, v, attn_mask=None):
    """The torch twin of capped_case_forward: torch_attn's flex_attention with its soft_cap
    -> (out, weights, lse) in the case's shapes; ``attn_mask`` a float mask tensor in place of the
    case's (for its gradient)."""
    lead = q.shape[:-1]
    q4, k4, v4 = (t.reshape((1,) * (4 - t.ndim) + tuple(t.shape)) for t in (q, k, v))
    shape = tuple(q4.shape[:3]) + tuple(k4.shape[2:3])
    keep, bias = _case_masks(case, shape)
    cap = tw_flex.soft_cap(case["softcap"])
    if bias is None:
        score_mod = cap
    else:
        bias_t = to_torch(np.ascontiguousarray(bias)) if attn_mask is None else attn_mask.reshape(
            (1,) * (4 - attn_mask.ndim) + tuple(attn_mask.shape)).expand(shape)

        def score_mod(score, b, h, q_idx, kv_idx):
            return cap(score, b, h, q_idx, kv_idx) + bias_t[b, h, q_idx, kv_idx]
    block_mask = None
    if keep is not None:
        keep_t = torch.from_numpy(keep.copy())
        block_mask = SimpleNamespace(mask_mod=lambda b, h, q_idx, kv_idx: keep_t[b, h, q_idx, kv_idx])
    out, lse = tw_flex.flex_attention(q4, k4, v4, score_mod=score_mod, block_mask=block_mask, scale=case["scale"],
                                      enable_gqa=True, return_lse=True)
    scale = 1 / math.sqrt(q4.shape[-1]) if case["scale"] is None else case["scale"]
    qf, kf = q4.to(lse.dtype), k4.to(lse.dtype).repeat_interleave(q4.shape[1] // k4.shape[1], dim=1)
    grids = tw_flex._index_grids(*shape)
    score = score_mod((qf @ kf.transpose(-1, -2)) * scale, *grids)
    if keep is not None:
        score = torch.where(keep_t, score, -torch.inf)
    weights = torch.where(torch.isneginf(lse)[..., None], 0, torch.exp(score - lse[..., None]))
    return (out.reshape(lead + v.shape[-1:]), weights.to(q.dtype).reshape(lead + (shape[-1],)),
            lse.reshape(lead))


def causal_or_window(T, S_, is_causal, window, attn_mask=None):
    """attention's mask arguments for ``is_causal`` with a sliding ``window`` (or None): the window
    as masks.sliding_window_mask in is_causal's alignment, else is_causal itself."""
    if window is None:
        return {"is_causal": is_causal, "attn_mask": attn_mask}
    align = "bottom_right" if is_causal == "bottom_right" else "top_left"
    return {"attn_mask": sliding_window_mask(T, S_, window, align)}


class SinksCache(NamedTuple):
    """attention's cache and attention_sinks' after it, read as attention's by the tests: the
    weights each row times its sink's share."""

    attn: tuple
    sinks: tuple

    @property
    def weights(self):
        return (self.attn.weights * self.sinks.share[..., None]).astype(self.attn.weights.dtype)

    keep = property(lambda self: self.attn.keep)
    keep_scale = property(lambda self: self.attn.keep_scale)
    scale = property(lambda self: self.attn.scale)


def numpy_backward(dout, cache):
    """The NumPy backward of numpy_forward's cache: (dq, dk, dv[, dattn_mask][, dsinks])."""
    if not isinstance(cache, SinksCache):
        return _attention_backward(dout, cache)
    dout, dlse, dsinks = attention_sinks_backward(dout, cache.sinks)
    return (*_attention_backward(dout, cache.attn, dlse), dsinks)


def _attention_backward(dout, cache, dlse=None):
    if isinstance(cache, CappedCache):
        return capped_case_backward(dout, cache, dlse)
    return scaled_dot_product_attention_backward(dout, cache, dlse)


def twin_fn(case, keep):
    """The torch twin as a function of (q, k, v), and of sinks (default the case's), with the
    case's masks and ``keep``: attention, then attention_sinks with sinks."""
    keep = None if keep is None else to_torch(keep)
    case_sinks = None if case.get("sinks") is None else to_torch(case["sinks"])
    masks = causal_or_window(case["q"].shape[-2], case["k"].shape[-2], case["is_causal"], case.get("window"),
                             case["attn_mask"])
    masks["attn_mask"] = torch_or_none(masks["attn_mask"])

    def fn(q, k, v, sinks=case_sinks):
        if case.get("softcap") is not None:   # a score modifier: flex attention carries it
            out, weights, lse = capped_case_twin(case, q, k, v)
        else:
            out, weights, lse = tw.scaled_dot_product_attention(
                q, k, v, scale=case["scale"], dropout_p=case["dropout_p"], keep=keep, return_lse=True, **masks)
        if sinks is None:
            return out, weights
        share = torch.sigmoid(lse - sinks.to(lse.dtype)[:, None])            # (..., nh, T): as cache.weights
        return tw_sinks.attention_sinks(out, lse, sinks), (weights * share[..., None]).to(weights.dtype)
    return fn


def gradient_tols(case, cache):
    """Tolerances for dq, dk, dv: the dtype's, atol scaled by the size of the terms that cancel.

    The weights' gradient dout @ v^T has entries up to D = hv max|dout| max|v| / (1 - p); the
    softmax backward subtracts terms that large however small the result comes out, and dq, dk
    multiply what is left by k * scale and q * scale; dv sums terms weight * dout / (1 - p). Two
    correct programs that round in another order (the built-in's fused kernel, keys permuted)
    differ by the dtype's atol times those terms, not times the result: Hypothesis found float32
    dk entries of 1e-5 off by 1.2e-5.
    """
    tol = TOLERANCES[np.dtype(case["q"].dtype)]
    terms = cancelled_terms(case, cache)
    return {name: dict(rtol=tol["rtol"], atol=tol["atol"] * max(1.0, float(terms[name]))) for name in "qkv"}


def qkv(case):
    return {name: case[name] for name in ("q", "k", "v")}


def as_heads(a):
    """(..., L, E) -> (B, nh, L, E) for transformers and flex attention, which want four axes."""
    return a.reshape((-1,) + a.shape[-3:]) if a.ndim >= 3 else a.reshape((1, 1) + a.shape)


def sink_tol(case, cache):
    """dsinks_h sums, over the R rows of head h, -w_sink * sum_j(dweights_j * weights_j): each row
    cancels terms of dweights as large as D (gradient_tols), so the dtype's atol times D per row,
    times the R rows that the sum adds up."""
    tol = TOLERANCES[np.dtype(case["q"].dtype)]
    D = case["v"].shape[-1] * np.abs(case["dout"]).max() * np.abs(case["v"]).max() * cache.keep_scale
    rows = cache.weights[..., 0].size // case["sinks"].size
    return dict(rtol=tol["rtol"], atol=tol["atol"] * max(1.0, float(D) * rows))


def sink_case(q, k, v, dout, sinks, **options):
    """A sinks case written out by hand, for @example."""
    return {**make_case(q, k, v, dout, **options), "sinks": sinks}


# Every key of the first query row masked, with a sink (its weights and output must be 0, its
# gradients too); and GQA (3 query heads on 1 key/value head) with a fully masked row and dropout.
SINK_EDGE_CASES = [
    sink_case(S.ramp(2, 3, 2), S.ramp(2, 4, 2), S.ramp(2, 4, 3), S.ramp(2, 3, 3), S.ramp(2) * 3,
              attn_mask=np.array([[False] * 4, [True, False, True, True], [True] * 4])),
    sink_case(S.ramp(3, 3, 2), S.ramp(1, 4, 2), S.ramp(1, 4, 3), S.ramp(3, 3, 3), S.ramp(3) * 4 - 1,
              attn_mask=np.array([[0.5, -np.inf, 0.0, 1.0], [-np.inf] * 4, [0.0] * 4]), dropout_p=0.5, seed=7),
]


def sink_grads(case, cache):
    """The NumPy backward's (dq, dk, dv, dsinks) of a sinks case, checking it returns four."""
    grads = numpy_backward(case["dout"], cache)
    assert len(grads) == 4, f"with sinks the backward returned {len(grads)} gradients, not 4 (dq, dk, dv, dsinks)"
    return dict(zip(("q", "k", "v", "sinks"), grads, strict=True))


def additive_mask(case):
    """The case's mask (or is_causal) as the float mask that is added to the scores, or None."""
    T, S_ = case["q"].shape[-2], case["k"].shape[-2]
    mask = np.tri(T, S_, dtype=bool) if case["is_causal"] else case["attn_mask"]
    if mask is None or mask.dtype != np.bool_:
        return mask
    return np.where(mask, 0, -np.inf).astype(case["q"].dtype)
