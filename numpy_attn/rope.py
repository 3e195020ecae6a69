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

Backward: a rotation's transpose is the rotation by the opposite angle, so dx = R(-p f) dout.
Angles are computed in float64 and their cos and sin rounded once to x's dtype.
"""

import numpy as np

from numpy_attn._checks import check_dout, check_float, check_integer

LAYOUTS = ("half", "interleaved")
SCALING_KEYS = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}


def rope_frequencies(hs, theta=10000.0, scaling=None):
    """The inverse frequencies f_j (hs/2,) in float64, scaled as ``scaling`` says (see above)."""
    _check_frequencies(hs, theta, scaling)
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
    return inv_freq


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


def rope_forward(x, positions, theta=10000.0, layout="half", scaling=None):
    """Rotate x (..., T, hs) by its integer ``positions`` (T,) or (..., T) -> out (..., T, hs).

    ``positions`` broadcasts against x's leading dimensions (one row per batch, or one for all).
    Returns ``(out, cache)``; the cache is ``(cos, sin, layout, x's shape)``: the backward
    rotates back by the same tables and checks its dout against the shape.
    """
    _check_rope(x, positions, layout)
    T, hs = x.shape[-2:]
    inv_freq = rope_frequencies(hs, theta, scaling)                  # (hs/2,)
    angles = np.asarray(positions)[..., None] * inv_freq            # (..., T) -> (..., T, hs/2), float64
    cos = np.cos(angles).astype(x.dtype)                            # (..., T, hs/2)
    sin = np.sin(angles).astype(x.dtype)                            # (..., T, hs/2)
    x_a, x_b = _pairs(x, layout)                                    # (..., T, hs) -> 2 x (..., T, hs/2)
    out_a = x_a * cos - x_b * sin
    out_b = x_b * cos + x_a * sin
    out = _join(out_a, out_b, layout)                               # 2 x (..., T, hs/2) -> (..., T, hs)
    cache = (cos, sin, layout, x.shape)
    return out, cache


def rope_backward(dout, cache):
    """Gradient of the rotation: dout (..., T, hs) -> dx (..., T, hs), the rotation by -angle."""
    cos, sin, layout, shape = cache
    check_dout("rope", dout, shape, cos.dtype)
    # Undoes out = _join(out_a, out_b).
    dout_a, dout_b = _pairs(dout, layout)                           # (..., T, hs) -> 2 x (..., T, hs/2)
    # Undoes both rotated halves at once: the transpose of [[cos, -sin], [sin, cos]].
    dx_a = dout_a * cos + dout_b * sin
    dx_b = dout_b * cos - dout_a * sin
    # Undoes x_a, x_b = _pairs(x).
    dx = _join(dx_a, dx_b, layout)                                  # 2 x (..., T, hs/2) -> (..., T, hs)
    return dx


def _check_frequencies(hs, theta, scaling):
    if isinstance(hs, bool) or not isinstance(hs, int | np.integer) or hs < 2 or hs % 2:
        raise ValueError(f"the head size hs must be a positive even integer, got {hs!r}")
    if isinstance(theta, bool) or not isinstance(theta, int | float | np.number) or not theta > 1:
        raise ValueError(f"theta must be a number > 1, got {theta!r}")
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
    if rope_type == "llama3" and not scaling["high_freq_factor"] > scaling["low_freq_factor"]:
        raise ValueError(f"llama3 scaling needs high_freq_factor > low_freq_factor, got "
                         f"{scaling['high_freq_factor']!r} and {scaling['low_freq_factor']!r}")


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
