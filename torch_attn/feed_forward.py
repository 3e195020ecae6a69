"""The Transformer's position-wise feed-forward network in plain PyTorch; autograd is the backward.

Twin of numpy_attn/feed_forward.py: linear C -> 4C, GELU, linear 4C -> C, built on the
torch_attn linear and gelu twins, taking the same nested parameter dict (weights (C_in, C_out));
float16 and bfloat16 computed in float32 and rounded once, as there.
"""

from numpy_attn._tree import tree_map  # plain Python: walks the nested dicts
from torch_attn._opmath import upcast
from torch_attn.gelu import gelu
from torch_attn.linear import linear


def feed_forward(x, params, approximate="none"):
    """Feed-forward network on x (..., C) with the nested ``params`` dict -> (..., C)."""
    x_dtype = x.dtype
    x, params = upcast(x), tree_map(upcast, params)                    # float32 for float16 and bfloat16
    fc, proj = params["fc"], params["proj"]
    h = linear(x, fc["w"], fc.get("b"))                                # (..., C) -> (..., H)
    a = gelu(h, approximate)                                           # (..., H)
    out = linear(a, proj["w"], proj.get("b"))                          # (..., H) -> (..., C)
    return out.to(x_dtype)                                             # rounded once to x's dtype


# Equals torch.nn.Sequential(nn.Linear(C, H), nn.GELU(approximate), nn.Linear(H, C)) with each
# nn.Linear's weight set to our w.T (nn.Linear stores (C_out, C_in)) and its bias to our b.
