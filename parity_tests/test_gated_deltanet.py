"""Parity tests for numpy_attn/gated_deltanet.py and torch_attn/gated_deltanet.py: Qwen3.5's
linear-attention sublayer against Hugging Face's Qwen3_5GatedDeltaNet, the twin, finite
differences, and decoding one token at a time against the full forward."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

from numpy_attn.gated_deltanet import gated_deltanet_backward, gated_deltanet_forward
from parity_tests.helpers import assert_close, assert_tree_close, autograd, to_numpy, to_torch
from parity_tests.model_kit import (
    assert_decoding_equals_the_full_forward,
    assert_sublayer_keeps_float32,
    assert_sublayer_matches_finite_differences,
)
from torch_attn.gated_deltanet import gated_deltanet

# The tiny Qwen3.5 of the brief: width 32, 2 key heads serving 4 value heads, heads of 8, 4 taps.
SIZES = dict(num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=8)
C, K = 32, 4
CONV_DIM = 2 * 2 * 8 + 4 * 8


def hf_module(seed):
    """Hugging Face's sublayer in float32 with random weights (the norm, dt_bias and A_log moved
    off their initial values so that each matters)."""
    config = Qwen3_5TextConfig(hidden_size=C, linear_num_key_heads=2, linear_num_value_heads=4,
                               linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=K,
                               num_hidden_layers=1, layer_types=["linear_attention"])
    torch.manual_seed(seed)
    module = Qwen3_5GatedDeltaNet(config, layer_idx=0)
    with torch.no_grad():
        module.norm.weight.normal_(1.0, 0.3)
        module.dt_bias.normal_()
        module.A_log.normal_(0.0, 0.5)
    return module, config.rms_norm_eps


def params_of(module):
    """Our params (float64) from the module's: linear weights transposed to (C_in, C_out), the
    convolution's (conv_dim, 1, K) squeezed to (conv_dim, K)."""
    p = {name: to_numpy(t).astype(np.float64) for name, t in module.named_parameters()}
    params = {name: {"w": p[f"{name}.weight"].T.copy()}
              for name in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")}
    params.update(conv1d={"w": p["conv1d.weight"][:, 0].copy()}, dt_bias=p["dt_bias"], A_log=p["A_log"],
                  norm={"w": p["norm.weight"]})
    return params


def hf_grads(module):
    """The module's parameter gradients in our layout."""
    g = {name: t.grad.double().numpy() for name, t in module.named_parameters()}
    grads = {name: {"w": g[f"{name}.weight"].T.copy()}
             for name in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")}
    grads.update(conv1d={"w": g["conv1d.weight"][:, 0].copy()}, dt_bias=g["dt_bias"], A_log=g["A_log"],
                 norm={"w": g["norm.weight"]})
    return grads


def random_params(rng, dtype=np.float64):
    """Weights of the scale of the models' (1 / sqrt(fan-in)), the norm near 1."""
    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(dtype)
    nv, dv = SIZES["num_v_heads"], SIZES["head_v_dim"]
    return {"in_proj_qkv": {"w": w(C, CONV_DIM)}, "in_proj_z": {"w": w(C, nv * dv)},
            "in_proj_b": {"w": w(C, nv)}, "in_proj_a": {"w": w(C, nv)}, "conv1d": {"w": w(K, CONV_DIM).T.copy()},
            "dt_bias": rng.standard_normal(nv).astype(dtype), "A_log": (0.5 * rng.standard_normal(nv)).astype(dtype),
            "norm": {"w": (1 + 0.3 * rng.standard_normal(dv)).astype(dtype)},
            "out_proj": {"w": w(nv * dv, C)}}


# -- against Hugging Face --------------------------------------------------------------------------

@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16), B=st.integers(1, 2), T=st.sampled_from([1, 5, 16, 40, 70]),
       padded=st.booleans())
def test_matches_transformers(seed, B, T, padded):
    """Ours in float64 against Hugging Face's module in float32 (its delta rule computes in float32
    whatever the weights' dtype, so a float64 module would still hold float32's digits only).

    Tolerance: every value here is O(1) (unit q and k, |beta| < 1, decays <= 1, weights scaled by
    1 / sqrt(fan-in)), and each output is a chain of a few dozen float32 roundings (projections
    of 32 terms, the convolution's 4, the norms, the chunk's solve over up to 64 steps, whose
    errors the decays damp). float32's unit roundoff 6e-8 times a growth of a few hundred gives
    2e-5 relative to the largest value, for the outputs and dx (autograd's backward replays the
    same chain). A parameter's gradient is besides a sum over the B * T positions, whose float32
    errors add up as sqrt(B * T) while the sum itself may cancel (dA_log and ddt_bias, one number
    per head from every position): its bound is 2e-5 * sqrt(B * T) of its largest value.
    Measured over 75 cases (T up to 70): out 4.8e-6, dx 4.4e-6 of the largest value; the
    parameters at most 2.2e-6 * sqrt(B * T) (dA_log 1.4e-5 of its largest value)."""
    module, eps = hf_module(seed)
    params = params_of(module)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, T, C))
    dout = rng.standard_normal((B, T, C))
    # Left padding: the last row's first T // 3 tokens (Hugging Face zeroes them before the projections).
    mask = np.ones((B, T), bool)
    mask[-1, :T // 3] = False
    mask = mask if padded else None
    out, _, cache = gated_deltanet_forward(x, params, **SIZES, eps=eps, mask=mask)
    dx, grads = gated_deltanet_backward(dout, cache)
    xt = to_torch(x.astype(np.float32), requires_grad=True)
    theirs = module(xt, attention_mask=None if mask is None else to_torch(mask))
    (theirs * to_torch(dout.astype(np.float32))).sum().backward()

    def close(name, ours, ref, summed=False):
        scale = np.abs(ref).max() * (np.sqrt(B * T) if summed else 1)
        assert_close(name, ours, ref, rtol=0, atol=2e-5 * max(scale, 1e-3))
    close("gated_deltanet.out vs transformers", out, to_numpy(theirs).astype(np.float64))
    close("gated_deltanet.dx vs transformers", dx, xt.grad.double().numpy())
    ref_grads = hf_grads(module)
    for name in grads:
        ours, ref = grads[name], ref_grads[name]
        for key in (ours if isinstance(ours, dict) else {None: ours}):
            o = ours[key] if key else ours
            r = ref[key] if key else ref
            close(f"gated_deltanet.d{name} vs transformers", o, r, summed=True)


# -- the twin --------------------------------------------------------------------------------------

@st.composite
def cases(draw):
    """(x, params, dout, state, mask, chunk_size): float64, an optional state and padding mask."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    B, T = draw(st.integers(1, 2)), draw(st.integers(1, 9))
    nv, dk, dv = SIZES["num_v_heads"], SIZES["head_k_dim"], SIZES["head_v_dim"]
    state = None
    if draw(st.booleans()):
        state = {"conv": rng.standard_normal((B, CONV_DIM, K - 1)),
                 "recurrent": 0.3 * rng.standard_normal((B, nv, dk, dv))}
    mask = None
    if draw(st.booleans()):
        mask = rng.random((B, T)) > 0.3
    return (rng.standard_normal((B, T, C)), random_params(rng), rng.standard_normal((B, T, C)), state, mask,
            draw(st.sampled_from([1, 2, 4, 64])))


@pytest.mark.twin_parity
@settings(max_examples=30, deadline=None)
@given(case=cases())
def test_matches_twin_and_autograd(case):
    """float64: the same operations in the same order, differing by a few ulps per step of a chain
    of O(1) values; helpers' float64 tolerance (rtol 1e-10) holds with room."""
    x, params, dout, state, mask, chunk_size = case
    out, new_state, cache = gated_deltanet_forward(x, params, **SIZES, state=state, mask=mask, chunk_size=chunk_size)
    dx, grads = gated_deltanet_backward(dout, cache)
    twin_state = {}

    def run(x, params):
        o, s = gated_deltanet(x, params, **SIZES,
                              state=None if state is None else {k: to_torch(v) for k, v in state.items()},
                              mask=None if mask is None else to_torch(mask), chunk_size=chunk_size)
        twin_state.update(s)
        return o
    twin_out, twin_grads = autograd(run, {"x": x, "params": params}, dout)
    assert_close("gated_deltanet.out", out, twin_out)
    for key in ("conv", "recurrent"):
        assert_close(f"gated_deltanet.state.{key}", new_state[key], to_numpy(twin_state[key]))
    assert_close("gated_deltanet.dx", dx, twin_grads["x"])
    assert_tree_close("gated_deltanet.dparams", grads, twin_grads["params"])


# -- finite differences ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["x", "A_log", "dt_bias", "conv1d", "norm", "in_proj_a"])
def test_backward_matches_finite_differences(name):
    rng = np.random.default_rng(7)
    x, params, dout = rng.standard_normal((2, 6, C)), random_params(rng), rng.standard_normal((2, 6, C))
    state = {"conv": rng.standard_normal((2, CONV_DIM, K - 1)), "recurrent": 0.3 * rng.standard_normal((2, 4, 8, 8))}
    mask = np.array([[False, True, True, True, True, True], [True] * 6])
    assert_sublayer_matches_finite_differences("gated_deltanet", gated_deltanet_forward, gated_deltanet_backward,
                                               x, params, dout, name, **SIZES, state=state, mask=mask, chunk_size=4)


def test_beta_scale_matches_twin_and_finite_differences():
    """beta_scale = 2 (OLMo Hybrid's, beta in (0, 2)): the twin's forward and autograd gradients,
    and five-point differences of in_proj_b (the weight whose gradient the scale enters), in float64;
    scale 2 changes the output, so the scale is used."""
    rng = np.random.default_rng(11)
    x, params, dout = rng.standard_normal((2, 6, C)), random_params(rng), rng.standard_normal((2, 6, C))
    out, _, cache = gated_deltanet_forward(x, params, **SIZES, chunk_size=4, beta_scale=2.0)
    dx, grads = gated_deltanet_backward(dout, cache)
    twin_out, twin_grads = autograd(lambda x, params: gated_deltanet(x, params, **SIZES, chunk_size=4,
                                                                      beta_scale=2.0)[0],
                                    {"x": x, "params": params}, dout)
    assert_close("gated_deltanet.beta_scale.out", out, twin_out)
    assert_close("gated_deltanet.beta_scale.dx", dx, twin_grads["x"])
    assert_tree_close("gated_deltanet.beta_scale.dparams", grads, twin_grads["params"])
    assert not np.allclose(out, gated_deltanet_forward(x, params, **SIZES, chunk_size=4)[0])
    assert_sublayer_matches_finite_differences("gated_deltanet.beta_scale", gated_deltanet_forward,
                                               gated_deltanet_backward, x, params, dout, "in_proj_b", **SIZES,
                                               chunk_size=4, beta_scale=2.0)


# -- decoding --------------------------------------------------------------------------------------

@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), T=st.integers(2, 12), data=st.data())
def test_prefill_then_decoding_equals_the_full_forward(seed, T, data):
    """A prefill of T1 tokens (chunked), then one token at a time (the recurrence) with the state
    carried, gives the full forward's outputs and final state: float64 to rounding."""
    rng = np.random.default_rng(seed)
    params, x = random_params(rng), rng.standard_normal((2, T, C))
    T1 = data.draw(st.integers(1, T - 1))
    assert_decoding_equals_the_full_forward("gated_deltanet", gated_deltanet_forward, x, params, T1,
                                            **SIZES)


def test_float32_keeps_its_dtype():
    rng = np.random.default_rng(3)
    params = random_params(rng, np.float32)
    x = rng.standard_normal((1, 5, C)).astype(np.float32)
    assert_sublayer_keeps_float32(gated_deltanet_forward, gated_deltanet_backward,
                                  x, params, ("A_log", "conv1d", "norm"), **SIZES)


# -- refusals --------------------------------------------------------------------------------------

def _bad(change):
    rng = np.random.default_rng(0)
    args = dict(x=rng.standard_normal((1, 3, C)), params=random_params(rng), **SIZES)
    change(args, rng)
    return args


@pytest.mark.parametrize("change, error, message", [
    (lambda a, r: a.update(x=a["x"][0]), ValueError, "x must have 3 dimensions"),
    (lambda a, r: a.update(x=a["x"].astype(np.float16)), TypeError, "float16"),
    (lambda a, r: a.update(num_k_heads=3), ValueError, r"num_v_heads \(4\) must be a multiple of num_k_heads \(3\)"),
    (lambda a, r: a.update(head_v_dim=0), ValueError, "head_v_dim must be a positive integer, got 0"),
    (lambda a, r: a["params"].update(A_log=np.zeros(3)), ValueError, r"A_log must be \(4,\), got \(3,\)"),
    (lambda a, r: a["params"].pop("norm"), ValueError, "params lacks norm.w"),
    (lambda a, r: a["params"]["out_proj"].update(b=np.zeros(C)), ValueError, "out_proj takes a weight w only"),
    (lambda a, r: a["params"].update(dt_bias=np.zeros(4, np.float32)), TypeError, "dt_bias is float32"),
    (lambda a, r: a.update(state={"conv": np.zeros((1, CONV_DIM, 2)), "recurrent": np.zeros((1, 4, 8, 8))}),
     ValueError, r"state conv must be \(1, 64, 3\), got \(1, 64, 2\)"),
    (lambda a, r: a.update(mask=np.ones((1, 4), bool)), ValueError, r"mask must be a bool array \(B, T\) = \(1, 3\)"),
    (lambda a, r: a.update(chunk_size=0), ValueError, "chunk_size"),
    (lambda a, r: a.update(beta_scale=0.0), ValueError, "beta_scale must be a positive finite number, got 0.0"),
    (lambda a, r: a.update(beta_scale="2"), ValueError, "beta_scale must be a positive finite number, got '2'"),
])
def test_bad_input_is_refused_naming_it(change, error, message):
    with pytest.raises(error, match=message):
        gated_deltanet_forward(**_bad(change))


def test_bad_dout_is_refused():
    args = _bad(lambda a, r: None)
    out, _, cache = gated_deltanet_forward(**args)
    with pytest.raises(ValueError, match="dout"):
        gated_deltanet_backward(out[:, :2], cache)
