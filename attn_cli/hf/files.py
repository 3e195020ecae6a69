"""Reading a Hugging Face folder's files, each checked before it is trusted: config.json and the
shard index (JSON), and the safetensors files (their headers, then their tensors).

Hostile files. A folder may come from anywhere, so nothing in it is trusted before it is checked,
and every check comes before the allocation it guards: each file named is a regular file of the
folder (a FIFO would block the read forever); a JSON file is at most JSON_LIMIT bytes and holds an
object without repeated keys; a safetensors header's length is compared with the file's size
before it is read, and each tensor's dtype, shape and byte range with the format and the file
before any data is. The safetensors files are parsed here rather than by the ``safetensors``
package, so that every file, whatever its dtypes, passes the same checks, and every refusal is a
CheckpointError naming the file, the tensor or key, and the value found.

Tensors are read in their stored dtype (BF16 as ml_dtypes' bfloat16, the 16 bits as stored) and
converted to the dtype asked for (``_Tensors.take``): a tensor already of that dtype is used as
read, so a float32 file loaded as float32, or a bfloat16 file as bfloat16, holds its data once
(the process's own memory, not a map of the file); any other conversion rounds once, and a value
beyond the range of the dtype (above float16's 65504, say) is refused naming the tensor rather
than loaded as inf.
"""

import json
import math
from pathlib import Path
from typing import NamedTuple

import ml_dtypes
import numpy as np

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
# The kinds of JSON value a header field or config.json key may be, by name (config.py's rules).
KINDS = {"int": lambda v: isinstance(v, int) and not isinstance(v, bool),
         "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v),
         "bool": lambda v: isinstance(v, bool), "str": lambda v: isinstance(v, str),
         "object": lambda v: isinstance(v, dict)}


class CheckpointError(ValueError):
    """A checkpoint folder this loader cannot read: the message names the file or tensor."""



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
        """Forget a tensor that may be present and is not needed (GPT-2's stored causal mask)."""
        self.left.pop(name, None)

    def head(self, name, wte, tied):
        """The head (C, V) the file holds as ``name`` (V, C), or None where the embedding ``wte``
        (V, C) serves: a tied config whose file omits the head or repeats the embedding. A tied
        config whose file holds a head of other values gets that head, as transformers does (it
        ties the two only where they are equal), rather than losing the file's head unseen."""
        if tied and name not in self.left:
            return None
        head = self.take(name, wte.shape)
        return None if tied and np.array_equal(head, wte) else head.T.copy()   # (V, C) -> (C, V)

    def finish(self):
        if self.left:
            names = sorted(self.left)
            more = f" and {len(names) - 5} more" if len(names) > 5 else ""
            raise CheckpointError(f"{self.folder}: unexpected tensors {names[:5]}{more} "
                                  "(not part of the model config.json describes)")
