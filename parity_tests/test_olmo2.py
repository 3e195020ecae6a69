"""Parity tests for numpy_attn/olmo2.py and torch_attn/olmo2.py, against Hugging Face's OLMo 2.

The tests of parity_tests/model_kit.py's model_tests (twin, autograd, transformers, finite
differences, cached decoding, checkpoints, generate --hf, bad configs) run on OLMo 2, plus what is
its own: the norms after the sublayers, and QK-norm across the heads.
"""

import numpy as np

import torch_attn.olmo2 as tw
from numpy_attn.olmo2 import Olmo2Config, init_olmo2_params, olmo2_backward, olmo2_forward
from parity_tests.helpers import assert_close, tree_map
from parity_tests.model_kit import Family, family_tol, model_tests

OLMO2 = Family("olmo2", "OLMo 2", Olmo2Config, olmo2_forward, olmo2_backward, tw.olmo2, "olmo2")


def _model():
    """A float64 model with eps = 0, so that a norm removes a scale exactly (up to rounding)."""
    config = Olmo2Config(vocab_size=7, block_size=4, n_layer=1, n_head=2, n_kv_head=1, n_embd=8, head_dim=4,
                         rms_eps=0.0)
    rng = np.random.default_rng(0)
    params = tree_map(lambda p: p + rng.uniform(-0.5, 0.5, p.shape), init_olmo2_params(config, rng, np.float64))
    return config, params, np.array([[1, 2, 3, 4]])


class TestOlmo2(model_tests(OLMO2)):

    def test_norms_sit_after_the_sublayers(self):
        """With the norms after attention and the MLP, scaling the MLP's down projection leaves
        the logits unchanged (the norm after it removes the scale), which a norm before the MLP
        (Llama's) would not."""
        config, params, ids = _model()
        logits, cache = olmo2_forward(ids, params, config)
        scaled = tree_map(lambda p: p.copy(), params)
        scaled["blocks"]["0"]["mlp"]["down"]["w"] *= 5.0
        assert_close("olmo2.logits with mlp.down scaled", olmo2_forward(ids, scaled, config)[0], logits,
                     **family_tol(cache, np.float64))

    def test_qk_norm_is_across_the_heads(self):
        """The q norm's weight has width nh * hs, and one norm spans all heads: scaling one head's
        query columns changes the other head's normed query, so the logits change; scaling all
        the query columns together does not."""
        config, params, ids = _model()
        assert params["blocks"]["0"]["attn"]["q_norm"]["w"].shape == (8,), "OLMo 2's q norm spans the projection"
        assert params["blocks"]["0"]["attn"]["k_norm"]["w"].shape == (4,), "OLMo 2's k norm spans nkv * hs"
        logits, cache = olmo2_forward(ids, params, config)
        scaled = tree_map(lambda p: p.copy(), params)
        scaled["blocks"]["0"]["attn"]["q"]["w"] *= 7.0
        assert_close("olmo2.logits with every query column scaled", olmo2_forward(ids, scaled, config)[0], logits,
                     **family_tol(cache, np.float64))
        scaled["blocks"]["0"]["attn"]["q"]["w"][:, :4] *= 7.0                 # head 0 now 49x, head 1 7x
        moved = np.abs(olmo2_forward(ids, scaled, config)[0] - logits).max()
        assert moved > 1e-3, f"olmo2.logits moved by only {moved:.1e} when one head's query was scaled"
