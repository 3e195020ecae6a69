"""Our parameter dicts in the layout of PyTorch's own modules, and back: the one place that knows
how ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` store what we store.

We keep weights (C_in, C_out) applied as ``x @ w + b``; ``nn.Linear`` keeps (C_out, C_in), and
``nn.MultiheadAttention`` stacks Wq, Wk, Wv (each transposed) into one ``in_proj_weight`` (3C, C)
and their biases into ``in_proj_bias`` (3C,). Used by the benchmarks and the tests to run the
built-ins on our parameters; the operations never import it, so it is not in torch_attn, which
holds the twins only, and it is in the benchmarks package because the wheel ships that (the tests
are not shipped). Works on tensors (differentiably) and on their gradients, which have the same
layout.
"""

import torch


def to_mha(params):
    """{"q", "k", "v", "o"} -> nn.MultiheadAttention's state-dict names; no biases without "b"."""
    state = {"in_proj_weight": torch.cat([params[n]["w"] for n in "qkv"], dim=1).T,   # (C, 3C) -> (3C, C)
             "out_proj.weight": params["o"]["w"].T}                                  # (C, C)
    if "b" in params["q"]:
        state["in_proj_bias"] = torch.cat([params[n]["b"] for n in "qkv"])           # (3C,)
        state["out_proj.bias"] = params["o"]["b"]
    return state


def from_mha(state):
    """The inverse of ``to_mha``: our {"q", "k", "v", "o"} from nn.MultiheadAttention's names."""
    params = {n: {"w": w.T} for n, w in zip("qkv", state["in_proj_weight"].chunk(3), strict=True)}
    params["o"] = {"w": state["out_proj.weight"].T}
    if state.get("in_proj_bias") is not None:
        for n, b in zip("qkv", state["in_proj_bias"].chunk(3), strict=True):
            params[n]["b"] = b
        params["o"]["b"] = state["out_proj.bias"]
    return params


# nn.TransformerEncoderLayer's Linear and LayerNorm modules, and where we keep each.
_ENCODER_MODULES = {"linear1": ("ffn", "fc"), "linear2": ("ffn", "proj"),
                    "norm1": ("ln1",), "norm2": ("ln2",)}


def _get(params, path):
    for key in path:
        params = params[key]
    return params


def to_encoder_layer(params):
    """A block's {"ln1", "attn", "ln2", "ffn"} -> nn.TransformerEncoderLayer's state-dict names."""
    state = {f"self_attn.{k}": v for k, v in to_mha(params["attn"]).items()}
    for module, path in _ENCODER_MODULES.items():
        p = _get(params, path)
        state[f"{module}.weight"] = p["w"].T if module.startswith("linear") else p["w"]
        state[f"{module}.bias"] = p["b"]
    return state


def from_encoder_layer(state):
    """The inverse of ``to_encoder_layer``."""
    attn = {k[len("self_attn."):]: v for k, v in state.items() if k.startswith("self_attn.")}
    params = {"attn": from_mha(attn), "ffn": {}}
    for module, path in _ENCODER_MODULES.items():
        w = state[f"{module}.weight"]
        node = params["ffn"] if path[0] == "ffn" else params
        node[path[-1]] = {"w": w.T if module.startswith("linear") else w, "b": state[f"{module}.bias"]}
    return params
