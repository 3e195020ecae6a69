"""``numpy-attn generate`` decodes with a key/value cache by default (attn_cli/generate.py): the
same tokens as running the whole context for every token (``--no-cache``), also once the
context slides past block_size."""

import argparse
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attn_cli import generate
from numpy_attn.gpt import GPTConfig, init_gpt_params
from parity_tests import strategies as S
from parity_tests.helpers import LOW_DTYPES, needs_vocab, tree_leaves, tree_map


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


# -- --dtype: a train checkpoint generating in bfloat16 or float16 -----------------------------------

def _saved_run(folder, params=None, vocab=None):
    """A train run folder of a tiny float32 GPT (its vocabulary GPT-2 ids ``vocab``)."""
    from attn_cli import checkpoint

    vocab = np.arange(9) * 7 if vocab is None else np.asarray(vocab)
    config = GPTConfig(vocab_size=len(vocab), block_size=8, n_layer=1, n_head=2, n_embd=4)
    params = init_gpt_params(config, np.random.default_rng(0)) if params is None else params
    checkpoint.save_checkpoint(str(folder), params, config, vocab, np.float32, {"steps": 1})
    return config, params


@needs_vocab
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_checkpoint_generates_in_a_low_dtype(tmp_path, capsys, monkeypatch, dtype):
    """``generate --checkpoint --dtype``: the model runs on the float32 params rounded once to the
    dtype, and its key/value cache holds that dtype, half the bytes a token of float32. The text
    is what generate() gives for the rounded params."""
    from attn_cli import cli, tokenizer

    ids = sorted(set(tokenizer.encode("The cat sat on the mat")))
    config, params = _saved_run(tmp_path / "run", vocab=ids)
    seen = {"caches": [], "params": set()}
    real_cache, real_forward = generate.gpt_kv_cache, generate.gpt_forward

    def spy_cache(config, B, dtype, max_len):
        seen["caches"].append(real_cache(config, B, dtype, max_len))
        return seen["caches"][-1]

    def spy_forward(x, params, config, **kw):
        seen["params"] |= {a.dtype for _, a in tree_leaves(params)}
        return real_forward(x, params, config, **kw)

    monkeypatch.setattr(generate, "gpt_kv_cache", spy_cache)
    monkeypatch.setattr(generate, "gpt_forward", spy_forward)
    argv = ["generate", "--checkpoint", str(tmp_path / "run"), "--prompt", "The cat", "--temperature", "0",
            "--max-new-tokens", "4", "--dtype", dtype]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    low = LOW_DTYPES[dtype][0]
    assert seen["params"] == {low}, f"the model ran on {seen['params']}, not {low}"
    assert {c.k.dtype for c in seen["caches"]} == {low}, [c.k.dtype for c in seen["caches"]]
    wide = real_cache(config, 1, np.float32, 1).bytes_per_token
    assert seen["caches"][0].bytes_per_token * 2 == wide, (seen["caches"][0].bytes_per_token, wide)
    rounded = tree_map(lambda a: a.astype(low), params)
    prompt = list(np.searchsorted(ids, tokenizer.encode("The cat")))
    expected = generate.generate(rounded, config, prompt, 4, 0.0, None, np.random.default_rng(0))
    assert text == tokenizer.decode(np.asarray(ids)[expected]) + "\n", (text, expected)


def test_a_checkpoint_beyond_float16s_range_is_refused_by_parameter(tmp_path, capsys):
    """A float32 weight of 1e5 (float16 holds up to 65504) is refused naming the parameter, not run
    with an infinity; bfloat16, with float32's range, takes it."""
    from attn_cli import cli

    config = GPTConfig(vocab_size=9, block_size=8, n_layer=1, n_head=2, n_embd=4)
    params = init_gpt_params(config, np.random.default_rng(0))
    params["blocks"]["0"]["ffn"]["fc"]["w"][1, 2] = 1e5
    _saved_run(tmp_path / "run", params)
    argv = ["generate", "--checkpoint", str(tmp_path / "run"), "--prompt", "x", "--dtype"]
    assert cli.main([*argv, "float16"]) == 2
    err = capsys.readouterr().err
    assert (f"{tmp_path / 'run'}: parameter blocks.0.ffn.fc.w holds values beyond the range of float16 "
            "(largest |value| 100000); leave out --dtype to generate in float32, as saved") in err, err
    rounded = generate.params_in(params, LOW_DTYPES["bfloat16"][0], "run")
    assert float(rounded["blocks"]["0"]["ffn"]["fc"]["w"][1, 2]) == 99840.0, "1e5 rounded to bfloat16"


def test_dtype_option():
    p = argparse.ArgumentParser()
    generate.add_arguments(p)
    assert p.parse_args(["--prompt", "x"]).dtype is None, "no --dtype: float32 for --hf, as saved for a checkpoint"
    assert p.parse_args(["--dtype", "bfloat16"]).dtype == "bfloat16"
    with pytest.raises(SystemExit):
        p.parse_args(["--dtype", "float64x"])


# -- the cache's size, checked before it is allocated ------------------------------------------------

def _sliding_cache(window, asked):
    """new_cache(max_len) of 2 sliding layers, 2 key/value heads of 8, float32: 128 bytes a token a
    layer; it records each max_len it is asked for."""
    from numpy_attn.kv_cache import init_kv_cache

    def new_cache(max_len):
        asked.append(max_len)
        return init_kv_cache(2, 1, 2, max_len, 8, np.float32, windows=[window, window])
    return new_cache


def test_sliding_layers_count_in_the_cache_size(monkeypatch):
    """Every layer slides, with a window and a context of 2^40: the size counts min(window, max_len)
    slots a layer (not only the full layers'), so 256 TiB is refused before any allocation."""
    from attn_cli import decoding

    monkeypatch.setattr(decoding, "memory_limits", lambda: {"this machine's memory": 2**30})
    asked = []
    with pytest.raises(ValueError) as err:
        decoding.decoding_cache(_sliding_cache(2**40, asked), 2**40 + 1, 2**40)
    # 1 sequence x 2 layers x 2**40 slots x 128 bytes
    assert f"needs {2 * 128 * 2**40:,} bytes" in str(err.value) and "windows [1099511627776]" in str(err.value)
    assert "lower --max-new-tokens" in str(err.value) and set(asked) == {1}, (str(err.value), asked)
    cache = decoding.decoding_cache(_sliding_cache(4, asked), 2**40 + 1, 2**40)   # 4 slots a layer fit
    assert cache.nbytes == decoding.cache_bytes(_sliding_cache(4, asked)(1), 2**40) == 2 * 4 * 128


@pytest.mark.parametrize("limit, named", [("address_space_limit", "ulimit -v (RLIMIT_AS)"),
                                          ("cgroup_memory_limit", "this cgroup's limit")])
def test_the_cache_must_fit_the_process_limits_not_only_the_machine(monkeypatch, limit, named):
    """A cache within the machine's memory but over the address-space or cgroup limit is refused
    naming that limit (the functions that read them are replaced: nothing is allocated)."""
    from attn_cli import decoding

    monkeypatch.setattr(decoding, "physical_memory", lambda: 2**40)
    monkeypatch.setattr(decoding, "address_space_limit", lambda: None)
    monkeypatch.setattr(decoding, "cgroup_memory_limit", lambda: None)
    monkeypatch.setattr(decoding, "_in_use", lambda statm: 0)
    assert decoding.decoding_cache(_sliding_cache(None, []), 2**20, 2**20).nbytes == 2 * 128 * 2**20
    monkeypatch.setattr(decoding, limit, lambda: 2**20)
    with pytest.raises(ValueError, match=f"needs {2 * 128 * 2**20:,} bytes .* more than the .*{re.escape(named)}"):
        decoding.decoding_cache(_sliding_cache(None, []), 2**20, 2**20)


@pytest.mark.parametrize("files, left", [({"memory.max": "1000", "memory.current": "400"}, 600),
                                         ({"memory.max": "max", "memory.current": "400"}, None),
                                         ({"memory/memory.limit_in_bytes": "5000",
                                           "memory/memory.usage_in_bytes": "1000"}, 4000),
                                         ({"memory/memory.limit_in_bytes": str(2**63 - 4096)}, None),
                                         ({}, None)])
def test_the_cgroup_limit_is_read_v2_then_v1(tmp_path, files, left):
    from attn_cli.decoding import cgroup_memory_limit

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text + "\n")
    assert cgroup_memory_limit(str(tmp_path)) == left


def test_the_address_space_limit_is_read_from_rlimit_as(monkeypatch):
    import resource

    from attn_cli import decoding

    monkeypatch.setattr(resource, "getrlimit", lambda which: (3 * 2**30, resource.RLIM_INFINITY)
                        if which == resource.RLIMIT_AS else (resource.RLIM_INFINITY,) * 2)
    assert decoding.address_space_limit() == 3 * 2**30
    monkeypatch.setattr(decoding, "_in_use", lambda statm: 2**30)
    assert decoding.memory_limits()["the address space left under ulimit -v (RLIMIT_AS)"] == 2 * 2**30
