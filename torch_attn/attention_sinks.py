"""Attention sinks in plain PyTorch; autograd supplies the backward.

out_sink = out * sigmoid(lse - s_h), out and lse attention's output and log-sum-exp per row. Twin
of numpy_attn/attention_sinks.py, which shows why this is softmax over the scores with one more
column s_h, dropped after the softmax (gpt-oss).
"""

import torch

from torch_attn._opmath import upcast


def attention_sinks(out, lse, sinks):
    """out * sigmoid(lse - s_h): out (..., nh, T, hv), lse (..., nh, T), sinks (nh,) -> (..., nh, T, hv)."""
    dtype = out.dtype                                             # float16 and bfloat16 compute in float32
    out, sinks = upcast(out), upcast(sinks)
    x = lse - sinks[:, None]                                      # (..., nh, T); -inf on a fully masked row
    share = torch.sigmoid(x).to(out.dtype)                        # sigmoid(x); 0 at -inf
    out_sink = out * share[..., None]                             # (..., nh, T, hv)
    return out_sink.to(dtype)                                     # rounded once to out's dtype


# Equals transformers' gpt-oss eager_attention_forward (its module.sinks) applied to the same
# scores: parity_tests/test_attention_sinks.py checks it.
