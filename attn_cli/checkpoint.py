"""Checkpoints of ``numpy-attn train``: a run folder holding ``model.npz`` (the parameters by
dotted path, e.g. ``blocks.0.attn.q.w``, plus ``vocab``; read with ``allow_pickle=False``),
``config.json`` (the GPTConfig, the dtype and the run's facts) and ``loss.png``.

Writing: the run is written into a new folder beside ``out`` and moved into place at the end, so
that a crash at any moment leaves either the whole old run or the whole new one; a lock file
beside ``out`` refuses a second writer. Reading: config.json's types and bounds, and every array's
name, shape and dtype (from the .npy headers, before any data is read) are checked against each
other; a damaged file or a non-finite weight gives a ValueError saying which, never a traceback.
"""

import contextlib
import dataclasses
import json
import math
import os
import shutil
import tempfile
import zipfile

import numpy as np

from numpy_attn._tree import flatten, unflatten
from numpy_attn.gpt import GPTConfig, init_gpt_params

CHECKPOINT, CONFIG, PLOT = "model.npz", "config.json", "loss.png"
DEFAULT_OUT = "numpy-attn-run"

# Bounds on what a config.json may ask for, so that a damaged or hostile file cannot make us
# allocate without limit: GPT-2's vocabulary, and sizes far above what this NumPy model trains.
LIMITS = {"vocab_size": 50257, "block_size": 4096, "n_layer": 64, "n_head": 256, "n_embd": 4096}
DTYPES = ("float32", "float64")


# -- writing ------------------------------------------------------------------------------------

def existing_files(out):
    """The run files already in the folder ``out``."""
    return [f for f in (CHECKPOINT, CONFIG, PLOT) if os.path.exists(os.path.join(out, f))]


def check_out(out, force):
    """Refuse (ValueError) an ``out`` that holds a run, unless ``force``, or that cannot be a run
    folder: a file, or a folder whose parent cannot be written."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"--out {out} is a file, not a folder")
    existing = existing_files(out)
    if existing and not force:
        raise ValueError(f"{out} already holds {', '.join(existing)}; pass --force to overwrite")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise ValueError(f"--out {out}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out}: cannot write in {parent}")


@contextlib.contextmanager
def writer_lock(out):
    """Hold ``.<name>.lock`` beside ``out`` for the whole run; ValueError if another writer does.

    An advisory lock (fcntl.flock), released by the system if the process dies; where flock does
    not exist, nothing is locked.
    """
    try:
        import fcntl
    except ImportError:            # not POSIX: no lock, as before
        yield
        return
    path = os.path.join(os.path.dirname(os.path.abspath(out)), f".{os.path.basename(os.path.abspath(out))}.lock")
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise ValueError(f"another numpy-attn train is writing {out} (it holds {path}); "
                             "wait for it, or choose another --out") from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def new_run_folder(out):
    """A fresh, empty folder beside ``out`` to write the new run into (same file system)."""
    parent = os.path.dirname(os.path.abspath(out))
    return tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(out))}.new-", dir=parent)


def write_run(folder, params, config, vocab, dtype, facts):
    """model.npz and config.json into ``folder`` (the new run folder), each flushed to disk."""
    with open(os.path.join(folder, CHECKPOINT), "wb") as f:
        np.savez(f, vocab=vocab, **flatten(params))
        f.flush()
        os.fsync(f.fileno())
    meta = {"gpt": dataclasses.asdict(config), "dtype": np.dtype(dtype).name, "tokenizer": "gpt2",
            "vocab": "model id i is GPT-2 id vocab[i], vocab stored in model.npz", **facts}
    with open(os.path.join(folder, CONFIG), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2)
        f.flush()
        os.fsync(f.fileno())


def move_into_place(folder, out):
    """Make the run in ``folder`` the run ``out``, replacing an old one in one rename.

    With an old run: the old folder is renamed aside first, the new one renamed in, the old one
    removed; a crash between the two renames leaves the whole old run in ``.<name>.old-*`` and the
    whole new run in ``.<name>.new-*``, beside ``out``.
    """
    out = os.path.abspath(out)
    if not os.path.exists(out):
        os.rename(folder, out)
        return
    old = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.old-", dir=os.path.dirname(out))
    os.rmdir(old)                  # a free name on the same file system
    os.rename(out, old)
    os.rename(folder, out)
    keep = [f for f in os.listdir(old) if f not in (CHECKPOINT, CONFIG, PLOT)]
    for name in keep:              # anything else the user kept in the folder stays there
        os.rename(os.path.join(old, name), os.path.join(out, name))
    shutil.rmtree(old, ignore_errors=True)


def save_checkpoint(out, params, config, vocab, dtype, facts, force=False, extra=None):
    """Write model.npz and config.json as the run ``out``; never overwrite without force.

    ``extra(folder)``, when given, writes more files (the loss plot) into the new run's folder
    before it is moved into place.
    """
    check_out(out, force)
    folder = new_run_folder(out)
    try:
        write_run(folder, params, config, vocab, dtype, facts)
        if extra is not None:
            extra(folder)
        move_into_place(folder, out)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


# -- reading ------------------------------------------------------------------------------------

def _check_config(meta, where):
    """GPTConfig and dtype from config.json's dict; ValueError naming the field at fault."""
    if not isinstance(meta, dict) or not isinstance(meta.get("gpt"), dict):
        raise ValueError(f"{where}: no \"gpt\" settings (is it a numpy-attn train config.json?)")
    gpt = meta["gpt"]
    fields = {f.name: f for f in dataclasses.fields(GPTConfig)}
    unknown = sorted(set(gpt) - set(fields))
    if unknown:
        raise ValueError(f"{where}: unknown gpt settings {unknown}")
    for name, value in gpt.items():
        kind = fields[name].type
        kind = {"int": int, "float": float, "bool": bool, "str": str}.get(kind, kind)
        ok = (isinstance(value, bool) if kind is bool else
              isinstance(value, int) and not isinstance(value, bool) if kind is int else
              isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
              if kind is float else isinstance(value, kind))
        if not ok:
            raise ValueError(f"{where}: gpt.{name} must be {kind.__name__}, got {value!r}")
        if name in LIMITS and not 0 <= value <= LIMITS[name]:
            raise ValueError(f"{where}: gpt.{name} = {value} is out of range 0..{LIMITS[name]}")
    if meta.get("dtype") not in DTYPES:
        raise ValueError(f"{where}: dtype must be one of {DTYPES}, got {meta.get('dtype')!r}")
    try:
        return GPTConfig(**gpt), np.dtype(meta["dtype"])
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: {err}") from None


def _expected_arrays(config, dtype):
    """{name: (shape, dtype)} the config needs, found without allocating a large model: the
    parameters are drawn for a vocabulary of 1 and a context of 1, and the tables that grow with
    them (wte, wpe, head.w) given their real sizes."""
    small = dataclasses.replace(config, vocab_size=1, block_size=1)
    shapes = {k: v.shape for k, v in flatten(init_gpt_params(small, np.random.default_rng(0), dtype)).items()}
    C, V = config.n_embd, config.vocab_size
    real = {"wte": (V, C), "wpe": (config.block_size, C), "head.w": (C, V)}
    out = {k: (real.get(k, s), dtype) for k, s in shapes.items()}
    out["vocab"] = ((V,), np.dtype(np.int64))
    return out


def _headers(npz):
    """{name: (shape, dtype)} of every array of an .npz, read from the .npy headers alone."""
    found = {}
    with zipfile.ZipFile(npz) as z:
        for info in z.infolist():
            if not info.filename.endswith(".npy"):
                raise ValueError(f"unexpected member {info.filename!r}")
            with z.open(info) as f:
                version = np.lib.format.read_magic(f)
                read = {(1, 0): np.lib.format.read_array_header_1_0,
                        (2, 0): np.lib.format.read_array_header_2_0}.get(version)
                if read is None:
                    raise ValueError(f"{info.filename}: .npy format version {version} not read here")
                shape, _, dtype = read(f)
            found[info.filename[:-4]] = (tuple(shape), np.dtype(dtype))
    return found


def load_checkpoint(path):
    """(params, config, vocab) from a run folder or its model.npz (config.json beside it).

    Raises ValueError, naming the file and what is wrong, when a file is missing, damaged or does
    not match the other.
    """
    folder = path if os.path.isdir(path) else os.path.dirname(path) or "."
    npz = os.path.join(path, CHECKPOINT) if os.path.isdir(path) else path
    config_path = os.path.join(folder, CONFIG)
    for file in (npz, config_path):
        if not os.path.isfile(file):
            raise ValueError(f"no {os.path.basename(file)} in {folder}: not a run folder of "
                             "numpy-attn train")
    try:
        with open(config_path, encoding="utf-8") as f:
            meta = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{config_path} is not valid JSON ({err}); the run is damaged: train "
                         "again") from None
    config, dtype = _check_config(meta, config_path)
    expected = _expected_arrays(config, dtype)
    try:
        found = _headers(npz)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as err:
        raise ValueError(f"{npz} is damaged or not a numpy-attn checkpoint ({err}); train again") from None
    problems = [f"missing {k}" for k in expected if k not in found]
    problems += [f"unexpected {k}" for k in found if k not in expected]
    problems += [f"{k} has shape {found[k][0]} {found[k][1]}, the config needs {s} {d}"
                 for k, (s, d) in expected.items() if k in found and found[k] != (s, np.dtype(d))]
    if problems:
        raise ValueError(f"checkpoint {npz} does not match {CONFIG}: " + "; ".join(problems[:5]))
    try:
        with np.load(npz, allow_pickle=False) as z:
            flat = {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as err:
        raise ValueError(f"{npz} is damaged ({err}); train again") from None
    vocab = flat.pop("vocab")
    bad = [k for k, v in flat.items() if not np.isfinite(v).all()]
    if bad:
        raise ValueError(f"checkpoint {npz} holds NaN or infinite weights in {', '.join(bad[:5])}")
    if len(vocab) and (vocab.min() < 0 or vocab.max() >= LIMITS["vocab_size"] or np.any(np.diff(vocab) <= 0)):
        raise ValueError(f"checkpoint {npz}: vocab must hold increasing GPT-2 ids below "
                         f"{LIMITS['vocab_size']}")
    return unflatten(flat), config, vocab
