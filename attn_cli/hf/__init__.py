"""Read a Hugging Face checkpoint folder into numpy_attn's parameter dicts, without torch.

    kind, config, params = load_checkpoint("gpt2")       # a folder with config.json + *.safetensors

Every family of numpy_attn (its ``FAMILY`` row, numpy_attn/_family.py) whose reader is a module
here, ``attn_cli/hf/<family>.py``, is read: the architectures its row names (``LlamaForCausalLM``,
...; ARCHITECTURES lists them) into its config class and params. Each reader module holds the
family's config.json keys, its config from config.json and its params from the tensors (its
``READER``); the tables below are built from the rows and the readers, so that a new family adds
files and edits none here.

- files.py reads the files: config.json, the shard index, the safetensors headers and tensors,
  each checked before it is trusted (the hostile-file rules are in its docstring);
- config.py reads config.json as the family's config class of transformers does (its other
  spellings of keys, its defaults where they are not Llama's, rope_scaling over rope_parameters,
  layer_types one per layer), checks its keys against the reader's rules, and reads the rope
  settings every rotary family shares (each kind numpy_attn/rope.py implements);
- llama.py reads Llama's layout, which the other rotary families build on.

The tensors are read from one ``model.safetensors`` or the shards listed in
``model.safetensors.index.json``, each in its stored dtype, and converted to ``dtype``: float32 (the
default), float64, bfloat16 or float16. Every tensor the model needs must be present with the
shape its config implies, and every tensor present must be used: anything else is a
CheckpointError naming the tensor.
"""

import dataclasses
import importlib
import importlib.util
from pathlib import Path

import numpy as np

from attn_cli.hf import config as _config
from attn_cli.hf.config import ROPE_KEYS, YARN_OPTIONAL
from attn_cli.hf.files import (
    LOAD_DTYPES,
    CheckpointError,
    _short,
    _Tensors,
    bytes_text,
    checkpoint_bytes,
    load_dtype,
    read_config,
    read_tensors,
)
from attn_cli.hf.gpt2 import _gpt2_params
from attn_cli.hf.gpt_oss import GPT_OSS_YARN_KEYS
from numpy_attn._family import families

# The names other code and the tests import from attn_cli.hf.
__all__ = ["ARCHITECTURES", "CONFIG_KEYS", "GPT_OSS_YARN_KEYS", "LOAD_DTYPES", "MODELS", "READERS", "ROPE_KEYS",
           "YARN_OPTIONAL", "CheckpointError", "_Tensors", "_gpt2_params", "bytes_text", "check_config",
           "checkpoint_bytes", "load_checkpoint", "load_dtype", "read_config", "read_tensors"]


def _readers():
    """{architecture: (Family, Reader)}: each family's row and its reader module's READER, for the
    families that have a reader module here."""
    found = {}
    for family in families().values():
        name = f"{__name__}.{family.name}"
        if importlib.util.find_spec(name) is None:
            continue                         # a family of numpy_attn that no Hugging Face folder is read into
        reader = importlib.import_module(name).READER
        for architecture in family.architectures:
            found[architecture] = (family, reader)
    return found


READERS = _readers()
ARCHITECTURES = tuple(READERS)
# The config.json keys each architecture reads: key -> (what it must be, lowest value, required).
CONFIG_KEYS = {architecture: reader.keys for architecture, (_, reader) in READERS.items()}
# architecture -> (kind, its config from config.json, its params from the tensors)
MODELS = {architecture: (family.name, reader.config, reader.params)
          for architecture, (family, reader) in READERS.items()}

def load_checkpoint(folder, dtype=np.float32):
    """(kind, config, params) from a Hugging Face folder: kind the name of the family's row ("gpt2",
    "llama", ...); the params in ``dtype`` (float32, float64, bfloat16 or float16: a NumPy dtype, or
    its name)."""
    dtype = load_dtype(dtype)
    folder = Path(folder)
    hf_config = read_config(folder)
    architecture = _architecture(hf_config, folder)
    hf_config = _config.resolve_keys(hf_config, folder, READERS[architecture][1])
    check_config(hf_config, architecture, folder)
    tensors = _Tensors(read_tensors(folder), folder, dtype)
    kind, build, read_params = MODELS[architecture]
    if READERS[architecture][1].check_tensors:
        READERS[architecture][1].check_tensors(hf_config, tensors)
    config = build(hf_config)
    params = read_params(tensors, config)
    tensors.finish()
    if config.tie_weights and "head" in params:      # a tied config whose file holds its own head (_Tensors.head)
        config = dataclasses.replace(config, tie_weights=False)
    return kind, config, params


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
    _config.check_config(hf_config, architecture, folder, READERS[architecture][1])
