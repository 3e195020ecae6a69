"""Check your own implementation of an operation against numpy_attn's: the parity suite's
reference, its input strategies and its error rule, offered to users.

    from numpy_attn.testing import check, check_model

    check("softmax", my_softmax_forward, my_softmax_backward)   # NumPy: forward and backward
    check("attention", my_torch_attention)                      # torch: autograd gives the backward
    check_model("llama", my_torch_llama)                        # a whole model, layer by layer

``check`` draws inputs with Hypothesis (bounded elements, small shapes coupled by construction,
masks, causality, grouped heads, T != S), runs the function under test on them and compares its
output and every gradient with numpy_attn's forward and hand-written backward, computed in float64
on the same values, to the tolerance the project's own tests use. On a mismatch Hypothesis shrinks
the input to a smallest one that still fails, and ``check`` raises ``CheckFailure`` (an
AssertionError) whose message is the report: the operation and options, that input, which output
or gradient is wrong, where, by how much, against what tolerance and why.

What the functions under test must look like, per operation (numpy_attn's names and argument
order; a keyword argument is passed only when it differs from its default, so a function that
lacks it can still be checked with the options that keep it at its default):

    op          NumPy forward -> (out, cache)                        its backward(dout, cache) returns
    softmax     f(x, axis=-1)                                        dx
    linear      f(x, w, b=None)                                      (dx, {"w": dw, "b": db})
    layer_norm  f(x, w=None, b=None, eps=1e-5, normalized_shape=None) (dx, {"w": dw, "b": db})
    rms_norm    f(x, w, eps=1e-6)                                    (dx, {"w": dw})
    gelu        f(x, approximate="none")                             dx
    attention   f(q, k, v, attn_mask=None, is_causal=False, scale=None, dropout_p=0.0,
                  keep=None)                                         (dq, dk, dv)
    flash_attention  f(q, k, v, is_causal=False, scale=None)         (dq, dk, dv)
    multi_head  f(x, params, num_heads, *, attn_mask=None, is_causal=False, dropout_p=0.0,
                  keep=None, kv=None)                                (dx, dparams) or, with kv,
                                                                     (dx, dparams, dkv)

A gradient dict holds a key per parameter given (no "b" without b). A torch function takes the
same arguments as tensors, as torch_attn's twins do (softmax's ``axis`` is ``dim`` there), and
returns out, or a tuple whose first item is out (the twins' ``(out, weights)``); autograd gives
its backward, so ``backward`` stays None. Without a backward, a function is taken for a torch
function when it comes from torch (or torch_attn) or its code names torch, directly or through a
function of its module that it calls; ``framework="numpy"`` or ``"torch"`` says so instead. Its
inputs go to ``device`` (default "cpu"); the reference stays on the CPU. Without a backward a
NumPy forward is checked alone.

``check_model(family, forward, backward=None, ...)`` does the same for a whole model: a forward
(ids, params) -> logits or (logits, hidden_states) on the weights of one of numpy_attn's model
families (numpy_attn._family.families()), compared with numpy_attn's model block by block, then
the logits and every parameter's gradient, in float64; the report names the first block and tensor
that departs (its docstring, and docs/testing.md's section on whole models).

``seed`` (None: 0) makes a run reproducible: the same program draws the same inputs. Hypothesis
also mixes the constants of the project modules loaded into its draws, so another program (a test
file, the command) may draw others with the same seed; the report prints the failing input whole
when it is small.

Options per operation fix what is otherwise drawn:

    softmax     axis (default: any axis), masked (default True: -inf entries and whole -inf rows)
    linear      bias (default: with or without)
    layer_norm  affine (a tuple of "w and b", "w only", "neither"), several_axes (default True:
                normalized_shape may be the last two or three axes), eps (default: 1e-5 or 1e-2)
    rms_norm    eps (default: 1e-6, 1e-5 or 1e-2)
    gelu        approximate (a tuple of "none", "tanh"; default both)
    attention   masks (a tuple of "none", "bool", "float", "causal"), groups (the most query heads
                per key/value head, default 3; 1 for none), scale (True: drawn, None or in
                [0.1, 2]; False: never passed; a number: always that one), dropout (as
                multi_head's)
    flash_attention  causal (default: drawn), groups, scale, blocks (default False; True: block_q
                and block_k drawn from 1 to past the lengths and passed)
    multi_head  masks, cross (default: drawn), bias (default: drawn), groups (as attention's: k and v
                projected to fewer heads, each shared by up to that many query heads, in order), dropout
                (default False; True: dropout_p drawn from 0.1, 0.5, 0.9; a number in [0, 1): always that p)

With dropout, the function under test drops the weights numpy_attn drops: a torch function gets
the keep-mask (the weights' shape, (B, nh, T, S) for multi_head) as ``keep=`` (bool, True = kept),
as torch_attn's twins take it, and
scales the kept weights by 1 / (1 - dropout_p); a NumPy function gets ``keep=`` too when it takes
one, else ``rng=``, a Generator seeded as numpy_attn's, from which numpy_attn's forward draws the
same mask (float64 only: in float32 it draws in float32, so a NumPy forward must take keep).

The semantics are numpy_attn's (docs/design.md): a bool mask is True where a query may attend,
``is_causal`` is aligned top-left, and a row whose entries are all masked gives 0 (output and
gradient), never NaN.

This module imports Hypothesis, and torch only when the function under test is a torch function:
the one exception to numpy_attn's rule of importing NumPy alone (``import numpy_attn`` imports
neither; ml_dtypes is imported here only for ``dtype="bfloat16"``).
"""

import functools
import inspect
import math
import textwrap
import types
from typing import NamedTuple

import numpy as np
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from numpy_attn._tree import leaves, tree_map
from numpy_attn.attention import scaled_dot_product_attention_backward, scaled_dot_product_attention_forward
from numpy_attn.flash_attention import flash_attention_backward, flash_attention_forward
from numpy_attn.gelu import gelu_backward, gelu_forward
from numpy_attn.layer_norm import layer_norm_backward, layer_norm_forward
from numpy_attn.linear import linear_backward, linear_forward
from numpy_attn.multi_head import multi_head_attention_backward, multi_head_attention_forward
from numpy_attn.rms_norm import rms_norm_backward, rms_norm_forward
from numpy_attn.softmax import softmax_backward, softmax_forward

__all__ = ["check", "check_model", "CheckFailure", "model_tolerance", "OPERATIONS", "TOLERANCES", "arrays",
           "floats", "attention_masks", "broadcastable_to", "MASK_KINDS", "to_torch", "to_numpy"]

# -- the error rule ---------------------------------------------------------------------------------

# float64 carries about 16 significant digits; two correct programs do the same arithmetic in a
# possibly different order (BLAS blocking, reduction order), so they differ by a few ulps times the
# length of the longest sum: rtol 1e-10 leaves ample room and still catches any real bug. float32
# carries about 7 digits, and a sum of n terms of mixed sign can lose log10(n) of them to
# cancellation relative to the largest term, hence rtol 1e-4 with an atol of 1e-5 times the scale
# of the values compared (elements are drawn bounded, so the scale is known).
TOLERANCES = {
    np.dtype(np.float64): dict(rtol=1e-10, atol=1e-12),
    np.dtype(np.float32): dict(rtol=1e-4, atol=1e-5),
}

WHY = {"float64": "two correct float64 programs differ only in the order they round in, a few ulps times the "
                  "longest sum",
       "float32": "float32 carries about 7 digits, and a sum of n terms of mixed sign loses log10(n) of them"}

# A sum of the few (at most about 50) terms of size X drawn here, computed in float32, is off by
# at most about 50 * 2^-24 X < 2^-16 X.
FLOAT32_NOISE = 2.0**-16


def layer_norm_tol(rstds, dtype):
    """The dtype's tolerance with rtol and atol scaled by the largest rstd = 1 / sqrt(var + eps)
    among a model's layer norms (their caches hold it): 1 for rows of unit spread, up to 316 for
    a near-constant row (C = 1 makes every row constant).

    A layer norm multiplies the rounding errors of its input, and the cancellation in its backward
    (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), by rstd, so two correct programs that round
    differently differ by up to rstd times the usual error, relative and absolute (the thorough
    profile finds float32 gradients of 200 on a two-channel row off by 1.1e-4 relative). Against
    the built-in it matters more: F.layer_norm centres each row once, and its rounding of the mean
    reaches xhat times rstd (ours centres twice; test_layer_norm.py widens its atol likewise).
    """
    tol = TOLERANCES[np.dtype(dtype)]
    rstd = max([1.0] + [float(r.max()) for r in rstds])
    return dict(rtol=tol["rtol"] * rstd, atol=tol["atol"] * rstd)


def cancelled_terms(case, cache):
    """The size of the terms attention's backward cancels (case: q, k, v, dout; cache: attention's):
    D for dscores ("scores"), D max|k| scale for dq, D max|q| scale for dk, max|dout| / (1 - p) for
    dv, with D = hv max|dout| max|v| / (1 - p), the largest entry of the weights' gradient
    dout @ v^T. The softmax backward subtracts terms that large however small the result comes out,
    so two correct programs that round in another order differ by the dtype's atol times those
    terms, not times the result (Hypothesis found float32 dk entries of 1e-5 off by 1.2e-5)."""
    big = {name: float(np.abs(case[name]).max()) for name in ("q", "k", "v", "dout")}
    D = case["v"].shape[-1] * big["dout"] * big["v"] * cache.keep_scale
    return {"scores": D, "q": D * big["k"] * cache.scale, "k": D * big["q"] * cache.scale,
            "v": big["dout"] * cache.keep_scale}


def multi_head_cancelled_size(x, params, kv, dout, cache):
    """The size (at least 1) of the terms multi-head attention's backward cancels: as
    cancelled_terms, the heads' dq and dk are what is left of subtracting terms up to
    D * |k| * scale and D * |q| * scale, D = hs max|dy| max|v| / (1 - p) with dy the gradient after
    the output projection; the projections' backward multiplies them by |x|, |kv| or |w|.
    Hypothesis found float32 dWq entries of 0.011 off by 2.2e-5 against nn.MultiheadAttention."""
    att = cache.attention
    dy = dout @ params["o"]["w"].T                                # (B, T, C)
    D = att.v.shape[-1] * np.abs(dy).max() * np.abs(att.v).max() * att.keep_scale
    heads = D * max(np.abs(att.q_scaled).max(), np.abs(att.k).max() * att.scale)
    inputs = max(float(np.abs(a).max()) for a in [x, *([] if kv is None else [kv])]
                 + [leaf for _, leaf in leaves(params)])
    return max(1.0, float(heads) * max(1.0, inputs))


# -- strategies -------------------------------------------------------------------------------------

def floats(dtype, bound=4.0):
    """Bounded, finite elements of ``dtype``."""
    return _floats(np.dtype(dtype), float(bound))


def arrays(dtype, shape, bound=4.0):
    """Arrays of ``shape`` with bounded elements of ``dtype``."""
    return _arrays(np.dtype(dtype), (shape,) if isinstance(shape, int | np.integer) else tuple(shape), float(bound))


# Strategies are immutable, and building one (Hypothesis validates it on first use) costs far more
# than drawing from it: a shrink draws the same few small shapes hundreds of times.
@functools.cache
def _floats(dtype, bound):
    width = 32 if dtype == np.float32 else 64
    return st.floats(-bound, bound, width=width, allow_nan=False, allow_infinity=False, allow_subnormal=False)


@functools.cache
def _arrays(dtype, shape, bound):
    return hnp.arrays(dtype, shape, elements=_floats(dtype, bound))


@st.composite
def broadcastable_to(draw, shape, min_dims=0):
    """Shapes that broadcast to exactly ``shape``: some leading axes dropped, each side kept or 1.

    (``hnp.broadcastable_shapes`` may also grow a side of 1, which would grow the result.)
    """
    ndim = draw(st.integers(min(min_dims, len(shape)), len(shape)))
    tail = tuple(shape)[len(shape) - ndim:]
    return tuple(side if draw(st.booleans()) else 1 for side in tail)


MASK_KINDS = ("none", "bool", "float", "causal")


@st.composite
def attention_masks(draw, dtype, scores_shape, kinds=MASK_KINDS):
    """(attn_mask, is_causal) in the convention of F.scaled_dot_product_attention, for scores of
    ``scores_shape`` (..., T, S): no mask, a bool mask (True = may attend; whole rows may be
    hidden), a float mask with -inf entries, or is_causal. Masks have at least two dimensions
    and broadcast to ``scores_shape``."""
    kind = draw(st.sampled_from(kinds))
    if kind not in ("bool", "float"):
        return None, kind == "causal"
    shape = draw(broadcastable_to(scores_shape, min_dims=2))
    hide = draw(hnp.arrays(np.bool_, shape))
    if kind == "bool":
        return ~hide, False
    return np.where(hide, -np.inf, draw(arrays(dtype, shape, 3.0))).astype(dtype), False


class Case(NamedTuple):
    """One drawn input: the differentiable ``inputs`` {name: array, or a dict of arrays for params}
    in the call's order, the other arguments ``options`` (keywords, only those not at their
    default, and multi_head's num_heads) and the upstream gradient ``dout``, all float64."""

    inputs: dict
    options: dict
    dout: np.ndarray


def _dim(low, high):
    return st.integers(low, high)


@st.composite
def _softmax_cases(draw, axis=None, masked=True):
    least = 1 if axis is None else (axis + 1 if axis >= 0 else -axis)
    shape = draw(hnp.array_shapes(min_dims=least, max_dims=max(3, least), min_side=1, max_side=6))
    x = draw(arrays(np.float64, shape, 10.0))
    if masked and draw(st.booleans()):
        x = np.where(draw(hnp.arrays(np.bool_, shape)), -np.inf, x)
    axis = draw(st.integers(-len(shape), len(shape) - 1)) if axis is None else axis
    options = {} if axis % len(shape) == len(shape) - 1 else {"axis": axis}
    return Case({"x": x}, options, draw(arrays(np.float64, shape)))


@st.composite
def _linear_cases(draw, bias=None):
    lead = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=4))
    C_in, C_out = draw(_dim(1, 8)), draw(_dim(1, 8))
    inputs = {"x": draw(arrays(np.float64, lead + (C_in,))), "w": draw(arrays(np.float64, (C_in, C_out)))}
    if draw(st.booleans()) if bias is None else bias:
        inputs["b"] = draw(arrays(np.float64, (C_out,)))
    return Case(inputs, {}, draw(arrays(np.float64, lead + (C_out,))))


AFFINE = ("w and b", "w only", "neither")


@st.composite
def _layer_norm_cases(draw, affine=AFFINE, several_axes=True, eps=None):
    lead = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=4))
    k = draw(st.sampled_from([None, 1, 2, 3] if several_axes else [None]))
    shape = (draw(_dim(1, 8)),) if k is None else tuple(draw(_dim(1, 4)) for _ in range(k))
    inputs = {"x": draw(arrays(np.float64, lead + shape))}
    kind = draw(st.sampled_from(tuple(affine)))
    if kind != "neither":
        inputs["w"] = draw(arrays(np.float64, shape))
    if kind == "w and b":
        inputs["b"] = draw(arrays(np.float64, shape))
    eps = draw(st.sampled_from([1e-5, 1e-2])) if eps is None else eps
    options = {**({} if eps == 1e-5 else {"eps": eps}), **({} if k is None else {"normalized_shape": shape})}
    return Case(inputs, options, draw(arrays(np.float64, lead + shape)))


def _qkv(draw, groups, length):
    """(q, k, v as inputs, q's leading axes, T, S, hv): leading axes (), (nh,) or (B, nh), q with g
    times the heads of k and v (g drawn up to ``groups``), T and S up to ``length``."""
    kv_lead = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=3))
    g = draw(_dim(1, groups)) if kv_lead else 1                  # query heads per key/value head
    q_lead = kv_lead[:-1] + (kv_lead[-1] * g,) if kv_lead else kv_lead
    T, S, hs, hv = draw(_dim(1, length)), draw(_dim(1, length)), draw(_dim(1, 4)), draw(_dim(1, 4))
    inputs = {"q": draw(arrays(np.float64, q_lead + (T, hs))), "k": draw(arrays(np.float64, kv_lead + (S, hs))),
              "v": draw(arrays(np.float64, kv_lead + (S, hv)))}
    return inputs, q_lead, T, S, hv


def _dropout_options(draw, dropout, shape):
    """dropout_p drawn (or the one given), and the keep-mask of ``shape`` numpy_attn's forward draws
    from the seed (numpy_attn's rule, dropout.py), to be replayed: {} without dropout."""
    if not dropout:
        return {}
    p = draw(st.sampled_from([0.1, 0.5, 0.9])) if dropout is True else float(dropout)
    seed = draw(st.integers(0, 2**32 - 1))
    return {"dropout_p": p, "keep": np.random.default_rng(seed).random(shape) < 1 - p, "keep_seed": seed}


@st.composite
def _attention_cases(draw, masks=MASK_KINDS, groups=3, scale=True, dropout=False):
    inputs, q_lead, T, S, hv = _qkv(draw, groups, 5)
    attn_mask, is_causal = draw(attention_masks(np.float64, q_lead + (T, S), tuple(masks)))
    if scale is True:
        scale = draw(st.none() | st.floats(0.1, 2.0))
    options = {"attn_mask": attn_mask, "is_causal": is_causal, "scale": scale or None,
               **_dropout_options(draw, dropout, q_lead + (T, S))}
    return Case(inputs, {k: v for k, v in options.items() if v is not None and v is not False},
                draw(arrays(np.float64, q_lead + (T, hv))))


@st.composite
def _multi_head_cases(draw, masks=MASK_KINDS, cross=None, bias=None, groups=3, dropout=False):
    B, T, hs = draw(_dim(1, 2)), draw(_dim(1, 4)), draw(_dim(1, 3))
    g = draw(_dim(1, groups))                                     # query heads per key/value head
    nkv = draw(_dim(1, 3 if g == 1 else 2))                       # key/value heads
    nh, C = nkv * g, nkv * g * hs
    cross = draw(st.booleans()) if cross is None else cross
    S = draw(_dim(1, 4)) if cross else T
    with_bias = draw(st.booleans()) if bias is None else bias
    widths = {"q": C, "k": nkv * hs, "v": nkv * hs, "o": C}       # k and v: the nkv heads' columns
    params = {name: {"w": draw(arrays(np.float64, (C, out), 1.0)),
                     **({"b": draw(arrays(np.float64, (out,), 1.0))} if with_bias else {})}
              for name, out in widths.items()}
    inputs = {"x": draw(arrays(np.float64, (B, T, C), 2.0)), "params": params}
    if cross:
        inputs["kv"] = draw(arrays(np.float64, (B, S, C), 2.0))
    attn_mask, is_causal = draw(attention_masks(np.float64, (B, nh, T, S), tuple(masks)))
    options = {"num_heads": nh, **({} if attn_mask is None else {"attn_mask": attn_mask}),
               **({"is_causal": True} if is_causal else {})}
    options.update(_dropout_options(draw, dropout, (B, nh, T, S)))
    return Case(inputs, options, draw(arrays(np.float64, (B, T, C))))


@st.composite
def _rms_norm_cases(draw, eps=None):
    lead = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=4))
    C = draw(_dim(1, 8))
    inputs = {"x": draw(arrays(np.float64, lead + (C,))), "w": draw(arrays(np.float64, (C,)))}
    eps = draw(st.sampled_from([1e-6, 1e-5, 1e-2])) if eps is None else eps
    return Case(inputs, {} if eps == 1e-6 else {"eps": eps}, draw(arrays(np.float64, lead + (C,))))


@st.composite
def _gelu_cases(draw, approximate=("none", "tanh")):
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6))
    kind = draw(st.sampled_from(tuple(approximate)))
    return Case({"x": draw(arrays(np.float64, shape, 10.0))}, {} if kind == "none" else {"approximate": kind},
                draw(arrays(np.float64, shape)))


@st.composite
def _flash_attention_cases(draw, causal=None, groups=3, scale=True, blocks=False):
    inputs, q_lead, T, S, hv = _qkv(draw, groups, 9)
    is_causal = draw(st.booleans()) if causal is None else causal
    if scale is True:
        scale = draw(st.none() | st.floats(0.1, 2.0))
    options = {"is_causal": is_causal, "scale": scale or None}
    if blocks:   # tiles that often do not divide the lengths, from 1 to past them
        options.update(block_q=draw(_dim(1, T + 2)), block_k=draw(_dim(1, S + 2)))
    return Case(inputs, {k: v for k, v in options.items() if v is not None and v is not False},
                draw(arrays(np.float64, q_lead + (T, hv))))


# -- the operations -----------------------------------------------------------------------------------

def _replayed(f, options, torch):
    """The options as ``f`` takes them. With dropout, the keep-mask is replayed: a torch function,
    or a NumPy one that takes ``keep``, gets it (torch_attn's twins do); a NumPy one without gets
    ``rng``, seeded as numpy_attn's (numpy_attn's own forward then draws that mask)."""
    rest = {k: v for k, v in options.items() if k not in ("keep", "keep_seed")}
    if "keep" in options:
        takes_keep = torch or "keep" in _parameters(f)
        rest.update({"keep": options["keep"]} if takes_keep else {"rng": np.random.default_rng(options["keep_seed"])})
    return rest


def _call_plain(f, arrays, options, torch):
    """f(*inputs, **options): inputs by position in order (a missing b or w trails)."""
    if torch and "axis" in options:                              # softmax's axis is torch's dim
        options = {("dim" if k == "axis" else k): v for k, v in options.items()}
    return f(*arrays.values(), **_replayed(f, options, torch))


def _call_multi_head(f, arrays, options, torch):
    """f(x, params, num_heads, **options, kv=kv), the keep-mask replayed as _replayed says."""
    rest = {k: v for k, v in _replayed(f, options, torch).items() if k != "num_heads"}
    kv = {"kv": arrays["kv"]} if "kv" in arrays else {}
    return f(arrays["x"], arrays["params"], options["num_heads"], **rest, **kv)


def _parameters(f):
    """The names of ``f``'s parameters (none for a callable whose signature cannot be read)."""
    try:
        return inspect.signature(f).parameters
    except (TypeError, ValueError):
        return {}


def _grads_plain(names):
    """Gradients returned as dx or (dx, {"w": dw, "b": db}) -> {input name: gradient}."""
    def grads(result, case):
        if names == ("x",):
            return {"x": result}
        dx, dparams = result
        return {"x": dx, **dparams}
    return grads


def _grads_attention(result, case):
    dq, dk, dv = result
    return {"q": dq, "k": dk, "v": dv}


def _grads_multi_head(result, case):
    if "kv" in case.inputs:
        dx, dparams, dkv = result
        return {"x": dx, "params": dparams, "kv": dkv}
    dx, dparams = result
    return {"x": dx, "params": dparams}


def _tols_plain(case, cache, dtype):
    """No gradient whose terms cancel beyond the dtype's tolerance: {}."""
    return {}


# Each _tols_* gives {gradient name ("*": every gradient): (rtol's factor, atol's factor, terms, why)}
# for ``dtype`` (float64 or float32): the dtype's tolerance scaled, as numpy_attn's own tests scale
# it, by the size of what the backward cancels; ``terms`` is that size, whose float32 noise
# (FLOAT32_NOISE * terms) float16 and bfloat16 may add to their budget.

def _tols_layer_norm(case, cache, dtype):
    rstd = max(1.0, float(np.max(cache[1])))
    return {"dx": (rstd, rstd, rstd, f"rtol and atol times the largest rstd = 1 / sqrt(var + eps) = {rstd:.3g}, "
                                     "by which the norm multiplies its input's rounding and its backward's "
                                     "cancellation")}


def _tols_attention(case, cache, dtype):
    terms = cancelled_terms({**case.inputs, "dout": case.dout}, cache)
    what = {"q": "D max|k| scale", "k": "D max|q| scale", "v": "max|dout|"}
    return {f"d{n}": (1.0, max(1.0, terms[n]), terms[n],
                      f"atol times {max(1.0, terms[n]):.3g} = max(1, {what[n]}), D = hv max|dout| max|v| = "
                      f"{terms['scores']:.3g}: the terms the backward cancels, to which rounding is relative")
            for n in "qkv"}


def _tols_multi_head(case, cache, dtype):
    size = multi_head_cancelled_size(case.inputs["x"], case.inputs["params"], case.inputs.get("kv"), case.dout,
                                     cache)
    return {"*": (1.0, size, size, f"atol times {size:.3g} = (D |k| scale, D |q| scale) times the largest |input|: "
                                   "the terms the heads' backward cancels, to which rounding is relative")}


def _tols_rms_norm(case, cache, dtype):
    rstd = max(1.0, float(np.max(cache[1])))
    return {"*": (rstd, rstd, rstd, f"rtol and atol times the largest rstd = 1 / sqrt(mean(x^2) + eps) = "
                                    f"{rstd:.3g}, by which the norm multiplies its input's rounding and its "
                                    "backward's cancellation")}


def flash_cancelled_size(case):
    """M = scale max|q, k| max(T, S) max|dout| max|v| hv: the size of what flash attention's dq and dk
    cancel. dS = P * (dP - D) cancels: dP and D are sums of up to hv terms |dout| |v|, and dS keeps
    their rounding, a few ulps of that size, however small the difference; dq and dk sum dS over up
    to max(T, S) rows times |k| or |q| and the scale, so their error reaches a few ulps of M in any
    implementation (measured: 2.4 float32 ulps of M between two block sizes, 4.4 float64 ulps)."""
    q, k, v, dout = (case[n] for n in ("q", "k", "v", "dout"))
    T, S_, hs, hv = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    scale = 1 / math.sqrt(hs) if case["scale"] is None else case["scale"]
    return float(scale * max(np.abs(q).max(), np.abs(k).max()) * max(T, S_) * np.abs(dout).max()
                 * np.abs(v).max() * hv)


def _tols_flash_attention(case, cache, dtype):
    """dq and dk: atol 8 ulps of M (flash_cancelled_size) where the dtype's atol is smaller."""
    M = flash_cancelled_size({**case.inputs, "dout": case.dout, "scale": case.options.get("scale")})
    factor = max(1.0, 8 * float(np.finfo(dtype).eps) * M / TOLERANCES[np.dtype(dtype)]["atol"])
    why = (f"atol times {factor:.3g} = 8 ulps of M = scale max|q, k| max(T, S) max|dout| max|v| hv = {M:.3g}, "
           "the size of what dS = P (dP - D) cancels, summed over the rows")
    return {"dq": (1.0, factor, M, why), "dk": (1.0, factor, M, why)}


class Operation(NamedTuple):
    """What check needs of an operation: its cases (a strategy from the options), numpy_attn's
    forward and backward, how the function under test is called, how its gradients are named,
    and the tolerances of the gradients whose terms cancel."""

    cases: object
    forward: object
    backward: object
    call: object
    grads: object
    tols: object
    signature: str


OPERATIONS = {
    "softmax": Operation(_softmax_cases, softmax_forward, softmax_backward, _call_plain, _grads_plain(("x",)),
                         _tols_plain, "f(x, axis=-1) -> (y, cache); backward(dy, cache) -> dx"),
    "linear": Operation(_linear_cases, linear_forward, linear_backward, _call_plain, _grads_plain(("x", "w")),
                        _tols_plain, 'f(x, w, b=None) -> (out, cache); backward(dout, cache) -> '
                                     '(dx, {"w": dw, "b": db})'),
    "layer_norm": Operation(_layer_norm_cases, layer_norm_forward, layer_norm_backward, _call_plain,
                            _grads_plain(("x", "w")), _tols_layer_norm,
                            "f(x, w=None, b=None, eps=1e-5, normalized_shape=None) -> (out, cache); "
                            'backward(dout, cache) -> (dx, {"w": dw, "b": db})'),
    "rms_norm": Operation(_rms_norm_cases, rms_norm_forward, rms_norm_backward, _call_plain, _grads_plain(("x", "w")),
                          _tols_rms_norm, 'f(x, w, eps=1e-6) -> (out, cache); backward(dout, cache) -> '
                                          '(dx, {"w": dw})'),
    "gelu": Operation(_gelu_cases, gelu_forward, gelu_backward, _call_plain, _grads_plain(("x",)), _tols_plain,
                      'f(x, approximate="none") -> (out, cache); backward(dout, cache) -> dx'),
    "attention": Operation(_attention_cases, scaled_dot_product_attention_forward,
                           scaled_dot_product_attention_backward, _call_plain, _grads_attention, _tols_attention,
                           "f(q, k, v, attn_mask=None, is_causal=False, scale=None, dropout_p=0.0, keep=None "
                           "(or rng=None)) -> (out, cache); "
                           "backward(dout, cache) -> (dq, dk, dv)"),
    "flash_attention": Operation(_flash_attention_cases, flash_attention_forward, flash_attention_backward,
                                 _call_plain, _grads_attention, _tols_flash_attention,
                                 "f(q, k, v, is_causal=False, scale=None) -> (out, cache); "
                                 "backward(dout, cache) -> (dq, dk, dv)"),
    "multi_head": Operation(_multi_head_cases, multi_head_attention_forward, multi_head_attention_backward,
                            _call_multi_head, _grads_multi_head, _tols_multi_head,
                            "f(x, params, num_heads, *, attn_mask=None, is_causal=False, dropout_p=0.0, keep=None "
                            "(or rng=None), kv=None) -> (out, cache); backward(dout, cache) -> (dx, dparams[, dkv])"),
}


# -- torch, imported only for a torch function ----------------------------------------------------------

def to_torch(x, requires_grad=False, device=None):
    """A torch tensor with ``x``'s dtype (a fresh copy, so NumPy code cannot alias it), on ``device``.

    torch.from_numpy does not know ml_dtypes' bfloat16: its bits travel as uint16 and are viewed
    as torch.bfloat16, which has the same layout."""
    import torch

    x = np.array(x, copy=True)
    if x.dtype.name == "bfloat16":
        t = torch.from_numpy(x.view(np.uint16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(x)
    t = t if device is None else t.to(device)
    return t.requires_grad_(requires_grad) if requires_grad else t


def to_numpy(t):
    """A torch tensor as a NumPy array on the CPU (bfloat16 as ml_dtypes' bfloat16)."""
    import torch

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _is_torch_function(f, seen=None):
    """True when ``f`` comes from torch or torch_attn, or its code names torch (``torch.softmax``,
    ``F.softmax`` with F torch.nn.functional, a function imported from torch), itself, in a function
    it defines or closes over, or in a function of its own module that it calls; torch itself is not
    imported to find out."""
    f = inspect.unwrap(getattr(f, "func", f))                     # functools.partial, decorators
    seen = set() if seen is None else seen
    if id(f) in seen:
        return False
    seen.add(id(f))
    if _from_torch(f):
        return True
    code = getattr(f, "__code__", None)
    if code is None:                                              # a callable object: its __call__
        call = vars(type(f)).get("__call__")
        return call is not None and hasattr(call, "__code__") and _is_torch_function(call, seen)
    names, stack = set(), [code]
    while stack:
        c = stack.pop()
        names.update(c.co_names)
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    found = [f.__globals__.get(n) for n in names] + [cell.cell_contents for cell in (f.__closure__ or ())]
    return any(_from_torch(v) or (isinstance(v, types.FunctionType) and _is_torch_function(v, seen))
               for v in found)


def _from_torch(v):
    """True for torch's modules and what they define, torch_attn's functions, and objects of a class
    built on one of torch's (an nn.Module of transformers, say)."""
    name = v.__name__ if isinstance(v, types.ModuleType) else getattr(v, "__module__", None)
    bases = () if isinstance(v, type | types.ModuleType | types.FunctionType) else type(v).__mro__
    return any(isinstance(n, str) and n.split(".")[0] in ("torch", "torch_attn")
               for n in [name, *(getattr(c, "__module__", None) for c in bases)])


# -- the check ----------------------------------------------------------------------------------------

class CheckFailure(AssertionError):
    """The function under test disagrees with numpy_attn's (or failed to run); the message is the report."""


class _Mismatch(NamedTuple):
    name: str        # "out", "dx", "dparams.q.w" ...
    text: str        # what is wrong, where, by how much, against what tolerance and why


def _dtype(name):
    """The NumPy dtype called ``name``: float64, float32, float16 or bfloat16 (ml_dtypes')."""
    if name not in ("float64", "float32", "float16", "bfloat16"):
        raise ValueError(f"dtype must be float64, float32, float16 or bfloat16, got {name!r}")
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _flat(tree, prefix):
    """{"d" + dotted path: array} of a gradient tree {input name: array or dict}."""
    return {f"{prefix}{path}": leaf for path, leaf in leaves(tree)}


def _show(a, most=24):
    """An array's shape and dtype, and its values when it is small."""
    a = np.asarray(a)
    head = f"{a.shape} {a.dtype}"
    if a.size > most:
        return head
    body = np.array2string(a if a.dtype == np.bool_ else np.asarray(a, np.float64), precision=4, separator=", ",
                           max_line_width=100)
    return head + " =\n      " + body.replace("\n", "\n      ")


def _index(i, shape):
    return str(tuple(int(n) for n in np.unravel_index(i, shape))) if shape else "()"


def _wrapped(text):
    """``text`` as the report's indented lines of at most 100 columns."""
    return "\n".join(textwrap.wrap(text, 100, initial_indent="    ", subsequent_indent="      "))


def _unlike(name, got, want, dtype):
    """A _Mismatch when ``got`` is no array of ``want``'s shape and of ``dtype``, else None."""
    if not hasattr(got, "shape") or not hasattr(got, "dtype"):
        return _Mismatch(name, f"{name}: expected an array {want.shape} {dtype}, got {type(got).__name__}")
    if np.shape(got) != want.shape:
        return _Mismatch(name, f"{name}: shape {np.shape(got)}, expected {want.shape}")
    if got.dtype != dtype:
        return _Mismatch(name, f"{name}: dtype {got.dtype}, expected {dtype} (dtype in is dtype out)")
    return None


def _compare(name, got, want, dtype, tol, why):
    """A _Mismatch when ``got`` differs from ``want`` (float64) beyond ``tol``, else None."""
    unlike = _unlike(name, got, want, dtype)
    if unlike:
        return unlike
    g = np.asarray(got).astype(np.float64)
    bound = tol["atol"] + tol["rtol"] * np.abs(want)
    same = (g == want) | (np.abs(g - want) <= bound)                 # == lets equal infinities through
    if same.all():
        return None
    diff = np.where(same, 0.0, np.abs(g - want))
    excess = np.where(np.isnan(diff), np.inf, diff / np.where(bound > 0, bound, np.finfo(float).tiny))
    i = int(np.argmax(np.where(same, -1.0, excess).ravel()))
    at = _index(i, want.shape)
    bad = int((~same).sum())
    return _Mismatch(name, (
        f"{name}: at index {at} got {g.ravel()[i]:.6g}, expected {want.ravel()[i]:.6g} (numpy_attn's), "
        f"off by {diff.ravel()[i]:.3g}\n"
        f"    tolerance there: atol {tol['atol']:.3g} + rtol {tol['rtol']:.3g} x |expected| = {bound.ravel()[i]:.3g}; "
        f"{bad} of {want.size} entries exceed theirs\n"
        + _wrapped(f"why this tolerance: {why}")))


def _compare_low(name, got, truth, baseline, dtype, extra):
    """FlashAttention's rule: max |got - truth| <= 2 max |numpy_attn's - truth| + one ulp of
    max |truth| (+ ``extra``), numpy_attn computing in the same low ``dtype``; a _Mismatch or None."""
    unlike = _unlike(name, got, truth, dtype)
    if unlike:
        return unlike
    finite = np.isfinite(truth)
    g = np.asarray(got).astype(np.float64)
    if not np.array_equal(g[~finite], truth[~finite]):
        return _Mismatch(name, f"{name}: its non-finite entries differ from numpy_attn's float64 truth")
    if not finite.any():
        return None
    err = np.where(finite, np.abs(g - truth), 0.0)
    err = np.where(np.isnan(err), np.inf, err)
    base = float(np.max(np.abs(baseline.astype(np.float64) - truth)[finite]))
    largest = np.asarray(np.max(np.abs(truth[finite])), dtype=dtype)
    one_ulp = float(np.abs(np.spacing(np.abs(largest))))
    bound = 2 * base + one_ulp + extra
    i = int(np.argmax(err.ravel()))
    if err.ravel()[i] <= bound:
        return None
    return _Mismatch(name, (
        f"{name}: at index {_index(i, truth.shape)} got {g.ravel()[i]:.6g}, expected {truth.ravel()[i]:.6g} "
        f"(numpy_attn's in float64 on the same rounded inputs), off by {err.ravel()[i]:.3g}\n"
        f"    tolerance: 2 x numpy_attn's own {dtype} error {base:.3g} + one ulp {one_ulp:.3g} of the largest "
        f"|truth| + {extra:.3g} = {bound:.3g}\n"
        + _wrapped("why this tolerance: FlashAttention's rule (docs/precision.md): at most twice the error of "
                   "numpy_attn computing as PyTorch's CPU kernels do (float32 inside, rounded once), plus the float32 "
                   "noise of the terms a gradient cancels")))


def _rounded(case, dtype):
    """The case's arrays rounded to ``dtype`` (bool masks left alone), and the same in float64."""
    def cast(a):
        return a.astype(dtype) if isinstance(a, np.ndarray) and a.dtype == np.float64 else a
    low = Case(tree_map(cast, case.inputs), {k: cast(v) for k, v in case.options.items()}, cast(case.dout))
    wide = Case(tree_map(lambda a: a.astype(np.float64), low.inputs),
                {k: v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype != np.bool_ else v
                 for k, v in low.options.items()}, low.dout.astype(np.float64))
    return low, wide


def _reference(op, case):
    """numpy_attn's (out, {gradient name: array}, cache) on ``case``."""
    out, cache = op.call(op.forward, case.inputs, case.options, False)
    return out, _flat(op.grads(op.backward(case.dout, cache), case), "d"), cache


def _raised(what, err):
    """The report's line for an error the function under test raised."""
    text = f"{what} raised {type(err).__name__}: {err}"
    if isinstance(err, TypeError) and "keyword argument" in str(err):
        text += ("\n    (a keyword argument is passed only when it differs from its default: an option fixes it, "
                 "e.g. axis=-1 for softmax, masks=('none',) and scale=False for attention)")
    return text


# The report's words for a NumPy backward that raises NotImplementedError: one still to be written,
# as numpy-attn exercise leaves it.
NOT_WRITTEN = "the backward is not written yet"


class _Failed(Exception):
    """The function under test raised or returned something unusable: the text says what. ``out`` is
    the forward's output where the forward ran and the backward failed (it is still compared), else None."""

    def __init__(self, text, out=None):
        super().__init__(text)
        self.out = out


def _run_numpy(op, forward, backward, case):
    """The function under test's (out, {gradient name: array}) on copies of the case's arrays."""
    inputs = tree_map(np.copy, case.inputs)
    try:
        result = op.call(forward, inputs, case.options, False)
    except Exception as err:                                         # the user's code: any error is a finding
        raise _Failed(_raised("forward", err)) from None
    if not (isinstance(result, tuple) and len(result) == 2):
        raise _Failed(f"forward must return (out, cache), got {type(result).__name__}"
                      f"{f' of {len(result)} items' if isinstance(result, tuple) else ''}")
    out, cache = result
    if backward is None:
        return out, {}
    try:
        grads = backward(case.dout.copy(), cache)
    except NotImplementedError as err:
        raise _Failed(f"{NOT_WRITTEN}: {getattr(backward, '__qualname__', 'it')} raised NotImplementedError"
                      + (f" ({err})" if str(err) else ""), out) from None
    except Exception as err:
        raise _Failed(f"backward raised {type(err).__name__}: {err}", out) from None
    try:
        return out, _flat(op.grads(grads, case), "d")
    except (TypeError, ValueError) as err:
        raise _Failed(f"backward returned {type(grads).__name__}, not what it should ({err}); "
                      f"{op.signature}", out) from None


def _run_torch(op, forward, case, device):
    """The torch function's (out, {gradient name: array}) from autograd, its inputs on ``device``."""
    import torch

    tensors = tree_map(lambda a: to_torch(a, requires_grad=True, device=device), case.inputs)
    options = {k: to_torch(v, device=device) if isinstance(v, np.ndarray) else v for k, v in case.options.items()}
    try:
        out = op.call(forward, tensors, options, True)
    except Exception as err:
        raise _Failed(_raised("forward", err)) from None
    out = out[0] if isinstance(out, tuple | list) and out else out
    if not isinstance(out, torch.Tensor):
        raise _Failed(f"forward must return a tensor, or a tuple whose first item is one, got {type(out).__name__}")
    try:
        (out * to_torch(case.dout, device=device)).sum().backward()
    except Exception as err:
        raise _Failed(f"autograd's backward raised {type(err).__name__}: {err}") from None
    grads = tree_map(lambda t: np.zeros(tuple(t.shape), to_numpy(t).dtype) if t.grad is None else to_numpy(t.grad),
                     tensors)
    return to_numpy(out), _flat(grads, "d")


def _report(op_name, options, who, dtype, seed, examples, low, problems, compared):
    """The text of a CheckFailure."""
    settings_text = ", ".join(f"{k}={v!r}" for k, v in options.items()) or "none (every option drawn)"
    unwritten = any(isinstance(p, str) and p.startswith(NOT_WRITTEN) for p in problems)
    headline = f"{NOT_WRITTEN}: write it, then check again" if unwritten else \
        "the function under test disagrees with numpy_attn's"
    lines = [f"{op_name}: {headline} "
             f"({dtype}, seed {seed}, examples {examples})",
             f"  function under test: {who}",
             f"  options: {settings_text}"]
    lines += [f"  wrong: {p.text}" if isinstance(p, _Mismatch) else f"  failed: {p}" for p in problems]
    right = [name for name in compared if name not in {p.name for p in problems if isinstance(p, _Mismatch)}]
    if right:
        lines.append(f"  right: {', '.join(right)}")
    lines.append("  smallest failing input found (after shrinking):")
    for name, a in leaves(low.inputs):
        lines.append(f"    {name} {_show(a)}")
    for name, value in low.options.items():
        lines.append(f"    {name} {_show(value) if isinstance(value, np.ndarray) else repr(value)}")
    lines.append(f"    dout {_show(low.dout)}")
    lines.append(f"  reproduce: check({op_name!r}, ..., examples={examples}, seed={seed}, dtype={dtype!r}"
                 + "".join(f", {k}={v!r}" for k, v in options.items()) + ")")
    return "\n".join(lines)


def _functions(forward, backward, seed, framework):
    """(seed, whether ``forward`` is a torch function) of check's and check_model's arguments;
    TypeError or ValueError naming the one at fault."""
    if not callable(forward):
        raise TypeError(f"forward must be a function, got {type(forward).__name__}")
    if backward is not None and not callable(backward):
        raise TypeError(f"backward must be a function or None, got {type(backward).__name__}")
    seed = 0 if seed is None else seed
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")
    if framework not in (None, "numpy", "torch"):
        raise ValueError(f'framework must be "numpy", "torch" or None, got {framework!r}')
    return seed, (framework == "torch" if framework else backward is None and _is_torch_function(forward))


def check(op, forward, backward=None, *, examples=50, seed=None, dtype="float64", **options):
    """Check ``forward`` (and ``backward``) of the operation ``op`` against numpy_attn's on
    ``examples`` inputs drawn by Hypothesis from ``seed`` (None: 0, the same examples every run).

    ``op`` is one of OPERATIONS (softmax, linear, layer_norm, rms_norm, gelu, attention,
    flash_attention, multi_head); the
    functions' signatures are in this module's docstring. ``dtype``: float64 (the inputs drawn in
    float64 and compared with the project's float64 tolerance), float32 (the same inputs rounded,
    the float32 tolerance) or float16 / bfloat16 (the 2x rule of docs/precision.md against
    numpy_attn's own result in that dtype). ``options``: the operation's (module docstring), and
    ``framework`` ("numpy" or "torch", found from the function when not given) and ``device``
    (torch's, default "cpu").

    Returns None when every example agrees; raises CheckFailure (an AssertionError) with the report
    of a smallest failing input otherwise, and ValueError or TypeError on bad arguments.
    """
    if op not in OPERATIONS:
        raise ValueError(f"unknown operation {op!r}: check knows {', '.join(OPERATIONS)}")
    if isinstance(examples, bool) or not isinstance(examples, int) or examples < 1:
        raise ValueError(f"examples must be a positive integer, got {examples!r}")
    low_dtype = _dtype(dtype)
    framework = options.pop("framework", None)
    device = options.pop("device", "cpu")
    seed, torch_side = _functions(forward, backward, seed, framework)
    if torch_side and backward is not None:
        raise TypeError("a torch forward's backward is autograd's: pass backward=None (a torch.autograd.Function "
                        "of your own is checked through autograd)")
    operation = OPERATIONS[op]
    known = [p for p in inspect.signature(operation.cases).parameters if p != "draw"]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(f"{op} has no option {', '.join(map(repr, unknown))}: its options are "
                        f"{', '.join(known + ['framework', 'device'])}")
    dropout = options.get("dropout", False)
    if not isinstance(dropout, bool) and not (isinstance(dropout, int | float) and 0 <= dropout < 1):
        # p = 1 drops every weight (the kept ones' scale 1 / (1 - p) is infinite): attention refuses it
        raise ValueError(f"dropout must be True, False or a probability in [0, 1), got {dropout!r}")
    if options.get("dropout") and low_dtype.name in ("float16", "bfloat16"):
        raise ValueError(f"dropout is checked in float64 and float32, not {dtype}: the 2x rule's baseline, "
                         "numpy_attn in that dtype, draws its keep-mask in float32 and would drop other weights")
    if options.get("dropout") and not torch_side and low_dtype != np.float64 and "keep" not in _parameters(forward):
        raise TypeError(f"with dropout in {dtype}, a NumPy forward must take keep= (the keep-mask to replay): "
                        "numpy_attn draws its mask in the compute dtype, so the seeded rng that replays it in "
                        "float64 draws another mask in float32")
    name = getattr(forward, "__qualname__", type(forward).__name__)
    who = (f"{getattr(forward, '__module__', '?')}.{name} (torch, autograd's backward, on {device})" if torch_side
           else f"{getattr(forward, '__module__', '?')}.{name} (NumPy, "
                f"{'backward ' + getattr(backward, '__qualname__', '?') if backward else 'forward only'})")
    strategy = operation.cases(**options)

    @hypothesis_seed(seed)
    @settings(max_examples=examples, deadline=None, database=None, derandomize=False, print_blob=False,
              suppress_health_check=list(HealthCheck), phases=(Phase.generate, Phase.shrink),
              verbosity=Verbosity.quiet, report_multiple_bugs=False)
    @given(case=strategy)
    def one(case):
        problems, compared = _problems(operation, forward, backward, case, low_dtype, torch_side, device)
        if problems:
            low, _ = _rounded(case, low_dtype)
            raise CheckFailure(_report(op, options, who, dtype, seed, examples, low, problems, compared))

    try:
        one()
    except CheckFailure as failure:
        raise CheckFailure(str(failure)) from None                # without Hypothesis's notes and traceback


def _problems(op, forward, backward, case, dtype, torch_side, device):
    """What is wrong with the function under test on ``case`` (a list of _Mismatch or texts), and
    the names of the outputs and gradients compared."""
    low, wide = _rounded(case, dtype)
    out, grads, cache = _reference(op, wide)
    failed = []                                      # the backward's failure: the forward is still compared
    try:
        got_out, got_grads = (_run_torch(op, forward, low, device) if torch_side
                              else _run_numpy(op, forward, backward, low))
    except _Failed as err:
        if err.out is None:
            return [str(err)], []
        failed, got_out, got_grads = [str(err)], err.out, {}
    expected = {"out": out, **(grads if (torch_side or backward is not None) and not failed else {})}
    missing = sorted(set(expected) - set(got_grads) - {"out"})
    if missing:
        return [f"the backward returned no {', '.join(missing)}; {op.signature}"], []
    got = {"out": got_out, **got_grads}
    special = op.tols(wide, cache, dtype if dtype.name in ("float64", "float32") else np.dtype(np.float32))
    problems = []
    if dtype.name in ("float64", "float32"):
        tol = TOLERANCES[dtype]
        own = f"{dtype.name}'s rtol {tol['rtol']:g}, atol {tol['atol']:g} ({WHY[dtype.name]})"
        for name, want in expected.items():
            r, a, _, why = special.get(name, special.get("*", (1, 1, 0, None))) if name != "out" else (1, 1, 0, None)
            why = f"{own}, as numpy_attn's own tests" + ("" if why is None else f"; {why}")
            problems.append(_compare(name, got[name], want, dtype,
                                     dict(rtol=tol["rtol"] * r, atol=tol["atol"] * a), why))
        return failed + [p for p in problems if p], list(expected)
    base_out, base_grads, _ = _reference(op, low)
    baseline = {"out": base_out, **base_grads}
    for name, want in expected.items():
        terms = special.get(name, special.get("*", (1, 1, 1.0, "")))[2] if name != "out" else 0.0
        problems.append(_compare_low(name, got[name], want, baseline[name], dtype, FLOAT32_NOISE * max(terms, 1.0)
                                     if name != "out" else 0.0))
    return failed + [p for p in problems if p], list(expected)


# -- whole models ---------------------------------------------------------------------------------------

def model_tolerance(scale):
    """float64's tolerance for a model's tensor: rtol 1e-10 and atol 1e-10 times ``scale``, the
    largest |value| of the tensor for a hidden state or the logits, of every gradient of the model
    for a gradient (the key bias's is zero in exact arithmetic, as adding q . b_k to every score of
    a row leaves its softmax unchanged: only rounding of the larger terms remains).

    Two correct float64 programs of the same model differ only in the order they round in: each
    step adds a few ulps (1.1e-16) relative to the largest value it combines, and over a small
    model's blocks, norms and head that stays near 1e-13 of that scale (numpy_attn's families meet
    transformers' so). 1e-10 of it leaves 1000x room; a wrong term errs by 1e-3 of it or more."""
    return dict(rtol=1e-10, atol=1e-10 * scale)


MODEL_WHY = ("float64 against float64: two correct programs of the same model differ only in the order they "
             "round in, near 1e-13 of the largest value compared (of the tensor; of every gradient for a "
             "gradient); 1e-10 of it leaves 1000x room, and a wrong term errs by 1e-3 of it or more")


def _model_names(n_layer, count):
    """The names of ``count`` hidden states of a model of ``n_layer`` blocks: each block's output
    (count n_layer), or transformers' output_hidden_states (count n_layer + 1: the embedding's
    output, blocks 0 .. n_layer - 2's, and the last block's after the final norm)."""
    if count == n_layer:
        return [f"blocks.{i}" for i in range(n_layer)]
    return ["embedding"] + [f"blocks.{i}" for i in range(n_layer - 1)] + ["final norm"]


def _model_reference(family, config, params, ids, dlogits):
    """numpy_attn's ({name: hidden state} for each kind of list, logits, {gradient name: array}, or {}
    without dlogits)."""
    logits, cache = family.forward(ids, params, config)
    hidden = list(cache.hidden)                                # embedding, blocks 0 .. n_layer - 1
    states = {"embedding": hidden[0], **{f"blocks.{i}": h for i, h in enumerate(hidden[1:])},
              "final norm": cache.head.linear.x}               # the head's input
    return states, logits, {} if dlogits is None else _flat(family.backward(dlogits, cache), "d")


def _model_outputs(result, with_cache, n_layer):
    """(logits, hidden states or None, cache) of what the forward returned; ValueError naming what is wrong."""
    cache = None
    if with_cache:
        if not isinstance(result, tuple) or len(result) not in (2, 3):
            raise ValueError(f"a NumPy forward with a backward must return (logits, cache) or (logits, "
                             f"hidden_states, cache), got {_kind(result)}")
        *result, cache = result
        result = tuple(result) if len(result) > 1 else result[0]
    if hasattr(result, "logits"):                              # transformers' output
        logits, hidden = result.logits, getattr(result, "hidden_states", None)
    elif isinstance(result, tuple | list):
        if len(result) != 2:
            raise ValueError(f"the forward must return logits or (logits, hidden_states), got {_kind(result)}")
        logits, hidden = result
    else:
        logits, hidden = result, None
    if hidden is not None and (not isinstance(hidden, tuple | list) or len(hidden) not in (n_layer, n_layer + 1)):
        raise ValueError(f"the forward's hidden_states must be a list of one per block ({n_layer}), or of "
                         f"{n_layer + 1} as transformers' output_hidden_states, got {_kind(hidden)}"
                         + ("" if with_cache else " (a NumPy forward that returns its cache last needs its backward)"))
    return logits, hidden, cache


def _kind(value):
    return f"{type(value).__name__}" + (f" of {len(value)} items" if isinstance(value, tuple | list) else "")


def _check_model_shape(what, got, shape):
    """Raise ValueError unless ``got`` is an array of ``shape``, naming ``what``."""
    if not hasattr(got, "shape"):
        raise ValueError(f"the forward returned {what} of type {type(got).__name__}, not an array")
    if tuple(got.shape) != tuple(shape):
        raise ValueError(f"the forward returned {what} of shape {tuple(got.shape)}, expected {tuple(shape)}")


def _run_model(forward, backward, ids, params, dlogits, torch_side, device, n_layer, gradients):
    """The model under test's (logits, hidden states or None, {gradient name: array or None} or None)."""
    if torch_side:
        import torch

        tensors = tree_map(lambda a: to_torch(a, requires_grad=gradients, device=device), params)
        try:
            result = forward(torch.from_numpy(ids).to(device), tensors)
        except Exception as err:                                # the user's code: any error is a finding
            raise _Failed(_raised("forward", err)) from None
        logits, hidden, _ = _model_outputs(result, False, n_layer)
        _check_model_shape("logits", logits, dlogits.shape)
        grads = None
        if gradients:
            try:
                (logits * to_torch(dlogits, device=device)).sum().backward()
            except Exception as err:
                raise _Failed(f"autograd's backward raised {type(err).__name__}: {err}") from None
            grads = {f"d{path}": None if t.grad is None else to_numpy(t.grad) for path, t in leaves(tensors)}
        hidden = None if hidden is None else [to_numpy(h) if isinstance(h, torch.Tensor) else h for h in hidden]
        return to_numpy(logits), hidden, grads
    try:
        result = forward(ids.copy(), tree_map(np.copy, params))
    except Exception as err:
        raise _Failed(_raised("forward", err)) from None
    logits, hidden, cache = _model_outputs(result, backward is not None, n_layer)
    _check_model_shape("logits", logits, dlogits.shape)
    if backward is None:
        return logits, hidden, None
    try:
        grads = backward(dlogits.copy(), cache)
    except Exception as err:
        raise _Failed(f"backward raised {type(err).__name__}: {err}") from None
    if not isinstance(grads, dict):
        raise _Failed(f"backward must return dparams, a dict nested as the params, got {type(grads).__name__}")
    return logits, hidden, _flat(grads, "d")


def _check_model_params(family, config, params):
    """``params`` in float64, or raise naming the leaf that is missing, extra or of the wrong shape
    for a ``family`` model of ``config``."""
    # The layout from the family's own init, in float32 to allocate half what float64 would.
    want = dict(leaves(family.init_params(config, np.random.default_rng(0), np.float32)))
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict nested as {family.name}'s, got {type(params).__name__}")
    got = dict(leaves(params))
    for path in want:
        if path not in got:
            raise ValueError(f"params has no {path!r}, which a {family.name} model of this config has "
                             f"(shape {want[path].shape})")
    for path, leaf in got.items():
        if path not in want:
            raise ValueError(f"params has {path!r}, which a {family.name} model of this config has not")
        if not isinstance(leaf, np.ndarray) or not np.issubdtype(leaf.dtype, np.floating):
            raise TypeError(f"params[{path!r}] must be a float array, got {type(leaf).__name__}"
                            + (f" of {leaf.dtype}" if isinstance(leaf, np.ndarray) else ""))
        if leaf.shape != want[path].shape:
            raise ValueError(f"params[{path!r}] has shape {leaf.shape}; a {family.name} model of this config "
                             f"needs {want[path].shape}")
    return tree_map(lambda a: a.astype(np.float64), params)


def _spans(names):
    """``names`` with runs of blocks.i joined: "embedding, blocks.0-2, final norm"."""
    out, run = [], []
    for name in names + [None]:
        if name is not None and name.startswith("blocks.") and name[7:].isdigit() and \
                (not run or int(name[7:]) == int(run[-1][7:]) + 1):
            run.append(name)
            continue
        if run:
            out.append(run[0] if len(run) == 1 else f"{run[0]}-{run[-1][7:]}")
            run = []
        if name is not None and name.startswith("blocks.") and name[7:].isdigit():
            run = [name]
        elif name is not None:
            out.append(name)
    return ", ".join(out)


def _summary(names, grads):
    """``names`` for a report: the hidden states and logits by name (_spans), the gradients counted."""
    states = [n for n in names if n not in grads]
    gradients = [n for n in names if n in grads]
    parts = [_spans(states)] if states else []
    if gradients:
        parts.append(gradients[0] if len(gradients) == 1 else
                     f"{len(gradients)} gradients ({gradients[0]} .. {gradients[-1]})")
    return ", ".join(parts)


def check_model(family, forward, backward=None, *, params=None, config=None, ids=None, seed=None,
                framework=None, device="cpu", gradients=True):
    """Check a whole model, ``forward`` (and ``backward``), against numpy_attn's model ``family`` on
    the same weights, layer by layer, in float64.

    ``family`` names one of numpy_attn's families ("gpt2", "llama", "qwen3", "gemma2", ...);
    ``config`` is its config class (default: the class's defaults, a small model) and ``params``
    its weights in numpy_attn's layout (default: the family's init, drawn from ``seed``; a Hugging
    Face folder's through attn_cli.hf.load_checkpoint or ``numpy-attn check --model --hf``). ``ids``
    (B, T) are the token ids (default: (2, 8) drawn from ``seed``, None: 0), and the gradients are
    those of sum(logits * dlogits), dlogits drawn from ``seed``.

    ``forward(ids, params)`` returns the logits (B, T, V), or ``(logits, hidden_states)``: one
    hidden state (B, T, C) per block, each block's output, or n_layer + 1 of them as transformers'
    ``output_hidden_states`` gives them (the embedding's output first, the last after the final
    norm); an output object with ``.logits`` and ``.hidden_states`` will do. A NumPy forward with a
    ``backward(dlogits, cache) -> dparams`` (nested as the params) returns the cache last. A torch
    forward gets the ids as a tensor and the params as tensors on ``device`` that require grad,
    and autograd gives every parameter's gradient; the reference stays on the CPU.
    ``gradients=False`` compares the hidden states and logits only: for a model that holds the
    weights itself (a transformers model loaded with them), which the params given do not reach.

    The hidden states are compared in order, then the logits, then each parameter's gradient by its
    dotted name (model_tolerance). Returns None when all agree; raises CheckFailure whose report
    names the first that departs, where and by how much, and what agreed before it; ValueError or
    TypeError on bad arguments, or when the forward returns something of the wrong shape.
    """
    from numpy_attn._family import families

    found = families()
    if family not in found:
        raise ValueError(f"unknown family {family!r}: check_model knows {', '.join(found)}")
    row = found[family]
    seed, torch_side = _functions(forward, backward, seed, framework)
    if torch_side and backward is not None:
        raise TypeError("a torch forward's backward is autograd's: pass backward=None")
    config = row.config() if config is None else config
    if type(config) is not row.config:
        raise TypeError(f"config must be a {row.config.__name__} for {family}, got {type(config).__name__}")
    if getattr(config, "dropout", 0):
        raise ValueError(f"config.dropout must be 0: check_model compares models without dropout, got "
                         f"{config.dropout}")
    rng = np.random.default_rng(seed)
    given = params is not None
    params = _check_model_params(row, config, params) if given else row.init_params(config, rng, np.float64)
    if ids is None:
        ids = rng.integers(0, config.vocab_size, (2, min(8, config.block_size)))
    ids = np.asarray(ids)
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"ids must be integer token ids of shape (B, T), got {ids.dtype} {ids.shape}")
    dlogits = rng.standard_normal((*ids.shape, config.vocab_size))          # (B, T, V)
    if not isinstance(gradients, bool):
        raise TypeError(f"gradients must be True or False, got {gradients!r}")
    if not gradients and backward is not None:
        raise TypeError("gradients=False compares no gradients: pass no backward")
    states, logits, grads = _model_reference(row, config, params, ids, dlogits if gradients else None)

    name = getattr(forward, "__qualname__", type(forward).__name__)
    who = (f"{getattr(forward, '__module__', '?')}.{name} (torch, autograd's backward, on {device}; the "
           f"reference on the cpu)" if torch_side
           else f"{getattr(forward, '__module__', '?')}.{name} (NumPy, "
                f"{'backward ' + getattr(backward, '__qualname__', '?') if backward else 'forward only'})")
    head = [f"  model under test: {who}",
            _wrapped(f"model: {family}, {config}")[2:],
            f"  params: {'given' if given else f'{row.init_params.__name__}, seed {seed}'}; ids {ids.shape}, "
            f"dlogits drawn from seed {seed}"]
    reproduce = f"  reproduce: check_model({family!r}, ..., seed={seed}{'' if gradients else ', gradients=False'})"
    try:
        got_logits, got_hidden, got_grads = _run_model(forward, backward, ids, params, dlogits, torch_side, device,
                                                       config.n_layer, gradients)
    except _Failed as err:
        raise CheckFailure("\n".join([f"{family}: the model under test failed to run (float64, seed {seed})",
                                      *head, f"  failed: {err}", reproduce])) from None
    compared = []                                              # (name, got, expected), in the order compared
    if got_hidden is not None:
        names = _model_names(config.n_layer, len(got_hidden))
        for i, (n, h) in enumerate(zip(names, got_hidden, strict=True)):
            _check_model_shape(f"hidden_states[{i}] ({n})", h, states[n].shape)
            compared.append((n, h, states[n]))
    compared.append(("logits", got_logits, logits))
    if got_grads is not None:
        compared += [(n, got_grads.get(n, "missing"), want) for n, want in grads.items()]
    largest_gradient = max([0.0] + [float(np.abs(g).max(initial=0)) for g in grads.values()])
    problems = []
    for n, got, want in compared:
        if isinstance(got, str) or got is None:
            problems.append(_Mismatch(n, f"{n}: the backward returned none" if isinstance(got, str) else
                                      f"{n}: no gradient reached it (its .grad is None: the forward does not use "
                                      "the tensor it was given)"))
            continue
        scale = largest_gradient if n in grads else float(np.abs(want).max(initial=0))
        problem = _compare(n, got, want, np.dtype(np.float64), model_tolerance(scale), MODEL_WHY)
        if problem:
            problems.append(problem)
    if not problems:
        return None
    first = problems[0]
    order = [n for n, _, _ in compared]
    before, after = order[:order.index(first.name)], [p.name for p in problems[1:]]
    where = f"{first.name}, its output" if first.name.startswith("blocks.") else first.name
    lines = [f"{family}: the model under test departs from numpy_attn's first at {where} (float64, seed {seed})",
             *head, f"  first departs: {first.text}"]
    lines.append(f"  agree before it: {_summary(before, grads) if before else 'nothing (it is the first compared)'}")
    if after:
        lines.append(f"  depart after it too: {_summary(after, grads)}")
    if got_hidden is None:
        lines.append("  (the forward returned no hidden_states: return (logits, hidden_states) to find the block)")
    lines.append(reproduce)
    raise CheckFailure("\n".join(lines))
