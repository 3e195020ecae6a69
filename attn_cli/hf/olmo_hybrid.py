"""OlmoHybridForCausalLM folders -> numpy_attn.olmo_hybrid's OlmoHybridConfig and params: OLMo 2's
keys, the layer types and Gated DeltaNet's sizes.

The attention layers are read as OLMo 2's (norms after the sublayers, q and k norms over the whole
projections); a linear layer's two norms come before its sublayers (input_layernorm and
post_attention_layernorm) and its mixer's tensors keep Hugging Face's names. Layers: each entry of
``layer_types``, or, without it, every 4th layer full (the last one if there are fewer than 4), as
transformers reads them. A config without rope_theta (transformers' NoPE mode) is refused by
rope_settings, naming the key.
"""

import dataclasses

import numpy as np

from attn_cli.hf.config import Reader, read_layer_types
from attn_cli.hf.files import CheckpointError, _short
from attn_cli.hf.llama import LAYOUT_KEYS, llama_config, llama_params, read_linear
from numpy_attn.olmo_hybrid import OlmoHybridConfig
from numpy_attn.qwen3_5 import LAYER_TYPES

KEYS = {**LAYOUT_KEYS, "linear_conv_kernel_dim": ("int", 1, False), "linear_key_head_dim": ("int or null", 1, False),
        "linear_value_head_dim": ("int or null", 1, False), "linear_num_key_heads": ("int or null", 1, False),
        "linear_num_value_heads": ("int or null", 1, False), "linear_allow_neg_eigval": ("bool", None, False)}

# transformers' OlmoHybridConfig's values for keys left out, where they are not Llama's.
DEFAULTS = {"max_position_embeddings": 65536}


def layer_types(hf):
    """config.json's layer_types, each entry checked (None where absent: the config's default)."""
    types = read_layer_types(hf, "OlmoHybrid")
    bad = [t for t in types or () if t not in LAYER_TYPES]
    if bad:
        raise CheckpointError(f"OlmoHybrid config.json: layer_types must list only 'linear_attention' and "
                              f"'full_attention', got {_short(bad[0])}")
    return types


def olmo_hybrid_config(hf):
    """OlmoHybridConfig from an OLMo Hybrid config.json (dict): llama_config's fields, then the
    layer types and Gated DeltaNet's sizes (those left out or null derived as transformers derives them)."""
    types = layer_types(hf)
    config = llama_config(hf, OlmoHybridConfig)
    return dataclasses.replace(
        config, layer_types=types, linear_k_heads=hf.get("linear_num_key_heads"),
        linear_v_heads=hf.get("linear_num_value_heads"), linear_k_dim=hf.get("linear_key_head_dim"),
        linear_v_dim=hf.get("linear_value_head_dim"), conv_kernel=hf.get("linear_conv_kernel_dim", 4),
        allow_neg_eigval=hf.get("linear_allow_neg_eigval", True))


def olmo_hybrid_params(tensors, config):
    """OLMo 2's params on the full layers; on a linear layer its pre-norms and Gated DeltaNet's
    tensors: nn.Linear's (C_out, C_in) transposed, the convolution's three (width, 1, K) pieces, q's,
    k's and v's, joined into (conv_dim, K). Names as the model's, read under the file's (_Saved)."""
    C, H = config.n_embd, config.hidden
    nk, nv, dk, dv = config.linear_k_heads, config.linear_v_heads, config.linear_k_dim, config.linear_v_dim
    full = [i for i in range(config.n_layer) if config.is_full(i)]
    # OLMo 2's reading, on a view of the file where the full layers are numbered 0, 1, ...
    only_full = dataclasses.replace(config, n_layer=len(full), layer_types=("full_attention",) * len(full))
    params = llama_params(_Saved(tensors, full), only_full,
                          norms=("post_attention_layernorm", "post_feedforward_layernorm"),
                          qk_norm=(config.n_head * config.hs, config.n_kv_head * config.hs))
    blocks = {str(i): params["blocks"][str(j)] for j, i in enumerate(full)}
    tensors = _Saved(tensors)
    for i in range(config.n_layer):
        if config.is_full(i):
            continue
        p, a = f"model.layers.{i}.", f"model.layers.{i}.linear_attn."
        sizes = {"q_proj": (C, nk * dk), "k_proj": (C, nk * dk), "v_proj": (C, nv * dv), "a_proj": (C, nv),
                 "b_proj": (C, nv), "g_proj": (C, nv * dv), "o_proj": (nv * dv, C)}
        attn = {name: read_linear(tensors, a + name, *shape) for name, shape in sizes.items()}
        attn.update(conv1d={"w": _conv(tensors, a, config)}, dt_bias=tensors.take(a + "dt_bias", (nv,)),
                    A_log=tensors.take(a + "A_log", (nv,)), o_norm={"w": tensors.take(a + "o_norm.weight", (dv,))})
        blocks[str(i)] = {
            "attn_norm": {"w": tensors.take(p + "input_layernorm.weight", (C,))}, "attn": attn,
            "mlp_norm": {"w": tensors.take(p + "post_attention_layernorm.weight", (C,))},
            "mlp": {"gate": read_linear(tensors, p + "mlp.gate_proj", C, H),
                    "up": read_linear(tensors, p + "mlp.up_proj", C, H),
                    "down": read_linear(tensors, p + "mlp.down_proj", H, C)}}
    params["blocks"] = {str(i): blocks[str(i)] for i in range(config.n_layer)}
    return params


def _conv(tensors, prefix, config):
    """The convolution's (conv_dim, K) weight from its three saved pieces, joined in order as
    transformers joins them on loading. Their widths are q's, k's and v's in the original
    checkpoints, while transformers' own save cuts the whole into three near-equal pieces
    (torch.chunk: 40 rows as 14, 14, 12): any widths are read whose sum is conv_dim."""
    K, names = config.conv_kernel, [f"{prefix}{x}_conv1d.weight" for x in "qkv"]
    widths = [tensors.width(name) for name in names]
    if None not in widths and sum(widths) != config.conv_dim:
        raise CheckpointError(f"{prefix}{{q,k,v}}_conv1d.weight: widths {widths} must sum to the convolved channels "
                              f"2 nk dk + nv dv = {config.conv_dim} from config.json")
    pieces = [tensors.take(name, (width or 0, 1, K))[:, 0] for name, width in zip(names, widths, strict=True)]
    return np.concatenate(pieces)                                             # (conv_dim, K)


def olmo_hybrid_parameter_count(hf):
    """A lower bound on the parameters config.json implies (Python integers: no size overflows): the
    embedding, the final norm and per layer its two norms, its MLP and its mixer's weight matrices,
    Gated DeltaNet's sizes derived as transformers derives them where left out."""
    C, H, L = hf["hidden_size"], hf["intermediate_size"], hf["num_hidden_layers"]
    nh = hf["num_attention_heads"]
    nkv, hs = hf.get("num_key_value_heads") or nh, hf.get("head_dim") or C // nh
    nk, nv = hf.get("linear_num_key_heads") or nh, hf.get("linear_num_value_heads") or nh
    dk = hf.get("linear_key_head_dim") or int(0.75 * C / nk)
    dv = hf.get("linear_value_head_dim") or 2 * dk
    full = 2 * C * nh * hs + 2 * C * nkv * hs                                  # q, o, k, v
    linear = C * (2 * nk * dk + nv * dv) + 2 * C * nv * dv + 2 * C * nv         # q, k, v; g, o; a, b
    try:
        types = layer_types(hf)
    except CheckpointError:
        types = None                           # refused later, by name
    mixers = L * min(full, linear) if types is None else \
        sum(full if t == "full_attention" else linear for t in types)   # without types: the smaller mixer
    return hf["vocab_size"] * C + mixers + L * (3 * C * H + 2 * C) + C


# The model's names of the norms -> the file's: transformers saves OLMo Hybrid under its original
# checkpoint's names (its conversion_mapping), on either kind of layer; the convolution as q's, k's
# and v's pieces.
SAVED_NAMES = {"input_layernorm": "attention_layer_norm", "post_attention_layernorm": "feedforward_layer_norm"}


class _Saved:
    """The file's tensors read under the model's names; with ``full``, layer j read as
    model.layers.<full[j]>: the full layers as a model of their own."""

    def __init__(self, tensors, full=None):
        self.tensors, self.full = tensors, full

    def _name(self, name):
        if self.full is not None and name.startswith("model.layers."):
            j, rest = name[len("model.layers."):].split(".", 1)
            name = f"model.layers.{self.full[int(j)]}.{rest}"
        for ours, saved in SAVED_NAMES.items():
            name = name.replace(f".{ours}.", f".{saved}.")
        return name

    def take(self, name, shape):
        return self.tensors.take(self._name(name), shape)

    def head(self, name, wte, tied):
        return self.tensors.head(name, wte, tied)

    def width(self, name):
        """The first dimension of the tensor ``name`` not yet taken, None where there is none (take names it)."""
        tensor = self.tensors.left.get(self._name(name))
        return None if tensor is None or len(tensor.shape) < 1 else int(tensor.shape[0])


READER = Reader(KEYS, olmo_hybrid_config, olmo_hybrid_params, parameter_count=olmo_hybrid_parameter_count,
                defaults=DEFAULTS)
