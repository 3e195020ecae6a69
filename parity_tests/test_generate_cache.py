"""``numpy-attn generate`` decodes with a key/value cache by default (attn_cli/generate.py): the
same tokens as running the whole context for every token (``--no-cache``), also once the
context slides past block_size."""

import argparse

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from attn_cli import generate
from numpy_attn.gpt import GPTConfig, init_gpt_params
from parity_tests import strategies as S
from parity_tests.helpers import tree_map


@given(seed=st.integers(0, 2**32 - 1), n_layer=st.integers(0, 2), n_kv_head=st.sampled_from([None, 1]),
       positions=st.sampled_from(["learned", "sinusoidal"]), prompt_len=S.dim(1, 5), new=S.dim(1, 8),
       temperature=st.sampled_from([0.0, 0.7]), top_k=st.sampled_from([None, 3]))
def test_cached_generation_equals_uncached(seed, n_layer, n_kv_head, positions, prompt_len, new,
                                           temperature, top_k):
    """float64 parameters made confident (wte x 20), so that no argmax or sample can flip on the
    last-bit differences between the two paths; prompt + new may exceed block_size = 5."""
    config = GPTConfig(vocab_size=9, block_size=5, n_layer=n_layer, n_head=2, n_kv_head=n_kv_head,
                       n_embd=4, positions=positions)
    rng = np.random.default_rng(seed)
    params = tree_map(lambda p: p + rng.uniform(-0.5, 0.5, p.shape), init_gpt_params(config, rng, np.float64))
    params["wte"] *= 20
    prompt = rng.integers(0, 9, prompt_len).tolist()
    cached, uncached = (generate.generate(params, config, prompt, new, temperature, top_k,
                                          np.random.default_rng(seed), cache=cache) for cache in (True, False))
    assert cached == uncached, f"generated ids with the cache {cached} != without {uncached}"
    assert cached[:prompt_len] == prompt and len(cached) == prompt_len + new, cached


def test_no_cache_option():
    p = argparse.ArgumentParser()
    generate.add_arguments(p)
    assert p.parse_args(["--prompt", "x"]).cache is True, "the cache is the default"
    assert p.parse_args(["--prompt", "x", "--no-cache"]).cache is False, "--no-cache"
