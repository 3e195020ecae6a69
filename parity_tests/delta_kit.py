"""What the delta rule's test files share: their low-precision error budget's runs (ours, the
twins' and transformers' fallbacks through autograd, each giving the output, the final state and
every input's gradient) and the choice of PyTorch's run to hold ours to."""

import numpy as np
from transformers.models.kimi_linear.modeling_kimi_linear import (
    chunk_kimi_delta_attention,
    recurrent_kimi_delta_attention,
)
from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule, torch_recurrent_gated_delta_rule

from numpy_attn.testing import to_numpy, to_torch


def autograd_both(fn, arrays, do, dstate):
    """``fn(**tensors) -> (o, state)`` with autograd through (o * do).sum() + (state * dstate).sum():
    (o, state, {name: gradient}) as NumPy; an input that is None stays None and has no gradient."""
    leaves = {name: None if x is None else to_torch(x, requires_grad=True) for name, x in arrays.items()}
    o, state = fn(**leaves)
    ((o * to_torch(do).to(o.dtype)).sum() + (state * to_torch(dstate).to(state.dtype)).sum()).backward()
    return to_numpy(o), to_numpy(state), {name: to_numpy(t.grad) for name, t in leaves.items() if t is not None}


def transformers_delta_rule(chunk_size=None):
    """transformers' fallback for the kind of g, on our layout, as ``f(q, k, v, g, beta,
    initial_state) -> (o, state)``: the recurrent ones (torch_recurrent_gated_delta_rule for one g
    per head, recurrent_kimi_delta_attention for one per key channel) without a ``chunk_size``, the
    chunked ones (torch_chunk_gated_delta_rule, chunk_kimi_delta_attention) with it. Each casts its
    inputs to float32, computes and rounds o once to the inputs' dtype; the state comes back in
    float32 and is rounded here to that dtype, as ours and the twin's: held to a float32 state, ours
    would be measured against no low-precision error at all (a multiple of 10^5 for being within an
    ulp)."""
    def run(q, k, v, g, beta, initial_state):
        per_channel = g.dim() == 4
        if chunk_size is None:
            theirs, sized = recurrent_kimi_delta_attention if per_channel else torch_recurrent_gated_delta_rule, {}
        else:
            theirs, sized = chunk_kimi_delta_attention if per_channel else torch_chunk_gated_delta_rule, {
                "chunk_size": chunk_size}
        o, state = theirs(*(x.transpose(1, 2) for x in (q, k, v, g, beta)), initial_state=initial_state,
                          output_final_state=True, use_qk_l2norm_in_kernel=False, **sized)
        return o.transpose(1, 2), state.to(o.dtype)
    return run


def budget_tensors(ours, yardsticks, truth):
    """{name: (ours, PyTorch's, truth)} for o, the final state and each input's gradient, of
    (o, state, grads) runs; PyTorch's is, tensor by tensor, the one of the ``yardsticks`` runs
    closest to the truth: ours is held to each of them."""
    def named(run):
        return {"o": run[0], "state": run[1], **{f"d{name}": g for name, g in run[2].items()}}

    def error(run, name):
        return np.max(np.abs(run[name].astype(np.float64) - truth[name]), initial=0.0)

    ours, truth, runs = named(ours), named(truth), [named(run) for run in yardsticks]
    return {name: (ours[name], min(runs, key=lambda run: error(run, name))[name], truth[name]) for name in truth}
