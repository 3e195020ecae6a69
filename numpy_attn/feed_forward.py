"""The Transformer's position-wise feed-forward network, and its backward.

    h = x @ fc.w + fc.b      (..., C) -> (..., 4C)
    a = gelu(h)              (..., 4C)
    out = a @ proj.w + proj.b   (..., 4C) -> (..., C)

Two affine maps around a GELU, applied to every position independently ("Attention Is All You
Need", section 3.3, with GPT-2's GELU and 4x width). Built from numpy_attn.linear and
numpy_attn.gelu; the backward runs their backwards in reverse order.

float16 and bfloat16: x and the weights and biases are cast up to float32 at the top, both layers,
the GELU and the backward run there as for float32, and out and each gradient are rounded once to
x's dtype (PyTorch's nn.Linear, nn.GELU, nn.Linear in bfloat16 compute each in float32 inside and
round after each, docs/precision.md; rounding once is at least as accurate).
"""

import numpy as np

from numpy_attn._checks import check_dout, check_float, check_rng, check_same_dtype, upcast
from numpy_attn._tree import tree_map
from numpy_attn.gelu import gelu_backward, gelu_forward
from numpy_attn.linear import linear_backward, linear_forward


def init_feed_forward_params(C, rng, dtype=np.float32, bias=True):
    """{"fc": {"w": (C, 4C), "b": (4C,)}, "proj": {"w": (4C, C), "b": (C,)}} (no "b" without bias).

    Drawn like ``torch.nn.Linear``'s default: every entry U(-1/sqrt(C_in), 1/sqrt(C_in)).
    """
    check_rng(rng, "init_feed_forward_params")
    params = {}
    for name, C_in, C_out in (("fc", C, 4 * C), ("proj", 4 * C, C)):
        bound = 1 / np.sqrt(C_in)
        params[name] = {"w": rng.uniform(-bound, bound, (C_in, C_out)).astype(dtype)}
        if bias:
            params[name]["b"] = rng.uniform(-bound, bound, (C_out,)).astype(dtype)
    return params


def feed_forward_forward(x, params, approximate="none"):
    """Feed-forward network on x (..., C) with ``params`` as from init_feed_forward_params -> (..., C).

    Returns ``(out, cache)``; the cache holds the three sub-caches (fc, gelu, proj), each layer's
    backward needing only its own, and x's dtype.
    """
    _check_feed_forward(x, params)
    x_dtype = x.dtype
    x, params = upcast(x), tree_map(upcast, params)                    # float32 for float16 and bfloat16
    fc, proj = params["fc"], params["proj"]
    h, fc_cache = linear_forward(x, fc["w"], fc.get("b"))              # (..., C) -> (..., H)
    a, gelu_cache = gelu_forward(h, approximate)                       # (..., H)
    out, proj_cache = linear_forward(a, proj["w"], proj.get("b"))     # (..., H) -> (..., C)
    cache = (fc_cache, gelu_cache, proj_cache, x_dtype)
    return out.astype(x_dtype, copy=False), cache                      # rounded once to x's dtype


def feed_forward_backward(dout, cache):
    """Gradients: dout (..., C) -> (dx (..., C), {"fc": {"w", "b"}, "proj": {"w", "b"}})."""
    fc_cache, gelu_cache, proj_cache, x_dtype = cache
    x = fc_cache.x                                                     # the forward's input (..., C)
    check_dout("feed_forward_backward", dout, x.shape, x_dtype)
    dout = upcast(dout)                                                # float32 for float16 and bfloat16
    # Undoes out = a @ proj.w + proj.b.
    da, dproj = linear_backward(dout, proj_cache)                      # (..., C) -> (..., H)
    # Undoes a = gelu(h).
    dh = gelu_backward(da, gelu_cache)                                 # (..., H)
    # Undoes h = x @ fc.w + fc.b.
    dx, dfc = linear_backward(dh, fc_cache)                            # (..., H) -> (..., C)
    # Each gradient rounded once to the inputs' dtype (no copy for float32 and float64).
    return dx.astype(x_dtype, copy=False), tree_map(lambda g: g.astype(x_dtype, copy=False),
                                                    {"fc": dfc, "proj": dproj})


def _check_feed_forward(x, params):
    """Raise unless x is a float array (..., C) and params' weights are float arrays fc.w (C, H),
    proj.w (H, C) (linear checks dtypes and biases, gelu its ``approximate``)."""
    check_float("x", x)
    if x.ndim < 1:
        raise ValueError(f"x must have shape (..., C), got {x.shape}")
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict {{'fc': {{'w', 'b'}}, 'proj': {{'w', 'b'}}}}, got "
                        f"{type(params).__name__}")
    for name in ("fc", "proj"):
        if not isinstance(params.get(name), dict) or "w" not in params[name]:
            raise ValueError(f"params must hold {name}: {{'w': ..., 'b': ...}} ('b' optional), got "
                             f"keys {sorted(params)} with {name} = {params.get(name)!r:.60}")
        check_float(f"{name}.w", params[name]["w"])
    C = x.shape[-1]
    fc, proj = params["fc"], params["proj"]
    H = fc["w"].shape[-1] if fc["w"].ndim else None
    if fc["w"].shape != (C, H) or proj["w"].shape != (H, C):
        raise ValueError(f"fc.w {fc['w'].shape} and proj.w {proj['w'].shape} must be (C, H) and "
                         f"(H, C) with C = {C} from x {x.shape}")
    # Refused here, as linear would (the same message), for the forward casts up before linear sees them.
    for p in (fc, proj):
        check_same_dtype(x=x, w=p["w"], b=p.get("b"))
