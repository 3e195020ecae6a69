"""Logit softcapping, c * tanh(x / c), and its backward.

    out = c * tanh(x / c)            -c < out < c;  out = x - x^3 / (3 c^2) + ... near 0

Gemma Team, "Gemma 2: Improving Open Language Models at a Practical Size" (2024), section 2:
the attention scores (``attn_logit_softcapping``, c = 50) and the final logits
(``final_logit_softcapping``, c = 30) are squashed smoothly into (-c, c), so that no logit can
grow without bound, while those well below c pass almost unchanged. Inside attention it acts on
the scaled scores before the mask is added (numpy_attn/attention.py, flash_attention.py).

Backward: d out / d x = 1 - tanh^2(x / c), from the tanh the forward kept (as PyTorch's tanh
backward computes it, 1 - y^2).

float16 and bfloat16: the whole of c * tanh(x / c) and its backward run in float32 and are
rounded once to x's dtype, as PyTorch's tanh kernel computes its one step (docs/precision.md).
"""

import numpy as np

from numpy_attn._checks import check_dout, check_float, check_softcap, upcast


def logit_softcap_forward(x, softcap):
    """c * tanh(x / c) elementwise, c = ``softcap`` > 0: x (...) -> out (...).

    Returns ``(out, cache)``; the cache is ``(t, c, x's dtype)``, t = tanh(x / c) in the dtype
    computed in, all the backward needs.
    """
    _check_logit_softcap(x, softcap)
    xf = upcast(x)                                  # (...) float32 for float16 and bfloat16
    c = xf.dtype.type(softcap)                      # in xf's dtype: a float64 c would upcast float32
    t = np.tanh(xf / c)                             # (...) in (-1, 1)
    out = c * t                                     # (...) in (-c, c)
    out = out.astype(x.dtype, copy=False)           # rounded once to x's dtype
    return out, (t, c, x.dtype)


def logit_softcap_backward(dout, cache):
    """Gradient of softcapping: dout (...) -> dx (...)."""
    t, c, x_dtype = cache
    check_dout("logit_softcap", dout, t.shape, x_dtype)
    # Undoes out = c * tanh(x / c): c * (1 - t^2) / c.
    dx = upcast(dout) * (1 - t * t)                 # (...) in t's dtype, float32 for the low ones
    return dx.astype(x_dtype, copy=False)


def _check_logit_softcap(x, softcap):
    """Raise unless x is a float array and softcap a finite number > 0 (None is no cap: refused here)."""
    check_float("x", x)
    if softcap is None:
        raise TypeError("softcap must be a finite number > 0, got None")
    check_softcap(softcap, dtype=x.dtype)
