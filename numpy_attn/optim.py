"""AdamW and SGD over nested parameter dicts, as pure functions: (params, grads, state) -> new.

AdamW (Loshchilov and Hutter, 2019, algorithm 2), step t = 1, 2, ...:

    p = p * (1 - lr * wd)                      decoupled weight decay: not part of the gradient
    m = b1 * m + (1 - b1) * g                  first moment
    v = b2 * v + (1 - b2) * g * g              second moment
    p = p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)     bias-corrected step

SGD with momentum mu, dampening d and L2 weight decay wd, as ``torch.optim.SGD``:

    g = g + wd * p                             weight decay folded into the gradient
    buf = g on the first step, else mu * buf + (1 - d) * g
    g = g + mu * buf if nesterov else buf      (only when mu > 0)
    p = p - lr * g

The order of operations is that of ``torch.optim.AdamW`` / ``torch.optim.SGD`` (single-tensor
path), so the two agree to rounding. Every call returns fresh arrays; the state is a plain dict
``{"step": int, ...moment trees...}`` and nothing is kept between calls.

float16 and bfloat16 parameters: each update runs in float32 on upcast copies of p, g, m and v,
and each result is rounded once to its own dtype (torch.optim's single-tensor path computes in
the parameters' dtype, rounding at every operation). Mixed-precision training keeps float32
master weights instead, so that the step is float32 throughout (attn_cli/train.py).

Dynamic loss scaling, for float16 mixed precision (Micikevicius et al., 2018, as
``torch.amp.GradScaler``): the loss's gradient is multiplied by a scale S before the backward, so
that small gradients stay above float16's smallest normal number (6e-5); the gradients are
divided by S in float32. A step whose gradients overflowed (inf or NaN) is skipped and S halved;
after ``growth_interval`` clean steps in a row S is doubled.

    found_inf:  skip the step;  S = S * backoff_factor;  clean = 0
    otherwise:  clean = clean + 1;  if clean == growth_interval:  S = S * growth_factor;  clean = 0

Hyperparameters have torch.optim's bounds: lr, eps, momentum and weight_decay >= 0 (no upper
bound), betas in [0, 1), nesterov only with momentum > 0 and dampening 0. Beyond them we refuse a
NaN anywhere (torch.optim.SGD takes a NaN lr, momentum or weight_decay, and every parameter
becomes NaN) and a dampening outside [0, 1], which SGD does not check (the gradient is scaled by
1 - dampening; a negative factor climbs the loss).
"""

import math
import numbers

import numpy as np

from numpy_attn._checks import check_float, upcast
from numpy_attn._tree import leaves, tree_map, tree_pick


def _check_leaf(path, leaf, *others):
    """Every leaf a float array with the parameter's shape and dtype; raise if not."""
    for i, other in enumerate((leaf,) + others):
        check_float(path, other)
        if other.shape != leaf.shape or other.dtype != leaf.dtype:
            raise ValueError(f"'{path}' has shape {leaf.shape} {leaf.dtype} in the "
                             f"parameters but {other.shape} {other.dtype} in argument {i}")


def _tree_map(fn, tree, *others):
    """tree_map over parameter trees, every leaf checked (ValueError/TypeError naming its path)."""
    return tree_map(fn, tree, *others, check=_check_leaf)


def _check_hyper(lr, weight_decay, eps=0.0, betas=(0.0, 0.0), momentum=0.0, dampening=0.0,
                 nesterov=False):
    """Raise on hyperparameters that torch.optim would refuse, on NaN and on a dampening outside
    [0, 1] (ValueError; TypeError for a non-number or a bool); return them as Python floats, in the
    order (lr, weight_decay, eps, betas, momentum, dampening).

    Python floats because a NumPy float64 scalar is strongly typed (NEP 50): lr=np.float64(1e-3)
    would turn every float32 parameter it touches into float64, where a Python float adapts.
    """
    if not isinstance(betas, tuple | list):
        raise TypeError(f"betas must be a pair of numbers, got {type(betas).__name__} {betas!r}")
    if len(betas) != 2:
        raise ValueError(f"betas must be a pair of numbers, got {len(betas)}: {betas!r}")
    named = (("lr", lr), ("weight_decay", weight_decay), ("eps", eps), ("betas[0]", betas[0]),
             ("betas[1]", betas[1]), ("momentum", momentum), ("dampening", dampening))
    for name, value in named:
        if not isinstance(value, numbers.Real) or isinstance(value, bool | np.bool_):
            raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    if not isinstance(nesterov, bool | np.bool_):
        raise TypeError(f"nesterov must be a bool, got {type(nesterov).__name__} {nesterov!r}")
    for name, value in (("lr", lr), ("weight_decay", weight_decay), ("eps", eps),
                        ("momentum", momentum)):
        if not value >= 0:                       # also catches NaN
            raise ValueError(f"{name} must be >= 0, got {value!r}")
    for i, beta in enumerate(betas):
        if not 0 <= beta < 1:
            raise ValueError(f"betas[{i}] must lie in [0, 1), got {beta!r}")
    if not 0 <= dampening <= 1:
        raise ValueError(f"dampening must lie in [0, 1], got {dampening!r}")
    if nesterov and (momentum <= 0 or dampening != 0):
        raise ValueError(f"nesterov needs momentum > 0 and dampening 0, got momentum={momentum!r}, "
                         f"dampening={dampening!r}")
    return (float(lr), float(weight_decay), float(eps), (float(betas[0]), float(betas[1])),
            float(momentum), float(dampening))


def adamw_init(params):
    """AdamW state for ``params``: step 0 and zero first and second moments shaped like params."""
    return {"step": 0, "m": _tree_map(np.zeros_like, params), "v": _tree_map(np.zeros_like, params)}


def adamw_step(params, grads, state, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
    """One AdamW step: returns ``(new_params, new_state)``, the same nesting, shapes and dtypes.

    The defaults are those of ``torch.optim.AdamW``.
    """
    lr, weight_decay, eps, betas, _, _ = _check_hyper(lr, weight_decay, eps=eps, betas=betas)
    beta1, beta2 = betas
    step = state["step"] + 1
    step_size = lr / (1 - beta1**step)                            # lr / bias_correction1
    bias_correction2_sqrt = (1 - beta2**step) ** 0.5

    def update(p, g, m, v):
        dtype = p.dtype
        p, g, m, v = upcast(p), upcast(g), upcast(m), upcast(v)   # float32 for float16 and bfloat16
        p = p * (1 - lr * weight_decay)                           # decay first, as torch does
        m = beta1 * m + (1 - beta1) * g                           # torch writes m.lerp_(g, 1 - b1)
        v = beta2 * v + (1 - beta2) * g * g
        denom = np.sqrt(v) / bias_correction2_sqrt + eps
        p = p - step_size * (m / denom)
        return p.astype(dtype, copy=False), m.astype(dtype, copy=False), v.astype(dtype, copy=False)

    triples = _tree_map(update, params, grads, state["m"], state["v"])
    new_params = tree_pick(triples, 0)
    new_state = {"step": step, "m": tree_pick(triples, 1), "v": tree_pick(triples, 2)}
    return new_params, new_state


def sgd_init(params):
    """SGD state for ``params``: step 0 and a zero momentum buffer shaped like params."""
    return {"step": 0, "buf": _tree_map(np.zeros_like, params)}


def sgd_step(params, grads, state, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0,
             nesterov=False):
    """One SGD step: returns ``(new_params, new_state)``, the same nesting, shapes and dtypes.

    The defaults are those of ``torch.optim.SGD``; nesterov needs momentum > 0 and no dampening.
    """
    lr, weight_decay, _, _, momentum, dampening = _check_hyper(
        lr, weight_decay, momentum=momentum, dampening=dampening, nesterov=nesterov)
    first = state["step"] == 0

    def update(p, g, buf):
        dtype = p.dtype
        p, g, buf = upcast(p), upcast(g), upcast(buf)             # float32 for float16 and bfloat16
        if weight_decay != 0:
            g = g + weight_decay * p                              # L2: part of the gradient
        if momentum != 0:
            buf = g.copy() if first else momentum * buf + (1 - dampening) * g
            g = g + momentum * buf if nesterov else buf
        p = p - lr * g
        buf = buf.copy() if momentum == 0 else buf                # fresh arrays, even unused
        return p.astype(dtype, copy=False), buf.astype(dtype, copy=False)

    pairs = _tree_map(update, params, grads, state["buf"])
    new_state = {"step": state["step"] + 1, "buf": tree_pick(pairs, 1)}
    return tree_pick(pairs, 0), new_state


def loss_scale_init(init_scale=2.0**15, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    """State of dynamic loss scaling: the scale, its rules, and the clean steps counted so far.

    The defaults are ``torch.amp.GradScaler``'s, but for the first scale: 2^15, the largest power
    of two float16 holds (its largest number is 65504), because here the scaled gradient of the
    loss, 1 * scale, enters the float16 backward as a float16 number; GradScaler's 2^16 scales a
    float32 loss.
    """
    for name, value, low in (("init_scale", init_scale, 0), ("growth_factor", growth_factor, 1)):
        if not isinstance(value, numbers.Real) or isinstance(value, bool) or not (math.isfinite(value) and value > low):
            raise ValueError(f"{name} must be a finite number above {low}, got {value!r}")
    if not isinstance(backoff_factor, numbers.Real) or not 0 < backoff_factor < 1:
        raise ValueError(f"backoff_factor must lie in (0, 1), got {backoff_factor!r}")
    if not isinstance(growth_interval, numbers.Integral) or isinstance(growth_interval, bool) or growth_interval < 1:
        raise ValueError(f"growth_interval must be an integer >= 1, got {growth_interval!r}")
    return {"scale": float(init_scale), "clean_steps": 0, "growth_factor": float(growth_factor),
            "backoff_factor": float(backoff_factor), "growth_interval": int(growth_interval)}


def unscale_grads(grads, scale):
    """``(grads / scale in float32, found_inf)``: the gradients of a scaled loss brought back to the
    loss's own scale, in float32 (the master weights' dtype), and whether any of them overflowed."""
    inv_scale = np.float32(1 / scale)                             # exact for a power of two
    unscaled = _tree_map(lambda g: g.astype(np.float32) * inv_scale, grads)   # fresh float32 arrays
    found_inf = not all(np.isfinite(g).all() for _, g in leaves(unscaled))
    return unscaled, found_inf


def loss_scale_update(state, found_inf):
    """The scale after one step whose gradients did (``found_inf``) or did not overflow: returns
    ``(new_state, skip)``, ``skip`` True when the step must not be taken (see the module docstring)."""
    if found_inf:
        return {**state, "scale": state["scale"] * state["backoff_factor"], "clean_steps": 0}, True
    clean = state["clean_steps"] + 1
    if clean == state["growth_interval"]:
        grown = state["scale"] * state["growth_factor"]
        if grown <= float(np.finfo(np.float32).max):              # GradScaler keeps a float32 scale
            return {**state, "scale": grown, "clean_steps": 0}, False
        clean = 0
    return {**state, "clean_steps": clean}, False
