"""Logit softcapping in plain PyTorch, c * tanh(x / c); autograd supplies the backward.

Twin of numpy_attn/softcap.py (Gemma 2's ``attn_logit_softcapping`` and
``final_logit_softcapping``): every logit squashed smoothly into (-c, c).
"""

import torch

from torch_attn._opmath import upcast


def logit_softcap(x, softcap):
    """c * tanh(x / c) elementwise, c = ``softcap`` > 0: x (...) -> out (...)."""
    xf = upcast(x)                                  # (...) float32 for float16 and bfloat16
    c = softcap
    t = torch.tanh(xf / c)                          # (...) in (-1, 1)
    out = c * t                                     # (...) in (-c, c)
    out = out.to(x.dtype)                           # rounded once to x's dtype
    return out


# No PyTorch built-in of its own: it equals the three lines transformers' Gemma 2 applies to its
# final logits (divide by the cap, torch.tanh, multiply), and inside attention the score_mod
# c * tanh(score / c) of torch.nn.attention.flex_attention (parity_tests/test_attention.py).
