"""The Transformer's position-wise feed-forward network in plain PyTorch; autograd is the backward.

Twin of numpy_attn/feed_forward.py: linear C -> 4C, GELU, linear 4C -> C, built on the
torch_attn linear and gelu twins, taking the same nested parameter dict (weights (C_in, C_out)).
"""

from torch_attn.gelu import gelu
from torch_attn.linear import linear


def feed_forward(x, params, approximate="none"):
    """Feed-forward network on x (..., C) with the nested ``params`` dict -> (..., C)."""
    fc, proj = params["fc"], params["proj"]
    h = linear(x, fc["w"], fc.get("b"))                                # (..., C) -> (..., H)
    a = gelu(h, approximate)                                           # (..., H)
    out = linear(a, proj["w"], proj.get("b"))                          # (..., H) -> (..., C)
    return out


# Equals torch.nn.Sequential(nn.Linear(C, H), nn.GELU(approximate), nn.Linear(H, C)) with each
# nn.Linear's weight set to our w.T (nn.Linear stores (C_out, C_in)) and its bias to our b.
