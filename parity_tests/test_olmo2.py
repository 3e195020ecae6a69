"""Parity tests for numpy_attn/olmo2.py and torch_attn/olmo2.py, against Hugging Face's OLMo 2.

The tests of parity_tests/model_kit.py's model_tests (twin, autograd, transformers, finite
differences, cached decoding, checkpoints, generate --hf, bad configs) run on OLMo 2, plus what is
its own: the norms after the sublayers, and QK-norm across the heads.
"""

import numpy as np
import pytest

import torch_attn.olmo2 as tw
from numpy_attn._model import qkv_forward
from numpy_attn.llama import llama_kv_cache
from numpy_attn.multi_head import split_heads
from numpy_attn.olmo2 import Olmo2Config, init_olmo2_params, olmo2_attention_forward, olmo2_backward, olmo2_forward
from numpy_attn.qk_norm import qk_norm_forward
from numpy_attn.rms_norm import rms_norm_forward
from numpy_attn.swiglu import swiglu_forward
from parity_tests.helpers import LOW_DTYPES, assert_close, round_to, tree_map
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


@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_every_norm_rounds_the_product_once(dtype):
    """In float16 and bfloat16 each of OLMo 2's four norms (QK, after attention, after the MLP, the
    final one) rounds w * xhat once, as transformers' Olmo2RMSNorm ((weight * hidden).to(dtype)),
    where Llama's rounds xhat first: each normed tensor is rms_norm_forward's with
    round_xhat=False, bit for bit. Rounding xhat first gives other bits on these rows, within the
    error budget, so only bits tell. One token per sequence, at position 0, where the rotation
    leaves k's bits as they are, so the cached k is the k norm's output."""
    config = Olmo2Config(vocab_size=5, block_size=1, n_layer=1, n_head=2, n_kv_head=2, n_embd=16, head_dim=8)
    rng = np.random.default_rng(0)
    params = init_olmo2_params(config, rng, LOW_DTYPES[dtype][0])
    block = params["blocks"]["0"]
    norms = [block["attn"]["q_norm"], block["attn"]["k_norm"], block["attn_norm"], block["mlp_norm"], params["norm"]]
    for norm in norms:   # away from 1, where w * xhat needs no rounding of its own
        norm["w"] = round_to(rng.uniform(0.5, 1.5, norm["w"].shape), dtype)
    ids, positions, eps = rng.integers(0, 5, (64, 1)), np.arange(1), config.rms_eps
    _, cache = olmo2_forward(ids, params, config)
    x = cache.hidden[0]                                                       # the embedding, (B, 1, C)

    def once_not_twice(name, got, norm_of):
        """got (in the dtype, or upcast exactly to float32 in a linear's cache) is
        norm_of(round_xhat=False) bit for bit, and the rows tell it from round_xhat=True."""
        once, twice = norm_of(False), norm_of(True)
        assert not np.array_equal(once, twice), f"{name}: the rows do not tell the two roundings apart"
        assert np.array_equal(got, once), f"{name}: {np.mean(got != once):.0%} differ"

    # the k norm: the key the cache holds (nkv = nh here, so no head is repeated)
    kv_cache = llama_kv_cache(config, 64, x.dtype)
    olmo2_attention_forward(x, block["attn"], config, positions, kv_cache=kv_cache.layer(0))
    q, k, _ = qkv_forward(x, block["attn"])[0]                                # (B, 1, nh*hs), (B, 1, nkv*hs)
    once_not_twice("the k norm", kv_cache.k[0][:, :, :1],
                   lambda r: split_heads(qk_norm_forward(q, k, block["attn"], eps, round_xhat=r)[1], 2))
    # the norm after attention: the MLP's input is x + rms_norm(attention(x))
    a, _ = olmo2_attention_forward(x, block["attn"], config, positions)      # (B, 1, C)
    x1 = cache.blocks[0].mlp[0].x                                             # the gate's input
    once_not_twice("the norm after attention", x1,
                   lambda r: x + rms_norm_forward(a, block["attn_norm"]["w"], eps, round_xhat=r)[0])
    # the norm after the MLP: the block's output is x1 + rms_norm(swiglu(x1))
    x1 = x1.astype(x.dtype)                                                   # exact: x1 equals the norm's bits
    f, _ = swiglu_forward(x1, block["mlp"])                                   # (B, 1, C)
    out = cache.hidden[1]
    once_not_twice("the norm after the MLP", out,
                   lambda r: x1 + rms_norm_forward(f, block["mlp_norm"]["w"], eps, round_xhat=r)[0])
    # the final norm: the head's input
    once_not_twice("the final norm", cache.head.linear.x,
                   lambda r: rms_norm_forward(out, params["norm"]["w"], eps, round_xhat=r)[0])
