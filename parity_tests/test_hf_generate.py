"""``numpy-attn generate --hf DIR``: a saved random checkpoint continued in NumPy gives the ids
that transformers' greedy ``generate`` gives."""

import numpy as np
import pytest
import torch
import transformers

from attn_cli import cli
from attn_cli.hf_generate import generate, next_token, parse_ids
from parity_tests.helpers import needs_vocab
from parity_tests.test_hf import LLAMA3, _llama_model


def _hf_greedy(model, ids, n):
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, min_new_tokens=n,
                             pad_token_id=0, eos_token_id=None)
    return out[0].tolist()


@pytest.mark.parametrize("cache", [[], ["--no-cache"]])
def test_llama_ids_in_ids_out(tmp_path, capsys, cache):
    """With the key/value cache (the default) and without, the ids transformers gives."""
    model = _llama_model(LLAMA3, False, False, np.float32)
    model.save_pretrained(tmp_path, safe_serialization=True)
    prompt = [3, 1, 4, 1, 5]
    assert cli.main(["generate", "--hf", str(tmp_path), "--ids", "3,1,4,1,5", "--max-new-tokens", "6",
                     "--temperature", "0", *cache]) == 0
    ours = [int(i) for i in capsys.readouterr().out.strip().split(",")]
    assert ours == _hf_greedy(model, prompt, 6), "greedy ids differ from transformers' generate"


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
    expected = tokenizer.decode(_hf_greedy(model, tokenizer.encode(prompt), 4))
    assert capsys.readouterr().out == expected + "\n", "greedy text differs from transformers'"


def test_sampling_is_seeded_and_uses_top_k():
    logits = np.array([0.0, 5.0, 4.9, -1.0])
    draws = {next_token(logits, 1.0, 2, np.random.default_rng(s)) for s in range(50)}
    assert draws == {1, 2}, f"top-2 sampling drew {draws}"
    a = generate(lambda ids: np.tile(logits, (1, ids.shape[1], 1)), [0], 4, 5, 1.0, None,
                 np.random.default_rng(7))
    b = generate(lambda ids: np.tile(logits, (1, ids.shape[1], 1)), [0], 4, 5, 1.0, None,
                 np.random.default_rng(7))
    assert a == b and len(a) == 6, (a, b)


def test_cache_feeds_only_new_tokens_until_the_context_slides():
    """With a cache the model sees the prompt once, then one token per step, while the ids fit
    in block_size; past it, the last block_size ids afresh without the cache."""
    from numpy_attn.kv_cache import init_kv_cache

    seen = []

    def forward(ids, kv_cache=None):
        seen.append((ids.shape[1], kv_cache is not None))
        if kv_cache is not None:
            kv_cache.lengths += ids.shape[1]                          # what a model's layers would append
        return np.tile(np.array([0.0, 5.0, 4.9]), (1, ids.shape[1], 1))

    out = generate(forward, [0, 2], 4, 4, 0.0, None, None, init_kv_cache(1, 1, 1, 4, 2))
    assert out == [0, 2, 1, 1, 1, 1], out
    assert seen == [(2, True), (1, True), (1, True), (4, False)], seen


def test_bad_arguments(tmp_path, capsys):
    _llama_model(LLAMA3, False, False, np.float32).save_pretrained(tmp_path, safe_serialization=True)
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
