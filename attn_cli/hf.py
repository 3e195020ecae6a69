"""Read a Hugging Face checkpoint folder into numpy_attn's parameter dicts, without torch.

    kind, config, params = load_checkpoint("gpt2")       # a folder with config.json + *.safetensors

Supported: ``GPT2LMHeadModel`` (-> numpy_attn.gpt.GPTConfig, with GPT-2's GELU and eps),
``LlamaForCausalLM`` (-> numpy_attn.llama.LlamaConfig and its params), ``Qwen3ForCausalLM``
(-> numpy_attn.qwen3.Qwen3Config), ``Olmo2ForCausalLM`` (-> numpy_attn.olmo2.Olmo2Config) and
``Gemma2ForCausalLM`` (-> numpy_attn.gemma2.Gemma2Config), ``Gemma3ForCausalLM`` (-> numpy_attn.gemma3.Gemma3Config),
whose params are Llama's with the q and k norms (and for OLMo 2 the block's two norms after the
attention and the MLP rather than before), ``GptOssForCausalLM`` (->
numpy_attn.gpt_oss.GptOssConfig: Llama's attention with biases and sinks, a mixture of experts
for its MLP) and ``DeepseekV3ForCausalLM`` (->
numpy_attn.deepseek_v3.DeepseekV3Config: MLA's projections, each expert's three, the router and
its selection bias). The tensors are read from
one ``model.safetensors`` or the shards listed in ``model.safetensors.index.json``, each in its
stored dtype (BF16 as ml_dtypes' bfloat16, the 16 bits as stored), and converted to ``dtype``:
float32 (the default), float64, bfloat16 or float16. Each tensor is read straight into its own
array, and a tensor already of ``dtype`` is used as read: loading a float32 file as float32, or a
bfloat16 file as bfloat16, holds its data once (the process's own memory, not a map of the file),
and no float32 copy of a bfloat16 file is made. Any other conversion rounds once (bfloat16 to
float32 is exact: a bfloat16 is the top half of a float32), and a value beyond the range of
``dtype`` (above float16's 65504, say) is refused naming the tensor rather than loaded as inf.

Layouts. GPT-2's Conv1D weights are already (C_in, C_out), as ours; its ``c_attn`` holds q, k and
v side by side in (C, 3C), split here into three. Llama's nn.Linear weights are (C_out, C_in) and
are transposed. A tied head (``tie_word_embeddings``) is the token embedding; a file may omit it
or repeat it. Hugging Face's Llama rotates q and k in the "half" layout, so the config says so.

Every tensor the model needs must be present with the shape its config implies, and every tensor
present must be used: anything else is a ValueError naming the tensor.

Hostile files. A folder may come from anywhere, so nothing in it is trusted before it is checked,
and every check comes before the allocation it guards: each file named is a regular file of the
folder (a FIFO would block the read forever); a JSON file is at most JSON_LIMIT bytes and holds an
object without repeated keys; config.json's keys have the type and bounds of CONFIG_KEYS, and the
model they describe needs no more parameters than the safetensors files hold values; a
safetensors header's length is compared with the file's size before it is read, and each tensor's
dtype, shape and byte range with the format and the file before any data is. The safetensors
files are parsed here rather than by the ``safetensors`` package, so that every file, whatever its
dtypes, passes the same checks, and every refusal is a CheckpointError naming the file, the
tensor or key, and the value found.
"""

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import NamedTuple

import ml_dtypes
import numpy as np

from numpy_attn._model import LAYER_TYPES
from numpy_attn.deepseek_v3 import DeepseekV3Config
from numpy_attn.gemma2 import Gemma2Config
from numpy_attn.gemma3 import Gemma3Config
from numpy_attn.gpt import GPTConfig
from numpy_attn.gpt_oss import GptOssConfig
from numpy_attn.llama import LlamaConfig
from numpy_attn.mla import mla_param_shapes
from numpy_attn.olmo2 import Olmo2Config
from numpy_attn.qwen3 import Qwen3Config

ARCHITECTURES = ("GPT2LMHeadModel", "LlamaForCausalLM", "Qwen3ForCausalLM", "Olmo2ForCausalLM", "Gemma2ForCausalLM",
                 "Gemma3ForCausalLM")
ARCHITECTURES += ("DeepseekV3ForCausalLM",)
GELUS = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}
# Buffers that older GPT-2 files store beside the weights: the causal mask, not parameters.
GPT2_BUFFERS = (".attn.bias", ".attn.masked_bias")

# The largest JSON read (a safetensors header, config.json, the shard index): the bound the
# safetensors format puts on its own header; real ones are kilobytes.
JSON_LIMIT = 100_000_000
# safetensors dtype names -> the NumPy dtype of their bytes (the format is little-endian); BF16 is
# read as its 16 bits (little-endian) and viewed as ml_dtypes' bfloat16. Others (F8_E4M3, quantised
# blocks) are refused by name.
DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4",
          "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
# The dtypes the parameters may be loaded in (load_checkpoint's dtype), by name.
LOAD_DTYPES = ("float32", "float64", "bfloat16", "float16")
# The values _finite checks at a time, widened to float32, in a bfloat16 tensor: 32 KiB of float32,
# large enough that the loop costs little (5 ms per 10^6 values), small beside any real tensor.
FINITE_CHUNK = 2**13
MAX_DIMS = 32                  # NumPy's guaranteed limit on dimensions; a model's tensors have 1 to 4

# The config.json keys each architecture reads: key -> (what it must be, lowest value, required).
CONFIG_KEYS = {
    "GPT2LMHeadModel": {
        "vocab_size": ("int", 1, True), "n_positions": ("int", 1, True), "n_layer": ("int", 0, True),
        "n_head": ("int", 1, True), "n_embd": ("int", 1, True), "n_inner": ("int or null", 1, False),
        "layer_norm_epsilon": ("number", 0, False), "activation_function": ("str", None, False),
        "tie_word_embeddings": ("bool", None, False), "scale_attn_weights": ("bool", None, False),
        "scale_attn_by_inverse_layer_idx": ("bool", None, False),
        "reorder_and_upcast_attn": ("bool", None, False), "add_cross_attention": ("bool", None, False)},
    "LlamaForCausalLM": {
        "vocab_size": ("int", 1, True), "hidden_size": ("int", 1, True),
        "intermediate_size": ("int", 1, True), "num_hidden_layers": ("int", 0, True),
        "num_attention_heads": ("int", 1, True), "num_key_value_heads": ("int or null", 1, False),
        "head_dim": ("int or null", 1, False), "max_position_embeddings": ("int", 1, False),
        "rms_norm_eps": ("number", 0, False), "rope_theta": ("number", 0, False),
        "rope_parameters": ("object or null", None, False), "rope_scaling": ("object or null", None, False),
        "attention_bias": ("bool", None, False), "mlp_bias": ("bool", None, False),
        "tie_word_embeddings": ("bool", None, False), "hidden_act": ("str", None, False)},
}
# Qwen3 and OLMo 2 read Llama's keys but mlp_bias (their MLPs have none); Qwen3's sliding-window
# keys are read to be checked (qwen3_config refuses the window, which is not implemented).
_LLAMA_FAMILY_KEYS = {key: rule for key, rule in CONFIG_KEYS["LlamaForCausalLM"].items() if key != "mlp_bias"}
CONFIG_KEYS["Qwen3ForCausalLM"] = {**_LLAMA_FAMILY_KEYS, "use_sliding_window": ("bool", None, False),
                                   "sliding_window": ("int or null", 1, False),
                                   "max_window_layers": ("int", 0, False)}
CONFIG_KEYS["Olmo2ForCausalLM"] = dict(_LLAMA_FAMILY_KEYS)
# Gemma 2 names its activation hidden_activation; the rest are its score scale, caps and window.
CONFIG_KEYS["Gemma2ForCausalLM"] = {
    **{key: rule for key, rule in _LLAMA_FAMILY_KEYS.items() if key != "hidden_act"},
    "hidden_activation": ("str", None, False), "query_pre_attn_scalar": ("number", 0, False),
    "attn_logit_softcapping": ("number or null", 0, False), "final_logit_softcapping": ("number or null", 0, False),
    "sliding_window": ("int", 1, False), "use_bidirectional_attention": ("bool or null", None, False)}
# Gemma 3 text: Gemma 2's keys, and the local layers' rotary base in the older spelling.
CONFIG_KEYS["Gemma3ForCausalLM"] = {**CONFIG_KEYS["Gemma2ForCausalLM"], "rope_local_base_freq": ("number", 0, False)}
# DeepSeek-V3: MLA's ranks and widths, the experts and their routing (absent keys take transformers'
# defaults; num_key_value_heads, which MLA does not use, must be num_attention_heads, as transformers needs).
CONFIG_KEYS["DeepseekV3ForCausalLM"] = {
    **{key: rule for key, rule in _LLAMA_FAMILY_KEYS.items() if key != "head_dim"},
    "moe_intermediate_size": ("int", 1, True), "n_routed_experts": ("int", 1, True),
    "n_shared_experts": ("int", 1, False), "num_experts_per_tok": ("int", 1, False), "n_group": ("int", 1, False),
    "topk_group": ("int", 1, False), "norm_topk_prob": ("bool", None, False),
    "routed_scaling_factor": ("number", 0, False), "first_k_dense_replace": ("int", 0, False),
    "q_lora_rank": ("int or null", 1, False), "kv_lora_rank": ("int", 1, True),
    "qk_nope_head_dim": ("int", 1, True), "qk_rope_head_dim": ("int", 1, True), "v_head_dim": ("int", 1, True),
    "rope_interleave": ("bool", None, False)}
# gpt-oss: Llama's keys but its activation (the experts' clamped GLU is fixed, whatever hidden_act says),
# the experts, the GLU's alpha and limit, the window, and quantization_config (refused: MXFP4 is not
# read); layer_types is checked by gpt_oss_config and GptOssConfig.
ARCHITECTURES += ("GptOssForCausalLM",)
CONFIG_KEYS["GptOssForCausalLM"] = {
    **{key: rule for key, rule in _LLAMA_FAMILY_KEYS.items() if key != "hidden_act"},
    "num_local_experts": ("int", 1, True), "num_experts_per_tok": ("int", 1, True),
    "swiglu_alpha": ("number", None, False), "swiglu_limit": ("number", 0, False),
    "sliding_window": ("int or null", 1, False), "quantization_config": ("object or null", None, False)}
# Sizes that allocate without being parameters, so that the parameter count cannot bound them:
# the rotary table has head_dim / 2 entries (released models use head sizes of 64 to 512).
CAPS = {"head_dim": 65536, "qk_rope_head_dim": 65536}
# Numbers inside Llama's rope_parameters / rope_scaling objects.
ROPE_KEYS = ("rope_theta", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
KINDS = {"int": lambda v: isinstance(v, int) and not isinstance(v, bool),
         "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v),
         "bool": lambda v: isinstance(v, bool), "str": lambda v: isinstance(v, str),
         "object": lambda v: isinstance(v, dict)}


class CheckpointError(ValueError):
    """A checkpoint folder this loader cannot read: the message names the file or tensor."""


def load_checkpoint(folder, dtype=np.float32):
    """(kind, config, params) from a Hugging Face folder: kind "gpt2", "llama", "qwen3", "olmo2" or
    "gemma2" or "gemma3", or "gpt_oss"; the params in ``dtype`` (float32, float64, bfloat16 or
    float16: a NumPy dtype, or its name)."""
    dtype = load_dtype(dtype)
    folder = Path(folder)
    hf_config = read_config(folder)
    architecture = _architecture(hf_config, folder)
    check_config(hf_config, architecture, folder)
    tensors = _Tensors(read_tensors(folder), folder, dtype)
    kind, build, read_params = MODELS[architecture]
    config = build(hf_config)
    params = read_params(tensors, config)
    tensors.finish()
    return kind, config, params


def load_dtype(dtype):
    """``dtype`` (a NumPy dtype, type or name) as a NumPy dtype, one of LOAD_DTYPES, or a TypeError
    naming it."""
    try:                                                 # np.dtype(None) would be float64
        found = None if dtype is None else np.dtype(dtype)
    except TypeError:
        found = None
    if found is None or found.name not in LOAD_DTYPES:
        raise TypeError(f"dtype must be one of {', '.join(LOAD_DTYPES)}, got {_short(dtype)}")
    return found


def read_config(folder):
    """config.json of the folder as a dict (a JSON object), or a CheckpointError."""
    path = Path(folder) / "config.json"
    if not _present(path):
        raise CheckpointError(f"{folder} has no config.json: is it a Hugging Face model folder?")
    return _read_json(path)


def _architecture(hf_config, folder):
    names = hf_config.get("architectures") or []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise CheckpointError(f"{folder}/config.json: architectures must be a list of names such as "
                              f"[\"GPT2LMHeadModel\"], got {_short(names)}")
    found = [n for n in names if n in ARCHITECTURES]
    if not found:
        raise CheckpointError(f"{folder}/config.json: architecture {names or hf_config.get('model_type')!r} "
                              f"is not supported; this loader reads {', '.join(ARCHITECTURES)}")
    return found[0]


def check_config(hf_config, architecture, folder):
    """Refuse (CheckpointError naming config.json and the key) a config.json whose keys lack the
    type or bounds of CONFIG_KEYS, or that describes more parameters than the folder's
    safetensors files hold values; run before anything is allocated from the config's sizes."""
    path = Path(folder) / "config.json"
    for key, (kind, low, required) in CONFIG_KEYS[architecture].items():
        if key not in hf_config:
            if required:
                raise CheckpointError(f"{path}: the key {key!r} is missing ({kind}, needed by {architecture})")
            continue
        _check_value(path, key, hf_config[key], kind, low)
        if key in CAPS and hf_config[key] is not None and hf_config[key] > CAPS[key]:
            raise CheckpointError(f"{path}: {key} = {hf_config[key]:,} is more than the {CAPS[key]:,} read here")
    for key in ("rope_parameters", "rope_scaling"):
        for name, value in (hf_config.get(key) or {}).items():
            if name in ROPE_KEYS:
                _check_value(path, f"{key}.{name}", value, "number", 0)
    count = _deepseek_v3_parameter_count if architecture == "DeepseekV3ForCausalLM" else _parameter_count
    need, held = count(hf_config, architecture), _values_held(folder)
    if need > held:
        raise CheckpointError(f"{path} describes at least {need:,} parameters ({bytes_text(4 * need)} in float32), "
                              f"but the safetensors files hold {held:,} values: the config does not "
                              "describe these weights")
    build = MODELS[architecture][1]
    try:                        # what only the config as a whole can refuse (n_embd % n_head, rope)
        build(hf_config)
    except (TypeError, ValueError) as err:      # named by path, once ("GPT-2 config.json: ..." or not)
        message = re.sub(r"^[\w-]+ config\.json: ", "", str(err))
        raise CheckpointError(f"{path}: {message}") from None


def _check_value(path, key, value, kind, low):
    """CheckpointError unless ``value`` is of ``kind`` ("int", "number or null", ...) and >= low."""
    if value is None and kind.endswith(" or null"):
        return
    base = kind.removesuffix(" or null")
    if not KINDS[base](value) or (low is not None and value < low):
        bound = "" if low is None else f" >= {low}"
        article = "an" if base in ("int", "object") else "a"
        raise CheckpointError(f"{path}: {key} must be {article} {kind}{bound}, "
                              f"got {_short(value)}")


def _parameter_count(hf, architecture):
    """A lower bound on the parameters the config's sizes imply: the weight matrices and norms
    every such model holds (biases, an untied head and, for GPT-2 without n_inner, the MLP left
    out), counted in Python integers so that no size overflows."""
    if architecture == "GPT2LMHeadModel":
        C, L, H = hf["n_embd"], hf["n_layer"], hf.get("n_inner") or 0
        per_layer = 4 * C * C + 2 * C * H + 4 * C          # c_attn, c_proj, the MLP, two layer norms
        return hf["vocab_size"] * C + hf["n_positions"] * C + L * per_layer + 2 * C
    C, L, H = hf["hidden_size"], hf["num_hidden_layers"], hf["intermediate_size"]
    nh = hf["num_attention_heads"]
    nkv, hs = hf.get("num_key_value_heads") or nh, hf.get("head_dim") or C // nh
    per_layer = 2 * C * nh * hs + 2 * C * nkv * hs + 3 * C * H + 2 * C   # q, o, k, v, the MLP, two norms
    return hf["vocab_size"] * C + L * per_layer + C


def _values_held(folder):
    """The number of values in the folder's safetensors files, from their headers alone."""
    return sum(math.prod(entry.shape) for path in _safetensors_files(folder) for entry in _header(path).values())


def _present(path):
    """Whether ``path`` exists, refusing one that is not a regular file (a FIFO would block the
    read forever, a device never end it): CheckpointError naming it."""
    if path.exists() and not path.is_file():
        raise CheckpointError(f"{path} is not a regular file (a FIFO, device or folder), so it is not read")
    return path.exists()


def _read_json(path):
    """The JSON object in the regular file ``path``, checked to be at most JSON_LIMIT bytes
    before it is read, with no key given twice; else a CheckpointError naming the file."""
    size = path.stat().st_size
    if size > JSON_LIMIT:
        raise CheckpointError(f"{path} is {size:,} bytes, more than the {JSON_LIMIT:,} a JSON file of "
                              "a checkpoint may have")
    return _parse_json(path.read_bytes(), path)


class _RepeatedKey(Exception):
    pass


def _no_repeats(pairs):
    """json's object_pairs_hook: a dict, refusing a key given twice (json keeps the last)."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise _RepeatedKey(key)
        out[key] = value
    return out


def _parse_json(data, path, what=""):
    try:
        value = json.loads(data, object_pairs_hook=_no_repeats)
    except _RepeatedKey as err:
        raise CheckpointError(f"{path}{what}: the key {err.args[0]!r} is given twice") from None
    except (ValueError, RecursionError) as err:     # JSONDecodeError, UnicodeDecodeError, huge ints
        raise CheckpointError(f"{path}{what} is not valid JSON ({err})") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}{what} must hold a JSON object {{...}}, got {type(value).__name__} "
                              f"{_short(value)}")
    return value


def _short(value, n=80):
    """repr(value), cut to n characters: a hostile value may be long."""
    text = repr(value)
    return text if len(text) <= n else text[:n] + "..."


def bytes_text(n):
    """1536 -> '1.5 KiB'."""
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


# -- tensors ----------------------------------------------------------------------------------------

def read_tensors(folder):
    """Every tensor of the folder's safetensors file(s), by name, as NumPy arrays."""
    folder = Path(folder)
    tensors, where = {}, {}
    for path in _safetensors_files(folder):
        for name, tensor in _read_safetensors(path).items():
            if name in tensors:
                raise CheckpointError(f"{folder}: tensor {name!r} is in both {where[name]} and {path.name}")
            tensors[name], where[name] = tensor, path.name
    return tensors


def checkpoint_bytes(folder):
    """The bytes of the folder's safetensors weights on disk (every shard), or a CheckpointError."""
    return sum(path.stat().st_size for path in _safetensors_files(folder))


def _safetensors_files(folder):
    """model.safetensors, or the shards model.safetensors.index.json names: each checked to be a
    plain file name of the folder (no other folder, no "..") and a regular file (not a FIFO,
    device or folder) before anything opens it. Links are followed: a cache folder links its
    files to the blobs beside it."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if _present(index):
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map or not all(
                isinstance(name, str) for name in weight_map.values()):
            raise CheckpointError(f"{index}: weight_map must be a non-empty object {{tensor name: file "
                                  f"name}}, got {_short(weight_map)}")
        names = sorted(set(weight_map.values()))
        for name in names:
            if name in ("", ".", "..") or Path(name).name != name:
                raise CheckpointError(f"{index}: weight_map names {name!r}, not a file name in {folder}")
            if not (folder / name).is_file():
                raise CheckpointError(f"{index}: weight_map names {name!r}, which is not a regular file "
                                      f"in {folder}")
    elif _present(folder / "model.safetensors"):
        names = ["model.safetensors"]
    else:
        raise CheckpointError(f"{folder} has no model.safetensors (nor model.safetensors.index.json); "
                              "download the safetensors weights")
    return [folder / name for name in names]


class _Entry(NamedTuple):
    """One tensor of a safetensors header: its dtype name, shape, and bytes [begin, end) of the file."""
    dtype: str
    shape: tuple
    begin: int
    end: int


def _read_safetensors(path):
    """Every tensor of one safetensors file, by name, in its stored dtype (BF16 as ml_dtypes'
    bfloat16: its bits as stored, neither widened nor copied).

    Each tensor's bytes are read straight into the array that holds them (an allocation the
    header, checked against the file's size by _header, justifies), so that the process holds one
    copy of the weights, its own: a file rewritten or cut short while the model runs cannot change
    or take away weights that were checked (a memory map of the file could do both)."""
    tensors = {}
    with open(path, "rb") as f:
        for name, entry in _header(path).items():
            f.seek(entry.begin)
            tensor = np.empty(entry.shape, DTYPES[entry.dtype])
            if f.readinto(tensor.reshape(-1).view(np.uint8)) != entry.end - entry.begin:
                raise CheckpointError(f"{path}: the file was cut short while tensor {name!r} was read")
            if entry.dtype == "BF16":      # the bits as they are (in native order: a no-op on little-endian)
                tensor = tensor.astype("=u2", copy=False).view(BFLOAT16)
            if entry.dtype.startswith(("F", "BF")) and not _finite(tensor):
                raise CheckpointError(f"{path}: tensor {name!r} holds NaN or infinite values: the file is damaged")
            tensors[name] = tensor
    return tensors


def _finite(tensor):
    """Whether every value is finite, without an array of booleans the tensor's size: a NaN
    anywhere makes the minimum and the maximum NaN, and an infinity is one of them. A bfloat16
    tensor is checked FINITE_CHUNK values at a time, each widened exactly to float32: ml_dtypes'
    own minimum and maximum loops run about 20 times slower than NumPy's float32 ones."""
    if tensor.dtype == BFLOAT16:
        flat = tensor.reshape(-1)
        return all(_finite(flat[i:i + FINITE_CHUNK].astype(np.float32)) for i in range(0, flat.size, FINITE_CHUNK))
    return bool(np.isfinite(tensor.min(initial=0)) and np.isfinite(tensor.max(initial=0)))


def _header(path):
    """{name: _Entry} of a safetensors file, every field checked first.

    The format: 8 bytes, the header's length n (little-endian), n bytes of JSON {name: {"dtype",
    "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the data, in which the
    tensors' byte ranges follow one another from 0 to its end without gap or overlap.
    """
    size = path.stat().st_size
    if size < 8:
        raise CheckpointError(f"{path} is {size} bytes, too short for a safetensors file (its first 8 bytes "
                              "give the header's length)")
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n > size - 8:                             # compared before anything is read: n may be 2^40
            raise CheckpointError(f"{path}: a header of {n:,} bytes does not fit in the file's "
                                  f"{size - 8:,} bytes after the 8-byte length; the file is cut "
                                  "short or not a safetensors file")
        if n > JSON_LIMIT:
            raise CheckpointError(f"{path}: a header of {n:,} bytes is more than the format's {JSON_LIMIT:,}")
        header = _parse_json(f.read(n), path, " (its header)")
    header.pop("__metadata__", None)
    start, data = 8 + n, size - 8 - n
    entries = {name: _entry(path, name, info, data) for name, info in header.items()}
    end = 0
    for name, entry in sorted(entries.items(), key=lambda item: (item[1].begin, item[1].end)):
        begin, stop = entry.begin, entry.end
        if begin != end:
            raise CheckpointError(f"{path}: tensor {name!r} has data_offsets [{begin}, {stop}], but the "
                                  f"tensor before it ends at {end}: the tensors' bytes must follow one "
                                  f"another without {'overlap' if begin < end else 'gap'}")
        end = stop
    if end != data:
        raise CheckpointError(f"{path}: the tensors' bytes end at {end:,}, but the file holds {data:,} "
                              "bytes of data")
    return {name: e._replace(begin=start + e.begin, end=start + e.end) for name, e in entries.items()}


def _entry(path, name, info, data):
    """One header entry as an _Entry of offsets within the data, or a CheckpointError naming the
    file, the tensor and the field: the dtype one of DTYPES, the shape at most MAX_DIMS sizes
    >= 0, the offsets within the data, and their difference the bytes the shape needs."""
    where = f"{path}: tensor {name!r}"
    if not isinstance(info, dict) or sorted(info) != ["data_offsets", "dtype", "shape"]:
        raise CheckpointError(f"{where} must have exactly dtype, shape and data_offsets, got {_short(info)}")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise CheckpointError(f"{where}: dtype {_short(dtype)} is not read here (one of {', '.join(DTYPES)})")
    if not (isinstance(shape, list) and len(shape) <= MAX_DIMS
            and all(KINDS["int"](d) and d >= 0 for d in shape)):
        raise CheckpointError(f"{where}: shape must be a list of at most {MAX_DIMS} sizes >= 0, got {_short(shape)}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(KINDS["int"](o) for o in offsets)
            and 0 <= offsets[0] <= offsets[1] <= data):
        raise CheckpointError(f"{where}: data_offsets must be [begin, end] with 0 <= begin <= end <= {data:,} "
                              f"(the file's data bytes), got {_short(offsets)}")
    need = math.prod(shape) * np.dtype(DTYPES[dtype]).itemsize
    if need != offsets[1] - offsets[0]:
        raise CheckpointError(f"{where}: shape {_short(tuple(shape))} of {dtype} takes {need:,} bytes, but "
                              f"data_offsets {offsets} hold {offsets[1] - offsets[0]:,}")
    return _Entry(dtype, tuple(shape), offsets[0], offsets[1])


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
        if tensor.dtype == self.dtype:
            return tensor                                # the array read from the file, no copy
        with np.errstate(over="ignore"):                 # an overflow is refused below, by name
            converted = tensor.astype(self.dtype)        # rounded once (float32 -> bfloat16 too)
        # The read tensor is finite (_read_safetensors): an inf now is a value beyond the range of
        # dtype (float16's 65504, float32's 3.4e38 for float64 or integers), not a damaged file.
        if not _finite(converted):
            raise CheckpointError(f"{self.folder}: tensor {name!r} holds values beyond the range of "
                                  f"{self.dtype}; load it as {tensor.dtype}")
        return converted

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
    fc = tensors.left.get(f"{prefix}h.0.mlp.c_fc.weight")          # no default array: C may be huge
    H = 4 * C if fc is None else fc.shape[-1]

    def take(name, shape):
        return tensors.take(prefix + name, shape)

    def layer_norm(name):
        return {"w": take(f"{name}.weight", (C,)), "b": take(f"{name}.bias", (C,))}

    params = {"wte": take("wte.weight", (V, C)), "wpe": take("wpe.weight", (T_max, C)), "blocks": {}}
    for i in range(config.n_layer):
        h = f"h.{i}."
        qkv_w = take(h + "attn.c_attn.weight", (C, 3 * C))                    # (C, 3C): q | k | v
        qkv_b = take(h + "attn.c_attn.bias", (3 * C,))
        # Contiguous copies, one layer at a time (c_attn is then dropped): a strided view would
        # save C x 3C floats while loading but make every pass over the weight slower (2.5x for
        # multi_head's finiteness check).
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

def llama_config(hf, config_class=LlamaConfig):
    """LlamaConfig (or ``config_class``, a family built on it) from a Llama config.json (dict):
    rope settings from ``rope_parameters`` (transformers 5) or ``rope_theta`` and
    ``rope_scaling`` (transformers 4)."""
    family = config_class.__name__.removesuffix("Config")         # "Llama", "Qwen3", "Olmo2"
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{family} config.json: hidden_act {hf['hidden_act']!r} is not supported (only 'silu')")
    theta, scaling = _rope_settings(hf, family, LLAMA_ROPE_KEYS)
    n_head = hf["num_attention_heads"]
    return config_class(
        vocab_size=hf["vocab_size"], block_size=hf.get("max_position_embeddings", 2048),
        n_layer=hf["num_hidden_layers"], n_head=n_head,
        n_kv_head=hf.get("num_key_value_heads") or n_head, n_embd=hf["hidden_size"],
        head_dim=hf.get("head_dim") or hf["hidden_size"] // n_head, hidden=hf["intermediate_size"],
        rms_eps=float(hf.get("rms_norm_eps", 1e-6)), rope_theta=float(theta), rope_scaling=scaling,
        rope_layout="half", attn_bias=bool(hf.get("attention_bias", False)),
        mlp_bias=bool(hf.get("mlp_bias", False)) and family == "Llama",   # Qwen3's, OLMo 2's MLPs have none
        tie_weights=bool(hf.get("tie_word_embeddings", False)))


# rope_type -> the keys of rope_parameters llama_config reads.
LLAMA_ROPE_KEYS = {"default": (), "linear": ("factor",),
                   "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}


def _rope_settings(hf, family, keys, optional=()):
    """(theta, scaling) from ``rope_parameters`` (transformers 5) or ``rope_theta`` and
    ``rope_scaling`` (transformers 4): scaling None for the default kind, else the rope_type and
    its ``keys[rope_type]`` (absent ones None, which rope.py refuses by name), with the
    ``optional`` keys only where the file gives them; a rope_type outside ``keys`` is refused."""
    rope = dict(hf.get("rope_parameters") or {})
    theta = rope.pop("rope_theta", hf.get("rope_theta", 10000.0))
    if not rope and hf.get("rope_scaling"):
        rope = dict(hf["rope_scaling"])
    if "type" in rope:                       # older files spell rope_type "type"
        rope.setdefault("rope_type", rope.pop("type"))
    rope_type = rope.get("rope_type", "default")
    if rope_type not in keys:
        raise CheckpointError(f"{family} config.json: rope_type {rope_type!r} is not supported "
                              f"(one of {sorted(keys)})")
    if rope_type == "default":
        return theta, None
    given = {k: rope[k] for k in optional if k in rope}
    return theta, {"rope_type": rope_type, **{k: rope.get(k) for k in keys[rope_type]}, **given}


def _llama_params(tensors, config, norms=("input_layernorm", "post_attention_layernorm"), mlp=None):
    """The params of a Llama (or Qwen3, OLMo 2, Gemma 3: with q_norm and k_norm) from its
    tensors; ``norms`` names the block's two norms, our attn_norm and mlp_norm; ``mlp(tensors,
    prefix, config)``, if given, reads the block's "mlp" in place of Llama's SwiGLU."""
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
        if isinstance(config, Qwen3Config | Olmo2Config | Gemma3Config):   # QK-norm
            # weights (hs,) per head (Qwen3, Gemma 3), or the projections' widths (OLMo 2)
            q_width, k_width = (nh * hs, nkv * hs) if isinstance(config, Olmo2Config) else (hs, hs)
            attn["q_norm"] = {"w": tensors.take(p + "self_attn.q_norm.weight", (q_width,))}
            attn["k_norm"] = {"w": tensors.take(p + "self_attn.k_norm.weight", (k_width,))}
        mlp_params = mlp(tensors, p + "mlp.", config) if mlp else {
            "gate": linear(p + "mlp.gate_proj", C, H, config.mlp_bias),
            "up": linear(p + "mlp.up_proj", C, H, config.mlp_bias),
            "down": linear(p + "mlp.down_proj", H, C, config.mlp_bias)}
        params["blocks"][str(i)] = {
            "attn_norm": {"w": tensors.take(f"{p}{norms[0]}.weight", (C,))}, "attn": attn,
            "mlp_norm": {"w": tensors.take(f"{p}{norms[1]}.weight", (C,))}, "mlp": mlp_params}
    return _with_norm_and_head(params, tensors, config)


def _with_norm_and_head(params, tensors, config):
    """``params`` with the final norm and, without tied weights, the head (a tied head's copy dropped)."""
    V, C = config.vocab_size, config.n_embd
    params["norm"] = {"w": tensors.take("model.norm.weight", (C,))}
    if config.tie_weights:
        tensors.drop("lm_head.weight")
    else:
        params["head"] = {"w": tensors.take("lm_head.weight", (V, C)).T.copy()}   # (V, C) -> (C, V)
    return params


# -- Qwen3 and OLMo 2: Llama's layout with q and k norms ---------------------------------------------

def qwen3_config(hf):
    """Qwen3Config from a Qwen3 config.json (dict): llama_config's reading, and the sliding window
    (``use_sliding_window``, off in the released models) refused, as it is not implemented here."""
    if hf.get("use_sliding_window", False):
        raise CheckpointError("Qwen3 config.json: use_sliding_window = True is not supported (sliding-window "
                              "layers are not implemented for Qwen3; only full attention)")
    layer_types = hf.get("layer_types")
    if layer_types is not None and (not isinstance(layer_types, list)
                                    or any(t != "full_attention" for t in layer_types)):
        raise CheckpointError(f"Qwen3 config.json: layer_types must list only 'full_attention' (sliding-window "
                              f"layers are not implemented for Qwen3), got {_short(layer_types)}")
    return llama_config(hf, Qwen3Config)


def olmo2_config(hf):
    """Olmo2Config from an OLMo 2 config.json (dict), read as llama_config reads Llama's."""
    return llama_config(hf, Olmo2Config)


def _olmo2_params(tensors, config):
    """Llama's params, the block's norms read from their places after attention and the MLP."""
    return _llama_params(tensors, config, norms=("post_attention_layernorm", "post_feedforward_layernorm"))


# -- Gemma 2: four norms per block, capped scores and logits, sliding layers -------------------------

def gemma2_config(hf, config_class=Gemma2Config, **extra):
    """Gemma2Config (or Gemma3Config, with ``extra`` fields) from a Gemma 2 config.json (dict):
    llama_config's reading (tied weights by default), and the activation, score scale, caps,
    window and layer types checked and read."""
    family = config_class.__name__.removesuffix("Config")         # "Gemma2", "Gemma3"
    if hf.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise CheckpointError(f"{family} config.json: hidden_activation {hf['hidden_activation']!r} is not "
                              "supported (only 'gelu_pytorch_tanh')")
    if hf.get("use_bidirectional_attention"):
        raise CheckpointError(f"{family} config.json: use_bidirectional_attention = True is not supported "
                              "(causal only)")
    n_layer = hf["num_hidden_layers"]
    layer_types = hf.get("layer_types")
    if layer_types is not None and (not isinstance(layer_types, list) or len(layer_types) != n_layer
                                    or any(t not in LAYER_TYPES for t in layer_types)):
        raise CheckpointError(f"{family} config.json: layer_types must list num_hidden_layers = {n_layer} entries, "
                              f"each 'sliding_attention' or 'full_attention', got {_short(layer_types)}")
    base = llama_config({**hf, "hidden_act": "silu", "tie_word_embeddings": hf.get("tie_word_embeddings", True)},
                        config_class)
    defaults = {"attn_logit_softcapping": base.attn_logit_softcap, "final_logit_softcapping": base.final_logit_softcap}
    caps = {key: None if hf.get(key, default) is None else float(hf.get(key, default))
            for key, default in defaults.items()}
    return dataclasses.replace(
        base, query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar", 256)),
        attn_logit_softcap=caps["attn_logit_softcapping"], final_logit_softcap=caps["final_logit_softcapping"],
        sliding_window=hf.get("sliding_window", 4096),
        layer_types=None if layer_types is None else tuple(layer_types), **extra)


def gemma3_config(hf):
    """Gemma3Config from a Gemma 3 text config.json (dict): gemma2_config's reading, with the rope
    settings per layer type (transformers 5: rope_parameters {"full_attention": ..., "sliding_attention":
    ...}; before: rope_theta and rope_local_base_freq); the local layers' rope must be the default kind."""
    rope = hf.get("rope_parameters") or {}
    if "full_attention" in rope or "sliding_attention" in rope:
        local = rope.get("sliding_attention") or {}
        if not isinstance(local, dict) or local.get("rope_type", "default") != "default":
            raise CheckpointError(f"Gemma3 config.json: rope_parameters.sliding_attention must be of the default "
                                  f"rope_type, got {_short(local)}")
        local_theta = local.get("rope_theta", 10000.0)
        hf = {**hf, "rope_parameters": rope.get("full_attention")}
    else:
        local_theta = hf.get("rope_local_base_freq", 10000.0)
    if not KINDS["number"](local_theta) or local_theta <= 0:
        raise CheckpointError(f"Gemma3 config.json: the local layers' rope_theta must be a number > 0, "
                              f"got {_short(local_theta)}")
    return gemma2_config(hf, Gemma3Config, rope_local_theta=float(local_theta))


def _gemma2_params(tensors, config):
    """Llama's params with the norms before the sublayers as attn_norm and mlp_norm, and the two
    after them (post-attention, post-feedforward) as attn_post_norm and mlp_post_norm."""
    params = _llama_params(tensors, config, norms=("input_layernorm", "pre_feedforward_layernorm"))
    C = config.n_embd
    for i, block in params["blocks"].items():
        p = f"model.layers.{i}."
        block["attn_post_norm"] = {"w": tensors.take(p + "post_attention_layernorm.weight", (C,))}
        block["mlp_post_norm"] = {"w": tensors.take(p + "post_feedforward_layernorm.weight", (C,))}
    return params


# -- DeepSeek-V3: multi-head latent attention, dense then mixture-of-experts blocks -------------------

# rope_type -> the keys of rope_parameters deepseek_v3_config reads (YaRN's optional ones where given).
DEEPSEEK_ROPE_KEYS = {"default": (), "linear": ("factor",), "yarn": ("factor", "original_max_position_embeddings")}
YARN_OPTIONAL = ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate")
# MLA's projections: ours -> transformers' names under self_attn.
MLA_NAMES = {"q": "q_proj", "q_a": "q_a_proj", "q_a_norm": "q_a_layernorm", "q_b": "q_b_proj",
             "kv_a": "kv_a_proj_with_mqa", "kv_a_norm": "kv_a_layernorm", "kv_b": "kv_b_proj", "o": "o_proj"}


def deepseek_v3_config(hf):
    """DeepseekV3Config from a DeepSeek-V3 config.json (dict), with transformers' defaults for the
    keys it leaves out; what is not implemented is refused naming the key."""
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"DeepseekV3 config.json: hidden_act {hf['hidden_act']!r} is not supported (only 'silu')")
    n_head = hf["num_attention_heads"]
    if hf.get("num_key_value_heads") not in (None, n_head):
        raise CheckpointError(f"DeepseekV3 config.json: num_key_value_heads = {hf['num_key_value_heads']} must be "
                              f"num_attention_heads = {n_head} (MLA has one key and value per query head)")
    theta, scaling = _rope_settings(hf, "DeepseekV3", DEEPSEEK_ROPE_KEYS, YARN_OPTIONAL)
    return DeepseekV3Config(
        vocab_size=hf["vocab_size"], block_size=hf.get("max_position_embeddings", 4096),
        n_layer=hf["num_hidden_layers"], n_head=n_head, n_kv_head=n_head, n_embd=hf["hidden_size"],
        head_dim=hf["qk_rope_head_dim"], hidden=hf["intermediate_size"], rms_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta), rope_scaling=scaling, attn_bias=hf.get("attention_bias", False),
        tie_weights=hf.get("tie_word_embeddings", False), q_lora_rank=hf.get("q_lora_rank", 1536),
        kv_lora_rank=hf["kv_lora_rank"], qk_nope_head_dim=hf["qk_nope_head_dim"],
        qk_rope_head_dim=hf["qk_rope_head_dim"], v_head_dim=hf["v_head_dim"],
        rope_interleave=hf.get("rope_interleave", True), moe_hidden=hf["moe_intermediate_size"],
        n_routed_experts=hf["n_routed_experts"], n_shared_experts=hf.get("n_shared_experts", 1),
        num_experts_per_tok=hf.get("num_experts_per_tok", 8), n_group=hf.get("n_group", 8),
        topk_group=hf.get("topk_group", 4), norm_topk_prob=hf.get("norm_topk_prob", True),
        routed_scaling_factor=float(hf.get("routed_scaling_factor", 2.5)),
        first_k_dense_replace=hf.get("first_k_dense_replace", 3))


def _deepseek_v3_parameter_count(hf, architecture):
    """A lower bound on the parameters a DeepSeek-V3 config.json implies (its matrices and norms;
    transformers' defaults for absent keys), in Python integers."""
    C, L, V, nh = hf["hidden_size"], hf["num_hidden_layers"], hf["vocab_size"], hf["num_attention_heads"]
    rq, rkv = hf.get("q_lora_rank", 1536), hf["kv_lora_rank"]
    dn, dr, dv = hf["qk_nope_head_dim"], hf["qk_rope_head_dim"], hf["v_head_dim"]
    E, Hm, H = hf["n_routed_experts"], hf["moe_intermediate_size"], hf["intermediate_size"]
    query = C * nh * (dn + dr) if rq is None else C * rq + rq * nh * (dn + dr)
    attention = query + C * (rkv + dr) + rkv * nh * (dn + dv) + nh * dv * C
    dense = min(L, hf.get("first_k_dense_replace", 3))
    moe = 3 * C * Hm * (E + hf.get("n_shared_experts", 1)) + C * E          # the experts, the shared one, the router
    return 2 * V * C + L * (attention + 2 * C) + dense * 3 * C * H + (L - dense) * moe + C


def _deepseek_v3_params(tensors, config):
    """The params of a DeepSeek-V3 from its tensors: MLA's under self_attn, a dense SwiGLU or the
    experts (each expert's three projections, stacked (E, ...)), the router (mlp.gate) and its
    selection bias (e_score_correction_bias), and the shared expert."""
    V, C = config.vocab_size, config.n_embd
    E, Hm = config.n_routed_experts, config.moe_hidden
    shapes = {path: shape for path, shape in mla_param_shapes(config.mla).items()}

    def linear(name, C_in, C_out):
        return {"w": tensors.take(f"{name}.weight", (C_out, C_in)).T.copy()}   # (C_out, C_in) -> (C_in, C_out)

    def swiglu(name, H):
        return {"gate": linear(f"{name}.gate_proj", C, H), "up": linear(f"{name}.up_proj", C, H),
                "down": linear(f"{name}.down_proj", H, C)}

    params = {"wte": tensors.take("model.embed_tokens.weight", (V, C)), "blocks": {}}
    for i in range(config.n_layer):
        p = f"model.layers.{i}."
        attn = {}
        for path, shape in shapes.items():                 # "q_a.w" (C, rq), "kv_a_norm.w" (rkv,), "o.b" (C,) ...
            name, key = path.split(".")
            hf_name = f"{p}self_attn.{MLA_NAMES[name]}.{'bias' if key == 'b' else 'weight'}"
            attn.setdefault(name, {})[key] = tensors.take(hf_name, shape[::-1]).T.copy()
        if config.is_moe(i):
            experts = [swiglu(f"{p}mlp.experts.{e}", Hm) for e in range(E)]
            mlp = {"router": linear(p + "mlp.gate", C, E),
                   "selection_bias": tensors.take(p + "mlp.gate.e_score_correction_bias", (E,)),
                   "experts": {name: {"w": np.stack([x[name]["w"] for x in experts])} for name in experts[0]},
                   "shared": swiglu(p + "mlp.shared_experts", config.n_shared_experts * Hm)}
        else:
            mlp = swiglu(p + "mlp", config.hidden)
        params["blocks"][str(i)] = {
            "attn_norm": {"w": tensors.take(p + "input_layernorm.weight", (C,))}, "attn": attn,
            "mlp_norm": {"w": tensors.take(p + "post_attention_layernorm.weight", (C,))}, "mlp": mlp}
    return _with_norm_and_head(params, tensors, config)


# architecture -> (kind, its config from config.json, its params from the tensors)
MODELS = {"GPT2LMHeadModel": ("gpt2", gpt2_config, _gpt2_params),
          "LlamaForCausalLM": ("llama", llama_config, _llama_params),
          "Qwen3ForCausalLM": ("qwen3", qwen3_config, _llama_params),
          "Olmo2ForCausalLM": ("olmo2", olmo2_config, _olmo2_params),
          "Gemma2ForCausalLM": ("gemma2", gemma2_config, _gemma2_params),
          "Gemma3ForCausalLM": ("gemma3", gemma3_config, _gemma2_params)}
MODELS["DeepseekV3ForCausalLM"] = ("deepseek_v3", deepseek_v3_config, _deepseek_v3_params)


# -- gpt-oss: attention with biases and sinks, sliding layers, YaRN, a mixture of experts -----------

# The rope_parameters (or rope_scaling) keys of YaRN that numpy_attn/rope.py reads.
GPT_OSS_YARN_KEYS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "truncate",
                     "attention_factor", "mscale", "mscale_all_dim")


def gpt_oss_config(hf):
    """GptOssConfig from a gpt-oss config.json (dict): llama_config's reading (attention biases on by
    default), the rope as rope_parameters (transformers 5) or rope_theta and rope_scaling says, of the
    default or the yarn type, the experts, the window and the layer types; quantised experts refused."""
    if hf.get("quantization_config") is not None:
        raise CheckpointError(f"gpt-oss config.json: quantization_config {_short(hf['quantization_config'])} is not "
                              "supported (MXFP4 experts are not read here); save the model dequantised")
    if hf["num_experts_per_tok"] > hf["num_local_experts"]:
        raise CheckpointError(f"gpt-oss config.json: num_experts_per_tok = {hf['num_experts_per_tok']} must be at "
                              f"most num_local_experts = {hf['num_local_experts']}")
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = rope.pop("rope_theta", hf.get("rope_theta", 150000.0))
    rope_type = rope.pop("rope_type", rope.pop("type", "default"))
    if rope_type not in ("default", "yarn"):
        raise CheckpointError(f"gpt-oss config.json: rope_type {rope_type!r} is not supported (default or yarn)")
    read = GPT_OSS_YARN_KEYS if rope_type == "yarn" else ()
    unknown = sorted(set(rope) - set(read))
    if unknown:
        raise CheckpointError(f"gpt-oss config.json: rope_parameters key {unknown[0]!r} is not read for rope_type "
                              f"{rope_type!r} (read: {', '.join(read) or 'none besides rope_theta'})")
    layer_types = hf.get("layer_types")
    if layer_types is not None and not isinstance(layer_types, list):
        raise CheckpointError(f"gpt-oss config.json: layer_types must be a list, got {_short(layer_types)}")
    sliding = layer_types is None or "sliding_attention" in layer_types
    if sliding and hf.get("sliding_window", 128) is None:
        raise CheckpointError("gpt-oss config.json: sliding_window = null with sliding_attention layers "
                              "(give the window, or make every layer full_attention)")
    base = llama_config({**hf, "hidden_act": "silu", "rope_parameters": {"rope_theta": theta}, "rope_scaling": None,
                         "attention_bias": hf.get("attention_bias", True)}, GptOssConfig)
    return dataclasses.replace(
        base, rope_scaling=None if rope_type == "default" else {"rope_type": "yarn", **rope},
        n_experts=hf["num_local_experts"], experts_per_token=hf["num_experts_per_tok"],
        swiglu_alpha=float(hf.get("swiglu_alpha", 1.702)), swiglu_limit=float(hf.get("swiglu_limit", 7.0)),
        sliding_window=hf.get("sliding_window") or 128, layer_types=None if layer_types is None else tuple(layer_types))


def _gpt_oss_moe_params(tensors, prefix, config):
    """A block's mixture of experts: the router (E, C) transposed, and the experts' stacked weights,
    already (E, C_in, C_out); gate_up_proj (E, C, 2H) holds gate in its even columns and up in its odd
    ones (transformers' GptOssExperts: gate_up[..., ::2], gate_up[..., 1::2]), its bias likewise."""
    C, H, E = config.n_embd, config.hidden, config.n_experts
    gate_up = tensors.take(prefix + "experts.gate_up_proj", (E, C, 2 * H))             # (E, C, 2H)
    gate_up_b = tensors.take(prefix + "experts.gate_up_proj_bias", (E, 2 * H))         # (E, 2H)
    return {"router": {"w": tensors.take(prefix + "router.weight", (E, C)).T.copy(),   # (E, C) -> (C, E)
                       "b": tensors.take(prefix + "router.bias", (E,))},
            "experts": {"gate": {"w": gate_up[..., 0::2].copy(), "b": gate_up_b[..., 0::2].copy()},   # (E, C, H)
                        "up": {"w": gate_up[..., 1::2].copy(), "b": gate_up_b[..., 1::2].copy()},     # (E, C, H)
                        "down": {"w": tensors.take(prefix + "experts.down_proj", (E, H, C)),
                                 "b": tensors.take(prefix + "experts.down_proj_bias", (E, C))}}}


def _gpt_oss_params(tensors, config):
    """Llama's params with the experts as each block's "mlp" and each attention's sinks (nh,)."""
    params = _llama_params(tensors, config, mlp=_gpt_oss_moe_params)
    for i, block in params["blocks"].items():
        block["attn"]["sinks"] = tensors.take(f"model.layers.{i}.self_attn.sinks", (config.n_head,))
    return params


MODELS["GptOssForCausalLM"] = ("gpt_oss", gpt_oss_config, _gpt_oss_params)
