"""What the language models here share after their blocks, in plain PyTorch: the output layer,
tied to the token embedding or not (numpy_attn/_model.py; autograd adds wte's two uses itself)."""

from torch_attn.linear import linear


def head(x, params, tie_weights):
    """The output layer: x (B, T, C) -> logits (B, T, V)."""
    head_w = params["wte"].T if tie_weights else params["head"]["w"]      # (C, V)
    logits = linear(x, head_w)                                            # (B, T, C) -> (B, T, V)
    return logits
