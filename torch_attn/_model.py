"""What the language models here share after their blocks, in plain PyTorch: the output layer,
tied to the token embedding or not (numpy_attn/_model.py; autograd adds wte's two uses itself)."""

from torch_attn.linear import linear


def head(x, params, tie_weights, logits_to_keep=None):
    """The output layer: x (B, T, C) -> logits (B, N, V), N = min(logits_to_keep, T), or T when
    logits_to_keep is None or 0 (transformers' keyword)."""
    # The last N positions only (generation reads the last): the head's V-wide rows skip the rest.
    x = x[:, -logits_to_keep:] if logits_to_keep else x                  # (B, T, C) -> (B, N, C)
    head_w = params["wte"].T if tie_weights else params["head"]["w"]      # (C, V)
    logits = linear(x, head_w)                                            # (B, N, C) -> (B, N, V)
    return logits
