"""Parity tests for numpy_attn/qk_norm.py and torch_attn/qk_norm.py: the RMS norm of q and of k
(Qwen3 and Gemma 3 per head, OLMo 2 over the projection); the models using it are tested in
test_qwen3.py, test_olmo2.py and test_gemma2.py."""

import numpy as np
import pytest
import torch.nn.functional as F
from hypothesis import assume, given
from hypothesis import strategies as st

from numpy_attn.qk_norm import qk_norm_backward, qk_norm_forward
from numpy_attn.rms_norm import rms_norm_forward
from parity_tests import strategies as S
from parity_tests.helpers import (
    LOW_DTYPES,
    assert_close,
    assert_tree_close,
    autograd,
    directional_derivative,
    directional_tol,
    layer_norm_tol,
    to_numpy,
    to_torch,
    tree_dot,
    tree_map,
)
from torch_attn.qk_norm import qk_norm


@st.composite
def qk_norms(draw, dtype=None):
    """(q, k, params, eps, dq, dk, kind): per head, q (B, nh, T, hs) and k (B, nkv, T, hs) with weights
    (hs,); over the projection, q (B, T, nh*hs) and k (B, T, nkv*hs) with their own widths."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    B, T, nkv, hs = draw(S.dim(1, 2)), draw(S.dim(1, 4)), draw(S.dim(1, 2)), draw(S.dim(1, 4))
    nh = nkv * draw(S.dim(1, 2))
    kind = draw(st.sampled_from(["head", "projection"]))
    if kind == "head":
        q_shape, k_shape = (B, nh, T, hs), (B, nkv, T, hs)
    else:
        q_shape, k_shape = (B, T, nh * hs), (B, T, nkv * hs)
    q, k, dq, dk = (draw(S.arrays(dtype, shape)) for shape in (q_shape, k_shape, q_shape, k_shape))
    params = {"q_norm": {"w": draw(S.arrays(dtype, q_shape[-1:], 2.0))},
              "k_norm": {"w": draw(S.arrays(dtype, k_shape[-1:], 2.0))}}
    return q, k, params, draw(st.sampled_from([1e-6, 1e-5])), dq, dk, kind


def _qk_tol(cache, dtype):
    """Each RMS norm multiplies its input's rounding by its rstd (see layer_norm_tol)."""
    return layer_norm_tol([cache.q[1], cache.k[1]], dtype)


# -- forward and backward match the twin and autograd ---------------------------------------------

@pytest.mark.twin_parity
@given(case=qk_norms())
def test_qk_norm_matches_twin_and_autograd(case):
    """qk_norm_forward against the twin's qk_norm, and qk_norm_backward (dq, dk and both
    weights' gradients) against autograd through (q_out * dq).sum() + (k_out * dk).sum()."""
    q, k, params, eps, dq, dk, kind = case
    q_out, k_out, cache = qk_norm_forward(q, k, params, eps)
    dq_in, dk_in, dparams = qk_norm_backward(dq, dk, cache)
    tq, tk, tparams = to_torch(q).requires_grad_(), to_torch(k).requires_grad_(), tree_map(to_torch, params)
    for leaf in (tparams["q_norm"]["w"], tparams["k_norm"]["w"]):
        leaf.requires_grad_()
    twin_q, twin_k = qk_norm(tq, tk, tparams, eps)
    ((twin_q * to_torch(dq)).sum() + (twin_k * to_torch(dk)).sum()).backward()
    tol = _qk_tol(cache, q.dtype)
    assert_close("qk_norm.q", q_out, to_numpy(twin_q), **tol)
    assert_close("qk_norm.k", k_out, to_numpy(twin_k), **tol)
    assert_close("qk_norm.dq", dq_in, to_numpy(tq.grad), **tol)
    assert_close("qk_norm.dk", dk_in, to_numpy(tk.grad), **tol)
    assert_tree_close("qk_norm.dparams", dparams, tree_map(lambda t: to_numpy(t.grad), tparams), **tol)


# -- the twin matches PyTorch's built-in --------------------------------------------------------

@given(case=qk_norms(dtype=np.float64))
def test_twin_matches_builtin(case):
    """F.rms_norm on q and on k, each over its last axis with its own weight."""
    q, k, params, eps, dq, dk, kind = case

    def builtin(q, k, wq, wk):
        return (F.rms_norm(q, wq.shape, wq, eps), F.rms_norm(k, wk.shape, wk, eps))

    def twin(q, k, wq, wk):
        return qk_norm(q, k, {"q_norm": {"w": wq}, "k_norm": {"w": wk}}, eps)

    inputs = {"q": q, "k": k, "wq": params["q_norm"]["w"], "wk": params["k_norm"]["w"]}
    tol = _qk_tol(qk_norm_forward(q, k, params, eps)[2], q.dtype)
    for i, name in enumerate(("q", "k")):
        douts = dq if name == "q" else dk
        twin_out, twin_grads = autograd(lambda i=i, **kw: twin(**kw)[i], inputs, douts)
        builtin_out, builtin_grads = autograd(lambda i=i, **kw: builtin(**kw)[i], inputs, douts)
        assert_close(f"qk_norm.{name} vs F.rms_norm", twin_out, builtin_out, **tol)
        assert_tree_close(f"qk_norm.d/d{name} vs F.rms_norm", twin_grads, builtin_grads, **tol)


# -- properties -----------------------------------------------------------------------------------

@given(case=qk_norms(dtype=np.float64), scale=st.floats(0.25, 8.0))
def test_a_scaled_query_gives_the_same_normed_query(case, scale):
    """With eps = 0 the norm removes any scale of its input's rows: the scores q . k it feeds are
    bounded by the weights alone, whatever the projections learn (what QK-norm is for)."""
    q, k, params, _, _, _, _ = case
    assume(np.all(np.sqrt(np.mean(q * q, axis=-1)) > 1e-3))   # a row of zeros has no scale to remove
    q_out, k_out, _ = qk_norm_forward(q, k, params, 0.0)
    q_scaled, k_same, _ = qk_norm_forward(q * scale, k, params, 0.0)
    assert_close("qk_norm.q of a scaled q", q_scaled, q_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(k_same, k_out)
    bound = np.sqrt(q.shape[-1]) * np.abs(params["q_norm"]["w"]).max()
    assert np.abs(q_out).max() <= bound * (1 + 1e-12), "a normed row is at most sqrt(d) max|w| long"


# -- finite differences (no torch) ----------------------------------------------------------------

@given(case=qk_norms(dtype=np.float64), seed=st.integers(0, 2**32 - 1))
def test_qk_norm_backward_matches_finite_differences(case, seed):
    """One directional derivative of sum(q_out * dq) + sum(k_out * dk) along a random direction
    in q, k and both weights."""
    q, k, params, eps, dq, dk, kind = case
    rng = np.random.default_rng(seed)
    tree = {"q": q, "k": k, "params": params}
    direction = tree_map(lambda p: rng.uniform(-1, 1, p.shape), tree)
    q_out, k_out, cache = qk_norm_forward(q, k, params, eps)
    dq_in, dk_in, dparams = qk_norm_backward(dq, dk, cache)
    grads = {"q": dq_in, "k": dk_in, "params": dparams}

    def f(t):
        q_out, k_out, _ = qk_norm_forward(t["q"], t["k"], t["params"], eps)
        return np.sum(q_out * dq) + np.sum(k_out * dk)

    h = 1e-4 / max(1.0, float(cache.q[1].max()), float(cache.k[1].max()))   # narrower rows, smaller step
    assert_close("qk_norm directional derivative vs finite differences", np.float64(tree_dot(grads, direction)),
                 np.float64(directional_derivative(f, tree, direction, h=h)), **directional_tol(grads, direction))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_defaults_are_rms_norms_defaults_in_low_precision(dtype):
    """Each norm is rms_norm_forward with its defaults, xhat rounded to the dtype before the weight
    (Qwen3's RMS norm; Gemma 3's offset norm does not round there): the same program, so the same
    bits. The unrounded product differs in some entries here, so the default is seen."""
    dtype = LOW_DTYPES[dtype][0]
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 2, 5, 8)).astype(dtype), rng.standard_normal((2, 1, 5, 8)).astype(dtype)
    params = {name: {"w": rng.standard_normal(8).astype(dtype)} for name in ("q_norm", "k_norm")}
    qn, kn, _ = qk_norm_forward(q, k, params, 1e-6)
    for x, got, w in ((q, qn, params["q_norm"]["w"]), (k, kn, params["k_norm"]["w"])):
        rounded, _ = rms_norm_forward(x, w, 1e-6)
        assert got.dtype == dtype and np.array_equal(got, rounded)
        assert not np.array_equal(got, rms_norm_forward(x, w, 1e-6, round_xhat=False)[0])


# -- bad input --------------------------------------------------------------------------------------

def test_bad_input_names_the_weight():
    q, k = np.zeros((1, 2, 3, 4)), np.zeros((1, 1, 3, 4))
    ones = {"q_norm": {"w": np.ones(4)}, "k_norm": {"w": np.ones(4)}}
    with pytest.raises(ValueError, match=r"^params\['q_norm'\]\['w'\] must have shape \(4,\) to match q "
                                         r"\(1, 2, 3, 4\), got \(8,\)$"):
        qk_norm_forward(q, k, {**ones, "q_norm": {"w": np.ones(8)}}, 1e-6)
    with pytest.raises(ValueError, match=r"^params\['k_norm'\]\['w'\] must have shape \(4,\) to match k"):
        qk_norm_forward(q, k, {**ones, "k_norm": {"w": np.ones(2)}}, 1e-6)
    with pytest.raises(ValueError, match=r"^params must hold 'q_norm' and 'k_norm', each \{'w': weight\}, "
                                         r"got \['k_norm'\]$"):
        qk_norm_forward(q, k, {"k_norm": ones["k_norm"]}, 1e-6)
    with pytest.raises(ValueError, match="eps must be a number >= 0, got -1"):
        qk_norm_forward(q, k, ones, -1)
    with pytest.raises(TypeError, match="x is float32, w is float64"):
        qk_norm_forward(q.astype(np.float32), k, ones, 1e-6)
    _, _, cache = qk_norm_forward(q, k, ones, 1e-6)
    with pytest.raises(ValueError, match=r"rms_norm: dout must have the shape .* \(1, 1, 3, 4\), got \(1, 2, 3, 4\)"):
        qk_norm_backward(q, q, cache)
