"""Parity tests for numpy_attn/block.py and torch_attn/block.py."""

import re
from functools import partial

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from torch import nn

from numpy_attn.block import block_backward, block_forward, init_block_params
from numpy_attn.feed_forward import feed_forward_backward, feed_forward_forward
from numpy_attn.layer_norm import layer_norm_backward, layer_norm_forward
from numpy_attn.multi_head import multi_head_attention_backward, multi_head_attention_forward
from parity_tests import strategies as S
from parity_tests.helpers import (
    LOW_DTYPES,
    assert_backward_matches_finite_differences,
    assert_close,
    assert_error_budget,
    assert_tree_close,
    autograd,
    layer_norm_tol,
    moved_off_init,
    randomly_rounded,
    round_to,
    to_numpy,
    to_torch,
    tree_leaves,
    tree_map,
)
from parity_tests.model_kit import GRAD_MULTIPLE, encoder_layer, encoder_layer_grads
from torch_attn.block import block


@st.composite
def arrays_like(draw, template, dtype, bound=1.0):
    """A nested dict of drawn arrays with the keys and shapes of ``template``."""
    return tree_map(lambda leaf: draw(S.arrays(dtype, leaf.shape, bound)), template)


@st.composite
def blocks(draw, dtype=None, bias=None):
    """(x, params, num_heads, dout): x (B, T, C) with C = nh * hs, every parameter drawn."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    B, T, nh, hs = draw(S.dim(1, 2)), draw(S.dim(1, 5)), draw(S.dim(1, 3)), draw(S.dim(1, 3))
    C = nh * hs
    bias = draw(st.booleans()) if bias is None else bias
    template = init_block_params(C, np.random.default_rng(0), bias=bias, dtype=dtype)
    params = draw(arrays_like(template, dtype))
    return draw(S.arrays(dtype, (B, T, C), 2.0)), params, nh, draw(S.arrays(dtype, (B, T, C), 2.0))


def _example(T=1, nh=1, hs=2, seed=0):
    """A pinned case from init_block_params with non-trivial layer norms (T = 1, nh = 1 by default)."""
    rng = np.random.default_rng(seed)
    params = moved_off_init(init_block_params(nh * hs, rng, dtype=np.float64), rng)
    return (rng.normal(size=(1, T, nh * hs)), params, nh, rng.normal(size=(1, T, nh * hs)))


def _ln_tol(cache, dtype):
    """Tolerance widened by the rstd of the block's two layer norms (see layer_norm_tol)."""
    return layer_norm_tol([cache.ln1[1], cache.ln2[1]], dtype)


def _grad_tol(cache, dtype, grads):
    """_ln_tol for the block's gradients, its atol in units of the largest of them (at least 1).

    An entry's rounding error follows the size of the terms that made it, not its own size. Every
    gradient of the block sums products of unit-scale activations with the gradients flowing back
    through it, which the largest gradient bounds; where they cancel, the entry is small and keeps
    their rounding. So when every key a query sees is equal (k.w all ones, each row of x with the
    same sum), the softmax's gradient and dq are 0 exactly, yet a float32 program leaves the
    rounding of terms as large as the block's other gradients: a drawn case had dq.w off by 7.5e-5
    in ours (autograd's -4.5e-12), 2.3 times the unscaled atol."""
    tol = _ln_tol(cache, dtype)
    largest = max([1.0] + [float(np.abs(g).max(initial=0.0)) for _, g in tree_leaves(grads)])
    return dict(rtol=tol["rtol"], atol=tol["atol"] * largest)


# -- forward matches the twin -----------------------------------------------------------------

@given(case=blocks())
@example(case=_example())
def test_forward_matches_twin(case):
    x, params, nh, dout = case
    out, cache = block_forward(x, params, nh)
    twin_out, _ = autograd(lambda **kw: block(**kw, num_heads=nh), {"x": x, "params": params}, dout)
    assert_close("block.out", out, twin_out, **_ln_tol(cache, x.dtype))


# -- backward matches autograd ----------------------------------------------------------------

@pytest.mark.twin_parity
@given(case=blocks())
@example(case=_example(T=4, nh=2))
def test_backward_matches_autograd(case):
    """Every gradient of the nested parameters, labelled by path (block.attn.q.w, ...)."""
    x, params, nh, dout = case
    _, cache = block_forward(x, params, nh)
    dx, dparams = block_backward(dout, cache)
    _, grads = autograd(lambda **kw: block(**kw, num_heads=nh), {"x": x, "params": params}, dout)
    tol = _grad_tol(cache, x.dtype, grads)
    assert_close("block.dx", dx, grads["x"], **tol)
    assert_tree_close("block", dparams, grads["params"], **tol)


@given(case=blocks(), p=st.sampled_from([0.1, 0.5]), seed=st.integers(0, 2**32 - 1))
def test_dropout_parity_through_masks(case, p, seed):
    """The NumPy block draws its keep-masks from rng; the twin replays them from cache.masks."""
    x, params, nh, dout = case
    out, cache = block_forward(x, params, nh, dropout_p=p, rng=np.random.default_rng(seed))
    dx, dparams = block_backward(dout, cache)
    masks = {k: to_torch(m) for k, m in cache.masks.items()}
    twin_out, grads = autograd(lambda **kw: block(**kw, num_heads=nh, dropout_p=p, masks=masks),
                               {"x": x, "params": params}, dout)
    assert_close("block[dropout].out", out, twin_out, **_ln_tol(cache, x.dtype))
    tol = _grad_tol(cache, x.dtype, grads)
    assert_close("block[dropout].dx", dx, grads["x"], **tol)
    assert_tree_close("block[dropout]", dparams, grads["params"], **tol)


# -- the twin matches PyTorch's built-in --------------------------------------------------------


def _builtin_tol(x, params, nh, dout):
    """Per-tensor tolerances against nn.TransformerEncoderLayer: layer_norm_tol plus the error of
    the built-in's layer-norm backward, which works from x and its row mean mu, not from x - mu.

    It forms x * rstd - mu * rstd with one rounding of the product mu * rstd (a fused multiply-add)
    and cancels sum(dxhat * x) - mu * sum(dxhat): both leave each row's xhat off by up to
    e = eps * |mu| * rstd, a constant along the row, that ours (centred twice) does not have. On a
    constant row xhat is exactly 0 here and +-e there, with e up to eps * |mu| * 316. That error
    reaches dw = sum over rows of dh * xhat times the layer norm's upstream gradient dh, and
    dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) times rstd * |dxhat| * |xhat|
    (through both xhat terms): gradients of hundreds (dout 2 through a 4C-wide feed-forward of unit
    weights) make it exceed the rstd-scaled atol of layer_norm_tol, which assumes unit gradients.
    ln2's dx error joins the residual gradient beside dout, so every gradient before it (the
    attention's, ln1's, dx) can carry it times their own gain; the bound adds it to all of them.
    """
    eps = np.finfo(x.dtype).eps
    # The block's forward and backward, step by step, for each layer norm's input and upstream dh.
    h1, ln1 = layer_norm_forward(x, **params["ln1"])
    a, attn = multi_head_attention_forward(h1, params["attn"], nh, is_causal=True)
    x2 = x + a
    h2, ln2 = layer_norm_forward(x2, **params["ln2"])
    _, ffn = feed_forward_forward(h2, params["ffn"])
    dh2, _ = feed_forward_backward(dout, ffn)
    dx2 = layer_norm_backward(dh2, ln2)[0] + dout
    dh1, _ = multi_head_attention_backward(dx2, attn)
    tol = layer_norm_tol([ln1[1], ln2[1]], x.dtype)
    bounds = {}
    for name, xin, (xhat, rstd, w, *_), dh in (("ln1", x, ln1, dh1), ("ln2", x2, ln2, dh2)):
        e = eps * np.abs(xin.mean(axis=-1, keepdims=True)) * rstd          # (B, T, 1)
        dxhat = np.abs(dh * w)                                               # (B, T, C)
        bounds[f"{name}.w"] = float((np.abs(dh) * e).sum(axis=(0, 1)).max())
        # |mean(dxhat * xhat)| <= mean|dxhat| * max|xhat| along the row
        bounds[f"{name}.dx"] = float((rstd * e * dxhat.mean(axis=-1, keepdims=True)
                                      * (np.abs(xhat).max(axis=-1, keepdims=True)
                                         + np.abs(xhat))).max())
    # ln2.dx enters every gradient computed after it; ln1.dx only dx.
    upstream = tol["atol"] + bounds["ln2.dx"]
    return {"out": tol,
            "dx": dict(tol, atol=upstream + bounds["ln1.dx"]),
            "ln1.w": dict(tol, atol=upstream + bounds["ln1.w"]),
            "ln2.w": dict(tol, atol=tol["atol"] + bounds["ln2.w"]),
            "attn": dict(tol, atol=upstream), "ln1.b": dict(tol, atol=upstream),
            "ln2.b": tol, "ffn": tol}


def _constant_row_example():
    """float32, one constant row, ln1 and ln2 zero (the attention adds nothing), unit feed-forward
    weights: ln2's upstream gradient is 2 * 4C * C = 324 on a row whose xhat is exactly 0 here and
    -1.5e-5 in the built-in's backward, so their ln2.w differ by 0.005 (layer_norm_tol alone: 3e-3).
    """
    C, f32 = 9, np.float32
    params = tree_map(np.zeros_like, init_block_params(C, np.random.default_rng(0), dtype=f32))
    params["ffn"]["fc"]["w"][:] = 1
    params["ffn"]["proj"]["w"][:] = 1
    return np.full((1, 1, C), 1.4375, f32), params, 3, np.full((1, 1, C), 2, f32)


@given(case=blocks(bias=True))
@example(case=_constant_row_example())
def test_twin_matches_builtin(case):
    x, params, nh, dout = case
    T = x.shape[1]
    twin_out, twin_grads = autograd(lambda **kw: block(**kw, num_heads=nh),
                                    {"x": x, "params": params}, dout)
    layer = encoder_layer(params, nh)
    xt = to_torch(x, requires_grad=True)
    mask = nn.Transformer.generate_square_subsequent_mask(T, dtype=xt.dtype)
    out = layer(xt, src_mask=mask, is_causal=True)
    (out * to_torch(dout)).sum().backward()
    tol = _builtin_tol(x, params, nh, dout)
    assert_close("block.out vs TransformerEncoderLayer", twin_out, to_numpy(out), **tol["out"])
    assert_close("block.dx vs TransformerEncoderLayer", twin_grads["x"], to_numpy(xt.grad),
                 **tol["dx"])
    builtin = dict(tree_leaves(encoder_layer_grads(layer)))
    for path, grad in tree_leaves(twin_grads["params"]):
        group = path if path in tol else path.split(".")[0]
        assert_close(f"block vs TransformerEncoderLayer.{path}", grad, builtin[path], **tol[group])


# -- float16 and bfloat16: FlashAttention's error rule against nn.TransformerEncoderLayer ----------

def _builtin_out_and_grads(x, params, nh, dout):
    """nn.TransformerEncoderLayer (causal) holding ``params`` in their dtype: its output and the
    gradients of sum(out * dout), {"x": dx, "ln1.w": ..., ...} by our dotted paths."""
    layer = encoder_layer(params, nh)
    xt = to_torch(x, requires_grad=True)
    mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], dtype=xt.dtype)
    out = layer(xt, src_mask=mask, is_causal=True)
    (out * to_torch(dout)).sum().backward()
    return to_numpy(out), {"x": to_numpy(xt.grad), **dict(tree_leaves(encoder_layer_grads(layer)))}


@st.composite
def budget_blocks(draw):
    """blocks()'s (x, params, num_heads, dout) in float64 at one small size rather than the tiniest
    (C = 12 on 3 heads, B = 2, 2 <= T <= 7; params moved off init_block_params' values)."""
    return _budget_block(draw(st.integers(2, 7)), draw(st.integers(0, 2**32 - 1), label="seed"))


def _budget_block(T, seed):
    """budget_blocks' case for length ``T`` from ``seed``."""
    rng = np.random.default_rng(seed)
    params = moved_off_init(init_block_params(12, rng, dtype=np.float64), rng)
    return rng.normal(size=(2, T, 12)), params, 3, rng.normal(size=(2, T, 12))


@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@given(case=budget_blocks())
@example(case=_budget_block(2, 120))   # PyTorch's run alone: our dattn.q.b reached 6.95 x its error
def test_low_precision_meets_the_error_budget(dtype, case):
    """Ours and the twin in float16 and bfloat16 against nn.TransformerEncoderLayer in float64 on the
    same rounded inputs, weights and dout, within twice the error of that built-in run in the low
    dtype (PyTorch's own block: its layer norms, linear layers, GELU and sdpa attention, each rounding
    its output, and the residual adds), for the output, dx and every parameter's gradient."""
    x, params, nh, dout = case
    x, dout, params = round_to(x, dtype), round_to(dout, dtype), tree_map(lambda p: round_to(p, dtype), params)
    out, cache = block_forward(x, params, nh)
    dx, dparams = block_backward(dout, cache)
    twin_out, twin_grads = autograd(lambda **kw: block(**kw, num_heads=nh), {"x": x, "params": params}, dout)
    lowp_out, lowp_grads = _builtin_out_and_grads(x, params, nh, dout)
    wide = tree_map(lambda p: p.astype(np.float64), params)
    truth = partial(_builtin_out_and_grads, x.astype(np.float64), wide, nh, dout.astype(np.float64))
    truth_out, truth_grads = truth()
    runs = randomly_rounded(truth, dtype)   # helpers.RANDOM_ROUNDINGS says why
    for who, (o, g) in {"numpy": (out, {"x": dx, **dict(tree_leaves(dparams))}),
                        "twin": (twin_out, {"x": twin_grads["x"], **dict(tree_leaves(twin_grads["params"]))})}.items():
        assert_error_budget(f"block[{who}]", dtype, {"out": (o, lowp_out, truth_out, [r[0] for r in runs])})
        assert_error_budget(f"block[{who}]", dtype,
                            {f"d{path}": (g[path], lowp_grads[path], truth_grads[path], [r[1][path] for r in runs])
                             for path in truth_grads if path != "attn.k.b"},
                            multiple=GRAD_MULTIPLE)   # model_kit.GRAD_MULTIPLE's comment says why


# attn.k.b's gradient is 0 in exact arithmetic (a key bias adds one q . b to every score of a query's
# row, and softmax ignores that): both sides return only the cancelled residue of dk's rounded
# entries, a float32 matter that test_multi_head.py's float32 tests hold, not a low-precision error.


# -- properties ---------------------------------------------------------------------------------

@given(case=blocks(), data=st.data())
def test_causal(case, data):
    """The output at position t ignores the inputs after t."""
    x, params, nh, _ = case
    B, T, C = x.shape
    t = data.draw(st.integers(0, T - 1), label="t")
    later = data.draw(S.arrays(x.dtype, (B, T - t - 1, C), 2.0), label="new later inputs")
    out, _ = block_forward(x, params, nh)
    changed, _ = block_forward(np.concatenate([x[:, : t + 1], later], axis=1), params, nh)
    np.testing.assert_array_equal(changed[:, : t + 1], out[:, : t + 1],
                                  err_msg=f"block output up to t = {t} saw later inputs")



def test_attn_mask_replaces_the_causal_mask():
    """The causal mask itself as attn_mask (T, T), True where a query may attend, gives the output
    and gradients of attn_mask=None bit for bit; hiding key 0 from the later queries changes their
    outputs and leaves query 0's."""
    rng = np.random.default_rng(0)
    params = init_block_params(8, rng, dtype=np.float64)
    x, dout = rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 5, 8))
    out, cache = block_forward(x, params, 2)
    causal = np.tri(5, dtype=bool)                                  # (T, S): query t sees keys 0..t
    out_m, cache_m = block_forward(x, params, 2, attn_mask=causal)
    assert np.array_equal(out_m, out), "the causal attn_mask changed the output"
    grads = [dict(zip(("x", "params"), block_backward(dout, c), strict=True)) for c in (cache_m, cache)]
    for (name, a), (_, b) in zip(tree_leaves(grads[0]), tree_leaves(grads[1]), strict=True):
        assert np.array_equal(a, b), f"the causal attn_mask changed block.{name}"
    hidden = causal.copy()
    hidden[1:, 0] = False                                           # queries 1.. no longer see key 0
    out_h, _ = block_forward(x, params, 2, attn_mask=hidden)
    assert np.array_equal(out_h[:, 0], out[:, 0]), "hiding key 0 from later queries changed query 0"
    assert np.all(np.any(out_h[:, 1:] != out[:, 1:], axis=-1)), "a query that no longer sees key 0 kept its output"


def test_dropout_masks_replace_the_rng():
    """With dropout, both keep-masks given need no rng and replay the run that drew them; one
    mask alone, or none, without an rng is refused naming dropout_p."""
    params = init_block_params(4, np.random.default_rng(0), dtype=np.float64)
    x = np.random.default_rng(1).standard_normal((2, 3, 4))
    out, cache = block_forward(x, params, 2, dropout_p=0.5, rng=np.random.default_rng(2))
    replayed, _ = block_forward(x, params, 2, dropout_p=0.5, masks=cache.masks)
    assert np.array_equal(replayed, out), "the keep-masks of a run did not replay it"
    message = ("block_forward with dropout_p = 0.5 (and no masks) needs rng: rng must be a np.random.Generator, "
               "got NoneType")
    for masks in (None, {"attn": cache.masks["attn"], "ffn": None}, {"attn": None, "ffn": cache.masks["ffn"]}):
        with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
            block_forward(x, params, 2, dropout_p=0.5, masks=masks)

@given(case=blocks(bias=True))
def test_zero_branch_outputs_make_the_identity(case):
    """With the attention and feed-forward output projections zero, both branches add zero."""
    x, params, nh, dout = case
    for p in (params["attn"]["o"], params["ffn"]["proj"]):
        p["w"], p["b"] = np.zeros_like(p["w"]), np.zeros_like(p["b"])
    out, cache = block_forward(x, params, nh)
    np.testing.assert_array_equal(out, x, err_msg="block with zero branches")
    dx, _ = block_backward(dout, cache)
    assert_close("block.dx with zero branches", dx, dout)


# -- finite differences (no torch) ----------------------------------------------------------------

@given(case=blocks(dtype=np.float64), seed=st.integers(0, 2**32 - 1))
@example(case=_example(T=3, nh=2), seed=0)
def test_backward_matches_finite_differences(case, seed):
    """One directional derivative along a random direction in (x, every parameter)."""
    x, params, nh, dout = case

    def backward(dout, cache):
        dx, dparams = block_backward(dout, cache)
        return {"x": dx, "params": dparams}

    assert_backward_matches_finite_differences(
        "block", lambda t: block_forward(t["x"], t["params"], nh), backward, {"x": x, "params": params}, dout, seed,
        rstds=lambda cache: [cache.ln1[1], cache.ln2[1]])


# -- dtype preservation -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
def test_dtype_is_preserved(dtype):
    params = init_block_params(4, np.random.default_rng(0), dtype=dtype)
    x = np.random.default_rng(1).normal(size=(2, 3, 4)).astype(dtype)
    out, cache = block_forward(x, params, 2, dropout_p=0.1, rng=np.random.default_rng(2))
    dx, dparams = block_backward(np.ones_like(out), cache)
    for name, arr in [("out", out), ("dx", dx)] + tree_leaves(dparams) + tree_leaves(params):
        assert arr.dtype == dtype, f"block {name} dtype {arr.dtype}"


def test_init_block_params_shapes():
    params = init_block_params(6, np.random.default_rng(0), bias=False, dtype=np.float64)
    shapes = {path: p.shape for path, p in tree_leaves(params)}
    assert shapes == {"ln1.w": (6,), "ln1.b": (6,), "ln2.w": (6,), "ln2.b": (6,),
                      **{f"attn.{n}.w": (6, 6) for n in "qkvo"},
                      "ffn.fc.w": (6, 24), "ffn.proj.w": (24, 6)}, shapes


# -- bad input --------------------------------------------------------------------------------------

def test_bad_input():
    params = init_block_params(4, np.random.default_rng(0), dtype=np.float64)
    with pytest.raises(ValueError, match=r"x must have 3 dimensions, got shape \(3, 4\)"):
        block_forward(np.zeros((3, 4)), params, 2)
    with pytest.raises(ValueError, match=r"not divisible by num_heads = 3"):
        block_forward(np.zeros((1, 3, 4)), params, 3)
    with pytest.raises(TypeError, match=r"needs rng"):
        block_forward(np.zeros((1, 3, 4)), params, 2, dropout_p=0.1)
    with pytest.raises(TypeError, match="x is float32, w is float64"):
        block_forward(np.zeros((1, 3, 4), np.float32), params, 2)
    with pytest.raises(TypeError, match="rng must be a np.random.Generator, got int"):
        init_block_params(4, 0)


@pytest.mark.parametrize("p", [1.0, 1.5, -0.1])
def test_dropout_p_out_of_range_is_refused(p):
    """dropout_p = 1 would divide by 1 - p = 0; the check names the argument and its value."""
    params = init_block_params(4, np.random.default_rng(0), dtype=np.float64)
    with pytest.raises(ValueError, match=rf"dropout_p must lie in \[0, 1\), got {p}"):
        block_forward(np.zeros((1, 3, 4)), params, 2, dropout_p=p, rng=np.random.default_rng(0))


def test_bad_dout_is_refused():
    """The upstream gradient must have the block's output shape and dtype (a float32 dout would
    otherwise turn the float64 gradients into float32 without a word, a transposed one broadcast)."""
    params = init_block_params(4, np.random.default_rng(0), dtype=np.float64)
    _, cache = block_forward(np.zeros((2, 3, 4)), params, 2)
    with pytest.raises(ValueError, match=r"block_backward: dout must have the shape .* \(2, 3, 4\), got \(3, 2, 4\)"):
        block_backward(np.zeros((3, 2, 4)), cache)
    with pytest.raises(TypeError, match=r"block_backward: dout must have the dtype .* float64, got float32"):
        block_backward(np.zeros((2, 3, 4), np.float32), cache)


@pytest.mark.parametrize("dropout_p", [1.0, -0.1, float("nan")])
def test_dropout_p_outside_0_1_is_refused(dropout_p):
    """p = 1 drops every weight and scales by 1 / 0; a negative p or NaN has no meaning."""
    params = init_block_params(4, np.random.default_rng(0), dtype=np.float64)
    with pytest.raises(ValueError, match=rf"^dropout_p must lie in \[0, 1\), got {dropout_p}$"):
        block_forward(np.zeros((1, 3, 4)), params, 2, dropout_p=dropout_p, rng=np.random.default_rng(0))
