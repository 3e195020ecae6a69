"""Parity tests for numpy_attn/llama4.py and torch_attn/llama4.py, against Hugging Face's
Llama4ForCausalLM (the text model).

A random Llama4ForCausalLM (model_kit.randomise) with its weights copied into our params: logits
and every parameter's gradient against transformers' autograd, in float64 (with transformers'
float32 steps moved to float64, ``exact_hf_llama4`` says which) and float32; the NumPy backward
against the twin's autograd and against finite differences; cached decoding across chunk
boundaries against the full forward; bad configs refused with the field named. The model is
small and has every kind of layer: four layers, the third a NoPE layer (global attention, no
rotation, a temperature on q that grows every floor_scale = 2 tokens), the others chunked in
chunks of 3 (T = 8 spans three chunks) with q and k normed; the second and fourth a mixture of 3
experts of which each token takes 2, with a shared expert; the others a dense SwiGLU network of
its own width; 4 query heads on 2 key/value heads; llama3 rope scaling; a pad id inside the
vocabulary, present in the ids (its embedding row gets no gradient). Transformers runs its eager
attention.
"""

import types

import numpy as np
import pytest
import torch
import transformers
from hypothesis import example, given, settings
from hypothesis import strategies as st
from transformers.models.llama4 import modeling_llama4

import numpy_attn.llama4
import torch_attn.llama4 as tw
from attn_cli.hf import load_checkpoint
from numpy_attn._tree import leaves, tree_map
from numpy_attn.llama4 import (
    Llama4Config,
    chunked_causal_mask,
    init_llama4_params,
    leading_padding,
    llama4_backward,
    llama4_forward,
    llama4_kv_cache,
)
from numpy_attn.rope import rope_frequencies
from parity_tests import helpers
from parity_tests import strategies as S
from parity_tests.helpers import assert_close, to_numpy, to_torch
from parity_tests.model_kit import (
    assert_changed_config_refused,
    assert_generate_hf_is_transformers,
    assert_options_are_keyword_only,
    compare,
    llama_rstds,
    next_token_dlogits,
    randomise,
    save,
)

CHUNK = 3
PAD = 5
LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 4}
TORCH_DTYPES = {np.float64: torch.float64, np.float32: torch.float32}
# Ours -> Hugging Face's names of a block's two norms.
NORMS = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}


def hf_llama4(dtype):
    """A random transformers Llama4ForCausalLM (see the module docstring for its sizes), every
    parameter far from its initialisation (model_kit.randomise)."""
    config = transformers.Llama4TextConfig(
        vocab_size=13, hidden_size=16, intermediate_size=12, intermediate_size_mlp=20, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=3, num_experts_per_tok=2,
        interleave_moe_layer_step=2, no_rope_layers=[1, 1, 0, 1], attention_chunk_size=CHUNK, floor_scale=2,
        attn_scale=0.5, rope_parameters=dict(LLAMA3), max_position_embeddings=32, rms_norm_eps=1e-5,
        pad_token_id=PAD, bos_token_id=None, eos_token_id=None, attn_implementation="eager")
    return randomise(transformers.Llama4ForCausalLM(config), 0).to(TORCH_DTYPES[dtype]).eval()


def from_hf(model, dtype):
    """(Llama4Config, params) holding ``model``'s config and weights: nn.Linear's (C_out, C_in)
    transposed, each expert's gate_up_proj (C, 2H) split into gate (its first H columns) and up."""
    c = model.config
    rope = dict(c.rope_parameters)
    theta = rope.pop("rope_theta")
    config = Llama4Config(
        vocab_size=c.vocab_size, block_size=c.max_position_embeddings, n_layer=c.num_hidden_layers,
        n_head=c.num_attention_heads, n_kv_head=c.num_key_value_heads, n_embd=c.hidden_size, head_dim=c.head_dim,
        hidden=c.intermediate_size, rms_eps=c.rms_norm_eps, rope_theta=theta,
        rope_scaling=None if rope["rope_type"] == "default" else rope, attn_bias=c.attention_bias,
        tie_weights=c.tie_word_embeddings, hidden_mlp=c.intermediate_size_mlp, n_experts=c.num_local_experts,
        experts_per_token=c.num_experts_per_tok, moe_layers=tuple(c.moe_layers),
        interleave_moe_layer_step=c.interleave_moe_layer_step, no_rope_layers=tuple(c.no_rope_layers),
        no_rope_layer_interval=c.no_rope_layer_interval,
        attention_chunk_size=c.attention_chunk_size, use_qk_norm=c.use_qk_norm,
        attn_temperature_tuning=c.attn_temperature_tuning, floor_scale=c.floor_scale, attn_scale=c.attn_scale,
        pad_token_id=c.pad_token_id)
    sd = {k: v.detach().numpy().astype(dtype) for k, v in model.state_dict().items()}

    def linear(name):
        return {"w": sd[f"{name}.weight"].T.copy()}

    def swiglu(prefix):
        return {ours: linear(f"{prefix}{ours}_proj") for ours in ("gate", "up", "down")}

    params = {"wte": sd["model.embed_tokens.weight"], "blocks": {}, "norm": {"w": sd["model.norm.weight"]},
              "head": {"w": sd["lm_head.weight"].T.copy()}}
    H = c.intermediate_size
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        block = {ours: {"w": sd[f"{p}{theirs}.weight"]} for ours, theirs in NORMS.items()}
        block["attn"] = {name: linear(f"{p}self_attn.{name}_proj") for name in "qkvo"}
        f = f"{p}feed_forward."
        if config.is_moe(i):
            gate_up = sd[f"{f}experts.gate_up_proj"]                                     # (E, C, 2H)
            block["mlp"] = {"router": linear(f"{f}router"),
                            "experts": {"gate": {"w": gate_up[..., :H].copy()}, "up": {"w": gate_up[..., H:].copy()},
                                        "down": {"w": sd[f"{f}experts.down_proj"]}},
                            "shared": swiglu(f"{f}shared_expert.")}
        else:
            block["mlp"] = swiglu(f)
        params["blocks"][str(i)] = block
    return config, params


def to_hf_names(grads, config):
    """Our gradient tree under Hugging Face's parameter names, linear weights transposed, the
    experts' gate and up side by side in gate_up_proj."""
    out = {"model.embed_tokens.weight": grads["wte"], "model.norm.weight": grads["norm"]["w"],
           "lm_head.weight": grads["head"]["w"].T}

    def swiglu(prefix, g):
        for name in ("gate", "up", "down"):
            out[f"{prefix}{name}_proj.weight"] = g[name]["w"].T

    for i, block in grads["blocks"].items():
        p = f"model.layers.{i}."
        for norm, hf_norm in NORMS.items():
            out[f"{p}{hf_norm}.weight"] = block[norm]["w"]
        for name in "qkvo":
            out[f"{p}self_attn.{name}_proj.weight"] = block["attn"][name]["w"].T
        f, mlp = f"{p}feed_forward.", block["mlp"]
        if config.is_moe(int(i)):
            experts = mlp["experts"]
            out[f"{f}experts.gate_up_proj"] = np.concatenate([experts["gate"]["w"], experts["up"]["w"]], axis=-1)
            out[f"{f}experts.down_proj"] = experts["down"]["w"]
            out[f"{f}router.weight"] = mlp["router"]["w"].T
            swiglu(f"{f}shared_expert.", mlp["shared"])
        else:
            swiglu(f, mlp)
    return out


def exact_hf_llama4(model, config, monkeypatch):
    """Make a float64 Llama4ForCausalLM compute in float64 throughout. transformers keeps these in
    float32 whatever the model's dtype (sound for bfloat16 models): its RMS norms and the
    weightless norm of q and k (``.float()``), the rotary angles and frequencies, the rotation itself
    (``apply_rotary_emb`` views q and k as complex64), the router's sigmoid, and the NoPE layers'
    temperature (log1p of float32 positions). Each is swapped for the same formula in float64 (the
    frequencies rope_frequencies', which test_rope.py checks against transformers' for every
    scaling; the rotation keeps transformers' complex product of adjacent channel pairs), so every
    other part (projections and their layout, grouped-query heads, the chunked and causal masks,
    attention, router choice, experts, shared expert, residuals, head) is compared at float64
    precision. The float32 comparison runs the model unchanged."""
    inv_freq = torch.from_numpy(rope_frequencies(config.hs, config.rope_theta, config.rope_scaling))

    def rms_norm(self, h):
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps) * getattr(self, "weight", 1.0)

    def rotary(self, x, position_ids):                   # (B, T, hs/2) complex128
        angles = position_ids[..., None].to(torch.float64) * inv_freq
        return torch.polar(torch.ones_like(angles), angles)

    def apply_rotary_emb(xq, xk, freqs_cis):             # (B, T, heads, hs), pairs (2j, 2j+1) as complex numbers
        def turn(x):
            z = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
            return torch.view_as_real(z * freqs_cis[:, :, None, :]).flatten(3)
        return turn(xq), turn(xk)

    def router(self, h):
        logits = torch.nn.functional.linear(h, self.weight)                      # (N, E)
        top, indices = torch.topk(logits, self.top_k, dim=1)
        scores = torch.full_like(logits, float("-inf")).scatter_(1, indices, top)
        return torch.sigmoid(scores), logits

    # The temperature: transformers' module-level torch with log1p taken in float64.
    exact_torch = types.SimpleNamespace(**{name: getattr(torch, name) for name in dir(torch)
                                           if not name.startswith("__")})
    exact_torch.log1p = lambda x: torch.log1p(x.to(torch.float64))
    monkeypatch.setattr(modeling_llama4, "torch", exact_torch)
    monkeypatch.setattr(modeling_llama4, "apply_rotary_emb", apply_rotary_emb)
    swaps = {modeling_llama4.Llama4TextRMSNorm: rms_norm, modeling_llama4.Llama4TextL2Norm: rms_norm,
             modeling_llama4.Llama4TextRotaryEmbedding: rotary, modeling_llama4.Llama4Router: router}
    for module in model.modules():
        forward = swaps.get(type(module))
        if forward is not None:
            module.forward = types.MethodType(forward, module)
    return model


def _tol(cache, dtype):
    """RMS norms amplify rounding as layer norms do (see layer_norm_tol)."""
    return helpers.layer_norm_tol(llama_rstds(cache), dtype)


def small_config(**changes):
    """A small Llama4Config with every kind of layer (as the module docstring's, smaller)."""
    sizes = dict(vocab_size=11, block_size=12, n_layer=4, n_head=4, n_kv_head=2, n_embd=8, head_dim=4, hidden=6,
                 hidden_mlp=5, n_experts=3, experts_per_token=2, interleave_moe_layer_step=2,
                 no_rope_layers=(1, 1, 0, 1), attention_chunk_size=CHUNK, floor_scale=2, attn_scale=0.5,
                 pad_token_id=2, rope_scaling={k: v for k, v in LLAMA3.items() if k != "rope_theta"})
    return Llama4Config(**{**sizes, **changes})


def moved_params(config, rng, dtype=np.float64):
    """init_llama4_params moved by U(-0.5, 0.5), so that norms are not at 1 and every weight matters."""
    return tree_map(lambda p: (p + rng.uniform(-0.5, 0.5, p.shape)).astype(dtype),
                    init_llama4_params(config, rng, dtype))


# -- against transformers ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_logits_and_every_gradient_match_transformers(monkeypatch, dtype):
    """Logits, and every gradient of the next-token loss (our backward and the twin's autograd),
    against transformers' autograd, with test_hf.py's tolerances (model_kit.compare: float64
    rtol = atol = 1e-10 of the largest value, a few hundred float64 roundings through four layers;
    float32 layer_norm_tol). T = 8 spans three chunks of 3; the pad id appears in the ids and its
    embedding row gets a zero gradient from the embedding (the head still gives it one)."""
    model = hf_llama4(dtype)
    config, params = from_hf(model, dtype)
    assert config.moe_layers == (1, 3) and config.no_rope_layers == (1, 1, 0, 1), config
    if dtype == np.float64:
        model = exact_hf_llama4(model, config, monkeypatch)
    ids = np.array([[3, PAD, 1, 4, 1, 5, 9, 2], [6, 5, 3, 5, 8, 9, 7, 9]])
    logits, cache = llama4_forward(ids, params, config)
    dlogits = next_token_dlogits(logits, ids)
    model.zero_grad()
    hf_logits = model(input_ids=to_torch(ids)).logits
    (hf_logits * to_torch(dlogits)).sum().backward()
    theirs = {k: to_numpy(p.grad) for k, p in model.named_parameters()}
    rstds = llama_rstds(cache)
    compare("llama4 logits", logits, to_numpy(hf_logits), dtype, rstds)
    tparams = helpers.tree_to_torch(params, requires_grad=True)
    (tw.llama4(to_torch(ids), tparams, config) * to_torch(dlogits)).sum().backward()
    scale = max(float(np.abs(g).max()) for g in theirs.values())
    for source, grads in (("twin", tree_map(lambda t: to_numpy(t.grad), tparams)),
                          ("backward", llama4_backward(dlogits, cache))):
        grads = to_hf_names(grads, config)
        assert grads.keys() == theirs.keys(), (source, sorted(set(grads) ^ set(theirs)))
        for hf_name, g in theirs.items():
            compare(f"llama4 d{hf_name} ({source})", grads[hf_name], g, dtype, rstds, scale)
        # Untied head: wte's gradient is the embedding's alone, zero on the pad row as transformers'.
        assert np.all(grads["model.embed_tokens.weight"][PAD] == 0), source
    assert np.all(theirs["model.embed_tokens.weight"][PAD] == 0)



@pytest.mark.parametrize("shift", [True, False])
def test_a_left_padded_batch_matches_transformers(monkeypatch, shift):
    """A left-padded batch (two pads before a row's six tokens; the mask hides them): transformers
    counts each sequence's chunks from its first real token, and so do we (leading_padding shifts
    chunked_causal_mask). Logits at the real positions and every gradient (dlogits zero at the pads)
    equal transformers' in float64, with compare's tolerance as above. With the chunks counted from
    position 0 instead (shift=False: the padding passed to the chunks as 0) the padded row's chunks
    cut elsewhere (two pads and chunks of 3) and the logits differ: the comparison can fail."""
    model = hf_llama4(np.float64)
    config, params = from_hf(model, np.float64)
    model = exact_hf_llama4(model, config, monkeypatch)
    ids = np.array([[PAD, PAD, 3, 1, 4, 1, 5, 9], [6, 5, 3, 5, 8, 9, 7, 9]])
    keep = np.ones(ids.shape, bool)
    keep[0, :2] = False                                                       # (B, T) the real tokens
    if not shift:
        monkeypatch.setattr("numpy_attn.llama4.leading_padding", lambda mask: np.zeros(mask.shape[0], np.int64))
    logits, cache = llama4_forward(ids, params, config, attn_mask=keep[:, None, None, :])
    dlogits = next_token_dlogits(logits, ids) * keep[..., None]               # no loss at the pads
    model.zero_grad()
    hf_logits = model(input_ids=to_torch(ids), attention_mask=to_torch(keep.astype(np.int64))).logits
    (hf_logits * to_torch(dlogits)).sum().backward()
    theirs = {k: to_numpy(p.grad) for k, p in model.named_parameters()}
    if not shift:   # far outside compare's tolerance (1e-10 of the largest logit), not recorded as a result
        assert np.abs(logits[keep] - to_numpy(hf_logits)[keep]).max() > 1e-3
        return
    compare("llama4 left-padded logits", logits[keep], to_numpy(hf_logits)[keep], np.float64)
    grads = to_hf_names(llama4_backward(dlogits, cache), config)
    scale = max(float(np.abs(g).max()) for g in theirs.values())
    for hf_name, g in theirs.items():
        compare(f"llama4 left-padded d{hf_name}", grads[hf_name], g, np.float64, (), scale)
    tparams = helpers.tree_to_torch(params, requires_grad=True)
    tmask = to_torch(keep[:, None, None, :])
    assert_close("llama4 left-padded twin logits", to_numpy(tw.llama4(to_torch(ids), tparams, config,
                                                                        attn_mask=tmask))[keep], logits[keep])


def test_every_part_changes_the_logits(monkeypatch):
    """The parts Llama 4 adds each move transformers' logits, so the comparison above tests them:
    the chunk (a chunk of 8 sees every key), the NoPE layer's temperature, the q and k norm."""
    model = hf_llama4(np.float64)
    config, params = from_hf(model, np.float64)
    ids = np.array([[3, PAD, 1, 4, 1, 5, 9, 2]])
    base = llama4_forward(ids, params, config)[0]
    for change in ({"attention_chunk_size": 8}, {"attn_temperature_tuning": False}, {"use_qk_norm": False}):
        changed = Llama4Config(**{**config.__dict__, **change})
        assert np.abs(llama4_forward(ids, params, changed)[0] - base).max() > 1e-3, change


# -- the NumPy model against its twin ------------------------------------------------------------------

@pytest.mark.twin_parity
@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_layer=st.integers(1, 4), T=st.integers(1, 9),
       dtype=st.sampled_from([np.float64, np.float32]), k=st.integers(1, 3), chunk=st.integers(1, 4),
       qk_norm=st.booleans())
@example(seed=694, n_layer=4, T=9, dtype=np.float32, k=1, chunk=1, qk_norm=False)
def test_forward_and_backward_match_twin(seed, n_layer, T, dtype, k, chunk, qk_norm):
    """Logits against the twin's, every gradient (labelled by path) against autograd's, on one to
    four layers (chunked, chunked and MoE, NoPE, chunked and MoE), 1 to 3 of 3 experts per token,
    chunks of 1 to 4, with and without the q and k norm."""
    config = small_config(n_layer=n_layer, no_rope_layers=(1, 1, 0, 1)[:n_layer], experts_per_token=k,
                          attention_chunk_size=chunk, use_qk_norm=qk_norm)
    rng = np.random.default_rng(seed)
    params = moved_params(config, rng, dtype)
    ids = rng.integers(0, config.vocab_size, (2, T))
    dout = rng.normal(size=(2, T, config.vocab_size)).astype(dtype)
    forward = lambda params: llama4_forward(ids, params, config)                  # noqa: E731
    twin = lambda params: tw.llama4(to_torch(ids), params, config)                # noqa: E731
    helpers.assert_logits_match_twin("llama4", forward, twin, params, dout, _tol)
    # atol in units of the largest gradient, as test_block's _grad_tol (its docstring: an entry's
    # rounding follows the terms that made it): a drawn float32 case had down.w[2, 0] = 0.078, among
    # entries near 7, off by 8.4e-5, 1.9 times the unscaled atol.
    largest = max([1.0] + [float(np.abs(g).max(initial=0.0))
                           for _, g in helpers.tree_leaves(llama4_backward(dout, forward(params)[1]))])
    grad_tol = lambda cache, dtype: {**_tol(cache, dtype), "atol": _tol(cache, dtype)["atol"] * largest}  # noqa: E731
    helpers.assert_grads_match_autograd("llama4", forward, llama4_backward, twin, params, dout, grad_tol)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_backward_matches_finite_differences(seed):
    """One directional derivative of sum(logits * dout) along a random direction in every
    parameter at once, float64, against our backward (FD_TOL, see directional_derivative). The ids
    avoid the pad id: its embedding row's zero gradient is a rule (transformers' padding_idx), not
    the derivative."""
    config = small_config()
    rng = np.random.default_rng(seed)
    params = moved_params(config, rng)
    ids = rng.integers(0, config.vocab_size - 1, (2, 8))
    ids[ids >= config.pad_token_id] += 1                  # every id but the pad id
    dout = rng.normal(size=(2, 8, config.vocab_size))
    helpers.assert_backward_matches_finite_differences(
        "llama4", lambda p: llama4_forward(ids, p, config), llama4_backward, params, dout, seed, llama_rstds)


# -- the chunked mask ----------------------------------------------------------------------------------

@given(T=st.integers(1, 9), past=st.integers(0, 9), chunk=st.integers(1, 5))
def test_chunked_mask_by_hand(T, past, chunk):
    """Query at p sees key at s exactly when s <= p and both lie in the same chunk [m c, (m + 1) c);
    a cache's held keys (from ``first``) give the same rows as the full mask's; the twin agrees."""
    S = past + T
    full = chunked_causal_mask(T, S, chunk)
    for t in range(T):
        p = past + t
        assert full[t].tolist() == [s <= p and s // chunk == p // chunk for s in range(S)], (t, p)
    first = max(0, past - chunk)                       # a cache holding its last chunk keys
    held = chunked_causal_mask(T, S - first, chunk, first)
    assert np.array_equal(held, full[:, first:]) and not full[:, :first].any()
    assert np.array_equal(to_numpy(tw.chunked_causal_mask(T, S - first, chunk, first)), held)


# -- cached decoding -----------------------------------------------------------------------------------

@pytest.mark.parametrize("sizes", [[5] + [1] * 7, [6] + [1] * 6, [1] * 12, [2, 7, 3]],
                         ids=["prefill inside a chunk", "prefill on a chunk boundary", "one by one", "steps"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cached_decoding_equals_full_forward(dtype, sizes):
    """Decoding 12 tokens in steps of ``sizes`` (a prefill of 5 ending inside the second chunk of
    3, or of 6 ending on its boundary, then one at a time; one at a time; steps longer than a
    chunk): every position's logits equal the full forward's (only the order of some sums differs:
    reorder_tol), the twin decodes the same, and the chunked layers hold their last chunk only
    while the NoPE layer holds every token."""
    config = small_config()
    rng = np.random.default_rng(7)
    params = moved_params(config, rng, dtype)
    ids = rng.integers(0, config.vocab_size, (2, sum(sizes)))
    full, full_cache = llama4_forward(ids, params, config)
    held = []                                            # what each layer holds after each step

    def forward(chunk, params, config, kv_cache):
        out = llama4_forward(chunk, params, config, kv_cache=kv_cache)
        held.append([kv_cache.layer(i).held for i in range(config.n_layer)])
        return out

    cached, _ = helpers.decode_with_cache(forward, llama4_kv_cache, config, params, ids, sizes)
    assert_close("llama4 decode.logits vs full forward", cached, full,
                 **helpers.reorder_tol(llama_rstds(full_cache), dtype))
    assert held == [[min(n, CHUNK)] * 2 + [n, min(n, CHUNK)] for n in np.cumsum(sizes)], held
    twin, _ = helpers.twin_decode_with_cache(tw.llama4, tw.llama4_kv_cache, config, params, ids, sizes)
    tol = _tol(full_cache, dtype)
    tol["atol"] *= max(1.0, float(np.abs(full).max()))   # absolute errors grow with the logits, as in compare
    assert_close("llama4 decode twin.logits", twin, cached, **tol)


def test_leading_padding_by_hand():
    """Keys no query sees at the start of each sequence, both twins: 0, 2, and all 4 of a
    sequence whose every key is hidden (its count is S, not B = 3); None without a mask."""
    mask = np.ones((3, 1, 2, 4), bool)          # (B, nh, T, S)
    mask[1, :, :, :2] = False
    mask[2] = False
    assert leading_padding(mask).tolist() == [0, 2, 4]
    assert tw.leading_padding(to_torch(mask)).tolist() == [0, 2, 4]
    assert leading_padding(None) is None and tw.leading_padding(None) is None


def test_attn_mask_with_a_bounded_cache_is_refused():
    config = small_config()
    params = init_llama4_params(config, np.random.default_rng(0), np.float64)
    with pytest.raises(ValueError, match="llama4_forward: an attn_mask with a kv_cache"):
        llama4_forward(np.zeros((1, 3), np.int64), params, config, attn_mask=np.ones((1, 1, 3, 3), bool),
                       kv_cache=llama4_kv_cache(config, 1, np.float64))


# -- the config ----------------------------------------------------------------------------------------

def test_default_layers_are_transformers():
    """Without moe_layers and no_rope_layers, the MoE and NoPE layers are transformers' defaults."""
    for n_layer, step, interval in ((1, 1, 4), (5, 2, 4), (8, 3, 2)):
        ours = Llama4Config(n_layer=n_layer, interleave_moe_layer_step=step, no_rope_layer_interval=interval)
        theirs = transformers.Llama4TextConfig(num_hidden_layers=n_layer, interleave_moe_layer_step=step,
                                               no_rope_layer_interval=interval)
        assert ours.moe_layers == tuple(theirs.moe_layers) and ours.no_rope_layers == tuple(theirs.no_rope_layers)
        chunked = ["chunked_attention" if ours.window(i) else "full_attention" for i in range(n_layer)]
        assert chunked == theirs.layer_types


def test_options_are_keyword_only():
    """The model's, its attention's and its block's options (attn_mask, kv_cache, rope, chunk, ...)
    are keyword-only in both twins."""
    for module in (numpy_attn.llama4, tw):
        assert_options_are_keyword_only(module, "llama4")


def test_init_gives_every_parameter_its_shape():
    """init_llama4_params: Llama's attention, a dense network of width hidden_mlp or the experts'
    stacked weights, a router and a shared expert of width hidden, all in the dtype asked for."""
    config = small_config()
    params = init_llama4_params(config, np.random.default_rng(0), np.float32)
    dense = {path: a.shape for path, a in leaves(params["blocks"]["0"])}
    moe = {path: a.shape for path, a in leaves(params["blocks"]["1"])}
    assert dense["mlp.gate.w"] == (8, 5) and dense["attn.q.w"] == (8, 16) and dense["attn.k.w"] == (8, 8), dense
    assert moe["mlp.router.w"] == (8, 3) and moe["mlp.experts.gate.w"] == (3, 8, 6), moe
    assert moe["mlp.experts.down.w"] == (3, 6, 8) and moe["mlp.shared.up.w"] == (8, 6), moe
    assert all(a.dtype == np.float32 for _, a in leaves(params)), "init_llama4_params changed the dtype"


@pytest.mark.parametrize("changes, error, message", [
    ({"experts_per_token": 5}, ValueError, r"Llama4Config.experts_per_token = 5 must lie in \[1, 4\]"),
    ({"n_experts": "4"}, TypeError, "Llama4Config.n_experts must be an integer, got str '4'"),
    ({"hidden_mlp": 0}, ValueError, "Llama4Config.hidden_mlp must be a positive integer, got 0"),
    ({"attention_chunk_size": 0}, ValueError, "Llama4Config.attention_chunk_size must be a positive integer, got 0"),
    ({"floor_scale": 0}, ValueError, "Llama4Config.floor_scale must be a positive integer, got 0"),
    ({"attn_scale": float("nan")}, ValueError, "Llama4Config.attn_scale must be a finite number, got nan"),
    ({"use_qk_norm": "yes"}, TypeError, "Llama4Config.use_qk_norm must be a bool, got str 'yes'"),
    ({"pad_token_id": 64}, ValueError, "Llama4Config.pad_token_id = 64 must be below vocab_size = 64"),
    ({"pad_token_id": -1}, ValueError, "Llama4Config.pad_token_id must be an integer >= 0, got -1"),
    ({"moe_layers": (0, 2)}, ValueError, r"Llama4Config.moe_layers must hold layer indices in \[0, 2\)"),
    ({"moe_layers": (1, 1)}, ValueError, r"Llama4Config.moe_layers lists a layer twice: \[1, 1\]"),
    ({"moe_layers": "1"}, TypeError, "Llama4Config.moe_layers must be a list of layer indices, got '1'"),
    ({"no_rope_layers": (1,)}, ValueError, "Llama4Config.no_rope_layers must list at least n_layer = 2 entries"),
    ({"no_rope_layers": (1, 2)}, ValueError, "Llama4Config.no_rope_layers: each entry must be 1 .* or 0 .*, got 2"),
    ({"interleave_moe_layer_step": 0}, ValueError, "Llama4Config.interleave_moe_layer_step must be a positive"),
    ({"rope_layout": "complex"}, ValueError, "Llama4Config.rope_layout must be 'half' or 'interleaved'"),
])
def test_bad_config_is_refused(changes, error, message):
    with pytest.raises(error, match=message):
        Llama4Config(n_layer=2, **changes)


def test_a_config_of_another_family_is_refused():
    """Llama 4's params differ from Llama's: its forward takes its own config class only."""
    from numpy_attn.llama import LlamaConfig
    config = small_config()
    params = init_llama4_params(config, np.random.default_rng(0), np.float64)
    with pytest.raises(TypeError, match="config must be a Llama4Config, got LlamaConfig"):
        llama4_forward(np.zeros((1, 3), np.int64), params, LlamaConfig())
    _, cache = llama4_forward(np.zeros((1, 3), np.int64), params, config)
    with pytest.raises(ValueError, match=r"llama4: dlogits must have the shape .* \(1, 3, 11\), got "):
        llama4_backward(np.zeros((1, 3, 4)), cache)


# -- checkpoints saved by transformers --------------------------------------------------------------------

def test_checkpoint_loads_as_the_model_holds_it(tmp_path):
    """The folder save_pretrained writes, loaded by attn_cli.hf: the same config and every
    parameter equal to from_hf's reading of the model in memory (which the comparison against
    transformers above uses), so the loaded model computes transformers' logits and gradients."""
    model = hf_llama4(np.float64)
    kind, config, params = load_checkpoint(save(model, tmp_path), np.float64)
    expected_config, expected = from_hf(model, np.float64)
    assert kind == "llama4" and config == expected_config, (config, expected_config)
    assert dict(leaves(params)).keys() == dict(leaves(expected)).keys()
    for path, a in leaves(params):
        assert np.array_equal(a, dict(leaves(expected))[path]), path


@pytest.mark.parametrize("cache", [[], ["--no-cache"]])
def test_generate_hf_ids_equal_transformers_generate(tmp_path, capsys, cache):
    """``numpy-attn generate --hf DIR --ids``, with the key/value cache (the default) and without:
    the greedy ids of transformers' generate (use_cache=True), decoding 10 tokens past a 5-token
    prompt that ends inside a chunk, across three chunk boundaries."""
    assert_generate_hf_is_transformers(hf_llama4(np.float32), tmp_path, capsys, cache, "Llama 4")


@pytest.mark.parametrize("changes, message", [
    ({"layer_types": ["full_attention"] * 4}, "what no_rope_layers and attention_chunk_size imply"),
    ({"no_rope_layers": [1, 1, 2, 1]}, r"no_rope_layers: each entry must be 1 \(rotary\) or 0 \(NoPE\), got 2"),
    ({"moe_layers": [4]}, r"moe_layers must hold layer indices in \[0, 4\)"),
    ({"moe_layers": 1}, "moe_layers must be a list or null, got 1"),
    ({"num_experts_per_tok": 4}, r"experts_per_token = 4 must lie in \[1, 3\]"),
    ({"attention_chunk_size": 0}, "attention_chunk_size must be an int or null >= 1, got 0"),
    ({"pad_token_id": 13}, "pad_token_id = 13 must be below vocab_size = 13"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "factor": 2.0}},
     "rope_type 'longrope' is not supported"),
])
def test_bad_config_json_is_refused_naming_the_field(tmp_path, capsys, changes, message):
    """The saved folder with config.json changed: load_checkpoint and generate --hf refuse it, naming the field."""
    assert_changed_config_refused(save(hf_llama4(np.float32), tmp_path), capsys, changes, message)


# -- dtypes --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [*S.FLOAT_DTYPES, *(d for d, _ in helpers.LOW_DTYPES.values())])
def test_dtype_is_preserved(dtype):
    """Logits and every gradient come back in the params' dtype, the MoE layer, the NoPE layer's
    temperature and the chunked layers included; a cached step too."""
    config = small_config()
    params = init_llama4_params(config, np.random.default_rng(0), dtype)
    helpers.assert_model_keeps_dtype("llama4", llama4_forward, llama4_backward, params, config, dtype)
    kv_cache = llama4_kv_cache(config, 1, dtype)
    for chunk in (np.array([[1, 2, 2, 4]]), np.array([[3]])):
        assert llama4_forward(chunk, params, config, kv_cache=kv_cache)[0].dtype == dtype
