"""Parity tests for numpy_attn/mla.py and torch_attn/mla.py, against Hugging Face's DeepseekV3Attention."""

import dataclasses
import types
from unittest import mock

import numpy as np
import pytest
import torch
import transformers
from hypothesis import example, given
from hypothesis import strategies as st

from numpy_attn import mla as mla_module
from numpy_attn.kv_cache import init_kv_cache
from numpy_attn.linear import LinearCache, linear_backward
from numpy_attn.mla import (
    MLAConfig,
    init_latent_cache,
    init_mla_kv_cache,
    init_mla_params,
    mla_absorbed_forward,
    mla_backward,
    mla_cache_bytes_per_token,
    mla_forward,
    mla_param_shapes,
    mla_softmax_scale,
)
from numpy_attn.rope import half_to_interleaved, rope_backward
from parity_tests import strategies as S
from parity_tests.helpers import (
    LOW_DTYPES,
    TOLERANCES,
    assert_close,
    assert_error_budget,
    autograd,
    directional_derivative,
    directional_tol,
    round_to,
    to_numpy,
    to_torch,
    tree_dot,
    tree_leaves,
    tree_map,
    ulp,
)
from parity_tests.model_kit import MLA_HF_NAMES, SCALINGS, mla_hf_config, mla_hf_rotary, mla_rstds
from torch_attn.mla import init_latent_cache as init_torch_latent_cache
from torch_attn.mla import init_mla_kv_cache as init_torch_mla_kv_cache
from torch_attn.mla import mla, mla_absorbed


@st.composite
def configs(draw, q_lora=None, rope_interleave=None):
    """Tiny configs: low-rank or full-rank queries, every width independent of the others, both
    rotary layouts, biases, every scaling rope.py knows."""
    low_rank = draw(st.booleans()) if q_lora is None else q_lora
    return MLAConfig(
        n_embd=draw(S.dim(1, 6)), n_head=draw(S.dim(1, 3)),
        q_lora_rank=draw(S.dim(1, 5)) if low_rank else None, kv_lora_rank=draw(S.dim(1, 5)),
        qk_nope_head_dim=draw(S.dim(1, 4)), qk_rope_head_dim=draw(st.sampled_from([2, 4])),
        v_head_dim=draw(S.dim(1, 4)), rms_eps=draw(st.sampled_from([1e-6, 1e-5])),
        rope_theta=draw(st.sampled_from([10000.0, 3.0])), rope_scaling=draw(st.sampled_from(SCALINGS)),
        rope_interleave=draw(st.booleans()) if rope_interleave is None else rope_interleave,
        attn_bias=draw(st.booleans()))


@st.composite
def cases(draw, dtype=None, **config_kw):
    """(config, params, x, positions, dout): params from init_mla_params moved by U(-0.5, 0.5) (so
    that norms and biases are not at 1 and 0), x and dout bounded, default or drawn positions."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    config = draw(configs(**config_kw))
    B, T = draw(S.dim(1, 2)), draw(S.dim(1, 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="seed"))
    params = tree_map(lambda p: (p + rng.uniform(-0.5, 0.5, p.shape)).astype(dtype),
                      init_mla_params(config, rng, dtype))
    x = draw(S.arrays(dtype, (B, T, config.n_embd), 2.0))
    positions = draw(st.sampled_from([None, (T,), (B, T)]))
    if positions is not None:
        positions = draw(S.token_ids(100, positions))
    return config, params, x, positions, draw(S.arrays(dtype, (B, T, config.n_embd), 2.0))


def _pinned_case(q_lora_rank=3, rope_interleave=True, kv_lora_rank=4):
    """Three heads, every width different, llama3 scaling, biases, two sequences, float64."""
    config = MLAConfig(n_embd=5, n_head=3, q_lora_rank=q_lora_rank, kv_lora_rank=kv_lora_rank, qk_nope_head_dim=2,
                       qk_rope_head_dim=4, v_head_dim=3, rope_scaling=SCALINGS[2],
                       rope_interleave=rope_interleave, attn_bias=True)
    rng = np.random.default_rng(3)
    params = tree_map(lambda p: p + rng.uniform(-0.5, 0.5, p.shape), init_mla_params(config, rng, np.float64))
    x = rng.uniform(-2, 2, (2, 4, 5))
    return config, params, x, None, rng.uniform(-2, 2, (2, 4, 5))


def _wide_case():
    """Widths of a small real model (sums of 16 to 96 terms), weights of unit-scale outputs
    (N(0, 1 / C_in)), float64: where a sum accumulated in the low dtype, not float32, shows."""
    config = MLAConfig(n_embd=64, n_head=4, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16,
                       qk_rope_head_dim=8, v_head_dim=16, attn_bias=True)
    rng = np.random.default_rng(5)
    params = tree_map(lambda p: rng.normal(0, 1 / np.sqrt(p.shape[0]), p.shape) if p.ndim == 2
                      else p + rng.uniform(-0.5, 0.5, p.shape), init_mla_params(config, rng, np.float64))
    return config, params, rng.uniform(-2, 2, (1, 16, 64)), None, rng.uniform(-2, 2, (1, 16, 64))


def _tol(cache, expected):
    """Two programs that compute MLA with the same operations rounded in a different order.

    Each RMS norm multiplies the rounding errors before it by its rstd (parity_tests/helpers.py,
    layer_norm_tol): both tolerances scale by the largest rstd. float64: the helpers' rtol 1e-10
    and atol 1e-12 (a few ulps times the longest sum, here at most 12 terms) have room to spare.
    float32: the helpers' atol of 1e-5 is stated for values of scale 1; MLA's are not (inputs up
    to 2 through chains of up to five products of width up to 12 with weights up to 0.52, their
    gradients the same chains backwards), and a rounding error is relative to the terms summed,
    not to a result they cancel to, so atol scales by the largest entry of the tensor compared.
    """
    tol = TOLERANCES[expected.dtype]
    rstd = max([1.0] + [float(r.max()) for r in mla_rstds(cache)])
    scale = max(1.0, float(np.abs(expected).max())) if expected.dtype == np.float32 else 1.0
    return dict(rtol=tol["rtol"] * rstd, atol=tol["atol"] * rstd * scale)


def _twin(config, positions):
    """The torch twin as a function of x and its parameters, for autograd()."""
    pos = None if positions is None else to_torch(positions)
    return lambda x, params: mla(x, params, config, positions=pos)


def _assert_grads_close(label, dx, dparams, expected_x, expected_params, cache):
    assert_close(f"{label}.x", dx, expected_x, **_tol(cache, expected_x))
    for path, g in tree_leaves(expected_params):
        assert_close(f"{label}.{path}", dict(tree_leaves(dparams))[path], g, **_tol(cache, g))
    assert dict(tree_leaves(dparams)).keys() == dict(tree_leaves(expected_params)).keys(), label


# -- forward matches the twin -----------------------------------------------------------------

@given(case=cases())
@example(case=_pinned_case())
@example(case=_pinned_case(q_lora_rank=None, rope_interleave=False))
def test_forward_matches_twin(case):
    config, params, x, positions, dout = case
    out, cache = mla_forward(x, params, config, positions=positions)
    twin_out, _ = autograd(_twin(config, positions), {"x": x, "params": params}, dout)
    assert_close("mla.out", out, twin_out, **_tol(cache, twin_out))


# -- backward matches autograd ----------------------------------------------------------------

@pytest.mark.twin_parity
@given(case=cases())
@example(case=_pinned_case())
@example(case=_pinned_case(q_lora_rank=None, rope_interleave=False))
def test_backward_matches_autograd(case):
    """dx and every projection's and norm's gradient, labelled by path (mla.kv_b.w, ...)."""
    config, params, x, positions, dout = case
    _, cache = mla_forward(x, params, config, positions=positions)
    dx, dparams = mla_backward(dout, cache)
    _, grads = autograd(_twin(config, positions), {"x": x, "params": params}, dout)
    _assert_grads_close("mla", dx, dparams, grads["x"], grads["params"], cache)


# -- the twin matches Hugging Face's DeepseekV3Attention ----------------------------------------


def hf_attention(config, params):
    """A DeepseekV3Attention holding our parameters (nn.Linear stores w transposed), in their dtype.
    Hugging Face's two latent norms have eps 1e-6 whatever the config says: set ours."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

    module = DeepseekV3Attention(mla_hf_config(config), layer_idx=0).to(to_torch(params["o"]["w"]).dtype).eval()
    state = {}
    for name, layer in params.items():
        for key, p in layer.items():
            theirs = "bias" if key == "b" else "weight"
            state[f"{MLA_HF_NAMES[name]}.{theirs}"] = p.T if p.ndim == 2 else p
    module.load_state_dict({k: to_torch(v) for k, v in state.items()}, strict=True)
    for norm in (module.q_a_layernorm, module.kv_a_layernorm):
        if norm is not None:
            norm.variance_epsilon = config.rms_eps
    return module


def exact_hf(module):
    """Make a float64 DeepseekV3Attention's RMS norms compute in float64: DeepseekV3RMSNorm casts to
    float32 (a sound choice for bfloat16); with its forward swapped for the same formula in the
    input's dtype, every other part of the module (projections and their layout, the split into
    the latent and the shared rotary key, the interleaved rotation, kv_b's split into keys and
    values, the scale, attention, o) is compared at float64 precision."""
    def rms_norm(self, h):
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    for norm in (module.q_a_layernorm, module.kv_a_layernorm):
        if norm is not None:
            norm.forward = types.MethodType(rms_norm, norm)
    return module


def _hf_grad(layer, key):
    """A Hugging Face layer's gradient in our layout: weights (C_in, C_out), norms and biases as they are."""
    g = to_numpy((layer.bias if key == "b" else layer.weight).grad)
    return g.T if g.ndim == 2 else g


@given(case=cases())
@example(case=_pinned_case())
@example(case=_pinned_case(q_lora_rank=None))
@example(case=_pinned_case(rope_interleave=False))
@example(case=_pinned_case(q_lora_rank=None, rope_interleave=False))
def test_twin_matches_hugging_face(case):
    """The twin's output and gradients (x and every parameter) against DeepseekV3Attention holding
    the same weights: float64 with its RMS norms in float64 (exact_hf), float32 unchanged."""
    config, params, x, positions, dout = case
    twin_out, twin_grads = autograd(_twin(config, positions), {"x": x, "params": params}, dout)
    hf_out, hf_dx, hf_params = hf_forward_backward(config, params, x, positions, dout)
    _, cache = mla_forward(x, params, config, positions=positions)
    label = "mla vs DeepseekV3Attention"
    assert_close(f"{label}.out", twin_out, hf_out, **_tol(cache, hf_out))
    _assert_grads_close(label, twin_grads["x"], twin_grads["params"], hf_dx, hf_params, cache)


def hf_forward_backward(config, params, x, positions, dout):
    """DeepseekV3Attention holding ``params`` in x's dtype (float64: its norms in float64, exact_hf):
    (out, dx, the parameters' gradients in our layout), as NumPy arrays."""
    module = hf_attention(config, params)
    if x.dtype == np.float64:
        module = exact_hf(module)
    hx = to_torch(x, requires_grad=True)
    hf_out, _ = module(hx, position_embeddings=mla_hf_rotary(config, x, positions), attention_mask=None)
    (hf_out * to_torch(dout)).sum().backward()
    hf_params = {name: {key: _hf_grad(getattr(module, MLA_HF_NAMES[name]), key) for key in layer}
                 for name, layer in params.items()}
    return to_numpy(hf_out), to_numpy(hx.grad), hf_params


@pytest.mark.parametrize("rope_parameters", [
    {"rope_type": "default", "rope_theta": 10000.0},
    {"rope_type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0,
     "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0},
    {"rope_type": "yarn", "factor": 40.0, "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096},
    {"rope_type": "yarn", "factor": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096},
    {"rope_type": "linear", "factor": 2.0},
])
def test_softmax_scale_matches_hugging_face(rope_parameters):
    """YaRN's mscale^2 in the score scale, as DeepseekV3Attention.scaling computes it (DeepSeek-V3's
    own checkpoint has factor 40 and mscale_all_dim 1: a scale 1.86 times 1/sqrt(dn + dr))."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_apply_mscale

    qk_head_dim = 192
    ours = mla_softmax_scale(qk_head_dim, rope_parameters)
    theirs = yarn_apply_mscale(rope_parameters, qk_head_dim ** -0.5)
    assert_close(f"mla_softmax_scale({rope_parameters})", np.float64(ours), np.float64(theirs))
    config = MLAConfig(qk_nope_head_dim=128, qk_rope_head_dim=64, rope_scaling=None)
    assert config.softmax_scale == mla_softmax_scale(192), "MLAConfig.softmax_scale without scaling"


# -- float16 and bfloat16: FlashAttention's error rule against transformers ----------------------


def _term_sizes(dout, cache):
    """mla_backward(dout, cache) with each sub-operation's backward replaced by the same sums of
    absolute values (every product of |factors|, every difference a sum): each gradient's sum of
    |terms|, for a float64 cache. A rounding anywhere in the backward is relative to these sizes,
    however far the gradient itself cancels below them."""
    def linear(d, c):          # |d| |w|^T, |x|^T |d|, sum |d|: linear_backward on absolute values
        return linear_backward(d, LinearCache(np.abs(c.x), np.abs(c.w), c.has_bias))

    def rms_norm(d, c):        # rstd (dxhat - xhat mean(dxhat xhat)), sum d xhat
        xhat, rstd, scale, _ = (np.abs(a) if isinstance(a, np.ndarray) else a for a in c)
        dxhat = d * scale
        dx = rstd * (dxhat + xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
        return dx, {"w": (d * xhat).reshape(-1, scale.shape[0]).sum(axis=0)}

    def rope(d, c):            # the rotation's transpose [[cos, sin], [-sin, cos]]: with |cos| and +-|sin|,
        cos, sin = np.abs(c[0]), np.abs(c[1])   # one of the two gives each entry its sum of |terms|
        return np.maximum(rope_backward(d, (cos, sin, *c[2:])), rope_backward(d, (cos, -sin, *c[2:])))

    def attention(d, c):       # dv = P^T d, dS = P (dP - rowsum(P dP)), dq = dS k scale, dk = dS^T q scale
        P = c.dropped
        dP = d @ np.abs(c.v).swapaxes(-1, -2)
        dS = P * (dP + (P * dP).sum(axis=-1, keepdims=True))
        return (dS @ np.abs(c.k)) * abs(c.scale), dS.swapaxes(-1, -2) @ np.abs(c.q_scaled), P.swapaxes(-1, -2) @ d

    with mock.patch.multiple(mla_module, linear_backward=linear, rms_norm_backward=rms_norm, rope_backward=rope,
                             scaled_dot_product_attention_backward=attention):
        return mla_backward(np.abs(dout), cache)


def _grads(dx, dparams):
    """{"dx": dx, "dq_a.w": ..., ...}: the gradients under the names the budget reports."""
    return {"dx": dx, **{f"d{path}": g for path, g in tree_leaves(dparams)}}


@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@given(case=cases(dtype=np.float64))
@example(case=_pinned_case())
@example(case=_pinned_case(kv_lora_rank=1))   # every latent -1: values equal, the query's gradients vanish
@example(case=_wide_case())
def test_low_precision_meets_the_error_budget(dtype, case):
    """Ours and the twin in float16 and bfloat16 against the truth (the twin in float64 on the same
    rounded inputs), within twice the error of DeepseekV3Attention in the low dtype, what a user
    compares against: out, dx and every parameter's gradient."""
    config, params, x, positions, dout = case
    x, dout, params = round_to(x, dtype), round_to(dout, dtype), tree_map(lambda p: round_to(p, dtype), params)
    x64, dout64, params64 = (tree_map(lambda a: a.astype(np.float64), a) for a in (x, dout, params))
    out, cache = mla_forward(x, params, config, positions=positions)
    dx, dparams = mla_backward(dout, cache)
    twin_out, twin_grads = autograd(_twin(config, positions), {"x": x, "params": params}, dout)
    truth_out, truth_grads = autograd(_twin(config, positions), {"x": x64, "params": params64}, dout64)
    torch_out, torch_dx, torch_params = hf_forward_backward(config, params, x, positions, dout)
    truth, torch_lowp = _grads(truth_grads["x"], truth_grads["params"]), _grads(torch_dx, torch_params)
    # A gradient that cancels far below the terms it sums (x's two paths nearly cancel; C = 1 or
    # kv_lora_rank = 1 make the latent one direction, so that its norm's gradient and the scores'
    # vanish) escapes the rule's one ulp of the largest truth: every operation rounds its output to
    # the low dtype (ours once each, transformers after each of its smaller steps), an error
    # relative to that operation's values, which reaches the gradient as a share of its terms, not
    # of the gradient. Both errors are then draws of that size, and their ratio is luck (2.1e-3
    # against PyTorch's 3.0e-4 for a bfloat16 dx of 9.8e-3 from terms of 13); where the truth is
    # exactly 0, float32's own rounding (eps32 times the terms) is left too. Allowed: the low
    # dtype's eps (its ulp at 1) times the largest sum of |terms| (_term_sizes, on the float64
    # intermediates of the case), the rule's one ulp taken (within a factor 2) at the size the
    # roundings are relative to. It covers float32's eps32 x 12 terms 2^9 (float16) to 2^12
    # (bfloat16) times over; over 1100 drawn cases the excess over 2 x PyTorch's error + one ulp
    # reached 0.2 of it.
    _, cache64 = mla_forward(x64, params64, config, positions=positions)
    extra = {name: ulp(1, dtype) * np.max(t, initial=0) for name, t in _grads(*_term_sizes(dout64, cache64)).items()}
    for who, (o, g) in {"numpy": (out, _grads(dx, dparams)),
                        "twin": (twin_out, _grads(twin_grads["x"], twin_grads["params"]))}.items():
        assert g.keys() == truth.keys() == torch_lowp.keys(), f"mla[{who}]: {sorted(g)} vs {sorted(truth)}"
        assert_error_budget(f"mla[{who}]", dtype, {"out": (o, torch_out, truth_out),
                                                   **{n: (g[n], torch_lowp[n], truth[n]) for n in truth}},
                            extra=extra)


# -- absorbed decoding equals the naive full forward ----------------------------------------------

def _chunk_sizes(data, T):
    """A prompt of 1..T-1 tokens drawn, then single tokens; all T at once without data or with T = 1."""
    if data is None or T == 1:
        return [T]
    prompt = data.draw(st.integers(1, T - 1), label="prompt")
    return [prompt] + [1] * (T - prompt)


@given(case=cases(), data=st.data())
@example(case=_pinned_case(), data=None)
def test_absorbed_decoding_equals_naive_forward(case, data):
    """A prompt, then new tokens in chunks (one at a time mostly), through the latent cache: each
    chunk's outputs equal the naive full forward's at the same positions, in NumPy and in the twin.
    The absorbed path reassociates the products (q_n W_uk^T) c_kv for q_n (c_kv W_uk) and
    (a c_kv) W_uv for a (c_kv W_uv): the same operations rounded in another order, _tol's bound."""
    config, params, x, _, _ = case
    B, T, C = x.shape
    sizes = _chunk_sizes(data, T)
    expected, cache = mla_forward(x, params, config)
    latent, twin_latent = init_latent_cache(config, B, T + 1, x.dtype), \
        init_torch_latent_cache(config, B, T + 1, to_torch(x).dtype)
    tparams, start = tree_map(to_torch, params), 0
    for n in sizes:
        chunk = x[:, start:start + n]
        out = mla_absorbed_forward(chunk, params, config, latent)
        assert_close(f"mla absorbed[{start}:{start + n}] vs naive", out, expected[:, start:start + n],
                     **_tol(cache, expected))
        twin = to_numpy(mla_absorbed(to_torch(chunk), tparams, config, twin_latent))
        assert_close(f"mla absorbed twin[{start}:{start + n}] vs naive", twin, expected[:, start:start + n],
                     **_tol(cache, expected))
        start += n
    assert latent.length == T and twin_latent.length == T, "the caches hold every token"


@pytest.mark.parametrize("q_lora_rank, rope_interleave", [(3, True), (None, False)])
def test_absorbed_decoding_equals_hugging_face_cached_decoding(q_lora_rank, rope_interleave):
    """A prompt of two tokens, then two single tokens, through DeepseekV3Attention with its
    DynamicCache (which also keeps the latent and k_r, expanding them to keys and values each
    step) and through the latent cache: the outputs agree to float64 rounding, and so do the two
    caches, k_r in Hugging Face's order (its interleaved rotation returns the pairs half-split)."""
    config, params, x, _, _ = _pinned_case(q_lora_rank, rope_interleave)
    module = exact_hf(hf_attention(config, params))
    hf_cache = transformers.DynamicCache(config=mla_hf_config(config))
    latent = init_latent_cache(config, 2, 4, np.float64)
    cos, sin = mla_hf_rotary(config, x, None)
    for start, end in ((0, 2), (2, 3), (3, 4)):
        with torch.no_grad():
            hf_out, _ = module(to_torch(x[:, start:end]), position_embeddings=(cos[:, start:end], sin[:, start:end]),
                               attention_mask=None, cache=hf_cache)
        out = mla_absorbed_forward(x[:, start:end], params, config, latent)
        assert_close(f"mla absorbed[{start}:{end}] vs DeepseekV3Attention with DynamicCache", out, to_numpy(hf_out))
    perm = half_to_interleaved(config.qk_rope_head_dim) if rope_interleave else slice(None)
    layer = hf_cache.layers[0]
    assert_close("latent cache c_kv vs DynamicCache", latent.c_kv, to_numpy(layer.keys[:, 0]))
    assert_close("latent cache k_r vs DynamicCache", latent.k_r[..., perm], to_numpy(layer.values[:, 0]))


@given(case=cases(), data=st.data())
@example(case=_pinned_case(), data=None)
@example(case=_pinned_case(q_lora_rank=None, rope_interleave=False), data=None)
def test_naive_cached_decoding_equals_full_forward_and_absorbed(case, data):
    """A prompt, then single tokens, through the naive key/value cache (full per-head keys and
    values, as Hugging Face's model caches them): each chunk's outputs equal the full forward's at
    the same positions, in NumPy and in the twin, and equal the absorbed path's on the same chunks.
    Cached or not, the keys and values are the same numbers; the new queries' scores are the full
    forward's rows, each a sum over its own keys: equal up to the summation order of one matmul
    row (BLAS may block T rows differently from one), _tol's bound. Absorbed against naive: as
    test_absorbed_decoding_equals_naive_forward."""
    config, params, x, _, _ = case
    B, T, C = x.shape
    expected, cache = mla_forward(x, params, config)
    kv = init_mla_kv_cache(config, 1, B, T + 1, x.dtype)
    twin_kv = init_torch_mla_kv_cache(config, 1, B, T + 1, to_torch(x).dtype)
    latent = init_latent_cache(config, B, T + 1, x.dtype)
    tparams, start = tree_map(to_torch, params), 0
    for n in _chunk_sizes(data, T):
        chunk, at = x[:, start:start + n], slice(start, start + n)
        out, _ = mla_forward(chunk, params, config, kv_cache=kv.layer(0))
        assert_close(f"mla naive cached[{start}:{start + n}] vs full forward", out, expected[:, at],
                     **_tol(cache, expected))
        twin = to_numpy(mla(to_torch(chunk), tparams, config, kv_cache=twin_kv.layer(0)))
        assert_close(f"mla naive cached twin[{start}:{start + n}] vs full forward", twin, expected[:, at],
                     **_tol(cache, expected))
        absorbed = mla_absorbed_forward(chunk, params, config, latent)
        assert_close(f"mla absorbed[{start}:{start + n}] vs naive cached", absorbed, out, **_tol(cache, out))
        start += n
    assert kv.length == twin_kv.length == latent.length == T, "the caches hold every token"
    layer = kv.layer(0)   # the full forward's keys and values, computed chunk by chunk (rounded as above)
    assert_close("naive cache keys", layer.k[:, :, :T], cache.sdpa.k, **_tol(cache, cache.sdpa.k))
    assert_close("naive cache values", layer.v[:, :, :T], cache.sdpa.v, **_tol(cache, cache.sdpa.v))


def test_naive_cache_bytes_per_token():
    """The naive cache's allocation per token is the figure mla_cache_bytes_per_token gives."""
    config = _pinned_case()[0]
    kv = init_mla_kv_cache(config, 1, 2, 4, np.float64)
    assert kv.bytes_per_token == mla_cache_bytes_per_token(config, np.float64)["mla_naive"] \
        == kv.nbytes // (2 * 4), "mla_naive bytes per token"
    assert kv.v.shape == (1, 2, config.n_head, 4, config.v_head_dim), f"naive cache values {kv.v.shape}"


def test_absorbed_cache_holds_only_the_latent_and_the_shared_key():
    """What the cache keeps per token is c_kv (after its norm) and the rotated k_r: a fresh
    forward's values, not keys or values per head."""
    config, params, x, _, _ = _pinned_case()
    latent = init_latent_cache(config, 2, 4, np.float64)
    mla_absorbed_forward(x, params, config, latent)
    _, cache = mla_forward(x, params, config)
    xhat_times_w = cache.latent[1][0] * params["kv_a_norm"]["w"]                # the normed latent
    assert_close("latent cache c_kv", latent.c_kv, xhat_times_w)
    k = cache.sdpa.k                                                          # (B, nh, T, dn + dr)
    assert_close("latent cache k_r", latent.k_r, k[:, 0, :, config.qk_nope_head_dim:])


# -- cache bytes per token --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cache_bytes_per_token_match_the_allocations(dtype):
    """Each figure equals the bytes per token of the cache that path allocates: the latent cache,
    the keys and values of the naive forward, and numpy_attn/kv_cache.py's cache for GQA and MHA."""
    config, params, x, _, _ = _pinned_case()
    params, x = tree_map(lambda p: p.astype(dtype), params), x.astype(dtype)
    figures = mla_cache_bytes_per_token(config, dtype, n_kv_head=1, head_size=5)
    B, T, C = x.shape
    latent = init_latent_cache(config, B, T, dtype)
    assert figures["mla_absorbed"] == (latent.c_kv.nbytes + latent.k_r.nbytes) // (B * T) \
        == latent.bytes_per_token, "mla_absorbed"
    _, cache = mla_forward(x, params, config)
    assert figures["mla_naive"] == (cache.sdpa.k.nbytes + cache.sdpa.v.nbytes) // (B * T), "mla_naive"
    assert figures["gqa"] == init_kv_cache(1, 1, 1, 1, 5, dtype).bytes_per_token, "gqa"
    assert figures["mha"] == init_kv_cache(1, 1, config.n_head, 1, 5, dtype).bytes_per_token, "mha"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_caches_take_half_the_bytes(dtype):
    """The latent cache and the byte figures take float16 and bfloat16 alike
    (the model's dtype, half the bytes of float32 per token); another dtype is refused by name."""
    config, low = _pinned_case()[0], LOW_DTYPES[dtype][0]
    latent, latent32 = init_latent_cache(config, 2, 3, low), init_latent_cache(config, 2, 3, np.float32)
    assert latent.c_kv.dtype == latent.k_r.dtype == low, f"latent cache {latent.c_kv.dtype}, {latent.k_r.dtype}"
    assert 2 * latent.bytes_per_token == latent32.bytes_per_token, "latent cache bytes per token"
    figures, figures32 = mla_cache_bytes_per_token(config, low), mla_cache_bytes_per_token(config, np.float32)
    assert {name: 2 * n for name, n in figures.items()} == figures32, f"{figures} against float32's {figures32}"
    assert figures["mla_absorbed"] == latent.bytes_per_token, "mla_absorbed"
    for call in (lambda: init_latent_cache(config, 2, 3, np.int32),
                 lambda: mla_cache_bytes_per_token(config, np.int32)):
        with pytest.raises(TypeError, match="dtype must be float16, bfloat16, float32 or float64, got int32"):
            call()


def test_cache_bytes_per_token_of_deepseek_v3():
    """DeepSeek-V3's sizes: the latent cache is (dc + dR) = 4.5 d_h numbers a token and layer, as
    the DeepSeek-V2 paper's Table 1 says (d_c = 4 d_h, d_R = d_h / 2), against 2 nh d_h for MHA."""
    config = MLAConfig(n_embd=7168, n_head=128, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                       qk_rope_head_dim=64, v_head_dim=128)
    figures = mla_cache_bytes_per_token(config, np.float16)
    d_h, itemsize = config.v_head_dim, 2
    assert figures["mla_absorbed"] == 4.5 * d_h * itemsize, figures
    assert figures["mha"] == 2 * config.n_head * d_h * itemsize, figures
    assert figures["gqa"] == 2 * 8 * d_h * itemsize, figures
    assert figures["mla_naive"] == config.n_head * (config.qk_head_dim + d_h) * itemsize, figures


# -- properties ---------------------------------------------------------------------------------

@given(case=cases(), data=st.data())
def test_causal(case, data):
    """The output at t does not depend on the inputs after t."""
    config, params, x, positions, _ = case
    T = x.shape[1]
    t = data.draw(st.integers(0, T - 1))
    changed = x.copy()
    changed[:, t + 1:] += 1
    out, cache = mla_forward(x, params, config, positions=positions)
    out_changed, _ = mla_forward(changed, params, config, positions=positions)
    assert_close(f"mla.out[:, :{t + 1}] after changing later inputs", out_changed[:, :t + 1], out[:, :t + 1],
                 rtol=0, atol=0)


@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
@pytest.mark.parametrize("q_lora_rank", [3, None])
def test_dtype_and_shapes_are_preserved(dtype, q_lora_rank):
    config = dataclasses.replace(_pinned_case()[0], q_lora_rank=q_lora_rank)
    params = init_mla_params(config, np.random.default_rng(0), dtype)
    assert {path: p.shape for path, p in tree_leaves(params)} == mla_param_shapes(config), "init shapes"
    out, cache = mla_forward(S.ramp(2, 4, 5, dtype=dtype), params, config)
    dx, grads = mla_backward(S.ramp(2, 4, 5, dtype=dtype), cache)
    assert out.dtype == dtype and dx.dtype == dtype, f"mla out {out.dtype}, dx {dx.dtype}"
    for path, g in tree_leaves(grads):
        assert g.dtype == dtype and g.shape == mla_param_shapes(config)[path], f"mla.{path} {g.dtype} {g.shape}"



@pytest.mark.parametrize("q_lora_rank", [3, None])
def test_no_tokens_give_empty_outputs_and_zero_gradients(q_lora_rank):
    """T = 0, as attention takes it: out and dx (B, 0, C), every parameter's gradient zero (an
    empty sum), and absorbed decoding of no token returns (B, 0, C) and leaves its cache as it was."""
    config, params, *_ = _pinned_case(q_lora_rank=q_lora_rank)
    x = np.zeros((2, 0, 5))
    out, cache = mla_forward(x, params, config)
    dx, grads = mla_backward(np.zeros((2, 0, 5)), cache)
    assert out.shape == (2, 0, 5) and dx.shape == (2, 0, 5), f"mla with T = 0: out {out.shape}, dx {dx.shape}"
    for path, g in tree_leaves(grads):
        assert g.shape == mla_param_shapes(config)[path] and not g.any(), f"mla.{path} with T = 0: {g}"
    latent_cache = init_latent_cache(config, 2, 4, np.float64)
    out = mla_absorbed_forward(x, params, config, latent_cache)
    assert out.shape == (2, 0, 5) and latent_cache.length == 0, f"absorbed T = 0: {out.shape}, {latent_cache.length}"

# -- finite differences (no torch) ----------------------------------------------------------------

@given(case=cases(dtype=np.float64), seed=st.integers(0, 2**32 - 1))
@example(case=_pinned_case(), seed=0)
@example(case=_pinned_case(q_lora_rank=None, rope_interleave=False), seed=1)
def test_backward_matches_finite_differences(case, seed):
    """One directional derivative of sum(out * dout) along a random direction in x and every parameter."""
    config, params, x, positions, dout = case
    rng = np.random.default_rng(seed)
    tree = {"x": x, "params": params}
    direction = tree_map(lambda p: rng.uniform(-1, 1, p.shape), tree)
    _, cache = mla_forward(x, params, config, positions=positions)
    dx, dparams = mla_backward(dout, cache)
    grads = {"x": dx, "params": dparams}
    exact = tree_dot(grads, direction)
    # The step shrinks with the narrowest RMS-norm row, as in test_llama.py.
    h = 1e-4 / max([1.0] + [float(r.max()) for r in mla_rstds(cache)])
    numeric = directional_derivative(
        lambda t: np.sum(mla_forward(t["x"], t["params"], config, positions=positions)[0] * dout),
        tree, direction, h=h)
    assert_close("mla directional derivative vs finite differences", np.float64(exact), np.float64(numeric),
                 **directional_tol(grads, direction))


# -- bad input --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, error, message", [
    (dict(kv_lora_rank=0), ValueError, r"MLAConfig.kv_lora_rank must be a positive integer, got 0"),
    (dict(q_lora_rank=0), ValueError, r"MLAConfig.q_lora_rank must be a positive integer, got 0"),
    (dict(q_lora_rank=2.0), TypeError, r"MLAConfig.q_lora_rank must be None or an integer, got float 2.0"),
    (dict(qk_rope_head_dim=3), ValueError, r"MLAConfig.qk_rope_head_dim must be even .* got 3"),
    (dict(qk_rope_head_dim=0), ValueError, r"MLAConfig.qk_rope_head_dim must be an integer >= 2, got 0"),
    (dict(qk_nope_head_dim=0), ValueError, r"MLAConfig.qk_nope_head_dim must be a positive integer, got 0"),
    (dict(v_head_dim=-1), ValueError, r"MLAConfig.v_head_dim must be a positive integer, got -1"),
    (dict(n_head=True), TypeError, r"MLAConfig.n_head must be an integer, got bool True"),
    (dict(rope_interleave=1), TypeError, r"MLAConfig.rope_interleave must be a bool, got int 1"),
    (dict(rms_eps=-1.0), ValueError, r"MLAConfig.rms_eps must be a number >= 0"),
    (dict(rope_theta=1.0), ValueError, r"theta must be a number > 1, got 1.0"),
    (dict(rope_scaling={"rope_type": "linear"}), ValueError, r"linear scaling needs factor > 0, got None"),
])
def test_bad_config(kw, error, message):
    with pytest.raises(error, match=message):
        MLAConfig(**kw)


def test_bad_input():
    config, params, x, _, _ = _pinned_case()
    wrong = {**params, "kv_b": {"w": np.zeros((4, 3 * 4))}}              # dn + dv = 5 per head, not 4
    with pytest.raises(ValueError, match=r"kv_b.w must have shape \(4, 15\) for this config, got \(4, 12\)"):
        mla_forward(x, wrong, config)
    no_rank = dataclasses.replace(config, q_lora_rank=None)
    with pytest.raises(ValueError, match=r"params must hold \[.*'q.w'.*\] for this config, got \[.*'q_a.w'"):
        mla_forward(x, params, no_rank)
    with pytest.raises(ValueError, match=r"x must have shape \(B, T, C\) with C = n_embd = 5, got \(2, 4, 4\)"):
        mla_forward(x[..., :4], params, config)
    with pytest.raises(ValueError, match=r"x of shape \(2, 4, 5\) holds NaN or inf"):
        mla_forward(np.where(x > 1, np.nan, x), params, config)
    with pytest.raises(TypeError, match=r"q_a.w has dtype float64, x has float32"):
        mla_forward(x.astype(np.float32), params, config)
    with pytest.raises(TypeError, match="config must be an MLAConfig, got dict"):
        mla_forward(x, params, {})
    with pytest.raises(ValueError, match=r"positions must have shape \(4,\) or \(2, 4\)"):
        mla_forward(x, params, config, positions=np.arange(3))
    _, cache = mla_forward(x, params, config)
    with pytest.raises(ValueError, match=r"mla: dout must have the shape of the forward's output, \(2, 4, 5\)"):
        mla_backward(np.zeros((2, 4, 3)), cache)
    latent = init_latent_cache(config, 2, 5, np.float64)
    mla_absorbed_forward(x, params, config, latent)
    with pytest.raises(ValueError, match=r"latent_cache overflow: it holds 4 tokens, appending 2 would make 6"):
        mla_absorbed_forward(x[:, :2], params, config, latent)
    assert latent.length == 4, "a refused step leaves the cache as it was"
    with pytest.raises(TypeError, match="latent_cache must be a LatentCache"):
        mla_absorbed_forward(x, params, config, {})
    # the latent's width 5 apart from the rotary key's 4, so that the message tells each shape apart
    wide, wide_params, _, _, _ = _pinned_case(kv_lora_rank=5)
    with pytest.raises(ValueError, match=r"^latent_cache arrays \(1, 5, 5\), \(1, 5, 4\) must be \(2, 5, 5\), "
                                         r"\(2, 5, 4\) for x \(2, 4, 5\) and this config$"):
        mla_absorbed_forward(x, wide_params, wide, init_latent_cache(wide, 1, 5, np.float64))
    with pytest.raises(ValueError, match="max_len must be >= 1, got 0"):
        init_latent_cache(config, 2, 0)
    with pytest.raises(ValueError, match="n_kv_head = 2 must divide n_head = 3"):
        mla_cache_bytes_per_token(config, n_kv_head=2)
    with pytest.raises(TypeError, match="rng must be a np.random.Generator, got int"):
        init_mla_params(config, 0)


def test_bad_naive_kv_cache():
    config, params, x, _, dout = _pinned_case()
    with pytest.raises(TypeError, match=r"kv_cache must be one layer of an MLA key/value cache .* got KVCache"):
        mla_forward(x, params, config, kv_cache=init_mla_kv_cache(config, 1, 2, 5, np.float64))
    plain = init_kv_cache(1, 2, config.n_head, 5, config.qk_head_dim, np.float64)   # values of width dn + dr
    with pytest.raises(ValueError, match=r"kv_cache \(B, heads, key width, value width\) = \(2, 3, 6, 6\) "
                                         r"must be \(2, 3, 6, 3\)"):
        mla_forward(x, params, config, kv_cache=plain.layer(0))
    with pytest.raises(TypeError, match="kv_cache holds float32, x is float64"):
        mla_forward(x, params, config, kv_cache=init_mla_kv_cache(config, 1, 2, 5, np.float32).layer(0))
    kv = init_mla_kv_cache(config, 1, 2, 5, np.float64)
    mla_forward(x, params, config, kv_cache=kv.layer(0))
    with pytest.raises(ValueError, match=r"kv_cache overflow: it holds 4 tokens, appending 2 would make 6"):
        mla_forward(x[:, :2], params, config, kv_cache=kv.layer(0))
    assert kv.length == 4, "a refused step leaves the cache as it was"
    _, cache = mla_forward(x[:, :1], params, config, kv_cache=kv.layer(0))
    with pytest.raises(ValueError, match=r"mla_backward: the forward attended over 5 keys of which only 1"):
        mla_backward(dout[:, :1], cache)

