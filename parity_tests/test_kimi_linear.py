"""Parity tests for numpy_attn/kimi_linear.py and torch_attn/kimi_linear.py: the model against
Hugging Face's KimiLinearForCausalLM in float64 (logits and every parameter's gradient), the twin,
finite differences, refusals of bad configs, and decoding with the hybrid cache against the full
forward."""

import inspect

import numpy as np
import pytest
import torch
import transformers
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from transformers.models.kimi_linear import modeling_kimi_linear as hf_modeling

import torch_attn.kimi_linear as tw
from numpy_attn.kimi_linear import (
    KimiLinearConfig,
    init_kimi_linear_params,
    kimi_linear_backward,
    kimi_linear_forward,
    kimi_linear_kv_cache,
)
from numpy_attn.masks import padding_attn_mask
from parity_tests.helpers import (
    assert_close,
    assert_normal_draws,
    moved_off_init,
    to_numpy,
    to_torch,
    tree_leaves,
)
from parity_tests.model_kit import (
    CHOICE_GAP,
    MLA_HF_NAMES,
    assert_checkpoint_reads_as,
    assert_generate_hf_is_transformers,
    assert_hybrid_matches_twin,
    assert_hybrid_meets_error_budget,
    assert_leaf_matches_finite_differences,
    assert_tree_equals_transformers,
    choice_gaps,
    drawn_hybrid_case,
    float64_twin,
    hybrid_budget_cases,
    randomise,
    save,
    tol64,
)

# A tiny Kimi Linear: three KDA layers then one MLA layer, as the released model repeats them (its
# default pattern puts MLA on layers 4, 8, ...; this one lists its own); a dense network in the first
# block, 4 experts in 2 groups after; 2 KDA heads of 4; MLA with a low-rank query. Pad, bos and eos
# ids inside the vocabulary.
LAYER_TYPES = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
HF_SIZES = dict(vocab_size=37, hidden_size=16, intermediate_size=20, moe_intermediate_size=6, num_hidden_layers=4,
                num_attention_heads=2, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                n_group=2, topk_group=1, n_shared_experts=1, routed_scaling_factor=2.5, q_lora_rank=6,
                kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=6, linear_num_heads=2,
                linear_head_dim=4, linear_conv_kernel_dim=4, rms_norm_eps=1e-5, layer_types=LAYER_TYPES,
                mlp_layer_types=["dense", "sparse", "sparse", "sparse"], max_position_embeddings=128,
                tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
CONFIG = KimiLinearConfig(vocab_size=37, block_size=128, n_layer=4, n_head=2, n_kv_head=2, n_embd=16, hidden=20,
                          rms_eps=1e-5, q_lora_rank=6, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4,
                          v_head_dim=6, moe_hidden=6, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                          n_group=2, topk_group=1, routed_scaling_factor=2.5, layer_types=tuple(LAYER_TYPES),
                          mlp_layer_types=("dense", "sparse", "sparse", "sparse"), linear_num_heads=2,
                          linear_head_dim=4, conv_kernel=4, pad_token_id=0)
KDA_LINEARS = ("q_proj", "k_proj", "v_proj", "b_proj", "g_a_proj", "g_b_proj", "o_proj")


def hf_model(seed=0, dtype=torch.float64):
    """Hugging Face's model in ``dtype`` (float64 by default), every weight drawn by model_kit.randomise (U(-0.5, 0.5),
    norms near 1) and the router's selection bias U(-0.1, 0.1), so that it moves the choice."""
    config = transformers.KimiLinearConfig(**HF_SIZES, attn_implementation="sdpa", experts_implementation="eager")
    model = randomise(transformers.KimiLinearForCausalLM(config), seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, hf_modeling.KimiLinearTopkRouter):
                module.e_score_correction_bias.copy_(torch.rand(4, generator=g) * 0.2 - 0.1)
    return model.to(dtype).eval()


def ours_from_hf(t, config):
    """Our tree from Hugging Face's {name: array} (its parameters and the selection bias, or their
    gradients): nn.Linear's (C_out, C_in) transposed, the convolution's (conv_dim, 1, K) squeezed,
    the forget gate's four flattened (A_log (1, 1, nh, 1) as (nh,)), the experts' gate_up_proj
    (E, 2H, C) split into gate and up (E, C, H) and down_proj (E, C, H) as (E, H, C)."""
    def lin(name):
        return {"w": t[name].T.copy()}

    tree = {"wte": t["model.embed_tokens.weight"].copy(), "norm": {"w": t["model.norm.weight"].copy()},
            "head": lin("lm_head.weight"), "blocks": {}}
    for i in range(config.n_layer):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        if config.is_full(i):
            attn = {ours: ({"w": t[f"{a}{name}.weight"].copy()} if ours.endswith("norm") else lin(f"{a}{name}.weight"))
                    for ours, name in MLA_HF_NAMES.items() if f"{a}{name}.weight" in t}
        else:
            attn = {name: lin(f"{a}{name}.weight") for name in KDA_LINEARS}
            f = a + "forget_gate."
            attn.update(f_a_proj=lin(f + "f_a_proj.weight"), f_b_proj=lin(f + "f_b_proj.weight"),
                        conv1d={"w": t[a + "conv1d.weight"][:, 0].copy()}, dt_bias=t[f + "dt_bias"].copy(),
                        A_log=t[f + "A_log"].reshape(-1).copy(), o_norm={"w": t[a + "o_norm.weight"].copy()})
        m = p + "mlp."
        if config.is_moe(i):
            gate_up, down = t[m + "experts.gate_up_proj"], t[m + "experts.down_proj"]
            H = gate_up.shape[1] // 2
            mlp = {"router": lin(m + "gate.weight"), "selection_bias": t[m + "gate.e_score_correction_bias"].copy(),
                   "experts": {"gate": {"w": gate_up[:, :H].transpose(0, 2, 1).copy()},
                               "up": {"w": gate_up[:, H:].transpose(0, 2, 1).copy()},
                               "down": {"w": down.transpose(0, 2, 1).copy()}},
                   "shared": {name: lin(f"{m}shared_experts.{name}_proj.weight") for name in ("gate", "up", "down")}}
        else:
            mlp = {name: lin(f"{m}{name}_proj.weight") for name in ("gate", "up", "down")}
        tree["blocks"][str(i)] = {"attn_norm": {"w": t[p + "input_layernorm.weight"].copy()}, "attn": attn,
                                  "mlp_norm": {"w": t[p + "post_attention_layernorm.weight"].copy()}, "mlp": mlp}
    return tree


def exact(monkeypatch):
    """Make the float64 model compute in float64 throughout. transformers keeps these steps in
    float32 whatever the weights' dtype: both KDA delta rules (chunk_kimi_delta_attention,
    recurrent_kimi_delta_attention) cast q, k, v, g, beta to float32; the forget gate forms g with
    .float(); KimiLinearRMSNorm and KimiLinearRMSNormGated normalise in float32; the router
    (KimiLinearTopkRouter) computes its logits in float32. Each is run again from its source with
    those casts made float64 (model_kit.float64_twin); attention runs as sdpa, in the weights' dtype
    (eager's softmax would be float32)."""
    for name in ("chunk_kimi_delta_attention", "recurrent_kimi_delta_attention"):
        monkeypatch.setattr(hf_modeling, name, float64_twin(getattr(hf_modeling, name), hf_modeling))
    for cls in (hf_modeling.KimiLinearForgetGate, hf_modeling.KimiLinearRMSNorm, hf_modeling.KimiLinearRMSNormGated,
                hf_modeling.KimiLinearTopkRouter):
        monkeypatch.setattr(cls, "forward", float64_twin(inspect.unwrap(cls.forward), hf_modeling))


def hf_run(model, ids, dout, attention_mask=None):
    """Logits and the gradients of sum(logits * dout), in our tree (the selection bias, a buffer
    there, has none: zeros)."""
    model.zero_grad()
    mask = None if attention_mask is None else to_torch(attention_mask.astype(np.int64))
    logits = model(input_ids=to_torch(ids), attention_mask=mask).logits
    (logits * to_torch(dout)).sum().backward()
    grads = {k: to_numpy(p.grad) for k, p in model.named_parameters()}
    grads.update({k: np.zeros(b.shape) for k, b in model.named_buffers() if k.endswith("e_score_correction_bias")})
    return to_numpy(logits), ours_from_hf(grads, CONFIG)


# -- against Hugging Face --------------------------------------------------------------------------

@pytest.mark.parametrize("seed, B, T, padded", [(0, 2, 7, False), (1, 1, 20, False), (2, 2, 9, True),
                                                (3, 1, 70, False), (4, 2, 70, True)])
def test_matches_transformers_in_float64(seed, B, T, padded):
    """Logits and every parameter's gradient of sum(logits * dout) equal transformers' float64
    model (made float64 throughout by ``exact``); with left padding through attention_mask, on the
    positions that are not padding (transformers' padded rows read no key and are not compared).
    T = 70 runs two chunks of the chunked delta rule. The experts' choice is checked far from a tie
    first (test_deepseek_v3's module docstring)."""
    rng = np.random.default_rng(seed)
    model = hf_model(seed)
    tensors = {k: to_numpy(p) for k, p in model.named_parameters()}
    tensors.update({k: to_numpy(b) for k, b in model.named_buffers() if k.endswith("e_score_correction_bias")})
    params = ours_from_hf(tensors, CONFIG)
    ids = rng.integers(0, CONFIG.vocab_size, (B, T))
    ids[0, 1] = CONFIG.pad_token_id                                           # the pad row is read, never trained
    dout = rng.normal(size=(B, T, CONFIG.vocab_size))
    mask = np.ones((B, T), bool)
    if padded:
        mask[0, :3] = False                                                   # sequence 0: 3 pads on the left
        dout = dout * mask[:, :, None]                                        # no gradient from padded rows
    with pytest.MonkeyPatch.context() as monkeypatch:
        exact(monkeypatch)
        ref_logits, ref_grads = hf_run(model, ids, dout, mask if padded else None)
    logits, cache = kimi_linear_forward(ids, params, CONFIG, attn_mask=padding_attn_mask(~mask) if padded else None)
    assert choice_gaps(cache, params, CONFIG) > CHOICE_GAP
    grads = kimi_linear_backward(dout, cache)
    keep = mask[:, :, None]
    assert_close("kimi_linear.logits", np.where(keep, logits, 0), np.where(keep, ref_logits, 0), **tol64(ref_logits))
    assert not grads["wte"][CONFIG.pad_token_id].any()                        # nn.Embedding(padding_idx=pad)
    assert_tree_equals_transformers("kimi_linear", grads, ref_grads, tol64)


# -- the twin, finite differences --------------------------------------------------------------------

@st.composite
def small_models(draw):
    """(config, params, ids, dout): a drawn tiny Kimi Linear (1 to 3 layers of either mixer and
    either network), its params from init_kimi_linear_params moved off their initial values."""
    n_layer, n_head = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    config = KimiLinearConfig(
        vocab_size=draw(st.integers(2, 9)), block_size=80, n_layer=n_layer, n_head=n_head, n_kv_head=n_head,
        n_embd=draw(st.sampled_from([4, 8])), hidden=draw(st.integers(1, 6)), q_lora_rank=draw(st.none() | st.just(3)),
        kv_lora_rank=draw(st.integers(1, 4)), qk_nope_head_dim=draw(st.integers(1, 3)), qk_rope_head_dim=2,
        v_head_dim=draw(st.integers(1, 3)), moe_hidden=draw(st.integers(1, 3)), n_routed_experts=4, n_group=2,
        topk_group=1, num_experts_per_tok=2,
        layer_types=tuple(draw(st.lists(st.sampled_from(["linear_attention", "full_attention"]),
                                        min_size=n_layer, max_size=n_layer))),
        mlp_layer_types=tuple(draw(st.lists(st.sampled_from(["dense", "sparse"]), min_size=n_layer,
                                            max_size=n_layer))),
        linear_num_heads=draw(st.integers(1, 2)), linear_head_dim=draw(st.integers(1, 4)),
        conv_kernel=draw(st.integers(2, 4)), tie_weights=draw(st.booleans()), pad_token_id=draw(st.none() | st.just(1)))
    return drawn_hybrid_case(draw, config, init_kimi_linear_params)


@pytest.mark.twin_parity
@settings(max_examples=15, deadline=None)
@given(case=small_models(), padded=st.booleans())
def test_matches_twin_and_autograd(case, padded):
    """float64, with and without left padding: model_kit.assert_hybrid_matches_twin, on cases whose
    router keeps its choice under rounding."""
    config, params, ids, dout = case
    assert_hybrid_matches_twin("kimi_linear", kimi_linear_forward, kimi_linear_backward, tw.kimi_linear, config, params,
                               ids, dout, padded, keep=lambda cache: choice_gaps(cache, params, config) > CHOICE_GAP)

H = 2e-4


@pytest.mark.parametrize("path", ["blocks.0.attn.A_log", "blocks.0.attn.dt_bias", "blocks.0.attn.f_b_proj.w",
                                  "blocks.0.attn.conv1d.w", "blocks.1.attn.kv_a.w", "blocks.1.attn.q_b.w",
                                  "blocks.1.mlp.experts.up.w", "blocks.1.mlp.router.w", "norm.w", "wte"])
def test_gradients_match_finite_differences(path):
    """float64 five-point differences (helpers.numerical_grad) of a few leaves, one of each kind:
    a KDA layer then an MLA layer with the experts, every token's choice far from a tie."""
    config = KimiLinearConfig(vocab_size=7, block_size=16, n_layer=2, n_head=2, n_kv_head=2, n_embd=8, hidden=6,
                              q_lora_rank=3, kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=3,
                              moe_hidden=3, n_routed_experts=4, n_group=2, topk_group=1, num_experts_per_tok=2,
                              layer_types=("linear_attention", "full_attention"), mlp_layer_types=("dense", "sparse"),
                              linear_num_heads=2, linear_head_dim=3, conv_kernel=3)
    rng = np.random.default_rng(11)
    params = moved_off_init(init_kimi_linear_params(config, rng, np.float64), rng)
    ids = rng.integers(0, 7, (2, 6))
    dout = rng.normal(size=(2, 6, 7))
    logits, cache = kimi_linear_forward(ids, params, config)
    assert choice_gaps(cache, params, config) > 1e-2
    grads = kimi_linear_backward(dout, cache)
    assert_leaf_matches_finite_differences("kimi_linear", kimi_linear_forward, grads, config, params, ids, dout, path,
                                           H)


# -- refusals ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("changes, message", [
    ({"layer_types": ("linear_attention",)}, "layer_types must list n_layer = 2 entries"),
    ({"layer_types": ("linear_attention", "sliding")}, "layer_types: each entry must be one of .* got 'sliding'"),
    ({"mlp_layer_types": ("dense", "moe")}, "mlp_layer_types: each entry must be one of .* got 'moe'"),
    ({"linear_num_heads": 0}, "linear_num_heads"),
    ({"linear_head_dim": 0}, "linear_head_dim"),
    ({"conv_kernel": 0}, "conv_kernel"),
    ({"pad_token_id": 9}, "pad_token_id = 9 must be below vocab_size = 9"),
    ({"pad_token_id": -1}, "pad_token_id"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling must be None"),
])
def test_bad_config_is_refused_naming_the_field(changes, message):
    with pytest.raises(ValueError, match=message):
        KimiLinearConfig(**{"vocab_size": 9, "n_layer": 2, **changes})


def test_smallest_sizes_are_accepted_and_run():
    """Each KDA size at its smallest, one head of width 1 and a convolution of one tap (no state to
    carry), and the pad id 0: accepted; a KDA layer then an MLA layer run, finite, and decoding the
    prompt from an empty cache gives the forward's logits."""
    config = KimiLinearConfig(vocab_size=9, n_layer=2, linear_num_heads=1, linear_head_dim=1, conv_kernel=1,
                              pad_token_id=0, layer_types=("linear_attention", "full_attention"))
    params = init_kimi_linear_params(config, np.random.default_rng(0), np.float64)
    ids = np.array([[0, 3, 5]])
    logits, _ = kimi_linear_forward(ids, params, config)
    kv_cache = kimi_linear_kv_cache(config, 1, np.float64)
    step, _ = kimi_linear_forward(ids, params, config, kv_cache=kv_cache)
    assert np.isfinite(logits).all()
    # float64, a prompt decoded at once from an empty cache: the same sums in another order (MLA absorbed).
    np.testing.assert_allclose(step, logits, rtol=1e-9, atol=1e-12)


def test_another_cache_is_refused():
    config = KimiLinearConfig(n_layer=2)
    params = init_kimi_linear_params(config, np.random.default_rng(0), np.float64)
    ids = np.zeros((1, 3), np.int64)
    with pytest.raises(TypeError, match="kv_cache must be a KimiLinearCache"):
        kimi_linear_forward(ids, params, config, kv_cache=object())
    assert kimi_linear_kv_cache(config, 1).n_layer == 2


# -- decoding ------------------------------------------------------------------------------------------

@settings(max_examples=10, deadline=None)
@given(case=small_models(), data=st.data(), padded=st.booleans())
def test_cached_decoding_equals_the_full_forward(case, data, padded):
    """A prefill of T1 tokens, then one token at a time from kimi_linear_kv_cache (MLA absorbed from
    its latents, KDA's recurrence from its state), gives the full forward's logits: float64 to
    rounding (rtol and atol 1e-10 of the largest logit), the experts' choice far from a tie; with
    left padding inside the prompt too (padded rows see no key and are not compared)."""
    config, params, ids, _ = case
    B, T = ids.shape
    assume(T > 1)
    T1 = data.draw(st.integers(1, T - 1))
    pad = np.zeros((B, T), bool)
    if padded:
        pad[0, : min(T1, 3)] = True                                           # left padding inside the prompt
    mask = padding_attn_mask(pad) if padded else None
    full, cache = kimi_linear_forward(ids, params, config, attn_mask=mask)
    assume(choice_gaps(cache, params, config) > CHOICE_GAP)
    kv = kimi_linear_kv_cache(config, B, np.float64, max_len=T)
    logits = [kimi_linear_forward(ids[:, :T1], params, config, kv_cache=kv, for_backward=False,
                                  attn_mask=None if mask is None else mask[..., :T1])[0]]
    for t in range(T1, T):
        logits.append(kimi_linear_forward(ids[:, t:t + 1], params, config, kv_cache=kv, for_backward=False,
                                          attn_mask=None if mask is None else mask[..., :t + 1])[0])
    assert kv.length == T
    keep = ~pad[:, :, None]
    assert_close("kimi_linear.decoding", np.where(keep, np.concatenate(logits, axis=1), 0), np.where(keep, full, 0),
                 rtol=1e-10, atol=1e-10 * float(np.abs(full).max()))


def test_cache_bytes_per_token():
    """The latents of an MLA layer grow by (rkv + dr) numbers a token; a KDA layer's state is
    3 nh d (K - 1) + nh d^2 numbers whatever the length."""
    kv = kimi_linear_kv_cache(CONFIG, 1, np.float64, max_len=10)
    assert kv.bytes_per_token == (CONFIG.kv_lora_rank + CONFIG.qk_rope_head_dim) * 8
    nh, d, K = CONFIG.linear_num_heads, CONFIG.linear_head_dim, CONFIG.conv_kernel
    assert kv.state_nbytes == 3 * (3 * nh * d * (K - 1) + nh * d * d) * 8



def test_a_model_of_kda_layers_only_keeps_nothing_per_token():
    """Without an MLA layer the cache's latent part is empty, keys and values alike: no byte a
    token, only the KDA states."""
    config = KimiLinearConfig(n_layer=2, layer_types=("linear_attention",) * 2)
    kv = kimi_linear_kv_cache(config, 2, np.float64, max_len=10)
    assert kv.buffer_k.shape[0] == kv.buffer_v.shape[0] == 0
    assert kv.bytes_per_token == 0
    nh, d, K = config.linear_num_heads, config.linear_head_dim, config.conv_kernel
    assert kv.state_nbytes == 2 * 2 * (3 * nh * d * (K - 1) + nh * d * d) * 8


@pytest.mark.parametrize("n_layer", [1, 4, 5, 9, 12])
def test_default_layer_types_are_transformers(n_layer):
    """Without layer_types, MLA on layers 4, 8, ... (0-based) and KDA elsewhere, as
    transformers.KimiLinearConfig lays them out; the first first_k_dense_replace networks dense."""
    ours = KimiLinearConfig(n_layer=n_layer, first_k_dense_replace=2)
    theirs = transformers.KimiLinearConfig(num_hidden_layers=n_layer, first_k_dense_replace=2)
    assert list(ours.layer_types) == list(theirs.layer_types)
    assert list(ours.mlp_layer_types) == list(theirs.mlp_layer_types)


def test_conv_kernel_default_is_transformers():
    """The convolution's taps default to transformers.KimiLinearConfig's linear_conv_kernel_dim (the
    released models' 4), where the other sizes default to a toy's."""
    assert KimiLinearConfig().conv_kernel == transformers.KimiLinearConfig().linear_conv_kernel_dim == 4


def test_projections_initialisation():
    """Hugging Face's initialisation of KDA's projections and convolution: N(0, 0.02^2), 21504
    draws here (helpers.assert_normal_draws); its gated norm at 1 (the forget gate's draws are the
    next test's)."""
    config = KimiLinearConfig(n_layer=1, layer_types=("linear_attention",), n_embd=64, linear_num_heads=4,
                              linear_head_dim=16)
    attn = init_kimi_linear_params(config, np.random.default_rng(0), np.float64)["blocks"]["0"]["attn"]
    drawn = {path: leaf for path, leaf in tree_leaves(attn) if path.split(".")[0] not in ("A_log", "dt_bias", "o_norm")}
    assert len(drawn) == 10, sorted(drawn)
    assert_normal_draws("KDA's projections", np.concatenate([w.ravel() for w in drawn.values()]), 0.02)
    assert np.all(attn["o_norm"]["w"] == 1)


def test_forget_gate_initialisation():
    """Hugging Face's initialisation of KDA's forget gate: exp(A_log) ~ U(1, 16) per head and
    softplus(dt_bias) = exp(U(log 1e-3, log 1e-1)) per channel. 4096 heads of one channel: every
    draw in its range, each range's top reached within 1% (a narrower range misses it with
    probability below 1e-17), and each mean within 5 standard errors of its expectation."""
    config = KimiLinearConfig(n_layer=1, layer_types=("linear_attention",), linear_num_heads=4096,
                              linear_head_dim=1)
    attn = init_kimi_linear_params(config, np.random.default_rng(0), np.float64)["blocks"]["0"]["attn"]
    a = np.exp(attn["A_log"])                                       # U(1, 16)
    assert attn["A_log"].dtype == np.float64 and a.shape == (4096,)
    assert a.min() >= 1 and a.max() <= 16 and a.max() > 15.85, (a.min(), a.max())
    assert abs(a.mean() - 8.5) < 5 * (15 / np.sqrt(12)) / np.sqrt(a.size), a.mean()
    log_dt = np.log(np.logaddexp(0, attn["dt_bias"]))               # log softplus(dt_bias) ~ U(log 1e-3, log 1e-1)
    lo, hi = np.log(1e-3), np.log(1e-1)
    assert log_dt.min() >= lo - 1e-9 and log_dt.max() <= hi + 1e-9 and log_dt.max() > hi - 0.01 * (hi - lo)
    assert abs(log_dt.mean() - (lo + hi) / 2) < 5 * ((hi - lo) / np.sqrt(12)) / np.sqrt(log_dt.size)

# -- folders saved by transformers -------------------------------------------------------------------

def test_checkpoint_loads_as_the_models_weights(tmp_path):
    """save_pretrained writes the released checkpoints' layout (block_sparse_moe, experts' w1 w3 w2,
    three convolutions); attn_cli.hf reads it back as the config and the very weights the
    module's parameters give (ours_from_hf)."""
    model = hf_model(0)
    tensors = {k: to_numpy(p) for k, p in model.named_parameters()}
    tensors.update({k: to_numpy(b) for k, b in model.named_buffers() if k.endswith("e_score_correction_bias")})
    assert_checkpoint_reads_as(save(model, tmp_path), "kimi_linear", CONFIG, ours_from_hf(tensors, CONFIG))


@pytest.mark.parametrize("cache", [[], ["--no-cache"]])
def test_generate_hf_ids_equal_transformers_generate(tmp_path, capsys, cache):
    """``numpy-attn generate --hf DIR --ids``, with the cache (MLA's latents, KDA's state) and
    without: the greedy ids of transformers' generate (float32, use_cache=True), 10 tokens past a
    5-token prompt."""
    assert_generate_hf_is_transformers(hf_model(0, torch.float32), tmp_path, capsys, cache, "Kimi Linear")


# -- float16 and bfloat16: FlashAttention's error rule against transformers -----------------------------

@pytest.mark.error_budget
@pytest.mark.parametrize("dtype, seed", hybrid_budget_cases({}))
def test_low_precision_meets_the_error_budget(dtype, seed):
    """Ours and the twin in float16 and bfloat16 (Kimi Delta Attention computing in float32 and
    rounding once) against KimiLinearForCausalLM in float64 on the same rounded weights and selection
    bias, within twice the error of KimiLinearForCausalLM run in the low dtype:
    model_kit.assert_hybrid_meets_error_budget."""
    assert_hybrid_meets_error_budget("kimi_linear", dtype, hf_model(seed), lambda t: ours_from_hf(t, CONFIG),
                                     lambda model, monkeypatch: exact(monkeypatch) or model, kimi_linear_forward,
                                     kimi_linear_backward, tw.kimi_linear, CONFIG, seed)
