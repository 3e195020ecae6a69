"""Real batches through the GPT (numpy_attn/gpt.py and its twin): a padded batch gives, at every
real position, the outputs and parameter gradients of each sequence run alone; so does a row of
packed sequences; the loss ignores padded targets; and decoding a left-padded batch with a cache
equals decoding each prompt alone."""

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from torch import nn

import torch_attn.gpt as tw
import torch_attn.masks as tw_masks
from benchmarks import convert
from numpy_attn.gpt import GPTConfig, gpt_backward, gpt_forward, gpt_kv_cache, init_gpt_params
from numpy_attn.loss import cross_entropy_backward, cross_entropy_forward
from numpy_attn.masks import (
    padded_position_ids,
    padding_attn_mask,
    varlen_attn_mask,
    varlen_position_ids,
)
from numpy_attn.multi_head import multi_head_attention_forward
from parity_tests import strategies as S
from parity_tests.helpers import (
    assert_close,
    assert_tree_close,
    layer_norm_tol,
    to_numpy,
    to_torch,
    tree_map,
    tree_to_torch,
)
from parity_tests.strategies import cu_seqlens_of

IGNORE = -100   # the target id of padding, as torch.nn.functional.cross_entropy's default


@st.composite
def models(draw, dtype=None, max_block=6):
    """(config, params): a tiny GPT, with or without grouped-query heads, params moved by
    U(-0.5, 0.5) off their initial values."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    nkv, g, hs = draw(S.dim(1, 2)), draw(S.dim(1, 2)), draw(S.dim(1, 3))
    config = GPTConfig(
        vocab_size=draw(S.dim(2, 7)), block_size=draw(S.dim(2, max_block)), n_layer=draw(st.integers(1, 2)),
        n_head=g * nkv, n_kv_head=draw(st.sampled_from([None, nkv])), n_embd=g * nkv * hs,
        bias=draw(st.booleans()), tie_weights=draw(st.booleans()),
        positions=draw(st.sampled_from(["learned", "sinusoidal"])))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="seed"))
    params = tree_map(lambda p: (p + rng.uniform(-0.5, 0.5, p.shape)).astype(dtype),
                      init_gpt_params(config, rng, dtype))
    return config, params


@st.composite
def padded_batches(draw, config, dtype):
    """(ids (B, T), key_padding_mask (B, T), lengths, dout (B, T, V)): sequences of 1..T real tokens
    padded on one side (drawn) with a pad id that is a real token id (so it has an embedding);
    dout is zero at padding, where nothing is read."""
    B, T = draw(S.dim(1, 3)), draw(S.dim(1, config.block_size))
    lengths = draw(st.lists(st.integers(1, T), min_size=B, max_size=B))
    real = np.arange(T)[None, :] < np.array(lengths)[:, None]               # right padding
    if draw(st.sampled_from(["left", "right"])) == "left":
        real = real[:, ::-1].copy()
    ids = draw(S.token_ids(config.vocab_size, (B, T)))
    dout = draw(S.arrays(dtype, (B, T, config.vocab_size), 2.0)) * real[..., None]
    return ids, ~real, lengths, dout.astype(dtype)


def _rstds(cache):
    return [cache.ln_f[1]] + [r for c in cache.blocks for r in (c.ln1[1], c.ln2[1])]


def _sum_trees(trees):
    out = trees[0]
    for t in trees[1:]:
        out = tree_map(lambda a, b: a + b, out, t)
    return out


def padded(key_padding_mask, past=0):
    """gpt_forward's arguments for a padded batch, composed with numpy_attn/masks.py: each row's
    real tokens numbered from 0 and the padding hidden from every query. key_padding_mask (B, S)
    is True at padding and covers the ``past`` cached tokens too; the positions are the new ones'."""
    return {"positions": padded_position_ids(key_padding_mask)[:, past:],    # (B, S) -> (B, T)
            "attn_mask": padding_attn_mask(key_padding_mask)}               # (B, 1, 1, S)


def twin_padded(key_padding_mask, past=0):
    """``padded`` for the torch twin, with torch_attn/masks.py."""
    return {"positions": tw_masks.padded_position_ids(key_padding_mask)[:, past:],
            "attn_mask": tw_masks.padding_attn_mask(key_padding_mask)}


# -- a padded batch equals each sequence alone -----------------------------------------------------

@given(case=models(), data=st.data())
def test_padded_batch_equals_sequences_alone(case, data):
    """Logits at every real position, and every parameter gradient, of a left- or right-padded
    batch equal those of each sequence alone (gradients summed over the sequences): padding is
    neither attended to, nor moves the positions, nor receives gradient."""
    config, params = case
    dtype = params["wte"].dtype
    ids, kpm, lengths, dout = data.draw(padded_batches(config, dtype))
    logits, cache = gpt_forward(ids, params, config, **padded(kpm))
    dparams = gpt_backward(dout, cache)
    grads_alone, rstds = [], _rstds(cache)
    for b in range(ids.shape[0]):
        real = ~kpm[b]
        alone, alone_cache = gpt_forward(ids[b:b + 1, real], params, config)
        rstds += _rstds(alone_cache)
        grads_alone.append(gpt_backward(np.ascontiguousarray(dout[b:b + 1, real]), alone_cache))
        assert_close(f"padded.logits[{b}] vs alone", logits[b:b + 1, real], alone, **layer_norm_tol(rstds, dtype))
    assert_tree_close("padded.grads vs alone", dparams, _sum_trees(grads_alone), **layer_norm_tol(rstds, dtype))


@given(case=models(), data=st.data())
def test_padded_batch_twin_matches_numpy(case, data):
    config, params = case
    ids, kpm, _, _ = data.draw(padded_batches(config, params["wte"].dtype))
    logits, cache = gpt_forward(ids, params, config, **padded(kpm))
    twin = tw.gpt(to_torch(ids), tree_map(to_torch, params), config, **twin_padded(to_torch(kpm)))
    real = ~kpm[..., None] & np.ones(logits.shape, bool)
    assert_close("padded.logits twin", np.where(real, to_numpy(twin), 0), np.where(real, logits, 0),
                 **layer_norm_tol(_rstds(cache), logits.dtype))


# -- a packed row equals its sequences alone ---------------------------------------------------------

@given(case=models(max_block=8), data=st.data())
def test_packed_row_equals_sequences_alone(case, data):
    """Sequences laid end to end in one row, with varlen_attn_mask and positions restarting at each
    sequence, give each sequence's logits and (summed) gradients alone; the twin agrees."""
    config, params = case
    dtype = params["wte"].dtype
    cu = data.draw(cu_seqlens_of(max_seqs=3, max_len=3).filter(lambda c: 0 < c[-1] <= config.block_size),
                   label="cu_seqlens")
    N = int(cu[-1])
    ids = data.draw(S.token_ids(config.vocab_size, (1, N)), label="ids")
    dout = data.draw(S.arrays(dtype, (1, N, config.vocab_size), 2.0), label="dout")
    mask, positions = varlen_attn_mask(cu), varlen_position_ids(cu)
    logits, cache = gpt_forward(ids, params, config, attn_mask=mask, positions=positions)
    dparams = gpt_backward(dout, cache)
    grads_alone, rstds = [], _rstds(cache)
    for i, (a, b) in enumerate(zip(cu[:-1], cu[1:], strict=True)):
        if a == b:
            continue
        alone, alone_cache = gpt_forward(ids[:, a:b], params, config)
        rstds += _rstds(alone_cache)
        grads_alone.append(gpt_backward(np.ascontiguousarray(dout[:, a:b]), alone_cache))
        assert_close(f"packed.logits[{i}] vs alone", logits[:, a:b], alone, **layer_norm_tol(rstds, dtype))
    assert_tree_close("packed.grads vs alone", dparams, _sum_trees(grads_alone), **layer_norm_tol(rstds, dtype))
    twin = tw.gpt(to_torch(ids), tree_map(to_torch, params), config, attn_mask=to_torch(mask),
                  positions=to_torch(positions))
    assert_close("packed.logits twin", to_numpy(twin), logits, **layer_norm_tol(rstds, dtype))


# -- the loss ignores padded targets -----------------------------------------------------------------

@given(case=models(), data=st.data())
def test_loss_ignores_padded_targets(case, data):
    """With targets = IGNORE at padding and ignore_index=IGNORE, the mean loss over a padded batch
    is the mean over its real tokens of the sequences' own losses, and its gradient matches."""
    config, params = case
    dtype = params["wte"].dtype
    ids, kpm, lengths, _ = data.draw(padded_batches(config, dtype))
    targets = np.where(kpm, IGNORE, data.draw(S.token_ids(config.vocab_size, ids.shape), label="targets"))
    logits, cache = gpt_forward(ids, params, config, **padded(kpm))
    loss, loss_cache = cross_entropy_forward(logits, targets, ignore_index=IGNORE)
    dparams = gpt_backward(cross_entropy_backward(np.asarray(1.0, dtype), loss_cache), cache)
    total, grads, rstds = 0.0, [], _rstds(cache)
    n = int((~kpm).sum())
    for b in range(ids.shape[0]):
        real = ~kpm[b]
        alone, alone_cache = gpt_forward(ids[b:b + 1, real], params, config)
        rstds += _rstds(alone_cache)
        loss_b, loss_b_cache = cross_entropy_forward(alone, targets[b:b + 1, real])
        weight = dtype.type(real.sum() / n)                     # each sequence's share of the mean
        total += float(loss_b) * float(weight)
        grads.append(gpt_backward(cross_entropy_backward(np.asarray(weight), loss_b_cache), alone_cache))
    tol = layer_norm_tol(rstds, dtype)
    assert_close("padded loss vs alone", loss, np.asarray(total, dtype), **tol)
    assert_tree_close("padded loss grads vs alone", dparams, _sum_trees(grads), **tol)


# -- decoding a left-padded batch with a cache -----------------------------------------------------

@given(case=models(), data=st.data())
def test_cached_decoding_of_left_padded_prompts_equals_each_alone(case, data):
    """Prompts of different lengths left-padded to P, prefilled together, then new tokens appended
    one at a time (the padding mask growing with a False per step): every new token's logits equal
    the full forward of that prompt and its continuation alone."""
    config, params = case
    dtype = params["wte"].dtype
    B = data.draw(S.dim(1, 3), label="B")
    P = data.draw(st.integers(1, config.block_size - 1), label="P")
    new = data.draw(st.integers(1, config.block_size - P), label="new tokens")
    lengths = data.draw(st.lists(st.integers(1, P), min_size=B, max_size=B), label="prompt lengths")
    ids = data.draw(S.token_ids(config.vocab_size, (B, P + new)), label="ids")
    kpm = np.zeros((B, P + new), bool)
    for b, n in enumerate(lengths):
        kpm[b, : P - n] = True                                               # left padding
    kv_cache = gpt_kv_cache(config, B, dtype)
    steps = [gpt_forward(ids[:, :P], params, config, kv_cache=kv_cache, **padded(kpm[:, :P]))[0]]
    for t in range(P, P + new):
        steps.append(gpt_forward(ids[:, t:t + 1], params, config, kv_cache=kv_cache,
                                 **padded(kpm[:, : t + 1], past=t))[0])
    cached = np.concatenate(steps, axis=1)
    for b in range(B):
        real = ~kpm[b]
        alone, alone_cache = gpt_forward(ids[b:b + 1, real], params, config)
        assert_close(f"left-padded decode[{b}] vs alone", cached[b:b + 1, real], alone,
                     **layer_norm_tol(_rstds(alone_cache), dtype))


# -- the key padding mask at nn.MultiheadAttention's boundary -------------------------------------

@given(data=st.data(), dtype=S.dtypes)
def test_multi_head_with_padding_matches_nn_multihead_attention(data, dtype):
    """multi_head_attention_forward with padding_attn_mask(key_padding_mask) equals
    nn.MultiheadAttention called with key_padding_mask (True = ignore), rows with a real key."""
    B, T, nh, hs = data.draw(S.dim(1, 3)), data.draw(S.dim(1, 5)), data.draw(S.dim(1, 2)), data.draw(S.dim(1, 3))
    C = nh * hs
    x = data.draw(S.arrays(dtype, (B, T, C)), label="x")
    kpm = data.draw(hnp.arrays(np.bool_, (B, T)), label="key_padding_mask")
    kpm[:, 0] = False                                   # the built-in gives NaN for rows with no key
    rng = np.random.default_rng(0)
    params = {n: {"w": rng.uniform(-0.5, 0.5, (C, C)).astype(dtype), "b": rng.uniform(-0.5, 0.5, C).astype(dtype)}
              for n in "qkvo"}
    out, _ = multi_head_attention_forward(x, params, nh, attn_mask=padding_attn_mask(kpm))
    mha = nn.MultiheadAttention(C, nh, batch_first=True, dtype=to_torch(x).dtype)
    mha.load_state_dict(convert.to_mha(tree_to_torch(params)))
    with torch.no_grad():
        ref, _ = mha(to_torch(x), to_torch(x), to_torch(x), key_padding_mask=to_torch(kpm), need_weights=False)
    # Values of |x| <= 4 through three C x C projections of |w| <= 0.5: the float32 atol scaled by C * 2.
    tol = dict(rtol=1e-4, atol=1e-5 * 2 * C) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-12 * 2 * C)
    assert_close("multi_head padded vs nn.MultiheadAttention", out, to_numpy(ref), **tol)
