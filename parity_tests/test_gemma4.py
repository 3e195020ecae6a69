"""Parity tests for numpy_attn/gemma4.py and torch_attn/gemma4.py: logits and every gradient
against transformers' Gemma4ForCausalLM holding the same weights (float64, its float32 steps
switched to float64), the twin against our backward, finite differences, and the refusals.

transformers' model keeps three steps in float32 whatever its dtype: Gemma4RMSNorm casts its
input and weight with ``.float()`` (every norm: the block's four, q-, k-, v-norm, the final one),
Gemma4TextRotaryEmbedding forms its frequencies and angles in float32 (inv_freq is a float32
buffer, the positions ``.float()``), and eager attention's softmax runs with dtype=float32.
``exact_hf_gemma4`` swaps the three for the same formulas in the model's dtype (the frequencies
rope_frequencies' in float64), so that every other part of transformers' model (projections,
layouts, grouped heads, the masks, shared keys and values, MLP, residuals, head) is compared at
float64 precision.
"""

import types

import numpy as np
import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.gemma4 import modeling_gemma4

import torch_attn.gemma4 as tw
from attn_cli import cli, decoding
from attn_cli.hf import load_checkpoint
from numpy_attn.gemma2 import gemma2_kv_cache
from numpy_attn.gemma3 import Gemma3Config
from numpy_attn.gemma4 import (
    Gemma4Config,
    gemma4_backward,
    gemma4_forward,
    gemma4_kv_cache,
    init_gemma4_params,
)
from numpy_attn.rope import rope_frequencies
from parity_tests.helpers import (
    assert_backward_matches_finite_differences,
    assert_close,
    assert_tree_close,
    autograd,
    decode_in_steps,
    layer_norm_tol,
    reorder_tol,
    to_numpy,
    to_torch,
    tree_leaves,
    tree_map,
)
from parity_tests.model_kit import (
    GEMMA_NORMS,
    assert_changed_config_refused,
    compare,
    gemma4_rstds,
    hf_logits_and_grads,
    randomise,
)

SLIDING, FULL = "sliding_attention", "full_attention"
# Six layers: sliding, global, sliding, global, then two shared ones, which reuse layer 2's (sliding)
# and layer 3's (global) keys and values; a global head of 16 against 8, half its pairs turning.
LAYER_TYPES = (SLIDING, FULL, SLIDING, FULL, SLIDING, FULL)
PAD = 2


def hf_gemma4(seed=0, n_shared=2, softcap=None, global_head_dim=16, per_layer=0, k_eq_v=False, double_wide=False,
              moe=False):
    """A random transformers Gemma4ForCausalLM in float64: C = 16 (sqrt(C) = 4, exact), 4 query heads
    on 2, head size 8 (``global_head_dim`` on the global layers), window 3, the last ``n_shared`` layers reading
    earlier ones' keys and values, pad id 2 in a vocabulary of 19; per-layer inputs of size
    ``per_layer`` (hidden_size_per_layer_input; 0 turns them off; sqrt(4) = 2 exact, as transformers
    rounds the scale to float32 first) from an embedding of 23 rows, more than the vocabulary;
    ``k_eq_v`` (attention_k_eq_v): the global layers' values their keys, with one key/value head
    (num_global_key_value_heads, which transformers reads with it only); ``double_wide``
    (use_double_wide_mlp): the shared layers' MLP 40 wide; ``moe`` (enable_moe_block): 4 experts
    of width 6 beside each MLP, 2 per token (transformers' loop over them, "eager"). Every parameter far
    from its initialisation (model_kit.randomise), each layer_scalar made a parameter drawn in
    [0.5, 1.5] so that its gradient is compared too."""
    config = transformers.Gemma4TextConfig(
        vocab_size=19, hidden_size=16, intermediate_size=20, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, global_head_dim=global_head_dim, max_position_embeddings=32,
        rms_norm_eps=1e-5,
        sliding_window=3, layer_types=list(LAYER_TYPES), num_kv_shared_layers=n_shared,
        hidden_size_per_layer_input=per_layer, vocab_size_per_layer_input=23, final_logit_softcapping=softcap,
        pad_token_id=PAD, bos_token_id=None,
        eos_token_id=None, attn_implementation="eager", attention_k_eq_v=k_eq_v,
        num_global_key_value_heads=1 if k_eq_v else None, use_double_wide_mlp=double_wide,
        enable_moe_block=moe, num_experts=4 if moe else None, top_k_experts=2 if moe else None,
        moe_intermediate_size=6 if moe else None, experts_implementation="eager",
        rope_parameters={SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
                         FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.5, "rope_theta": 1e6}})
    # With per-layer inputs off, transformers 5.24's forward slices their None before the first shared
    # layer (_maybe_slice_kv_shared_inputs, a TypeError) unless hidden states are asked for, which
    # skips that slicing (a no-op here: it keeps the last logits_to_keep = 0, i.e. all, positions).
    config.output_hidden_states = True
    model = transformers.Gemma4ForCausalLM(config).to(torch.float64)
    g = torch.Generator().manual_seed(seed + 1)
    for layer in model.model.layers:
        layer.layer_scalar = torch.nn.Parameter(torch.rand(1, generator=g, dtype=torch.float64) + 0.5)
    return randomise(model, seed).eval()


def our_config(model):
    """Our Gemma4Config for transformers' ``model`` (the sizes hf_gemma4 sets)."""
    c = model.config
    head_dims = {layer.self_attn.layer_type: layer.self_attn.head_dim for layer in model.model.layers}
    kv_heads = {layer.self_attn.layer_type: c.num_attention_heads // layer.self_attn.num_key_value_groups
                for layer in model.model.layers}
    return Gemma4Config(vocab_size=c.vocab_size, block_size=c.max_position_embeddings, n_layer=c.num_hidden_layers,
                        n_head=c.num_attention_heads, n_kv_head=kv_heads[SLIDING], n_embd=c.hidden_size,
                        head_dim=head_dims[SLIDING], global_head_dim=head_dims[FULL], hidden=c.intermediate_size,
                        rms_eps=c.rms_norm_eps,
                        rope_theta=1e6, rope_local_theta=10000.0, partial_rotary_factor=0.5,
                        final_logit_softcap=c.final_logit_softcapping, sliding_window=c.sliding_window,
                        layer_types=tuple(c.layer_types), n_kv_shared_layers=c.num_kv_shared_layers,
                        pad_token_id=c.pad_token_id, per_layer_input_size=c.hidden_size_per_layer_input,
                        per_layer_vocab_size=c.vocab_size_per_layer_input if c.hidden_size_per_layer_input else None,
                        attention_k_eq_v=c.attention_k_eq_v,
                        global_n_kv_head=None if kv_heads[FULL] == kv_heads[SLIDING] else kv_heads[FULL],
                        double_wide_mlp=c.use_double_wide_mlp, enable_moe=c.enable_moe_block, n_experts=c.num_experts,
                        experts_per_token=c.top_k_experts, moe_hidden=c.moe_intermediate_size)


def hf_names(config):
    """{our path: (Hugging Face's name, transposed)} for every parameter of ``config``'s model:
    transposed swaps the last two axes (an expert's (E, out, in) too); an expert's gate and up are
    the first and second half of Hugging Face's (E, 2h, C) gate_up_proj ("name[0]", "name[1]")."""
    names = {"wte": ("model.embed_tokens.weight", False), "norm.w": ("model.norm.weight", False)}
    for i in range(config.n_layer):
        layer = f"model.layers.{i}"
        for ours, theirs in GEMMA_NORMS.items():
            names[f"blocks.{i}.{ours}.w"] = (f"{layer}.{theirs}.weight", False)
        names[f"blocks.{i}.layer_scalar.w"] = (f"{layer}.layer_scalar", False)
        made_here = config.kv_source(i) == i
        for proj in ("q", "k", "v", "o") if made_here and not config.k_eq_v(i) else ("q", "k", "o") if made_here \
                else ("q", "o"):
            names[f"blocks.{i}.attn.{proj}.w"] = (f"{layer}.self_attn.{proj}_proj.weight", True)
        for norm in ("q_norm", "k_norm") if made_here else ("q_norm",):
            names[f"blocks.{i}.attn.{norm}.w"] = (f"{layer}.self_attn.{norm}.weight", False)
        for proj in ("gate", "up", "down"):
            names[f"blocks.{i}.mlp.{proj}.w"] = (f"{layer}.mlp.{proj}_proj.weight", True)
        if config.enable_moe:
            moe = f"blocks.{i}.moe"
            names[f"{moe}.router.w"] = (f"{layer}.router.proj.weight", True)
            names[f"{moe}.router.scale"] = (f"{layer}.router.scale", False)
            names[f"{moe}.router.expert_scale"] = (f"{layer}.router.per_expert_scale", False)
            names[f"{moe}.experts.gate.w"] = (f"{layer}.experts.gate_up_proj[0]", True)
            names[f"{moe}.experts.up.w"] = (f"{layer}.experts.gate_up_proj[1]", True)
            names[f"{moe}.experts.down.w"] = (f"{layer}.experts.down_proj", True)
            moe_norms = {"dense_post_norm": "post_feedforward_layernorm_1", "norm": "pre_feedforward_layernorm_2",
                         "post_norm": "post_feedforward_layernorm_2"}
            for ours, theirs in moe_norms.items():
                names[f"{moe}.{ours}.w"] = (f"{layer}.{theirs}.weight", False)
        if config.per_layer_input_size:
            names[f"blocks.{i}.per_layer.gate.w"] = (f"{layer}.per_layer_input_gate.weight", True)
            names[f"blocks.{i}.per_layer.proj.w"] = (f"{layer}.per_layer_projection.weight", True)
            names[f"blocks.{i}.per_layer.norm.w"] = (f"{layer}.post_per_layer_input_norm.weight", False)
    if config.per_layer_input_size:
        names["per_layer.wte"] = ("model.embed_tokens_per_layer.weight", False)
        names["per_layer.proj.w"] = ("model.per_layer_model_projection.weight", True)
        names["per_layer.norm.w"] = ("model.per_layer_projection_norm.weight", False)
    return names


def params_from_hf(model, config):
    """Our params tree holding ``model``'s weights (linear weights transposed to (in, out))."""
    state = {k: v.detach().numpy() for k, v in model.named_parameters()}
    for name in [name for name in state if name.endswith("gate_up_proj")]:   # (E, 2h, C): gate's h rows, up's
        state[name + "[0]"], state[name + "[1]"] = np.split(state.pop(name), 2, axis=1)
    params = {}
    for path, (name, transposed) in hf_names(config).items():
        node = params
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = np.swapaxes(state[name], -1, -2).copy() if transposed else state[name].copy()
    return params


def to_hf(grads, config):
    """Our gradient tree under Hugging Face's names, weights transposed back."""
    leaves = dict(tree_leaves(grads))
    out = {name: np.swapaxes(leaves[path], -1, -2) if transposed else leaves[path]
           for path, (name, transposed) in hf_names(config).items()}
    for name in [name[:-3] for name in out if name.endswith("gate_up_proj[0]")]:
        out[name] = np.concatenate([out.pop(name + "[0]"), out.pop(name + "[1]")], axis=1)   # (E, 2h, C)
    return out


def exact_hf_gemma4(model, config, monkeypatch):
    """transformers' float64 model with its three float32 steps (the module docstring) in float64."""
    inv_freq = {SLIDING: rope_frequencies(config.hs, config.rope_local_theta)}
    full = rope_frequencies(config.global_hs, config.rope_theta)            # (hs/2,)
    full[int(config.partial_rotary_factor * config.global_hs // 2):] = 0    # proportional: the rest stay put
    inv_freq[FULL] = full

    def rms_norm(self, h):
        out = h * (h.pow(2).mean(-1, keepdim=True) + self.eps) ** -0.5
        return out * self.weight if self.with_scale else out

    def rotary(self, x, position_ids, layer_type):
        angles = position_ids[..., None].to(torch.float64) * torch.from_numpy(inv_freq[layer_type])
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None, **kwargs):
        groups = module.num_key_value_groups
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        scores = query @ key.transpose(2, 3) * scaling
        if attention_mask is not None:
            scores = scores + attention_mask
        weights = torch.softmax(scores, dim=-1)                                # in the model's dtype
        return (weights @ value).transpose(1, 2).contiguous(), weights

    for module in model.modules():
        if isinstance(module, modeling_gemma4.Gemma4RMSNorm):
            module.forward = types.MethodType(rms_norm, module)
        if isinstance(module, modeling_gemma4.Gemma4TextRotaryEmbedding):
            module.forward = types.MethodType(rotary, module)
    def router(self, h):   # the router's softmax, in float32 there, in the model's dtype
        h = self.norm(h) * self.scale * self.scalar_root_size
        probabilities = torch.softmax(self.proj(h), dim=-1)                 # (N, E)
        weights, indices = torch.topk(probabilities, k=self.config.top_k_experts, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return probabilities, weights * self.per_expert_scale[indices], indices

    for module in model.modules():
        if isinstance(module, modeling_gemma4.Gemma4TextRouter):
            module.forward = types.MethodType(router, module)
    monkeypatch.setattr(modeling_gemma4, "eager_attention_forward", attention)
    return model


def ids_with_pad(V, B=2, T=7, seed=0):
    """Token ids (B, T) below V with the pad id among them (its embedding row then gets the head's
    gradient only)."""
    ids = np.random.default_rng(seed).integers(0, V, (B, T))
    ids[0, 1] = ids[1, 4] = PAD
    return ids


# float64 against transformers: model_kit.compare's rtol 1e-10, atol 1e-10 times the largest
# |value| (test_hf.py's analysis: a path of K ~ 10^3 roundings of u = 1.1e-16 through norms of
# rstd R ~ 10 leaves K u R ~ 1e-12 relative; 1e-10 keeps a factor 100 of margin and still fails
# on any wrong formula, which moves the logits by 1e-3 or more).
@pytest.mark.parametrize("n_shared,softcap,per_layer,k_eq_v,double_wide,moe", [
    (2, None, 0, False, False, False), (1, 3.0, 0, False, False, False), (0, None, 0, False, False, False),
    (2, None, 4, False, False, False), (0, 3.0, 4, False, False, False), (2, None, 0, True, False, False),
    (0, None, 4, True, False, False), (2, None, 0, False, True, False), (1, None, 4, True, True, False),
    (2, None, 0, False, False, True), (0, 3.0, 4, True, False, True)])
def test_logits_and_every_gradient_equal_transformers(monkeypatch, n_shared, softcap, per_layer, k_eq_v, double_wide,
                                                      moe):
    """T = 7 > the window 3: logits, and the gradient of sum(logits * dlogits) for every parameter
    of transformers' model (shared layers' missing k, v and k-norm included by their absence),
    against transformers' autograd; the shared-from layers' k and v gradients hold both uses, and
    with per-layer inputs wte's holds the blocks' share and theirs, and with k = v a global layer's
    k projection holds both its uses'; with a double-wide MLP the shared layers' is 2 H wide; with
    the experts their router's weights, scales and the experts' own."""
    model = hf_gemma4(n_shared=n_shared, softcap=softcap, per_layer=per_layer, k_eq_v=k_eq_v, double_wide=double_wide,
                      moe=moe)
    config = our_config(model)
    model = exact_hf_gemma4(model, config, monkeypatch)
    params = params_from_hf(model, config)
    ids = ids_with_pad(config.vocab_size)
    logits, cache = gemma4_forward(ids, params, config)
    dlogits = np.random.default_rng(1).normal(size=logits.shape)
    hf_logits, theirs = hf_logits_and_grads(model, ids, None, dlogits)
    compare("gemma4 logits", logits, hf_logits, np.float64)
    ours = to_hf(gemma4_backward(dlogits, cache), config)
    assert ours.keys() == theirs.keys(), (sorted(ours), sorted(theirs))
    scale = max(float(np.abs(g).max()) for g in theirs.values())
    for name, g in theirs.items():
        compare(f"gemma4 d{name}", ours[name], g, np.float64, scale=scale)
    assert np.all(ours["model.embed_tokens.weight"][PAD] != 0)   # the head's share reaches the pad row
    if per_layer:   # the per-layer embedding's pad row and the rows no id reads get nothing
        unread = [PAD] + sorted(set(range(23)) - set(ids.ravel().tolist()))
        assert not np.any(ours["model.embed_tokens_per_layer.weight"][unread])


def transformers_logits(monkeypatch, **options):
    """(config, params, ids, logits) of hf_gemma4(**options), the logits transformers' (exact_hf_gemma4)."""
    model = hf_gemma4(**options)
    config = our_config(model)
    model = exact_hf_gemma4(model, config, monkeypatch)
    ids = ids_with_pad(config.vocab_size)
    hf_logits, _ = hf_logits_and_grads(model, ids, None, np.zeros((2, 7, config.vocab_size)))
    return config, params_from_hf(model, config), ids, hf_logits


def test_per_layer_inputs_change_what_the_model_computes(monkeypatch):
    """The comparison above can fail on them: the same weights with the per-layer inputs left out
    of each block (its per_layer params dropped, the model's too), or each layer reading its
    neighbour's input, give other logits than transformers'."""
    config, params, ids, hf_logits = transformers_logits(monkeypatch, per_layer=4)
    logits, _ = gemma4_forward(ids, params, config)
    compare("gemma4 logits", logits, hf_logits, np.float64)
    rolled = {**params, "per_layer": {**params["per_layer"],
                                      "wte": np.roll(params["per_layer"]["wte"], config.per_layer_input_size, 1)}}
    assert np.abs(gemma4_forward(ids, rolled, config)[0] - hf_logits).max() > 1e-3
    off = Gemma4Config(**{**config.__dict__, "per_layer_input_size": 0, "per_layer_vocab_size": None})
    plain = {key: value for key, value in params.items() if key != "per_layer"}
    plain["blocks"] = {i: {k: v for k, v in block.items() if k != "per_layer"} for i, block in params["blocks"].items()}
    assert np.abs(gemma4_forward(ids, plain, off)[0] - hf_logits).max() > 1e-3


def test_shared_layers_change_what_the_model_computes(monkeypatch):
    """The comparison above can fail: the same weights with each shared layer computing its own
    keys (none shared, the shared layers' k, v made from their q's) give other logits than transformers'."""
    config, params, ids, hf_logits = transformers_logits(monkeypatch, n_shared=2)
    unshared = Gemma4Config(**{**config.__dict__, "n_kv_shared_layers": 0})
    for i in (4, 5):
        attn = params["blocks"][str(i)]["attn"]
        src = params["blocks"][str(config.kv_source(i))]["attn"]
        attn.update(k=src["k"], v=src["v"], k_norm=src["k_norm"])
    logits, _ = gemma4_forward(ids, params, unshared)
    assert np.abs(logits - hf_logits).max() > 1e-3


def random_case(seed, n_layer, n_shared, T, dtype=np.float64, pad=PAD, per_layer=0, k_eq_v=False,
                double_wide=False, moe=False):
    """A small random config (sliding and global alternating, ending global; per-layer inputs of
    size ``per_layer`` from 13 rows; with ``k_eq_v`` the global layers' values their keys, on one
    key/value head; with ``double_wide`` the shared layers' MLP twice as wide; with ``moe`` 3 experts
    of width 5, 2 per token) and params far from init."""
    types_ = tuple((FULL, SLIDING)[(n_layer - 1 - i) % 2] for i in range(n_layer))
    config = Gemma4Config(vocab_size=11, block_size=8, n_layer=n_layer, n_head=4, n_kv_head=2, n_embd=8, head_dim=4,
                          global_head_dim=6, hidden=12, sliding_window=2, layer_types=types_,
                          n_kv_shared_layers=n_shared, pad_token_id=pad, partial_rotary_factor=0.7,
                          per_layer_input_size=per_layer, per_layer_vocab_size=13 if per_layer else None,
                          attention_k_eq_v=k_eq_v, global_n_kv_head=1 if k_eq_v else None,
                          double_wide_mlp=double_wide, enable_moe=moe, n_experts=3 if moe else None,
                          experts_per_token=2 if moe else None, moe_hidden=5 if moe else None)
    rng = np.random.default_rng(seed)
    params = tree_map(lambda p: (p + rng.uniform(-0.5, 0.5, p.shape)).astype(dtype),
                      init_gemma4_params(config, rng, dtype))
    ids = rng.integers(0, config.vocab_size, (2, T))
    dout = rng.normal(size=(2, T, config.vocab_size)).astype(dtype)
    return config, params, ids, dout


@pytest.mark.twin_parity
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_layer=st.integers(2, 4), T=st.integers(1, 6), data=st.data())
def test_forward_and_backward_match_twin(seed, n_layer, T, data):
    """Logits against the twin's and every gradient (by path) against autograd's, float64, with
    up to n_layer - 2 shared layers (each type keeps a layer before them), per-layer inputs, k = v,
    the double-wide MLP and the experts on or off. float64: the rstd-scaled tolerance of layer_norm_tol (the
    norms amplify rounding by up to their rstd)."""
    n_shared = data.draw(st.integers(0, n_layer - 2))
    switches = {"per_layer": data.draw(st.sampled_from([0, 3])), "k_eq_v": data.draw(st.booleans()),
                "double_wide": data.draw(st.booleans()), "moe": data.draw(st.booleans())}
    config, params, ids, dout = random_case(seed, n_layer, n_shared, T, **switches)
    logits, cache = gemma4_forward(ids, params, config)
    dparams = gemma4_backward(dout, cache)
    twin_logits, grads = autograd(lambda params: tw.gemma4(to_torch(ids), params, config), {"params": params}, dout)
    tol = layer_norm_tol(gemma4_rstds(cache), np.float64)
    assert_close("gemma4.logits", logits, twin_logits, **tol)
    # wte's gradient through the embedding is dx * sqrt(C): its atol is sqrt(C) times the rest's.
    assert_close("gemma4.wte", dparams.pop("wte"), grads["params"].pop("wte"),
                 rtol=tol["rtol"], atol=tol["atol"] * config.n_embd ** 0.5)
    assert_tree_close("gemma4", dparams, grads["params"], **tol)


@pytest.mark.parametrize("seed,per_layer,k_eq_v,moe", [(0, 0, False, False), (1, 0, False, False),
                                                       (2, 3, False, False), (3, 0, True, False), (4, 0, False, True)])
def test_backward_matches_finite_differences(seed, per_layer, k_eq_v, moe):
    """A directional derivative through every parameter (shared layers' sources and the per-layer
    inputs' included; k = v's keys; the router and experts) in float64; no pad id (its embedding
    rows' gradient is left out on purpose, so it is no derivative)."""
    config, params, ids, dout = random_case(seed, 4, 2, 5, pad=None, per_layer=per_layer, k_eq_v=k_eq_v, moe=moe)
    assert_backward_matches_finite_differences(
        "gemma4", lambda p: gemma4_forward(ids, p, config), gemma4_backward, params, dout, seed, gemma4_rstds)


def test_default_choices_are_transformers():
    """Gemma4Config's defaults that are not sizes are transformers' Gemma4TextConfig's: the rotary
    bases of the global and sliding layers, the global layers' share of rotating pairs, tied
    embeddings, no logit cap, five sliding layers then one global."""
    ours, theirs = Gemma4Config(n_layer=7), transformers.Gemma4TextConfig(num_hidden_layers=7)
    rope = theirs.rope_parameters
    assert (ours.rope_theta, ours.partial_rotary_factor) == (rope["full_attention"]["rope_theta"],
                                                             rope["full_attention"]["partial_rotary_factor"])
    assert ours.rope_local_theta == rope["sliding_attention"]["rope_theta"]
    assert (ours.tie_weights, ours.final_logit_softcap) == (theirs.tie_word_embeddings, theirs.final_logit_softcapping)
    assert [ours.window(i) is None for i in range(7)] == [t == "full_attention" for t in theirs.layer_types]


@pytest.mark.parametrize("changes,error,message", [
    ({"partial_rotary_factor": 1.5}, ValueError, r"partial_rotary_factor must be in \[0, 1\], got 1.5"),
    ({"layer_types": (FULL, SLIDING)}, ValueError, r"layer_types must end with 'full_attention'"),
    ({"n_kv_shared_layers": 2}, ValueError, r"n_kv_shared_layers must be below n_layer = 2 \(.*\), got 2"),
    ({"n_layer": 3, "layer_types": (FULL, SLIDING, FULL), "n_kv_shared_layers": 2}, ValueError,
     "shared layer 1 is 'sliding_attention', and no layer before"),
    ({"pad_token_id": 11}, ValueError, "pad_token_id = 11 must be below vocab_size = 11"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, ValueError, "rope_scaling must be None"),
    ({"global_head_dim": 5}, ValueError, "global_head_dim must be even"),
    ({"n_kv_shared_layers": -1}, ValueError, "n_kv_shared_layers"),
    ({"global_head_dim": 2.0}, TypeError, "global_head_dim"),
    ({"per_layer_input_size": -1}, ValueError, "per_layer_input_size"),
    ({"n_head": 4, "n_kv_head": 2, "global_n_kv_head": 3}, ValueError,
     "n_head = 4 must be a multiple of global_n_kv_head = 3"),
    ({"attention_k_eq_v": 1}, TypeError, "attention_k_eq_v"),
    ({"double_wide_mlp": None}, TypeError, "double_wide_mlp"),
    ({"enable_moe": True, "n_experts": 4}, ValueError, "enable_moe needs n_experts, experts_per_token and moe_hidden"),
    ({"enable_moe": True, "n_experts": 2, "experts_per_token": 3, "moe_hidden": 4}, ValueError,
     "experts_per_token = 3 must be at most n_experts = 2"),
    ({"per_layer_input_size": 2, "per_layer_vocab_size": 10}, ValueError,
     "per_layer_vocab_size = 10 must be at least vocab_size = 11"),
])
def test_bad_config_refused(changes, error, message):
    """Each check names the field and the value at fault."""
    base = dict(vocab_size=11, n_layer=2, layer_types=(SLIDING, FULL))
    with pytest.raises(error, match=message):
        Gemma4Config(**{**base, **changes})


def decode_case(n_shared=2, per_layer=0, global_head_dim=None, k_eq_v=False, moe=False):
    """Six layers (sliding, global alternating), the last ``n_shared`` shared, head size 4 (the
    global layers' ``global_head_dim``, None: the same), window 2, per-layer inputs of size
    ``per_layer``, with ``k_eq_v`` the global layers' values their keys, on one key/value head, with
    ``moe`` 3 experts of width 5 beside each MLP, 2 per token."""
    config = Gemma4Config(vocab_size=11, block_size=16, n_layer=6, n_head=4, n_kv_head=2, n_embd=8, head_dim=4,
                          hidden=12, sliding_window=2, layer_types=LAYER_TYPES, n_kv_shared_layers=n_shared,
                          partial_rotary_factor=0.5, per_layer_input_size=per_layer, global_head_dim=global_head_dim,
                          attention_k_eq_v=k_eq_v, global_n_kv_head=1 if k_eq_v else None, enable_moe=moe,
                          n_experts=3 if moe else None, experts_per_token=2 if moe else None,
                          moe_hidden=5 if moe else None)
    rng = np.random.default_rng(3)
    params = tree_map(lambda p: p + rng.uniform(-0.5, 0.5, p.shape), init_gemma4_params(config, rng, np.float64))
    return config, params, rng.integers(0, config.vocab_size, (2, 12))


@pytest.mark.parametrize("n_shared,per_layer,global_head_dim,k_eq_v,moe", [
    (2, 0, None, False, False), (0, 0, None, False, False), (2, 3, None, False, False), (2, 0, 6, False, False),
    (0, 3, 6, False, False), (2, 0, None, True, False), (0, 0, 6, True, False), (2, 3, 6, True, True)])
def test_cached_decoding_equals_full_forward(n_shared, per_layer, global_head_dim, k_eq_v, moe):
    """A prefill of 3 tokens (past the window 2), then one token at a time up to 12: every position's
    logits equal the full forward's (reorder_tol: the same sums, some in another order); the shared
    layers read their source's keys, the held ones included, and hold none themselves; the sliding
    layers stop growing at their window; each step's per-layer inputs are its own tokens'; a global
    head size (or key/value head count: k = v's) of its own is held in the cache's second
    allocation (``wide``), at that size."""
    config, params, ids = decode_case(n_shared, per_layer, global_head_dim, k_eq_v, moe)
    full, full_cache = gemma4_forward(ids, params, config)
    kv_cache = gemma4_kv_cache(config, 2, np.float64)
    sizes = [3] + [1] * 9
    cached = decode_in_steps(lambda chunk: gemma4_forward(chunk, params, config, kv_cache=kv_cache)[0], ids, sizes)
    assert_close("gemma4 decode.logits vs full forward", cached, full, **reorder_tol(gemma4_rstds(full_cache),
                                                                                      np.float64))
    makers = [i for i in range(config.n_layer) if config.kv_source(i) == i]
    assert [kv_cache.layer(i) is None for i in range(config.n_layer)] == [i not in makers for i in range(6)]
    assert [kv_cache.layer(i).held for i in makers] == [2 if config.window(i) else 12 for i in makers]
    assert [kv_cache.layer(i).k.shape[1::2] for i in makers] == [(config.layer_nkv(i), config.layer_hs(i))
                                                                  for i in makers]
    assert (kv_cache.wide is None) == (config.global_hs == config.hs and config.global_nkv == config.n_kv_head)
    assert kv_cache.bytes_per_token == sum(2 * config.layer_nkv(i) * config.layer_hs(i) * 8 for i in makers
                                           if not config.window(i))
    assert decoding.cache_bytes(gemma4_kv_cache(config, 2, np.float64, 1), 16) == kv_cache.nbytes
    assert kv_cache.bytes_held == 2 * sum(kv_cache.layer(i).held * kv_cache.layer(i).bytes_per_token for i in makers)
    tparams = tree_map(to_torch, params)
    twin_cache = tw.gemma4_kv_cache(config, 2, torch.float64)
    twin = decode_in_steps(lambda chunk: to_numpy(tw.gemma4(to_torch(chunk), tparams, config, kv_cache=twin_cache)),
                           ids, sizes)
    assert_close("gemma4 decode twin.logits", twin, cached, **layer_norm_tol(gemma4_rstds(full_cache), np.float64))
    assert twin_cache.bytes_held == kv_cache.bytes_held


def test_cache_bytes_per_token_against_gemma3():
    """The same sizes and layer types as Gemma 3 (whose cache holds every layer's keys): Gemma 4's
    two shared layers hold none, so one of its three global layers' keys (layer 5's, layer 3's reused)
    is not held; bytes per token 2/3 of Gemma 3's, 2 x nkv x hs x 8 bytes a global layer."""
    config, _, _ = decode_case(2)
    ours = gemma4_kv_cache(config, 1, np.float64)
    gemma3 = Gemma3Config(vocab_size=11, block_size=16, n_layer=6, n_head=4, n_kv_head=2, n_embd=8, head_dim=4,
                          hidden=12, sliding_window=2, layer_types=LAYER_TYPES)
    theirs = gemma2_kv_cache(gemma3, 1, np.float64)
    per_layer = 2 * config.n_kv_head * config.hs * 8                   # k and v of one layer, one token
    assert theirs.bytes_per_token == 3 * per_layer == 384
    assert ours.bytes_per_token == 2 * per_layer == 256
    assert ours.nbytes == per_layer * (2 * 16 + 2 * 2)                 # two global layers of 16, two sliding of 2
    assert theirs.nbytes == per_layer * (3 * 16 + 3 * 2)


def test_cache_refusals():
    """A cache of another kind, an attn_mask beside a cache and a backward after cached keys, each
    refused naming what is at fault."""
    config, params, ids = decode_case()
    with pytest.raises(TypeError, match="kv_cache must be a Gemma4Cache .*, got object"):
        gemma4_forward(ids, params, config, kv_cache=object())
    kv_cache = gemma4_kv_cache(config, 2, np.float64)
    with pytest.raises(ValueError, match="an attn_mask together with a kv_cache is not supported"):
        gemma4_forward(ids, params, config, kv_cache=kv_cache, attn_mask=np.ones((2, 4, 12, 12), bool))
    gemma4_forward(ids[:, :3], params, config, kv_cache=kv_cache)
    logits, cache = gemma4_forward(ids[:, 3:5], params, config, kv_cache=kv_cache)
    with pytest.raises(ValueError, match="backward"):
        gemma4_backward(np.ones_like(logits), cache)


@pytest.mark.parametrize("dtype,per_layer,k_eq_v,double_wide,moe", [
    (np.float64, 0, False, False, False), (np.float32, 0, False, False, False), (np.float64, 4, False, False, False),
    (np.float64, 0, True, False, False), (np.float64, 0, False, True, False), (np.float64, 0, False, False, True)])
def test_checkpoint_reads_transformers_weights(tmp_path, dtype, per_layer, k_eq_v, double_wide, moe):
    """The folder save_pretrained writes, loaded by attn_cli.hf: the config this test builds by hand
    and every weight (the shared layers' missing k, v and k-norm, layer_scalar, the per-layer
    inputs', k = v's missing v and its global layers' one key/value head, the double-wide MLP, the
    router and experts), in ``dtype``."""
    model = hf_gemma4(softcap=3.0, per_layer=per_layer, k_eq_v=k_eq_v, double_wide=double_wide, moe=moe)
    model.save_pretrained(tmp_path, safe_serialization=True)
    kind, config, params = load_checkpoint(tmp_path, dtype)
    assert kind == "gemma4" and config == our_config(model), config
    expected = dict(tree_leaves(params_from_hf(model, config)))
    got = dict(tree_leaves(params))
    assert got.keys() == expected.keys(), sorted(set(got) ^ set(expected))
    for path, value in expected.items():
        assert got[path].dtype == dtype and np.array_equal(got[path], value.astype(dtype)), path


@pytest.mark.parametrize("global_head_dim,options,per_layer,k_eq_v,double_wide,moe", [
    (8, [], 0, False, False, False), (16, ["--no-cache"], 0, False, False, False),
    (8, ["--no-cache"], 0, False, False, False), (8, [], 4, False, False, False), (16, [], 0, False, False, False),
    (16, [], 4, False, False, False), (16, [], 0, True, False, False), (8, [], 4, True, False, False),
    (16, [], 0, False, True, False), (16, [], 4, True, False, True)])
def test_generate_hf_ids_equal_transformers_generate(tmp_path, capsys, global_head_dim, options, per_layer, k_eq_v,
                                                     double_wide, moe):
    """``numpy-attn generate --hf DIR --ids 3,1,4,1,5``: the 10 greedy ids of transformers' generate
    (use_cache=True), with our key/value cache and without, a global head size of its own or not,
    with per-layer inputs or not, with k = v (one key/value head on the global layers) or not, with
    a double-wide MLP or not, with experts or not.
    hf_gemma4's output_hidden_states makes generate return a record: its sequences are the ids
    (model_kit.hf_greedy reads a plain tensor)."""
    model = hf_gemma4(global_head_dim=global_head_dim, per_layer=per_layer, k_eq_v=k_eq_v, double_wide=double_wide,
                      moe=moe).to(torch.float32)
    model.save_pretrained(tmp_path, safe_serialization=True)
    assert cli.main(["generate", "--hf", str(tmp_path), "--ids", "3,1,4,1,5", "--max-new-tokens", "10",
                     "--temperature", "0", *options]) == 0
    ours = [int(i) for i in capsys.readouterr().out.strip().split(",")]
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        theirs = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=10, min_new_tokens=10,
                                do_sample=False, pad_token_id=0, eos_token_id=None, use_cache=True,
                                return_dict_in_generate=True).sequences[0].tolist()
    assert ours == theirs, f"gemma4 {global_head_dim} {options} {per_layer} {k_eq_v}: greedy ids differ"


@pytest.mark.parametrize("changes,message", [
    ({"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 6},
     "tensor 'model.layers.0.experts.gate_up_proj' is missing"),
    ({"enable_moe_block": True, "num_experts": 4, "top_k_experts": 5, "moe_intermediate_size": 6},
     "experts_per_token = 5 must be at most n_experts = 4"),
    ({"use_double_wide_mlp": True}, "tensor 'model.layers.4.mlp.gate_proj.weight' has shape"),
    ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention = 'all' is not supported"),
    ({"rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}},
     "rope_parameters.sliding_attention must be an unscaled rope of kind default"),
    ({"per_layer_config": {"0": {"head_dim": 16}}}, "per_layer_config may set only a global layer's head_dim"),
    ({"num_kv_shared_layers": 6}, "n_kv_shared_layers must be below n_layer = 6"),
    ({"hidden_size_per_layer_input": 4, "vocab_size_per_layer_input": 18},
     "per_layer_vocab_size = 18 must be at least vocab_size = 19"),
    ({"hidden_size_per_layer_input": -1}, "hidden_size_per_layer_input"),
    ({"per_layer_config": {"1": {"head_dim": 16, "num_key_value_heads": 1}, "3": {"head_dim": 16}}},
     "per_layer_config gives the global layers different num_key_value_heads"),
    ({"per_layer_config": None, "attention_k_eq_v": True, "num_global_key_value_heads": 3},
     "n_head = 4 must be a multiple of global_n_kv_head = 3"),
])
def test_unsupported_folder_refused(tmp_path, capsys, changes, message):
    """A config.json switching on what numpy_attn.gemma4 leaves off is refused naming the key."""
    folder = tmp_path / "model"
    hf_gemma4().save_pretrained(folder, safe_serialization=True)
    assert_changed_config_refused(folder, capsys, changes, message)
