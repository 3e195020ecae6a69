"""What the attention tests share (test_attention.py, test_multi_head.py, test_softcap.py,
test_flash_attention.py, test_flex_attention.py): bad caps and windows, the bad-dout refusal, the
low-precision error budget of an attention op and its inputs' rounding, and FlashAttention-4's
rule for float32 results with what a float32 computation may keep beyond it."""

import math

import numpy as np
import pytest
from hypothesis import assume
from hypothesis import strategies as st

from parity_tests import strategies as S
from parity_tests.helpers import LOW_DTYPES, assert_close, assert_error_budget, round_to, to_torch

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


# A sum of the few (at most about 50) terms of size X drawn here, computed in float32, is off by
# at most about 50 * 2^-24 X < 2^-16 X.
FLOAT32_NOISE = 2.0**-16


def assert_attention_budget(op, dtype, ours, twin, torch_lowp, truth, terms):
    """assert_error_budget for the NumPy side and the twin, each a dict tensor name -> array,
    against the same ``torch_lowp`` and ``truth`` dicts.

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
                budget[name], extra[name] = (got[name], torch_lowp[name], truth[name]), noise
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


def cancelled_size(case):
    """test_flash_attention.grad_tol's M = scale max|q, k| max(T, S) max|dout| max|v| hv: the size of
    what dq and dk cancel."""
    q, k, v, dout = (case[n] for n in ("q", "k", "v", "dout"))
    T, S_, hs, hv = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    scale = 1 / math.sqrt(hs) if case["scale"] is None else case["scale"]
    return float(scale * max(np.abs(q).max(), np.abs(k).max()) * max(T, S_) * np.abs(dout).max()
                 * np.abs(v).max() * hv)


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
