"""Parity tests for numpy_attn/llama.py and torch_attn/llama.py, against Hugging Face's Llama."""

import dataclasses
import re
import types
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from numpy_attn._family import families
from numpy_attn._model import layer_types, normal_init
from numpy_attn.llama import (
    LlamaConfig,
    init_llama_params,
    llama_backward,
    llama_block_forward,
    llama_forward,
)
from numpy_attn.masks import padded_position_ids, padding_attn_mask
from numpy_attn.rms_norm import rms_norm_forward
from numpy_attn.rope import half_to_interleaved
from parity_tests import strategies as S
from parity_tests.helpers import (
    LOW_DTYPES,
    assert_backward_matches_finite_differences,
    assert_bad_config_rng_and_dlogits_refused,
    assert_close,
    assert_grads_match_autograd,
    assert_logits_match_twin,
    assert_model_keeps_dtype,
    assert_tree_close,
    autograd,
    layer_norm_tol,
    moved_off_init,
    round_to,
    to_numpy,
    to_torch,
    tree_leaves,
    tree_map,
)
from parity_tests.model_kit import (
    SCALINGS,
    assert_family_meets_error_budget,
    exact_hf_llama,
    hf_llama,
    hf_logits_and_grads,
    llama_budget_models,
    llama_models,
    llama_rstds,
    to_hf_names,
    twin_of,
)
from torch_attn.llama import llama


def _pinned_case():
    """GQA (4 query heads on 2 key/value heads), llama3 scaling, two layers, float64."""
    config = LlamaConfig(vocab_size=5, block_size=4, n_layer=2, n_head=4, n_kv_head=2, n_embd=8,
                         head_dim=2, hidden=5, rope_scaling=SCALINGS[2])
    rng = np.random.default_rng(1)
    params = moved_off_init(init_llama_params(config, rng, np.float64), rng)
    ids = np.array([[1, 3, 1, 1]])
    return config, params, ids, None, rng.normal(size=ids.shape + (config.vocab_size,))


def _tol(cache, dtype):
    """RMS norms amplify rounding as layer norms do (see layer_norm_tol)."""
    return layer_norm_tol(llama_rstds(cache), dtype)


def _twin(config, ids, positions):
    """The torch twin as a function of its parameters only, for autograd()."""
    return twin_of(llama, config, ids, positions)


# -- forward matches the twin -----------------------------------------------------------------

@given(case=llama_models())
@example(case=_pinned_case())
def test_forward_matches_twin(case):
    config, params, ids, positions, dout = case
    assert_logits_match_twin("llama", lambda p: llama_forward(ids, p, config, positions=positions),
                             _twin(config, ids, positions), params, dout, _tol)


# -- backward matches autograd ----------------------------------------------------------------

@pytest.mark.twin_parity
@given(case=llama_models())
@example(case=_pinned_case())
def test_backward_matches_autograd(case):
    """Every gradient of the nested parameters, labelled by path (llama.blocks.0.attn.q.w, ...)."""
    config, params, ids, positions, dout = case
    assert_grads_match_autograd("llama", lambda p: llama_forward(ids, p, config, positions=positions),
                                llama_backward, _twin(config, ids, positions), params, dout, _tol)


# -- the twin matches Hugging Face's LlamaForCausalLM ---------------------------------------------


@given(case=llama_models(n_layer=1, rope_layout="half") | llama_models(n_layer=2, dtype=np.float64, rope_layout="half"))
@example(case=_pinned_case())
def test_twin_matches_hugging_face(case):
    """The twin's logits and gradients against LlamaForCausalLM holding the same weights: float64
    with RMS norm and rotary angles in float64 (exact_hf_llama), float32 unchanged."""
    config, params, ids, positions, dout = case
    model = hf_llama(config, params)
    if dout.dtype == np.float64:
        model = exact_hf_llama(model, config)
    twin_logits, twin_grads = autograd(_twin(config, ids, positions), {"params": params}, dout)
    hf_logits, hf_grads = hf_logits_and_grads(model, ids, positions, dout)
    _, cache = llama_forward(ids, params, config, positions=positions)
    tol = _tol(cache, dout.dtype)
    # Hugging Face's layout is half; test_layouts_agree_through_permuted_weights links the other.
    label = "llama vs LlamaForCausalLM"
    assert_close(f"{label}.logits", twin_logits, hf_logits, **tol)
    assert_tree_close(label, to_hf_names(twin_grads["params"], config), hf_grads, **tol)


# -- float16 and bfloat16: FlashAttention's error rule against transformers ----------------------


# A model in the low dtype, the twin, and transformers' model twice: a handful of examples each (about
# 0.2 s an example for one or two layers); the ops' own budget tests draw many more.
@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@settings(max_examples=4)
@given(case=llama_budget_models())
def test_low_precision_meets_the_error_budget(dtype, case):
    """Ours and the twin in float16 and bfloat16 against LlamaForCausalLM in float64 on the same
    rounded weights, within twice the error of LlamaForCausalLM run in the low dtype (its sdpa
    attention; its RMS norms and rotary angles in float32, as transformers writes them)."""
    assert_family_meets_error_budget("llama", dtype, case, llama_forward, llama_backward, llama)


# -- properties ---------------------------------------------------------------------------------

def permute_qk(params, config):
    """The half-layout model that equals an interleaved one: each head's q and k columns in the
    order half_to_interleaved (the permutation that converts Meta's checkpoints)."""
    perm = half_to_interleaved(config.hs)
    out = tree_map(lambda p: p.copy(), params)
    for block in out["blocks"].values():
        for name, heads in (("q", config.n_head), ("k", config.n_kv_head)):
            cols = (np.arange(heads)[:, None] * config.hs + perm).reshape(-1)   # per head
            block["attn"][name]["w"] = block["attn"][name]["w"][:, cols]
            if "b" in block["attn"][name]:
                block["attn"][name]["b"] = block["attn"][name]["b"][cols]
    return out


@given(case=llama_models(rope_layout="interleaved"))
def test_layouts_agree_through_permuted_weights(case):
    config, params, ids, positions, _ = case
    interleaved, cache = llama_forward(ids, params, config, positions=positions)
    half_config = dataclasses.replace(config, rope_layout="half")
    half, _ = llama_forward(ids, permute_qk(params, config), half_config, positions=positions)
    assert_close("llama[half] with permuted q, k vs llama[interleaved]", half, interleaved,
                 **_tol(cache, half.dtype))


@given(case=llama_models(), data=st.data())
def test_causal(case, data):
    """Logits at t do not depend on the tokens after t."""
    config, params, ids, positions, _ = case
    B, T = ids.shape
    t = data.draw(st.integers(0, T - 1))
    changed = ids.copy()
    changed[:, t + 1:] = (changed[:, t + 1:] + 1) % config.vocab_size
    logits, cache = llama_forward(ids, params, config, positions=positions)
    logits_changed, _ = llama_forward(changed, params, config, positions=positions)
    assert_close(f"llama.logits[:, :{t + 1}] after changing later tokens", logits_changed[:, : t + 1],
                 logits[:, : t + 1], **_tol(cache, logits.dtype))


@given(case=llama_models(), pads=st.lists(st.integers(0, 4), min_size=3, max_size=3), left=st.booleans())
@example(case=_pinned_case(), pads=[2, 0, 0], left=True)
def test_padded_batch_equals_sequences_alone(case, pads, left):
    """gpt_forward's vocabulary: padding composed by the caller with numpy_attn/masks.py
    (positions numbered per row, attn_mask hiding the padding) gives every real token of a left-
    or right-padded row its logits alone, and the parameter gradients of the rows alone, summed
    (dout is zero at padding); the twin takes the same arguments and agrees."""
    config, params, ids, _, dout = case
    B, T = ids.shape
    kpm = np.zeros((B, T), bool)                                      # True at padding
    for b in range(B):
        pad = pads[b] % T                                             # at least one real token
        kpm[b, slice(0, pad) if left else slice(T - pad, T)] = True
    dout = np.where(kpm[..., None], 0, dout).astype(dout.dtype)
    kw = dict(positions=padded_position_ids(kpm), attn_mask=padding_attn_mask(kpm))
    logits, cache = llama_forward(ids, params, config, **kw)
    dparams = llama_backward(dout, cache)
    rstds, alone_grads = llama_rstds(cache), []
    for b in range(B):
        real = ~kpm[b]
        alone, alone_cache = llama_forward(ids[b:b + 1, real], params, config)
        rstds += llama_rstds(alone_cache)
        alone_grads.append(llama_backward(np.ascontiguousarray(dout[b:b + 1, real]), alone_cache))
        assert_close(f"llama padded.logits[{b}] vs alone", logits[b:b + 1, real], alone,
                     **layer_norm_tol(rstds, logits.dtype))
    summed = alone_grads[0]
    for g in alone_grads[1:]:
        summed = tree_map(lambda a, c: a + c, summed, g)
    assert_tree_close("llama padded.grads vs alone", dparams, summed, **layer_norm_tol(rstds, logits.dtype))
    twin = llama(to_torch(ids), tree_map(to_torch, params), config, positions=to_torch(kw["positions"]),
                 attn_mask=to_torch(kw["attn_mask"]))
    real = ~kpm[..., None] & np.ones(logits.shape, bool)
    assert_close("llama padded.logits twin", np.where(real, to_numpy(twin), 0), np.where(real, logits, 0),
                 **layer_norm_tol(rstds, logits.dtype))


@given(case=llama_models(), shift=st.integers(1, 1000))
def test_only_relative_positions_matter(case, shift):
    """Moving every position by the same shift leaves the logits unchanged (RoPE scores depend
    on i - j only), up to the rounding of the larger angles: an ulp of 1100 radians, 2.4e-13,
    within the float64 tolerance; float32 rounds its cos and sin more coarsely than that."""
    config, params, ids, positions, _ = case
    T = ids.shape[1]
    pos = np.arange(T) if positions is None else positions
    logits, cache = llama_forward(ids, params, config, positions=pos)
    shifted, _ = llama_forward(ids, params, config, positions=pos + shift)
    tol = _tol(cache, logits.dtype)
    if logits.dtype == np.float32:   # cos and sin of the rotations differ by an ulp: rtol 1e-4
        tol["atol"] *= max(1.0, float(np.abs(logits).max()))
    assert_close(f"llama.logits with positions shifted by {shift}", shifted, logits, **tol)


@given(case=llama_models(tie_weights=True))
def test_tied_gradient_is_the_sum_of_both_uses(case):
    config, params, ids, positions, dout = case
    dtied = llama_backward(dout, llama_forward(ids, params, config, positions=positions)[1])
    untied = {**params, "head": {"w": params["wte"].T.copy()}}
    _, cache = llama_forward(ids, untied, dataclasses.replace(config, tie_weights=False), positions=positions)
    duntied = llama_backward(dout, cache)
    assert_close("llama tied wte = embedding + head", dtied["wte"],
                 duntied["wte"] + duntied["head"]["w"].T, **_tol(cache, dout.dtype))


@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
@pytest.mark.parametrize("tie_weights, bias", [(True, False), (False, True)])
def test_init_shapes_and_dtype(dtype, tie_weights, bias):
    config = LlamaConfig(vocab_size=11, n_layer=2, n_head=4, n_kv_head=2, n_embd=8, head_dim=6,
                         hidden=10, attn_bias=bias, mlp_bias=bias, tie_weights=tie_weights)
    params = init_llama_params(config, np.random.default_rng(0), dtype)
    shapes = {k: v.shape for k, v in tree_leaves(params)}
    expected = {"wte": (11, 8), "norm.w": (8,), "blocks.1.attn.q.w": (8, 24), "blocks.1.attn.k.w": (8, 12),
                "blocks.1.attn.v.w": (8, 12), "blocks.1.attn.o.w": (24, 8), "blocks.1.mlp.gate.w": (8, 10),
                "blocks.1.mlp.down.w": (10, 8), "blocks.0.attn_norm.w": (8,)}
    for path, shape in expected.items():
        assert shapes[path] == shape, f"{path}: {shapes[path]} != {shape}"
    assert ("head.w" in shapes) == (not tie_weights), "head present with tied weights, or missing"
    assert ("blocks.0.attn.q.b" in shapes) == bias and ("blocks.0.mlp.up.b" in shapes) == bias
    assert all(v.dtype == dtype for _, v in tree_leaves(params)), "init_llama_params dtype"
    again = init_llama_params(config, np.random.default_rng(0), dtype)
    assert_tree_close("init_llama_params with the same seed", again, params, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_block_norm_rounds_xhat_before_the_scale(dtype):
    """In float16 and bfloat16 Llama's RMS norm rounds xhat to the dtype, then scales by w and rounds
    again, as transformers' LlamaRMSNorm (weight * hidden.to(input_dtype)): the block's normed input
    to attention is rms_norm_forward's with round_xhat, bit for bit. Rounding the product only
    (OLMo 2's norm) gives other bits on these rows, within the error budget, so only bits tell."""
    config = LlamaConfig(vocab_size=5, block_size=8, n_layer=1, n_head=2, n_kv_head=1, n_embd=16)
    rng = np.random.default_rng(0)
    block = init_llama_params(config, rng, LOW_DTYPES[dtype][0])["blocks"]["0"]
    block["attn_norm"]["w"] = w = round_to(rng.uniform(0.5, 1.5, 16), dtype)
    x = round_to(rng.standard_normal((2, 8, 16)), dtype)
    _, cache = llama_block_forward(x, block, config, np.arange(8))
    h = cache.attn.qkv[0].x                                                    # q's input: rms_norm(x), (B, T, C)
    expected, _ = rms_norm_forward(x, w, config.rms_eps, round_xhat=True)
    product_rounded, _ = rms_norm_forward(x, w, config.rms_eps, round_xhat=False)
    assert not np.array_equal(product_rounded, expected), "the rows do not tell the two roundings apart"
    assert h.dtype == x.dtype and np.array_equal(h, expected), f"{np.mean(h != expected):.0%} of h differ"


# -- finite differences (no torch) ----------------------------------------------------------------

@given(case=llama_models(dtype=np.float64), seed=st.integers(0, 2**32 - 1))
@example(case=_pinned_case(), seed=0)
def test_backward_matches_finite_differences(case, seed):
    """One directional derivative of sum(logits * dout) along a random direction in every parameter."""
    config, params, ids, positions, dout = case
    assert_backward_matches_finite_differences(
        "llama", lambda p: llama_forward(ids, p, config, positions=positions), llama_backward, params, dout, seed,
        rstds=llama_rstds)


# -- dtype preservation -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
def test_dtype_is_preserved(dtype):
    config = LlamaConfig(vocab_size=7, block_size=4, n_layer=1, n_head=2, n_kv_head=1, n_embd=4)
    params = init_llama_params(config, np.random.default_rng(0), dtype)
    assert_model_keeps_dtype("llama", llama_forward, llama_backward, params, config, dtype)


@pytest.mark.parametrize("bias", [True, False])
def test_init_llama_params(bias):
    """As Hugging Face's LlamaForCausalLM initialises: every weight from N(0, 0.02^2)
    (initializer_range; compared with a reference sample of the same size), every bias exactly
    0 and present only when the config asks, every RMS norm weight exactly 1."""
    from parity_tests.helpers import assert_same_distribution

    config = LlamaConfig(vocab_size=256, block_size=4, n_layer=1, n_head=4, n_kv_head=2, n_embd=64,
                         hidden=96, attn_bias=bias, mlp_bias=bias, tie_weights=False)
    params = init_llama_params(config, np.random.default_rng(0), np.float64)
    reference = np.random.default_rng(1)
    for path, p in tree_leaves(params):
        if path.endswith("norm.w"):
            assert np.array_equal(p, np.ones(64)), f"llama.{path} is not all ones"
        elif path.endswith(".b"):
            assert bias and np.array_equal(p, np.zeros(p.shape)), f"llama.{path}: a bias with bias={bias}, or not 0"
        else:
            assert_same_distribution(f"llama.{path}", p, reference.normal(0, 0.02, p.shape))
    biases = [path for path, _ in tree_leaves(params) if path.endswith(".b")]
    assert len(biases) == (7 if bias else 0), f"llama biases with bias={bias}: {biases}"


@pytest.mark.parametrize("dtype", [np.dtype(np.float64), np.dtype(np.float32), *(d for d, _ in LOW_DTYPES.values())],
                         ids=str)
def test_shared_normal_init_draws_n_0_0_02_in_the_dtype_asked(dtype):
    """_model.normal_init, the weight initialiser of the families built on this shell (Qwen3.5,
    OLMo-hybrid, Llama 4): arrays of the shape asked, in the dtype asked, drawn from N(0, 0.02^2)
    (Hugging Face's initializer_range), compared with a reference sample of the same size."""
    from parity_tests.helpers import assert_same_distribution

    w = normal_init(np.random.default_rng(0), dtype)(64, 96)
    assert w.shape == (64, 96) and w.dtype == dtype, (w.shape, w.dtype)
    assert_same_distribution(f"normal_init {dtype}", w, np.random.default_rng(1).normal(0, 0.02, (64, 96)))


def test_shared_layer_types_default_to_every_pattern_th_full_and_refuse_a_wrong_list():
    """_model.layer_types, which the sliding families' configs call (Gemma 2 and 3, gpt-oss): by
    default layer i is full when i + 1 is a multiple of the pattern, as Hugging Face's default;
    a list of another length than n_layer (shorter or longer) or with an unknown entry is refused,
    naming the config's field and the value."""
    config = types.SimpleNamespace(n_layer=7, layer_types=None)
    sliding, full = "sliding_attention", "full_attention"
    assert layer_types(config, 3) == (sliding, sliding, full, sliding, sliding, full, sliding)
    assert layer_types(config, 1) == (full,) * 7
    for wrong in ([full] * 6, [full] * 8):
        with pytest.raises(ValueError, match=rf"^SimpleNamespace.layer_types must list n_layer = 7 entries, "
                                             rf"got {re.escape(repr(wrong))}$"):
            layer_types(types.SimpleNamespace(n_layer=7, layer_types=wrong), 3)
    with pytest.raises(ValueError, match=r"^SimpleNamespace.layer_types: each entry must be 'sliding_attention' or "
                                         r"'full_attention', got 'local' "):
        layer_types(types.SimpleNamespace(n_layer=2, layer_types=(full, "local")), 3)


# -- bad input --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, error, message", [
    (dict(n_head=3, n_kv_head=2), ValueError, "n_head = 3 must be a multiple of n_kv_head = 2"),
    (dict(n_embd=0), ValueError, "n_embd must be a positive integer, got 0"),
    (dict(n_layer=-1), ValueError, "n_layer must be an integer >= 0, got -1"),
    (dict(vocab_size=True), TypeError, "vocab_size must be an integer, got bool True"),
    (dict(hidden=2.0), TypeError, "hidden must be an integer, got float 2.0"),
    (dict(head_dim=3), ValueError, "the head size must be even for rotary positions, got 3"),
    (dict(head_dim=0), ValueError, "LlamaConfig.head_dim must be an integer >= 2, got 0"),
    (dict(head_dim=4.0), TypeError, "LlamaConfig.head_dim must be None or an integer, got float 4.0"),
    (dict(n_kv_head=False), TypeError, "LlamaConfig.n_kv_head must be an integer, got bool False"),
    (dict(n_embd=12, n_head=4, n_kv_head=4), ValueError, "the head size must be even .* got 3"),
    (dict(tie_weights=1), TypeError, "tie_weights must be a bool, got int 1"),
    (dict(attn_bias="no"), TypeError, "attn_bias must be a bool, got str 'no'"),
    (dict(rms_eps=-1e-6), ValueError, "rms_eps must be a number >= 0"),
    (dict(rope_layout="neox"), ValueError, "rope_layout must be 'half' or 'interleaved', got 'neox'"),
    (dict(rope_theta=1.0), ValueError, "theta must be a number > 1, got 1.0"),
    (dict(rope_scaling={"rope_type": "longrope"}), ValueError, "rope_type must be one of"),
])
def test_bad_config(kw, error, message):
    with pytest.raises(error, match=message):
        LlamaConfig(**kw)


@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_mixed_low_precision_params_are_refused(dtype):
    """A float16 or bfloat16 model with a float32 norm weight is refused by the norm, naming both
    dtypes, as a float32/float64 mix is (nothing is upcast silently)."""
    config = LlamaConfig(vocab_size=7, block_size=4, n_layer=1, n_head=2, n_kv_head=1, n_embd=4)
    params = init_llama_params(config, np.random.default_rng(0), LOW_DTYPES[dtype][0])
    params["blocks"]["0"]["attn_norm"]["w"] = params["blocks"]["0"]["attn_norm"]["w"].astype(np.float32)
    with pytest.raises(TypeError, match=f"x is {dtype}, w is float32"):
        llama_forward(np.array([[1, 2]]), params, config)


def test_bad_input():
    config = LlamaConfig(vocab_size=7, block_size=4, n_layer=1, n_head=2, n_kv_head=1, n_embd=4)
    params = init_llama_params(config, np.random.default_rng(0), np.float64)
    with pytest.raises(ValueError, match=r"T = 5 of ids \(1, 5\) exceeds block_size = 4"):
        llama_forward(np.zeros((1, 5), np.int64), params, config)
    with pytest.raises(ValueError, match=r"ids must have 2 dimensions, got shape \(3,\)"):
        llama_forward(np.zeros(3, np.int64), params, config)
    with pytest.raises(TypeError, match="token ids must be integers"):
        llama_forward(np.zeros((1, 3)), params, config)
    with pytest.raises(ValueError, match=r"positions must have shape \(3,\) or \(1, 3\) .* got \(2,\)"):
        llama_forward(np.zeros((1, 3), np.int64), params, config, positions=np.arange(2))
    with pytest.raises(TypeError, match="positions must be integers"):
        llama_forward(np.zeros((1, 3), np.int64), params, config, positions=np.arange(3.0))
    with pytest.raises(ValueError, match="token id 7 is out of range"):
        llama_forward(np.full((1, 3), 7), params, config)
    assert_bad_config_rng_and_dlogits_refused("llama", llama_forward, llama_backward, init_llama_params, params, config)


LOWER_BOUNDS = {"vocab_size": 1, "block_size": 1, "n_layer": 0, "n_head": 1, "n_kv_head": 1, "hidden": 1,
                "head_dim": 2}


@pytest.mark.parametrize("field, low", LOWER_BOUNDS.items())
def test_config_counts_at_their_lower_bound_and_one_below(field, low):
    """Each count at its smallest value makes a model that runs; one below is refused naming the
    field (a bound moved by one either way fails here)."""
    base = dict(vocab_size=5, block_size=4, n_layer=1, n_head=2, n_kv_head=1, n_embd=8, hidden=3)
    config = LlamaConfig(**{**base, field: low})
    logits, _ = llama_forward(np.zeros((1, 1), np.int64), init_llama_params(config, np.random.default_rng(0)), config)
    assert getattr(config, field) == low and logits.shape == (1, 1, config.vocab_size), (field, logits.shape)
    bound = "a positive integer" if low == 1 else f"an integer >= {low}"
    with pytest.raises(ValueError, match=rf"^LlamaConfig.{field} must be {bound}, got {low - 1}$"):
        LlamaConfig(**{**base, field: low - 1})


def test_llamas_files_name_no_other_family():
    """llama.py and its twin show Llama: every other family's difference lives in its own file, so
    neither names another family of the registry (by its name or its title), GPT-2 aside: the model
    Llama grew from, named as its starting point."""
    root = Path(__file__).resolve().parents[1]
    for path in (root / "numpy_attn" / "llama.py", root / "torch_attn" / "llama.py"):
        text = path.read_text().lower()
        named = sorted(name for name, family in families().items() if name not in ("llama", "gpt2")
                       and (re.search(rf"\b{re.escape(name)}\b", text) or family.title.lower() in text))
        assert not named, f"{path.name} names {named}"
