"""Parity tests for numpy_attn/gpt_oss.py and torch_attn/gpt_oss.py, against Hugging Face's
GptOssForCausalLM.

A random GptOssForCausalLM saved by transformers is loaded by attn_cli.hf: logits and every
parameter's gradient (the sinks, the router, the experts, attention, norms, embedding and head)
against transformers' autograd in float64 and float32, with test_hf.py's tolerances (from its
error analysis); the NumPy backward against the twin's autograd; cached decoding past the
sliding window against the full forward; ``generate --hf`` against transformers' generate; bad
configs refused with the field named. The model is small: three layers (sliding, full, sliding),
window 3, 4 query heads on 2 key/value heads, 4 experts of which each token takes 2, YaRN with
factor 4 over an original context of 8, and a GLU limit of 1.5 instead of 7, so that the clamps
cut (at 7 these small models would never reach them). Transformers runs its eager attention
and its eager loop over the experts (the readable implementations).
"""

import dataclasses
import json
import tempfile
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from hypothesis import given
from hypothesis import strategies as st
from transformers.models.gpt_oss import modeling_gpt_oss

import numpy_attn.gpt_oss as gpt_oss
import torch_attn.gpt_oss as tw
import torch_attn.moe as tw_moe
from attn_cli import cli, hf
from attn_cli.hf import load_checkpoint
from numpy_attn._tree import leaves, tree_map
from numpy_attn.gpt_oss import GptOssConfig, gpt_oss_backward, gpt_oss_forward, gpt_oss_kv_cache, init_gpt_oss_params
from numpy_attn.rope import rope_attention_factor, rope_frequencies
from parity_tests import helpers
from parity_tests.helpers import assert_close, assert_normal_draws, autograd, to_numpy, to_torch
from parity_tests.model_kit import (
    JSON,
    assert_changed_config_refused,
    assert_config_stores_python_values,
    assert_loads_or_names_folder,
    assert_options_are_keyword_only,
    assert_refusals_name_the_family,
    compare,
    hf_greedy,
    hf_logits_and_grads,
    next_token_dlogits,
    random_ids,
    randomise,
    save,
)

WINDOW = 3
LIMIT = 1.5
YARN = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "truncate": False, "original_max_position_embeddings": 8}
TORCH_DTYPES = {np.float64: torch.float64, np.float32: torch.float32}
# Ours -> Hugging Face's names of a block's two norms.
NORMS = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}


def _rstds(cache):
    """The rstd of every RMS norm of the model (their caches are (xhat, rstd, scale))."""
    return [cache.norm[1]] + [getattr(c, name)[1] for c in cache.blocks for name in NORMS]


def _tol(cache, dtype):
    """RMS norms amplify rounding as layer norms do (see layer_norm_tol)."""
    return helpers.layer_norm_tol(_rstds(cache), dtype)


def hf_gpt_oss(dtype):
    """A random transformers GptOssForCausalLM (see the module docstring for its sizes), every
    parameter far from its initialisation (model_kit.randomise)."""
    config = transformers.GptOssConfig(
        vocab_size=19, hidden_size=16, intermediate_size=12, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW,
        swiglu_limit=LIMIT, max_position_embeddings=32, rope_parameters=dict(YARN), rms_norm_eps=1e-5,
        attn_implementation="eager", experts_implementation="eager", pad_token_id=None, bos_token_id=None,
        eos_token_id=None)
    return randomise(transformers.GptOssForCausalLM(config), 0).to(TORCH_DTYPES[dtype]).eval()


def exact_hf_gpt_oss(model):
    """Make a float64 GptOssForCausalLM compute in float64 throughout: its RMS norms cast to
    float32 and its rotary angles (and YaRN's frequencies) are computed in float32 whatever the
    model's dtype. Those two are swapped for the same formulas in the model's dtype (the
    frequencies rope_frequencies', which test_rope.py checks against transformers' YaRN), so every
    other part (projections and biases, sinks, masks, router, experts, residuals, head) is
    compared at float64 precision. Its attention's softmax already runs in the scores' dtype."""
    config = model.config
    rope = dict(config.rope_parameters)
    theta = rope.pop("rope_theta")
    inv_freq = torch.from_numpy(rope_frequencies(config.head_dim, theta, rope))
    attention_factor = rope_attention_factor(rope)

    def rms_norm(self, h):
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    def rotary(self, x, position_ids):   # one angle per channel pair: its rotation splits q and k in halves
        angles = position_ids[..., None].to(torch.float64) * inv_freq
        return (angles.cos() * attention_factor).to(x.dtype), (angles.sin() * attention_factor).to(x.dtype)

    for module in model.modules():
        if isinstance(module, modeling_gpt_oss.GptOssRMSNorm):
            module.forward = types.MethodType(rms_norm, module)
        if isinstance(module, modeling_gpt_oss.GptOssRotaryEmbedding):
            module.forward = types.MethodType(rotary, module)
    return model


def interleave(gate, up):
    """(E, ..., H) gate and up -> (E, ..., 2H) with gate in the even columns and up in the odd
    ones, as transformers' gate_up_proj holds them."""
    both = np.stack([gate, up], axis=-1)                                  # (E, ..., H, 2)
    return both.reshape(gate.shape[:-1] + (-1,))                          # (E, ..., 2H)


def to_hf_names(grads):
    """Our gradient tree under Hugging Face's parameter names, linear weights transposed, the
    experts' gate and up interleaved into gate_up_proj."""
    out = {"model.embed_tokens.weight": grads["wte"], "model.norm.weight": grads["norm"]["w"],
           "lm_head.weight": grads["head"]["w"].T}
    for i, block in grads["blocks"].items():
        p = f"model.layers.{i}."
        for norm, hf_norm in NORMS.items():
            out[f"{p}{hf_norm}.weight"] = block[norm]["w"]
        attn, mlp = block["attn"], block["mlp"]
        for name in "qkvo":
            out[f"{p}self_attn.{name}_proj.weight"] = attn[name]["w"].T
            out[f"{p}self_attn.{name}_proj.bias"] = attn[name]["b"]
        out[f"{p}self_attn.sinks"] = attn["sinks"]
        out[f"{p}mlp.router.weight"] = mlp["router"]["w"].T
        out[f"{p}mlp.router.bias"] = mlp["router"]["b"]
        experts = mlp["experts"]
        out[f"{p}mlp.experts.gate_up_proj"] = interleave(experts["gate"]["w"], experts["up"]["w"])
        out[f"{p}mlp.experts.gate_up_proj_bias"] = interleave(experts["gate"]["b"], experts["up"]["b"])
        out[f"{p}mlp.experts.down_proj"] = experts["down"]["w"]
        out[f"{p}mlp.experts.down_proj_bias"] = experts["down"]["b"]
    return out


def clamped_share(cache):
    """The share of the experts' gate values the limit cut, over every layer and expert."""
    gates = [c.glu.g for block in cache.blocks for c in block.mlp.experts.expert_caches if c.glu.g.size]
    return float(np.mean(np.concatenate([g.ravel() for g in gates]) > LIMIT))


# -- the NumPy model against its twin -----------------------------------------------------------------

@pytest.mark.twin_parity
@given(seed=st.integers(0, 2**32 - 1), n_layer=st.integers(1, 3), T=st.integers(1, 8),
       dtype=st.sampled_from([np.float64, np.float32]), k=st.integers(1, 3))
def test_forward_and_backward_match_twin(seed, n_layer, T, dtype, k):
    """Logits against the twin's, every gradient (labelled by path) against autograd's, on one to
    three layers (sliding, full, sliding), 1 to 3 of 3 experts per token, with YaRN and sinks."""
    config = GptOssConfig(vocab_size=11, block_size=8, n_layer=n_layer, n_head=4, n_kv_head=2, n_embd=8,
                          head_dim=4, hidden=6, n_experts=3, experts_per_token=k, sliding_window=2,
                          swiglu_limit=LIMIT, rope_scaling={**YARN, "original_max_position_embeddings": 4})
    rng = np.random.default_rng(seed)
    params = tree_map(lambda p: (p + rng.uniform(-0.5, 0.5, p.shape)).astype(dtype),
                      init_gpt_oss_params(config, rng, dtype))
    ids = rng.integers(0, config.vocab_size, (2, T))
    dout = rng.normal(size=(2, T, config.vocab_size)).astype(dtype)
    logits, cache = gpt_oss_forward(ids, params, config)
    dparams = gpt_oss_backward(dout, cache)
    twin_logits, grads = autograd(lambda params: tw.gpt_oss(to_torch(ids), params, config), {"params": params}, dout)
    assert_close("gpt_oss.logits", logits, twin_logits, **_tol(cache, dtype))
    helpers.assert_tree_close("gpt_oss", dparams, grads["params"], **_tol(cache, dtype))


# -- checkpoints saved by transformers ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_checkpoint_matches_transformers(tmp_path, dtype):
    """The folder save_pretrained writes, loaded by attn_cli.hf: logits, and every gradient of the
    next-token loss (our backward and the twin's autograd) against transformers' autograd, with
    test_hf.py's tolerances; T = 7 > the window 3, so the sliding layers mask what the full one
    sees; some gates lie above the limit, so the clamps act."""
    model = hf_gpt_oss(dtype)
    kind, config, params = load_checkpoint(save(model, tmp_path), dtype)
    assert kind == "gpt_oss" and type(config) is GptOssConfig, config
    assert config.layer_types == ("sliding_attention", "full_attention", "sliding_attention")
    assert config.rope_scaling["rope_type"] == "yarn" and config.swiglu_limit == LIMIT, config
    if dtype == np.float64:
        model = exact_hf_gpt_oss(model)
    ids = random_ids(config.vocab_size)
    logits, cache = gpt_oss_forward(ids, params, config)
    assert 0 < clamped_share(cache) < 0.5, f"the limit {LIMIT} cuts {clamped_share(cache):.0%} of the gates"
    dlogits = next_token_dlogits(logits, ids)
    hf_logits, theirs = hf_logits_and_grads(model, ids, None, dlogits)
    rstds = _rstds(cache)
    compare("gpt_oss checkpoint logits", logits, hf_logits, dtype, rstds)
    tparams = helpers.tree_to_torch(params, requires_grad=True)
    (tw.gpt_oss(to_torch(ids), tparams, config) * to_torch(dlogits)).sum().backward()
    scale = max(float(np.abs(g).max()) for g in theirs.values())
    for source, grads in (("twin", tree_map(lambda t: to_numpy(t.grad), tparams)),
                          ("backward", gpt_oss_backward(dlogits, cache))):
        grads = to_hf_names(grads)
        assert grads.keys() == theirs.keys(), (source, sorted(set(grads) ^ set(theirs)))
        for hf_name, g in theirs.items():
            compare(f"gpt_oss checkpoint d{hf_name} ({source})", grads[hf_name], g, dtype, rstds, scale)


def test_gate_up_proj_interleaves_gate_and_up(tmp_path):
    """The loader splits gate_up_proj by columns, even ones gate and odd ones up, as transformers'
    GptOssExperts does: one expert of the saved model, run by transformers' own GLU, equals ours."""
    model = hf_gpt_oss(np.float64)
    _, _, params = load_checkpoint(save(model, tmp_path), np.float64)
    experts = model.model.layers[1].mlp.experts
    x = torch.from_numpy(np.random.default_rng(3).normal(size=(5, 16)))
    with torch.no_grad():
        gate_up = x @ experts.gate_up_proj[2] + experts.gate_up_proj_bias[2]          # (5, 2H)
        theirs = experts._apply_gate(gate_up) @ experts.down_proj[2] + experts.down_proj_bias[2]
    ours = tw_moe.gpt_oss_expert(x, tree_map(lambda p: torch.from_numpy(p[2]), params["blocks"]["1"]["mlp"]["experts"]),
                                 limit=LIMIT)
    assert_close("gpt_oss expert 2 of layer 1 vs GptOssExperts", to_numpy(ours), to_numpy(theirs))


# -- cached decoding equals the full forward --------------------------------------------------------------

@pytest.mark.parametrize("sizes", [[5] + [1] * 11, [1] * 16, [2, 7, 3, 4]], ids=["prefill 5", "one by one", "chunks"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cached_decoding_past_the_window_equals_full_forward(tmp_path, dtype, sizes):
    """Decoding 16 tokens in steps of ``sizes`` (a prefill of 5, more than the window 3, then one
    at a time; one at a time from the first; chunks longer than the window): every position's
    logits equal the full forward's (only the order of some sums differs: reorder_tol), the twin
    decodes the same, and the sliding layers hold their window only while the full layer holds
    every token."""
    _, config, params = load_checkpoint(save(hf_gpt_oss(dtype), tmp_path), dtype)
    ids = random_ids(config.vocab_size, B=2, T=16, seed=1)
    full, full_cache = gpt_oss_forward(ids, params, config)
    kv_cache = gpt_oss_kv_cache(config, 2, dtype)
    held = []

    def step(chunk):
        logits = gpt_oss_forward(chunk, params, config, kv_cache=kv_cache)[0]
        held.append([kv_cache.layer(i).held for i in range(config.n_layer)])
        return logits

    cached = helpers.decode_in_steps(step, ids, sizes)
    assert_close("gpt_oss decode.logits vs full forward", cached, full,
                 **helpers.reorder_tol(_rstds(full_cache), dtype))
    assert held == [[min(n, WINDOW), n, min(n, WINDOW)] for n in np.cumsum(sizes)], held
    per_token = 2 * config.n_kv_head * config.hs * np.dtype(dtype).itemsize        # k and v of one layer
    assert kv_cache.bytes_per_token == per_token                                  # the full layer only
    tparams = tree_map(to_torch, params)
    twin_cache = tw.gpt_oss_kv_cache(config, 2, tparams["wte"].dtype)
    twin = helpers.decode_in_steps(
        lambda chunk: to_numpy(tw.gpt_oss(to_torch(chunk), tparams, config, kv_cache=twin_cache)), ids, sizes)
    # Absolute errors grow with the logits' size, as in model_kit.compare: atol scales with the largest |logit|.
    tol = _tol(full_cache, dtype)
    tol["atol"] *= max(1.0, float(np.abs(full).max()))
    assert_close("gpt_oss decode twin.logits", twin, cached, **tol)


@pytest.mark.parametrize("cache", [[], ["--no-cache"]])
def test_generate_hf_ids_equal_transformers_generate(tmp_path, capsys, cache):
    """``numpy-attn generate --hf DIR --ids``, with the key/value cache (the default) and without:
    the greedy ids of transformers' generate (use_cache=True), decoding 10 tokens past a 5-token
    prompt, well past the window."""
    model = hf_gpt_oss(np.float32)
    model.save_pretrained(tmp_path, safe_serialization=True)
    assert cli.main(["generate", "--hf", str(tmp_path), "--ids", "3,1,4,1,5", "--max-new-tokens", "10",
                     "--temperature", "0", *cache]) == 0
    ours = [int(i) for i in capsys.readouterr().out.strip().split(",")]
    assert ours == hf_greedy(model, [3, 1, 4, 1, 5], 10), "gpt-oss: greedy ids differ from transformers'"


# -- bad input ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("changes, message", [
    ({"num_experts_per_tok": 5}, "num_experts_per_tok = 5 must be at most num_local_experts = 4"),
    ({"num_local_experts": 0}, "num_local_experts must be an int >= 1, got 0"),
    ({"num_experts_per_tok": 2.0}, "num_experts_per_tok must be an int >= 1, got 2.0"),
    ({"swiglu_limit": 0}, "GptOssConfig.swiglu_limit must be a number > 0, got 0.0"),
    ({"swiglu_alpha": "fast"}, "swiglu_alpha must be a number, got 'fast'"),
    ({"sliding_window": 0}, "sliding_window must be an int or null >= 1, got 0"),
    ({"sliding_window": None}, "sliding_window = null with sliding_attention layers"),
    ({"layer_types": ["sliding_attention", "chunked_attention", "full_attention"]},
     "GptOssConfig.layer_types must list n_layer = 3 entries, each 'sliding_attention' or 'full_attention'"),
    ({"layer_types": "sliding_attention"}, "layer_types must be a list, got 'sliding_attention'"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "factor": 2.0}},
     "rope_type 'longrope' is not supported"),
    ({"rope_parameters": {**YARN, "low_freq_factor": 1.0}}, "rope_parameters key 'low_freq_factor' is not read"),
    ({"rope_parameters": {**YARN, "factor": -4.0}}, "rope_parameters.factor must be a number >= 0, got -4.0"),
    ({"quantization_config": {"quant_method": "mxfp4"}}, "quantization_config {'quant_method': 'mxfp4'} is not"),
])
def test_bad_config_is_refused_naming_the_field(tmp_path, capsys, changes, message):
    """The saved folder with config.json changed: load_checkpoint and generate --hf refuse it, naming the field."""
    assert_changed_config_refused(save(hf_gpt_oss(np.float32), tmp_path), capsys, changes, message)


@pytest.fixture(scope="module")
def saved_gpt_oss(tmp_path_factory):
    """config.json and model.safetensors of the float32 test model, saved once for the module."""
    folder = save(hf_gpt_oss(np.float32), tmp_path_factory.mktemp("gpt_oss"))
    return json.loads((folder / "config.json").read_text()), (folder / "model.safetensors").read_bytes()


GPT_OSS_KEYS = sorted(set(hf.CONFIG_KEYS["GptOssForCausalLM"]) | {"layer_types"})


@given(data=st.data())
def test_any_config_value_loads_or_is_refused(saved_gpt_oss, data):
    """One to three keys of the saved config.json (every key the loader reads, and layer_types)
    given any JSON value, and sometimes a rope object with any of YaRN's keys: the folder loads,
    or a CheckpointError names config.json (or, for a size that changes a tensor's shape, the
    tensor); no other exception, no allocation beyond test_hostile_inputs' limit."""
    config, weights = saved_gpt_oss
    changes = data.draw(st.dictionaries(st.sampled_from(GPT_OSS_KEYS), JSON, min_size=1, max_size=3), label="changes")
    if data.draw(st.booleans(), label="rope"):
        rope = st.dictionaries(st.sampled_from(["rope_type", "type", *hf.ROPE_KEYS, *hf.GPT_OSS_YARN_KEYS]),
                               st.sampled_from(["default", "yarn", "linear"]) | JSON, max_size=5)
        changes[data.draw(st.sampled_from(["rope_parameters", "rope_scaling"]))] = data.draw(rope, label="rope dict")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "config.json").write_text(json.dumps({**config, **changes}))
        (folder / "model.safetensors").write_bytes(weights)
        assert_loads_or_names_folder(folder, changes)


@pytest.mark.parametrize("changes, error, message", [
    ({"experts_per_token": 5}, ValueError, "GptOssConfig.experts_per_token = 5 must be at most n_experts = 4"),
    ({"n_experts": "4"}, TypeError, "GptOssConfig.n_experts must be an integer, got str '4'"),
    ({"swiglu_limit": -1.0}, ValueError, "GptOssConfig.swiglu_limit must be a number > 0, got -1.0"),
    ({"swiglu_alpha": float("inf")}, ValueError, "GptOssConfig.swiglu_alpha must be a finite number, got inf"),
    ({"layer_types": ("full_attention",)}, ValueError, "GptOssConfig.layer_types must list n_layer = 2 entries"),
    ({"sliding_window": 0}, ValueError, "GptOssConfig.sliding_window must be a positive integer, got 0"),
])
def test_bad_gpt_oss_config_is_refused(changes, error, message):
    with pytest.raises(error, match=message):
        GptOssConfig(n_layer=2, **changes)


def test_default_layer_types_are_transformers():
    """Without layer_types, the layers alternate, the first sliding, as transformers' config does."""
    for n_layer in (1, 2, 5):
        assert GptOssConfig(n_layer=n_layer).layer_types == tuple(
            transformers.GptOssConfig(num_hidden_layers=n_layer).layer_types)


def test_default_experts_activation_is_transformers():
    """The experts' SwiGLU defaults to gpt-oss's: alpha 1.702 and the clamp at 7, as transformers'
    GptOssExperts holds them (alpha fixed in the module, the limit from its config)."""
    hf = transformers.GptOssConfig(hidden_size=8, intermediate_size=8, num_local_experts=2, num_attention_heads=2,
                                   num_key_value_heads=1, head_dim=4, num_hidden_layers=1)
    experts = modeling_gpt_oss.GptOssExperts(hf)
    ours = GptOssConfig()
    assert (ours.swiglu_alpha, ours.swiglu_limit) == (experts.alpha, experts.limit)


def test_attn_mask_with_a_bounded_cache_is_refused():
    config = GptOssConfig()
    params = init_gpt_oss_params(config, np.random.default_rng(0), np.float64)
    ids = np.zeros((1, 3), np.int64)
    with pytest.raises(ValueError, match=r"^gpt_oss_forward: an attn_mask with a kv_cache whose sliding or chunked "
                                         r"layers hold only their last window is not supported \(the mask spans all "
                                         r"past \+ T keys\): decode without attn_mask, or with a cache whose layers "
                                         r"hold every token \(init_kv_cache without windows\)$"):
        gpt_oss_forward(ids, params, config, attn_mask=np.ones((1, 1, 3, 3), bool),
                        kv_cache=gpt_oss_kv_cache(config, 1, np.float64))
    # Only sliding layers bound the cache: with every layer global, a mask and a cache go together.
    every_global = dataclasses.replace(config, layer_types=("full_attention",) * config.n_layer)
    mask = np.tril(np.ones((1, 1, 3, 3), bool))
    cached, _ = gpt_oss_forward(ids, params, every_global, attn_mask=mask,
                                kv_cache=gpt_oss_kv_cache(every_global, 1, np.float64))
    assert_close("gpt_oss.logits, every layer global, masked, with a kv_cache", cached,
                 gpt_oss_forward(ids, params, every_global, attn_mask=mask)[0])


@pytest.mark.parametrize("dtype", sorted(helpers.LOW_DTYPES))
def test_norms_round_the_scaled_product_once(dtype):
    """gpt-oss's RMS norms form w * xhat in float32 and round it once to the low dtype, as
    transformers' GptOssRMSNorm (Llama's round xhat first): what a block's first norm hands the
    projections and what the final norm hands the head are (xhat * w) rounded, bit for bit, from
    each norm's cache; with these weights rounding twice differs."""
    low = helpers.LOW_DTYPES[dtype][0]
    config = GptOssConfig(vocab_size=11, n_layer=1, n_embd=16, n_head=2, n_kv_head=1, hidden=6, n_experts=3)
    rng = np.random.default_rng(0)
    params = tree_map(lambda p: (p + rng.uniform(-0.5, 0.5, p.shape)).astype(low),
                      init_gpt_oss_params(config, rng, np.float32))
    _, cache = gpt_oss_forward(rng.integers(0, 11, (2, 5)), params, config)
    block = cache.blocks[0]
    for name, (xhat, _, scale, _), handed in (("blocks.0.attn_norm", block.attn_norm, block.attn.qkv[0].x),
                                              ("norm", cache.norm, cache.head[0].x)):
        once, twice = (xhat * scale).astype(low), (xhat.astype(low).astype(np.float32) * scale).astype(low)
        assert not np.array_equal(once, twice), f"{name}: the example does not tell the roundings apart"
        assert np.array_equal(np.asarray(handed).astype(low), once), f"{name} is not w * xhat rounded once"


def test_config_stores_numpy_scalars_as_python_values():
    assert_config_stores_python_values(GptOssConfig, {
        "n_experts": np.int64(4), "experts_per_token": np.int32(2), "swiglu_alpha": np.float32(1.5),
        "swiglu_limit": np.float64(7.0), "sliding_window": np.int64(3)}, n_layer=2)


def test_refusals_name_gpt_oss():
    assert_refusals_name_the_family("gpt_oss", GptOssConfig, init_gpt_oss_params, gpt_oss_forward, gpt_oss_backward)


def test_init_gives_every_parameter_its_shape():
    """init_gpt_oss_params: the Llama tree with attention biases, sinks (nh,) and the experts'
    stacked weights, all in the dtype asked for."""
    config = GptOssConfig(n_layer=1, n_embd=8, n_head=2, n_kv_head=1, hidden=6, n_experts=3)
    params = init_gpt_oss_params(config, np.random.default_rng(0), np.float32)
    shapes = {path: a.shape for path, a in leaves(params["blocks"]["0"])}
    assert shapes["attn.sinks"] == (2,) and shapes["attn.q.b"] == (8,) and shapes["attn.k.b"] == (4,), shapes
    assert shapes["mlp.router.w"] == (8, 3) and shapes["mlp.experts.gate.w"] == (3, 8, 6), shapes
    assert shapes["mlp.experts.down.b"] == (3, 8), shapes
    assert all(a.dtype == np.float32 for _, a in leaves(params)), "init_gpt_oss_params changed the dtype"


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_init_draws_the_sinks_from_n_0_0_02(dtype):
    """Each sink logit starts N(0, 0.02^2), as Hugging Face's initializer_range: a larger spread
    would start some heads far from the others (1024 draws, helpers.assert_normal_draws); and the
    sinks come in the dtype asked for."""
    config = GptOssConfig(n_layer=8, n_embd=256, n_head=128, n_kv_head=1, hidden=2, n_experts=2)
    sinks = np.concatenate([block["attn"]["sinks"] for block in
                            init_gpt_oss_params(config, np.random.default_rng(0), dtype)["blocks"].values()])
    assert sinks.dtype == dtype and sinks.shape == (1024,), (sinks.dtype, sinks.shape)
    assert_normal_draws("sinks", sinks, 0.02)


@pytest.mark.parametrize("field, low, below, bound", [
    ("n_experts", 1, 0, "a positive integer"),
    ("experts_per_token", 1, 0, "a positive integer"),
    ("sliding_window", 1, 0, "a positive integer"),
    ("swiglu_limit", 1e-300, 0.0, "a number > 0"),
])
def test_config_at_its_lower_bounds_and_below(field, low, below, bound):
    """Each of gpt-oss's own numbers at its smallest value is accepted, just below it refused
    naming the field; and LlamaConfig's checks still run (vocab_size = 0)."""
    config = GptOssConfig(n_layer=2, **{field: low}, **({"experts_per_token": 1} if field == "n_experts" else {}))
    assert getattr(config, field) == low
    with pytest.raises(ValueError, match=rf"^GptOssConfig.{field} must be {bound}, got {below}$"):
        GptOssConfig(n_layer=2, **{field: below})
    with pytest.raises(ValueError, match=r"^GptOssConfig.vocab_size must be a positive integer, got 0$"):
        GptOssConfig(vocab_size=0)


@pytest.mark.parametrize("module", [gpt_oss, tw], ids=["numpy", "twin"])
def test_options_are_keyword_only(module):
    assert_options_are_keyword_only(module, "gpt_oss")
