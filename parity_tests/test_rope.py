"""Parity tests for numpy_attn/rope.py and torch_attn/rope.py, against Hugging Face's Llama too."""

import math
import re

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from transformers import LlamaConfig, modeling_rope_utils
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import (
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from numpy_attn.rope import (
    half_to_interleaved,
    rope_attention_factor,
    rope_backward,
    rope_forward,
    rope_frequencies,
)
from parity_tests import strategies as S
from parity_tests.helpers import (
    FD_TOL,
    LOW_DTYPES,
    TOLERANCES,
    assert_close,
    assert_error_budget,
    autograd,
    numerical_grad,
    round_to,
    to_numpy,
    to_torch,
)
from torch_attn.rope import rope

layouts = st.sampled_from(["half", "interleaved"])
thetas = st.sampled_from([10000.0, 500000.0, 10.0])


@st.composite
def scalings(draw):
    """None, linear or llama3 (with an original context short enough that all three bands of
    the llama3 blend occur at head sizes of a few channels)."""
    kind = draw(st.sampled_from(["none", "linear", "llama3"]))
    if kind == "none":
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": draw(st.sampled_from([2.0, 4.0, 0.5]))}
    low = draw(st.sampled_from([1.0, 2.0]))
    return {"rope_type": "llama3", "factor": draw(st.sampled_from([8.0, 2.0])),
            "low_freq_factor": low, "high_freq_factor": low * draw(st.sampled_from([2.0, 4.0])),
            "original_max_position_embeddings": draw(st.sampled_from([16, 64, 8192]))}


@st.composite
def cases(draw, dtype=None):
    """(x, positions, dout, theta, layout, scaling): x (..., T, hs) with 0 to 2 leading dims,
    positions (T,) or one row per leading index, integers that may repeat, skip or go backwards."""
    dtype = draw(S.dtypes) if dtype is None else dtype
    lead = draw(S.batch_shapes())
    T, hs = draw(S.dim(1, 5)), 2 * draw(S.dim(1, 4))
    x = draw(S.arrays(dtype, lead + (T, hs)))
    pos_shape = draw(st.sampled_from([(T,), lead + (T,)]))
    positions = draw(S.token_ids(5000, pos_shape))
    dout = draw(S.arrays(dtype, lead + (T, hs)))
    return x, positions, dout, draw(thetas), draw(layouts), draw(scalings())


PINNED = (S.ramp(2, 3, 4), np.array([0, 7, 4095]), S.ramp(2, 3, 4)[::-1].copy(), 10000.0, "half",
          {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 16})


@st.composite
def long_scalings(draw):
    """yarn (every optional key present or absent, DeepSeek's mscale pair included) or dynamic,
    with original contexts short enough that positions up to 5000 run past them."""
    L = draw(st.sampled_from([8, 64, 4096]))
    factor = draw(st.sampled_from([2.0, 4.0, 40.0, 0.5]))
    if draw(st.booleans()):
        return {"rope_type": "dynamic", "factor": factor, "original_max_position_embeddings": L}
    scaling = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": L}
    optional = {"beta_fast": st.sampled_from([32, 8.0]), "beta_slow": st.sampled_from([1, 2.0]),
                "truncate": st.booleans(), "attention_factor": st.sampled_from([0.5, 1.3]),
                "mscale": st.sampled_from([1.0, 0.707]), "mscale_all_dim": st.sampled_from([1.0, 0.5])}
    for key, values in optional.items():
        if draw(st.booleans()):
            scaling[key] = draw(values)
    return scaling


@st.composite
def long_cases(draw, dtype=None):
    """cases() with a yarn or dynamic scaling and head sizes from 4 (dynamic's smallest) to 16,
    so that the yarn ramp has pairs before, inside and past it."""
    x, positions, dout, theta, layout, _ = draw(cases(dtype))
    hs = 2 * draw(S.dim(2, 8))
    lead, T = x.shape[:-2], x.shape[-2]
    x = draw(S.arrays(x.dtype, lead + (T, hs)))
    dout = draw(S.arrays(x.dtype, lead + (T, hs)))
    return x, positions, dout, theta, layout, draw(long_scalings())


LONG_PINNED = (S.ramp(2, 3, 8), np.array([0, 7, 4095]), S.ramp(2, 3, 8)[::-1].copy(), 10000.0, "half",
               {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                "beta_fast": 8.0, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.5})


def _angle_atol(positions, dtype):
    """The absolute error of cos and sin from rounding a float64 angle p * f: an ulp of the
    largest angle, 2^-52 * max|p| * max f (f reaches 2 with a linear factor of 0.5; positions
    reach 8000 in the shift test), up to 4e-12. Negligible against float32's own rounding."""
    if np.dtype(dtype) != np.float64:
        return 0.0
    return 2 * float(np.max(np.abs(positions), initial=1)) * 2.0**-52


# -- forward matches the twin -----------------------------------------------------------------

@given(case=st.one_of(cases(), long_cases()))
@example(case=PINNED)
@example(case=LONG_PINNED)
def test_forward_matches_twin(case):
    x, positions, dout, theta, layout, scaling = case
    out, _ = rope_forward(x, positions, theta, layout, scaling)
    twin = rope(to_torch(x), to_torch(positions), theta, layout, scaling)
    assert_close(f"rope[{layout}].out", out, to_numpy(twin))


# -- backward matches autograd ----------------------------------------------------------------

@pytest.mark.twin_parity
@given(case=st.one_of(cases(), long_cases()))
@example(case=PINNED)
@example(case=LONG_PINNED)
def test_backward_matches_autograd(case):
    x, positions, dout, theta, layout, scaling = case
    _, cache = rope_forward(x, positions, theta, layout, scaling)
    dx = rope_backward(dout, cache)
    _, grads = autograd(lambda x: rope(x, to_torch(positions), theta, layout, scaling), {"x": x}, dout)
    assert_close(f"rope[{layout}].dx", dx, grads["x"])


# -- the twin matches Hugging Face's Llama ------------------------------------------------------

@given(case=cases())
@example(case=PINNED)
def test_twin_matches_hugging_face_apply_rotary_pos_emb(case):
    """apply_rotary_pos_emb rotates q and k with tables cos, sin (..., T, hs) that repeat each
    frequency in both halves; given the twin's own float64 angles, the rotation must agree."""
    x, positions, dout, theta, _, scaling = case
    hs = x.shape[-1]
    angles = np.asarray(positions)[..., None] * rope_frequencies(hs, theta, scaling)
    cos = to_torch(np.cos(np.concatenate([angles, angles], -1)).astype(x.dtype))
    sin = to_torch(np.sin(np.concatenate([angles, angles], -1)).astype(x.dtype))
    hf_q, hf_k = apply_rotary_pos_emb(to_torch(x), to_torch(-x), cos, sin, unsqueeze_dim=0)
    hf_q, hf_k = hf_q.reshape(x.shape), hf_k.reshape(x.shape)   # drops the axis cos gained
    out, _ = rope_forward(x, positions, theta, "half", scaling)
    assert_close("rope.out vs apply_rotary_pos_emb(q)", out, to_numpy(hf_q))
    assert_close("rope.out vs apply_rotary_pos_emb(k)", -out, to_numpy(hf_k))


# -- float16 and bfloat16: FlashAttention's error rule -------------------------------------------

def _hf_rope(positions, theta, layout, scaling, dtype):
    """transformers' apply_rotary_pos_emb as a Llama in ``dtype`` runs it: the float64 angles'
    cos and sin rounded to that dtype, then its four products and two sums, each rounding. The
    interleaved layout is the half one on permuted channels (half_to_interleaved)."""
    def f(x):
        hs = x.shape[-1]
        perm = half_to_interleaved(hs) if layout == "interleaved" else np.arange(hs)
        angles = np.asarray(positions)[..., None] * rope_frequencies(hs, theta, scaling)
        cos, sin = (to_torch(np.concatenate([t, t], -1)).to(dtype) for t in (np.cos(angles), np.sin(angles)))
        out, _ = apply_rotary_pos_emb(x[..., perm], x[..., perm], cos, sin, unsqueeze_dim=0)
        return out.reshape(x.shape)[..., np.argsort(perm)]          # drops the axis cos gained
    return f


@pytest.mark.error_budget
@pytest.mark.parametrize("dtype", LOW_DTYPES)
@given(case=cases(dtype=np.float64))
@example(case=PINNED)
def test_low_precision_meets_the_error_budget(dtype, case):
    """Ours and the twin against float64 truth, within twice the error of transformers' rotation
    in the low dtype (its tables rounded to that dtype, as a bfloat16 Llama's are): out and dx."""
    x, positions, dout, theta, layout, scaling = case
    x, dout = round_to(x, dtype), round_to(dout, dtype)
    out, cache = rope_forward(x, positions, theta, layout, scaling)
    dx = rope_backward(dout, cache)
    twin_out, twin_grads = autograd(lambda x: rope(x, to_torch(positions), theta, layout, scaling),
                                    {"x": x}, dout)
    torch_out, torch_grads = autograd(_hf_rope(positions, theta, layout, scaling, LOW_DTYPES[dtype][1]),
                                      {"x": x}, dout)
    truth_out, truth_grads = autograd(_hf_rope(positions, theta, layout, scaling, torch.float64),
                                      {"x": x.astype(np.float64)}, dout.astype(np.float64))
    for who, (o, g) in {"numpy": (out, dx), "twin": (twin_out, twin_grads["x"])}.items():
        assert_error_budget(f"rope[{layout}][{who}]", dtype, {"out": (o, torch_out, truth_out),
                                                              "dx": (g, torch_grads["x"], truth_grads["x"])})


@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_low_precision_dout_of_another_dtype_is_refused(dtype):
    """rope has one float input: the mix to refuse is a float32 dout for a low-precision x (the
    cache holds float32 tables, so the check must use x's dtype, not theirs)."""
    _, cache = rope_forward(round_to(S.ramp(3, 4), dtype), np.arange(3))
    with pytest.raises(TypeError, match=f"rope: dout must have the dtype .* {dtype}, got float32"):
        rope_backward(S.ramp(3, 4, dtype=np.float32), cache)


def _hf_inv_freq(hs, theta, scaling):
    params = {"rope_type": "default", "rope_theta": theta, **(scaling or {})}
    config = LlamaConfig(hidden_size=hs, num_attention_heads=1, head_dim=hs, rope_parameters=params,
                         max_position_embeddings=64)
    return to_numpy(LlamaRotaryEmbedding(config).inv_freq).astype(np.float64)


@pytest.mark.parametrize("hs", [2, 8, 64, 128])
@pytest.mark.parametrize("theta", [10000.0, 500000.0])
@pytest.mark.parametrize("scaling", [
    None,
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
    {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
])
def test_frequencies_match_llama_rotary_embedding(hs, theta, scaling):
    """LlamaRotaryEmbedding computes theta^(-2j/hs) in float32: the exponent 2j/hs is rounded
    (relative error 2^-24), which the power turns into an absolute error ln(theta) * 2j/hs * 2^-24
    of the logarithm, i.e. a relative error of at most ln(theta) * 2^-24 in f_j, plus a few
    roundings of the power, the division and the scaling: rtol (ln(theta) + 4) * 2^-24."""
    ours = rope_frequencies(hs, theta, scaling)
    theirs = _hf_inv_freq(hs, theta, scaling)
    name = f"rope_frequencies(hs={hs}, {(scaling or {}).get('rope_type', 'default')})"
    assert_close(f"{name} vs LlamaRotaryEmbedding.inv_freq", ours, theirs,
                 rtol=(math.log(theta) + 4) * 2.0**-24, atol=0.0)


def test_llama3_scaling_bands():
    """Waves longer than L / low are slowed by factor, waves shorter than L / high are kept."""
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    plain = rope_frequencies(128, 500000.0)
    scaled = rope_frequencies(128, 500000.0, scaling)
    wavelength = 2 * np.pi / plain
    slow, fast = wavelength > 8192, wavelength < 8192 / 4
    assert slow.any() and fast.any() and (~slow & ~fast).any(), "the sweep misses a band"
    assert_close("llama3 slow band", scaled[slow], plain[slow] / 8)
    assert_close("llama3 fast band", scaled[fast], plain[fast])
    middle = ~slow & ~fast
    assert np.all((scaled[middle] < plain[middle]) & (scaled[middle] > plain[middle] / 8)), \
        "llama3 middle band is not between the two"


# -- properties ---------------------------------------------------------------------------------

@given(case=cases())
def test_norms_of_pairs_are_preserved(case):
    x, positions, _, theta, layout, scaling = case
    out, _ = rope_forward(x, positions, theta, layout, scaling)
    assert_close(f"rope[{layout}] norms", np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1))


@given(case=cases(), shift=st.integers(-3000, 3000))
def test_score_depends_only_on_the_distance(case, shift):
    """q_i . k_j after rotation is unchanged when both positions move by the same shift."""
    x, positions, _, theta, layout, scaling = case
    q, k = x, x[..., ::-1, :].copy()
    pos = np.asarray(positions)

    def scores(p):
        rq, _ = rope_forward(q, p, theta, layout, scaling)
        rk, _ = rope_forward(k, p, theta, layout, scaling)
        return rq @ rk.swapaxes(-1, -2)                             # (..., T, T)

    base = scores(pos)
    # Each score sums hs products of elements up to 4 * 4, so its atol is that many times the
    # elements' (the dtype's, plus the rounding of the shifted angles, _angle_atol, on both).
    tol = TOLERANCES[x.dtype]
    scale = x.shape[-1] * 16
    atol = scale * (tol["atol"] + 2 * _angle_atol(np.abs(pos) + abs(shift), x.dtype))
    assert_close(f"rope[{layout}] scores after a shift of {shift}", scores(pos + shift), base,
                 rtol=tol["rtol"], atol=atol)


@given(case=cases())
def test_layouts_agree_on_permuted_channels(case):
    x, positions, dout, theta, _, scaling = case
    perm = half_to_interleaved(x.shape[-1])
    half, _ = rope_forward(x[..., perm], positions, theta, "half", scaling)
    interleaved, _ = rope_forward(x, positions, theta, "interleaved", scaling)
    assert_close("rope[half](x[perm]) vs rope[interleaved](x)[perm]", half, interleaved[..., perm])


@given(case=cases())
def test_backward_is_the_opposite_rotation(case):
    x, positions, _, theta, layout, scaling = case
    out, cache = rope_forward(x, positions, theta, layout, scaling)
    assert_close(f"rope[{layout}] backward(forward(x))", rope_backward(out, cache), x)


def test_position_zero_is_the_identity():
    x = S.ramp(3, 6)
    out, _ = rope_forward(x, np.zeros(3, np.int64), layout="interleaved")
    assert np.array_equal(out, x), "rope at position 0 changed x"


# -- finite differences (no torch) ----------------------------------------------------------------

@given(case=st.one_of(cases(dtype=np.float64), long_cases(dtype=np.float64)))
@example(case=LONG_PINNED)
def test_backward_matches_finite_differences(case):
    x, positions, dout, theta, layout, scaling = case
    _, cache = rope_forward(x, positions, theta, layout, scaling)
    dx = rope_backward(dout, cache)
    fd = numerical_grad(lambda x: rope_forward(x, positions, theta, layout, scaling)[0], x.copy(), dout)
    assert_close(f"rope[{layout}].dx vs finite differences", dx, fd, **FD_TOL)


# -- dtype preservation -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", S.FLOAT_DTYPES)
def test_dtype_is_preserved(dtype):
    x = S.ramp(2, 4, dtype=dtype)
    out, cache = rope_forward(x, np.array([3, 9], np.int32), theta=np.float64(10000.0))
    dx = rope_backward(S.ramp(2, 4, dtype=dtype), cache)
    assert out.dtype == dtype, f"rope.out dtype {out.dtype}"
    assert dx.dtype == dtype, f"rope.dx dtype {dx.dtype}"


# -- bad input --------------------------------------------------------------------------------------

def test_bad_input():
    x = np.zeros((2, 3, 4))
    with pytest.raises(ValueError, match=r"even head size hs, got \(2, 3, 5\)"):
        rope_forward(np.zeros((2, 3, 5)), np.arange(3))
    with pytest.raises(ValueError, match=r"^positions of shape \(4,\) must be \(T,\) or \(\.\.\., T\) and "
                                         r"broadcast to x's \(2, 3\) \(x \(2, 3, 4\)\)$"):
        rope_forward(x, np.arange(4))
    with pytest.raises(ValueError, match=r"^positions of shape \(\) must be \(T,\) or \(\.\.\., T\)"):
        rope_forward(x, np.array(1))
    with pytest.raises(TypeError, match="positions must be integers, got dtype float64"):
        rope_forward(x, np.arange(3.0))
    with pytest.raises(TypeError, match="^x must be float16, bfloat16, float32 or float64, got dtype int64$"):
        rope_forward(np.zeros((3, 4), np.int64), np.arange(3))
    with pytest.raises(ValueError, match="layout must be 'half' or 'interleaved', got 'neox'"):
        rope_forward(x, np.arange(3), layout="neox")
    with pytest.raises(ValueError, match="theta must be a number > 1, got -1"):
        rope_forward(x, np.arange(3), theta=-1)
    with pytest.raises(ValueError, match="rope_type must be one of .* got 'longrope'"):
        rope_forward(x, np.arange(3), scaling={"rope_type": "longrope", "factor": 2.0})
    with pytest.raises(ValueError, match="linear scaling needs factor > 0, got None"):
        rope_forward(x, np.arange(3), scaling={"rope_type": "linear"})
    with pytest.raises(ValueError, match="^llama3 scaling needs high_freq_factor > low_freq_factor, got 1.0 and 4.0$"):
        rope_forward(x, np.arange(3), scaling={"rope_type": "llama3", "factor": 8.0,
                                               "low_freq_factor": 4.0, "high_freq_factor": 1.0,
                                               "original_max_position_embeddings": 16})
    # Equal factors leave no band between the two (the blend would divide by high - low = 0).
    with pytest.raises(ValueError, match="^llama3 scaling needs high_freq_factor > low_freq_factor, got 2.0 and 2.0$"):
        rope_forward(x, np.arange(3), scaling={"rope_type": "llama3", "factor": 8.0,
                                               "low_freq_factor": 2.0, "high_freq_factor": 2.0,
                                               "original_max_position_embeddings": 16})
    with pytest.raises(TypeError, match="scaling must be None or a dict, got float"):
        rope_forward(x, np.arange(3), scaling=2.0)
    _, cache = rope_forward(x, np.arange(3))
    with pytest.raises(ValueError, match=r"rope: dout must have the shape .* \(2, 3, 4\), got \(2, 4, 3\)"):
        rope_backward(np.zeros((2, 4, 3)), cache)
    with pytest.raises(TypeError, match=r"^rope: dout must have the dtype of the forward's output, float64, "
                                        r"got float32 \(shape \(2, 3, 4\)\)$"):
        rope_backward(np.zeros((2, 3, 4), np.float32), cache)


# -- YaRN and dynamic NTK -----------------------------------------------------------------------

@given(case=long_cases())
def test_yarn_scales_every_pair_by_the_attention_factor(case):
    """A rotation scaled by m: each pair's norm is m times x's, and the backward of the forward
    gives m^2 x (the transpose of m R times m R)."""
    x, positions, _, theta, layout, scaling = case
    m = rope_attention_factor(scaling)
    out, cache = rope_forward(x, positions, theta, layout, scaling)
    m_x = x.dtype.type(m)
    assert_close(f"rope[{scaling['rope_type']}] norms / attention factor {m}",
                 np.linalg.norm(out, axis=-1), m_x * np.linalg.norm(x, axis=-1))
    assert_close(f"rope[{scaling['rope_type']}] backward(forward(x))", rope_backward(out, cache), m_x * m_x * x)


class _Float64Torch:
    """torch with float32 read as float64: transformers' rope functions ask for ``torch.float``
    or ``torch.float32`` by name, so with this in their module's place they run their own
    formulas in float64, to be compared with ours to float64's rounding."""

    float = float32 = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


def _hf_config(hs, theta, scaling):
    """A LlamaConfig whose rope_parameters are ours: dynamic's original context goes into
    max_position_embeddings, where transformers reads it; yarn's context grows by its factor."""
    params = {"rope_theta": theta, **scaling}
    L = params.pop("original_max_position_embeddings")
    if scaling["rope_type"] == "yarn":
        params["original_max_position_embeddings"] = L
        L = max(L, int(L * scaling["factor"]))
    return LlamaConfig(hidden_size=hs, num_attention_heads=1, head_dim=hs, rope_parameters=params,
                       max_position_embeddings=L)


YARN = {"rope_type": "yarn", "original_max_position_embeddings": 64}
HF_SCALINGS = [
    {**YARN, "factor": 4.0},
    {**YARN, "factor": 8.0, "beta_fast": 8, "beta_slow": 2.0, "truncate": False},
    {**YARN, "factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 0.707, "mscale_all_dim": 0.707},
    {**YARN, "factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 0.5},
    {**YARN, "factor": 16.0, "attention_factor": 1.5, "beta_fast": 4},
    {**YARN, "factor": 2.0, "mscale": 0.707},                       # mscale alone is ignored
    {**YARN, "factor": 1.0, "truncate": True},                      # factor 1: attention factor 1
    # beta_fast and beta_slow left to their defaults (32 and 1) where they move the ramp: at L = 64
    # every pair turns fewer than 32 times and the ramp starts at 0 whatever beta_fast is.
    {**YARN, "factor": 8.0, "original_max_position_embeddings": 4096, "truncate": False},
    # beta_slow equal to beta_fast's default: a ramp of width 0, a step between kept and divided pairs.
    {**YARN, "factor": 8.0, "original_max_position_embeddings": 4096, "beta_slow": 32, "truncate": False},
    {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 64},
    {"rope_type": "dynamic", "factor": 8.0, "original_max_position_embeddings": 16},
]


@pytest.mark.parametrize("hs", [4, 8, 64, 128])
@pytest.mark.parametrize("theta", [10000.0, 1000000.0])
@pytest.mark.parametrize("scaling", HF_SCALINGS)
@pytest.mark.parametrize("seq_len", [None, 10, 5000])
def test_scaled_frequencies_match_transformers_in_float64(hs, theta, scaling, seq_len, monkeypatch):
    """ROPE_INIT_FUNCTIONS[rope_type] run in float64 gives our inverse frequencies and attention
    factor. Both sides evaluate one formula in a different order: theta^(2j/hs) (or the grown
    base's) is a power whose relative error is an ulp plus the exponent's rounding times
    ln(base) (ln of a grown base is below 40), the ramp and blend add a few ulps: rtol
    50 * 2^-52 = 1.1e-14. The attention factor is the same Python arithmetic: exact but for the
    order of two products, rtol 4 * 2^-52."""
    monkeypatch.setattr(modeling_rope_utils, "torch", _Float64Torch())
    rope_type = scaling["rope_type"]
    theirs, their_factor = ROPE_INIT_FUNCTIONS[rope_type](_hf_config(hs, theta, scaling), None, seq_len=seq_len)
    assert theirs.dtype == torch.float64, f"transformers' {rope_type} did not run in float64: {theirs.dtype}"
    ours = rope_frequencies(hs, theta, scaling, seq_len)
    name = f"rope_frequencies(hs={hs}, {rope_type}, seq_len={seq_len})"
    assert_close(f"{name} vs ROPE_INIT_FUNCTIONS", ours, to_numpy(theirs), rtol=50 * 2.0**-52, atol=0.0)
    assert_close(f"rope_attention_factor({rope_type}) vs ROPE_INIT_FUNCTIONS",
                 np.float64(rope_attention_factor(scaling)), np.float64(their_factor), rtol=4 * 2.0**-52, atol=0.0)


@pytest.mark.parametrize("scaling", HF_SCALINGS)
def test_twin_matches_llama_rotary_embedding_cos_and_sin(scaling):
    """LlamaRotaryEmbedding, in float32 as transformers runs it, multiplies cos and sin by the
    attention factor and, for dynamic, grows the base to the largest position id + 1 it is given
    (positions past the original context here). Its angles p f_j carry f_j's float32 error
    (ln(theta) + 4) * 2^-24 relative (see test_frequencies_match_llama_rotary_embedding) times
    p <= 99, plus the rounding of p f_j itself: atol m * (99 * (ln(theta) + 4) + 4) * 2^-24 on
    tables of size m, the attention factor."""
    hs, theta = 16, 10000.0
    positions = np.array([[0, 3, 50, 99]])
    module = LlamaRotaryEmbedding(_hf_config(hs, theta, scaling))
    x = torch.zeros(1, positions.shape[-1], hs)
    cos, sin = module(x, to_torch(positions))                       # (1, T, hs), both halves alike
    m = rope_attention_factor(scaling)
    # Every pair (1, 0) comes out as (m cos, m sin): the tables themselves.
    ones = np.concatenate([np.ones(hs // 2), np.zeros(hs // 2)])
    out, _ = rope_forward(np.tile(ones, (positions.shape[-1], 1)), positions[0], theta, "half", scaling)
    ours_cos, ours_sin = out[:, : hs // 2], out[:, hs // 2:]        # (T, hs/2) each
    atol = m * (99 * (math.log(theta) + 4) + 4) * 2.0**-24
    assert_close(f"rope[{scaling['rope_type']}] cos vs LlamaRotaryEmbedding", ours_cos,
                 to_numpy(cos)[0, :, : hs // 2].astype(np.float64), rtol=0.0, atol=atol)
    assert_close(f"rope[{scaling['rope_type']}] sin vs LlamaRotaryEmbedding", ours_sin,
                 to_numpy(sin)[0, :, : hs // 2].astype(np.float64), rtol=0.0, atol=atol)


def test_dynamic_changes_nothing_within_the_original_context():
    """Dynamic NTK is the plain rotation up to L positions, and slows every pair but the first
    past them, the slowest pair the most."""
    scaling = {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 64}
    plain = rope_frequencies(32, 10000.0)
    assert_close("dynamic at seq_len 64", rope_frequencies(32, 10000.0, scaling, 64), plain)
    assert_close("dynamic at seq_len None", rope_frequencies(32, 10000.0, scaling), plain)
    ratio = rope_frequencies(32, 10000.0, scaling, 1000) / plain
    assert ratio[0] == 1.0 and np.all(np.diff(ratio) < 0), f"dynamic past L: ratios {ratio}"


def test_yarn_ramp_bands():
    """Pairs turning more than beta_fast times over L keep their frequency, pairs turning fewer
    than beta_slow times are divided by factor, and those between lie between."""
    scaling = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096, "truncate": False}
    plain = rope_frequencies(128, 10000.0)
    scaled = rope_frequencies(128, 10000.0, scaling)
    turns = 4096 * plain / (2 * np.pi)
    fast, slow = turns > 32, turns < 1
    assert fast.any() and slow.any() and (~fast & ~slow).any(), "the sweep misses a band"
    assert_close("yarn fast band", scaled[fast], plain[fast])
    assert_close("yarn slow band", scaled[slow], plain[slow] / 8)
    middle = ~fast & ~slow
    assert np.all((scaled[middle] < plain[middle]) & (scaled[middle] > plain[middle] / 8)), \
        "yarn middle band is not between the two"


def test_dynamic_reads_the_largest_position():
    """seq_len=None is the largest position + 1 over all rows, as transformers takes it."""
    scaling = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8}
    x = S.ramp(2, 3, 4)
    positions = np.array([[0, 1, 2], [20, 30, 40]])
    out, _ = rope_forward(x, positions, scaling=scaling)
    explicit, _ = rope_forward(x, positions, scaling=scaling, seq_len=41)
    shorter, _ = rope_forward(x, positions, scaling=scaling, seq_len=20)
    assert np.array_equal(out, explicit), "seq_len=None is not max(positions) + 1"
    assert not np.allclose(out, shorter), "seq_len changes nothing past the original context"


def test_bad_scaling():
    x = np.zeros((2, 3, 4))
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    bad = [
        (ValueError, "yarn scaling needs original_max_position_embeddings > 0, got None",
         {"rope_type": "yarn", "factor": 4.0}),
        (ValueError, "dynamic scaling needs factor > 0, got None",
         {"rope_type": "dynamic", "original_max_position_embeddings": 64}),
        (TypeError, "yarn scaling beta_fast must be a number or None, got str '32'", {**yarn, "beta_fast": "32"}),
        (ValueError, "yarn scaling needs mscale > 0 and finite when given, got -1.0", {**yarn, "mscale": -1.0}),
        (ValueError, "yarn scaling needs attention_factor > 0 and finite when given, got inf",
         {**yarn, "attention_factor": float("inf")}),
        (TypeError, "yarn scaling truncate must be True or False, got str 'no'", {**yarn, "truncate": "no"}),
        (ValueError, "yarn scaling needs beta_fast >= beta_slow .* beta_fast 1 and beta_slow 32",
         {**yarn, "beta_fast": 1, "beta_slow": 32}),
        (ValueError, re.escape("yarn scaling needs beta_fast >= beta_slow (turns over the original context), "
                               "got beta_fast 32 and beta_slow 33"), {**yarn, "beta_slow": 33}),   # beta_fast's default
        (ValueError, "yarn scaling needs a finite factor, got inf", {**yarn, "factor": float("inf")}),
        (ValueError, "partial_rotary_factor is not implemented .* got 0.5", {**yarn, "partial_rotary_factor": 0.5}),
    ]
    for error, match, scaling in bad:
        with pytest.raises(error, match=match):
            rope_forward(x, np.arange(3), scaling=scaling)
        with pytest.raises(error, match=match):
            rope_attention_factor(scaling)
    dynamic = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8}
    with pytest.raises(ValueError, match="dynamic scaling needs a head size hs >= 4 .* got 2"):
        rope_forward(np.zeros((3, 2)), np.arange(3), scaling=dynamic)
    with pytest.raises(TypeError, match="seq_len must be an int or None, got float 10.0"):
        rope_forward(x, np.arange(3), scaling=dynamic, seq_len=10.0)
    with pytest.raises(ValueError, match="seq_len must be >= 1, got 0"):
        rope_frequencies(4, 10000.0, dynamic, seq_len=0)
    with pytest.raises(ValueError, match="rope_type must be one of .* got 'longrope'"):
        rope_attention_factor({"rope_type": "longrope", "factor": 2.0})


SCALING_TYPES = {
    "linear": {"rope_type": "linear"},
    "llama3": {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
    "yarn": YARN,
    "dynamic": {"rope_type": "dynamic", "original_max_position_embeddings": 64},
}


@pytest.mark.parametrize("rope_type", SCALING_TYPES)
def test_factors_that_are_not_positive_finite_numbers_are_refused(rope_type):
    """factor = 0 divides every frequency by 0 (YaRN took it before), inf slows every pair to 0 (it
    was taken by all but YaRN), and 1e-320 is positive but 1 / 1e-320 is inf in float64."""
    x, positions = np.zeros((2, 3, 4)), np.arange(3)
    for factor, match in ((0, f"^{rope_type} scaling needs factor > 0, got 0$"),
                          (-1.5, f"^{rope_type} scaling needs factor > 0, got -1.5$"),
                          (float("inf"), f"^{rope_type} scaling needs a finite factor, got inf$"),
                          (10**400, f"^{rope_type} scaling needs a finite factor, got 1000"),
                          (1e-320, f"^{rope_type} scaling factor = 1e-320 is too small: 1 / factor overflows to inf "
                                   "in float64")):
        with pytest.raises(ValueError, match=match):
            rope_forward(x, positions, scaling={**SCALING_TYPES[rope_type], "factor": factor})
    out, _ = rope_forward(x, positions, scaling={**SCALING_TYPES[rope_type], "factor": 1e-300})
    assert np.isfinite(out).all(), f"{rope_type} with factor 1e-300"


def test_theta_that_is_not_finite_is_refused():
    """theta = inf passed the old `theta > 1` and made every pair but the first stand still."""
    for theta, what in ((float("inf"), "is not finite"), (10**400, "overflows to inf")):
        with pytest.raises(ValueError, match=rf"^theta must be finite .* in float64, .* {what}$"):
            rope_frequencies(4, theta)


@given(seed=st.integers(0, 2**32 - 1), hs=st.sampled_from([4, 8, 16]), share=st.sampled_from([0.25, 0.5, 1.0]),
       layout=layouts, theta=thetas)
def test_partial_rotary_rotates_the_first_channels_only(seed, hs, share, layout, theta):
    """The model shell's rotate_forward with rotary_dim r (Qwen3.5's partial rotary): the first r
    channels of each head are rope_forward's of a head of size r, the others pass unchanged; equal
    to transformers' Qwen3.5 apply_rotary_pos_emb (which rotates cos's width) in float64 for the
    half layout, and to the twin; the backward is the transpose (<rot(q), d> = <q, rot^T(d)>)."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import apply_rotary_pos_emb as qwen3_5_rotary

    from numpy_attn._model import rotate_backward, rotate_forward
    from torch_attn._model import rotate
    rng = np.random.default_rng(seed)
    r = max(2, int(hs * share))
    q, k = rng.normal(size=(2, 3, 5, hs)), rng.normal(size=(2, 1, 5, hs))
    positions = rng.integers(0, 50, 5)
    q_rot, k_rot, cache = rotate_forward(q, k, positions, theta, None, layout, r)
    for name, x, out in (("q", q, q_rot), ("k", k, k_rot)):
        assert_close(f"rotate.{name}[:r]", out[..., :r], rope_forward(x[..., :r], positions, theta, layout)[0])
        assert np.array_equal(out[..., r:], x[..., r:]), "the channels past rotary_dim pass unchanged"
    tq, tk = rotate(to_torch(q), to_torch(k), to_torch(positions), theta, None, layout, r)
    assert_close("rotate.twin.q", q_rot, to_numpy(tq))
    assert_close("rotate.twin.k", k_rot, to_numpy(tk))
    if layout == "half":
        angles = positions[:, None] * rope_frequencies(r, theta)              # (T, r/2), float64
        angles = torch.from_numpy(np.concatenate([angles, angles], axis=-1))[None]   # (1, T, r)
        hq, hk = qwen3_5_rotary(to_torch(q), to_torch(k), angles.cos(), angles.sin())
        assert_close("rotate.hf.q", q_rot, to_numpy(hq))
        assert_close("rotate.hf.k", k_rot, to_numpy(hk))
    dq, dk = rng.normal(size=q.shape), rng.normal(size=k.shape)
    bq, bk = rotate_backward(dq, dk, cache)
    assert math.isclose(np.sum(q_rot * dq) + np.sum(k_rot * dk), np.sum(q * bq) + np.sum(k * bk),
                        rel_tol=1e-12, abs_tol=1e-12)
