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

Hyperparameters have torch.optim's bounds: lr, eps, momentum and weight_decay >= 0 (no upper
bound), betas in [0, 1), nesterov only with momentum > 0 and dampening 0. Beyond them we refuse a
NaN anywhere (torch.optim.SGD takes a NaN lr, momentum or weight_decay, and every parameter
becomes NaN) and a dampening outside [0, 1], which SGD does not check (the gradient is scaled by
1 - dampening; a negative factor climbs the loss).
"""

import numbers

import numpy as np

from numpy_attn._checks import check_float
from numpy_attn._tree import tree_map, tree_pick


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
        p = p * (1 - lr * weight_decay)                           # decay first, as torch does
        m = beta1 * m + (1 - beta1) * g                           # torch writes m.lerp_(g, 1 - b1)
        v = beta2 * v + (1 - beta2) * g * g
        denom = np.sqrt(v) / bias_correction2_sqrt + eps
        p = p - step_size * (m / denom)
        return p, m, v

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
        if weight_decay != 0:
            g = g + weight_decay * p                              # L2: part of the gradient
        if momentum != 0:
            buf = g.copy() if first else momentum * buf + (1 - dampening) * g
            g = g + momentum * buf if nesterov else buf
        p = p - lr * g
        return p, buf.copy() if momentum == 0 else buf            # fresh arrays, even unused

    pairs = _tree_map(update, params, grads, state["buf"])
    new_state = {"step": state["step"] + 1, "buf": tree_pick(pairs, 1)}
    return tree_pick(pairs, 0), new_state
