"""Parity tests for numpy_attn/deepseek_v3.py and torch_attn/deepseek_v3.py, against Hugging Face's
DeepseekV3ForCausalLM.

Random DeepseekV3ForCausalLM models saved by transformers are loaded by attn_cli.hf: logits and
every parameter's gradient (every MLA projection and norm, the dense network, the router, the
experts, the shared expert) against transformers' autograd in float64 and float32 (test_hf.py's
tolerances, from its error analysis); the NumPy backward against the twin's autograd and finite
differences on tiny drawn models; cached decoding, absorbed and naive, against the full forward
token by token and against each other; ``generate --hf`` against transformers' generate; bad
configs.

The choice of experts is piecewise constant: two programs whose router scores differ by rounding
choose differently where two candidates (experts, or groups) are nearly tied, and the outputs then
differ by far more than rounding. So every comparison first checks that the choice is well
separated (``assert_choice_separated``: the gap at the top-k boundary, of groups and of experts,
is far above any rounding error); the checkpoints' seeds were picked so that it is, and the drawn
models that are not are discarded (hypothesis.assume).
"""

import dataclasses
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import transformers
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

import torch_attn.deepseek_v3 as tw
from attn_cli import cli, hf
from attn_cli.hf import CheckpointError, load_checkpoint
from numpy_attn.deepseek_v3 import (
    DeepseekV3Config,
    deepseek_v3_attention_forward,
    deepseek_v3_backward,
    deepseek_v3_block_forward,
    deepseek_v3_forward,
    deepseek_v3_kv_cache,
    init_deepseek_v3_params,
)
from numpy_attn.kv_cache import init_kv_cache
from numpy_attn.moe import DeepSeekMoECache
from parity_tests import strategies as S
from parity_tests.helpers import (
    LOW_DTYPES,
    TOLERANCES,
    assert_close,
    assert_normal_draws,
    autograd,
    decode_in_steps,
    directional_derivative,
    directional_tol,
    to_numpy,
    to_torch,
    tree_dot,
    tree_leaves,
    tree_map,
    tree_to_torch,
)
from parity_tests.model_kit import (
    CHOICE_GAP,
    DTYPES,
    JSON,
    SCALINGS,
    assert_changed_config_refused,
    assert_checkpoint_meets_error_budget,
    assert_config_stores_python_values,
    assert_loads_or_names_folder,
    choice_gaps,
    compare,
    decided_tokens,
    deepseek_models,
    deepseek_to_hf_names,
    deepseek_v3_rstds,
    exact_hf_deepseek,
    hf_greedy,
    hf_llama_model,
    hf_logits_and_grads,
    next_token_dlogits,
    random_ids,
    randomise_deepseek,
    router_calls,
    save,
    token_gaps,
)
from parity_tests.model_kit import mla_rstds as mla_rstds


def _tol(cache, expected):
    """Two programs that compute the model with the same operations rounded in another order: the
    dtype's tolerance times the largest rstd (helpers.layer_norm_tol), atol also times the largest
    |value| compared, as test_mla._tol argues (a rounding error is relative to the terms summed,
    not to a result they cancel to, and these values are not of scale 1: the experts' outputs are
    scaled by routed_scaling_factor and summed k at a time)."""
    tol = TOLERANCES[expected.dtype]
    rstd = max([1.0] + [float(r.max()) for r in deepseek_v3_rstds(cache)])
    scale = max(1.0, float(np.abs(expected).max()))
    return dict(rtol=tol["rtol"] * rstd, atol=tol["atol"] * rstd * scale)


def assert_choice_separated(label, cache, params, config, gap=CHOICE_GAP):
    """The experts each token chose are far from a tie (see the module docstring)."""
    found = choice_gaps(cache, params, config)
    assert found > gap, f"{label}: a top-k boundary of the router is {found:.2e} from a tie (< {gap:.0e})"


# -- the NumPy model against its twin -----------------------------------------------------------------

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8, "mscale": 1.0,
        "mscale_all_dim": 0.8}


def models(dtype=None):
    """(config, params, ids, dout): model_kit.deepseek_models with every switch (low-rank query or
    not, both rotary layouts, biases, tied head, 2 shared experts or 1, normalised weights or not,
    every scaling YaRN's with mscale included) and the selection bias drawn, so that it moves the
    choice (init_deepseek_v3_params' params moved by U(-0.5, 0.5))."""
    return deepseek_models(
        DeepseekV3Config, init_deepseek_v3_params, dtype, rms_eps=st.sampled_from([1e-6, 1e-5]),
        rope_scaling=st.sampled_from([*SCALINGS, YARN]), tie_weights=st.booleans(),
        q_lora_rank=st.none() | S.dim(1, 4), rope_interleave=st.booleans(), n_shared_experts=S.dim(1, 2),
        norm_topk_prob=st.booleans(), routed_scaling_factor=st.sampled_from([1.0, 2.5]))


def _pinned():
    """Three experts' worth of every switch at once: two heads, a low-rank query, YaRN, one dense
    block then two MoE blocks of 4 experts in 2 groups, 2 per token, float64."""
    config = DeepseekV3Config(vocab_size=7, block_size=6, n_layer=3, n_head=2, n_kv_head=2, n_embd=6,
                              rope_scaling=YARN, n_routed_experts=4, n_group=2, topk_group=1, num_experts_per_tok=2,
                              moe_hidden=3, hidden=5)
    rng = np.random.default_rng(5)
    params = tree_map(lambda p: p + rng.uniform(-0.5, 0.5, p.shape), init_deepseek_v3_params(config, rng, np.float64))
    ids = np.array([[1, 3, 1, 6, 0], [2, 2, 5, 4, 1]])
    return config, params, ids, rng.normal(size=ids.shape + (config.vocab_size,))


def _twin(config, ids):
    return lambda params: tw.deepseek_v3(to_torch(ids), params, config)


@pytest.mark.twin_parity
@given(case=models())
@example(case=_pinned())
def test_forward_and_backward_match_twin(case):
    """Logits against the twin's, every gradient (labelled by path) against autograd's; the
    selection bias, which chooses and never weights, gets gradient zero."""
    config, params, ids, dout = case
    logits, cache = deepseek_v3_forward(ids, params, config)
    assume(choice_gaps(cache, params, config) > CHOICE_GAP)     # twin and NumPy round the router differently
    dparams = deepseek_v3_backward(dout, cache)
    twin_logits, grads = autograd(_twin(config, ids), {"params": params}, dout)
    assert_close("deepseek_v3.logits", logits, twin_logits, **_tol(cache, twin_logits))
    for path, g in tree_leaves(grads["params"]):      # selection_bias: zeros on both sides (autograd's unused leaf)
        assert_close(f"deepseek_v3.{path}", dict(tree_leaves(dparams))[path], g, **_tol(cache, g))


@given(case=models(dtype=np.float64), seed=st.integers(0, 2**32 - 1))
@example(case=_pinned(), seed=0)
def test_backward_matches_finite_differences(case, seed):
    """One directional derivative of sum(logits * dout) along a random direction in every parameter;
    the step moves each router score by far less than the gap at the top-k boundary, so no expert
    enters or leaves the choice between the two evaluations."""
    config, params, ids, dout = case
    rng = np.random.default_rng(seed)
    direction = tree_map(lambda p: rng.uniform(-1, 1, p.shape), params)
    _, cache = deepseek_v3_forward(ids, params, config)
    assume(choice_gaps(cache, params, config) > 1e-2)
    grads = deepseek_v3_backward(dout, cache)
    h = 1e-4 / max([1.0] + [float(r.max()) for r in deepseek_v3_rstds(cache)])   # as test_llama.py
    numeric = directional_derivative(lambda p: np.sum(deepseek_v3_forward(ids, p, config)[0] * dout),
                                     params, direction, h=h)
    assert_close("deepseek_v3 directional derivative vs finite differences", np.float64(tree_dot(grads, direction)),
                 np.float64(numeric), **directional_tol(grads, direction))


# -- checkpoints saved by transformers ------------------------------------------------------------------

# Two checkpoints between them turning every switch: YaRN with DeepSeek's mscale in the score
# scale, a low-rank query, interleaved rotary pairs, 8 experts in 4 groups of which 2 are kept,
# 3 per token, 2 shared, one dense block; then a full-rank query, half-split pairs, biases,
# unnormalised weights, one group, every block MoE.
CHECKPOINTS = {
    "yarn": dict(q_lora_rank=12, rope_interleave=True, attention_bias=False, norm_topk_prob=True, n_group=4,
                 topk_group=2, first_k_dense_replace=1, n_shared_experts=2,
                 rope_parameters={"rope_theta": 10000.0, **YARN}),
    "plain": dict(q_lora_rank=None, rope_interleave=False, attention_bias=True, norm_topk_prob=False, n_group=1,
                  topk_group=1, first_k_dense_replace=0, n_shared_experts=1,
                  rope_parameters={"rope_type": "default", "rope_theta": 500.0}),
}


def hf_deepseek_v3(dtype, variant="yarn", seed=0, **changes):
    """A random transformers DeepseekV3ForCausalLM of three blocks: C = 16, two heads, kv_lora_rank 8,
    dn 4, dr 4, dv 6, 8 experts of width 6, 3 per token; every parameter far from its initialisation
    (model_kit.randomise) and the selection bias (a buffer) U(-0.1, 0.1), so that it moves the choice;
    ``changes`` to CHECKPOINTS[variant]'s config entries."""
    config = transformers.DeepseekV3Config(
        vocab_size=19, hidden_size=16, intermediate_size=20, moe_intermediate_size=6, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=2, n_routed_experts=8, num_experts_per_tok=3,
        kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=6, routed_scaling_factor=2.5,
        max_position_embeddings=32, rms_norm_eps=1e-5, pad_token_id=None, bos_token_id=None, eos_token_id=None,
        attn_implementation="sdpa", experts_implementation="eager", **{**CHECKPOINTS[variant], **changes})
    return randomise_deepseek(transformers.DeepseekV3ForCausalLM(config), seed).to(DTYPES[dtype]).eval()


def exact_hf_deepseek_v3(model, config):
    """A float64 DeepseekV3ForCausalLM computing in float64 throughout (model_kit.exact_hf_deepseek)."""
    return exact_hf_deepseek(model, config, "DeepseekV3")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("variant", sorted(CHECKPOINTS))
def test_checkpoint_matches_transformers(tmp_path, variant, dtype):
    """The folder save_pretrained writes, loaded by attn_cli.hf: logits, and every gradient of the
    next-token loss (our backward and the twin's autograd) against transformers' autograd, with
    test_hf.py's tolerances (its docstring gives the analysis); the router's choice checked first."""
    model = hf_deepseek_v3(dtype, variant)
    kind, config, params = load_checkpoint(save(model, tmp_path), dtype)
    assert kind == "deepseek_v3" and type(config) is DeepseekV3Config, config
    assert_close("deepseek_v3 score scale (YaRN's mscale included)", np.float64(config.mla.softmax_scale),
                 np.float64(model.model.layers[0].self_attn.scaling))
    if dtype == np.float64:
        model = exact_hf_deepseek_v3(model, config)
    ids = random_ids(config.vocab_size)
    logits, cache = deepseek_v3_forward(ids, params, config)
    assert_choice_separated(f"deepseek_v3 checkpoint {variant}", cache, params, config)
    dlogits = next_token_dlogits(logits, ids)
    hf_logits, theirs = hf_logits_and_grads(model, ids, None, dlogits)
    rstds = deepseek_v3_rstds(cache)
    compare(f"deepseek_v3 checkpoint {variant} logits", logits, hf_logits, dtype, rstds)
    tparams = tree_to_torch(params, requires_grad=True)
    (tw.deepseek_v3(to_torch(ids), tparams, config) * to_torch(dlogits)).sum().backward()
    ours = deepseek_v3_backward(dlogits, cache)
    twin = tree_map(lambda t: np.zeros(t.shape, dtype) if t.grad is None else to_numpy(t.grad), tparams)
    scale = max(float(np.abs(g).max()) for g in theirs.values())
    for source, grads in (("twin", twin), ("backward", ours)):
        for block in grads["blocks"].values():
            if "router" in block["mlp"]:
                assert not block["mlp"]["selection_bias"].any(), f"{source}: selection_bias has a gradient"
        grads = deepseek_to_hf_names(grads, config)
        assert grads.keys() == theirs.keys(), (source, sorted(grads), sorted(theirs))
        for hf_name, g in theirs.items():
            compare(f"deepseek_v3 checkpoint {variant} d{hf_name} ({source})", grads[hf_name], g, dtype, rstds, scale)


# -- float16 and bfloat16: FlashAttention's error rule against transformers -----------------------------

def decided_by_the_model(ids, config, cache, lowp_model, truth_model):
    """model_kit.decided_tokens for DeepSeek-V3's router: the values ranked are the choice values
    (scores + selection bias; transformers computes them in float32 from its low-dtype input), a
    group score sums two of them."""
    truth, lowp = (router_calls(m, "DeepseekV3TopkRouter", ids) for m in (truth_model, lowp_model))
    truth_choice = [1 / (1 + np.exp(-(to_numpy(h) @ to_numpy(m.weight).T))) + to_numpy(m.e_score_correction_bias)
                    for m, h, _ in truth]                                      # (N, E) float64
    lowp_choice = [to_numpy(out[0].sigmoid() + m.e_score_correction_bias).astype(np.float64) for m, _, out in lowp]

    def margins(choice):
        group_gap, expert_gap = token_gaps(choice, config)
        return np.minimum(group_gap / 2, expert_gap)

    experts = {"truth": [to_numpy(out[2]) for _, _, out in truth],
               "transformers": [to_numpy(out[2]) for _, _, out in lowp],
               "numpy": [b.mlp.router.indices for b in cache.blocks if isinstance(b.mlp, DeepSeekMoECache)]}
    return decided_tokens("deepseek_v3", ids.shape, truth_choice, lowp_choice, margins, experts)


# Three blocks, the last one's the only MoE (first_k_dense_replace = 2): a token whose experts rounding
# chooses then changes its own logits only (decided_tokens), where an earlier MoE block would carry the
# other expert to every later token of the row. Measured on the checkpoints with two or three MoE blocks
# (seeds 0-9, both variants): transformers' bfloat16 choice values are off by 5e-3 to 1.5e-2 (the
# router's input is rounded hidden state), its logits by up to 3.6 where it picked another expert, and
# ours 1.2 against its 0.14 where ours did (a gap of 7.7e-4 at the last block): a near-tie, not our
# rounding. A handful of examples, each drawing the weights, ids and dout anew.
# The draws are fixed (derandomize), in every profile: at this size the rule's statistic has heavy
# tails both ways. Over 60 float16 and 47 bfloat16 draws (seeds 0-29, both variants) ours (and the
# twin, within 1e-4 of ours) broke it in two: float16 logits at 4.4x and layers.2's kv_a_layernorm
# gradient at 11x (plain, seed 5), bfloat16 layers.1's at 6.2x in the twin (yarn, seed 21);
# transformers held to the same rule against ours broke it in 11 (float16 logits up to 3.6x,
# gradients up to 8x, both dtypes). A draw-by-draw pass is then luck, not
# a proof, so the examples stay put; the tails' cause (a 2-3x larger dv in the first two blocks'
# attention at those draws, where the attention alone is within 1.0x) is open.
@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@settings(max_examples=3, derandomize=True)
@given(variant=st.sampled_from(sorted(CHECKPOINTS)), seed=st.integers(0, 2**31 - 1))
def test_low_precision_meets_the_error_budget(tmp_path_factory, dtype, variant, seed):
    """Ours and the twin in float16 and bfloat16 against DeepseekV3ForCausalLM in float64 on the same
    rounded weights (exact_hf_deepseek_v3), within twice the error of DeepseekV3ForCausalLM run in the
    low dtype (its sdpa attention; its norms, rotary angles and router in float32), on the tokens whose
    experts the model decides (decided_by_the_model)."""
    model = hf_deepseek_v3(np.float64, variant, seed, first_k_dense_replace=2)
    assert_checkpoint_meets_error_budget(
        "deepseek_v3", dtype, model, tmp_path_factory.mktemp("deepseek_v3"), seed, deepseek_v3_forward,
        deepseek_v3_backward, tw.deepseek_v3, deepseek_to_hf_names,
        lambda model, config, _: exact_hf_deepseek_v3(model, config), compared=decided_by_the_model)


# -- decoding: absorbed (the default) and naive, against the full forward and each other -----------------

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cached_decoding_equals_full_forward(tmp_path, dtype):
    """A prefill of 3 tokens, then one token at a time up to 10, through the absorbed latent cache
    and through the naive one: every position's logits equal the full forward's, absorbed and naive
    agree, and the twin decodes the same. The absorbed path reassociates MLA's products (test_mla),
    the decoding steps reorder sums (helpers.reorder_tol): both are roundings of the same operations,
    _tol's bound. Each cache holds what it says: rkv + dr numbers a token and layer, or every head's
    key and value."""
    _, config, params = load_checkpoint(save(hf_deepseek_v3(dtype), tmp_path), dtype)
    ids = random_ids(config.vocab_size, B=2, T=10, seed=1)
    full, full_cache = deepseek_v3_forward(ids, params, config)
    assert_choice_separated("deepseek_v3 decode", full_cache, params, config)
    tol = _tol(full_cache, full)
    sizes, tparams = [3] + [1] * 7, tree_map(to_torch, params)

    def decode(absorb):
        """(NumPy's logits, the twin's, NumPy's cache) of decoding ids in ``sizes`` steps."""
        kv_cache = deepseek_v3_kv_cache(config, 2, dtype, absorb=absorb)
        ours = decode_in_steps(lambda chunk: deepseek_v3_forward(chunk, params, config, kv_cache=kv_cache)[0],
                               ids, sizes)
        twin_cache = tw.deepseek_v3_kv_cache(config, 2, tparams["wte"].dtype, absorb=absorb)
        twin = decode_in_steps(
            lambda chunk: to_numpy(tw.deepseek_v3(to_torch(chunk), tparams, config, kv_cache=twin_cache)), ids, sizes)
        return ours, twin, kv_cache

    decoded = {}
    for absorb in (True, False):
        decoded[absorb], twin, kv_cache = decode(absorb)
        label = "absorbed" if absorb else "naive"
        assert_close(f"deepseek_v3 decode {label}.logits vs full forward", decoded[absorb], full, **tol)
        assert kv_cache.length == 10, f"{label} cache length {kv_cache.length}"
        assert_close(f"deepseek_v3 decode {label} twin.logits", twin, decoded[absorb], **tol)
    assert_close("deepseek_v3 decode absorbed vs naive logits", decoded[True], decoded[False], **tol)
    itemsize, L = np.dtype(dtype).itemsize, config.n_layer
    absorbed, naive = (deepseek_v3_kv_cache(config, 1, dtype, absorb=a).bytes_per_token for a in (True, False))
    assert absorbed == L * (config.kv_lora_rank + config.qk_rope_head_dim) * itemsize, absorbed
    assert naive == L * config.n_head * (config.mla.qk_head_dim + config.v_head_dim) * itemsize, naive


@pytest.mark.parametrize("options", [[], ["--no-absorb"], ["--no-cache"]])
def test_generate_hf_ids_equal_transformers_generate(tmp_path, capsys, options):
    """``numpy-attn generate --hf DIR --ids``, absorbed (the default), naive (--no-absorb) and
    without a cache: the greedy ids of transformers' generate (use_cache=True), 10 past 5."""
    model = hf_deepseek_v3(np.float32)
    model.save_pretrained(tmp_path, safe_serialization=True)
    assert cli.main(["generate", "--hf", str(tmp_path), "--ids", "3,1,4,1,5", "--max-new-tokens", "10",
                     "--temperature", "0", *options]) == 0
    ours = [int(i) for i in capsys.readouterr().out.strip().split(",")]
    assert ours == hf_greedy(model, [3, 1, 4, 1, 5], 10), f"deepseek_v3 {options}: greedy ids differ from theirs"


def test_no_absorb_is_refused_without_mla(tmp_path, capsys):
    """--no-absorb chooses how MLA decodes: a model without MLA refuses it in one line."""
    from parity_tests.model_kit import LLAMA3

    hf_llama_model(LLAMA3, False, False, np.float32).save_pretrained(tmp_path, safe_serialization=True)
    capsys.readouterr()                                                   # save_pretrained's progress bar
    assert cli.main(["generate", "--hf", str(tmp_path), "--ids", "1,2", "--no-absorb"]) == 2
    err = capsys.readouterr().err
    assert "--no-absorb" in err and "is a Llama checkpoint, without multi-head latent attention" in err, err
    assert err.strip().count("\n") == 0, err
    assert cli.main(["generate", "--prompt", "hi", "--no-absorb"]) == 2
    assert "--no-absorb goes with --hf DIR of a DeepSeek-V3 model" in capsys.readouterr().err


# -- bad input ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("changes, message", [
    ({"num_experts_per_tok": 9}, r"DeepseekV3Config.num_experts_per_tok = 9 must lie in \[1, 4\]"),
    ({"n_group": 3}, r"DeepseekV3Config.n_group = 3 must divide n_routed_experts = 8"),
    ({"topk_group": 5}, r"DeepseekV3Config.topk_group = 5 must lie in \[1, 4\]: n_group = 4"),
    ({"kv_lora_rank": 0}, r"kv_lora_rank must be an int >= 1, got 0"),
    ({"q_lora_rank": 0}, r"q_lora_rank must be an int or null >= 1, got 0"),
    ({"qk_rope_head_dim": 3}, r"MLAConfig.qk_rope_head_dim must be even"),
    ({"n_routed_experts": "8"}, r"n_routed_experts must be an int >= 1, got '8'"),
    ({"routed_scaling_factor": 0}, r"DeepseekV3Config.routed_scaling_factor must be a number > 0, got 0.0"),
    ({"num_key_value_heads": 1}, r"num_key_value_heads = 1 must be num_attention_heads = 2"),
    ({"hidden_act": "gelu"}, r"hidden_act 'gelu' is not supported"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "factor": 2.0}},
     r"rope_type 'longrope' is not supported"),
    ({"moe_intermediate_size": None}, r"moe_intermediate_size must be an int >= 1, got None"),
])
def test_bad_config_is_refused_naming_the_field(tmp_path, capsys, changes, message):
    """The saved folder with config.json changed: load_checkpoint and generate --hf refuse it, naming the key."""
    assert_changed_config_refused(save(hf_deepseek_v3(np.float32), tmp_path), capsys, changes, message)


@pytest.mark.parametrize("kw, error, message", [
    (dict(num_experts_per_tok=5, n_group=1, topk_group=1), ValueError,
     r"^DeepseekV3Config.num_experts_per_tok = 5 must lie in \[1, 4\]: the 4 experts of topk_group = 1 groups of 4 "
     r"\(n_routed_experts = 4\)$"),
    (dict(n_routed_experts=6, n_group=4), ValueError, r"DeepseekV3Config.n_group = 4 must divide n_routed_experts"),
    (dict(kv_lora_rank=0), ValueError, r"MLAConfig.kv_lora_rank must be a positive integer, got 0"),
    (dict(head_dim=2), ValueError, r"DeepseekV3Config.head_dim must be the rotary width qk_rope_head_dim = 4"),
    (dict(norm_topk_prob=1), TypeError, r"DeepseekV3Config.norm_topk_prob must be a bool, got int 1"),
    (dict(first_k_dense_replace=-1), ValueError, r"DeepseekV3Config.first_k_dense_replace must be"),
    (dict(n_shared_experts=0), ValueError, r"DeepseekV3Config.n_shared_experts must be a positive integer"),
    (dict(n_group=8), ValueError, r"^DeepseekV3Config.n_group = 8 must lie in \[1, 4\]: n_routed_experts = 4$"),
])
def test_bad_config(kw, error, message):
    with pytest.raises(error, match=message):
        DeepseekV3Config(**{"n_routed_experts": 4, **kw})


def test_bad_input():
    config, params, ids, dout = _pinned()
    with pytest.raises(ValueError,
                       match=r"^deepseek_v3_forward: attn_mask is not supported \(MLA here is causal only\)$"):
        deepseek_v3_forward(ids, params, config, attn_mask=np.ones((5, 5), bool))
    h = np.zeros((2, 5, config.n_embd))
    with pytest.raises(ValueError, match=r"^deepseek_v3_attention_forward: attn_mask is not supported \(MLA attends "
                                         r"causally\)$"):
        deepseek_v3_attention_forward(h, params["blocks"]["0"]["attn"], config, np.arange(5),
                                      attn_mask=np.ones((5, 5), bool))
    with pytest.raises(TypeError, match="kv_cache must come from deepseek_v3_kv_cache, got dict"):
        deepseek_v3_forward(ids, params, config, kv_cache={})
    with pytest.raises(ValueError, match=r"kv_cache \(B, heads, key width, value width\) = \(2, 2, 2, 2\) must be"):
        deepseek_v3_forward(ids, params, config, kv_cache=init_kv_cache(3, 2, 2, 6, 2, np.float64))
    with pytest.raises(TypeError, match="config must be a DeepseekV3Config, got LlamaConfig"):
        from numpy_attn.llama import LlamaConfig

        deepseek_v3_forward(ids, params, LlamaConfig())
    for absorb in (True, False):
        kv_cache = deepseek_v3_kv_cache(config, 2, np.float64, absorb=absorb)
        deepseek_v3_forward(ids[:, :2], params, config, kv_cache=kv_cache)
        _, cache = deepseek_v3_forward(ids[:, 2:3], params, config, kv_cache=kv_cache)
        absorbed = (r"^deepseek_v3_backward: the forward decoded from an absorbed latent cache, "
                    r"which is for inference only$")
        with pytest.raises(ValueError, match=absorbed if absorb else "for inference only"):
            deepseek_v3_backward(dout[:, 2:3], cache)
    small = dataclasses.replace(config, kv_lora_rank=4)
    with pytest.raises(ValueError, match="kv_cache holds latents of width 8, the config's kv_lora_rank is 4"):
        deepseek_v3_forward(ids, params, small, kv_cache=deepseek_v3_kv_cache(config, 2, np.float64))
    _, cache = deepseek_v3_forward(ids, params, config)
    with pytest.raises(ValueError, match=r"deepseek_v3: dlogits must have the shape"):
        deepseek_v3_backward(dout[..., :3], cache)


def test_checkpoint_without_an_expert_is_refused(tmp_path):
    """Every expert's three projections are read: a file missing one (here, under another name, so
    that the values held still cover the parameter count) names it."""
    from safetensors.numpy import load_file, save_file

    folder = save(hf_deepseek_v3(np.float32), tmp_path)
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.1.mlp.experts.5.upper.weight"] = tensors.pop("model.layers.1.mlp.experts.5.up_proj.weight")
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"tensor 'model.layers.1.mlp.experts.5.up_proj.weight' is missing"):
        load_checkpoint(folder)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One saved checkpoint (config.json and model.safetensors) for the tests that change its config."""
    return save(hf_deepseek_v3(np.float32), tmp_path_factory.mktemp("deepseek_v3"))


ROPE = st.dictionaries(st.sampled_from(["rope_type", "type", *hf.ROPE_KEYS, *hf.YARN_OPTIONAL]),
                       st.sampled_from(["default", "linear", "yarn", "llama3"]) | JSON, max_size=5)


@given(data=st.data())
def test_any_config_value_loads_or_is_refused(saved, data):
    """One to three keys of the saved config.json given any JSON value (sizes of any magnitude, null,
    strings, nested objects; rope objects with YaRN's keys): the folder loads, or a CheckpointError
    names config.json or the tensor, with no hang and no allocation beyond test_hostile_inputs'
    bound (the parameter count is checked against the values the file holds before any size is used)."""
    config = json.loads((saved / "config.json").read_text())
    keys = sorted(hf.CONFIG_KEYS["DeepseekV3ForCausalLM"])
    changes = data.draw(st.dictionaries(st.sampled_from(keys), JSON, min_size=1, max_size=3), label="changes")
    if data.draw(st.booleans(), label="rope"):
        changes["rope_parameters"] = data.draw(ROPE, label="rope dict")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        shutil.copy(saved / "model.safetensors", folder)
        (folder / "config.json").write_text(json.dumps({**config, **changes}))
        assert_loads_or_names_folder(folder, changes)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_init_statistics_and_dtype(dtype):
    """The dense blocks' SwiGLU weights, the embedding and the head start N(0, 0.02^2) as Hugging
    Face's initializer_range (6144, 4096 and 4096 draws here, helpers.assert_normal_draws), the
    norms at 1, and every leaf comes in the dtype asked for."""
    config = DeepseekV3Config(vocab_size=128, n_layer=2, first_k_dense_replace=1)
    params = init_deepseek_v3_params(config, np.random.default_rng(0), dtype)
    for path, leaf in tree_leaves(params):
        assert leaf.dtype == dtype, f"{path} has dtype {leaf.dtype}, asked for {np.dtype(dtype)}"
    dense = params["blocks"]["0"]["mlp"]
    for name, w in (("blocks.0.mlp", np.concatenate([dense[k]["w"].ravel() for k in ("gate", "up", "down")])),
                    ("wte", params["wte"]), ("head", params["head"]["w"])):
        assert_normal_draws(name, w, 0.02)
    for path, leaf in tree_leaves(params):
        if path.endswith("norm.w"):
            assert np.all(leaf == 1), f"{path} does not start at 1"


def test_config_stores_numpy_scalars_as_python_values():
    assert_config_stores_python_values(DeepseekV3Config, {
        "moe_hidden": np.int64(8), "n_routed_experts": np.int32(4), "n_shared_experts": np.int64(1),
        "num_experts_per_tok": np.int64(2), "n_group": np.int64(2), "topk_group": np.int64(1),
        "norm_topk_prob": np.bool_(False), "routed_scaling_factor": np.float32(2.5),
        "first_k_dense_replace": np.int64(0)})


def test_block_without_moe_runs_the_dense_network():
    """deepseek_v3_block_forward called without ``moe`` is a dense block (the first
    first_k_dense_replace blocks' kind): block 0's parameters run as with moe=False, bit for bit."""
    config, params, ids, _ = _pinned()
    x = np.random.default_rng(0).normal(size=(2, 5, config.n_embd))
    out, cache = deepseek_v3_block_forward(x, params["blocks"]["0"], config, np.arange(5))
    dense, _ = deepseek_v3_block_forward(x, params["blocks"]["0"], config, np.arange(5), moe=False)
    assert np.array_equal(out, dense), "block 0 without moe differs from moe=False"


def test_init_without_a_generator_is_refused_by_name():
    """A missing or wrong rng is refused by init_deepseek_v3_params itself, before any parameter is drawn."""
    for rng in (None, 0):
        with pytest.raises(TypeError, match=rf"^init_deepseek_v3_params needs rng: rng must be a np.random.Generator, "
                                            rf"got {type(rng).__name__}$"):
            init_deepseek_v3_params(DeepseekV3Config(), rng)


def test_config_runs_llama_checks_and_its_own_lower_bounds():
    """DeepseekV3Config extends LlamaConfig: its checks still run (vocab_size = 0, n_layer = -1),
    and each of its own counts at its bound is accepted, one below refused naming the field (two
    routed experts at least: a group's score sums its best two)."""
    for field, below in (("vocab_size", 0), ("n_layer", -1)):
        with pytest.raises(ValueError, match=rf"^DeepseekV3Config.{field} must be .* got {below}$"):
            DeepseekV3Config(**{field: below})
    with pytest.raises(ValueError, match=r"^DeepseekV3Config.n_routed_experts must be a positive integer, got 0$"):
        DeepseekV3Config(n_group=1, n_routed_experts=0)
    with pytest.raises(ValueError, match=r"^DeepseekV3Config.n_group = 1 must divide n_routed_experts = 1 into groups "
                                         r"of at least 2"):
        DeepseekV3Config(n_group=1, n_routed_experts=1)
    bounds = {"moe_hidden": 1, "n_shared_experts": 1, "num_experts_per_tok": 1, "n_group": 1, "topk_group": 1,
              "first_k_dense_replace": 0}
    for field, low in bounds.items():
        config = DeepseekV3Config(**{"n_group": 1, field: low})
        assert getattr(config, field) == low, field
        with pytest.raises(ValueError, match=rf"^DeepseekV3Config.{field} must .* {low - 1}"):
            DeepseekV3Config(**{"n_group": 1, field: low - 1})


def test_the_toy_configs_choices_are_deepseek_v3s():
    """Besides its toy sizes, DeepseekV3Config defaults to what transformers' DeepseekV3Config
    (DeepSeek-V3's own) chooses: one shared expert, renormalised top-k weights scaled by 2.5, and
    DeepSeek's interleaved rotary pairs."""
    config, hf = DeepseekV3Config(), transformers.DeepseekV3Config()
    ours = (config.n_shared_experts, config.norm_topk_prob, config.routed_scaling_factor, config.rope_interleave)
    assert ours == (hf.n_shared_experts, hf.norm_topk_prob, hf.routed_scaling_factor, hf.rope_interleave), ours
