"""Rotary position embedding (RoPE) of queries or keys, and its backward.

Channel pair j of a head of size hs (j = 0 .. hs/2 - 1) is a point in the plane, turned by the
angle p * f_j at position p:

    f_j      = theta^(-2j / hs)                      (inverse frequencies; theta = 10000)
    out_a    = x_a * cos(p f_j) - x_b * sin(p f_j)
    out_b    = x_b * cos(p f_j) + x_a * sin(p f_j)

Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding" (2021), eq. 34. A
rotated query at i and a rotated key at j then score q . R(j - i) k: the score depends only on
i - j. Which channels form pair j is the ``layout``:

- "half": channels j and j + hs/2 (``rotate_half`` in Hugging Face's Llama, GPT-NeoX);
- "interleaved": channels 2j and 2j + 1 (Meta's original Llama code, GPT-J).

The two are the same operation on permuted channels (``half_to_interleaved``); converting a
checkpoint from one to the other permutes the columns of the q and k projections the same way.

``scaling`` stretches long contexts by slowing the rotations, as a dict in the form of Hugging
Face's ``rope_parameters``: ``{"rope_type": "linear", "factor": s}`` divides every f_j by s
(positions p / s); ``{"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
"original_max_position_embeddings"}`` divides only the slow ones: waves longer than L / low
(L the original context) by ``factor``, waves shorter than L / high not at all, and blends the
two between. ``None`` or ``{"rope_type": "default"}`` leaves them as they are.

``{"rope_type": "yarn", "factor", "original_max_position_embeddings"}`` (Peng et al., "YaRN:
Efficient Context Window Extension of Large Language Models", 2023) ramps between the two by
the number of turns a wave makes over the original context L: pairs turning more than
``beta_fast`` (32) times are kept, pairs turning fewer than ``beta_slow`` (1) times are divided by
``factor``, linearly in the pair index between (``truncate``, default True, rounds the two ends
outwards to whole pairs). YaRN also multiplies cos and sin by an attention factor (so q . k by
its square): ``attention_factor`` if given, else 0.1 ln(factor) + 1, or DeepSeek's ratio of two
such curves when both ``mscale`` and ``mscale_all_dim`` are given (``rope_attention_factor``).
``{"rope_type": "dynamic", "factor", "original_max_position_embeddings"}`` (dynamic NTK) keeps
every f_j up to L positions and beyond that raises the base theta to
theta * (factor * seq_len / L - factor + 1)^(hs / (hs - 2)), seq_len the longest position + 1.
These follow transformers' ``modeling_rope_utils`` key for key; for "dynamic", L is what
transformers reads from the model config's ``max_position_embeddings``.

Backward: a rotation's transpose is the rotation by the opposite angle, so dx = R(-p f) dout
(times the attention factor, which the cached cos and sin already hold). Angles are computed
in float64 and their cos and sin rounded once to x's dtype.

float16 and bfloat16: the tables are rounded to float32 instead (transformers also forms them in
float32 for a bfloat16 model, though it then rounds them to the model's dtype), x is cast up, the
rotation and its backward run in float32 and out and dx are rounded once to x's dtype, as
PyTorch's elementwise kernels compute each product in float32 (docs/precision.md).
"""

import math

import numpy as np

from numpy_attn._checks import check_dout, check_float, check_in_dtype, check_integer, is_finite_number, opmath, upcast

LAYOUTS = ("half", "interleaved")
SCALING_KEYS = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings"),
    "dynamic": ("factor", "original_max_position_embeddings"),
}
# YaRN's optional numbers (absent or None: transformers' defaults), each > 0 when given.
YARN_OPTIONAL_KEYS = ("beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim")


def rope_frequencies(hs, theta=10000.0, scaling=None, seq_len=None):
    """The inverse frequencies f_j (hs/2,) in float64, scaled as ``scaling`` says (see above).

    ``seq_len`` (an int >= 1) matters only to "dynamic": None means the original context, where
    dynamic NTK changes nothing.
    """
    _check_frequencies(hs, theta, scaling, seq_len)
    inv_freq = 1.0 / theta ** (np.arange(0, hs, 2) / hs)            # (hs/2,)
    rope_type = "default" if scaling is None else scaling.get("rope_type", "default")
    if rope_type == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif rope_type == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        L = scaling["original_max_position_embeddings"]
        wavelength = 2 * np.pi / inv_freq                           # (hs/2,)
        # 0 for waves longer than L / low (slowed by factor), 1 for waves shorter than L / high
        # (kept), a straight line in L / wavelength between.
        blend = np.clip((L / wavelength - low) / (high - low), 0.0, 1.0)
        inv_freq = (1 - blend) * inv_freq / factor + blend * inv_freq
    elif rope_type == "yarn":
        factor, L = scaling["factor"], scaling["original_max_position_embeddings"]
        beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1
        # Pair j turns L f_j / (2 pi) times over the original context: it turns r times at
        # j = hs ln(L / (2 pi r)) / (2 ln theta), which gives the ends of the ramp.
        low, high = (hs * math.log(L / (2 * math.pi * r)) / (2 * math.log(theta)) for r in (beta_fast, beta_slow))
        if scaling.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, hs - 1)                  # hs - 1, not hs/2 - 1: as transformers
        high = high + 0.001 if high == low else high                # a ramp of width 0 would divide 0 by 0
        # 0 for the fast pairs below low (kept), 1 for the slow ones above high (divided by factor).
        ramp = np.clip((np.arange(hs // 2) - low) / (high - low), 0.0, 1.0)   # (hs/2,)
        inv_freq = (1 - ramp) * inv_freq + ramp * inv_freq / factor
    elif rope_type == "dynamic":
        factor, L = scaling["factor"], scaling["original_max_position_embeddings"]
        seq_len = L if seq_len is None else max(seq_len, L)         # within L nothing changes
        base = theta * (factor * seq_len / L - (factor - 1)) ** (hs / (hs - 2))
        inv_freq = 1.0 / base ** (np.arange(0, hs, 2) / hs)         # (hs/2,)
    return inv_freq


def rope_attention_factor(scaling=None):
    """The number cos and sin are multiplied by: YaRN's attention factor, 1.0 for the other kinds.

    As in transformers, it multiplies both tables, so both q and k, and their scores by its
    square; rope_forward applies it. Given ``attention_factor`` wins; else with both ``mscale``
    and ``mscale_all_dim`` (DeepSeek) it is m(factor, mscale) / m(factor, mscale_all_dim), else
    m(factor, 1), with m(s, c) = 0.1 c ln(s) + 1 for s > 1 and 1 otherwise.
    """
    _check_scaling(scaling)
    if scaling is None or scaling.get("rope_type", "default") != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor, mscale, mscale_all_dim = scaling["factor"], scaling.get("mscale"), scaling.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
    return _yarn_mscale(factor, 1.0)


def _yarn_mscale(factor, mscale):
    """YaRN's sqrt(1 / t) = 0.1 mscale ln(factor) + 1, the softmax temperature t of the paper;
    1 when the context is not stretched."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def half_to_interleaved(hs):
    """The channel order ``perm`` (hs,) with x_half = x_interleaved[..., perm]: 0, 2, 4, ..., 1, 3, ...

    With it, rope(x[..., perm], layout="half") == rope(x, layout="interleaved")[..., perm].
    """
    return np.concatenate([np.arange(0, hs, 2), np.arange(1, hs, 2)])


def _pairs(x, layout):
    """The two halves (x_a, x_b) of every rotated pair: x (..., hs) -> two (..., hs/2)."""
    if layout == "half":
        hs = x.shape[-1]
        return x[..., : hs // 2], x[..., hs // 2:]
    return x[..., 0::2], x[..., 1::2]


def _join(a, b, layout):
    """The inverse of _pairs: two (..., hs/2) -> (..., hs)."""
    if layout == "half":
        return np.concatenate([a, b], axis=-1)                      # (..., hs/2) x 2 -> (..., hs)
    return np.stack([a, b], axis=-1).reshape(a.shape[:-1] + (2 * a.shape[-1],))   # a0 b0 a1 b1 ...


def rope_forward(x, positions, theta=10000.0, layout="half", scaling=None, seq_len=None):
    """Rotate x (..., T, hs) by its integer ``positions`` (T,) or (..., T) -> out (..., T, hs).

    ``positions`` broadcasts against x's leading dimensions (one row per batch, or one for all).
    ``seq_len`` sizes dynamic NTK's base; None means the largest position + 1 over all rows, as
    transformers' rotary embedding takes it from the position ids it is given.
    Returns ``(out, cache)``; the cache is ``(cos, sin, layout, x's shape, x's dtype)``: the backward
    rotates back by the same tables (float32 for float16 and bfloat16) and checks its dout against
    the shape and dtype.
    """
    _check_rope(x, positions, layout)
    T, hs = x.shape[-2:]
    if seq_len is None:                                             # only "dynamic" reads it
        seq_len = int(np.max(positions, initial=0)) + 1
    inv_freq = rope_frequencies(hs, theta, scaling, seq_len)        # (hs/2,)
    # YaRN's attention factor scales both tables (1.0 for the other kinds), as in transformers.
    attention_factor = rope_attention_factor(scaling)
    angles = np.asarray(positions)[..., None] * inv_freq            # (..., T) -> (..., T, hs/2), float64
    cos = (np.cos(angles) * attention_factor).astype(opmath(x.dtype))   # (..., T, hs/2), float32 for low x
    sin = (np.sin(angles) * attention_factor).astype(opmath(x.dtype))   # (..., T, hs/2)
    x_a, x_b = _pairs(upcast(x), layout)                            # (..., T, hs) -> 2 x (..., T, hs/2)
    out_a = x_a * cos - x_b * sin
    out_b = x_b * cos + x_a * sin
    out = _join(out_a, out_b, layout)                               # 2 x (..., T, hs/2) -> (..., T, hs)
    cache = (cos, sin, layout, x.shape, x.dtype)
    return out.astype(x.dtype, copy=False), cache                   # rounded once to x's dtype


def rope_backward(dout, cache):
    """Gradient of the rotation: dout (..., T, hs) -> dx (..., T, hs), the rotation by -angle."""
    cos, sin, layout, shape, x_dtype = cache
    check_dout("rope", dout, shape, x_dtype)
    # Undoes out = _join(out_a, out_b).
    dout_a, dout_b = _pairs(upcast(dout), layout)                          # (..., T, hs) -> 2 x (..., T, hs/2)
    # Undoes both rotated halves at once: the transpose of [[cos, -sin], [sin, cos]] (a scaled
    # rotation's transpose is scaled alike: the factor is inside cos and sin).
    dx_a = dout_a * cos + dout_b * sin
    dx_b = dout_b * cos - dout_a * sin
    # Undoes x_a, x_b = _pairs(x).
    dx = _join(dx_a, dx_b, layout)                                  # 2 x (..., T, hs/2) -> (..., T, hs)
    return dx.astype(x_dtype, copy=False)                           # rounded once to x's dtype


def _check_frequencies(hs, theta, scaling, seq_len=None):
    if isinstance(hs, bool) or not isinstance(hs, int | np.integer) or hs < 2 or hs % 2:
        raise ValueError(f"the head size hs must be a positive even integer, got {hs!r}")
    if isinstance(theta, bool) or not isinstance(theta, int | float | np.number) or not theta > 1:
        raise ValueError(f"theta must be a number > 1, got {theta!r}")
    check_in_dtype("theta", theta, np.float64)          # the frequencies are computed in float64
    _check_scaling(scaling)
    if isinstance(seq_len, bool) or not isinstance(seq_len, int | np.integer | None):
        raise TypeError(f"seq_len must be an int or None, got {type(seq_len).__name__} {seq_len!r}")
    if seq_len is not None and seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len!r}")
    if scaling is not None and scaling.get("rope_type") == "dynamic" and hs < 4:
        raise ValueError(f"dynamic scaling needs a head size hs >= 4 (its base grows by the power "
                         f"hs / (hs - 2)), got {hs!r}")


def _check_scaling(scaling):
    if scaling is None:
        return
    if not isinstance(scaling, dict):
        raise TypeError(f"scaling must be None or a dict, got {type(scaling).__name__}")
    rope_type = scaling.get("rope_type", "default")
    if rope_type not in SCALING_KEYS:
        raise ValueError(f"scaling rope_type must be one of {sorted(SCALING_KEYS)}, got {rope_type!r}")
    for key in SCALING_KEYS[rope_type]:
        value = scaling.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float | np.number) or not value > 0:
            raise ValueError(f"{rope_type} scaling needs {key} > 0, got {value!r}")
        if not is_finite_number(value):
            raise ValueError(f"{rope_type} scaling needs a finite {key}, got {value!r}")
        if key.endswith("factor") and not math.isfinite(1 / value):   # 1e-320: the frequencies divided by it
            raise ValueError(f"{rope_type} scaling {key} = {value!r} is too small: 1 / {key} overflows to inf "
                             "in float64, the dtype the frequencies are computed in")
    if rope_type == "llama3" and not scaling["high_freq_factor"] > scaling["low_freq_factor"]:
        raise ValueError(f"llama3 scaling needs high_freq_factor > low_freq_factor, got "
                         f"{scaling['high_freq_factor']!r} and {scaling['low_freq_factor']!r}")
    if scaling.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"scaling partial_rotary_factor is not implemented (only 1.0), got "
                         f"{scaling['partial_rotary_factor']!r}")
    if rope_type == "yarn":
        _check_yarn(scaling)


def _check_yarn(scaling):
    for key in YARN_OPTIONAL_KEYS:
        value = scaling.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float | np.number)):
            raise TypeError(f"yarn scaling {key} must be a number or None, got {type(value).__name__} {value!r}")
        if value is not None and not 0 < value < math.inf:
            raise ValueError(f"yarn scaling needs {key} > 0 and finite when given, got {value!r}")
    truncate = scaling.get("truncate", True)
    if not isinstance(truncate, bool | np.bool_):
        raise TypeError(f"yarn scaling truncate must be True or False, got {type(truncate).__name__} {truncate!r}")
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1
    if beta_fast < beta_slow:
        raise ValueError(f"yarn scaling needs beta_fast >= beta_slow (turns over the original context), got "
                         f"beta_fast {beta_fast!r} and beta_slow {beta_slow!r}")


def _check_rope(x, positions, layout):
    check_float("x", x)
    if x.ndim < 2 or x.shape[-1] % 2:
        raise ValueError(f"x must have shape (..., T, hs) with an even head size hs, got {x.shape}")
    positions = np.asarray(positions)
    check_integer("positions", positions)
    try:
        fits = (positions.ndim >= 1
                and np.broadcast_shapes(positions.shape, x.shape[:-1]) == x.shape[:-1])
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"positions of shape {positions.shape} must be (T,) or (..., T) and "
                         f"broadcast to x's {x.shape[:-1]} (x {x.shape})")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be 'half' or 'interleaved', got {layout!r}")
