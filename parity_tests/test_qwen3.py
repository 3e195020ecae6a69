"""Parity tests for numpy_attn/qwen3.py and torch_attn/qwen3.py, against Hugging Face's Qwen3.

Qwen3 is test_llama.py's model with QK-norm per head, so these are test_llama.py's kinds of test
run on it (the QK-norm pieces themselves are tested there, beside qk_norm_forward), plus cached
decoding and checkpoints saved by transformers. ``model_tests`` (parity_tests/model_kit.py) makes
them for any family built on Llama's model; parity_tests/test_olmo2.py runs them on OLMo 2.
"""


import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import torch_attn.qwen3 as tw
from numpy_attn.qwen3 import Qwen3Config, qwen3_backward, qwen3_forward
from parity_tests.helpers import (
    assert_close,
    to_torch,
    tree_map,
)
from parity_tests.model_kit import (
    Family,
    assert_keeps_the_last_logits,
    family_tol,
    init_params,
    model_tests,
    small_family_model,
)

QWEN3 = Family("qwen3", "Qwen3", Qwen3Config, qwen3_forward, qwen3_backward, tw.qwen3, "qwen3")


class TestQwen3(model_tests(QWEN3)):

    @pytest.mark.parametrize("changes, message", [
        ({"use_sliding_window": True, "sliding_window": 4}, "use_sliding_window = True is not supported"),
        ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types must list only 'full_attention'"),
        ({"layer_types": "full_attention"}, "layer_types must list only 'full_attention'"),
    ])
    def test_sliding_window_is_refused_naming_the_field(self, tmp_path, capsys, changes, message):
        """Qwen3's optional sliding window (off in the released llama_models) is not implemented."""
        self._assert_bad_config_refused(tmp_path, capsys, changes, message)

    def test_qk_norm_is_per_head_before_the_rotation(self):
        """The q norm's weight has width hs and acts on each head alone: scaling one head's query
        projection columns by a constant leaves the logits unchanged (RMS norm removes the scale
        exactly with eps = 0), which a norm across heads (OLMo 2's) would not."""
        config = Qwen3Config(vocab_size=7, block_size=4, n_layer=1, n_head=2, n_kv_head=1, n_embd=8, head_dim=4,
                             rms_eps=0.0)
        rng = np.random.default_rng(0)
        params = tree_map(lambda p: p + rng.uniform(-0.5, 0.5, p.shape), init_params(config, rng, np.float64))
        assert params["blocks"]["0"]["attn"]["q_norm"]["w"].shape == (4,), "Qwen3's q norm is per head"
        ids = np.array([[1, 2, 3, 4]])
        logits, cache = qwen3_forward(ids, params, config)
        scaled = tree_map(lambda p: p.copy(), params)
        scaled["blocks"]["0"]["attn"]["q"]["w"][:, :4] *= 7.0                  # head 0's query only
        assert_close("qwen3.logits with head 0's query scaled", qwen3_forward(ids, scaled, config)[0], logits,
                     **family_tol(cache, np.float64))


# -- logits_to_keep in every family built on numpy_attn/llama.py ------------------------------------

@pytest.fixture(scope="module")
def family_model():
    """model_kit.small_family_model: ``make(name, seed)`` -> a small float64 model of family ``name``."""
    return small_family_model


@pytest.mark.parametrize("name", ["llama", "qwen3", "qwen3_5", "qwen3_next", "olmo2", "olmo_hybrid", "gemma2", "gemma3",
                                  "gemma4", "gpt_oss", "deepseek_v3", "deepseek_v32", "glm_moe_dsa",
                                  "llama4", "kimi_linear"])
@settings(max_examples=8)
@given(seed=st.integers(0, 2**32 - 1), B=st.integers(1, 2), T=st.integers(1, 6), N=st.integers(0, 7))
@example(seed=0, B=1, T=5, N=1)
def test_logits_to_keep_in_every_family(family_model, name, seed, B, T, N):
    """Each family's forward keeps the last N positions' logits (Gemma's cap applied to those),
    equal to its full forward's and its twin's, with the backward of model_kit's
    assert_keeps_the_last_logits; and it refuses a bad logits_to_keep, naming it."""
    forward, backward, twin, config, params, rstds = family_model(name, seed)
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, config.vocab_size, (B, T))
    dout = rng.normal(size=(B, T, config.vocab_size))
    assert_keeps_the_last_logits(name, lambda ids, p, **kw: forward(ids, p, config, **kw), backward,
                                 lambda p, **kw: twin(to_torch(ids), p, config, **kw), params, ids, N, dout, rstds)
    with pytest.raises(ValueError, match="logits_to_keep must be None or an int >= 0 .*, got -1$"):
        forward(ids, params, config, logits_to_keep=-1)
    with pytest.raises(TypeError, match="logits_to_keep must be None or an int >= 0 .*, got False of type bool"):
        forward(ids, params, config, logits_to_keep=False)
