"""Checkpoints of ``numpy-attn train``: a run folder holding ``model.npz`` (the parameters by
dotted path, e.g. ``blocks.0.attn.q.w``, plus ``vocab``; read with ``allow_pickle=False``) and
``config.json`` (the GPTConfig, the dtype and the run's facts)."""

import dataclasses
import json
import os

import numpy as np

from numpy_attn._tree import flatten, unflatten
from numpy_attn.gpt import GPTConfig, init_gpt_params

CHECKPOINT, CONFIG, PLOT = "model.npz", "config.json", "loss.png"
DEFAULT_OUT = "numpy-attn-run"


def existing_files(out):
    """The run files already in the folder ``out``."""
    return [f for f in (CHECKPOINT, CONFIG, PLOT) if os.path.exists(os.path.join(out, f))]


def check_out(out, force):
    """Refuse (ValueError) an ``out`` that holds a run, unless ``force``, or that cannot be a folder."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"--out {out} is a file, not a folder")
    existing = existing_files(out)
    if existing and not force:
        raise ValueError(f"{out} already holds {', '.join(existing)}; pass --force to overwrite")


def save_checkpoint(out, params, config, vocab, dtype, facts, force=False):
    """Write model.npz and config.json into the folder ``out``; never overwrite without force."""
    check_out(out, force)
    os.makedirs(out, exist_ok=True)
    np.savez(os.path.join(out, CHECKPOINT), vocab=vocab, **flatten(params))
    meta = {"gpt": dataclasses.asdict(config), "dtype": np.dtype(dtype).name, "tokenizer": "gpt2",
            "vocab": "model id i is GPT-2 id vocab[i], vocab stored in model.npz", **facts}
    with open(os.path.join(out, CONFIG), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2)


def load_checkpoint(path):
    """(params, config, vocab) from a run folder or its model.npz (config.json beside it).

    Raises ValueError when the arrays do not match the config.
    """
    folder = path if os.path.isdir(path) else os.path.dirname(path) or "."
    npz = os.path.join(path, CHECKPOINT) if os.path.isdir(path) else path
    with open(os.path.join(folder, CONFIG), encoding="utf-8") as f:
        meta = json.load(f)
    config = GPTConfig(**meta["gpt"])
    with np.load(npz, allow_pickle=False) as z:
        flat = {k: z[k] for k in z.files}
    vocab = flat.pop("vocab", None)
    expected = flatten(init_gpt_params(config, np.random.default_rng(0), meta["dtype"]))
    problems = [f"missing {k}" for k in expected if k not in flat]
    problems += [f"unexpected {k}" for k in flat if k not in expected]
    problems += [f"{k} has shape {flat[k].shape} {flat[k].dtype}, the config needs "
                 f"{v.shape} {v.dtype}" for k, v in expected.items()
                 if k in flat and (flat[k].shape != v.shape or flat[k].dtype != v.dtype)]
    if vocab is None or vocab.shape != (config.vocab_size,):
        problems.append(f"vocab must hold vocab_size = {config.vocab_size} ids, got "
                        f"{None if vocab is None else vocab.shape}")
    if problems:
        raise ValueError(f"checkpoint {npz} does not match {CONFIG}: " + "; ".join(problems[:5]))
    return unflatten(flat), config, vocab
