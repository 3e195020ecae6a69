"""AdamW and SGD over nested dicts of tensors, as pure functions: (params, grads, state) -> new.

Twin of numpy_attn/optim.py: the same formulas in the same order, on tensors, under
``torch.no_grad()`` so that the new parameters are fresh leaves (call ``requires_grad_`` on them
to train on). AdamW: decay p by (1 - lr * wd), update the moments, take the bias-corrected step.
SGD: fold wd * p into the gradient, then momentum (optionally Nesterov), then p - lr * g.
float16 and bfloat16: each update in float32, each result rounded once to its own dtype. Dynamic
loss scaling: skip and halve on overflow, double after growth_interval clean steps.
"""

import torch

from numpy_attn._tree import leaves, tree_map, tree_pick  # plain Python: walks the nested dicts
from torch_attn._opmath import upcast


def _tree_map(fn, tree, *others):
    """tree_map over parameter trees (the NumPy twin also checks every leaf)."""
    return tree_map(fn, tree, *others)


def adamw_init(params):
    """AdamW state for ``params``: step 0 and zero first and second moments shaped like params."""
    return {"step": 0, "m": _tree_map(torch.zeros_like, params), "v": _tree_map(torch.zeros_like, params)}


@torch.no_grad()
def adamw_step(params, grads, state, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
    """One AdamW step: returns ``(new_params, new_state)``."""
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
        denom = torch.sqrt(v) / bias_correction2_sqrt + eps
        p = p - step_size * (m / denom)
        return p.to(dtype), m.to(dtype), v.to(dtype)

    triples = _tree_map(update, params, grads, state["m"], state["v"])
    new_params = tree_pick(triples, 0)
    new_state = {"step": step, "m": tree_pick(triples, 1), "v": tree_pick(triples, 2)}
    return new_params, new_state


def sgd_init(params):
    """SGD state for ``params``: step 0 and a zero momentum buffer shaped like params."""
    return {"step": 0, "buf": _tree_map(torch.zeros_like, params)}


@torch.no_grad()
def sgd_step(params, grads, state, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0,
             nesterov=False):
    """One SGD step: returns ``(new_params, new_state)``."""
    first = state["step"] == 0

    def update(p, g, buf):
        dtype = p.dtype
        p, g, buf = upcast(p), upcast(g), upcast(buf)             # float32 for float16 and bfloat16
        if weight_decay != 0:
            g = g + weight_decay * p                              # L2: part of the gradient
        if momentum != 0:
            buf = g.clone() if first else momentum * buf + (1 - dampening) * g
            g = g + momentum * buf if nesterov else buf
        p = p - lr * g
        buf = buf.clone() if momentum == 0 else buf               # fresh tensors, even unused
        return p.to(dtype), buf.to(dtype)

    pairs = _tree_map(update, params, grads, state["buf"])
    new_state = {"step": state["step"] + 1, "buf": tree_pick(pairs, 1)}
    return tree_pick(pairs, 0), new_state


def loss_scale_init(init_scale=2.0**15, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    """State of dynamic loss scaling: the scale, its rules, and the clean steps counted so far."""
    return {"scale": float(init_scale), "clean_steps": 0, "growth_factor": float(growth_factor),
            "backoff_factor": float(backoff_factor), "growth_interval": int(growth_interval)}


def unscale_grads(grads, scale):
    """``(grads / scale in float32, found_inf)``."""
    inv_scale = 1 / scale                                         # exact for a power of two
    unscaled = _tree_map(lambda g: g.to(torch.float32) * inv_scale, grads)
    found_inf = not all(bool(torch.isfinite(g).all()) for _, g in leaves(unscaled))
    return unscaled, found_inf


def loss_scale_update(state, found_inf):
    """``(new_state, skip)``: halve on overflow and skip; double after growth_interval clean steps."""
    if found_inf:
        return {**state, "scale": state["scale"] * state["backoff_factor"], "clean_steps": 0}, True
    clean = state["clean_steps"] + 1
    if clean == state["growth_interval"]:
        grown = state["scale"] * state["growth_factor"]
        if grown <= torch.finfo(torch.float32).max:               # GradScaler keeps a float32 scale
            return {**state, "scale": grown, "clean_steps": 0}, False
        clean = 0
    return {**state, "clean_steps": clean}, False


# Equals torch.optim.AdamW(params, lr, betas, eps, weight_decay) and
# torch.optim.SGD(params, lr, momentum, dampening, weight_decay, nesterov), step after step; the
# loss scaling equals torch.amp.GradScaler(init_scale, growth_factor, backoff_factor, growth_interval).
