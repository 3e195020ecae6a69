"""The decode benchmark (benchmarks/decode.py): greedy generation with and without a key/value
cache gives the same tokens in both libraries, and ``python -m benchmarks --ops decode`` runs."""

import contextlib
import io
import json

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from benchmarks import cli
from benchmarks.decode import greedy_numpy, greedy_twin
from numpy_attn.gpt import GPTConfig, init_gpt_params
from parity_tests import strategies as S
from parity_tests.helpers import tree_map


@given(seed=st.integers(0, 2**32 - 1), P=S.dim(1, 4), new=S.dim(1, 4), n_kv_head=st.sampled_from([None, 1]))
def test_greedy_generation_with_cache_equals_without(seed, P, new, n_kv_head):
    """float64, so that no argmax can flip on a rounding difference between the paths."""
    config = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_kv_head=n_kv_head, n_embd=8)
    rng = np.random.default_rng(seed)
    params = tree_map(lambda p: p + rng.uniform(-0.5, 0.5, p.shape), init_gpt_params(config, rng, np.float64))
    prompt = rng.integers(0, config.vocab_size, (1, P))
    cached = greedy_numpy(params, config, prompt, new, cache=True)
    np.testing.assert_array_equal(cached, greedy_numpy(params, config, prompt, new, cache=False),
                                  err_msg="greedy ids, cached vs uncached")
    assert cached.shape == (1, P + new) and np.array_equal(cached[:, :P], prompt), "prompt kept"
    twin = greedy_twin(tree_map(torch.from_numpy, params), config, torch.from_numpy(prompt), new, cache=True)
    np.testing.assert_array_equal(twin.numpy(), cached, err_msg="greedy ids, twin vs numpy")


def test_decode_benchmark_runs(tmp_path):
    out = tmp_path / "decode.json"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        status = cli.main(["--ops", "decode", "--quick", "--seq-lens", "3", "--repeats", "1",
                           "--min-time", "0", "--no-progress", "--json", str(out)])
    assert status == 0, stdout.getvalue()
    rows = json.loads(out.read_text())["rows"]
    assert [(r["impl"], r["P"]) for r in rows] == [("numpy", 3), ("twin", 3)], rows
    assert all(r["same_tokens"] and r["cached_tokens_per_s"] > 0 for r in rows), rows
    assert "cached/uncached" in stdout.getvalue()
