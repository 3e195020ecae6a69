"""The model families, one row each: what a command needs to build, run and decode a family.

A family's file (llama.py, qwen3.py, ...) ends with its row, ``FAMILY = Family(...)``, and
``families()`` finds every row by scanning this package's modules: a new family is a new file,
with no list elsewhere to extend. attn_cli reads Hugging Face folders and decodes through these
rows (attn_cli/hf/, attn_cli/hf_generate.py).
"""

import importlib
import os
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache


@dataclass(frozen=True)
class Family:
    """One model family: its name, the Hugging Face architectures it reads, its config class and
    functions (each the family's own, as its file defines them)."""
    name: str                  # "llama": attn_cli's kind, and attn_cli/hf/<name>.py reads its folders
    title: str                 # "Llama", as messages name it
    architectures: tuple       # Hugging Face's class names of its models: ("LlamaForCausalLM",)
    config: type               # LlamaConfig
    forward: Callable          # (ids, params, config, *, kv_cache=None, ...) -> (logits, cache)
    backward: Callable         # (dlogits, cache) -> dparams
    kv_cache: Callable         # (config, B, dtype, max_len) -> an empty key/value cache
    init_params: Callable      # (config, rng, dtype) -> params
    absorb: bool = False       # kv_cache takes absorb= (MLA's latent cache, or every head's keys and values)


@cache
def families():
    """{name: Family} of every module of numpy_attn that ends with a FAMILY row, in module order."""
    found = {}
    # This file's folder, not `import numpy_attn`: the package imports every family file, which
    # imports this one, so naming the package here would close an import loop.
    for module in pkgutil.iter_modules([os.path.dirname(__file__)]):
        if module.ispkg:
            continue
        row = getattr(importlib.import_module(f"numpy_attn.{module.name}"), "FAMILY", None)
        if isinstance(row, Family):
            if row.name in found:
                raise ValueError(f"two families are named {row.name!r}: numpy_attn.{module.name} and another")
            found[row.name] = row
    return found
