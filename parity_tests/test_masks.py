"""Tests for numpy_attn/masks.py and torch_attn/masks.py: the twins agree, and attention with each
mask equals PyTorch's F.scaled_dot_product_attention given the equivalent mask, or the sequences
run alone (padding dropped, packed sequences taken apart), forward and backward."""

import re

import numpy as np
import pytest
import torch.nn.functional as F
from hypothesis import example, given
from hypothesis import strategies as st
from torch.nn.attention.bias import causal_lower_right

import torch_attn.masks as tw
from numpy_attn.attention import (
    scaled_dot_product_attention_backward,
    scaled_dot_product_attention_forward,
)
from numpy_attn.masks import (
    causal_mask,
    padded_position_ids,
    padding_attn_mask,
    sliding_window_mask,
    varlen_attn_mask,
    varlen_position_ids,
    varlen_sequence_ids,
)
from parity_tests import strategies as S
from parity_tests.helpers import LOW_DTYPES, TOLERANCES, assert_close, autograd, round_to, to_numpy, to_torch
from parity_tests.strategies import cu_seqlens_of

BOUND = 4.0   # |q|, |k|, |v|, |dout| <= BOUND


def grad_tols(dtype, hs):
    """Tolerances for dq, dk, dv against another program: the dtype's, atol scaled by the terms
    that cancel. The weights' gradient dout @ v^T has entries up to hs * BOUND^2; the softmax
    backward subtracts terms that large however small the result, and dq, dk multiply what is left
    by |k| or |q| / sqrt(hs) <= BOUND; dv sums weight * dout <= BOUND."""
    tol = TOLERANCES[np.dtype(dtype)]
    big = hs * BOUND**2 * BOUND / np.sqrt(hs)
    return {"q": dict(rtol=tol["rtol"], atol=tol["atol"] * big),
            "k": dict(rtol=tol["rtol"], atol=tol["atol"] * big),
            "v": dict(rtol=tol["rtol"], atol=tol["atol"] * BOUND)}


@st.composite
def qkv(draw, T, S_, lead=None, dtype=None):
    """q (..., T, hs), k, v (..., S, hs) and dout (..., T, hs), leading dims (B, nh) unless given."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    lead = (draw(S.dim(1, 2)), draw(S.dim(1, 2))) if lead is None else lead
    hs = draw(S.dim(1, 4))
    return dict(q=draw(S.arrays(dtype, lead + (T, hs), BOUND)),
                k=draw(S.arrays(dtype, lead + (S_, hs), BOUND)),
                v=draw(S.arrays(dtype, lead + (S_, hs), BOUND)),
                dout=draw(S.arrays(dtype, lead + (T, hs), BOUND)))


def numpy_attention(case, attn_mask):
    """out and (dq, dk, dv) of the NumPy attention with ``attn_mask``."""
    out, cache = scaled_dot_product_attention_forward(case["q"], case["k"], case["v"], attn_mask=attn_mask)
    return out, dict(zip("qkv", scaled_dot_product_attention_backward(case["dout"], cache), strict=True))


def assert_matches(label, case, out, grads, out_ref, grads_ref):
    tols = grad_tols(case["q"].dtype, case["q"].shape[-1])
    assert_close(f"{label}.out", out, out_ref)
    for name in "qkv":
        assert_close(f"{label}.d{name}", grads[name], grads_ref[name], **tols[name])


@st.composite
def padding_masks(draw, B=None, T=None):
    """(key_padding_mask (B, T) True at padding, lengths, side): each row's real tokens on one
    side, padding on the other, as a tokenizer pads a batch."""
    B = draw(S.dim(1, 3)) if B is None else B
    T = draw(S.dim(1, 6)) if T is None else T
    lengths = draw(st.lists(st.integers(0, T), min_size=B, max_size=B))
    side = draw(st.sampled_from(["left", "right"]))
    real = np.arange(T)[None, :] < np.array(lengths)[:, None]          # right padding: real first
    return (~real if side == "right" else ~real[:, ::-1].copy()), lengths, side


# -- the twins agree ------------------------------------------------------------------------------

@pytest.mark.twin_parity
@given(T=S.dim(0, 6), S_=S.dim(0, 6), align=st.sampled_from(["top_left", "bottom_right"]),
       padding=padding_masks(), cu_seqlens=cu_seqlens_of(), causal=st.booleans())
def test_twins_agree(T, S_, align, padding, cu_seqlens, causal):
    kpm = padding[0]
    pairs = {
        "causal_mask": (causal_mask(T, S_, align), tw.causal_mask(T, S_, align)),
        "padding_attn_mask": (padding_attn_mask(kpm), tw.padding_attn_mask(to_torch(kpm))),
        "padded_position_ids": (padded_position_ids(kpm), tw.padded_position_ids(to_torch(kpm))),
        "varlen_attn_mask": (varlen_attn_mask(cu_seqlens, causal),
                             tw.varlen_attn_mask(to_torch(cu_seqlens), causal)),
        "varlen_position_ids": (varlen_position_ids(cu_seqlens), tw.varlen_position_ids(to_torch(cu_seqlens))),
        "varlen_sequence_ids": (varlen_sequence_ids(cu_seqlens), tw.varlen_sequence_ids(to_torch(cu_seqlens))),
    }
    for name, (ours, twin) in pairs.items():
        twin = to_numpy(twin)
        assert ours.dtype == twin.dtype, f"{name}: dtype {ours.dtype} != twin's {twin.dtype}"
        np.testing.assert_array_equal(ours, twin, err_msg=name, strict=True)


# -- causal masks in both alignments ----------------------------------------------------------------

@given(T=S.dim(0, 6), S_=S.dim(0, 6))
@example(T=3, S_=5)
def test_causal_masks_by_definition(T, S_):
    """top_left: key s visible to query t iff s <= t; bottom_right: iff s <= S - T + t."""
    t, s = np.arange(T)[:, None], np.arange(S_)[None, :]
    np.testing.assert_array_equal(causal_mask(T, S_), s <= t, err_msg="top_left", strict=True)
    np.testing.assert_array_equal(causal_mask(T, S_, "bottom_right"), s <= S_ - T + t,
                                  err_msg="bottom_right", strict=True)
    if T == S_:
        np.testing.assert_array_equal(causal_mask(T, S_, "bottom_right"), causal_mask(T, S_),
                                      err_msg="alignments agree when T = S", strict=True)


@given(T=S.dim(0, 7), S_=S.dim(0, 7), align=st.sampled_from(["top_left", "bottom_right"]), data=st.data())
@example(T=5, S_=3, align="bottom_right", data=None)
def test_a_tile_is_the_slice_of_the_whole_mask(T, S_, align, data):
    """rows and cols (as flash attention's tiles ask) give that block of the (T, S) mask, twin too;
    bottom-right with T > S puts the diagonal left of the tile's first column."""
    if data is None:
        rows, cols = slice(1, 4), slice(0, 2)
    else:
        r0, c0 = data.draw(st.integers(0, T), label="row start"), data.draw(st.integers(0, S_), label="col start")
        rows = slice(r0, data.draw(st.integers(r0, T), label="row end"))
        cols = slice(c0, data.draw(st.integers(c0, S_), label="col end"))
    whole = causal_mask(T, S_, align)
    np.testing.assert_array_equal(causal_mask(T, S_, align, rows, cols), whole[rows, cols],
                                  err_msg=f"causal_mask tile {rows}, {cols}", strict=True)
    np.testing.assert_array_equal(to_numpy(tw.causal_mask(T, S_, align, rows, cols)), whole[rows, cols],
                                  err_msg=f"twin causal_mask tile {rows}, {cols}", strict=True)


@given(data=st.data(), T=S.dim(1, 5), S_=S.dim(1, 5))
def test_top_left_equals_is_causal(data, T, S_):
    """Attention with causal_mask(T, S) equals F.scaled_dot_product_attention(is_causal=True), also
    when T != S (the built-in aligns it top-left too), output and gradients."""
    case = data.draw(qkv(T, S_))
    out, grads = numpy_attention(case, causal_mask(T, S_))
    out_ref, grads_ref = autograd(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                  {n: case[n] for n in "qkv"}, case["dout"])
    assert_matches("causal top_left vs is_causal", case, out, grads, out_ref, grads_ref)


@given(data=st.data(), T=S.dim(1, 5), past=S.dim(0, 4))
@example(data=None, T=1, past=3)
def test_bottom_right_equals_causal_lower_right(data, T, past):
    """Attention with causal_mask(T, S, "bottom_right") equals the built-in given
    torch.nn.attention.bias.causal_lower_right(T, S), for S = past + T >= T (where the built-in
    warns of NaN rows it does not produce on this path, it is not asked)."""
    S_ = past + T
    case = data.draw(qkv(T, S_)) if data is not None else dict(
        q=S.ramp(1, 1, T, 2), k=S.ramp(1, 1, S_, 2), v=S.ramp(1, 1, S_, 2), dout=S.ramp(1, 1, T, 2) / 2)
    out, grads = numpy_attention(case, causal_mask(T, S_, "bottom_right"))
    bias = causal_lower_right(T, S_)
    out_ref, grads_ref = autograd(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=bias),
                                  {n: case[n] for n in "qkv"}, case["dout"])
    assert_matches("causal bottom_right vs causal_lower_right", case, out, grads, out_ref, grads_ref)


# -- sliding window --------------------------------------------------------------------------------

ALIGNS = st.sampled_from(["top_left", "bottom_right"])


@given(T=S.dim(0, 7), S_=S.dim(0, 7), window=S.dim(1, 8), align=ALIGNS, data=st.data())
@example(T=3, S_=5, window=2, align="bottom_right", data=None)   # attention.py's picture
def test_sliding_window_by_definition_twin_and_tiles(T, S_, window, align, data):
    """Query t (moved to S - T + t bottom-right) sees key s iff t - window < s <= t: exactly the
    causal mask's keys within ``window`` of it; the twin agrees and a tile is the whole's slice."""
    t = np.arange(T)[:, None] + (S_ - T if align == "bottom_right" else 0)
    s = np.arange(S_)[None, :]
    whole = sliding_window_mask(T, S_, window, align)
    np.testing.assert_array_equal(whole, (t - window < s) & (s <= t), err_msg="sliding_window_mask", strict=True)
    np.testing.assert_array_equal(whole, causal_mask(T, S_, align) & (s > t - window),
                                  err_msg="sliding_window_mask within causal_mask", strict=True)
    np.testing.assert_array_equal(to_numpy(tw.sliding_window_mask(T, S_, window, align)), whole,
                                  err_msg="twin sliding_window_mask", strict=True)
    if data is None:
        rows, cols = slice(1, 3), slice(2, 5)
        picture = np.array([[0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]], bool)
        np.testing.assert_array_equal(whole, picture, err_msg="attention.py's picture", strict=True)
    else:
        r0, c0 = data.draw(st.integers(0, T), label="row start"), data.draw(st.integers(0, S_), label="col start")
        rows = slice(r0, data.draw(st.integers(r0, T), label="row end"))
        cols = slice(c0, data.draw(st.integers(c0, S_), label="col end"))
    np.testing.assert_array_equal(sliding_window_mask(T, S_, window, align, rows, cols), whole[rows, cols],
                                  err_msg=f"sliding_window_mask tile {rows}, {cols}", strict=True)
    if window >= S_ + max(0, T - S_):      # a window past every key is the causal mask
        np.testing.assert_array_equal(whole, causal_mask(T, S_, align), err_msg="wide window", strict=True)


@given(T=S.dim(1, 7), past=S.dim(0, 6), window=S.dim(1, 8))
@example(T=1, past=6, window=4)
def test_sliding_window_equals_transformers_mask_function(T, past, window):
    """transformers' masking_utils.sliding_window_causal_mask_function(window), the mask of
    Mistral, Gemma 2 and Gemma 3 sliding layers, takes absolute positions: T new queries at
    positions past .. past + T - 1 over S = past + T keys. It is our bottom-right mask, and for
    past = 0 our top-left one."""
    masking_utils = pytest.importorskip("transformers.masking_utils")
    import torch

    S_ = past + T
    fn = masking_utils.sliding_window_causal_mask_function(window)
    q_idx = torch.arange(past, S_)[:, None]                        # (T, 1) cache positions
    kv_idx = torch.arange(S_)[None, :]                             # (1, S)
    theirs = to_numpy(fn(0, 0, q_idx, kv_idx))
    np.testing.assert_array_equal(sliding_window_mask(T, S_, window, "bottom_right"), theirs,
                                  err_msg="sliding_window_mask vs transformers", strict=True)
    if past == 0:
        np.testing.assert_array_equal(sliding_window_mask(T, S_, window), theirs,
                                      err_msg="top-left sliding_window_mask vs transformers", strict=True)


@pytest.mark.parametrize("window", [1, 2, 3])
def test_sliding_window_equals_mistral_attention_weights(window):
    """A tiny transformers MistralModel with sliding_window = w and eager attention: its attention
    weights are nonzero exactly where sliding_window_mask(T, T, w) is True, in every layer."""
    transformers = pytest.importorskip("transformers")
    import torch

    config = transformers.MistralConfig(vocab_size=7, hidden_size=8, intermediate_size=8, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                                        sliding_window=window, attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.MistralModel(config).double().eval()
    T = 6
    with torch.no_grad():
        out = model(torch.arange(T)[None] % 7, output_attentions=True)
    assert len(out.attentions) == 2, "one weight tensor per layer"
    for i, weights in enumerate(out.attentions):
        seen = to_numpy(weights[0] > 0)                            # (nh, T, T)
        np.testing.assert_array_equal(seen, np.broadcast_to(sliding_window_mask(T, T, window), seen.shape),
                                      err_msg=f"Mistral layer {i} keys seen, window {window}", strict=True)


@given(data=st.data(), T=S.dim(1, 5), past=S.dim(0, 4), window=S.dim(1, 5))
def test_sliding_window_attention_equals_builtin(data, T, past, window):
    """Attention with sliding_window_mask(T, S, w, "bottom_right") equals the built-in given that
    window written out here, output and gradients."""
    S_ = past + T
    case = data.draw(qkv(T, S_))
    out, grads = numpy_attention(case, sliding_window_mask(T, S_, window, "bottom_right"))
    t, s = np.arange(past, S_)[:, None], np.arange(S_)[None, :]
    mask = to_torch((s <= t) & (s > t - window))
    out_ref, grads_ref = autograd(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                                  {n: case[n] for n in "qkv"}, case["dout"])
    assert_matches("sliding window vs builtin", case, out, grads, out_ref, grads_ref)


# -- key padding --------------------------------------------------------------------------------------

@given(data=st.data(), padding=padding_masks())
def test_padding_equals_dropping_padded_keys(data, padding):
    """With padding_attn_mask, each sequence's output equals F.scaled_dot_product_attention over its
    real keys only, and padded keys get zero gradient; a sequence with no real key gives zeros."""
    kpm, lengths, side = padding
    B, S_ = kpm.shape
    T = data.draw(S.dim(1, 4), label="T")
    case = data.draw(qkv(T, S_, lead=(B, data.draw(S.dim(1, 2), label="nh"))))
    out, grads = numpy_attention(case, padding_attn_mask(kpm))
    out_ref, grads_ref = np.zeros_like(out), {n: np.zeros_like(case[n]) for n in "qkv"}
    for b in range(B):
        real = ~kpm[b]
        if not real.any():
            continue
        sub = {"q": case["q"][b], "k": case["k"][b][:, real], "v": case["v"][b][:, real]}
        out_ref[b], g = autograd(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), sub, case["dout"][b])
        grads_ref["q"][b] = g["q"]
        grads_ref["k"][b][:, real] = g["k"]
        grads_ref["v"][b][:, real] = g["v"]
    assert_matches(f"key padding ({side})", case, out, grads, out_ref, grads_ref)


@given(padding=padding_masks())
@example(padding=(np.array([[True, True, False, False], [False, False, False, False]]), [2, 4], "left"))
def test_padded_position_ids_number_real_tokens_from_zero(padding):
    """Left or right padded, a sequence's real tokens get positions 0..n-1, as alone; padding 0."""
    kpm, lengths, side = padding
    pos = padded_position_ids(kpm)
    assert pos.dtype == np.int64, f"position ids dtype {pos.dtype}"
    for b, n in enumerate(lengths):
        np.testing.assert_array_equal(pos[b][~kpm[b]], np.arange(n), err_msg=f"real positions of row {b}")
        np.testing.assert_array_equal(pos[b][kpm[b]], 0, err_msg=f"padding positions of row {b}")


# -- packed sequences ---------------------------------------------------------------------------------

@given(data=st.data(), cu_seqlens=cu_seqlens_of(), causal=st.booleans())
@example(data=None, cu_seqlens=np.array([0, 1, 1, 4]), causal=True)   # T = 1, an empty sequence
def test_packed_sequences_equal_sequences_alone(data, cu_seqlens, causal):
    """One packed row with varlen_attn_mask gives, for each sequence, what
    F.scaled_dot_product_attention gives it alone (is_causal with ``causal``), output and
    gradients: no attention crosses a boundary, as in FlashAttention's varlen functions."""
    N = int(cu_seqlens[-1])
    if data is None:
        case = dict(q=S.ramp(2, N, 3), k=S.ramp(2, N, 3) / 2, v=S.ramp(2, N, 3) * 2, dout=S.ramp(2, N, 3))
    else:
        case = data.draw(qkv(N, N, lead=(data.draw(S.dim(1, 2), label="nh"),)))
    out, grads = numpy_attention(case, varlen_attn_mask(cu_seqlens, causal))
    out_ref, grads_ref = np.zeros_like(out), {n: np.zeros_like(case[n]) for n in "qkv"}
    for a, b in zip(cu_seqlens[:-1], cu_seqlens[1:], strict=True):
        if a == b:
            continue
        sub = {n: case[n][:, a:b] for n in "qkv"}
        out_ref[:, a:b], g = autograd(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                      sub, case["dout"][:, a:b])
        for n in "qkv":
            grads_ref[n][:, a:b] = g[n]
    assert_matches(f"packed (causal={causal})", case, out, grads, out_ref, grads_ref)


@given(cu_seqlens=cu_seqlens_of())
def test_varlen_position_ids_restart_at_each_sequence(cu_seqlens):
    lengths = np.diff(cu_seqlens)
    expected = np.concatenate([np.arange(n) for n in lengths]).astype(np.int64)
    np.testing.assert_array_equal(varlen_position_ids(cu_seqlens), expected, err_msg="varlen positions",
                                  strict=True)
    expected_seq = np.concatenate([np.full(n, i) for i, n in enumerate(lengths)]).astype(np.int64)
    np.testing.assert_array_equal(varlen_sequence_ids(cu_seqlens), expected_seq, err_msg="sequence ids",
                                  strict=True)


# -- bad input ------------------------------------------------------------------------------------

# -- float16 and bfloat16 ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", LOW_DTYPES)
@given(data=st.data(), T=S.dim(1, 5), past=S.dim(0, 4), window=S.dim(1, 6), align=ALIGNS,
       padding=padding_masks(), cu_seqlens=cu_seqlens_of())
def test_low_precision_float_masks_equal_the_bool_masks(dtype, data, T, past, window, align, padding, cu_seqlens):
    """Each mask here written as the float mask a model adds to its scores, 0 where a query may
    attend and -inf elsewhere, cast to float16 or bfloat16: both values survive the cast exactly
    (-inf stays -inf, not the dtype's most negative number), so attention in that dtype gives the
    bool mask's output and gradients bit for bit, fully masked rows (all padding) included."""
    low = LOW_DTYPES[dtype][0]
    S_ = past + T
    B, P = padding[0].shape
    N = int(cu_seqlens[-1])
    masks = {"causal": (causal_mask(T, S_, align), (T, S_), None),
             "sliding window": (sliding_window_mask(T, S_, window, align), (T, S_), None),
             "padding": (padding_attn_mask(padding[0]), (T, P), (B, 2)),
             "varlen": (varlen_attn_mask(cu_seqlens, causal=True), (N, N), None)}
    for name, (mask, (rows, cols), lead) in masks.items():
        if rows == 0:
            continue                                              # no tokens packed: nothing to attend
        additive = np.where(mask, 0.0, -np.inf).astype(low)       # float64 0 and -inf, cast
        assert np.array_equal(np.isneginf(additive), ~mask) and np.all(additive[mask] == 0), \
            f"{name} mask in {dtype}: {additive}"
        drawn = data.draw(qkv(rows, cols, lead, dtype=np.float64), label=name)
        case = {n: round_to(a, dtype) for n, a in drawn.items()}
        out, grads = numpy_attention(case, mask)
        out_f, grads_f = numpy_attention(case, additive)
        for label, a, b in [("out", out, out_f), *((f"d{n}", grads[n], grads_f[n]) for n in "qkv")]:
            assert a.dtype == b.dtype == low and np.array_equal(a.view(np.uint16), b.view(np.uint16)), \
                f"{name} mask in {dtype}: {label} differs between the bool and the float mask"


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="align must be one of"):
        causal_mask(2, 2, "lower_right")
    with pytest.raises(ValueError, match="S must be >= 0"):
        causal_mask(2, -1)
    with pytest.raises(TypeError, match="T must be an integer"):
        causal_mask(2.0, 2)
    for window, error in ((0, ValueError), (-2, ValueError), (2.0, TypeError), (True, TypeError), (None, TypeError)):
        with pytest.raises(error, match=rf"window must be a positive integer.*got .*{window!r}"):
            sliding_window_mask(3, 3, window)
    with pytest.raises(ValueError, match="align must be one of"):
        sliding_window_mask(2, 2, 1, "lower_right")
    with pytest.raises(TypeError, match="key_padding_mask must be a bool NumPy array"):
        padding_attn_mask(np.array([[1, 0]]))
    with pytest.raises(ValueError, match=r"key_padding_mask must have 2 dimensions, got shape \(2,\)"):
        padded_position_ids(np.array([True, False]))
    with pytest.raises(ValueError, match=r"cu_seqlens must start at 0 and never decrease.*\[0, 3, 2\]"):
        varlen_attn_mask(np.array([0, 3, 2]))
    with pytest.raises(ValueError, match=r"cu_seqlens must start at 0.*\[1, 3\]"):
        varlen_position_ids(np.array([1, 3]))
    with pytest.raises(TypeError, match="cu_seqlens must be an integer NumPy array"):
        varlen_attn_mask(np.array([0.0, 2.0]))


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("T, S", [(3, 5), (5, 3), (4, 4)])
def test_window_past_every_key_is_no_limit(align, T, S):
    """A window of at least T + S keys sees all a causal query sees: it is the causal mask, up to
    2**63 and 10**30 (an OverflowError in int64 before), on both sides."""
    causal = causal_mask(T, S, align)
    for window in (T + S, 2**63, 10**30):
        assert np.array_equal(sliding_window_mask(T, S, window, align), causal), f"window {window}"
        assert np.array_equal(to_numpy(tw.sliding_window_mask(T, S, window, align)), causal), f"twin {window}"


def test_refusals_name_what_was_given():
    """Each refusal's whole message: the dtype or type given, the argument's name; cu_seqlens
    = [0] (no sequence, N = 0) is an empty batch, not a mistake; and a varlen mask is causal only
    when asked."""
    refusals = [
        (lambda: sliding_window_mask(3, 3, None), TypeError,
         "window must be a positive integer, got None (use causal_mask for no window)"),
        (lambda: padding_attn_mask(np.zeros((2, 3))), TypeError,
         "key_padding_mask must be a bool NumPy array (True at padding), got float64"),
        (lambda: padding_attn_mask([[True]]), TypeError,
         "key_padding_mask must be a bool NumPy array (True at padding), got list"),
        (lambda: varlen_attn_mask(np.array([0.0, 2.0])), TypeError,
         "cu_seqlens must be an integer NumPy array, got float64"),
        (lambda: varlen_attn_mask([0, 2]), TypeError, "cu_seqlens must be an integer NumPy array, got list"),
        (lambda: varlen_attn_mask(np.zeros((1, 2), np.int64)), ValueError,
         "cu_seqlens must have 1 dimensions, got shape (1, 2)"),
    ]
    for call, error, message in refusals:
        with pytest.raises(error, match=f"^{re.escape(message)}$"):
            call()
    none = np.array([0])
    assert varlen_attn_mask(none).shape == (0, 0) and varlen_position_ids(none).shape == (0,), "cu_seqlens [0]"
    assert varlen_attn_mask(np.array([0, 2])).all(), "varlen_attn_mask is not causal unless asked"
