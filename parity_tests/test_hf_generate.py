"""``numpy-attn generate --hf DIR``: a saved random checkpoint continued in NumPy gives the ids
that transformers' greedy ``generate`` gives."""

import json

import numpy as np
import pytest
import torch
import transformers

from attn_cli import cli
from attn_cli.decoding import continue_ids, next_token, physical_memory
from attn_cli.hf import load_checkpoint
from attn_cli.hf_generate import parse_ids
from parity_tests.helpers import LOW_DTYPES, needs_vocab, ulp
from parity_tests.model_kit import LLAMA3, exact_hf_llama, hf_gpt2_model, hf_greedy, hf_llama_model, randomise


@pytest.mark.parametrize("cache", [[], ["--no-cache"]])
def test_llama_ids_in_ids_out(tmp_path, capsys, cache):
    """With the key/value cache (the default) and without, the ids transformers gives."""
    model = hf_llama_model(LLAMA3, False, False, np.float32)
    model.save_pretrained(tmp_path, safe_serialization=True)
    prompt = [3, 1, 4, 1, 5]
    assert cli.main(["generate", "--hf", str(tmp_path), "--ids", "3,1,4,1,5", "--max-new-tokens", "6",
                     "--temperature", "0", *cache]) == 0
    ours = [int(i) for i in capsys.readouterr().out.strip().split(",")]
    assert ours == hf_greedy(model, prompt, 6), "greedy ids differ from transformers' generate"


def _greedy_margin(model, truth_model, ids, n_prompt, dtype):
    """(margin, bound) along the greedy path ``ids`` (the prompt's n_prompt ids, then the new ones):
    margin, the smallest gap between the float64 truth's two largest logits at a step; bound,
    2 (2 e + u), e the largest error of ``model``'s logits (in the low ``dtype``) against the truth's
    on the path, u one ulp of the largest |logit|. A model whose logits are within the error budget
    (2 e + u) moves a gap by at most the bound, so with margin > bound its greedy ids are decided
    by the model, not by a near-tie that rounding may flip either way."""
    with torch.no_grad():
        x = torch.tensor([ids])
        truth = truth_model(input_ids=x).logits[0, n_prompt - 1:-1].double()
        lowp = model(input_ids=x).logits[0, n_prompt - 1:-1].double()
    top2 = truth.topk(2, dim=-1).values
    margin = float((top2[:, 0] - top2[:, 1]).min())
    return margin, 2 * (2 * float((lowp - truth).abs().max()) + ulp(float(truth.abs().max()), dtype))


def _low_models(family, dtype, folder):
    """(transformers' model in ``dtype``, the same weights in float64 as the truth), saved to ``folder``.
    The Llama's weights are _randomise's seed 8: of seeds 0 to 11, seven make a step of the greedy
    path nearly tied in bfloat16 (gap below _greedy_margin's bound); GPT-2's seed 0 has none."""
    if family == "llama":
        model = hf_llama_model(LLAMA3, False, False, np.float32, seed=8).to(LOW_DTYPES[dtype][1])
        model.save_pretrained(folder, safe_serialization=True)
        config = load_checkpoint(folder, np.float64)[1]
        truth = exact_hf_llama(transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float64), config)
    else:
        model = hf_gpt2_model(True, np.float32).to(LOW_DTYPES[dtype][1])
        model.save_pretrained(folder, safe_serialization=True)
        truth = transformers.GPT2LMHeadModel.from_pretrained(folder, dtype=torch.float64)
    return model.eval(), truth.eval()


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@pytest.mark.parametrize("cache", [[], ["--no-cache"]])
def test_ids_in_a_low_dtype_match_transformers(tmp_path, capsys, family, dtype, cache):
    """``--dtype bfloat16`` / ``float16`` on a folder saved in that dtype: the ids transformers'
    greedy generate gives with the model in that dtype, with the cache and without. Greedy decoding
    in low precision flips where two logits are nearly tied, whoever computes; the weights (seeds
    chosen in _low_models) are checked first to decide every step with room to spare
    (_greedy_margin), so that this test is about the dtype handling and not a coin toss."""
    model, truth = _low_models(family, dtype, tmp_path)
    prompt, n = [3, 1, 4, 1, 5], 4
    expected = hf_greedy(model, prompt, n)
    margin, bound = _greedy_margin(model, truth, expected, len(prompt), dtype)
    assert margin > bound, f"{family} {dtype}: a near-tie on the greedy path (gap {margin:.3g} <= {bound:.3g})"
    assert cli.main(["generate", "--hf", str(tmp_path), "--ids", ",".join(map(str, prompt)), "--max-new-tokens",
                     str(n), "--temperature", "0", "--dtype", dtype, *cache]) == 0
    ours = [int(i) for i in capsys.readouterr().out.strip().split(",")]
    assert ours == expected, f"{family} {dtype}: greedy ids {ours} differ from transformers' {expected}"


@needs_vocab
@pytest.mark.parametrize("cache", [[], ["--no-cache"]])
def test_gpt2_prompt_in_text_out(tmp_path, capsys, cache):
    """A random model with GPT-2's vocabulary size, so that the prompt's tokens fit; with the
    key/value cache (the default) and without."""
    from attn_cli import tokenizer

    config = transformers.GPT2Config(vocab_size=50257, n_positions=16, n_embd=8, n_layer=1, n_head=2)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-0.5, 0.5)
    model.save_pretrained(tmp_path, safe_serialization=True)
    prompt = "The cat sat"
    assert cli.main(["generate", "--hf", str(tmp_path), "--prompt", prompt, "--max-new-tokens", "4",
                     "--temperature", "0", *cache]) == 0
    expected = tokenizer.decode(hf_greedy(model, tokenizer.encode(prompt), 4))
    assert capsys.readouterr().out == expected + "\n", "greedy text differs from transformers'"


def test_sampling_is_seeded_and_uses_top_k():
    logits = np.array([0.0, 5.0, 4.9, -1.0])
    draws = {next_token(logits, 1.0, 2, np.random.default_rng(s)) for s in range(50)}
    assert draws == {1, 2}, f"top-2 sampling drew {draws}"
    def forward(ids, logits_to_keep, for_backward):
        return np.tile(logits, (1, logits_to_keep, 1))

    a = continue_ids(forward, [0], 4, 5, 1.0, None, np.random.default_rng(7))
    b = continue_ids(forward, [0], 4, 5, 1.0, None, np.random.default_rng(7))
    assert a == b and len(a) == 6, (a, b)


def test_a_tiny_temperature_draws_the_largest_and_broken_logits_are_refused():
    """A temperature of 1e-310 overflowed logits / temperature to +-inf (NaN in the softmax); NaN
    logits went to argmax, which returns the NaN's position."""
    logits = np.array([0.0, 5.0, 4.9, -1.0])
    assert next_token(logits, 1e-310, None, np.random.default_rng(0)) == 1
    assert next_token(logits, 1e-310, 2, np.random.default_rng(0)) == 1
    for bad in (np.nan, np.inf):
        with pytest.raises(ValueError, match="the model's logits hold NaN or infinite values"):
            next_token(np.array([0.0, bad, 1.0]), 0.0, None, None)


def test_cache_feeds_only_new_tokens_until_the_context_slides():
    """With a cache the model sees the prompt once, then one token per step, while the ids fit
    in block_size; past it, the last block_size ids afresh without the cache."""
    from numpy_attn.kv_cache import init_kv_cache

    seen = []

    def forward(ids, kv_cache=None, logits_to_keep=None, for_backward=True):
        seen.append((ids.shape[1], kv_cache is not None, logits_to_keep, for_backward))
        if kv_cache is not None:
            kv_cache.lengths += ids.shape[1]                          # what a model's layers would append
        return np.tile(np.array([0.0, 5.0, 4.9]), (1, ids.shape[1], 1))

    out = continue_ids(forward, [0, 2], 4, 4, 0.0, None, None, lambda max_len: init_kv_cache(1, 1, 1, max_len, 2))
    assert out == [0, 2, 1, 1, 1, 1], out
    # Every step reads the last logits only: the head runs on one position (logits_to_keep=1), and
    # nothing is kept for a backward (for_backward=False).
    assert seen == [(2, True, 1, False), (1, True, 1, False), (1, True, 1, False), (4, False, 1, False)], seen


def test_bad_arguments(tmp_path, capsys):
    hf_llama_model(LLAMA3, False, False, np.float32).save_pretrained(tmp_path, safe_serialization=True)
    assert cli.main(["generate", "--hf", str(tmp_path), "--prompt", "hello"]) == 2
    err = capsys.readouterr().err
    assert "is a Llama checkpoint" in err and "--ids 1,2,3" in err, err
    assert cli.main(["generate", "--hf", str(tmp_path), "--ids", "1,x"]) == 2
    assert "--ids must be comma-separated integers" in capsys.readouterr().err
    assert cli.main(["generate", "--prompt", "hi", "--ids", "1,2"]) == 2
    assert "--ids goes with --hf" in capsys.readouterr().err
    assert cli.main(["generate", "--hf", str(tmp_path / "missing"), "--ids", "1"]) == 2
    assert "has no config.json" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--ids is empty"):
        parse_ids(" , ")


def _gpt2_folder(folder, n_positions=16, vocab_size=50):
    config = transformers.GPT2Config(vocab_size=vocab_size, n_positions=n_positions, n_embd=8, n_layer=1, n_head=2)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder, safe_serialization=True)
    return folder


def _edit_config(folder, **changes):
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_a_prompt_longer_than_the_context_is_refused_as_for_train_checkpoints(tmp_path, capsys):
    """20 ids into 16 positions: refused with the train checkpoint's message, not cut to the last 16."""
    from attn_cli import generate
    from numpy_attn.gpt import GPTConfig, init_gpt_params

    ids = ",".join(str(i % 50) for i in range(20))
    folder = _gpt2_folder(tmp_path)
    capsys.readouterr()                                     # transformers' progress bar
    assert cli.main(["generate", "--hf", str(folder), "--ids", ids, "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    config = GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=8)
    with pytest.raises(ValueError) as train:
        generate.generate(init_gpt_params(config, np.random.default_rng(0)), config, list(range(20)), 2)
    assert str(train.value) == "the prompt is 20 tokens, longer than the context of block_size = 16", train.value
    assert err == f"numpy-attn generate: error: {train.value}\n", err


def test_ids_outside_the_vocabulary_are_refused_by_option(tmp_path, capsys):
    assert cli.main(["generate", "--hf", str(_gpt2_folder(tmp_path)), "--ids", "1,50"]) == 2
    err = capsys.readouterr().err
    assert f"--ids: token id 50 is outside the vocabulary of {tmp_path}, ids 0 to 49" in err, err


def test_the_cache_is_sized_by_the_prompt_and_new_tokens(tmp_path, capsys):
    """max_position_embeddings = 10^10 would make a cache of 2.5 TB by the context; the ids are
    those of the same folder with a context of 16, and the peak allocation stays small."""
    import tracemalloc

    model = hf_llama_model(LLAMA3, False, False, np.float32)
    model.save_pretrained(tmp_path, safe_serialization=True)
    argv = ["generate", "--hf", str(tmp_path), "--ids", "3,1,4", "--max-new-tokens", "3", "--temperature", "0"]
    assert cli.main(argv) == 0
    expected = capsys.readouterr().out
    _edit_config(tmp_path, max_position_embeddings=10**10)
    tracemalloc.start()
    try:
        status = cli.main(argv)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert status == 0 and capsys.readouterr().out == expected, "a longer context changed the ids"
    assert peak < 64 * 2**20, f"{peak:,} bytes allocated for 6 tokens of a tiny model"


@pytest.mark.skipif(physical_memory() is None, reason="the system does not say how much memory it has")
@pytest.mark.parametrize("dtype, needs", [([], "25,600,000,000,256"), (["--dtype", "float32"], "25,600,000,000,256"),
                                          (["--dtype", "bfloat16"], "12,800,000,000,128"),
                                          (["--dtype", "float16"], "12,800,000,000,128")])
def test_a_cache_larger_than_memory_is_refused_with_its_size(tmp_path, capsys, dtype, needs):
    """The cache takes the model's dtype: in bfloat16 and float16 half the bytes a token."""
    hf_llama_model(LLAMA3, False, False, np.float32).save_pretrained(tmp_path, safe_serialization=True)
    _edit_config(tmp_path, max_position_embeddings=10**12)
    assert cli.main(["generate", "--hf", str(tmp_path), "--ids", "1", "--max-new-tokens", str(10**11), *dtype]) == 2
    err = capsys.readouterr().err
    # 2 (k, v) x 2 layers x 2 key/value heads x head size 8 x 4 bytes = 256 bytes a token (2 bytes: 128).
    assert "the key/value cache for 100,000,000,001 tokens" in err and f"needs {needs} bytes" in err, err
    assert "lower --max-new-tokens" in err, err


def test_the_loop_asks_for_a_cache_of_prompt_plus_new_tokens():
    from numpy_attn.kv_cache import init_kv_cache

    asked = []

    def new_cache(max_len):
        asked.append(max_len)
        return init_kv_cache(1, 1, 1, max_len, 2)

    def forward(ids, kv_cache=None, logits_to_keep=None, for_backward=True):
        if kv_cache is not None:
            kv_cache.lengths += ids.shape[1]
        return np.zeros((1, logits_to_keep, 3))

    continue_ids(forward, [0, 1, 2], 10**9, 4, 0.0, None, None, new_cache)
    continue_ids(forward, [0, 1, 2], 5, 4, 0.0, None, None, new_cache)
    assert asked == [1, 7, 1, 5], f"cache sizes asked for (a probe of 1 slot, then the cache): {asked}"


def _chunk_models():
    """{family: (forward, new cache, config, params)}, float64, small: GPT-2's layout, Gemma 2's
    sliding layers (a window of 2, shorter than a chunk) and DeepSeek-V3's absorbed latent cache."""
    from numpy_attn.deepseek_v3 import (
        DeepseekV3Config,
        deepseek_v3_forward,
        deepseek_v3_kv_cache,
        init_deepseek_v3_params,
    )
    from numpy_attn.gemma2 import Gemma2Config, gemma2_forward, gemma2_kv_cache, init_gemma2_params
    from numpy_attn.gpt import GPTConfig, gpt_forward, gpt_kv_cache, init_gpt_params
    from parity_tests.helpers import tree_map

    rng = np.random.default_rng(0)
    made = {"gpt2": (gpt_forward, gpt_kv_cache, GPTConfig(vocab_size=11, block_size=12, n_layer=2, n_head=2, n_embd=8),
                     init_gpt_params),
            "gemma2": (gemma2_forward, gemma2_kv_cache, Gemma2Config(vocab_size=11, block_size=12, n_layer=2, n_head=2,
                                                                     n_kv_head=1, n_embd=8, sliding_window=2),
                       init_gemma2_params),
            "deepseek_v3": (deepseek_v3_forward, deepseek_v3_kv_cache,
                            DeepseekV3Config(vocab_size=11, block_size=12, n_layer=2, n_head=2, n_kv_head=2, n_embd=6,
                                             n_routed_experts=4, n_group=2, topk_group=1, num_experts_per_tok=2,
                                             moe_hidden=3, hidden=5), init_deepseek_v3_params)}
    return {family: (forward, cache, config, tree_map(lambda p: p + rng.uniform(-0.5, 0.5, p.shape),
                                                      init(config, rng, np.float64)))
            for family, (forward, cache, config, init) in made.items()}


@pytest.mark.parametrize("family", ["gpt2", "gemma2", "deepseek_v3"])
def test_a_prompt_enters_the_cache_in_chunks_with_the_logits_of_one_forward(monkeypatch, family):
    """A 7-id prompt with PREFILL_CHUNK = 3 runs as forwards of 3, 3 and 1 ids through the cache,
    then one id a step; the logits after it are the one whole forward's, and each step's those of
    a whole forward over the ids so far (float64: the chunks reorder no sum of one position but
    the attention's, whose terms they only split among calls)."""
    from attn_cli import decoding

    forward, new_cache, config, params = _chunk_models()[family]
    monkeypatch.setattr(decoding, "PREFILL_CHUNK", 3)
    calls = []

    def recorded(ids, **kw):
        logits = forward(ids, params, config, **kw)[0]
        calls.append((ids.shape[1], logits))
        return logits

    prompt = [1, 4, 1, 5, 9, 2, 6]
    out = continue_ids(recorded, prompt, config.block_size, 3, 0.0, None, None,
                       lambda max_len: new_cache(config, 1, np.float64, max_len))
    assert [n for n, _ in calls] == [3, 3, 1, 1, 1], [n for n, _ in calls]
    for step, (_, logits) in enumerate(calls[2:]):                           # after the prompt, then each new id
        ids = np.array([out[:len(prompt) + step]])
        whole = forward(ids, params, config, logits_to_keep=1)[0]           # (1, 1, V)
        np.testing.assert_allclose(logits, whole, rtol=1e-10, atol=1e-12,
                                   err_msg=f"{family}: logits after {ids.shape[1]} ids, chunked vs one forward")


@pytest.mark.parametrize("family", ["gpt2", "gemma2", "deepseek_v3"])
def test_a_forward_for_no_backward_keeps_no_activations(family):
    """for_backward=False (what generation runs): the same logits bit for bit, no cache for a
    backward, and a smaller peak of the memory the forward allocates, which held every block's
    activations with the cache (tracemalloc traces NumPy's allocations); a value other than True
    or False is refused, naming it."""
    import tracemalloc

    forward, _, config, params = _chunk_models()[family]
    ids = np.random.default_rng(1).integers(0, config.vocab_size, (256, config.block_size))   # (256, 12)
    peaks = {}
    for keep in (True, False):
        tracemalloc.start()
        logits, cache = forward(ids, params, config, for_backward=keep)
        peaks[keep] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        if keep:
            kept_logits = logits
        else:
            assert cache is None, f"{family}: a cache was returned with for_backward=False"
            np.testing.assert_array_equal(logits, kept_logits, err_msg=f"{family}: logits changed")
    # Two blocks: with the cache the second block runs beside the first one's activations; without,
    # alone (0.54-0.66 of the peak with it, measured; 1.0 while the loop still held the last block's).
    assert peaks[False] < 0.75 * peaks[True], f"{family}: peak {peaks[False]} B without the cache, {peaks[True]} with"
    with pytest.raises(TypeError, match="for_backward must be True or False.*'no'"):
        forward(ids, params, config, for_backward="no")


# -- every rope type rope.py implements, read for the rotary families ---------------------------

# YaRN stretches an original context of 8 to the 32 of max_position_embeddings; dynamic NTK keeps the
# base up to max_position_embeddings = 4 and grows it past there, each forward's base set by its
# longest position (transformers' rotary embedding and rope.py alike). 5 prompt ids and 10 new ones
# run to position 14, so that dynamic's base grows for the prompt and at every step.
LONG_ROPES = {"yarn": ({"rope_type": "yarn", "rope_theta": 100.0, "factor": 4.0, "original_max_position_embeddings": 8,
                        "beta_fast": 8.0}, 32),
              "dynamic": ({"rope_type": "dynamic", "rope_theta": 100.0, "factor": 4.0}, 4)}
LONG_PROMPT, LONG_NEW = [3, 1, 4, 1, 5], 10


def _rotary_model(family, rope, seed=0):
    """A small random transformers model of ``family`` with ``rope``'s rope_parameters (float32)."""
    parameters, context = LONG_ROPES[rope] if isinstance(rope, str) else (rope, 32)
    classes = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
               "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
               "olmo2": (transformers.Olmo2Config, transformers.Olmo2ForCausalLM)}
    config_class, model_class = classes[family]
    config = config_class(vocab_size=23, hidden_size=16, intermediate_size=20, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=4,
                          max_position_embeddings=context, rope_parameters=dict(parameters),
                          tie_word_embeddings=False, rms_norm_eps=1e-5, attn_implementation="eager")
    return randomise(model_class(config), seed).eval()


def _hf_greedy_uncached(model, ids, n):
    """transformers' greedy ids without its cache: every step runs the whole sequence, as --no-cache does."""
    ids = torch.tensor([ids])                                                 # (1, P)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                             min_new_tokens=n, pad_token_id=0, eos_token_id=None, use_cache=False)
    return out[0].tolist()


@pytest.mark.parametrize("family", ["llama", "qwen3", "olmo2"])
@pytest.mark.parametrize("rope", ["yarn", "dynamic"])
@pytest.mark.parametrize("cache", [[], ["--no-cache"]])
def test_yarn_and_dynamic_rope_generate_transformers_ids(tmp_path, capsys, family, rope, cache):
    """``generate --hf`` on a Llama, Qwen3 or OLMo 2 folder whose rope_parameters ask for YaRN or
    dynamic NTK: the greedy ids of transformers' generate, with its cache (each step's keys rotated
    by the base of their own step, as ours with the key/value cache) and without (every position
    rotated by the last step's base, as ours with --no-cache). The same weights with the default
    rope give other ids, so the rope type decides them."""
    model = _rotary_model(family, rope)
    model.save_pretrained(tmp_path, safe_serialization=True)
    expected = (_hf_greedy_uncached if cache else hf_greedy)(model, LONG_PROMPT, LONG_NEW)
    plain = _rotary_model(family, {"rope_type": "default", "rope_theta": 100.0})
    assert (_hf_greedy_uncached if cache else hf_greedy)(plain, LONG_PROMPT, LONG_NEW) != expected, \
        f"{family} {rope}: the default rope gives the same ids; the test would not see the rope type"
    assert cli.main(["generate", "--hf", str(tmp_path), "--ids", ",".join(map(str, LONG_PROMPT)), "--max-new-tokens",
                     str(LONG_NEW), "--temperature", "0", *cache]) == 0
    ours = [int(i) for i in capsys.readouterr().out.strip().split(",")]
    assert ours == expected, f"{family} {rope}: greedy ids {ours} differ from transformers' {expected}"


@pytest.mark.parametrize("family", ["llama", "qwen3", "olmo2"])
def test_dynamic_rope_context_is_its_factor_times_the_original(tmp_path, family):
    """Dynamic NTK serves factor times max_position_embeddings (4 x 4 here), with the original context
    of 4 as rope.py's original_max_position_embeddings; YaRN's context is max_position_embeddings."""
    _rotary_model(family, "dynamic").save_pretrained(tmp_path / "dynamic", safe_serialization=True)
    _rotary_model(family, "yarn").save_pretrained(tmp_path / "yarn", safe_serialization=True)
    dynamic, yarn = (load_checkpoint(tmp_path / rope)[1] for rope in ("dynamic", "yarn"))
    assert dynamic.block_size == 16, dynamic
    assert dynamic.rope_scaling == {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 4}, \
        dynamic.rope_scaling
    assert yarn.block_size == 32 and yarn.rope_scaling["rope_type"] == "yarn", yarn
    assert yarn.rope_scaling["beta_fast"] == 8.0, "YaRN's optional keys are read where given"
