"""Parity tests for numpy_attn/gemma2.py and gemma3.py and their torch twins, against Hugging
Face's Gemma 2 and Gemma 3 (text).

Random Gemma2ForCausalLM models saved by transformers are loaded by attn_cli.hf: logits and every
parameter's gradient against transformers' autograd in float64 (test_hf.py's tolerances, from its
error analysis) and in float32 (every side against the float64 truth within float32_bound, a count
of the roundings on the longest path), the NumPy backward against the twin's autograd, cached
decoding past the sliding window against the full forward, ``generate --hf`` against
transformers' generate, and bad configs. The window is small (3) so that every test crosses it,
and the caps are small (attention's 2, the logits' 3) so that tanh bends the values (at
Gemma's 50 and 30 these small models would never reach the cap's curved part). Gemma 3 runs
the same tests (seven layers: five sliding, one global, one sliding; no caps, QK-norm, the local
layers' rotary base 1e4 against the global ones' 1e6), each parametrised by family.
"""


import dataclasses

import numpy as np
import pytest
import transformers

import numpy_attn.gemma2
import torch_attn.gemma2 as tw
from numpy_attn._tree import leaves
from numpy_attn.gemma2 import (
    Gemma2Config,
    gemma2_backward,
    gemma2_forward,
    gemma2_kv_cache,
    init_gemma2_params,
)
from numpy_attn.gemma3 import Gemma3Config, init_gemma3_params
from numpy_attn.kv_cache import init_kv_cache
from parity_tests.gemma_kit import (  # noqa: F401  (pytest collects what the module holds)
    budget_test,
    float32_bound,
    gemma_tol,
    hf_gemma2,
    name,
    test_cached_decoding_past_the_window_equals_full_forward,
    test_checkpoint_matches_transformers,
    test_forward_and_backward_match_twin,
    test_generate_hf_ids_equal_transformers_generate,
)
from parity_tests.helpers import (
    assert_close,
    to_numpy,
    to_torch,
    tree_map,
)
from parity_tests.model_kit import (
    assert_changed_config_refused,
    assert_config_stores_python_values,
    assert_options_are_keyword_only,
    assert_refusals_name_the_family,
    save,
)

# -- the NumPy model against its twin -----------------------------------------------------------------


def test_attn_mask_joins_the_window():
    """An attn_mask joins each sliding layer's window rather than replacing it: with an all-true
    mask the logits are those without a mask (a mask that replaced the window would let the sliding
    layers see every past key); with sequence 0's first key masked, sequence 1 is unchanged and the
    twin agrees. A mask with a bounded cache is refused."""
    config = Gemma2Config(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_kv_head=1, n_embd=8, sliding_window=2)
    rng = np.random.default_rng(0)
    params = tree_map(lambda p: p + rng.uniform(-0.5, 0.5, p.shape), init_gemma2_params(config, rng, np.float64))
    ids = rng.integers(0, 11, (2, 6))
    full = np.ones((2, 1, 6, 6), bool)
    logits, cache = gemma2_forward(ids, params, config, attn_mask=full)
    assert_close("gemma2.logits with an all-true mask", logits, gemma2_forward(ids, params, config)[0],
                 **gemma_tol(cache, np.float64))
    pad = full.copy()
    pad[0, :, :, 0] = False
    padded = gemma2_forward(ids, params, config, attn_mask=pad)[0]
    assert np.abs(padded[0, 1:] - logits[0, 1:]).max() > 1e-6, "the mask changed nothing in sequence 0"
    assert_close("gemma2.logits of the unpadded sequence", padded[1], logits[1], **gemma_tol(cache, np.float64))
    twin = tw.gemma2(to_torch(ids), tree_map(to_torch, params), config, attn_mask=to_torch(pad))
    assert_close("gemma2 twin.logits, padded", to_numpy(twin), padded, **gemma_tol(cache, np.float64))
    with pytest.raises(ValueError, match=r"^gemma2_forward: an attn_mask with a kv_cache whose sliding or chunked "
                                         r"layers hold only their last window is not supported \(the mask spans all "
                                         r"past \+ T keys\): decode without attn_mask, or with a cache whose layers "
                                         r"hold every token \(init_kv_cache without windows\)$"):
        gemma2_forward(ids, params, config, attn_mask=full, kv_cache=gemma2_kv_cache(config, 2, np.float64))
    # Only sliding layers bound the cache: with every layer global, a mask and a cache go together.
    every_global = dataclasses.replace(config, layer_types=("full_attention",) * 2)
    cached = gemma2_forward(ids, params, every_global, attn_mask=pad,
                            kv_cache=gemma2_kv_cache(every_global, 2, np.float64))[0]
    assert_close("gemma2.logits, every layer global, padded, with a kv_cache", cached,
                 gemma2_forward(ids, params, every_global, attn_mask=pad)[0], **gemma_tol(cache, np.float64))


def test_attn_mask_decodes_with_a_cache_that_holds_every_token():
    """The way out the refusal above names: a cache without windows (init_kv_cache) keeps every past
    key, so a padded batch decodes with its attn_mask, each sliding layer still seeing its window
    only: a prefill of 4 tokens, then 2, gives the full forward's logits of the last 2."""
    config = Gemma2Config(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_kv_head=1, n_embd=8, sliding_window=2)
    rng = np.random.default_rng(1)
    params = tree_map(lambda p: p + rng.uniform(-0.5, 0.5, p.shape), init_gemma2_params(config, rng, np.float64))
    ids = rng.integers(0, 11, (2, 6))
    pad = np.ones((2, 1, 6, 6), bool)
    pad[0, :, :, 0] = False
    logits, cache = gemma2_forward(ids, params, config, attn_mask=pad)
    kv = init_kv_cache(config.n_layer, 2, config.n_kv_head, config.block_size, config.hs, np.float64)
    gemma2_forward(ids[:, :4], params, config, attn_mask=pad[:, :, :4, :4], kv_cache=kv, for_backward=False)
    step = gemma2_forward(ids[:, 4:], params, config, attn_mask=pad[:, :, 4:, :], kv_cache=kv, for_backward=False)[0]
    assert_close("gemma2.logits decoded with a mask and a full cache", step, logits[:, 4:],
                 **gemma_tol(cache, np.float64))


# -- checkpoints saved by transformers ------------------------------------------------------------------


# -- float16 and bfloat16: FlashAttention's error rule against transformers -----------------------------


test_low_precision_meets_the_error_budget = budget_test()


# -- cached decoding equals the full forward --------------------------------------------------------------


# -- bad input ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("changes, message", [
    ({"layer_types": ["sliding_attention", "chunked_attention", "full_attention"]},
     "layer_types must list num_hidden_layers = 3 entries, each 'sliding_attention' or 'full_attention', "
     "got \\['sliding_attention', 'chunked_attention'"),
    ({"layer_types": ["full_attention"]}, "layer_types must list num_hidden_layers = 3 entries"),
    ({"sliding_window": 0}, "sliding_window must be an int >= 1, got 0"),
    ({"final_logit_softcapping": 0}, "Gemma2Config.final_logit_softcap must be"),
    ({"hidden_activation": "relu"}, "hidden_activation 'relu' is not supported"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "factor": 2.0}},
     "rope_type 'longrope' is not supported"),
])
def test_bad_config_is_refused_naming_the_field(tmp_path, capsys, changes, message):
    """The saved folder with config.json changed: load_checkpoint and generate --hf refuse it, naming the field."""
    assert_changed_config_refused(save(hf_gemma2(np.float32), tmp_path), capsys, changes, message)


@pytest.mark.parametrize("changes, message", [
    ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                          "sliding_attention": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}},
     "rope_parameters.sliding_attention must be of the default rope_type"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                          "sliding_attention": {"rope_type": "default", "rope_theta": -1}}},
     "the local layers' rope_theta must be a number > 0, got -1"),
    ({"layer_types": ["sliding_attention"] * 6 + ["global"]}, "layer_types must list num_hidden_layers = 7 entries"),
])
def test_bad_gemma3_config_is_refused_naming_the_field(tmp_path, capsys, changes, message):
    assert_changed_config_refused(save(hf_gemma2(np.float32, "gemma3"), tmp_path), capsys, changes, message)


@pytest.mark.parametrize("changes, error, message", [
    ({"layer_types": ("sliding_attention", "local")}, ValueError, "Gemma2Config.layer_types: each entry"),
    ({"layer_types": ("full_attention",)}, ValueError, "Gemma2Config.layer_types must list n_layer = 2"),
    ({"sliding_window": 0}, ValueError, "Gemma2Config.sliding_window"),
    ({"attn_logit_softcap": -1.0}, ValueError, "Gemma2Config.attn_logit_softcap"),
    ({"query_pre_attn_scalar": "8"}, TypeError, "Gemma2Config.query_pre_attn_scalar"),
])
def test_bad_gemma2_config_is_refused(changes, error, message):
    with pytest.raises(error, match=message):
        Gemma2Config(n_layer=2, **changes)


@pytest.mark.parametrize("n_layer", [1, 6, 7, 13])
def test_default_layer_types_are_transformers(n_layer):
    """Without layer_types, Gemma 2 alternates (sliding first) and Gemma 3 makes every sixth layer
    global, as transformers' configs do."""
    assert Gemma2Config(n_layer=n_layer).layer_types == tuple(
        transformers.Gemma2Config(num_hidden_layers=n_layer).layer_types)
    assert Gemma3Config(n_layer=n_layer).layer_types == tuple(
        transformers.Gemma3TextConfig(num_hidden_layers=n_layer).layer_types)


def test_gemma2s_own_choices_are_transformers():
    """What Gemma2Config sets besides its toy sizes is Gemma 2's: transformers' soft caps, the head
    tied to the embedding, and a query_pre_attn_scalar equal to the head size, as transformers'
    default (256, its head_dim), so that the default scores take the usual 1 / sqrt(hs)."""
    config, hf = Gemma2Config(), transformers.Gemma2Config()
    assert config.tie_weights is hf.tie_word_embeddings is True
    assert (config.attn_logit_softcap, config.final_logit_softcap) == (hf.attn_logit_softcapping,
                                                                        hf.final_logit_softcapping)
    assert hf.query_pre_attn_scalar == hf.head_dim
    assert config.query_pre_attn_scalar == config.hs, (config.query_pre_attn_scalar, config.hs)


@pytest.mark.parametrize("module", [numpy_attn.gemma2, tw], ids=["numpy", "twin"])
def test_options_are_keyword_only(module):
    assert_options_are_keyword_only(module, "gemma2")


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_init_starts_every_norm_at_0_in_the_dtype_asked(family, dtype):
    """Gemma's norms scale by 1 + w: w = 0 is the plain RMS norm, as Hugging Face initialises them
    (a w of 1, Llama's start, would double every normed activation), Gemma 3's QK-norms included.
    Every leaf in the dtype asked."""
    config, init, per_block = {"gemma2": (Gemma2Config(n_layer=2), init_gemma2_params, 4),
                               "gemma3": (Gemma3Config(n_layer=2), init_gemma3_params, 6)}[family]
    params = init(config, np.random.default_rng(0), dtype)
    norms = [(path, leaf) for path, leaf in leaves(params) if path.endswith("norm.w")]
    assert len(norms) == 1 + per_block * config.n_layer, [path for path, _ in norms]
    for path, leaf in norms:
        assert not leaf.any(), f"{family} {path} does not start at 0: {leaf}"
    for path, leaf in leaves(params):
        assert leaf.dtype == dtype, f"{family} {path} has dtype {leaf.dtype}, asked for {np.dtype(dtype)}"


@pytest.mark.parametrize("config_class", [Gemma2Config, Gemma3Config])
def test_config_runs_llama_checks_and_its_own_lower_bounds(config_class):
    """Gemma2Config (and Gemma3Config after it) extend LlamaConfig: its checks still run
    (vocab_size = 0); each of Gemma's own numbers at its bound is accepted, just below refused."""
    cls = config_class.__name__
    with pytest.raises(ValueError, match=rf"^{cls}.vocab_size must be a positive integer, got 0$"):
        config_class(vocab_size=0)
    for field, low, below, bound in (("query_pre_attn_scalar", 1e-300, 0.0, "a number > 0"),
                                     ("attn_logit_softcap", 1e-300, 0.0, "a number > 0"),
                                     ("final_logit_softcap", 1e-300, 0.0, "a number > 0"),
                                     ("sliding_window", 1, 0, "a positive integer")):
        assert getattr(config_class(**{field: low}), field) == low, field
        with pytest.raises(ValueError, match=rf"^{cls}.{field} must be {bound}, got {below}$"):
            config_class(**{field: below})


def test_config_stores_numpy_scalars_as_python_values():
    assert_config_stores_python_values(Gemma2Config, {
        "query_pre_attn_scalar": np.float32(16.0), "attn_logit_softcap": np.float64(20.0),
        "final_logit_softcap": np.float32(15.0), "sliding_window": np.int64(3)}, n_layer=2)


def test_refusals_name_gemma2():
    assert_refusals_name_the_family("gemma2", Gemma2Config, init_gemma2_params, gemma2_forward, gemma2_backward)


def test_a_sliding_window_past_every_key_is_no_limit():
    """sliding_window = 10**30 (an OverflowError in the mask's int64 arithmetic before) is a
    window longer than any sequence: the logits of one of 1000, full and cached alike."""
    huge, long = Gemma2Config(n_layer=2, sliding_window=10**30), Gemma2Config(n_layer=2, sliding_window=1000)
    params = init_gemma2_params(huge, np.random.default_rng(0), np.float64)
    ids = np.array([[1, 2, 3, 4]])
    logits, _ = gemma2_forward(ids, params, huge)
    assert np.array_equal(logits, gemma2_forward(ids, params, long)[0]), "10**30 is not a window past every key"
    kv_cache = gemma2_kv_cache(huge, 1, np.float64)
    cached = np.concatenate([gemma2_forward(ids[:, :3], params, huge, kv_cache=kv_cache)[0],
                             gemma2_forward(ids[:, 3:], params, huge, kv_cache=kv_cache)[0]], axis=1)
    assert_close("gemma2 cached with sliding_window = 10**30", cached, logits)
