"""Checkpoints of ``numpy-attn train``: a run folder holding ``model.npz`` (the parameters by
dotted path, e.g. ``blocks.0.attn.q.w``, plus ``vocab``; read with ``allow_pickle=False``),
``config.json`` (the GPTConfig, the dtype, the run's facts, and model.npz's size and SHA-256) and
``loss.png``. The parameters are saved in the dtype the optimiser kept them in: float32 or float64,
and float32 for a mixed-precision run (``--dtype bfloat16`` or ``float16``), whose float32 master
weights are saved rather than their low-precision casts; its config.json says ``"dtype": "float32"``
and names the dtype the steps ran in as ``"compute_dtype"`` (with float16's final loss scale and
skipped steps under ``"loss_scale"``).

Writing. ``--out`` is the user's folder: it may be the current folder, a symlink to a folder
elsewhere, or a folder that holds other work. So a run owns its three files there and nothing else:

- ``--out`` itself is never renamed, replaced or removed, and its mode is left as it is. A missing
  one is created (with the umask's mode) and, if the run ends before writing, removed again while
  it is still empty (rmdir removes nothing else).
- Taken: a missing or empty folder; one holding a previous run (its config.json written by
  numpy-attn train), or other files, only with ``--force``. Refused even with ``--force``: a file
  named model.npz, config.json or loss.png that no run wrote, or such a name that is not a regular
  file; the user made it, and it is theirs.
- Each file is first written whole to a new hidden file in ``--out`` (``.model.npz.<random>.new``,
  created exclusively, so that no existing name is ever reused) and flushed to disk. The new files
  then replace the old ones by os.replace, config.json first; the old ones are kept as hard links
  (copies where the file system has none) until every name holds its new file, and put back if a
  step fails.
- The guarantee: after any exception or signal, the three names hold the whole old run or the whole
  new one, never a mixture, and every other entry of ``--out`` (files, subfolders, links) is as it
  was. SIGINT, SIGTERM and SIGHUP arriving while files are written are held until the save has
  finished or been undone, then act as usual (Ctrl-C raises KeyboardInterrupt). Only a kill that no
  code sees (SIGKILL, a power cut) during the few renames can leave a mixture and hidden files;
  config.json records model.npz's size and SHA-256, so the loader refuses such a mixture.
- A second writer is refused by an advisory lock (flock) on the ``--out`` folder itself, held for
  the whole run: no lock file is left anywhere.

Reading: config.json's types and bounds, the model size it implies against model.npz's size, and
every array's name, shape, dtype and byte count (from the zip directory and the .npy headers, before
any data is read) are checked against each other; a damaged file or a non-finite weight gives a
ValueError saying which, never a traceback.
"""

import contextlib
import dataclasses
import hashlib
import io
import json
import math
import os
import secrets
import signal
import threading
import zipfile

import numpy as np

from numpy_attn._tree import flatten, unflatten
from numpy_attn.gpt import GPTConfig

CHECKPOINT, CONFIG, PLOT = "model.npz", "config.json", "loss.png"
RUN_FILES = (CHECKPOINT, CONFIG, PLOT)     # the only files a run writes
PLACE_ORDER = (CONFIG, CHECKPOINT, PLOT)   # the order they are put in place (see above)
DEFAULT_OUT = "numpy-attn-run"
WRITER = "numpy-attn train"

# Bounds on what a config.json may ask for, so that a damaged or hostile file cannot make us
# allocate without limit: GPT-2's vocabulary, and sizes far above what this NumPy model trains.
LIMITS = {"vocab_size": 50257, "block_size": 4096, "n_layer": 64, "n_head": 256, "n_embd": 4096}
DTYPES = ("float32", "float64")
_CONFIG_BYTES = 1 << 20        # a config.json larger than this is not one of ours
_ARRAY_OVERHEAD = 4096         # bytes model.npz may hold per array beyond its data

_HELD = {}                     # abspath of each --out this process has locked -> whether it made it


# -- writing ------------------------------------------------------------------------------------

def existing_files(out):
    """The run files' names that exist in the folder ``out`` (as anything: file, link, folder)."""
    return [f for f in RUN_FILES if os.path.lexists(os.path.join(out, f))]


def is_run_config(path):
    """Whether ``path`` is a config.json that numpy-attn train wrote (a regular file, small, JSON
    with the "gpt" settings and the dtype)."""
    try:
        if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > _CONFIG_BYTES:
            return False
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(meta, dict) and isinstance(meta.get("gpt"), dict) and "dtype" in meta


def check_folder_path(out, option):
    """Whether the folder ``out`` exists; ValueError naming ``option`` and ``out`` where it cannot
    be a folder to write into: a symlink to nothing, a file, or a missing folder whose parent is
    missing or cannot be written. Through a symlink, its target is the folder."""
    if os.path.islink(out) and not os.path.exists(out):
        raise ValueError(f"{option} {out} is a symlink to {os.readlink(out)}, which does not exist")
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"{option} {out} is a file, not a folder")
    if os.path.exists(out):
        return True
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise ValueError(f"{option} {out}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {out} cannot be written: no permission to create it in {parent}")
    return False


def check_out(out, force, made=False):
    """Refuse (ValueError naming --out and the path) an ``out`` this run may not write into; see the
    module docstring for which. ``made``: the folder is one this run created (its other files
    were put there while it trained, and count as no refusal)."""
    if not check_folder_path(out, "--out"):
        return
    if not os.access(out, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out} cannot be written: no permission to write in {os.path.abspath(out)}")
    named = existing_files(out)
    odd = [f for f in named if os.path.islink(os.path.join(out, f)) or not os.path.isfile(os.path.join(out, f))]
    if odd:
        raise ValueError(f"--out {out} holds {', '.join(odd)}, which is not a regular file; train "
                         "replaces only files it wrote: move it away or choose another --out")
    if named and not is_run_config(os.path.join(out, CONFIG)):
        raise ValueError(f"--out {out} holds {', '.join(named)} but no config.json of numpy-attn train: "
                         "train never replaces a file it did not write, even with --force; move "
                         f"{'it' if len(named) == 1 else 'them'} away or choose another --out")
    if named and not force:
        raise ValueError(f"{out} already holds {', '.join(named)}; pass --force to overwrite")
    others = sorted(set(os.listdir(out)) - set(RUN_FILES))
    if others and not named and not force and not made:
        raise ValueError(f"--out {out} is a folder holding other files ({len(others)}, such as "
                         f"{others[0]!r}); train writes only {', '.join(RUN_FILES)} into it and "
                         "touches nothing else: pass --force to write them there, or choose a new "
                         "or empty folder")


@contextlib.contextmanager
def writer_lock(out, command=WRITER, option="--out"):
    """Hold an advisory lock (fcntl.flock) on the folder ``out`` for the whole run, creating the
    folder if it is missing; ValueError if another writer holds it (the messages name the
    ``command`` and the ``option`` that gave ``out``). Nested calls for the same ``out`` hold it
    once.

    The lock is on the folder itself, so no lock file is ever left (the system releases it if the
    process dies). A folder this run created is removed at the end if it is still empty. Where
    flock does not exist, nothing is locked.
    """
    key = os.path.abspath(out)
    if key in _HELD:
        yield
        return
    made = _make_folder(out, option)
    try:
        fd = _lock_folder(out, command, option)
        _HELD[key] = made
        try:
            yield
        finally:
            del _HELD[key]
            _unlock_folder(fd)
    finally:
        if made:
            with contextlib.suppress(OSError):  # not empty: it holds the run, or the user's files
                os.rmdir(out)


def _lock_folder(out, command=WRITER, option="--out"):
    """An open descriptor of the folder ``out`` holding its flock; None where flock does not exist."""
    try:
        import fcntl
    except ImportError:                         # not POSIX: no lock
        return None
    try:
        fd = os.open(out, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as err:
        raise ValueError(f"{option} {out} cannot be written: {err.strerror or err}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise ValueError(f"another {command} is writing {out} (it holds a lock on the "
                         f"folder); wait for it, or choose another {option}") from None
    return fd


def _unlock_folder(fd):
    if fd is None:
        return
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_UN)          # closing releases it too, if the close is made
    finally:
        os.close(fd)


def _make_folder(out, option="--out"):
    """Create the folder ``out`` if it is missing; whether this call created it."""
    try:
        os.mkdir(out)
    except FileExistsError:
        return False
    except OSError as err:
        raise ValueError(f"{option} {out} cannot be written: cannot create the folder "
                         f"{os.path.abspath(out)} ({err.strerror or err})") from None
    return True


def run_files(params, config, vocab, dtype, facts, plot=None):
    """{name: bytes} of a run, built in memory: model.npz, config.json (recording model.npz's size
    and SHA-256), and loss.png if ``plot(file)`` writes one into a binary file (returning False
    when it cannot)."""
    npz = io.BytesIO()
    np.savez(npz, vocab=vocab, **flatten(params))
    files = {CHECKPOINT: npz.getvalue()}
    meta = {"written_by": WRITER, "gpt": dataclasses.asdict(config), "dtype": np.dtype(dtype).name,
            "tokenizer": "gpt2", "vocab": "model id i is GPT-2 id vocab[i], vocab stored in model.npz",
            "model_bytes": len(files[CHECKPOINT]), "model_sha256": hashlib.sha256(files[CHECKPOINT]).hexdigest(),
            **facts}
    files[CONFIG] = json.dumps(meta, indent=2).encode("utf-8")
    png = io.BytesIO()
    if plot is not None and plot(png) is not False:
        files[PLOT] = png.getvalue()
    return files


def save_checkpoint(out, params, config, vocab, dtype, facts, force=False, plot=None):
    """Write the run's files (see ``run_files``) into the folder ``out``, all or none, touching
    nothing else there (the module docstring says how); never over a run without ``force``.
    Returns the names written."""
    files = run_files(params, config, vocab, dtype, facts, plot)     # nothing is on disk yet
    check_out(out, force, made=_HELD.get(os.path.abspath(out), False))
    with writer_lock(out), signals_held():
        check_out(out, force, made=_HELD[os.path.abspath(out)])     # again, now that it is ours
        write_files(out, files, PLACE_ORDER)    # a name the new run lacks (loss.png) is removed
    return [name for name in RUN_FILES if name in files]


def write_files(out, files, order):
    """Give the folder ``out`` the files ``files`` ({relative path: bytes}, "/" between folders)
    and remove the other names of ``order`` that exist there, all or none; nothing else in ``out``
    is touched. ``order`` (every name of ``files`` and those to remove) is the order the names
    change in. The caller holds the signals (``signals_held``) and has checked that each name it
    replaces or removes is a regular file of its own, under folders that are not links.

    Each file is first written whole to a new hidden file beside its name and flushed to disk; a
    missing folder (of a relative path) is created, and removed again if the write is undone.
    Then ``move_into_place``. Used by ``save_checkpoint`` and ``numpy-attn site``; one file
    alone goes through ``replace_file``."""
    new, made = {}, []                          # name -> new hidden file; folders created
    try:
        for name, data in files.items():
            folder, base = os.path.split(os.path.join(out, *name.split("/")))
            _make_folders(folder, out, made)
            new[name] = _new_file(folder, base, ".new", data)
        move_into_place(new, out, order)
    except BaseException:
        _remove_quietly(new.values())           # the new files not moved in
        for folder in reversed(made):           # then the folders made for them, if empty
            with contextlib.suppress(OSError):
                os.rmdir(folder)
        raise


def _make_folders(folder, out, made):
    """Create ``folder`` (inside ``out``) and its missing parents up to ``out``, adding each one
    created to ``made``."""
    missing = []
    while not os.path.isdir(folder) and os.path.abspath(folder) != os.path.abspath(out):
        missing.append(folder)
        folder = os.path.dirname(folder)
    for folder in reversed(missing):
        os.mkdir(folder)
        made.append(folder)


def move_into_place(new, out, order=PLACE_ORDER):
    """Give each name of ``order`` (relative paths in ``out``) its new file ``new[name]`` (a hidden
    file beside it), or remove the name where ``new`` has none, all or none. ``new`` loses each
    entry moved in.

    The old files are kept as hard links first; if a step fails, the names already changed get
    their old file back (or are removed where there was none), so ``out`` holds the old files.
    """
    kept = {}              # name -> a hidden hard link to (or copy of) the old file
    done = []              # names already changed, in order
    path = {name: os.path.join(out, *name.split("/")) for name in order}
    try:
        for name in order:
            if os.path.lexists(path[name]):
                kept[name] = _keep(path[name])
        for name in order:
            if name in new:
                os.replace(new[name], path[name])
                del new[name]
            elif name in kept:
                os.unlink(path[name])           # e.g. the old run's plot, where the new run has none
            else:
                continue
            done.append(name)
        for folder in dict.fromkeys(os.path.dirname(p) for p in path.values()):
            _sync_folder(folder)
    except BaseException:
        for name in reversed(done):             # undo, newest first
            with contextlib.suppress(BaseException):   # then that old file stays in its hidden copy
                if name in kept:
                    os.replace(kept.pop(name), path[name])
                else:
                    os.unlink(path[name])
        raise
    finally:
        _remove_quietly(kept.values())          # copies of files that are in place again


def _new_file(folder, name, suffix, data, mode=None):
    """Path of a new hidden file ``.<name>.<random><suffix>`` in ``folder`` holding ``data``
    (``new_file``); never an existing name."""
    while True:
        path = os.path.join(folder, f".{name}.{secrets.token_hex(4)}{suffix}")
        try:
            return new_file(path, data, mode)
        except FileExistsError:
            continue


def new_file(path, data, mode=None):
    """Create the file ``path`` (FileExistsError if the name exists: nothing is ever written over),
    write ``data`` (bytes) whole, with permission bits ``mode`` (default: the umask's), and flush it
    to disk; removed again if any of that fails. Returns ``path``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        try:
            if mode is not None:
                os.chmod(path, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        _remove_quietly([path])
        raise
    return path


def replace_file(path, data):
    """Replace the file ``path`` by one holding ``data`` (bytes), whole or not at all, as a run's
    files are replaced: ``data`` goes into a new hidden file beside it, flushed to disk, which then
    takes the name in one os.replace, with SIGINT, SIGTERM and SIGHUP held meanwhile. Interrupted
    at any step, ``path`` holds its old content or the whole new one and the hidden file is gone.
    Through a symlink, its target is the file replaced. The new file keeps the old one's permission
    bits, else gets the umask's. For one file on its own (a report, a results file); a run's files
    go together through ``save_checkpoint``."""
    path = os.path.realpath(path)
    folder, name = os.path.split(path)
    with signals_held():
        mode = os.stat(path).st_mode & 0o7777 if os.path.lexists(path) else None
        new = _new_file(folder, name, ".new", data, mode)
        try:
            os.replace(new, path)
        except BaseException:
            _remove_quietly([new])
            raise
        _sync_folder(folder)


def create_file(path, data):
    """Create the file ``path`` holding ``data`` (bytes), whole or not at all, and never over an
    existing name (FileExistsError; nothing is written then): ``data`` goes into a new hidden file
    beside it, flushed to disk, which then takes the name by os.link (which refuses a name that
    exists, where os.replace would write over it), with SIGINT, SIGTERM and SIGHUP held meanwhile,
    and the hidden name is removed. Interrupted at any step, ``path`` is missing or holds all of
    ``data``; only a cut removal of the hidden name can leave that hidden file. Where the file system
    has no hard links, the file is created under its own name exclusively and written there
    (``new_file``: removed again if the write fails). The new file gets the umask's permission bits."""
    folder, name = os.path.split(os.path.abspath(path))
    with signals_held():
        new = _new_file(folder, name, ".new", data)
        try:
            try:
                os.link(new, path)
            except FileExistsError:
                raise
            except OSError:                     # no hard links here: write under the name itself
                new_file(path, data)
        finally:
            _remove_quietly([new])
        _sync_folder(folder)
    return path


def _keep(path):
    """A new hidden hard link to the file ``path``, or a copy where the file system has no links."""
    folder, name = os.path.split(path)
    while True:
        keep = os.path.join(folder, f".{name}.{secrets.token_hex(4)}.old")
        try:
            os.link(path, keep)
            return keep
        except FileExistsError:
            continue
        except OSError:
            break
    with open(path, "rb") as f:
        return _new_file(folder, name, ".old", f.read())


def _sync_folder(folder):
    """Flush the folder's entries (the renames) to disk, where the system allows it."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _remove_quietly(paths):
    """Remove our own hidden files; one already gone, or that cannot go, is passed over. An
    exception other than OSError is raised once every other path has been tried."""
    first = None
    for path in list(paths):
        try:
            os.unlink(path)
        except OSError:
            pass
        except BaseException as err:
            first = first or err
    if first is not None:
        raise first


@contextlib.contextmanager
def signals_held(signums=("SIGINT", "SIGTERM", "SIGHUP")):
    """Hold these signals until the block ends, then act on each one that came, as before (a
    Ctrl-C then raises KeyboardInterrupt): a save is never cut in the middle. Only the main
    thread can set handlers; elsewhere nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came = []
    previous = {}
    for signum in (getattr(signal, s) for s in signums if hasattr(signal, s)):
        handler = signal.getsignal(signum)
        if handler is not None and handler != signal.SIG_IGN:     # None: set outside Python
            previous[signum] = signal.signal(signum, lambda s, frame: came.append(s))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(came):
            signal.raise_signal(signum)


class Terminated(SystemExit):
    """The SystemExit that ``termination_raises`` raises for SIGTERM or SIGHUP (``signum``); its
    exit status is 128 + the signal, as a shell reports a process the signal ended."""

    def __init__(self, signum):
        super().__init__(128 + signum)
        self.signum = signum


@contextlib.contextmanager
def termination_raises():
    """SIGTERM and SIGHUP end the command by ``Terminated`` (a SystemExit, status 128 + the
    signal), as Ctrl-C does by KeyboardInterrupt, so that locks are released, a folder the command
    created but did not fill is removed, and temporary files and folders are cleaned up; their
    default would end the process on the spot. A handler already set (other than the default) is
    left as it is."""
    def leave(signum, frame):
        raise Terminated(signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for signum in (getattr(signal, s) for s in ("SIGTERM", "SIGHUP") if hasattr(signal, s)):
        if signal.getsignal(signum) == signal.SIG_DFL:
            previous[signum] = signal.signal(signum, leave)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


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
            raise ValueError(f"{where}: gpt.{name} must be {getattr(kind, '__name__', kind)}, got {value!r}")
        if name in LIMITS and not 0 <= value <= LIMITS[name]:
            raise ValueError(f"{where}: gpt.{name} = {value} is out of range 0..{LIMITS[name]}")
    if meta.get("dtype") not in DTYPES:
        raise ValueError(f"{where}: dtype must be one of {DTYPES}, got {meta.get('dtype')!r}")
    try:
        return GPTConfig(**gpt), np.dtype(meta["dtype"])
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: {err}") from None


def _expected_arrays(config, dtype):
    """{name: (shape, dtype)} of every array model.npz must hold for ``config``, written out from
    the init functions' shapes rather than drawn (a config asking for 64 blocks of width 4096 would
    otherwise allocate 51 GB to find them); the tests compare it with init_gpt_params."""
    V, C, T = config.vocab_size, config.n_embd, config.block_size
    kv = (config.n_kv_head or config.n_head) * (C // config.n_head)       # nkv * hs
    linears = {"attn.q": (C, C), "attn.k": (C, kv), "attn.v": (C, kv), "attn.o": (C, C),
               "ffn.fc": (C, 4 * C), "ffn.proj": (4 * C, C)}              # (C_in, C_out)
    shapes = {"wte": (V, C)}
    if config.positions == "learned":
        shapes["wpe"] = (T, C)
    for i in range(config.n_layer):
        for norm in ("ln1", "ln2"):
            shapes.update({f"blocks.{i}.{norm}.w": (C,), f"blocks.{i}.{norm}.b": (C,)})
        for name, (c_in, c_out) in linears.items():
            shapes[f"blocks.{i}.{name}.w"] = (c_in, c_out)
            if config.bias:
                shapes[f"blocks.{i}.{name}.b"] = (c_out,)
    shapes.update({"ln_f.w": (C,), "ln_f.b": (C,)})
    if not config.tie_weights:
        shapes["head.w"] = (C, V)
    out = {k: (s, np.dtype(dtype)) for k, s in shapes.items()}
    out["vocab"] = ((V,), np.dtype(np.int64))
    return out


def _nbytes(shape, dtype):
    return math.prod(shape) * np.dtype(dtype).itemsize


def _headers(npz, size):
    """{name: (shape, dtype)} of every array of an .npz of ``size`` bytes, read from the zip
    directory and the .npy headers alone; ValueError where a member is compressed or its data does
    not fill exactly the bytes its header claims."""
    found = {}
    with zipfile.ZipFile(npz) as z:
        for info in z.infolist():
            if not info.filename.endswith(".npy"):
                raise ValueError(f"unexpected member {info.filename!r}")
            if info.compress_type != zipfile.ZIP_STORED or info.file_size > size:
                raise ValueError(f"{info.filename} is compressed or claims {info.file_size} bytes "
                                 "(numpy-attn train stores arrays uncompressed)")
            with z.open(info) as f:
                version = np.lib.format.read_magic(f)
                read = {(1, 0): np.lib.format.read_array_header_1_0,
                        (2, 0): np.lib.format.read_array_header_2_0}.get(version)
                if read is None:
                    raise ValueError(f"{info.filename}: .npy format version {version} not read here")
                shape, _, dtype = read(f)
                data = info.file_size - f.tell()
            if data != _nbytes(shape, dtype):
                raise ValueError(f"{info.filename} claims shape {tuple(shape)} {np.dtype(dtype)} "
                                 f"({_nbytes(shape, dtype)} bytes) but holds {data} bytes of data")
            found[info.filename[:-4]] = (tuple(shape), np.dtype(dtype))
    return found


def file_sha256(path):
    """The SHA-256 (hex) of the file ``path``'s content."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_checkpoint(path):
    """(params, config, vocab) from a run folder or its model.npz (config.json beside it).

    Raises ValueError, naming the file and what is wrong, when a file is missing, damaged or does
    not match the other. Nothing is allocated before the sizes config.json asks for have been
    checked against model.npz's size and headers.
    """
    folder = path if os.path.isdir(path) else os.path.dirname(path) or "."
    npz = os.path.join(path, CHECKPOINT) if os.path.isdir(path) else path
    config_path = os.path.join(folder, CONFIG)
    for file in (npz, config_path):
        if not os.path.isfile(file):
            raise ValueError(f"no {os.path.basename(file)} in {folder}: not a run folder of "
                             "numpy-attn train")
    if os.path.getsize(config_path) > _CONFIG_BYTES:
        raise ValueError(f"{config_path} is {os.path.getsize(config_path)} bytes, not a config.json "
                         f"of numpy-attn train (at most {_CONFIG_BYTES})")
    try:
        with open(config_path, encoding="utf-8") as f:
            meta = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{config_path} is not valid JSON ({err}); the run is damaged: train "
                         "again") from None
    config, dtype = _check_config(meta, config_path)
    expected = _expected_arrays(config, dtype)
    size = os.path.getsize(npz)
    need = sum(_nbytes(s, d) for s, d in expected.values())
    # np.savez adds a .npy header and two zip entries per array, about 300 bytes: far more over
    # the arrays is not this run's file, and is not parsed (a zip directory of millions of entries).
    if not need <= size <= need + _ARRAY_OVERHEAD * len(expected):
        raise ValueError(f"{npz} is damaged or not this run's: it is {size:,} bytes, and {config_path} "
                         f"describes {need:,} bytes of arrays ({config.n_layer} blocks of width "
                         f"{config.n_embd}, vocabulary {config.vocab_size}, {dtype.name}); train again")
    try:
        found = _headers(npz, size)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as err:
        raise ValueError(f"{npz} is damaged or not a numpy-attn checkpoint ({err}); train again") from None
    problems = [f"missing {k}" for k in expected if k not in found]
    problems += [f"unexpected {k}" for k in found if k not in expected]
    problems += [f"{k} has shape {found[k][0]} {found[k][1]}, the config needs {s} {d}"
                 for k, (s, d) in expected.items() if k in found and found[k] != (s, np.dtype(d))]
    if problems:
        raise ValueError(f"checkpoint {npz} does not match {CONFIG}: " + "; ".join(problems[:5]))
    if "model_sha256" in meta and (meta.get("model_bytes") != size or meta["model_sha256"] != file_sha256(npz)):
        raise ValueError(f"{npz} is damaged or from another run: its size or SHA-256 differs from "
                         f"what {config_path} records (a save cut off by a kill?); train again")
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
