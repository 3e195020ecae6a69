"""Parity tests for numpy_attn/glm_moe_dsa.py and torch_attn/glm_moe_dsa.py, against Hugging Face's
GlmMoeDsaForCausalLM (GLM-5).

GLM-5 is DeepSeek-V3.2 with the indexer's rotary pairs interleaved and "shared" layers that reuse
the last full layer's selection; test_deepseek_v32.py tests what they share. Here: a checkpoint of
three layers, full, shared, full, saved by transformers and loaded by attn_cli.hf: every row's
selected keys (full layers) equal transformers' top-k indices, logits and every gradient against
transformers' autograd in float64 (its float32 steps made float64) and float32; the NumPy backward
against the twin's autograd; cached decoding against the full forward; ``generate --hf``; bad
configs. The selections are checked far from a tie first (model_kit.assert_dsa_separated).
"""

import json

import numpy as np
import pytest
import transformers
from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa

import numpy_attn.glm_moe_dsa as glm_moe_dsa
import torch_attn.glm_moe_dsa as tw
from numpy_attn.glm_moe_dsa import GlmMoeDsaConfig, glm_moe_dsa_backward, glm_moe_dsa_forward, init_glm_moe_dsa_params
from parity_tests.helpers import assert_close, autograd, to_torch, tree_leaves, tree_map
from parity_tests.model_kit import (
    DTYPES,
    assert_changed_config_refused,
    assert_dsa_checkpoint_matches_transformers,
    assert_dsa_decodes_as_full_forward,
    assert_dsa_separated,
    assert_generate_hf_is_transformers,
    assert_options_are_keyword_only,
    dsa_tol,
    exact_hf_deepseek,
    float64_twin,
    randomise_deepseek,
    save,
)


def hf_glm_moe_dsa(dtype, seed=0, **changes):
    """A random transformers GlmMoeDsaForCausalLM of three blocks, their indexers full, shared, full:
    test_deepseek_v32.hf_deepseek_v32's sizes (an indexer of 8 heads of width 8 keeping 3 keys, so
    that no exact tie of zero scores falls at a top-k boundary), far from its initialisation."""
    config = transformers.GlmMoeDsaConfig(**{**dict(
        vocab_size=19, hidden_size=16, intermediate_size=20, moe_intermediate_size=6, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=2, n_routed_experts=8, num_experts_per_tok=3, n_group=4,
        topk_group=2, kv_lora_rank=8, q_lora_rank=12, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=6,
        first_k_dense_replace=1, n_shared_experts=2, index_topk=3, index_head_dim=8, index_n_heads=8,
        indexer_types=["full", "shared", "full"], max_position_embeddings=32, rms_norm_eps=1e-5,
        pad_token_id=None, bos_token_id=None, eos_token_id=None, attn_implementation="sdpa",
        experts_implementation="eager"), **changes})
    return randomise_deepseek(transformers.GlmMoeDsaForCausalLM(config), seed).to(DTYPES[dtype]).eval()


def exact_hf_glm_moe_dsa(model, config):
    """A float64 GlmMoeDsaForCausalLM computing in float64 throughout: model_kit.exact_hf_deepseek
    (norms, rotary angles, router) and its indexer's float32 scores made float64 by float64_twin."""
    indexer = float64_twin(modeling_glm_moe_dsa.GlmMoeDsaIndexer.forward, modeling_glm_moe_dsa)
    return exact_hf_deepseek(model, config, "GlmMoeDsa", indexer)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_checkpoint_matches_transformers(tmp_path, dtype):
    """model_kit.assert_dsa_checkpoint_matches_transformers: selections, logits, every gradient."""
    assert_dsa_checkpoint_matches_transformers("glm_moe_dsa", GlmMoeDsaConfig, hf_glm_moe_dsa(dtype), tmp_path,
                                               dtype, exact_hf_glm_moe_dsa, tw.glm_moe_dsa)


def _pinned():
    """Three blocks, full, shared, full; one dense then two MoE blocks; 3 index heads keeping 2 of 6 keys."""
    config = GlmMoeDsaConfig(vocab_size=7, block_size=6, n_layer=3, n_head=2, n_kv_head=2, n_embd=6,
                             n_routed_experts=4, n_group=2, topk_group=1, num_experts_per_tok=2, moe_hidden=3,
                             hidden=5, index_topk=2, index_n_heads=3, indexer_types=("full", "shared", "full"))
    rng = np.random.default_rng(1)   # every gap at a top-k boundary above 1e-2 (experts and keys)
    params = tree_map(lambda p: p + rng.uniform(-0.5, 0.5, p.shape), init_glm_moe_dsa_params(config, rng, np.float64))
    ids = np.array([[1, 3, 1, 6, 0, 2], [2, 2, 5, 4, 1, 3]])
    return config, params, ids, rng.normal(size=ids.shape + (config.vocab_size,))


@pytest.mark.twin_parity
def test_forward_and_backward_match_twin():
    """Logits against the twin's, every gradient against autograd's; the shared block has no
    indexer, and attends over the first block's keys."""
    config, params, ids, dout = _pinned()
    assert "indexer" not in params["blocks"]["1"]["attn"] and "indexer" in params["blocks"]["2"]["attn"]
    logits, cache = glm_moe_dsa_forward(ids, params, config)
    assert_dsa_separated("glm_moe_dsa pinned", cache, params, config)
    assert (cache.blocks[1].attn.selected == cache.blocks[0].attn.selected).all()
    dparams = glm_moe_dsa_backward(dout, cache)
    twin_logits, grads = autograd(lambda params: tw.glm_moe_dsa(to_torch(ids), params, config), {"params": params},
                                  dout)
    assert_close("glm_moe_dsa.logits", logits, twin_logits, **dsa_tol(cache, twin_logits))
    for path, g in tree_leaves(grads["params"]):
        assert_close(f"glm_moe_dsa.{path}", dict(tree_leaves(dparams))[path], g, **dsa_tol(cache, g))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cached_decoding_equals_full_forward(tmp_path, dtype):
    """model_kit.assert_dsa_decodes_as_full_forward, a shared layer among the full ones."""
    assert_dsa_decodes_as_full_forward("glm_moe_dsa", hf_glm_moe_dsa(dtype), tmp_path, dtype, tw.glm_moe_dsa,
                                       tw.glm_moe_dsa_kv_cache)


@pytest.mark.parametrize("options", [[], ["--no-cache"]])
def test_generate_hf_ids_equal_transformers_generate(tmp_path, capsys, options):
    """``numpy-attn generate --hf DIR --ids``, with and without the cache: transformers' greedy ids."""
    assert_generate_hf_is_transformers(hf_glm_moe_dsa(np.float32), tmp_path, capsys, options, f"glm_moe_dsa {options}")


@pytest.mark.parametrize("changes, message", [
    ({"indexer_types": ["shared", "full", "full"]}, r"indexer_types must list num_hidden_layers = 3 entries of "
     r"\('full', 'shared'\), the first 'full'"),
    ({"indexer_types": ["full", "full"]}, r"indexer_types must list num_hidden_layers = 3"),
    ({"q_lora_rank": None}, r"q_lora_rank must be an int >= 1, got None"),
])
def test_bad_config_is_refused_naming_the_field(tmp_path, capsys, changes, message):
    """The saved folder with config.json changed: load_checkpoint and generate --hf refuse it, naming the key."""
    assert_changed_config_refused(save(hf_glm_moe_dsa(np.float32), tmp_path), capsys, changes, message)


@pytest.mark.parametrize("kw, message", [
    (dict(indexer_types=("shared", "full")), r"GlmMoeDsaConfig.indexer_types\[0\] must be 'full'"),
    (dict(indexer_types=("full",)), r"GlmMoeDsaConfig.indexer_types must list n_layer = 2 entries"),
    (dict(indexer_types="full"), r"GlmMoeDsaConfig.indexer_types must list n_layer = 2 entries"),
    (dict(indexer_types=("full", "full", "shared")), r"indexer_types must list n_layer = 2 entries .*, got \("),
    (dict(indexer_types=2), r"GlmMoeDsaConfig.indexer_types must list n_layer = 2 entries .*, got 2$"),
])
def test_bad_config(kw, message):
    with pytest.raises(ValueError, match=message):
        GlmMoeDsaConfig(n_routed_experts=4, n_layer=2, **kw)


def test_forward_without_an_earlier_selection_is_refused():
    """A shared block's params given to the first block (no indexer there) name the cause."""
    config, params, ids, _ = _pinned()
    del params["blocks"]["0"]["attn"]["indexer"]
    with pytest.raises(ValueError, match="no earlier block selected keys"):
        glm_moe_dsa_forward(ids, params, config)


@pytest.mark.parametrize("module", [glm_moe_dsa, tw], ids=["numpy", "twin"])
def test_options_are_keyword_only(module):
    assert_options_are_keyword_only(module, "glm_moe_dsa")


def test_every_layer_has_its_own_indexer_by_default():
    """Without indexer_types every layer is "full" (its own indexer), as its docstring says."""
    assert GlmMoeDsaConfig(n_layer=3).indexer_types == ("full", "full", "full")


def test_init_gives_indexers_to_full_layers_only_from_a_json_config():
    """A config whose layer types were read from JSON (strings not interned, as a saved config's
    are): init gives each "full" layer an indexer and no "shared" layer one."""
    kinds = json.loads('["full", "shared", "full", "shared"]')
    config = GlmMoeDsaConfig(n_layer=4, n_routed_experts=4, indexer_types=tuple(kinds))
    params = init_glm_moe_dsa_params(config, np.random.default_rng(0), np.float64)
    assert ["indexer" in params["blocks"][str(i)]["attn"] for i in range(4)] == [True, False, True, False]


def test_indexer_types_of_a_deep_model_are_taken():
    """300 layers listed for 300 layers are taken (lengths compared by value: Python shares the int
    objects up to 256 only, so an identity test would pass every smaller model and refuse this)."""
    n = int("300")                                            # made at run time, as a parsed config's
    kinds = ("full", "shared") * (n // 2)
    assert GlmMoeDsaConfig(n_layer=n, n_routed_experts=4, indexer_types=kinds).indexer_types == kinds
