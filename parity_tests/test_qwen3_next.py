"""Parity tests for numpy_attn/qwen3_next.py and torch_attn/qwen3_next.py: the model against Hugging
Face's Qwen3NextForCausalLM in float64 (logits and every parameter's gradient), the twin, finite
differences, refusals of bad configs, and decoding with the hybrid cache against the full forward."""

import inspect
import types

import numpy as np
import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.qwen2_moe import modeling_qwen2_moe
from transformers.models.qwen3_next import modeling_qwen3_next as hf_modeling

import torch_attn.qwen3_next as tw
from numpy_attn.qwen3_5 import qwen3_5_kv_cache
from numpy_attn.qwen3_next import (
    Qwen3NextConfig,
    fused_columns,
    init_qwen3_next_params,
    qwen3_next_backward,
    qwen3_next_forward,
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
    assert_twin_decodes_as_ours,
    drawn_hybrid_case,
    float64_twin,
    hybrid_budget_cases,
    randomise,
)

# A tiny Qwen3-Next: Gated DeltaNet, attention, Gated DeltaNet, attention; the mixture of experts
# (6 experts, 2 per token, a shared expert) on blocks 1 and 3 by decoder_sparse_step = 2 except
# block 3, listed in mlp_only_layers: one expert block, three dense. 4 query heads on 2 key/value
# heads of 8 channels, half of them rotating; 2 key heads of Gated DeltaNet serving 4 value heads
# (the fused projections' grouping matters). Pad, bos and eos ids inside the vocabulary.
HF_SIZES = dict(vocab_size=97, hidden_size=16, intermediate_size=24, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=4, linear_value_head_dim=6,
                linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
                layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
                partial_rotary_factor=0.5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                num_experts=6, num_experts_per_tok=2, moe_intermediate_size=10, shared_expert_intermediate_size=12,
                norm_topk_prob=True, decoder_sparse_step=2, mlp_only_layers=[3],
                tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
CONFIG = Qwen3NextConfig(vocab_size=97, block_size=128, n_layer=4, n_head=4, n_kv_head=2, n_embd=16, head_dim=8,
                         hidden=24, rms_eps=1e-6, rope_theta=10000.0, partial_rotary_factor=0.5,
                         layer_types=("linear_attention", "full_attention") * 2, linear_k_heads=2,
                         linear_v_heads=4, linear_k_dim=4, linear_v_dim=6, conv_kernel=4, n_experts=6,
                         experts_per_token=2, moe_hidden=10, shared_hidden=12, norm_topk_prob=True,
                         decoder_sparse_step=2, mlp_only_layers=(3,))


def hf_model(seed=0, **changes):
    """Hugging Face's model in float64, every weight drawn by model_kit.randomise (norm weights
    near 1: the norms then scale by about 2, as 1 + w)."""
    config = transformers.Qwen3NextConfig(**(HF_SIZES | changes), attn_implementation="sdpa",
                                          experts_implementation="eager")   # a loop: float64 on CPU
    return randomise(transformers.Qwen3NextForCausalLM(config), seed).to(torch.float64).eval()


def hf_names(config):
    """{Hugging Face's name: (our path, how)}: how "T" transposes nn.Linear's (C_out, C_in) (and
    the experts' stacked (E, C_out, C_in)), "conv" squeezes the convolution's (conv_dim, 1, K) to
    (conv_dim, K), "gate_up" splits the experts' (E, 2H, C) into gate and up, "" copies."""
    names = {"model.embed_tokens.weight": (("wte",), ""), "model.norm.weight": (("norm", "w"), ""),
             "lm_head.weight": (("head", "w"), "T")}
    for i in range(config.n_layer):
        p, ours = f"model.layers.{i}.", ("blocks", str(i))
        names[p + "input_layernorm.weight"] = (ours + ("attn_norm", "w"), "")
        names[p + "post_attention_layernorm.weight"] = (ours + ("mlp_norm", "w"), "")
        mlp = ours + ("mlp",)
        if config.is_moe(i):
            names[p + "mlp.gate.weight"] = (mlp + ("router", "w"), "T")
            names[p + "mlp.experts.gate_up_proj"] = (mlp + ("experts",), "gate_up")
            names[p + "mlp.experts.down_proj"] = (mlp + ("experts", "down", "w"), "T")
            for name in ("gate", "up", "down"):
                names[f"{p}mlp.shared_expert.{name}_proj.weight"] = (mlp + ("shared", name, "w"), "T")
            names[p + "mlp.shared_expert_gate.weight"] = (mlp + ("shared_gate", "w"), "T")
        else:
            for name in ("gate", "up", "down"):
                names[f"{p}mlp.{name}_proj.weight"] = (mlp + (name, "w"), "T")
        attn = ours + ("attn",)
        if config.is_full(i):
            for name in ("q", "k", "v", "o"):
                names[f"{p}self_attn.{name}_proj.weight"] = (attn + (name, "w"), "T")
            for name in ("q_norm", "k_norm"):
                names[f"{p}self_attn.{name}.weight"] = (attn + (name, "w"), "")
        else:
            for name in ("in_proj_qkvz", "in_proj_ba", "out_proj"):
                names[f"{p}linear_attn.{name}.weight"] = (attn + (name, "w"), "T")
            names[p + "linear_attn.conv1d.weight"] = (attn + ("conv1d", "w"), "conv")
            names[p + "linear_attn.norm.weight"] = (attn + ("norm", "w"), "")
            for name in ("dt_bias", "A_log"):
                names[f"{p}linear_attn.{name}"] = (attn + (name,), "")
    return names


def ours_from_hf(tensors, config):
    """Our tree from Hugging Face's {name: array} (its parameters, or their gradients)."""
    tree = {}
    for name, (path, how) in hf_names(config).items():
        a = np.asarray(tensors[name])
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        if how == "gate_up":                                                  # (E, 2H, C): gate rows, then up
            H = a.shape[1] // 2
            gate, up = a[:, :H].swapaxes(1, 2).copy(), a[:, H:].swapaxes(1, 2).copy()   # (E, C, H) each
            node[path[-1]] = {"gate": {"w": gate}, "up": {"w": up}, **node.get(path[-1], {})}
            continue
        a = np.swapaxes(a, -1, -2).copy() if how == "T" else a[:, 0].copy() if how == "conv" else a.copy()
        node[path[-1]] = a
    return tree


def exact(model, monkeypatch):
    """Make the float64 model compute in float64 throughout. transformers keeps these steps in
    float32 whatever the weights' dtype: both delta rules (torch_chunk_gated_delta_rule,
    torch_recurrent_gated_delta_rule) cast q, k, v, beta, g to float32; Gated DeltaNet's forward
    forms g from A_log.float() and a.float(); Qwen3NextRMSNorm and Qwen3NextRMSNormGated normalise
    in float32; the router (Qwen2MoeTopKRouter's forward, which Qwen3NextTopKRouter inherits) takes
    its softmax with dtype=torch.float; the rotary embedding forms its frequencies and angles in
    float32. The first five are run again from their source with those casts made float64
    (model_kit.float64_twin); the rotary embedding's angles are formed in float64 from rope_frequencies of
    the rotary_dim channels. The experts run in the weights' dtype already (eager loop)."""
    for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"):
        monkeypatch.setattr(hf_modeling, name, float64_twin(getattr(hf_modeling, name), hf_modeling))
    for cls in (hf_modeling.Qwen3NextGatedDeltaNet, hf_modeling.Qwen3NextRMSNorm, hf_modeling.Qwen3NextRMSNormGated):
        monkeypatch.setattr(cls, "forward", float64_twin(inspect.unwrap(cls.forward), hf_modeling))
    router = modeling_qwen2_moe.Qwen2MoeTopKRouter.forward
    monkeypatch.setattr(hf_modeling.Qwen3NextTopKRouter, "forward", float64_twin(router, modeling_qwen2_moe))
    inv_freq = torch.from_numpy(rope_frequencies(CONFIG.rotary_dim, CONFIG.rope_theta))   # (r/2,) float64

    def rotary(self, x, position_ids):
        angles = position_ids[..., None].to(torch.float64) * inv_freq         # (B, T, r/2)
        angles = torch.cat((angles, angles), dim=-1)                          # (B, T, r)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    monkeypatch.setattr(model.model.rotary_emb, "forward", types.MethodType(rotary, model.model.rotary_emb))
    return model


def hf_run(model, ids, dout, attention_mask=None, config=CONFIG):
    """Logits and the gradients of sum(logits * dout), in our tree."""
    model.zero_grad()
    mask = None if attention_mask is None else to_torch(attention_mask.astype(np.int64))
    logits = model(input_ids=to_torch(ids), attention_mask=mask).logits
    (logits * to_torch(dout)).sum().backward()
    return to_numpy(logits), ours_from_hf({k: to_numpy(p.grad) for k, p in model.named_parameters()}, config)


def tol64(ref):
    """float64 against transformers run in float64: the same operations, summed in other orders
    (BLAS blocks, the chunked delta rule's triangular solve written as a loop there and a solve
    here, the fused projections' columns gathered before the product here, after it there). Each
    step adds a few ulps (1.1e-16) relative to the largest value it combines; over four blocks of
    some hundred such steps, with the norms and the delta rule's solve amplifying by O(10), errors
    stay near 1e-13 of the largest value of the kind compared. rtol and atol 1e-10 x that largest
    value leave 1000x room and still catch any wrong term (which errs by O(1e-2) or more)."""
    scale = float(np.abs(ref).max(initial=0))
    return dict(rtol=1e-10, atol=1e-10 * scale)


# -- against Hugging Face --------------------------------------------------------------------------

@pytest.mark.parametrize("seed, B, T, padded, norm_topk_prob", [
    (0, 2, 7, False, True), (1, 1, 20, False, False), (2, 2, 9, True, True), (3, 1, 70, False, True)])
def test_matches_transformers_in_float64(seed, B, T, padded, norm_topk_prob):
    """Logits and every parameter's gradient of sum(logits * dout) equal transformers' float64
    model (made float64 throughout by ``exact``); with left padding through attention_mask, on the
    positions that are not padding (transformers' padded rows read no key and are not compared);
    the router's weights renormalised or not. T = 70 runs two chunks of the chunked delta rule."""
    rng = np.random.default_rng(seed)
    model = hf_model(seed, norm_topk_prob=norm_topk_prob)
    config = Qwen3NextConfig(**{**CONFIG.__dict__, "norm_topk_prob": norm_topk_prob})
    params = ours_from_hf({k: to_numpy(p) for k, p in model.named_parameters()}, config)
    def run_hf(ids, dout, attention_mask):
        with pytest.MonkeyPatch.context() as monkeypatch:
            return hf_run(exact(model, monkeypatch), ids, dout, attention_mask, config)
    assert_hybrid_equals_transformers("qwen3_next", qwen3_next_forward, qwen3_next_backward, run_hf, config,
                                      params, rng, B, T, padded, HF_SIZES["pad_token_id"], tol64)


def test_router_in_float32_is_what_exact_removes():
    """The router's softmax is the one step of the mixture of experts transformers keeps in float32
    (dtype=torch.float) in a float64 model: without that swap its logits differ from ours by
    float32 rounding (about 1e-8 of them), far above tol64, so that the swap is needed and the
    tolerance sees it."""
    rng = np.random.default_rng(0)
    model = hf_model(0)
    params = ours_from_hf({k: to_numpy(p) for k, p in model.named_parameters()}, CONFIG)
    ids = rng.integers(0, CONFIG.vocab_size, (1, 7))
    dout = rng.normal(size=(1, 7, CONFIG.vocab_size))
    with pytest.MonkeyPatch.context() as monkeypatch:
        exact(model, monkeypatch)
        monkeypatch.setattr(hf_modeling.Qwen3NextTopKRouter, "forward",
                            modeling_qwen2_moe.Qwen2MoeTopKRouter.forward)   # the float32 softmax again
        ref_logits, _ = hf_run(model, ids, dout)
    logits, _ = qwen3_next_forward(ids, params, CONFIG)
    err = np.abs(logits - ref_logits).max()
    assert err > 1e-10 * np.abs(ref_logits).max(), err


def test_fused_columns_are_transformers_split():
    """fused_columns picks, from in_proj_qkvz's and in_proj_ba's outputs, the q, k, v, z, b, a that
    transformers' fix_query_key_value_ordering derives (each output a distinct number, so a wrong
    column shows)."""
    model = hf_model(0)
    layer = model.model.layers[0].linear_attn
    nk, nv, dk, dv = CONFIG.linear_k_heads, CONFIG.linear_v_heads, CONFIG.linear_k_dim, CONFIG.linear_v_dim
    qkvz = torch.arange(2 * nk * dk + 2 * nv * dv, dtype=torch.float64)[None, None]   # (1, 1, n)
    ba = torch.arange(2 * nv, dtype=torch.float64)[None, None]
    q, k, v, z, b, a = (t.reshape(-1).numpy() for t in layer.fix_query_key_value_ordering(qkvz, ba))
    cols = fused_columns(nk, nv, dk, dv)
    assert np.array_equal(cols["in_proj_qkv"], np.concatenate([q, k, v]))
    assert np.array_equal(cols["in_proj_z"], z)
    assert np.array_equal(cols["in_proj_b"], b) and np.array_equal(cols["in_proj_a"], a)


# -- the twin, finite differences --------------------------------------------------------------------

@st.composite
def small_models(draw):
    """(config, params, ids, dout): a drawn tiny Qwen3-Next (1 to 3 layers of either type, grouped
    heads, dense or expert networks), its params from init_qwen3_next_params moved off their
    initial values."""
    n_layer = draw(st.integers(1, 3))
    nkv, g, nk, r = (draw(st.integers(1, 2)) for _ in range(4))
    hs = draw(st.sampled_from([4, 8]))
    E = draw(st.integers(0, 4))
    config = Qwen3NextConfig(
        vocab_size=draw(st.integers(2, 9)), block_size=80, n_layer=n_layer, n_head=nkv * g, n_kv_head=nkv,
        n_embd=draw(st.sampled_from([4, 8])), head_dim=hs, hidden=draw(st.integers(1, 6)),
        partial_rotary_factor=draw(st.sampled_from([0.5, 1.0])),
        layer_types=tuple(draw(st.lists(st.sampled_from(["linear_attention", "full_attention"]),
                                        min_size=n_layer, max_size=n_layer))),
        linear_k_heads=nk, linear_v_heads=nk * r, linear_k_dim=draw(st.integers(1, 4)),
        linear_v_dim=draw(st.integers(1, 4)), conv_kernel=draw(st.integers(2, 4)),
        n_experts=E, experts_per_token=draw(st.integers(1, max(E, 1))), moe_hidden=draw(st.integers(1, 5)),
        shared_hidden=draw(st.integers(1, 5)), norm_topk_prob=draw(st.booleans()),
        decoder_sparse_step=draw(st.integers(1, 2)),
        mlp_only_layers=tuple(draw(st.sets(st.integers(0, n_layer - 1), max_size=1))),
        attn_bias=draw(st.booleans()), tie_weights=draw(st.booleans()))
    return drawn_hybrid_case(draw, config, init_qwen3_next_params)


@pytest.mark.twin_parity
@settings(max_examples=15, deadline=None)
@given(case=small_models(), padded=st.booleans())
def test_matches_twin_and_autograd(case, padded):
    """float64, with and without left padding: model_kit.assert_hybrid_matches_twin."""
    config, params, ids, dout = case
    assert_hybrid_matches_twin("qwen3_next", qwen3_next_forward, qwen3_next_backward, tw.qwen3_next, config, params,
                               ids, dout, padded)


H = 2e-4


@pytest.mark.parametrize("path", ["blocks.0.attn.in_proj_qkvz.w", "blocks.0.attn.in_proj_ba.w",
                                  "blocks.0.mlp.router.w", "blocks.0.mlp.experts.gate.w",
                                  "blocks.0.mlp.shared_gate.w", "blocks.0.mlp.shared.up.w",
                                  "blocks.1.attn.q.w", "blocks.1.mlp.down.w", "wte"])
@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_gradients_match_finite_differences(path, norm_topk_prob):
    """float64 five-point differences (helpers.numerical_grad) of a few leaves, one of each kind
    Qwen3-Next adds: the fused projections, the router (with and without renormalising), an expert,
    the shared expert and its gate. Step H as test_qwen3_5's (the same sharpness of params moved off
    init): the stencil's h^4 error near 3e-9, the rounding error 1e-16 |sum| / H near 1e-11, below
    FD_TOL's atol 1e-8 and rtol 1e-6. The top-k choice is piecewise constant: a stencil point that
    moves a token's k-th and (k+1)-th router probabilities past each other makes the function jump
    (seeds whose smallest such gap was 5e-3 or less did, by up to 600 in the gradient). Seed 2's
    smallest gap is 1.2e-2, and no point of the stencil (steps up to 2H = 4e-4 in one entry) flips a
    choice; the gap is asserted, so that a change of the drawn params shows as what it is."""
    config = Qwen3NextConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_kv_head=1, n_embd=8, head_dim=8,
                             hidden=6, partial_rotary_factor=0.5, layer_types=("linear_attention", "full_attention"),
                             linear_k_heads=1, linear_v_heads=2, linear_k_dim=4, linear_v_dim=3, conv_kernel=3,
                             n_experts=4, experts_per_token=2, moe_hidden=5, shared_hidden=3,
                             norm_topk_prob=norm_topk_prob, mlp_only_layers=(1,))
    rng = np.random.default_rng(2)
    params = moved_off_init(init_qwen3_next_params(config, rng, np.float64), rng)
    ids = rng.integers(0, 11, (2, 6))
    dout = rng.normal(size=(2, 6, 11))
    logits, cache = qwen3_next_forward(ids, params, config)
    p = np.sort(cache.blocks[0].mlp.router.softmax[0], axis=-1)              # (N, E) router probabilities
    assert (p[:, -2] - p[:, -3]).min() > 1e-2                                 # k = 2: no choice near a tie
    grads = qwen3_next_backward(dout, cache)
    assert_leaf_matches_finite_differences("qwen3_next", qwen3_next_forward, grads, config, params, ids, dout, path, H)


# -- refusals ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("changes, error, message", [
    ({"n_experts": -1}, ValueError, "n_experts must be an integer >= 0, got -1"),
    ({"experts_per_token": 5}, ValueError, r"experts_per_token = 5 must lie in \[1, 4\]: n_experts = 4"),
    ({"experts_per_token": 0}, ValueError, "experts_per_token must be a positive integer, got 0"),
    ({"moe_hidden": 0}, ValueError, "moe_hidden must be a positive integer, got 0"),
    ({"shared_hidden": 2.0}, TypeError, "shared_hidden must be an integer, got float 2.0"),
    ({"shared_hidden": 0}, ValueError, "shared_hidden must be a positive integer, got 0"),
    ({"norm_topk_prob": "yes"}, TypeError, "norm_topk_prob must be a bool, got str 'yes'"),
    ({"decoder_sparse_step": 0}, ValueError, "decoder_sparse_step must be a positive integer, got 0"),
    ({"mlp_only_layers": 1}, TypeError, "mlp_only_layers must be a list of layer indices, got 1"),
    ({"mlp_only_layers": (2,)}, ValueError, r"mlp_only_layers must hold layer indices in \[0, 2\) .*, got 2"),
    ({"mlp_only_layers": (True,)}, ValueError, "mlp_only_layers must hold layer indices .*, got True"),
    ({"linear_v_heads": 3}, ValueError, "linear_v_heads = 3 must be a multiple of linear_k_heads = 2"),
])
def test_bad_config_is_refused_naming_the_value(changes, error, message):
    """Each new field's checks (and one of Qwen3.5's, inherited), naming Qwen3NextConfig.<field>
    and the value given."""
    fields = dict(n_layer=2, head_dim=8, linear_k_heads=2, linear_v_heads=4) | changes
    with pytest.raises(error, match="Qwen3NextConfig." + message):
        Qwen3NextConfig(**fields)


def test_wrong_cache_is_refused():
    """A Llama key/value cache has no place for Gated DeltaNet's state: refused, naming its type."""
    config = Qwen3NextConfig(n_layer=2, head_dim=8)
    params = init_qwen3_next_params(config, np.random.default_rng(0), np.float64)
    assert_llama_cache_refused(qwen3_next_forward, config, params)


def test_other_configs_are_refused():
    """Params of this family need a Qwen3NextConfig: a Qwen3.5 one (no experts) is refused, naming it."""
    from numpy_attn.qwen3_5 import Qwen3_5Config
    config = Qwen3NextConfig(n_layer=2, head_dim=8)
    params = init_qwen3_next_params(config, np.random.default_rng(0), np.float64)
    with pytest.raises(TypeError, match="config must be a Qwen3NextConfig, got Qwen3_5Config"):
        qwen3_next_forward(np.zeros((1, 2), int), params, Qwen3_5Config(n_layer=2, head_dim=8))


@pytest.mark.parametrize("name, value", [("in_proj_qkvz", None), ("in_proj_qkvz", {"w": np.zeros((16, 5))}),
                                         ("in_proj_ba", {"w": np.zeros((16, 8)), "b": np.zeros(8)})])
def test_bad_fused_projection_is_refused(name, value):
    """A linear layer's fused projection missing, of the wrong width or with a bias is refused, naming it."""
    params = init_qwen3_next_params(CONFIG, np.random.default_rng(0), np.float64)
    if value is None:
        del params["blocks"]["0"]["attn"][name]
    else:
        params["blocks"]["0"]["attn"][name] = value
    with pytest.raises(ValueError, match=f"qwen3_next: params {name} must be "):
        qwen3_next_forward(np.zeros((1, 2), int), params, CONFIG)


def test_backward_refuses_a_cached_forward():
    """The cache is for inference only: a backward of a forward that read a cached state is refused."""
    config = Qwen3NextConfig(n_layer=2, head_dim=8, layer_types=("linear_attention", "full_attention"))
    params = init_qwen3_next_params(config, np.random.default_rng(0), np.float64)
    assert_backward_refuses_cached_forward(qwen3_next_forward, qwen3_next_backward, qwen3_5_kv_cache, config,
                                           params)


# -- decoding ------------------------------------------------------------------------------------------

@settings(max_examples=10, deadline=None)
@given(case=small_models(), P=st.integers(1, 9), padded=st.booleans())
def test_decoding_equals_the_full_forward(case, P, padded):
    """Prefill P tokens, then one token at a time through qwen3_5_kv_cache, with left padding too:
    model_kit.assert_hybrid_decodes_as_full_forward."""
    config, params, ids, _ = case
    assert_hybrid_decodes_as_full_forward("qwen3_next", qwen3_next_forward, qwen3_5_kv_cache, config, params,
                                          *ids.shape, P, padded)


@pytest.mark.parametrize("padded", [False, True])
def test_decoding_matches_transformers_generate(padded):
    """Greedy ids of our cached decoding equal transformers' generate on the float64 model made
    exact (its own DynamicCache with Gated DeltaNet's states), with a left-padded batch too."""
    model = hf_model(5)
    params = ours_from_hf({k: to_numpy(p) for k, p in model.named_parameters()}, CONFIG)
    prompts = [[3, 14, 15, 92, 65, 35], [0, 0, 27, 18, 28, 18]] if padded else [[3, 14, 15, 92, 65, 35]]
    pad = np.array([[padded and i == 1 and t < 2 for t in range(6)] for i in range(len(prompts))])
    assert_hybrid_generates_as_transformers("qwen3_next", qwen3_next_forward, qwen3_5_kv_cache, model, exact, CONFIG,
                                            params, prompts, pad)


def test_twin_decodes_as_ours():
    """The twin's cache (torch_attn/qwen3_5.py's, which this model's states fit) decodes a prefill
    then one token at a time to our logits (float64: the same steps, helpers' tolerance)."""
    from torch_attn.qwen3_5 import qwen3_5_kv_cache as twin_kv_cache
    model = hf_model(4)
    params = ours_from_hf({k: to_numpy(p) for k, p in model.named_parameters()}, CONFIG)
    assert_twin_decodes_as_ours("qwen3_next", qwen3_next_forward, tw.qwen3_next, qwen3_5_kv_cache, twin_kv_cache,
                                CONFIG, params)


# -- checkpoints saved by transformers ------------------------------------------------------------------

def test_checkpoint_reads_as_the_model(tmp_path):
    """attn_cli.hf reads a saved Qwen3NextForCausalLM folder into CONFIG and the very params the
    tests above copy from the model (float64: no rounding)."""
    model = hf_model(7)
    model.save_pretrained(tmp_path, safe_serialization=True)
    expected = ours_from_hf({k: to_numpy(p) for k, p in model.named_parameters()}, CONFIG)
    assert_checkpoint_reads_as(tmp_path, "qwen3_next", CONFIG, expected)


@pytest.mark.parametrize("cache", [[], ["--no-cache"]])
def test_generate_hf_ids_equal_transformers_generate(tmp_path, capsys, cache):
    """``numpy-attn generate --hf DIR --ids`` on a saved float32 model, with the cache (keys and
    values, Gated DeltaNet's state) and without: transformers' greedy ids (use_cache=True)."""
    from parity_tests.model_kit import assert_generate_hf_is_transformers
    assert_generate_hf_is_transformers(hf_model(8).to(torch.float32), tmp_path, capsys, cache, "qwen3_next")


@pytest.mark.parametrize("changes, message", [
    ({"mlp_only_layers": 3}, "mlp_only_layers must be a list of layer indices, got 3"),
    ({"num_experts_per_tok": 7}, r"experts_per_token = 7 must lie in \[1, 6\]: n_experts = 6"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
])
def test_bad_config_json_is_refused(tmp_path, capsys, changes, message):
    """A config.json this model cannot run is refused by load_checkpoint and generate --hf, naming the key."""
    from parity_tests.model_kit import assert_changed_config_refused
    folder = tmp_path / "model"
    hf_model(9).to(torch.float32).save_pretrained(folder, safe_serialization=True)
    assert_changed_config_refused(folder, capsys, changes, message)


# -- float16 and bfloat16: FlashAttention's error rule against transformers -----------------------------

# float16 breaks the rule at these seeds (bfloat16 holds at all three), measured when the test was written:
FLOAT16_BROKEN = {
    ("float16", 0): "dblocks.0.attn.norm.w: ours 43.7 off, 6.2x transformers' 7.04 (the rule: 6x)",
    ("float16", 1): "dwte: ours 5.91 off, transformers' float16 run is nan there (no bound)",
}


@pytest.mark.error_budget
@pytest.mark.parametrize("dtype, seed", hybrid_budget_cases(FLOAT16_BROKEN))
def test_low_precision_meets_the_error_budget(dtype, seed):
    """Ours and the twin in float16 and bfloat16 (Gated DeltaNet computing in float32 and rounding
    once) against Qwen3NextForCausalLM in float64 on the same rounded weights, within twice the error
    of Qwen3NextForCausalLM run in the low dtype: model_kit.assert_hybrid_meets_error_budget."""
    assert_hybrid_meets_error_budget("qwen3_next", dtype, hf_model(seed), lambda t: ours_from_hf(t, CONFIG), exact,
                                     qwen3_next_forward, qwen3_next_backward, tw.qwen3_next, CONFIG, seed)
