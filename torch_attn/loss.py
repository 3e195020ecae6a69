"""Cross-entropy of logits against class targets or class probabilities, in plain PyTorch.

Twin of numpy_attn/loss.py, built on torch_attn.softmax's log-softmax: the targets become a
(smoothed, weighted) distribution q over the classes and each token costs -sum(weight * q * logp).
Tokens whose target is ``ignore_index`` are left out; if every token is (or the counted weight is
0), reduction="mean" returns 0 with zero gradients (PyTorch's built-in returns NaN there).
float16 and bfloat16 are computed in float32 and the loss rounded once, as there.
"""

import torch

from torch_attn._opmath import upcast
from torch_attn.softmax import log_softmax


def cross_entropy(logits, targets, ignore_index=None, reduction="mean", label_smoothing=0.0,
                  weight=None, axis=-1):
    """Cross-entropy: logits (..., V), targets (...) of class indices or (..., V) of class
    probabilities, weight (V,) or None -> loss, 0-d (or (...) for reduction="none")."""
    soft = targets.is_floating_point()                                 # the NumPy checker's decision
    dtype = logits.dtype                                               # the loss's
    logits = upcast(torch.movedim(logits, axis, -1))                   # class axis last: (..., V)
    V = logits.shape[-1]
    weight = torch.ones(V, dtype=logits.dtype, device=logits.device) if weight is None else upcast(weight)
    if soft:                                                           # probabilities: (..., V)
        q = upcast(torch.movedim(targets, axis, -1))                   # class axis last: (..., V)
        counted = torch.ones(q.shape[:-1], dtype=torch.bool, device=q.device)   # (...)
        n = q[..., 0].numel()                                          # the number of tokens
    else:                                                              # class indices: (...)
        counted = torch.ones_like(targets, dtype=torch.bool) if ignore_index is None else targets != ignore_index
        targets = torch.where(counted, targets, 0)                     # (...), ignored -> class 0
        q = (targets[..., None] == torch.arange(V, device=targets.device)).to(logits.dtype)  # one-hot
        n = weight[targets][counted].sum()                             # weight of the counted tokens
    q = (1 - label_smoothing) * q + label_smoothing / V                # (..., V), smoothed
    q = torch.where(counted[..., None], q, 0)                          # ignored tokens cost nothing
    wq = weight * q                                                    # (..., V)
    logp = log_softmax(logits)                                         # (..., V)
    terms = wq * torch.where(wq == 0, 0, logp)                         # a -inf logit of weight 0: 0, not NaN
    loss = -terms.sum(dim=-1)                                          # (..., V) -> (...)
    n = 1 if reduction != "mean" else n if n != 0 else torch.inf       # n = 0: 0 / inf, not 0 / 0
    if reduction != "none":
        loss = loss.sum() / n                                          # (...) -> ()
    return loss.to(dtype)                                              # rounded once to logits' dtype


# Equals torch.nn.functional.cross_entropy(torch.movedim(logits, axis, 1), targets, weight,
# ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing) (class axis 1,
# or 0 for logits (V,)) whenever reduction="mean" has a nonzero divisor; test_loss.py checks it.
