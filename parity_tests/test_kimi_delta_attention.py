"""Parity tests for numpy_attn/kimi_delta_attention.py and torch_attn/kimi_delta_attention.py: Kimi
Linear's linear-attention sublayer against Hugging Face's KimiLinearDeltaAttention in float64, the
twin, finite differences, and decoding one token at a time against the full forward."""

import inspect

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import KimiLinearConfig
from transformers.models.kimi_linear import modeling_kimi_linear as hf_modeling

from numpy_attn._tree import tree_map
from numpy_attn.kimi_delta_attention import (
    kimi_delta_attention_backward,
    kimi_delta_attention_forward,
    kimi_delta_attention_param_shapes,
)
from parity_tests.helpers import assert_close, assert_tree_close, autograd, to_numpy, to_torch
from parity_tests.model_kit import (
    assert_decoding_equals_the_full_forward,
    assert_sublayer_keeps_float32,
    assert_sublayer_matches_finite_differences,
    float64_twin,
)
from torch_attn.kimi_delta_attention import kimi_delta_attention

# A tiny KDA: width 16, 2 heads of 4 channels, 4 taps.
SIZES = dict(num_heads=2, head_dim=4)
C, K, NH, D = 16, 4, 2, 4
CONV_DIM = 3 * NH * D
EPS = 1e-5
LINEARS = ("q_proj", "k_proj", "v_proj", "b_proj", "g_a_proj", "g_b_proj", "o_proj")
GATE = ("f_a_proj", "f_b_proj")


def exact(monkeypatch):
    """Make Kimi Linear's float64 modules compute in float64 throughout. transformers keeps these
    steps in float32 whatever the weights' dtype: both delta rules (chunk_kimi_delta_attention,
    recurrent_kimi_delta_attention) cast q, k, v, g, beta to float32; the forget gate forms g with
    .float(); KimiLinearRMSNorm and KimiLinearRMSNormGated normalise in float32. Each is run again
    from its source with those casts made float64 (model_kit.float64_twin)."""
    for name in ("chunk_kimi_delta_attention", "recurrent_kimi_delta_attention"):
        monkeypatch.setattr(hf_modeling, name, float64_twin(getattr(hf_modeling, name), hf_modeling))
    for cls in (hf_modeling.KimiLinearForgetGate, hf_modeling.KimiLinearRMSNorm, hf_modeling.KimiLinearRMSNormGated):
        monkeypatch.setattr(cls, "forward", float64_twin(inspect.unwrap(cls.forward), hf_modeling))


def hf_module(seed):
    """Hugging Face's sublayer in float64, every parameter from N(0, 0.5^2) (dt_bias then keeps the
    softplus's input far below 20, where transformers' softplus switches to the identity)."""
    config = KimiLinearConfig(hidden_size=C, linear_num_heads=NH, linear_head_dim=D, linear_conv_kernel_dim=K,
                              num_hidden_layers=1, layer_types=["linear_attention"], rms_norm_eps=EPS)
    torch.manual_seed(seed)
    module = hf_modeling.KimiLinearDeltaAttention(config, layer_idx=0)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.5)
    return module.double()


def ours_from_hf(t):
    """Our tree from the module's {name: array} (parameters or gradients): linear weights
    transposed to (C_in, C_out), the convolution's (conv_dim, 1, K) squeezed, the forget gate's
    four flattened, A_log (1, 1, nh, 1) as (nh,)."""
    tree = {name: {"w": t[f"{name}.weight"].T.copy()} for name in LINEARS}
    tree.update({name: {"w": t[f"forget_gate.{name}.weight"].T.copy()} for name in GATE})
    tree.update(conv1d={"w": t["conv1d.weight"][:, 0].copy()}, dt_bias=t["forget_gate.dt_bias"].copy(),
                A_log=t["forget_gate.A_log"].reshape(NH).copy(), o_norm={"w": t["o_norm.weight"].copy()})
    return tree


def random_params(rng, dtype=np.float64):
    """Weights of the scale of the model's (1 / sqrt(fan-in)), the norm near 1, dt_bias near -2."""
    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(dtype)
    return {"q_proj": {"w": w(C, NH * D)}, "k_proj": {"w": w(C, NH * D)}, "v_proj": {"w": w(C, NH * D)},
            "conv1d": {"w": w(K, CONV_DIM).T.copy()}, "f_a_proj": {"w": w(C, D)}, "f_b_proj": {"w": w(D, NH * D)},
            "dt_bias": (rng.standard_normal(NH * D) - 2).astype(dtype),
            "A_log": (0.5 * rng.standard_normal(NH)).astype(dtype), "b_proj": {"w": w(C, NH)},
            "g_a_proj": {"w": w(C, D)}, "g_b_proj": {"w": w(D, NH * D)},
            "o_norm": {"w": (1 + 0.3 * rng.standard_normal(D)).astype(dtype)}, "o_proj": {"w": w(NH * D, C)}}


# -- against Hugging Face --------------------------------------------------------------------------

@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**16), B=st.integers(1, 2), T=st.sampled_from([1, 5, 16, 70]), padded=st.booleans())
def test_matches_transformers_in_float64(seed, B, T, padded):
    """Output, dx and every parameter's gradient equal Hugging Face's module made float64 by
    ``exact``; T = 70 runs two chunks.

    Tolerance: the same operations summed in other orders (BLAS blocks; the chunk's triangular
    solve a loop there, row by row here) differ by a few ulps (1.1e-16) of the largest term they
    combine per step; a chain of some dozens of steps, with the norms and the solve amplifying by
    O(10), stays near 1e-13 of the largest value compared (measured: 5e-14 on dx, 2e-13 on
    f_b_proj's gradient for T = 70). rtol and atol 1e-10 of that largest value leave 500x room and
    still catch a wrong term, which errs by 1e-3 of it or more."""
    module = hf_module(seed)
    params = ours_from_hf({k: to_numpy(p) for k, p in module.named_parameters()})
    rng = np.random.default_rng(seed)
    x, dout = rng.standard_normal((B, T, C)), rng.standard_normal((B, T, C))
    mask = np.ones((B, T), bool)
    mask[-1, :T // 3] = False                                          # left padding of the last row
    mask = mask if padded else None
    out, _, cache = kimi_delta_attention_forward(x, params, **SIZES, eps=EPS, mask=mask)
    dx, grads = kimi_delta_attention_backward(dout, cache)
    xt = to_torch(x, requires_grad=True)
    with pytest.MonkeyPatch.context() as monkeypatch:
        exact(monkeypatch)
        theirs = module(xt, attention_mask=None if mask is None else to_torch(mask))
        (theirs * to_torch(dout)).sum().backward()
    ref_grads = ours_from_hf({k: to_numpy(p.grad) for k, p in module.named_parameters()})

    def close(name, ours, ref):
        scale = float(np.abs(ref).max())
        assert_close(f"kimi_delta_attention.{name} vs transformers", ours, ref, rtol=1e-10, atol=1e-10 * scale)
    close("out", out, to_numpy(theirs))
    close("dx", dx, to_numpy(xt.grad))
    for name, ours in grads.items():
        close(f"d{name}", ours["w"] if isinstance(ours, dict) else ours,
              ref_grads[name]["w"] if isinstance(ours, dict) else ref_grads[name])


# -- the twin --------------------------------------------------------------------------------------

@st.composite
def cases(draw):
    """(x, params, dout, state, mask, chunk_size): float64, an optional state and padding mask."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    B, T = draw(st.integers(1, 2)), draw(st.integers(1, 9))
    state = None
    if draw(st.booleans()):
        state = {"conv": rng.standard_normal((B, CONV_DIM, K - 1)),
                 "recurrent": 0.3 * rng.standard_normal((B, NH, D, D))}
    mask = rng.random((B, T)) > 0.3 if draw(st.booleans()) else None
    return (rng.standard_normal((B, T, C)), random_params(rng), rng.standard_normal((B, T, C)), state, mask,
            draw(st.sampled_from([1, 2, 4, 64])))


@pytest.mark.twin_parity
@settings(max_examples=30, deadline=None)
@given(case=cases())
def test_matches_twin_and_autograd(case):
    """float64: the same operations in the same order, differing by a few ulps per step of a chain
    of O(1) values; helpers' float64 tolerance (rtol 1e-10) holds with room."""
    x, params, dout, state, mask, chunk_size = case
    out, new_state, cache = kimi_delta_attention_forward(x, params, **SIZES, state=state, mask=mask,
                                                         chunk_size=chunk_size)
    dx, grads = kimi_delta_attention_backward(dout, cache)
    twin_state = {}

    def run(x, params):
        o, s = kimi_delta_attention(x, params, **SIZES,
                                    state=None if state is None else {k: to_torch(v) for k, v in state.items()},
                                    mask=None if mask is None else to_torch(mask), chunk_size=chunk_size)
        twin_state.update(s)
        return o
    twin_out, twin_grads = autograd(run, {"x": x, "params": params}, dout)
    assert_close("kimi_delta_attention.out", out, twin_out)
    for key in ("conv", "recurrent"):
        assert_close(f"kimi_delta_attention.state.{key}", new_state[key], to_numpy(twin_state[key]))
    assert_close("kimi_delta_attention.dx", dx, twin_grads["x"])
    assert_tree_close("kimi_delta_attention.dparams", grads, twin_grads["params"])


# -- finite differences ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["x", "A_log", "dt_bias", "f_a_proj", "f_b_proj", "g_a_proj", "conv1d", "o_norm"])
def test_backward_matches_finite_differences(name):
    rng = np.random.default_rng(7)
    x, params, dout = rng.standard_normal((2, 6, C)), random_params(rng), rng.standard_normal((2, 6, C))
    state = {"conv": rng.standard_normal((2, CONV_DIM, K - 1)), "recurrent": 0.3 * rng.standard_normal((2, NH, D, D))}
    mask = np.array([[False, True, True, True, True, True], [True] * 6])
    assert_sublayer_matches_finite_differences("kimi_delta_attention", kimi_delta_attention_forward,
                                               kimi_delta_attention_backward, x, params, dout, name, **SIZES,
                                               state=state, mask=mask, chunk_size=4)


# -- decoding --------------------------------------------------------------------------------------

@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), T=st.integers(2, 12), data=st.data())
def test_prefill_then_decoding_equals_the_full_forward(seed, T, data):
    """A prefill of T1 tokens (chunked), then one token at a time (the recurrence) with the state
    carried, gives the full forward's outputs and final state: float64 to rounding."""
    rng = np.random.default_rng(seed)
    params, x = random_params(rng), rng.standard_normal((2, T, C))
    T1 = data.draw(st.integers(1, T - 1))
    assert_decoding_equals_the_full_forward("kimi_delta_attention", kimi_delta_attention_forward, x, params, T1,
                                            **SIZES)


def test_float32_keeps_its_dtype():
    rng = np.random.default_rng(3)
    params = random_params(rng, np.float32)
    x = rng.standard_normal((1, 5, C)).astype(np.float32)
    assert_sublayer_keeps_float32(kimi_delta_attention_forward, kimi_delta_attention_backward,
                                  x, params, ("A_log", "dt_bias", "o_norm"), **SIZES)


# -- refusals --------------------------------------------------------------------------------------

def _bad(change):
    rng = np.random.default_rng(0)
    args = dict(x=rng.standard_normal((1, 3, C)), params=random_params(rng), **SIZES)
    change(args)
    return args


@pytest.mark.parametrize("change, error, message", [
    (lambda a: a.update(x=a["x"][0]), ValueError, "x must have 3 dimensions"),
    (lambda a: a.update(x=a["x"].astype(np.float16)), TypeError, "float16"),
    (lambda a: a.update(num_heads=0), ValueError, "num_heads must be a positive integer, got 0"),
    (lambda a: a.update(head_dim=3), ValueError, r"params q_proj.w must be \(16, 6\), got \(16, 8\)"),
    (lambda a: a["params"].update(A_log=np.zeros(3)), ValueError, r"A_log must be \(2,\), got \(3,\)"),
    (lambda a: a["params"].update(dt_bias=np.zeros(2)), ValueError, r"dt_bias must be \(8,\), got \(2,\)"),
    (lambda a: a["params"].pop("o_norm"), ValueError, "params lacks o_norm.w"),
    (lambda a: a["params"]["g_b_proj"].update(b=np.zeros(8)), ValueError, "g_b_proj takes a weight w only"),
    (lambda a: a["params"].update(A_log=np.zeros(2, np.float32)), TypeError, "A_log is float32"),
    (lambda a: a.update(state={"conv": np.zeros((1, CONV_DIM, 2)), "recurrent": np.zeros((1, NH, D, D))}),
     ValueError, r"state conv must be \(1, 24, 3\), got \(1, 24, 2\)"),
    (lambda a: a.update(mask=np.ones((1, 4), bool)), ValueError, r"mask must be a bool array \(B, T\) = \(1, 3\)"),
    (lambda a: a.update(chunk_size=0), ValueError, "chunk_size"),
])
def test_bad_input_is_refused_naming_it(change, error, message):
    with pytest.raises(error, match=message):
        kimi_delta_attention_forward(**_bad(change))


def test_one_head_of_one_channel_runs_as_the_twin():
    """The smallest sizes the check accepts, num_heads = head_dim = 1, run, as the twin does."""
    rng = np.random.default_rng(0)
    shapes = kimi_delta_attention_param_shapes(C, 1, 1, K)
    params = {}
    for path, shape in shapes.items():
        name, _, leaf = path.partition(".")
        value = rng.standard_normal(shape) / np.sqrt(shape[0])
        params[name] = {leaf: value} if leaf else value
    x = rng.standard_normal((1, 5, C))
    out, state, _ = kimi_delta_attention_forward(x, params, num_heads=1, head_dim=1, eps=EPS)
    twin_out, twin_state = kimi_delta_attention(to_torch(x), tree_map(to_torch, params), num_heads=1, head_dim=1,
                                                eps=EPS)
    assert_close("kimi_delta_attention.out", out, twin_out)
    assert state["recurrent"].shape == (1, 1, 1, 1)


def test_bad_dout_is_refused():
    args = _bad(lambda a: None)
    out, _, cache = kimi_delta_attention_forward(**args)
    with pytest.raises(ValueError, match="dout"):
        kimi_delta_attention_backward(out[:, :2], cache)
