"""Cross-entropy of logits against integer targets, mean over tokens, in plain PyTorch.

Twin of numpy_attn/loss.py, built on torch_attn.softmax's log-softmax. Tokens whose target is
``ignore_index`` are left out; if every token is, the loss is 0 with zero gradients (PyTorch's
built-in returns NaN there).
"""

import torch

from torch_attn.softmax import log_softmax


def cross_entropy(logits, targets, ignore_index=None):
    """Mean cross-entropy: logits (..., V), integer targets (...) -> loss, a 0-d tensor."""
    counted = torch.ones_like(targets, dtype=torch.bool) if ignore_index is None else targets != ignore_index
    targets = torch.where(counted, targets, 0)                         # (...), ignored -> class 0
    n = max(int(counted.sum()), 1)                                     # all ignored: 0 / 1, not 0 / 0
    logp = log_softmax(logits)                                         # (..., V)
    picked = torch.gather(logp, -1, targets[..., None])[..., 0]        # (..., V) -> (...)
    loss = -torch.where(counted, picked, 0).sum() / n                  # (...) -> ()
    return loss


# Equals torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1),
# ignore_index=ignore_index) (reduction="mean") whenever at least one token is counted.
