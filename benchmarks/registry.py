"""The operations to benchmark, one entry each, named by the stem their files share.

An op's stem names ``numpy_attn/<stem>.py`` (the forward/backward pair), ``torch_attn/<stem>.py``
(the twin) and ``parity_tests/test_<stem>.py``. An op whose module or functions do not exist yet
is reported as not available, so ``python -m benchmarks`` works at every commit.

Adding an op is one ``Op(...)`` in ``OPS`` plus, at most, an inputs function and a builtin call:

    Op("block", stem="block", forward="block_forward", backward="block_backward",
       twin="block", builtin="nn.TransformerEncoderLayer", inputs=_block_inputs,
       flops=lambda z: 24 * z.B * z.T * z.C**2 + 4 * z.B * z.T * z.S * z.C, call_builtin=...)

This module imports NumPy only: the NumPy worker imports it and must never load torch.
"""

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

IMPLS = ("numpy", "twin", "builtin")
MODES = ("fwd", "fwd+bwd")


class Size(NamedTuple):
    """Benchmark size (DESIGN.md dimension key); self-attention, so S = T."""

    B: int
    nh: int
    T: int
    hs: int

    @property
    def S(self):
        return self.T

    @property
    def C(self):
        return self.nh * self.hs


@dataclass(frozen=True)
class Op:
    """One benchmarked operation.

    ``inputs(size, dtype, rng) -> (diff, static)``: ``diff`` holds the arrays (or nested parameter
    dicts) that gradients flow to, in the order the NumPy backward returns their gradients;
    ``static`` holds the other keyword arguments. Both twins are called as ``f(**diff, **static)``.
    ``flops(size)`` counts the forward; forward+backward counts ``1 + bwd_factor`` times that.
    ``call_builtin(tensors, static)`` runs the PyTorch built-in on torch tensors shaped like diff.
    """

    name: str
    stem: str
    forward: str
    backward: str
    twin: str
    builtin: str
    inputs: Callable
    flops: Callable
    call_builtin: Callable
    bwd_factor: float = 2.0

    def numpy_functions(self):
        """(forward, backward) from numpy_attn/<stem>.py; ImportError/AttributeError if absent."""
        module = importlib.import_module(f"numpy_attn.{self.stem}")
        return getattr(module, self.forward), getattr(module, self.backward)

    def twin_function(self):
        """The forward from torch_attn/<stem>.py (imports torch)."""
        return getattr(importlib.import_module(f"torch_attn.{self.stem}"), self.twin)

    def count_flops(self, size, mode):
        forward = self.flops(size)
        return forward if mode == "fwd" else round(forward * (1 + self.bwd_factor))

    def missing(self, impl):
        """Why ``impl`` cannot run yet (a sentence), or None when it can.

        Every impl needs the NumPy pair: it is the parity reference.
        """
        try:
            self.numpy_functions()
            if impl == "twin":
                self.twin_function()
        except (ImportError, AttributeError) as err:
            return f"not available: {err}"
        return None


def _normal(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


# -- inputs -----------------------------------------------------------------------------------

def _scores_inputs(z, dtype, rng):
    return {"x": _normal(rng, (z.B, z.nh, z.T, z.S), dtype)}, {}     # attention scores


def _qkv_inputs(causal):
    def inputs(z, dtype, rng):
        diff = {
            "q": _normal(rng, (z.B, z.nh, z.T, z.hs), dtype),
            "k": _normal(rng, (z.B, z.nh, z.S, z.hs), dtype),
            "v": _normal(rng, (z.B, z.nh, z.S, z.hs), dtype),
        }
        return diff, {"is_causal": causal}
    return inputs


def _mha_inputs(z, dtype, rng):
    from numpy_attn.multi_head import init_multi_head_params

    x = _normal(rng, (z.B, z.T, z.C), dtype)
    params = init_multi_head_params(z.C, rng, bias=True, dtype=dtype)
    return {"x": x, "params": params}, {"num_heads": z.nh}


# -- PyTorch built-ins (torch is imported here, never at module level) ------------------------

def _builtin_softmax(t, static):
    import torch

    return torch.softmax(t["x"], dim=-1)


def _builtin_sdpa(t, static):
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(t["q"], t["k"], t["v"], is_causal=static["is_causal"])


def _builtin_mha(t, static):
    """F.multi_head_attention_forward, the function behind nn.MultiheadAttention.

    Called functionally so that the gradients land on our parameter dict (for the parity check);
    nn.MultiheadAttention stores the transposed weights, q/k/v packed in one (3C, C) matrix.
    """
    import torch
    import torch.nn.functional as F

    x, p = t["x"], t["params"]
    C = x.shape[-1]
    w_in = torch.cat([p["q"]["w"], p["k"]["w"], p["v"]["w"]], dim=1).T   # (C, 3C) -> (3C, C)
    b_in = torch.cat([p["q"]["b"], p["k"]["b"], p["v"]["b"]])            # (3C,)
    x_tbc = x.transpose(0, 1)                      # (B, T, C) -> (T, B, C): sequence first
    out, _ = F.multi_head_attention_forward(
        x_tbc, x_tbc, x_tbc, C, static["num_heads"], w_in, b_in, None, None, False, 0.0,
        p["o"]["w"].T, p["o"]["b"], training=True, need_weights=False,
    )
    return out.transpose(0, 1)                     # (T, B, C) -> (B, T, C)


# -- the registry -----------------------------------------------------------------------------

def _attention_flops(z):
    return 4 * z.B * z.nh * z.T * z.S * z.hs       # q @ k^T and p @ v, 2 FLOPs per multiply-add


_SDPA = dict(
    stem="attention",
    forward="scaled_dot_product_attention_forward",
    backward="scaled_dot_product_attention_backward",
    twin="scaled_dot_product_attention",
    builtin="F.scaled_dot_product_attention",
    call_builtin=_builtin_sdpa,
)

OPS = {op.name: op for op in (
    Op("softmax", stem="softmax", forward="softmax_forward", backward="softmax_backward",
       twin="softmax", builtin="torch.softmax", inputs=_scores_inputs,
       # max, subtract, exp, sum, divide per element; the backward does 4 (dy*y, sum, -, *).
       # Softmax is memory-bound: its share of the matmul peak is only indicative.
       flops=lambda z: 5 * z.B * z.nh * z.T * z.S, bwd_factor=0.8,
       call_builtin=_builtin_softmax),
    Op("attention", inputs=_qkv_inputs(False), flops=_attention_flops, **_SDPA),
    # Causal: only the T*S/2 unmasked pairs count as useful work, although the reference code
    # computes the full score matrix and masks it.
    Op("attention_causal", inputs=_qkv_inputs(True), flops=lambda z: _attention_flops(z) // 2,
       **_SDPA),
    Op("multi_head", stem="multi_head", forward="multi_head_attention_forward",
       backward="multi_head_attention_backward", twin="multi_head_attention",
       builtin="nn.MultiheadAttention", inputs=_mha_inputs,
       # four (C, C) projections plus the attention itself
       flops=lambda z: 8 * z.B * z.T * z.C * z.C + _attention_flops(z),
       call_builtin=_builtin_mha),
)}


def select(names):
    """The ops named, in registry order; a stem selects every op built on it.

    Raises ValueError naming the unknown entries and the valid choices.
    """
    names = list(names) or list(OPS)
    unknown = [n for n in names if n not in OPS and n not in {op.stem for op in OPS.values()}]
    if unknown:
        raise ValueError(f"unknown op {', '.join(map(repr, unknown))}; choose from: {', '.join(OPS)}")
    return [op for op in OPS.values() if op.name in names or op.stem in names]
