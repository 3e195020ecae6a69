"""Parity tests for numpy_attn/rope.py and torch_attn/rope.py, against Hugging Face's Llama too."""

import math

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from numpy_attn.rope import half_to_interleaved, rope_backward, rope_forward, rope_frequencies
from parity_tests import strategies as S
from parity_tests.helpers import (
    FD_TOL,
    TOLERANCES,
    assert_close,
    autograd,
    numerical_grad,
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


def _angle_atol(positions, dtype):
    """The absolute error of cos and sin from rounding a float64 angle p * f: an ulp of the
    largest angle, 2^-52 * max|p| * max f (f reaches 2 with a linear factor of 0.5; positions
    reach 8000 in the shift test), up to 4e-12. Negligible against float32's own rounding."""
    if np.dtype(dtype) != np.float64:
        return 0.0
    return 2 * float(np.max(np.abs(positions), initial=1)) * 2.0**-52


# -- forward matches the twin -----------------------------------------------------------------

@given(case=cases())
@example(case=PINNED)
def test_forward_matches_twin(case):
    x, positions, dout, theta, layout, scaling = case
    out, _ = rope_forward(x, positions, theta, layout, scaling)
    twin = rope(to_torch(x), to_torch(positions), theta, layout, scaling)
    assert_close(f"rope[{layout}].out", out, to_numpy(twin))


# -- backward matches autograd ----------------------------------------------------------------

@given(case=cases())
@example(case=PINNED)
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

@given(case=cases(dtype=np.float64))
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
    with pytest.raises(TypeError, match="^x must be float32 or float64, got dtype int64$"):
        rope_forward(np.zeros((3, 4), np.int64), np.arange(3))
    with pytest.raises(ValueError, match="layout must be 'half' or 'interleaved', got 'neox'"):
        rope_forward(x, np.arange(3), layout="neox")
    with pytest.raises(ValueError, match="theta must be a number > 1, got -1"):
        rope_forward(x, np.arange(3), theta=-1)
    with pytest.raises(ValueError, match="rope_type must be one of .* got 'yarn'"):
        rope_forward(x, np.arange(3), scaling={"rope_type": "yarn", "factor": 2.0})
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
