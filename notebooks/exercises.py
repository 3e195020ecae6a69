# %% [markdown]
# # The exercise ladder: write the backward, graded as numpy_attn's own is
#
# Six operations, in the order to climb them (`numpy-attn exercise --list`). Each rung shows
# `numpy_attn`'s forward (the code the exercise file copies: the cache it returns is what your
# backward gets), leaves its backward for you to write (the signature, how it unpacks the cache,
# and as comments the line of the forward each step undoes), and grades it with
# `numpy_attn.testing.check`: Hypothesis draws inputs, and your gradients are compared with
# `numpy_attn`'s hand-written ones in float64, to the tolerance the project's own tests use. Until
# a backward is right its grading cell prints the report: the smallest input that fails, which
# gradient is wrong, where and by how much.
#
# The same ladder as files: `numpy-attn exercise softmax ex` writes `ex/softmax.py`, and
# `numpy-attn check ex/softmax.py` grades it.

# %%
from IPython.display import Markdown, display

from attn_cli import exercise
from numpy_attn.testing import OPERATIONS, CheckFailure, check

EXAMPLES = 50                # inputs drawn for each grading, as numpy-attn check draws them (seed 0)


def show(op):
    """numpy_attn's forward of ``op``, with its cache and helpers, as the exercise file copies them."""
    display(Markdown(f"```python\n{exercise.forward_text(op)}```"))


def grade(op, forward, backward):
    """Grade ``backward`` with numpy_attn.testing.check: print that it agrees, or the report."""
    if backward is OPERATIONS[op].backward:       # a later rung's cell imported numpy_attn's own
        print(f"{op}: {backward.__name__} is numpy_attn's own, imported by a later exercise's cell: run "
              "the cell of yours again, then this one")
        return
    try:
        check(op, forward, backward, examples=EXAMPLES)
    except CheckFailure as report:                # the report, printed: the notebook goes on
        print(report)
    else:
        print(f"{op}: {backward.__name__} agrees with numpy_attn's on {EXAMPLES} examples (float64, seed 0)")

# %% [markdown]
# ## 1. softmax
#
# Softmax and log-softmax along one axis, with hand-written backward passes. The forward,
# `numpy_attn/softmax.py`'s own:

# %%
from numpy_attn.softmax import softmax_forward

show("softmax")

# %% [markdown]
# Write `softmax_backward`: it returns `dx`. Then run the cell under it.

# %% tags=["backward"]
import numpy as np

from numpy_attn._checks import upcast
from numpy_attn.softmax import _check_softmax_dy, _to_x_dtype


def softmax_backward(dy, cache):
    """Gradient of softmax: dy (..., n) -> dx (..., n)."""
    y, axis, x_dtype, y_dtype = cache
    # To write: each step undoes a line of the forward, from its last line to its first.
    # Undoes y = e / s
    raise NotImplementedError("write this backward, then grade it: run the next cell")

# %%
grade("softmax", softmax_forward, softmax_backward)

# %% [markdown]
# ## 2. linear
#
# Affine map ``x @ w + b`` with the weight stored (C_in, C_out), and its backward. The forward,
# `numpy_attn/linear.py`'s own:

# %%
from numpy_attn.linear import linear_forward

show("linear")

# %% [markdown]
# Write `linear_backward`: it returns `(dx, {"w": dw, "b": db})`, `"b"` only when the forward had
# a bias. Then run the cell under it.

# %% tags=["backward"]
import numpy as np

from numpy_attn._checks import check_dout, upcast


def linear_backward(dout, cache):
    """Gradients of ``x @ w + b``: dout (..., C_out) -> (dx (..., C_in), {"w": dw, "b": db}).

    Without a bias the dict has no "b" key, so it has exactly the keys of the parameters used.
    """
    x, w, has_bias = cache
    # To write: each step undoes a line of the forward, from its last line to its first.
    # Undoes out = out + b
    # Undoes out = x @ w
    raise NotImplementedError("write this backward, then grade it: run the next cell")

# %%
grade("linear", linear_forward, linear_backward)

# %% [markdown]
# ## 3. layer_norm
#
# Layer normalisation over the last axis (or the last few), with its backward. The forward,
# `numpy_attn/layer_norm.py`'s own:

# %%
from numpy_attn.layer_norm import layer_norm_forward

show("layer_norm")

# %% [markdown]
# Write `layer_norm_backward`: it returns `(dx, {"w": dw, "b": db})`, with only the parameters the
# forward was given. Then run the cell under it.

# %% tags=["backward"]
import numpy as np

from numpy_attn._checks import check_dout, upcast


def layer_norm_backward(dout, cache):
    """Gradients of layer norm: dout (..., *S) -> (dx (..., *S), {"w": dw S, "b": db S}), with
    only the parameters the forward was given."""
    xhat, rstd, w, has_b, axes, x_dtype = cache
    # To write: each step undoes a line of the forward, from its last line to its first.
    # Undoes out = xhat * w + b
    # Undoes xhat = xc * rstd, var = mean(xc^2) and both centrings together
    raise NotImplementedError("write this backward, then grade it: run the next cell")

# %%
grade("layer_norm", layer_norm_forward, layer_norm_backward)

# %% [markdown]
# ## 4. attention
#
# Scaled dot-product attention and its backward: the twin of
# torch.nn.functional.scaled_dot_product_attention. The forward, `numpy_attn/attention.py`'s own:

# %%
from numpy_attn.attention import scaled_dot_product_attention_forward

show("attention")

# %% [markdown]
# Write `scaled_dot_product_attention_backward`: it returns `(dq, dk, dv)`. Then run the cell
# under it.

# %% tags=["backward"]
import numpy as np

from numpy_attn._checks import check_dout, upcast
from numpy_attn.attention import _check_dlse, _sum_to_shape
from numpy_attn.dropout import dropout_backward
from numpy_attn.softmax import softmax_backward


def scaled_dot_product_attention_backward(dout, cache, dlse=None):
    """Gradients of attention: dout (..., T, hv) [, dlse (..., T), the gradient of ``cache.lse``]
    -> (dq (..., T, hs), dk (..., S, hs), dv (..., S, hv)[, dattn_mask]), dattn_mask (the mask's
    shape) if the forward had ``attn_mask_grad=True``.

    With grouped-query attention dk and dv have the fewer heads of k and v: each sums its group.
    """
    q_scaled, k, v, dropped, g = cache.q_scaled, cache.k, cache.v, cache.dropped, cache.g
    dtype = cache.weights.dtype                                   # the inputs'; the cache may hold float32
    # To write: each step undoes a line of the forward, from its last line to its first.
    # Undoes out = dropped @ v
    # Undoes dropped = dropout(weights)
    # Undoes weights = softmax(scores)
    # if dlse is not None:
    #     Undoes lse = log sum exp(scores)
    # Undoes scores = q_scaled @ k^T + attn_mask and q_scaled = q * scale
    # Undoes the broadcasting of the batch axes
    # if g > 1:
    #     Undoes the repeat
    raise NotImplementedError("write this backward, then grade it: run the next cell")

# %%
grade("attention", scaled_dot_product_attention_forward, scaled_dot_product_attention_backward)

# %% [markdown]
# ## 5. multi_head
#
# Multi-head attention: project, split into heads, attend, merge the heads, project back. The
# forward, `numpy_attn/multi_head.py`'s own:

# %%
from numpy_attn.multi_head import multi_head_attention_forward

show("multi_head")

# %% [markdown]
# Write `multi_head_attention_backward`: it returns `(dx, dparams)`, dparams shaped like params.
# Then run the cell under it.

# %% tags=["backward"]
import numpy as np

from numpy_attn._checks import check_dout, check_no_past
from numpy_attn.attention import scaled_dot_product_attention_backward
from numpy_attn.linear import linear_backward
from numpy_attn.multi_head import merge_heads, split_heads


def multi_head_attention_backward(dout, cache):
    """Gradients: dout (B, T, C) -> (dx (B, T, C), dparams), dkv (B, S, C) after them for
    cross-attention, then dattn_mask (the mask's shape) if the forward had attn_mask_grad=True.
    dparams has the keys and nesting of params ("b" only with bias)."""
    B, nh, T, hs = cache.attention.q_scaled.shape
    # To write: each step undoes a line of the forward, from its last line to its first.
    # Undoes out = linear(y, o)
    # Undoes y = merge_heads(y)
    # Undoes the attention of the heads
    # Undoes q, k, v = split_heads(...)
    # Undoes the three projections
    # Undoes src = x
    raise NotImplementedError("write this backward, then grade it: run the next cell")

# %%
grade("multi_head", multi_head_attention_forward, multi_head_attention_backward)

# %% [markdown]
# ## 6. flash_attention
#
# FlashAttention: exact attention computed in tiles, never forming the (T, S) scores, with
# backward. The forward, `numpy_attn/flash_attention.py`'s own:

# %%
from numpy_attn.flash_attention import flash_attention_forward

show("flash_attention")

# %% [markdown]
# Write `flash_attention_backward`: it returns `(dq, dk, dv)`. Then run the cell under it.

# %% tags=["backward"]
import numpy as np

from numpy_attn._checks import check_dout, upcast
from numpy_attn.flash_attention import _crosses, _last_row, _visible
from numpy_attn.softcap import logit_softcap_backward, logit_softcap_forward


def flash_attention_backward(dout, cache):
    """Gradients: dout (..., T, hv) -> (dq (..., T, hs), dk (..., S, hs), dv (..., S, hv)), and
    dsinks (nh,) after them if the forward had ``sinks``: (dq, dk, dv[, dsinks]).

    With grouped-query attention dk and dv have the fewer heads of k and v: each sums its group.
    """
    q, k, v, out, lse, is_causal, scale, block_q, block_k, g, softcap, window, sinks, sink_p, dtype = cache
    # To write: each step undoes a line of the forward, from its last line to its first.
    # Undoes out = acc / row_sum
    # for j0 in range(0, S_seen if T > 0 else 0, block_k):
    #     for i0 in range(i_first, i_stop, block_q):
    #         Undoes the tile's p = exp(s - m) and the running sums
    #         Undoes acc += p @ v
    #         Undoes p = softmax(s) on this tile
    #         if softcap is not None:
    #             Undoes s = c * tanh(s / c)
    #         Undoes s = (q * scale) @ k^T
    # if g > 1:
    #     Undoes the repeat
    # if sinks is not None:
    #     Undoes the sink column
    raise NotImplementedError("write this backward, then grade it: run the next cell")

# %%
grade("flash_attention", flash_attention_forward, flash_attention_backward)
