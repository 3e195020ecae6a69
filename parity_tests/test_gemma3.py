"""Parity tests for numpy_attn/gemma3.py and torch_attn/gemma3.py: Gemma 2's model tests
(parity_tests/gemma_kit.py), run here for the gemma3 family through the ``name`` fixture, against
transformers' Gemma3ForCausalLM. Gemma 3's config refusals stay beside Gemma 2's in test_gemma2.py."""

from parity_tests.gemma_kit import (  # noqa: F401  (pytest collects what the module holds)
    budget_test,
    name,
    test_cached_decoding_past_the_window_equals_full_forward,
    test_checkpoint_matches_transformers,
    test_forward_and_backward_match_twin,
    test_generate_hf_ids_equal_transformers_generate,
)

# Gemma 3's budget draws are fixed (gemma_kit.py's comment above budget_test says why).
test_low_precision_meets_the_error_budget = budget_test()
