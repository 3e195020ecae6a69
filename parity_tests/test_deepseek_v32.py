"""Parity tests for numpy_attn/deepseek_v32.py and torch_attn/deepseek_v32.py, against Hugging Face's
DeepseekV32ForCausalLM.

Random DeepseekV32ForCausalLM models saved by transformers are loaded by attn_cli.hf: logits and
every parameter's gradient against transformers' autograd in float64 and float32 (the indexer's
parameters get none there, its forward running under no_grad: ours are zeros), and the keys each
query's indexer selects against transformers' top-k indices; the NumPy backward against the twin's
autograd and finite differences on tiny drawn models; the indexer's own loss and its gradient;
cached decoding against the full forward token by token; ``generate --hf`` against transformers'
generate; bad configs.

Two choices are piecewise constant: the experts (as test_deepseek_v3.py's, choice_gaps) and each
query's keys. Two programs whose index scores differ by rounding keep different keys where the
k-th and the next score of a row are nearly tied, and the attention then differs by far more than
rounding. So every comparison first checks that the selection is well separated
(``index_gap``: the gap at each row's top-k boundary is far above any rounding error); the
checkpoints' seeds were picked so that it is, and drawn models that are not are discarded.
"""

import dataclasses
import inspect

import numpy as np
import pytest
import torch
import transformers
from hypothesis import assume, example, given
from hypothesis import strategies as st
from transformers.models.deepseek_v32 import modeling_deepseek_v32

import numpy_attn.deepseek_v32
import torch_attn.deepseek_v32 as tw
from attn_cli import cli
from attn_cli.hf import load_checkpoint
from numpy_attn.deepseek_v32 import (
    DeepseekV32Config,
    DSACache,
    deepseek_v32_attention_forward,
    deepseek_v32_backward,
    deepseek_v32_forward,
    deepseek_v32_indexer_loss,
    deepseek_v32_indexer_loss_backward,
    deepseek_v32_kv_cache,
    init_deepseek_v32_params,
)
from parity_tests import strategies as S
from parity_tests.helpers import (
    assert_close,
    assert_normal_draws,
    autograd,
    directional_derivative,
    directional_tol,
    to_numpy,
    to_torch,
    tree_dot,
    tree_leaves,
    tree_map,
)
from parity_tests.model_kit import (
    CHOICE_GAP,
    DTYPES,
    INDEX_GAP,
    assert_changed_config_refused,
    assert_dsa_checkpoint_matches_transformers,
    assert_dsa_decodes_as_full_forward,
    assert_generate_hf_is_transformers,
    assert_options_are_keyword_only,
    choice_gaps,
    deepseek_models,
    deepseek_v32_rstds,
    dsa_tol,
    exact_hf_deepseek,
    float64_twin,
    index_gap,
    random_ids,
    randomise_deepseek,
    save,
)
from torch_attn.lightning_indexer import lightning_indexer_loss


def models(dtype=None):
    """(config, params, ids, dout): model_kit.deepseek_models with the indexer's sizes drawn (1 to 3
    heads, a width of dr to dr + 2, index_topk from 1 to past T) and a low-rank query."""
    return deepseek_models(DeepseekV32Config, init_deepseek_v32_params, dtype, q_lora_rank=S.dim(1, 4),
                           index_topk=S.dim(1, 7), index_head_dim=st.integers(4, 6), index_n_heads=S.dim(1, 3))


def _pinned():
    """Two heads, YaRN-free, one dense block then one MoE block, 3 index heads keeping 2 keys of 6."""
    config = DeepseekV32Config(vocab_size=7, block_size=6, n_layer=2, n_head=2, n_kv_head=2, n_embd=6,
                               n_routed_experts=4, n_group=2, topk_group=1, num_experts_per_tok=2, moe_hidden=3,
                               hidden=5, index_topk=2, index_n_heads=3)
    rng = np.random.default_rng(14)   # every gap at a top-k boundary above 1e-2 (experts and keys)
    params = tree_map(lambda p: p + rng.uniform(-0.5, 0.5, p.shape), init_deepseek_v32_params(config, rng, np.float64))
    ids = np.array([[1, 3, 1, 6, 0, 2], [2, 2, 5, 4, 1, 3]])
    return config, params, ids, rng.normal(size=ids.shape + (config.vocab_size,))


@pytest.mark.twin_parity
@given(case=models())
@example(case=_pinned())
def test_forward_and_backward_match_twin(case):
    """Logits against the twin's, every gradient (labelled by path) against autograd's; the
    indexer's parameters and the selection bias get gradient zero on both sides."""
    config, params, ids, dout = case
    logits, cache = deepseek_v32_forward(ids, params, config)
    assume(choice_gaps(cache, params, config) > CHOICE_GAP and index_gap(cache, config.index_topk) > INDEX_GAP)
    dparams = deepseek_v32_backward(dout, cache)
    twin_logits, grads = autograd(lambda params: tw.deepseek_v32(to_torch(ids), params, config), {"params": params},
                                  dout)
    assert_close("deepseek_v32.logits", logits, twin_logits, **dsa_tol(cache, twin_logits))
    for path, g in tree_leaves(grads["params"]):
        ours = dict(tree_leaves(dparams))[path]
        if ".indexer." in path:
            assert not ours.any() and not g.any(), f"deepseek_v32.{path}: the indexer got a gradient"
        assert_close(f"deepseek_v32.{path}", ours, g, **dsa_tol(cache, g))


@given(case=models(dtype=np.float64), seed=st.integers(0, 2**32 - 1))
@example(case=_pinned(), seed=0)
def test_backward_matches_finite_differences(case, seed):
    """One directional derivative of sum(logits * dout) along a random direction in every parameter
    (the indexer's included: its derivative is 0 while no key enters or leaves a selection); the
    step moves each router and index score by far less than the gaps at their top-k boundaries."""
    config, params, ids, dout = case
    rng = np.random.default_rng(seed)
    direction = tree_map(lambda p: rng.uniform(-1, 1, p.shape), params)
    _, cache = deepseek_v32_forward(ids, params, config)
    assume(choice_gaps(cache, params, config) > 1e-2 and index_gap(cache, config.index_topk) > 1e-2)
    grads = deepseek_v32_backward(dout, cache)
    h = 1e-4 / max([1.0] + [float(r.max()) for r in deepseek_v32_rstds(cache)])
    numeric = directional_derivative(lambda p: np.sum(deepseek_v32_forward(ids, p, config)[0] * dout),
                                     params, direction, h=h)
    assert_close("deepseek_v32 directional derivative vs finite differences",
                 np.float64(tree_dot(grads, direction)), np.float64(numeric), **directional_tol(grads, direction))


def test_the_selection_drops_keys_and_changes_the_output():
    """index_topk < T: rows keep index_topk of their visible keys, and the logits differ from
    DeepSeek-V3's dense attention with the same weights (index_topk = block_size selects every key)."""
    config, params, ids, _ = _pinned()
    logits, cache = deepseek_v32_forward(ids, params, config)
    for block in cache.blocks:
        visible = np.isfinite(block.attn.scores)
        np.testing.assert_array_equal(block.attn.selected.sum(-1), np.minimum(visible.sum(-1), config.index_topk))
        assert (block.attn.selected.sum(-1) < visible.sum(-1)).any(), "no key dropped"
    dense_config = dataclasses.replace(config, index_topk=config.block_size)
    dense, _ = deepseek_v32_forward(ids, params, dense_config)
    assert np.abs(dense - logits).max() > 1e-3, "dropping keys left the logits as they were"
    with pytest.raises(ValueError, match="attn_mask is not supported"):
        deepseek_v32_forward(ids, params, config, attn_mask=np.ones((6, 6), bool))


@pytest.mark.parametrize("module", [numpy_attn.deepseek_v32, tw], ids=["numpy", "twin"])
def test_options_are_keyword_only(module):
    assert_options_are_keyword_only(module, "deepseek_v32")
    if module is numpy_attn.deepseek_v32:   # the forward GLM-5 shares: keywords past (name, class, ids, params, config)
        kinds = [p.kind for p in inspect.signature(module.dsa_decoder_forward).parameters.values()]
        assert kinds[:5] == [inspect.Parameter.POSITIONAL_OR_KEYWORD] * 5, kinds
        assert set(kinds[5:]) == {inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.VAR_KEYWORD}, kinds


def test_the_attention_leaves_its_selection_for_the_blocks_after_it():
    """The attention alone: with a ``selection`` dict it leaves its indexer's selection there, and
    without one gives the same output; a block without an indexer (GLM-5's shared layers) attends
    over the selection left, and without one is refused."""
    config, params, _, _ = _pinned()
    attn = params["blocks"]["0"]["attn"]
    h = np.random.default_rng(3).normal(size=(2, 6, config.n_embd))
    positions = np.arange(6)
    selection = {}
    out, cache = deepseek_v32_attention_forward(h, attn, config, positions, selection=selection)
    np.testing.assert_array_equal(selection["selected"], cache.selected)
    np.testing.assert_array_equal(deepseek_v32_attention_forward(h, attn, config, positions)[0], out)
    shared = {name: layer for name, layer in attn.items() if name != "indexer"}
    out_shared, cache_shared = deepseek_v32_attention_forward(h, shared, config, positions, selection=selection)
    np.testing.assert_array_equal(out_shared, out)
    assert cache_shared.scores is None and cache_shared.selected is selection["selected"]
    for left in (None, {}):
        with pytest.raises(ValueError, match="no earlier block selected keys"):
            deepseek_v32_attention_forward(h, shared, config, positions, selection=left)


# -- the indexer's own loss ---------------------------------------------------------------------------

def test_indexer_loss_gradient_matches_autograd_and_finite_differences():
    """deepseek_v32_indexer_loss: per block KL(p || softmax(I)) over the selected keys, p the
    block's attention summed over its heads (a constant). Its backward against autograd through the
    twin's lightning_indexer_loss on the same scores, and a directional derivative in the indexers'
    parameters against finite differences (the step keeps every selection)."""
    config, params, ids, _ = _pinned()
    _, cache = deepseek_v32_forward(ids, params, config)
    assert index_gap(cache, config.index_topk) > 1e-2
    loss, loss_cache = deepseek_v32_indexer_loss(cache)
    grads = deepseek_v32_indexer_loss_backward(np.ones(()), loss_cache)
    twin = sum(lightning_indexer_loss(to_torch(b.attn.scores), to_torch(b.attn.mla.sdpa.weights.sum(axis=1)),
                                      to_torch(b.attn.selected)) for b in cache.blocks)
    assert_close("deepseek_v32 indexer loss vs twin", loss, to_numpy(twin), rtol=1e-12, atol=1e-12)
    # A one-block cache (a one-layer model's): its loss is that block's.
    first = cache.blocks[0].attn
    alone = lightning_indexer_loss(to_torch(first.scores), to_torch(first.mla.sdpa.weights.sum(axis=1)),
                                   to_torch(first.selected))
    assert_close("deepseek_v32 indexer loss of one block vs twin",
                 deepseek_v32_indexer_loss(cache._replace(blocks=cache.blocks[:1]))[0], to_numpy(alone),
                 rtol=1e-12, atol=1e-12)
    rng = np.random.default_rng(1)
    indexers = {i: block["attn"]["indexer"] for i, block in params["blocks"].items()}
    direction = tree_map(lambda p: rng.uniform(-1, 1, p.shape), indexers)

    def loss_at(moved):
        p = {**params, "blocks": {i: {**b, "attn": {**b["attn"], "indexer": moved[i]}}
                                  for i, b in params["blocks"].items()}}
        return deepseek_v32_indexer_loss(deepseek_v32_forward(ids, p, config)[1])[0]

    numeric = directional_derivative(loss_at, indexers, direction, h=1e-5)
    assert_close("deepseek_v32 indexer loss directional derivative", np.float64(tree_dot(grads, direction)),
                 np.float64(numeric), **directional_tol(grads, direction))
    assert float(loss) > 0


# -- checkpoints saved by transformers ------------------------------------------------------------------

def hf_deepseek_v32(dtype, seed=0, **changes):
    """A random transformers DeepseekV32ForCausalLM of three blocks: C = 16, two heads, low-rank query
    12, kv_lora_rank 8, dn 4, dr 4, dv 6, 8 experts of width 6 in 4 groups of which 2 kept, 3 per
    token, one dense block; an indexer of 8 heads of width 8 keeping 3 keys; every parameter far
    from its initialisation (model_kit.randomise) and the selection bias U(-0.1, 0.1). Eight index
    heads, as a key whose every head's ReLU is 0 scores exactly 0 and with random weights such
    keys tie at a row's top-k boundary: at 4 heads most seeds have one there, which torch.topk and
    a stable sort break differently (and transformers' own cached and full forwards too)."""
    config = transformers.DeepseekV32Config(**{**dict(
        vocab_size=19, hidden_size=16, intermediate_size=20, moe_intermediate_size=6, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=2, n_routed_experts=8, num_experts_per_tok=3, n_group=4,
        topk_group=2, kv_lora_rank=8, q_lora_rank=12, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=6,
        first_k_dense_replace=1, n_shared_experts=2, index_topk=3, index_head_dim=8, index_n_heads=8,
        max_position_embeddings=32, rms_norm_eps=1e-5, pad_token_id=None, bos_token_id=None, eos_token_id=None,
        attn_implementation="sdpa", experts_implementation="eager"), **changes})
    return randomise_deepseek(transformers.DeepseekV32ForCausalLM(config), seed).to(DTYPES[dtype]).eval()


def exact_hf_deepseek_v32(model, config):
    """A float64 DeepseekV32ForCausalLM computing in float64 throughout: model_kit.exact_hf_deepseek
    (norms, rotary angles, router) and its indexer's float32 scores (q.float(), k.float(),
    weights .float()) made float64 by float64_twin."""
    indexer = float64_twin(modeling_deepseek_v32.DeepseekV32Indexer.forward, modeling_deepseek_v32)
    return exact_hf_deepseek(model, config, "DeepseekV32", indexer)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_checkpoint_matches_transformers(tmp_path, dtype):
    """The folder save_pretrained writes, loaded by attn_cli.hf: every row's selected keys equal
    transformers' top-k indices, logits, and every gradient of the next-token loss (our backward and
    the twin's autograd) against transformers' autograd with test_hf.py's tolerances; the indexer's
    parameters get none there (no_grad) and zeros here."""
    assert_dsa_checkpoint_matches_transformers("deepseek_v32", DeepseekV32Config, hf_deepseek_v32(dtype), tmp_path,
                                               dtype, exact_hf_deepseek_v32, tw.deepseek_v32)


def test_float64_steps_are_the_ones_transformers_keeps_in_float32(tmp_path):
    """Without exact_hf_deepseek_v32, transformers' float64 model differs from ours by more than
    float64's tolerance (its norms, angles, router and index scores in float32): the patch is what
    makes the float64 comparison exact, not a loose tolerance."""
    model = hf_deepseek_v32(np.float64)
    _, config, params = load_checkpoint(save(model, tmp_path), np.float64)
    ids = random_ids(config.vocab_size)
    logits, _ = deepseek_v32_forward(ids, params, config)
    with torch.no_grad():
        plain = to_numpy(model(input_ids=to_torch(ids)).logits)
    assert np.abs(plain - logits).max() > 1e-9 * np.abs(logits).max()


# -- decoding: the latents and the indexer's keys, against the full forward -----------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cached_decoding_equals_full_forward(tmp_path, dtype):
    """A prefill of 3 tokens, then one token at a time up to 10: every position's logits equal the
    full forward's, and the twin decodes the same (test_deepseek_v3's bound: the absorbed path
    reassociates MLA's products). The cache holds rkv + dr + index_head_dim numbers a token and
    layer."""
    assert_dsa_decodes_as_full_forward("deepseek_v32", hf_deepseek_v32(dtype), tmp_path, dtype,
                                       tw.deepseek_v32, tw.deepseek_v32_kv_cache)


def test_decoding_refuses_a_foreign_cache_and_the_backward():
    config, params, ids, dout = _pinned()
    from numpy_attn.deepseek_v3 import deepseek_v3_kv_cache

    with pytest.raises(TypeError, match="kv_cache must come from deepseek_v32_kv_cache, got LatentKVCache"):
        deepseek_v32_forward(ids, params, config, kv_cache=deepseek_v3_kv_cache(config, 2, np.float64))
    kv_cache = deepseek_v32_kv_cache(config, 2, np.float64)
    _, cache = deepseek_v32_forward(ids[:, :2], params, config, kv_cache=kv_cache)
    with pytest.raises(ValueError, match="for inference only"):
        deepseek_v32_backward(dout[:, :2], cache)
    with pytest.raises(ValueError, match="without a kv_cache"):
        deepseek_v32_indexer_loss(cache)
    # A cache of other widths is refused naming both widths, its and the config's.
    other = dataclasses.replace(config, kv_lora_rank=config.kv_lora_rank + 1, index_head_dim=config.index_head_dim + 1)
    with pytest.raises(ValueError, match=rf"^kv_cache holds latents of width {other.kv_lora_rank} and indexer keys "
                       rf"of width {other.index_head_dim}, the config's kv_lora_rank is {config.kv_lora_rank} and "
                       rf"index_head_dim {config.index_head_dim}$"):
        deepseek_v32_forward(ids[:, :2], params, config, kv_cache=deepseek_v32_kv_cache(other, 2, np.float64))
    assert isinstance(deepseek_v32_forward(ids, params, config)[1].blocks[0].attn, DSACache)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_cache_bytes_per_token_count_the_indexer_keys(dtype):
    """A token adds per layer its latent and shared rotary key (kv_lora_rank + dr numbers in the
    model's dtype) and its indexer key (index_head_dim numbers, in float32 for a float16 model: the
    indexer's dtype). Two layers of 12 + 6 numbers here, sizes whose bytes share bits."""
    config, _, _, _ = _pinned()
    key_bytes = np.dtype(np.float32 if dtype == np.float16 else dtype).itemsize
    latent = (config.kv_lora_rank + config.qk_rope_head_dim) * np.dtype(dtype).itemsize
    expected = config.n_layer * (latent + config.index_head_dim * key_bytes)
    assert deepseek_v32_kv_cache(config, 2, dtype).bytes_per_token == expected


@pytest.mark.parametrize("options", [[], ["--no-cache"]])
def test_generate_hf_ids_equal_transformers_generate(tmp_path, capsys, options):
    """``numpy-attn generate --hf DIR --ids``, with and without the cache: the greedy ids of
    transformers' generate (use_cache=True), 10 past 5: past index_topk = 3 keys, so every later
    token attends sparsely."""
    assert_generate_hf_is_transformers(hf_deepseek_v32(np.float32), tmp_path, capsys, options,
                                       f"deepseek_v32 {options}")


def test_no_absorb_is_refused(tmp_path, capsys):
    """DeepSeek-V3.2 decodes absorbed only: --no-absorb is refused in one line saying so."""
    hf_deepseek_v32(np.float32).save_pretrained(tmp_path, safe_serialization=True)
    capsys.readouterr()                                                   # save_pretrained's progress bar
    assert cli.main(["generate", "--hf", str(tmp_path), "--ids", "1,2", "--no-absorb"]) == 2
    err = capsys.readouterr().err
    assert "is a DeepSeek-V3.2 checkpoint, whose multi-head latent attention decodes absorbed only" in err, err
    assert err.strip().count("\n") == 0, err


# -- bad input ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("changes, message", [
    ({"q_lora_rank": None}, r"q_lora_rank must be an int >= 1, got None"),
    ({"index_topk": 0}, r"index_topk must be an int >= 1, got 0"),
    ({"index_head_dim": 2}, r"index_head_dim = 2 must be >= qk_rope_head_dim = 4"),
    ({"mlp_layer_types": ["sparse", "dense", "sparse"]}, r"mlp_layer_types must list num_hidden_layers = 3 "
     r"entries, 'dense' ones then 'sparse' ones"),
    ({"num_key_value_heads": 1}, r"config.json: num_key_value_heads = 1 must be num_attention_heads = 2"),
])
def test_bad_config_is_refused_naming_the_field(tmp_path, capsys, changes, message):
    """The saved folder with config.json changed: load_checkpoint and generate --hf refuse it, naming the key."""
    assert_changed_config_refused(save(hf_deepseek_v32(np.float32), tmp_path), capsys, changes, message)


def test_mlp_layer_types_give_the_dense_blocks(tmp_path):
    """transformers' layers read mlp_layer_types, not first_k_dense_replace: the dense blocks are its."""
    import json

    folder = save(hf_deepseek_v32(np.float32, first_k_dense_replace=2), tmp_path)
    hf = json.loads((folder / "config.json").read_text())
    assert hf["mlp_layer_types"] == ["dense", "dense", "sparse"], hf["mlp_layer_types"]
    hf["first_k_dense_replace"] = 1
    (folder / "config.json").write_text(json.dumps(hf))
    _, config, _ = load_checkpoint(folder)
    assert config.first_k_dense_replace == 2


@pytest.mark.parametrize("kw, error, message", [
    (dict(q_lora_rank=None), ValueError, r"q_lora_rank must be an int: the indexer reads MLA's query latent"),
    (dict(rope_interleave=False), ValueError, r"rope_interleave must be True"),
    (dict(index_topk=0), ValueError, r"DeepseekV32Config.index_topk must be a positive integer"),
    (dict(index_n_heads=1.5), TypeError, r"DeepseekV32Config.index_n_heads must be"),
    (dict(index_head_dim=2), ValueError, r"index_head_dim = 2 must be >= qk_rope_head_dim = 4"),
    (dict(index_head_dim=0), ValueError, r"DeepseekV32Config.index_head_dim must be a positive integer, got 0"),
    (dict(index_n_heads=0), ValueError, r"DeepseekV32Config.index_n_heads must be a positive integer, got 0"),
])
def test_bad_config(kw, error, message):
    with pytest.raises(error, match=message):
        DeepseekV32Config(**{"n_routed_experts": 4, **kw})


def test_init_gives_every_indexer_its_params():
    config = DeepseekV32Config(n_routed_experts=4, n_layer=2)
    params = init_deepseek_v32_params(config, np.random.default_rng(0), np.float32)
    for block in params["blocks"].values():
        indexer = block["attn"]["indexer"]
        assert indexer["wq_b"]["w"].shape == (config.q_lora_rank, config.index_n_heads * config.index_head_dim)
        assert np.all(indexer["k_norm"]["w"] == 1) and np.all(indexer["k_norm"]["b"] == 0)
        assert all(leaf.dtype == np.float32 for _, leaf in tree_leaves(indexer))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_init_draws_the_indexer_from_n_0_0_02(dtype):
    """The indexer's three projections start N(0, 0.02^2), as Hugging Face's initializer_range
    (4096, 2048 and 2048 draws over two blocks, helpers.assert_normal_draws), in the dtype asked for."""
    config = DeepseekV32Config(n_routed_experts=4, n_layer=2, n_embd=128, q_lora_rank=32, index_n_heads=8,
                               index_head_dim=8)
    indexers = [block["attn"]["indexer"] for block in
                init_deepseek_v32_params(config, np.random.default_rng(0), dtype)["blocks"].values()]
    for name in ("wq_b", "wk", "weights_proj"):
        w = np.concatenate([indexer[name]["w"].ravel() for indexer in indexers])
        assert w.dtype == dtype, f"{name} has dtype {w.dtype}, asked for {np.dtype(dtype)}"
        assert_normal_draws(f"indexer {name}", w, 0.02)
