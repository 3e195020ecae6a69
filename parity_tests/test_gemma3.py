"""Parity tests for numpy_attn/gemma3.py and torch_attn/gemma3.py: Gemma 2's model tests
(parity_tests/gemma_kit.py), run here for the gemma3 family through the ``name`` fixture, against
transformers' Gemma3ForCausalLM. Gemma 3's config refusals stay beside Gemma 2's in test_gemma2.py;
below, the defaults and the check of what Gemma3Config adds, and the keyword-only signatures."""

import numpy as np
import pytest
import transformers

import numpy_attn.gemma3 as gemma3
import torch_attn.gemma3 as tw
from numpy_attn.gemma3 import Gemma3Config
from parity_tests.gemma_kit import (  # noqa: F401  (pytest collects what the module holds)
    budget_test,
    name,
    test_cached_decoding_past_the_window_equals_full_forward,
    test_checkpoint_matches_transformers,
    test_forward_and_backward_match_twin,
    test_generate_hf_ids_equal_transformers_generate,
)
from parity_tests.model_kit import assert_options_are_keyword_only

# Gemma 3's budget draws are fixed (gemma_kit.py's comment above budget_test says why).
test_low_precision_meets_the_error_budget = budget_test()


@pytest.mark.parametrize("n_layer", [5, 6, 7, 12])
def test_gemma3s_own_defaults_are_transformers(n_layer):
    """The fields Gemma3Config sets itself default to transformers.Gemma3TextConfig's: five sliding
    layers then a global one, no soft caps, and the sliding layers' rotary base that of its
    rope_parameters' sliding_attention (1e4)."""
    config, hf = Gemma3Config(n_layer=n_layer), transformers.Gemma3TextConfig(num_hidden_layers=n_layer)
    assert config.layer_types == tuple(hf.layer_types), config.layer_types
    assert config.rope_local_theta == hf.rope_parameters["sliding_attention"]["rope_theta"], config.rope_local_theta
    assert (config.attn_logit_softcap, config.final_logit_softcap) == (hf.attn_logit_softcapping,
                                                                        hf.final_logit_softcapping)


def test_local_rotary_base_is_checked_and_stored_as_a_python_float():
    """rope_local_theta, the one number Gemma3Config adds, goes through the config's check: above 0, a
    number, and stored as a Python float when given as a NumPy scalar (so that the config writes to JSON)."""
    with pytest.raises(ValueError, match=r"^Gemma3Config.rope_local_theta must be a number > 0, got 0.0$"):
        Gemma3Config(rope_local_theta=0.0)
    with pytest.raises(TypeError, match=r"^Gemma3Config.rope_local_theta must be a real number, got str '1e4'$"):
        Gemma3Config(rope_local_theta="1e4")
    theta = Gemma3Config(rope_local_theta=np.float32(5e5)).rope_local_theta
    assert type(theta) is float and theta == 5e5, repr(theta)


@pytest.mark.parametrize("module", [gemma3, tw], ids=["numpy", "twin"])
def test_options_are_keyword_only(module):
    assert_options_are_keyword_only(module, "gemma3")
