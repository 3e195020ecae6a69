"""Read a Hugging Face checkpoint folder into numpy_attn's parameter dicts, without torch.

    kind, config, params = load_checkpoint("gpt2")       # a folder with config.json + *.safetensors

Supported: ``GPT2LMHeadModel`` (-> numpy_attn.gpt.GPTConfig, with GPT-2's GELU and eps) and
``LlamaForCausalLM`` (-> numpy_attn.llama.LlamaConfig and its params). The tensors are read with
``safetensors.numpy`` (bfloat16 ones, which NumPy lacks, are widened to float32 bit by bit), from
one ``model.safetensors`` or the shards listed in ``model.safetensors.index.json``, and converted
to ``dtype``.

Layouts. GPT-2's Conv1D weights are already (C_in, C_out), as ours; its ``c_attn`` holds q, k and
v side by side in (C, 3C), split here into three. Llama's nn.Linear weights are (C_out, C_in) and
are transposed. A tied head (``tie_word_embeddings``) is the token embedding; a file may omit it
or repeat it. Hugging Face's Llama rotates q and k in the "half" layout, so the config says so.

Every tensor the model needs must be present with the shape its config implies, and every tensor
present must be used: anything else is a ValueError naming the tensor.
"""

import json
from pathlib import Path

import numpy as np

from numpy_attn.gpt import GPTConfig
from numpy_attn.llama import LlamaConfig

ARCHITECTURES = ("GPT2LMHeadModel", "LlamaForCausalLM")
GELUS = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}
# Buffers that older GPT-2 files store beside the weights: the causal mask, not parameters.
GPT2_BUFFERS = (".attn.bias", ".attn.masked_bias")


class CheckpointError(ValueError):
    """A checkpoint folder this loader cannot read: the message names the file or tensor."""


def load_checkpoint(folder, dtype=np.float32):
    """(kind, config, params) from a Hugging Face folder: kind "gpt2" or "llama"."""
    folder = Path(folder)
    hf_config = read_config(folder)
    architecture = _architecture(hf_config, folder)
    tensors = _Tensors(read_tensors(folder), folder, dtype)
    if architecture == "GPT2LMHeadModel":
        config = gpt2_config(hf_config)
        params = _gpt2_params(tensors, config)
        kind = "gpt2"
    else:
        config = llama_config(hf_config)
        params = _llama_params(tensors, config)
        kind = "llama"
    tensors.finish()
    return kind, config, params


def read_config(folder):
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{folder} has no config.json: is it a Hugging Face model folder?")
    return json.loads(path.read_text())


def _architecture(hf_config, folder):
    names = hf_config.get("architectures") or []
    found = [n for n in names if n in ARCHITECTURES]
    if not found:
        raise CheckpointError(f"{folder}/config.json: architecture {names or hf_config.get('model_type')!r} "
                              f"is not supported; this loader reads {', '.join(ARCHITECTURES)}")
    return found[0]


# -- tensors ----------------------------------------------------------------------------------------

def read_tensors(folder):
    """Every tensor of the folder's safetensors file(s), by name, as NumPy arrays."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise CheckpointError(f"{folder} has no model.safetensors (nor model.safetensors.index.json); "
                              "download the safetensors weights")
    tensors = {}
    for name in files:
        tensors.update(_read_safetensors(folder / name))
    return tensors


def _read_safetensors(path):
    from safetensors.numpy import load_file

    header = _header(path)
    if not any(info.get("dtype") == "BF16" for info in header.values() if isinstance(info, dict)):
        return load_file(str(path))
    return _read_with_bfloat16(path, header)


def _header(path):
    """The JSON header of a safetensors file: {name: {"dtype", "shape", "data_offsets"}, ...}."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header


def _read_with_bfloat16(path, header):
    """Read a file holding bfloat16 tensors: bfloat16 is the top half of a float32, so shifting
    its 16 bits up gives the float32 of the same value exactly."""
    numpy_dtypes = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
                    "I32": np.int32, "BF16": np.uint16}
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    start = 8 + int.from_bytes(raw[:8].tobytes(), "little")
    tensors = {}
    for name, info in header.items():
        if info["dtype"] not in numpy_dtypes:
            raise CheckpointError(f"{path}: tensor {name!r} has dtype {info['dtype']}, not supported")
        begin, end = info["data_offsets"]
        data = np.frombuffer(raw[start + begin: start + end].tobytes(), numpy_dtypes[info["dtype"]])
        if info["dtype"] == "BF16":
            data = (data.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = data.reshape(info["shape"])
    return tensors


class _Tensors:
    """The checkpoint's tensors, handed out once each with their shapes checked."""

    def __init__(self, tensors, folder, dtype):
        self.left, self.folder, self.dtype = dict(tensors), folder, np.dtype(dtype)

    def take(self, name, shape):
        if name not in self.left:
            raise CheckpointError(f"{self.folder}: tensor {name!r} is missing (expected shape {shape})")
        tensor = self.left.pop(name)
        if tuple(tensor.shape) != tuple(shape):
            raise CheckpointError(f"{self.folder}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                                  f"expected {tuple(shape)} from config.json")
        return np.ascontiguousarray(tensor, dtype=self.dtype)

    def drop(self, name):
        """Forget a tensor that may be present and is not needed (a tied head's copy)."""
        self.left.pop(name, None)

    def finish(self):
        if self.left:
            names = sorted(self.left)
            more = f" and {len(names) - 5} more" if len(names) > 5 else ""
            raise CheckpointError(f"{self.folder}: unexpected tensors {names[:5]}{more} "
                                  "(not part of the model config.json describes)")


# -- GPT-2 ------------------------------------------------------------------------------------------

def gpt2_config(hf):
    """GPTConfig from a GPT-2 config.json (dict); unsupported options are refused by name."""
    for key, supported in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                           ("reorder_and_upcast_attn", False), ("add_cross_attention", False)):
        if hf.get(key, supported) != supported:
            raise CheckpointError(f"GPT-2 config.json: {key} = {hf[key]!r} is not supported "
                                  f"(only {supported!r})")
    activation = hf.get("activation_function", "gelu_new")
    if activation not in GELUS:
        raise CheckpointError(f"GPT-2 config.json: activation_function {activation!r} is not supported "
                              f"(one of {sorted(GELUS)})")
    return GPTConfig(vocab_size=hf["vocab_size"], block_size=hf["n_positions"], n_layer=hf["n_layer"],
                     n_head=hf["n_head"], n_embd=hf["n_embd"], dropout=0.0, bias=True,
                     tie_weights=bool(hf.get("tie_word_embeddings", True)), positions="learned",
                     ln_eps=float(hf.get("layer_norm_epsilon", 1e-5)), gelu=GELUS[activation])


def _gpt2_params(tensors, config):
    # Files written by GPT2LMHeadModel prefix "transformer."; the original release does not.
    prefix = "transformer." if any(k.startswith("transformer.") for k in tensors.left) else ""
    for name in list(tensors.left):
        if name.endswith(GPT2_BUFFERS):    # "h.0.attn.bias", never "h.0.attn.c_attn.bias"
            tensors.drop(name)
    V, C, T_max = config.vocab_size, config.n_embd, config.block_size
    H = tensors.left.get(f"{prefix}h.0.mlp.c_fc.weight", np.zeros((C, 4 * C))).shape[-1]

    def take(name, shape):
        return tensors.take(prefix + name, shape)

    def layer_norm(name):
        return {"w": take(f"{name}.weight", (C,)), "b": take(f"{name}.bias", (C,))}

    params = {"wte": take("wte.weight", (V, C)), "wpe": take("wpe.weight", (T_max, C)), "blocks": {}}
    for i in range(config.n_layer):
        h = f"h.{i}."
        qkv_w = take(h + "attn.c_attn.weight", (C, 3 * C))                    # (C, 3C): q | k | v
        qkv_b = take(h + "attn.c_attn.bias", (3 * C,))
        attn = {name: {"w": qkv_w[:, j * C:(j + 1) * C].copy(), "b": qkv_b[j * C:(j + 1) * C].copy()}
                for j, name in enumerate("qkv")}
        attn["o"] = {"w": take(h + "attn.c_proj.weight", (C, C)), "b": take(h + "attn.c_proj.bias", (C,))}
        ffn = {"fc": {"w": take(h + "mlp.c_fc.weight", (C, H)), "b": take(h + "mlp.c_fc.bias", (H,))},
               "proj": {"w": take(h + "mlp.c_proj.weight", (H, C)), "b": take(h + "mlp.c_proj.bias", (C,))}}
        params["blocks"][str(i)] = {"ln1": layer_norm(h + "ln_1"), "attn": attn,
                                    "ln2": layer_norm(h + "ln_2"), "ffn": ffn}
    params["ln_f"] = layer_norm("ln_f")
    if config.tie_weights:
        tensors.drop("lm_head.weight")
    else:
        params["head"] = {"w": tensors.take("lm_head.weight", (V, C)).T.copy()}   # (V, C) -> (C, V)
    return params


# -- Llama ------------------------------------------------------------------------------------------

def llama_config(hf):
    """LlamaConfig from a Llama config.json (dict): rope settings from ``rope_parameters``
    (transformers 5) or ``rope_theta`` and ``rope_scaling`` (transformers 4)."""
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"Llama config.json: hidden_act {hf['hidden_act']!r} is not supported (only 'silu')")
    rope = dict(hf.get("rope_parameters") or {})
    theta = rope.pop("rope_theta", hf.get("rope_theta", 10000.0))
    if not rope and hf.get("rope_scaling"):
        rope = dict(hf["rope_scaling"])
    if "type" in rope:                       # older files spell rope_type "type"
        rope.setdefault("rope_type", rope.pop("type"))
    rope_type = rope.get("rope_type", "default")
    keys = {"default": (), "linear": ("factor",),
            "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}
    if rope_type not in keys:
        raise CheckpointError(f"Llama config.json: rope_type {rope_type!r} is not supported "
                              f"(one of {sorted(keys)})")
    scaling = None if rope_type == "default" else {"rope_type": rope_type, **{k: rope.get(k) for k in keys[rope_type]}}
    n_head = hf["num_attention_heads"]
    return LlamaConfig(
        vocab_size=hf["vocab_size"], block_size=hf.get("max_position_embeddings", 2048),
        n_layer=hf["num_hidden_layers"], n_head=n_head,
        n_kv_head=hf.get("num_key_value_heads") or n_head, n_embd=hf["hidden_size"],
        head_dim=hf.get("head_dim") or hf["hidden_size"] // n_head, hidden=hf["intermediate_size"],
        rms_eps=float(hf.get("rms_norm_eps", 1e-6)), rope_theta=float(theta), rope_scaling=scaling,
        rope_layout="half", attn_bias=bool(hf.get("attention_bias", False)),
        mlp_bias=bool(hf.get("mlp_bias", False)), tie_weights=bool(hf.get("tie_word_embeddings", False)))


def _llama_params(tensors, config):
    V, C, H, hs = config.vocab_size, config.n_embd, config.hidden, config.hs
    nh, nkv = config.n_head, config.n_kv_head

    def linear(name, C_in, C_out, bias):
        layer = {"w": tensors.take(f"{name}.weight", (C_out, C_in)).T.copy()}   # (C_out, C_in) -> (C_in, C_out)
        if bias:
            layer["b"] = tensors.take(f"{name}.bias", (C_out,))
        return layer

    params = {"wte": tensors.take("model.embed_tokens.weight", (V, C)), "blocks": {}}
    for i in range(config.n_layer):
        p = f"model.layers.{i}."
        bias = config.attn_bias
        attn = {"q": linear(p + "self_attn.q_proj", C, nh * hs, bias),
                "k": linear(p + "self_attn.k_proj", C, nkv * hs, bias),
                "v": linear(p + "self_attn.v_proj", C, nkv * hs, bias),
                "o": linear(p + "self_attn.o_proj", nh * hs, C, bias)}
        mlp = {"gate": linear(p + "mlp.gate_proj", C, H, config.mlp_bias),
               "up": linear(p + "mlp.up_proj", C, H, config.mlp_bias),
               "down": linear(p + "mlp.down_proj", H, C, config.mlp_bias)}
        params["blocks"][str(i)] = {
            "attn_norm": {"w": tensors.take(p + "input_layernorm.weight", (C,))}, "attn": attn,
            "mlp_norm": {"w": tensors.take(p + "post_attention_layernorm.weight", (C,))}, "mlp": mlp}
    params["norm"] = {"w": tensors.take("model.norm.weight", (C,))}
    if config.tie_weights:
        tensors.drop("lm_head.weight")
    else:
        params["head"] = {"w": tensors.take("lm_head.weight", (V, C)).T.copy()}   # (V, C) -> (C, V)
    return params
