"""Parity tests for numpy_attn/qwen3_5.py and torch_attn/qwen3_5.py: the model against Hugging
Face's Qwen3_5ForCausalLM in float64 (logits and every parameter's gradient), the twin, finite
differences, refusals of bad configs, and decoding with the hybrid cache against the full forward."""

import inspect
import types

import numpy as np
import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf_modeling

import numpy_attn.qwen3_5
import torch_attn.qwen3_5 as tw
from numpy_attn.qwen3_5 import (
    Qwen3_5Config,
    init_qwen3_5_params,
    qwen3_5_backward,
    qwen3_5_forward,
    qwen3_5_kv_cache,
)
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
    assert_options_are_keyword_only,
    assert_twin_decodes_as_ours,
    drawn_hybrid_case,
    float64_twin,
    hybrid_budget_cases,
    randomise,
    tol64,
    tree_from_names,
)

# A tiny Qwen3.5: three Gated DeltaNet layers then one attention layer, as the released models
# repeat them; 4 query heads on 2 key/value heads of 8 channels, half of them rotating; 2 key heads
# of Gated DeltaNet serving 4 value heads. Pad, bos and eos ids inside the vocabulary.
HF_SIZES = dict(vocab_size=97, hidden_size=16, intermediate_size=24, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=4, linear_value_head_dim=6,
                linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
                layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
                tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
CONFIG = Qwen3_5Config(vocab_size=97, block_size=128, n_layer=4, n_head=4, n_kv_head=2, n_embd=16, head_dim=8,
                       hidden=24, rms_eps=1e-6, rope_theta=10000.0, partial_rotary_factor=0.5,
                       layer_types=("linear_attention",) * 3 + ("full_attention",), linear_k_heads=2,
                       linear_v_heads=4, linear_k_dim=4, linear_v_dim=6, conv_kernel=4)
LINEARS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")


def hf_model(seed=0):
    """Hugging Face's model in float64, every weight drawn by model_kit.randomise (norm weights
    near 1: the norms then scale by about 2, as 1 + w)."""
    config = transformers.Qwen3_5TextConfig(**HF_SIZES, attn_implementation="sdpa")
    return randomise(transformers.Qwen3_5ForCausalLM(config), seed).to(torch.float64).eval()


def hf_names(config):
    """{Hugging Face's name: (our path, how)}: how "T" transposes nn.Linear's (C_out, C_in), "conv"
    squeezes the convolution's (conv_dim, 1, K) to (conv_dim, K), "" copies."""
    names = {"model.embed_tokens.weight": (("wte",), ""), "model.norm.weight": (("norm", "w"), ""),
             "lm_head.weight": (("head", "w"), "T")}
    for i in range(config.n_layer):
        p, ours = f"model.layers.{i}.", ("blocks", str(i))
        names[p + "input_layernorm.weight"] = (ours + ("attn_norm", "w"), "")
        names[p + "post_attention_layernorm.weight"] = (ours + ("mlp_norm", "w"), "")
        for name in ("gate", "up", "down"):
            names[f"{p}mlp.{name}_proj.weight"] = (ours + ("mlp", name, "w"), "T")
        attn = ours + ("attn",)
        if config.is_full(i):
            for name in ("q", "k", "v", "o"):
                names[f"{p}self_attn.{name}_proj.weight"] = (attn + (name, "w"), "T")
            for name in ("q_norm", "k_norm"):
                names[f"{p}self_attn.{name}.weight"] = (attn + (name, "w"), "")
        else:
            for name in LINEARS:
                names[f"{p}linear_attn.{name}.weight"] = (attn + (name, "w"), "T")
            names[p + "linear_attn.conv1d.weight"] = (attn + ("conv1d", "w"), "conv")
            names[p + "linear_attn.norm.weight"] = (attn + ("norm", "w"), "")
            for name in ("dt_bias", "A_log"):
                names[f"{p}linear_attn.{name}"] = (attn + (name,), "")
    return names


def ours_from_hf(tensors, config):
    """Our tree from Hugging Face's {name: array} (its parameters, or their gradients)."""
    return tree_from_names(tensors, hf_names(config))


def exact(model, monkeypatch):
    """Make the float64 model compute in float64 throughout. transformers keeps these steps in
    float32 whatever the weights' dtype: both delta rules (torch_chunk_gated_delta_rule,
    torch_recurrent_gated_delta_rule) cast q, k, v, beta, g to float32; Gated DeltaNet's forward
    forms g from A_log.float() and a.float(); Qwen3_5RMSNorm and Qwen3_5RMSNormGated normalise in
    float32; the rotary embedding forms its frequencies and angles in float32. The first four are
    run again from their source with those casts made float64 (model_kit.float64_twin); the rotary
    embedding's angles are formed in float64 from rope_frequencies of the rotary_dim channels (its
    three mrope sections see the same text positions, so they are the one rotation)."""
    for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"):
        monkeypatch.setattr(hf_modeling, name, float64_twin(getattr(hf_modeling, name), hf_modeling))
    for cls in (hf_modeling.Qwen3_5GatedDeltaNet, hf_modeling.Qwen3_5RMSNorm, hf_modeling.Qwen3_5RMSNormGated):
        monkeypatch.setattr(cls, "forward", float64_twin(inspect.unwrap(cls.forward), hf_modeling))
    inv_freq = torch.from_numpy(rope_frequencies(CONFIG.rotary_dim, CONFIG.rope_theta))   # (r/2,) float64

    def rotary(self, x, position_ids):
        angles = position_ids[0][..., None].to(torch.float64) * inv_freq     # (B, T, r/2)
        angles = torch.cat((angles, angles), dim=-1)                          # (B, T, r)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    monkeypatch.setattr(model.model.rotary_emb, "forward", types.MethodType(rotary, model.model.rotary_emb))
    return model


def hf_run(model, ids, dout, attention_mask=None):
    """Logits and the gradients of sum(logits * dout), in our tree."""
    model.zero_grad()
    mask = None if attention_mask is None else to_torch(attention_mask.astype(np.int64))
    logits = model(input_ids=to_torch(ids), attention_mask=mask).logits
    (logits * to_torch(dout)).sum().backward()
    return to_numpy(logits), ours_from_hf({k: to_numpy(p.grad) for k, p in model.named_parameters()}, CONFIG)


# -- against Hugging Face --------------------------------------------------------------------------

@pytest.mark.parametrize("seed, B, T, padded", [(0, 2, 7, False), (1, 1, 20, False), (2, 2, 9, True),
                                                (3, 1, 70, False)])
def test_matches_transformers_in_float64(seed, B, T, padded):
    """Logits and every parameter's gradient of sum(logits * dout) equal transformers' float64
    model (made float64 throughout by ``exact``); with left padding through attention_mask, on the
    positions that are not padding (transformers' padded rows read no key and are not compared).
    T = 70 runs two chunks of the chunked delta rule."""
    rng = np.random.default_rng(seed)
    model = hf_model(seed)
    params = ours_from_hf({k: to_numpy(p) for k, p in model.named_parameters()}, CONFIG)
    def run_hf(ids, dout, attention_mask):
        with pytest.MonkeyPatch.context() as monkeypatch:
            return hf_run(exact(model, monkeypatch), ids, dout, attention_mask)
    assert_hybrid_equals_transformers("qwen3_5", qwen3_5_forward, qwen3_5_backward, run_hf, CONFIG, params, rng,
                                      B, T, padded, HF_SIZES["pad_token_id"], tol64)


# -- the twin, finite differences --------------------------------------------------------------------

@st.composite
def small_models(draw):
    """(config, params, ids, dout): a drawn tiny Qwen3.5 (1 to 3 layers of either type, grouped
    heads, any rotary share), its params from init_qwen3_5_params moved off their initial values."""
    n_layer = draw(st.integers(1, 3))
    nkv, g, nk, r = (draw(st.integers(1, 2)) for _ in range(4))
    hs = draw(st.sampled_from([4, 8]))
    config = Qwen3_5Config(
        vocab_size=draw(st.integers(2, 9)), block_size=80, n_layer=n_layer, n_head=nkv * g, n_kv_head=nkv,
        n_embd=draw(st.sampled_from([4, 8])), head_dim=hs, hidden=draw(st.integers(1, 6)),
        partial_rotary_factor=draw(st.sampled_from([0.25, 0.5, 1.0])) if hs == 8 else draw(st.sampled_from([0.5, 1.0])),
        layer_types=tuple(draw(st.lists(st.sampled_from(["linear_attention", "full_attention"]),
                                        min_size=n_layer, max_size=n_layer))),
        linear_k_heads=nk, linear_v_heads=nk * r, linear_k_dim=draw(st.integers(1, 4)),
        linear_v_dim=draw(st.integers(1, 4)), conv_kernel=draw(st.integers(2, 4)),
        attn_bias=draw(st.booleans()), tie_weights=draw(st.booleans()))
    return drawn_hybrid_case(draw, config, init_qwen3_5_params)


@pytest.mark.twin_parity
@settings(max_examples=15, deadline=None)
@given(case=small_models(), padded=st.booleans())
def test_matches_twin_and_autograd(case, padded):
    """float64, with and without left padding: model_kit.assert_hybrid_matches_twin."""
    config, params, ids, dout = case
    assert_hybrid_matches_twin("qwen3_5", qwen3_5_forward, qwen3_5_backward, tw.qwen3_5, config, params, ids, dout,
                               padded)


H = 2e-4


@pytest.mark.parametrize("path", ["blocks.0.attn.q.w", "blocks.0.attn.k_norm.w", "blocks.1.attn.A_log",
                                  "blocks.1.attn.dt_bias", "blocks.1.attn.conv1d.w", "blocks.1.attn.in_proj_qkv.w",
                                  "blocks.1.attn_norm.w", "norm.w", "wte"])
def test_gradients_match_finite_differences(path):
    """float64 five-point differences (helpers.numerical_grad) of a few leaves, one of each kind:
    q's query and gate halves, Gated DeltaNet's decay and convolution, the QK-norm. Step H: the
    params moved off init by U(-0.5, 0.5) make attention sharp enough that the stencil's h^4 error
    reaches 3e-7 at h = 1e-3 on one query weight; at H = 2e-4 the error is 3e-9 (the rounding
    error 1e-16 |sum| / H near 1e-11), below FD_TOL's atol 1e-8 and rtol 1e-6."""
    config = Qwen3_5Config(vocab_size=11, block_size=16, n_layer=3, n_head=2, n_kv_head=1, n_embd=8, head_dim=8,
                           hidden=6, partial_rotary_factor=0.5,
                           layer_types=("full_attention", "linear_attention", "full_attention"),
                           linear_k_heads=1, linear_v_heads=2, linear_k_dim=4, linear_v_dim=3, conv_kernel=3)
    rng = np.random.default_rng(0)
    params = moved_off_init(init_qwen3_5_params(config, rng, np.float64), rng)
    ids = rng.integers(0, 11, (2, 6))
    dout = rng.normal(size=(2, 6, 11))
    grads = qwen3_5_backward(dout, qwen3_5_forward(ids, params, config)[1])
    assert_leaf_matches_finite_differences("qwen3_5", qwen3_5_forward, grads, config, params, ids, dout, path, H)


# -- refusals ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("changes, error, message", [
    ({"layer_types": ("linear_attention",)}, ValueError, r"layer_types must list n_layer = 2 entries, got \("),
    ({"layer_types": ("linear_attention", "sliding_attention")}, ValueError,
     "layer_types: each entry must be 'linear_attention' or 'full_attention', got 'sliding_attention'"),
    ({"layer_types": "full_attention"}, ValueError, "layer_types must list n_layer = 2 entries, got 'full"),
    ({"partial_rotary_factor": 0.0}, ValueError, r"partial_rotary_factor must be in \(0, 1\], got 0.0"),
    ({"partial_rotary_factor": 1.5}, ValueError, r"partial_rotary_factor must be in \(0, 1\], got 1.5"),
    ({"partial_rotary_factor": 0.1}, ValueError, "partial_rotary_factor = 0.1 rotates int.hs . factor. = 0 channels"),
    ({"partial_rotary_factor": 0.375}, ValueError, "partial_rotary_factor = 0.375 rotates int.hs . factor. = 3"),
    ({"partial_rotary_factor": "half"}, TypeError, "partial_rotary_factor must be a real number, got str 'half'"),
    ({"linear_v_heads": 3}, ValueError, "linear_v_heads = 3 must be a multiple of linear_k_heads = 2"),
    ({"linear_k_heads": 0}, ValueError, "linear_k_heads must be a positive integer, got 0"),
    ({"linear_v_dim": 2.0}, TypeError, "linear_v_dim must be an int"),
    ({"conv_kernel": 0}, ValueError, "conv_kernel must be a positive integer, got 0"),
])
def test_bad_config_is_refused_naming_the_value(changes, error, message):
    """Each new field's checks, naming Qwen3_5Config.<field> and the value given."""
    fields = dict(n_layer=2, head_dim=8, linear_k_heads=2, linear_v_heads=4) | changes
    with pytest.raises(error, match="Qwen3_5Config." + message):
        Qwen3_5Config(**fields)


@pytest.mark.parametrize("n_layer", [1, 4, 5, 9])
def test_default_layer_types_are_transformers(n_layer):
    """Without layer_types every 4th layer (3, 7, ...) is full attention and the rest Gated
    DeltaNet, as transformers.Qwen3_5TextConfig lays them out."""
    ours = Qwen3_5Config(n_layer=n_layer, head_dim=8)
    assert list(ours.layer_types) == transformers.Qwen3_5TextConfig(num_hidden_layers=n_layer).layer_types


def test_options_are_keyword_only():
    """The model's and the gated attention's options (attn_mask, kv_cache, ...) are keyword-only in
    both twins."""
    for module in (numpy_attn.qwen3_5, tw):
        assert_options_are_keyword_only(module, "qwen3_5", gated_attention=4)


def test_wrong_cache_is_refused():
    """A Llama key/value cache has no place for Gated DeltaNet's state: refused, naming its type."""
    config = Qwen3_5Config(n_layer=2, head_dim=8)
    params = init_qwen3_5_params(config, np.random.default_rng(0), np.float64)
    assert_llama_cache_refused(qwen3_5_forward, config, params)


@pytest.mark.parametrize("last", ["full_attention", "linear_attention"])
def test_backward_refuses_a_cached_forward(last):
    """The cache is for inference only: a backward of a forward that read a cached state is refused,
    by the last layer's kind first (the backward runs from the last layer)."""
    config = Qwen3_5Config(n_layer=2, head_dim=8, layer_types=("linear_attention", last))
    params = init_qwen3_5_params(config, np.random.default_rng(0), np.float64)
    assert_backward_refuses_cached_forward(qwen3_5_forward, qwen3_5_backward, qwen3_5_kv_cache, config, params)


# -- decoding ------------------------------------------------------------------------------------------

@settings(max_examples=10, deadline=None)
@given(case=small_models(), P=st.integers(1, 9), padded=st.booleans())
def test_decoding_equals_the_full_forward(case, P, padded):
    """Prefill P tokens, then one token at a time through qwen3_5_kv_cache, with left padding too:
    model_kit.assert_hybrid_decodes_as_full_forward."""
    config, params, ids, _ = case
    assert_hybrid_decodes_as_full_forward("qwen3_5", qwen3_5_forward, qwen3_5_kv_cache, config, params, *ids.shape, P,
                                          padded)


def test_cache_bytes():
    """The bytes the cache reports against its arrays, B = 2 sequences after 3 tokens: the full
    layer's keys and values grow by 2 x nkv x (hs + hs) numbers a token and sequence, the linear
    layers' states stay their size; the allocation is the slots of max_len tokens and the states."""
    kv = qwen3_5_kv_cache(CONFIG, 2, np.float64, max_len=10)
    params = init_qwen3_5_params(CONFIG, np.random.default_rng(0), np.float64)
    qwen3_5_forward(np.zeros((2, 3), int), params, CONFIG, kv_cache=kv, for_backward=False)
    states = sum(a.nbytes for s in kv.states if s is not None for a in (s["conv"], s["recurrent"]))
    assert kv.bytes_per_token == CONFIG.n_kv_head * 2 * CONFIG.head_dim * 8
    assert kv.state_nbytes == states > 0
    assert kv.bytes_held == 3 * 2 * kv.bytes_per_token + states
    assert kv.nbytes == 10 * 2 * kv.bytes_per_token + states == kv.buffer_k.nbytes + kv.buffer_v.nbytes + states


def test_decoding_matches_transformers_generate():
    """Greedy ids of our cached decoding equal transformers' generate on the float64 model made
    exact (its own DynamicCache with Gated DeltaNet's states)."""
    model = hf_model(5)
    params = ours_from_hf({k: to_numpy(p) for k, p in model.named_parameters()}, CONFIG)
    prompts = [[3, 14, 15, 92, 65, 35]]
    assert_hybrid_generates_as_transformers("qwen3_5", qwen3_5_forward, qwen3_5_kv_cache, model, exact, CONFIG, params,
                                            prompts, np.zeros((1, 6), bool))


# -- checkpoints saved by transformers ------------------------------------------------------------------

def test_checkpoint_reads_as_the_model(tmp_path):
    """attn_cli.hf reads a saved Qwen3_5ForCausalLM folder into CONFIG and the very params the
    tests above copy from the model (float64: no rounding)."""
    model = hf_model(7)
    model.save_pretrained(tmp_path, safe_serialization=True)
    expected = ours_from_hf({k: to_numpy(p) for k, p in model.named_parameters()}, CONFIG)
    assert_checkpoint_reads_as(tmp_path, "qwen3_5", CONFIG, expected)


@pytest.mark.parametrize("cache", [[], ["--no-cache"]])
def test_generate_hf_ids_equal_transformers_generate(tmp_path, capsys, cache):
    """``numpy-attn generate --hf DIR --ids`` on a saved float32 model, with the cache (keys and
    values, Gated DeltaNet's state) and without: transformers' greedy ids (use_cache=True)."""
    from attn_cli import cli
    from parity_tests.model_kit import hf_greedy
    model = hf_model(8).to(torch.float32)
    model.save_pretrained(tmp_path, safe_serialization=True)
    assert cli.main(["generate", "--hf", str(tmp_path), "--ids", "3,1,4,1,5", "--max-new-tokens", "6",
                     "--temperature", "0", *cache]) == 0
    ours = [int(i) for i in capsys.readouterr().out.strip().split(",")]
    assert ours == hf_greedy(model, [3, 1, 4, 1, 5], 6)


@pytest.mark.parametrize("changes, message", [
    ({"layer_types": ["linear_attention", "sliding_attention", "linear_attention", "full_attention"]},
     "layer_types must list only 'linear_attention' and 'full_attention', got 'sliding_attention'"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
])
def test_bad_config_json_is_refused(tmp_path, capsys, changes, message):
    """A config.json this model cannot run is refused by load_checkpoint and generate --hf, naming the key."""
    from parity_tests.model_kit import assert_changed_config_refused
    folder = tmp_path / "model"
    hf_model(9).to(torch.float32).save_pretrained(folder, safe_serialization=True)
    assert_changed_config_refused(folder, capsys, changes, message)


def test_generate_hf_in_bfloat16_runs(tmp_path, capsys):
    """Gated DeltaNet computes float16 and bfloat16 in float32: --dtype bfloat16 decodes, with the
    cache (its states held in bfloat16), as many ids as asked, each in the vocabulary."""
    from attn_cli import cli
    hf_model(1).to(torch.float32).save_pretrained(tmp_path, safe_serialization=True)
    assert cli.main(["generate", "--hf", str(tmp_path), "--ids", "1,2", "--dtype", "bfloat16", "--max-new-tokens",
                     "5", "--temperature", "0"]) == 0
    ids = [int(i) for i in capsys.readouterr().out.strip().split(",")]
    assert len(ids) == 7 and ids[:2] == [1, 2] and all(0 <= i < HF_SIZES["vocab_size"] for i in ids), ids


def test_twin_decodes_as_ours():
    """The twin's cache (torch_attn/qwen3_5.py's) decodes a prefill then one token at a time to our
    logits (float64: the same steps, helpers' tolerance)."""
    model = hf_model(4)
    params = ours_from_hf({k: to_numpy(p) for k, p in model.named_parameters()}, CONFIG)
    assert_twin_decodes_as_ours("qwen3_5", qwen3_5_forward, tw.qwen3_5, qwen3_5_kv_cache, tw.qwen3_5_kv_cache, CONFIG,
                                params)


# -- float16 and bfloat16: FlashAttention's error rule against transformers -----------------------------

# float16 breaks the rule at these seeds (bfloat16 holds at all three), measured when the test was written:
FLOAT16_BROKEN = {
    ("float16", 0): "dwte: ours 517 off, transformers' float16 run is nan there; blocks.0.mlp.gate.w 505 (its 25.6)",
    ("float16", 1): "dwte: ours 49.8 off, transformers' float16 run is nan there (no bound)",
}


@pytest.mark.error_budget
@pytest.mark.parametrize("dtype, seed", hybrid_budget_cases(FLOAT16_BROKEN))
def test_low_precision_meets_the_error_budget(dtype, seed):
    """Ours and the twin in float16 and bfloat16 (Gated DeltaNet computing in float32 and rounding
    once) against Qwen3_5ForCausalLM in float64 on the same rounded weights, within twice the error
    of Qwen3_5ForCausalLM run in the low dtype: model_kit.assert_hybrid_meets_error_budget."""
    assert_hybrid_meets_error_budget("qwen3_5", dtype, hf_model(seed), lambda t: ours_from_hf(t, CONFIG), exact,
                                     qwen3_5_forward, qwen3_5_backward, tw.qwen3_5, CONFIG, seed)
