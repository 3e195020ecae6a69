"""What every family's reading of config.json shares: the record of a family's reader, config.json
read as transformers' config class reads it (aliases, defaults, layer_types), the checks of its
keys against the reader's rules, and the rope settings.

A reader's ``keys`` are config.json's keys it reads: key -> (what it must be, lowest value,
required). Each is checked for type and bounds, and the model they describe for a parameter count
no larger than the safetensors files hold, before anything is allocated from a size in the file.
"""

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from attn_cli.hf.files import KINDS, CheckpointError, _short, _values_held, bytes_text
from numpy_attn.rope import SCALING_KEYS

# Sizes that allocate without being parameters, so that the parameter count cannot bound them:
# the rotary table has head_dim / 2 entries (released models use head sizes of 64 to 512).
CAPS = {"head_dim": 65536, "qk_rope_head_dim": 65536}
# Numbers inside rope_parameters / rope_scaling objects, each checked to be a number >= 0.
ROPE_KEYS = ("rope_theta", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
# YaRN's optional keys (numpy_attn/rope.py reads each), taken where the file gives them.
YARN_OPTIONAL = ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate")


def layout_parameter_count(hf):
    """A lower bound on the parameters a config.json of Llama's layout implies: the weight matrices
    and norms every such model holds (biases and an untied head left out), counted in Python
    integers so that no size overflows."""
    C, L, H = hf["hidden_size"], hf["num_hidden_layers"], hf["intermediate_size"]
    nh = hf["num_attention_heads"]
    nkv, hs = hf.get("num_key_value_heads") or nh, hf.get("head_dim") or C // nh
    per_layer = 2 * C * nh * hs + 2 * C * nkv * hs + 3 * C * H + 2 * C   # q, o, k, v, the MLP, two norms
    return hf["vocab_size"] * C + L * per_layer + C


@dataclass(frozen=True)
class Reader:
    """How attn_cli.hf reads one family's folders: config.json's keys (key -> (kind, lowest value,
    required)), its config from config.json (a dict), its params from the tensors (files._Tensors)
    and the config, and a lower bound on the parameters config.json implies."""
    keys: dict
    config: Callable
    params: Callable
    parameter_count: Callable = layout_parameter_count
    # transformers' other spellings of keys (its config class's attribute_map): alias -> key.
    aliases: dict = field(default_factory=dict)
    # transformers' values for keys config.json leaves out, where they differ from Llama's
    # (llama_config's): key -> value (Qwen3's head_dim is 128 whatever hidden_size says).
    defaults: dict = field(default_factory=dict)
    layers_key: str = "num_hidden_layers"       # the key layer_types must match in length
    # check_tensors(config.json, tensors): refuse tensors that config.json's keys do not describe
    # where no config field carries them to the params (GPT-2's n_inner).
    check_tensors: Callable | None = None


def resolve_keys(hf_config, folder, reader):
    """config.json as the family's config class of transformers reads it: each alias of
    ``reader.aliases`` read as its key (an alias alone is the key; beside its key with another
    value, refused naming both: transformers reads the alias), and ``reader.defaults`` for the
    keys left out."""
    hf = dict(hf_config)
    for alias, key in reader.aliases.items():
        if alias not in hf:
            continue
        if key in hf and hf[key] != hf[alias]:
            raise CheckpointError(f"{Path(folder) / 'config.json'}: {alias} = {_short(hf[alias])} and {key} = "
                                  f"{_short(hf[key])} differ; {alias} is another name of {key} (transformers "
                                  f"reads {alias}): give one value")
        hf[key] = hf.pop(alias)
    return {**reader.defaults, **hf}


def read_layer_types(hf, family, layers_key="num_hidden_layers"):
    """config.json's layer_types as a tuple (None where absent), transformers' older "attention"
    read as "full_attention": a list of another length than ``layers_key`` (num_hidden_layers),
    empty included, is refused naming both numbers, as every config class of transformers refuses
    it, whether its model reads layer_types or not. The entries are the family's to check."""
    types = hf.get("layer_types")
    if types is None:
        return None
    if not isinstance(types, list):
        raise CheckpointError(f"{family} config.json: layer_types must be a list, got {_short(types)}")
    n = hf.get(layers_key)
    if len(types) != n:
        raise CheckpointError(f"{family} config.json: layer_types must list {layers_key} = {_short(n)} entries, "
                              f"one per layer, got {len(types)}: {_short(types)}")
    return tuple("full_attention" if t == "attention" else t for t in types)


def check_config(hf_config, architecture, folder, reader):
    """Refuse (CheckpointError naming config.json and the key) a config.json whose keys lack the
    type or bounds of ``reader.keys``, or that describes more parameters than the folder's
    safetensors files hold values; run before anything is allocated from the config's sizes."""
    path = Path(folder) / "config.json"
    for key, (kind, low, required) in reader.keys.items():
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
    need, held = reader.parameter_count(hf_config), _values_held(folder)
    if need > held:
        raise CheckpointError(f"{path} describes at least {need:,} parameters ({bytes_text(4 * need)} in float32), "
                              f"but the safetensors files hold {held:,} values: the config does not "
                              "describe these weights")
    try:                        # what only the config as a whole can refuse (n_embd % n_head, rope)
        reader.config(hf_config)
        read_layer_types(hf_config, architecture, reader.layers_key)        # checked whether read or not
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


def rope_settings(hf, family, optional=(), theta=10000.0, context=2048):
    """(theta, scaling) from ``rope_parameters`` (transformers 5) or ``rope_theta`` and
    ``rope_scaling`` (transformers 4): scaling None for the default kind, else the rope_type and
    the keys numpy_attn/rope.py reads for it (absent ones None, which rope.py refuses by name),
    YaRN's optional keys (and ``optional`` ones, for every kind) only where the file gives them.
    Every kind rope.py implements is read (default, linear, llama3, yarn, dynamic); another is
    refused naming it. Dynamic NTK's original context is max_position_embeddings (default
    ``context``), where transformers reads it; so is the original context of llama3 and YaRN
    where their object leaves it out.

    A non-empty ``rope_scaling`` wins over ``rope_parameters``, whole, as in transformers' config
    classes (its rope_theta, else the top-level one, else ``theta``; rope_parameters' is not read):
    a file written by transformers 5 holds rope_parameters, and one edited by hand or by older code
    beside it may hold rope_scaling too."""
    rope = dict(hf.get("rope_scaling") or hf.get("rope_parameters") or {})
    check_rope_object(rope, hf, family)
    theta = rope.pop("rope_theta", hf.get("rope_theta", theta))
    if "type" in rope:                       # older files spell rope_type "type"
        rope.setdefault("rope_type", rope.pop("type"))
    rope_type = rope.get("rope_type", "default")
    if not isinstance(rope_type, str) or rope_type not in SCALING_KEYS:
        raise CheckpointError(f"{family} config.json: rope_type {_short(rope_type)} is not supported "
                              f"(one of {sorted(SCALING_KEYS)})")
    if rope_type == "default":
        return theta, None
    if rope_type == "dynamic":
        rope["original_max_position_embeddings"] = hf.get("max_position_embeddings", context)
    elif rope_type in ("llama3", "yarn"):
        rope.setdefault("original_max_position_embeddings", hf.get("max_position_embeddings", context))
    given = {k: rope[k] for k in (*(YARN_OPTIONAL if rope_type == "yarn" else ()), *optional) if k in rope}
    return theta, {"rope_type": rope_type, **{k: rope.get(k) for k in SCALING_KEYS[rope_type]}, **given}


def check_rope_object(rope, hf, family):
    """Refuse what transformers reads in a rope object and rope.py does not implement, naming it:
    a partial_rotary_factor other than 1 (in the object, or at config.json's top, which
    transformers moves into it), with which only part of each head would rotate; an object inside
    it (settings per layer type, which only Gemma 3's reader reads)."""
    partial = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise CheckpointError(f"{family} config.json: partial_rotary_factor = {_short(partial)} is not supported "
                              "(every dimension of a head rotates here: only 1.0)")
    nested = sorted(key for key, value in rope.items() if isinstance(value, dict))
    if nested:
        raise CheckpointError(f"{family} config.json: the rope settings per layer type ({nested[0]!r}) are not "
                              f"read for {family}: give one rope_parameters object")


def context_length(hf, scaling, context=2048):
    """block_size, the longest context: max_position_embeddings (default ``context``), which dynamic
    NTK stretches by its factor (transformers runs past it, the base growing with the positions; a
    factor of s serves s times the original context, so this model's stops there)."""
    length = hf.get("max_position_embeddings", context)
    factor = None if scaling is None or scaling["rope_type"] != "dynamic" else scaling.get("factor")
    if KINDS["int"](length) and KINDS["number"](factor) and factor > 1:
        return max(length, math.floor(length * factor))
    return length
