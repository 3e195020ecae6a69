"""What the language models here share after their blocks: the output layer, tied to the token
embedding or not, and the backward loop over the blocks.

    logits = x @ head.w                        head.w = wte^T with tied weights
    logits = x[:, -N:] @ head.w                with logits_to_keep = N: the last N positions only

``logits_to_keep`` is transformers' keyword and means what it does there: an int N > 0 keeps the
last N positions' logits (all T when N >= T), 0 or None keeps all. Generation reads the last
position's logits only, and the head is the widest matmul of a small model (C x V, 768 x 50257 in
GPT-2): a 512-token prompt then costs one row of it instead of 512. The backward hands the dropped
positions a zero gradient, as the full forward's backward with zero dlogits there.

With tied weights (Press and Wolf, 2017) wte is used twice, as the embedding and (transposed) as
the output layer, so its gradient is the sum of the two uses: ``dwte = dwte_embedding + dwte_head``.
In float16 and bfloat16 each use's gradient comes rounded to wte's dtype and their sum is rounded
once more, as PyTorch's autograd accumulates the gradients of a tensor used twice.

``for_backward=False`` (every model's forward takes it) keeps nothing for a backward: each block's
cache, which holds that block's activations, is dropped as soon as the block returns, and the forward
returns ``(logits, None)``; what ``torch.no_grad()`` does for the twin. Generation runs so: a forward
over 256 prompt tokens of GPT-2 124M then holds one block's activations at a time, not twelve.
"""

from typing import NamedTuple

import numpy as np

from numpy_attn._checks import check_dout
from numpy_attn.linear import linear_backward, linear_forward


class HeadCache(NamedTuple):
    """The output layer's linear cache, whether its weight is wte^T, and the logits' shape and dtype."""

    linear: tuple
    tied: bool
    shape: tuple             # (B, N, V), N the positions kept (T without logits_to_keep)
    dtype: np.dtype
    T: int                   # the positions of x, N of them kept


def head_forward(x, params, tie_weights, logits_to_keep=None):
    """The output layer: x (B, T, C) -> logits (B, N, V), N = min(logits_to_keep, T), or T when
    logits_to_keep is None or 0. Returns ``(logits, cache)``."""
    T = x.shape[1]
    # The last N positions only (generation reads the last): the head's V-wide rows skip the rest.
    x = x[:, -logits_to_keep:] if logits_to_keep else x                  # (B, T, C) -> (B, N, C)
    head_w = params["wte"].T if tie_weights else params["head"]["w"]      # (C, V)
    logits, linear_cache = linear_forward(x, head_w)                      # (B, N, C) -> (B, N, V)
    return logits, HeadCache(linear_cache, tie_weights, logits.shape, logits.dtype, T)


def head_backward(op, dlogits, cache):
    """Undoes logits = x[:, -N:] @ head_w: dlogits (B, N, V) -> (dx (B, T, C), dhead {"w": (C, V)});
    ``op`` names the model in the message about a wrong dlogits."""
    check_dout(op, dlogits, cache.shape, cache.dtype, name="dlogits")
    dx, dhead = linear_backward(dlogits, cache.linear)                    # (B, N, V) -> (B, N, C)
    # Undoes x = x[:, -N:]: the T - N positions without logits get no gradient from the head.
    dx = np.pad(dx, ((0, 0), (cache.T - dx.shape[1], 0), (0, 0))) if dx.shape[1] < cache.T else dx   # (B, T, C)
    return dx, dhead


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


def check_for_backward(for_backward):
    """Raise unless ``for_backward`` is True or False, naming it."""
    if not isinstance(for_backward, bool | np.bool_):
        raise TypeError(f"for_backward must be True or False (whether the forward keeps its activations for a "
                        f"backward), got {for_backward!r} of type {type(for_backward).__name__}")


def check_logits_to_keep(logits_to_keep):
    """Raise unless ``logits_to_keep`` is None or an integer >= 0 (not a bool), naming it."""
    if logits_to_keep is None:
        return
    if isinstance(logits_to_keep, bool) or not isinstance(logits_to_keep, int | np.integer):
        raise TypeError(f"logits_to_keep must be None or an int >= 0 (how many of the last positions get "
                        f"logits; 0 keeps all), got {logits_to_keep!r} of type {type(logits_to_keep).__name__}")
    if logits_to_keep < 0:
        raise ValueError(f"logits_to_keep must be None or an int >= 0 (how many of the last positions get "
                         f"logits; 0 keeps all), got {logits_to_keep!r}")
