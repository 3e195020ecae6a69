"""Parity tests for numpy_attn/olmo_hybrid.py and torch_attn/olmo_hybrid.py: the model against
Hugging Face's OlmoHybridForCausalLM in float64 (logits and every parameter's gradient), the twin,
finite differences, refusals of bad configs, and decoding with the hybrid cache against the full
forward."""

import inspect
import types

import numpy as np
import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.olmo_hybrid import modeling_olmo_hybrid as hf_modeling

import torch_attn.olmo_hybrid as tw
from numpy_attn.olmo_hybrid import (
    OlmoHybridConfig,
    init_olmo_hybrid_params,
    olmo_hybrid_backward,
    olmo_hybrid_forward,
)
from numpy_attn.qwen3_5 import qwen3_5_kv_cache
from numpy_attn.rope import rope_frequencies
from parity_tests.helpers import (
    moved_off_init,
    to_numpy,
    to_torch,
)
from parity_tests.model_kit import (
    assert_backward_refuses_cached_forward,
    assert_checkpoint_reads_as,
    assert_hybrid_decodes_as_full_forward,
    assert_hybrid_equals_transformers,
    assert_hybrid_generates_as_transformers,
    assert_hybrid_matches_twin,
    assert_hybrid_meets_error_budget,
    assert_leaf_matches_finite_differences,
    assert_llama_cache_refused,
    assert_twin_decodes_as_ours,
    drawn_hybrid_case,
    float64_twin,
    hybrid_budget_cases,
    randomise,
    tree_from_names,
)

# A tiny OLMo Hybrid: Gated DeltaNet and attention layers alternating (so that each kind follows the
# other), 4 query heads on 2 key/value heads of 4 channels; 2 key heads of Gated DeltaNet serving 4
# value heads. Pad and eos ids inside the vocabulary (the default pad id, 100277, is not).
HF_SIZES = dict(vocab_size=97, hidden_size=16, intermediate_size=24, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=4, linear_value_head_dim=6,
                linear_conv_kernel_dim=4, rms_norm_eps=1e-6, linear_allow_neg_eigval=True,
                layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
CONFIG = OlmoHybridConfig(vocab_size=97, block_size=128, n_layer=4, n_head=4, n_kv_head=2, n_embd=16, head_dim=4,
                          hidden=24, rms_eps=1e-6, rope_theta=10000.0,
                          layer_types=("linear_attention", "full_attention") * 2, linear_k_heads=2,
                          linear_v_heads=4, linear_k_dim=4, linear_v_dim=6, conv_kernel=4)
LINEARS = ("q_proj", "k_proj", "v_proj", "a_proj", "b_proj", "g_proj", "o_proj")


def hf_model(seed=0, **changes):
    """Hugging Face's model in float64, every weight drawn by model_kit.randomise (norm weights near 1)."""
    config = transformers.OlmoHybridConfig(**(HF_SIZES | changes), attn_implementation="sdpa")
    return randomise(transformers.OlmoHybridForCausalLM(config), seed).to(torch.float64).eval()


def hf_names(config):
    """{Hugging Face's name: (our path, how)}: how "T" transposes nn.Linear's (C_out, C_in), "conv"
    squeezes the convolution's (conv_dim, 1, K) to (conv_dim, K), "" copies. The block's two norms
    are ours attn_norm and mlp_norm on either kind of layer: after the sublayers on a full one, before
    them on a linear one."""
    names = {"model.embed_tokens.weight": (("wte",), ""), "model.norm.weight": (("norm", "w"), ""),
             "lm_head.weight": (("head", "w"), "T")}
    for i in range(config.n_layer):
        p, ours = f"model.layers.{i}.", ("blocks", str(i))
        for name in ("gate", "up", "down"):
            names[f"{p}mlp.{name}_proj.weight"] = (ours + ("mlp", name, "w"), "T")
        attn = ours + ("attn",)
        if config.is_full(i):
            names[p + "post_attention_layernorm.weight"] = (ours + ("attn_norm", "w"), "")
            names[p + "post_feedforward_layernorm.weight"] = (ours + ("mlp_norm", "w"), "")
            for name in ("q", "k", "v", "o"):
                names[f"{p}self_attn.{name}_proj.weight"] = (attn + (name, "w"), "T")
            for name in ("q_norm", "k_norm"):
                names[f"{p}self_attn.{name}.weight"] = (attn + (name, "w"), "")
        else:
            names[p + "input_layernorm.weight"] = (ours + ("attn_norm", "w"), "")
            names[p + "post_attention_layernorm.weight"] = (ours + ("mlp_norm", "w"), "")
            for name in LINEARS:
                names[f"{p}linear_attn.{name}.weight"] = (attn + (name, "w"), "T")
            names[p + "linear_attn.conv1d.weight"] = (attn + ("conv1d", "w"), "conv")
            names[p + "linear_attn.o_norm.weight"] = (attn + ("o_norm", "w"), "")
            for name in ("dt_bias", "A_log"):
                names[f"{p}linear_attn.{name}"] = (attn + (name,), "")
    return names


def ours_from_hf(tensors, config=CONFIG):
    """Our tree from Hugging Face's {name: array} (its parameters, or their gradients)."""
    return tree_from_names(tensors, hf_names(config))


def exact(model, monkeypatch):
    """Make the float64 model compute in float64 throughout. transformers keeps these steps in
    float32 whatever the weights' dtype: both delta rules (torch_chunk_gated_delta_rule,
    torch_recurrent_gated_delta_rule) cast q, k, v, beta, g to float32; Gated DeltaNet's forward
    forms g from A_log.float() and a.float(); OlmoHybridRMSNorm and OlmoHybridRMSNormGated
    normalise in float32; the rotary embedding forms its frequencies and angles in float32 ("to
    match OLMo-core"). The first four are run again from their source with those casts made float64
    (model_kit.float64_twin; the delta rules first, so that Gated DeltaNet's twin calls theirs); the rotary
    embedding's angles are formed in float64 from rope_frequencies. Attention runs through sdpa,
    whose softmax keeps float64 (the eager one's is float32)."""
    for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"):
        monkeypatch.setattr(hf_modeling, name, float64_twin(getattr(hf_modeling, name), hf_modeling))
    for cls in (hf_modeling.OlmoHybridGatedDeltaNet, hf_modeling.OlmoHybridRMSNorm,
                hf_modeling.OlmoHybridRMSNormGated):
        monkeypatch.setattr(cls, "forward", float64_twin(inspect.unwrap(cls.forward), hf_modeling))
    inv_freq = torch.from_numpy(rope_frequencies(CONFIG.hs, CONFIG.rope_theta))   # (hs/2,) float64

    def rotary(self, x, position_ids):
        angles = position_ids[..., None].to(torch.float64) * inv_freq         # (B, T, hs/2)
        angles = torch.cat((angles, angles), dim=-1)                          # (B, T, hs)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    monkeypatch.setattr(model.model.rotary_emb, "forward", types.MethodType(rotary, model.model.rotary_emb))
    return model


def hf_run(model, ids, dout, attention_mask=None):
    """Logits and the gradients of sum(logits * dout), in our tree."""
    model.zero_grad()
    mask = None if attention_mask is None else to_torch(attention_mask.astype(np.int64))
    logits = model(input_ids=to_torch(ids), attention_mask=mask).logits
    (logits * to_torch(dout)).sum().backward()
    return to_numpy(logits), ours_from_hf({k: to_numpy(p.grad) for k, p in model.named_parameters()})


def tol64(ref):
    """float64 against transformers run in float64: the same operations, summed in other orders
    (BLAS blocks, the chunked delta rule's triangular solve, q, k and v's three projections here one).
    Each step adds a few ulps (1.1e-16) relative to the largest value it combines; over four blocks
    of some hundred such steps, with the norms and the delta rule's solve amplifying by O(10), errors
    stay near 1e-13 of the largest value of the kind compared. rtol and atol 1e-10 x that largest
    value leave 1000x room and still catch any wrong term (which errs by O(1e-2) or more)."""
    scale = float(np.abs(ref).max(initial=0))
    return dict(rtol=1e-10, atol=1e-10 * scale)


# -- against Hugging Face --------------------------------------------------------------------------

@pytest.mark.parametrize("seed, B, T, padded, neg", [(0, 2, 7, False, True), (1, 1, 20, False, False),
                                                     (2, 2, 9, True, True), (3, 1, 70, False, True)])
def test_matches_transformers_in_float64(seed, B, T, padded, neg):
    """Logits and every parameter's gradient of sum(logits * dout) equal transformers' float64
    model (made float64 throughout by ``exact``), with beta doubled (linear_allow_neg_eigval) or
    not; with left padding through attention_mask, on the positions that are not padding
    (transformers' padded rows read no key and are not compared). T = 70 runs two chunks of the
    chunked delta rule."""
    rng = np.random.default_rng(seed)
    model = hf_model(seed, linear_allow_neg_eigval=neg)
    config = OlmoHybridConfig(**{**CONFIG.__dict__, "allow_neg_eigval": neg})
    params = ours_from_hf({k: to_numpy(p) for k, p in model.named_parameters()})
    def run_hf(ids, dout, attention_mask):
        with pytest.MonkeyPatch.context() as monkeypatch:
            return hf_run(exact(model, monkeypatch), ids, dout, attention_mask)
    assert_hybrid_equals_transformers("olmo_hybrid", olmo_hybrid_forward, olmo_hybrid_backward, run_hf, config,
                                      params, rng, B, T, padded, HF_SIZES["pad_token_id"], tol64)


def test_default_sizes_are_transformers():
    """Sizes left None take transformers' defaults from the others, and so does the layer pattern;
    the convolution's taps and the negative eigenvalues default as transformers' do."""
    for n_layer in (2, 3, 5, 8):   # transformers refuses a model without both kinds of layer
        ref = transformers.OlmoHybridConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=n_layer)
        ours = OlmoHybridConfig(n_embd=32, n_head=4, n_layer=n_layer)
        assert (ours.linear_k_heads, ours.linear_v_heads, ours.linear_k_dim, ours.linear_v_dim) == (
            ref.linear_num_key_heads, ref.linear_num_value_heads, ref.linear_key_head_dim, ref.linear_value_head_dim)
        assert list(ours.layer_types) == ref.layer_types
        assert (ours.conv_kernel, ours.allow_neg_eigval) == (ref.linear_conv_kernel_dim, ref.linear_allow_neg_eigval)


# -- the twin, finite differences --------------------------------------------------------------------

@st.composite
def small_models(draw):
    """(config, params, ids, dout): a drawn tiny OLMo Hybrid (1 to 3 layers of either type, grouped
    heads), its params from init_olmo_hybrid_params moved off their initial values."""
    n_layer = draw(st.integers(1, 3))
    nkv, g, nk, r = (draw(st.integers(1, 2)) for _ in range(4))
    config = OlmoHybridConfig(
        vocab_size=draw(st.integers(2, 9)), block_size=80, n_layer=n_layer, n_head=nkv * g, n_kv_head=nkv,
        n_embd=draw(st.sampled_from([4, 8])), head_dim=draw(st.sampled_from([2, 4])), hidden=draw(st.integers(1, 6)),
        layer_types=tuple(draw(st.lists(st.sampled_from(["linear_attention", "full_attention"]),
                                        min_size=n_layer, max_size=n_layer))),
        linear_k_heads=nk, linear_v_heads=nk * r, linear_k_dim=draw(st.integers(1, 4)),
        linear_v_dim=draw(st.integers(1, 4)), conv_kernel=draw(st.integers(2, 4)),
        allow_neg_eigval=draw(st.booleans()), attn_bias=draw(st.booleans()), tie_weights=draw(st.booleans()))
    return drawn_hybrid_case(draw, config, init_olmo_hybrid_params)


@pytest.mark.twin_parity
@settings(max_examples=15, deadline=None)
@given(case=small_models(), padded=st.booleans())
def test_matches_twin_and_autograd(case, padded):
    """float64, with and without left padding: model_kit.assert_hybrid_matches_twin."""
    config, params, ids, dout = case
    assert_hybrid_matches_twin("olmo_hybrid", olmo_hybrid_forward, olmo_hybrid_backward, tw.olmo_hybrid, config,
                               params, ids, dout, padded)


H = 2e-4


@pytest.mark.parametrize("path", ["blocks.0.attn.q.w", "blocks.0.attn.k_norm.w", "blocks.0.attn_norm.w",
                                  "blocks.1.attn.A_log", "blocks.1.attn.b_proj.w", "blocks.1.attn.k_proj.w",
                                  "blocks.1.attn.v_proj.w", "blocks.1.attn.o_norm.w", "blocks.1.mlp_norm.w",
                                  "norm.w", "wte"])
def test_gradients_match_finite_differences(path):
    """float64 five-point differences (helpers.numerical_grad) of a few leaves, one of each kind:
    the post-norm block's QK-norm and norms, Gated DeltaNet's decay, doubled beta and split
    projections, the pre-norm block's norms. Step H as test_qwen3_5's (params moved off init by
    U(-0.5, 0.5): the stencil's h^4 error near 3e-9, rounding near 1e-11, below FD_TOL). The
    embedding takes 1e-5: its rows (near 0.1) reach the first, post-norm, block unnormed and its
    QK-norm divides by their size, so the fourth derivative is large (wte[9, 7]'s error, 0.085 at
    2e-4, falls 256x per 4x smaller step, the stencil's h^4, to 6e-7 at 1e-5, next to a gradient
    of 470; rounding 1e-16 |sum| / h stays near 1e-10)."""
    h = 1e-5 if path == "wte" else H
    config = OlmoHybridConfig(vocab_size=11, block_size=16, n_layer=3, n_head=2, n_kv_head=1, n_embd=8, head_dim=4,
                              hidden=6, layer_types=("full_attention", "linear_attention", "full_attention"),
                              linear_k_heads=1, linear_v_heads=2, linear_k_dim=4, linear_v_dim=3, conv_kernel=3)
    rng = np.random.default_rng(0)
    params = moved_off_init(init_olmo_hybrid_params(config, rng, np.float64), rng)
    ids = rng.integers(0, 11, (2, 6))
    dout = rng.normal(size=(2, 6, 11))
    grads = olmo_hybrid_backward(dout, olmo_hybrid_forward(ids, params, config)[1])
    assert_leaf_matches_finite_differences("olmo_hybrid", olmo_hybrid_forward, grads, config, params, ids, dout,
                                           path, h)


# -- refusals ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("changes, error, message", [
    ({"layer_types": ("linear_attention",)}, ValueError, r"layer_types must list n_layer = 2 entries, got \("),
    ({"layer_types": ("linear_attention", "sliding_attention")}, ValueError,
     "layer_types: each entry must be 'linear_attention' or 'full_attention', got 'sliding_attention'"),
    ({"layer_types": "full_attention"}, ValueError, "layer_types must list n_layer = 2 entries, got 'full"),
    ({"linear_v_heads": 3}, ValueError, "linear_v_heads = 3 must be a multiple of linear_k_heads = 2"),
    ({"linear_k_heads": 0}, ValueError, "linear_k_heads must be a positive integer, got 0"),
    ({"linear_v_dim": 2.0}, TypeError, "linear_v_dim must be None or an int"),
    ({"linear_k_heads": 40, "linear_v_heads": 40}, ValueError,
     r"linear_k_dim: the default int\(0.75 \* n_embd / linear_k_heads\) is 0 \(n_embd = 32, linear_k_heads = 40\)"),
    ({"conv_kernel": 0}, ValueError, "conv_kernel must be a positive integer, got 0"),
    ({"allow_neg_eigval": "yes"}, TypeError, "allow_neg_eigval must be a bool, got str 'yes'"),
])
def test_bad_config_is_refused_naming_the_value(changes, error, message):
    """Each new field's checks, naming OlmoHybridConfig.<field> and the value given."""
    fields = dict(n_layer=2, linear_k_heads=2, linear_v_heads=4) | changes
    with pytest.raises(error, match="OlmoHybridConfig." + message):
        OlmoHybridConfig(**fields)


def test_wrong_cache_is_refused():
    """A Llama key/value cache has no place for Gated DeltaNet's state: refused, naming its type."""
    config = OlmoHybridConfig(n_layer=2)
    params = init_olmo_hybrid_params(config, np.random.default_rng(0), np.float64)
    assert_llama_cache_refused(olmo_hybrid_forward, config, params)


def test_backward_refuses_a_cached_forward():
    """The cache is for inference only: a backward of a forward that read a cached state is refused."""
    config = OlmoHybridConfig(n_layer=2, layer_types=("linear_attention", "full_attention"))
    params = init_olmo_hybrid_params(config, np.random.default_rng(0), np.float64)
    assert_backward_refuses_cached_forward(olmo_hybrid_forward, olmo_hybrid_backward, qwen3_5_kv_cache, config,
                                           params)


# -- decoding ------------------------------------------------------------------------------------------

@settings(max_examples=10, deadline=None)
@given(case=small_models(), P=st.integers(1, 9), padded=st.booleans())
def test_decoding_equals_the_full_forward(case, P, padded):
    """Prefill P tokens, then one token at a time through qwen3_5_kv_cache: every step's logits equal
    the full forward's at that position (float64, to rounding: the chunked and the one-step delta
    rule are the same recurrence summed in another order), with left padding too. The cache's
    linear layers hold a state of a fixed size, whatever the length."""
    config, params, ids = case[:3]
    assert_hybrid_decodes_as_full_forward("olmo_hybrid", olmo_hybrid_forward, qwen3_5_kv_cache, config, params,
                                          *ids.shape, P, padded)


@pytest.mark.parametrize("padded", [False, True])
def test_decoding_matches_transformers_generate(padded):
    """Greedy ids of our cached decoding equal transformers' generate on the float64 model made
    exact (its own DynamicCache with Gated DeltaNet's states), for two prompts, the second one
    left-padded by 2 when ``padded`` (attention_mask 0 there, read as padding by both)."""
    model = hf_model(5)
    params = ours_from_hf({k: to_numpy(p) for k, p in model.named_parameters()})
    prompts = np.array([[3, 14, 15, 92, 65, 35], [0, 0, 89, 79, 32, 38] if padded else [2, 71, 82, 81, 82, 8]])
    pad = np.zeros(prompts.shape, bool)
    if padded:
        pad[1, :2] = True
    assert_hybrid_generates_as_transformers("olmo_hybrid", olmo_hybrid_forward, qwen3_5_kv_cache, model, exact, CONFIG,
                                            params, prompts, pad)


def test_twin_decodes_as_ours():
    """The twin's cache (torch_attn/qwen3_5.py's) decodes a prefill then one token at a time to our
    logits (float64: the same steps, helpers' tolerance)."""
    import torch_attn.qwen3_5 as tw_qwen3_5
    model = hf_model(4)
    params = ours_from_hf({k: to_numpy(p) for k, p in model.named_parameters()})
    assert_twin_decodes_as_ours("olmo_hybrid", olmo_hybrid_forward, tw.olmo_hybrid, qwen3_5_kv_cache,
                                tw_qwen3_5.qwen3_5_kv_cache, CONFIG, params)


# -- checkpoints saved by transformers ------------------------------------------------------------------

def test_checkpoint_reads_as_the_model(tmp_path):
    """attn_cli.hf reads a saved OlmoHybridForCausalLM folder into CONFIG and the very params the
    tests above copy from the model (float64: no rounding)."""
    model = hf_model(7)
    model.save_pretrained(tmp_path, safe_serialization=True)
    expected = ours_from_hf({k: to_numpy(p) for k, p in model.named_parameters()})
    assert_checkpoint_reads_as(tmp_path, "olmo_hybrid", CONFIG, expected)


@pytest.mark.parametrize("cache", [[], ["--no-cache"]])
def test_generate_hf_ids_equal_transformers_generate(tmp_path, capsys, cache):
    """``numpy-attn generate --hf DIR --ids`` on a saved float32 model, with the cache (keys and
    values, Gated DeltaNet's state) and without: transformers' greedy ids (use_cache=True)."""
    from parity_tests.model_kit import assert_generate_hf_is_transformers
    assert_generate_hf_is_transformers(hf_model(8).to(torch.float32), tmp_path, capsys, cache, f"olmo_hybrid {cache}")


@pytest.mark.parametrize("changes, message", [
    ({"layer_types": ["linear_attention", "sliding_attention", "linear_attention", "full_attention"]},
     "layer_types must list only 'linear_attention' and 'full_attention', got 'sliding_attention'"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ({"linear_allow_neg_eigval": "yes"}, "linear_allow_neg_eigval"),
])
def test_bad_config_json_is_refused(tmp_path, capsys, changes, message):
    """A config.json this model cannot run is refused by load_checkpoint and generate --hf, naming the key."""
    from parity_tests.model_kit import assert_changed_config_refused
    folder = tmp_path / "model"
    hf_model(9).to(torch.float32).save_pretrained(folder, safe_serialization=True)
    assert_changed_config_refused(folder, capsys, changes, message)


@pytest.mark.parametrize("widths", [(8, 8, 24), (8, 8, 23)])
def test_convolution_pieces_of_any_widths_are_read(tmp_path, widths):
    """The original checkpoints hold the convolution as q's, k's and v's pieces (8, 8, 24 rows
    here), transformers' own save as three near-equal ones (14, 14, 12): both join into the one
    weight; pieces whose widths do not sum to conv_dim (40) are refused, naming them."""
    import safetensors.numpy

    from attn_cli.hf import CheckpointError, load_checkpoint
    model = hf_model(6)
    model.save_pretrained(tmp_path, safe_serialization=True)
    path = tmp_path / "model.safetensors"
    tensors = safetensors.numpy.load_file(path)
    a = "model.layers.0.linear_attn."
    names = [f"{a}{x}_conv1d.weight" for x in "qkv"]
    assert [tensors[n].shape[0] for n in names] == [14, 14, 12]                # transformers' cut
    whole = np.concatenate([tensors[n] for n in names])[:sum(widths)]
    for name, piece in zip(names, np.split(whole, np.cumsum(widths)[:-1]), strict=True):
        tensors[name] = piece
    safetensors.numpy.save_file(tensors, path, metadata={"format": "pt"})
    if sum(widths) != CONFIG.conv_dim:
        with pytest.raises(CheckpointError, match=r"conv1d.weight: widths \[8, 8, 23\] must sum to .* = 40"):
            load_checkpoint(tmp_path, np.float64)
        return
    _, _, params = load_checkpoint(tmp_path, np.float64)
    expected = to_numpy(model.model.layers[0].linear_attn.conv1d.weight)[:, 0]
    assert np.array_equal(params["blocks"]["0"]["attn"]["conv1d"]["w"], expected)


# -- float16 and bfloat16: FlashAttention's error rule against transformers -----------------------------

# float16 breaks the rule at these seeds (bfloat16 holds at all three), measured when the test was written:
FLOAT16_BROKEN = {
    ("float16", 1): "dwte: ours 24.8 off, 7.0x transformers' 3.52 (the rule: 6x)",
}


@pytest.mark.error_budget
@pytest.mark.parametrize("dtype, seed", hybrid_budget_cases(FLOAT16_BROKEN))
def test_low_precision_meets_the_error_budget(dtype, seed):
    """Ours and the twin in float16 and bfloat16 (Gated DeltaNet computing in float32 and rounding
    once) against OlmoHybridForCausalLM in float64 on the same rounded weights, within twice the error
    of OlmoHybridForCausalLM run in the low dtype: model_kit.assert_hybrid_meets_error_budget."""
    assert_hybrid_meets_error_budget("olmo_hybrid", dtype, hf_model(seed), ours_from_hf, exact,
                                     olmo_hybrid_forward, olmo_hybrid_backward, tw.olmo_hybrid, CONFIG, seed)
