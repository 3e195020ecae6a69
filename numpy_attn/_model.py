"""What the language models here share after their blocks: the output layer, tied to the token
embedding or not, and the backward loop over the blocks.

    logits = x @ head.w                        head.w = wte^T with tied weights

With tied weights (Press and Wolf, 2017) wte is used twice, as the embedding and (transposed) as
the output layer, so its gradient is the sum of the two uses: ``dwte = dwte_embedding + dwte_head``.
In float16 and bfloat16 each use's gradient comes rounded to wte's dtype and their sum is rounded
once more, as PyTorch's autograd accumulates the gradients of a tensor used twice.
"""

from typing import NamedTuple

import numpy as np

from numpy_attn._checks import check_dout
from numpy_attn.linear import linear_backward, linear_forward


class HeadCache(NamedTuple):
    """The output layer's linear cache, whether its weight is wte^T, and the logits' shape and dtype."""

    linear: tuple
    tied: bool
    shape: tuple             # (B, T, V)
    dtype: np.dtype


def head_forward(x, params, tie_weights):
    """The output layer: x (B, T, C) -> logits (B, T, V). Returns ``(logits, cache)``."""
    head_w = params["wte"].T if tie_weights else params["head"]["w"]      # (C, V)
    logits, linear_cache = linear_forward(x, head_w)                      # (B, T, C) -> (B, T, V)
    return logits, HeadCache(linear_cache, tie_weights, logits.shape, logits.dtype)


def head_backward(op, dlogits, cache):
    """Undoes logits = x @ head_w: dlogits (B, T, V) -> (dx (B, T, C), dhead {"w": (C, V)});
    ``op`` names the model in the message about a wrong dlogits."""
    check_dout(op, dlogits, cache.shape, cache.dtype, name="dlogits")
    return linear_backward(dlogits, cache.linear)                         # (B, T, V) -> (B, T, C)


def blocks_backward(dx, caches, block_backward):
    """Undoes the blocks, the last one first: dx (B, T, C) -> (dx (B, T, C), dblocks), dblocks
    keyed "0", "1", ... in the params' order."""
    dblocks = {}
    for i in reversed(range(len(caches))):
        dx, dblocks[str(i)] = block_backward(dx, caches[i])              # (B, T, C)
    return dx, {str(i): dblocks[str(i)] for i in range(len(caches))}


def with_head(dparams, dhead, cache):
    """``dparams`` (whose "wte" is the embedding's gradient) with the output layer's gradient:
    added into "wte" with tied weights, as "head" without."""
    if cache.tied:
        # wte was used twice, as the embedding and (transposed) as the head: the uses add.
        dwte_head = dhead["w"].T                                          # (C, V) -> (V, C)
        dparams["wte"] = dparams["wte"] + dwte_head
    else:
        dparams["head"] = dhead
    return dparams
