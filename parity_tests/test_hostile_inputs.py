"""Hostile inputs at every boundary that reads a file or a config: one table of cases per boundary.

Boundaries (BOUNDARIES): a safetensors file (header and data), the sharded index
model.safetensors.index.json, a Hugging Face config.json, and a checkpoint of numpy-attn train
(config.json and model.npz). Each case starts from a small valid folder, damages one thing, and
expects a refusal of the boundary's error type whose message names the file and matches the
case's pattern (the field and the value found), for Hugging Face folders also through
``generate --hf`` without a traceback, without a hang (an alarm) and without an allocation the
input did not justify (tracemalloc's peak stays under PEAK_LIMIT, far below what the damaged field
asks for).

A new boundary cannot come in without cases: test_every_reading_function_has_cases lists the
functions of the reading modules that open or parse a file and fails for one READERS does not map
to a boundary of this file. Beyond the tables, two Hypothesis tests damage a safetensors file's
bytes anywhere and give config.json's keys any JSON value: the folder loads or is refused by name.

The valid folders are written by this file's own safetensors writer (8 bytes of header length, a
JSON header, the data), so that each hostile variant is built from the same parts.
"""

import ast
import contextlib
import io
import json
import os
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from attn_cli import checkpoint, cli, hf
from attn_cli.hf import CheckpointError, load_checkpoint
from numpy_attn._tree import leaves
from numpy_attn.gpt import GPTConfig, init_gpt_params
from parity_tests.model_kit import JSON, PEAK_LIMIT, assert_loads_or_names_folder, watch_allocations

ROOT = Path(__file__).resolve().parent.parent


# -- valid folders ------------------------------------------------------------------------------

GPT2 = {"architectures": ["GPT2LMHeadModel"], "vocab_size": 5, "n_positions": 4, "n_embd": 4,
        "n_layer": 0, "n_head": 2, "n_inner": None}
LLAMA = {"architectures": ["LlamaForCausalLM"], "vocab_size": 5, "hidden_size": 4, "intermediate_size": 6,
         "num_hidden_layers": 0, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 2,
         "max_position_embeddings": 8, "rms_norm_eps": 1e-5, "rope_parameters": {"rope_type": "default",
                                                                                  "rope_theta": 10000.0}}


def _gpt2_tensors():
    """A GPT-2 of no layers: embeddings and the final layer norm (tied head)."""
    rng = np.random.default_rng(0)
    return {"transformer.wte.weight": rng.normal(size=(5, 4)), "transformer.wpe.weight": rng.normal(size=(4, 4)),
            "transformer.ln_f.weight": np.ones(4), "transformer.ln_f.bias": np.zeros(4)}


def _llama_tensors():
    rng = np.random.default_rng(0)
    return {"model.embed_tokens.weight": rng.normal(size=(5, 4)), "model.norm.weight": np.ones(4),
            "lm_head.weight": rng.normal(size=(5, 4))}


def _layout(tensors, dtype="F32"):
    """(header dict, data bytes) of float tensors stored as ``dtype`` (F32, F64, or BF16: the top
    16 bits of each float32), one after another."""
    header, data = {}, b""
    for name, a in tensors.items():
        raw = np.asarray(a, "<f8" if dtype == "F64" else "<f4").tobytes()
        if dtype == "BF16":
            raw = (np.frombuffer(raw, "<u4") >> 16).astype("<u2").tobytes()
        header[name] = {"dtype": dtype, "shape": list(np.shape(a)), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    return header, data


def _pack(header, data, length=None):
    """The bytes of a safetensors file: 8-byte little-endian header length, header, data."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return (len(text) if length is None else length).to_bytes(8, "little") + text + data


def _folder(path, config=GPT2, tensors=None):
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    header, data = _layout(_gpt2_tensors() if tensors is None else tensors)
    (path / "model.safetensors").write_bytes(_pack(header, data))
    return path


def _sharded(path):
    """The GPT-2 folder split into two shards and an index, as save_pretrained writes large models."""
    _folder(path)
    (path / "model.safetensors").unlink()
    tensors = _gpt2_tensors()
    names = list(tensors)
    for i, part in enumerate((names[:2], names[2:])):
        header, data = _layout({n: tensors[n] for n in part})
        (path / f"model-0000{i + 1}-of-00002.safetensors").write_bytes(_pack(header, data))
    weight_map = {n: f"model-0000{1 + (n in names[2:])}-of-00002.safetensors" for n in names}
    _write_index(path, {"metadata": {}, "weight_map": weight_map})
    return path


def _write_index(path, index):
    (path / "model.safetensors.index.json").write_text(index if isinstance(index, str) else json.dumps(index))


def test_the_valid_folders_load(tmp_path):
    """The starting points of the cases load, so each case's refusal is its damage's doing."""
    kind, config, params = load_checkpoint(_folder(tmp_path / "gpt2"))
    assert kind == "gpt2" and params["wte"].shape == (5, 4), (kind, params["wte"].shape)
    np.testing.assert_array_equal(params["wte"], _gpt2_tensors()["transformer.wte.weight"].astype(np.float32))
    kind, _, params = load_checkpoint(_folder(tmp_path / "llama", LLAMA, _llama_tensors()))
    assert kind == "llama" and params["head"]["w"].shape == (4, 5), kind
    _, _, sharded = load_checkpoint(_sharded(tmp_path / "sharded"))
    np.testing.assert_array_equal(sharded["wpe"], _gpt2_tensors()["transformer.wpe.weight"].astype(np.float32))
    bf16 = _folder(tmp_path / "bf16")
    (bf16 / "model.safetensors").write_bytes(_pack(*_layout(_gpt2_tensors(), "BF16")))
    assert load_checkpoint(bf16)[2]["ln_f"]["w"].tolist() == [1.0] * 4, "bfloat16 ones widen to ones"
    kept = load_checkpoint(bf16, "bfloat16")[2]["ln_f"]["w"]
    assert kept.dtype.name == "bfloat16" and kept.tolist() == [1.0] * 4, "bfloat16 ones stay bfloat16 ones"


# -- boundary 1: a safetensors file, header and data (attn_cli.hf.files._header, _read_safetensors)

def _edit_header(edit):
    """A case: ``edit(header)`` changes the valid GPT-2 header in place; the data stays."""
    def make(header, data):
        edit(header)
        return _pack(header, data)
    return make


def _share_range(dtype):
    """ln_f.bias given ln_f.weight's bytes (same size), the data shortened to match."""
    def make(header, data):
        header, data = _layout(_gpt2_tensors(), dtype)
        header["transformer.ln_f.bias"]["data_offsets"] = header["transformer.ln_f.weight"]["data_offsets"]
        return _pack(header, data[:header["transformer.ln_f.weight"]["data_offsets"][1]])
    return make


def _with_bf16_inf():
    """The bfloat16 file with wpe[0, 0] = +inf (bits 0x7F80)."""
    header, data = _layout(_gpt2_tensors(), "BF16")
    begin = header["transformer.wpe.weight"]["data_offsets"][0]
    return header, data[:begin] + (0x7F80).to_bytes(2, "little") + data[begin + 2:]


def _huge():
    return np.full((5, 4), 1e300)         # finite in float64, +inf in float32


def _set(name, field, value):
    return _edit_header(lambda h: h[name].__setitem__(field, value))


WTE = "transformer.wte.weight"
HEADER_CASES = {
    "empty file": (lambda h, d: b"", r"is 0 bytes, too short for a safetensors file"),
    "shorter than the length field": (lambda h, d: b"\x05\x00", r"is 2 bytes, too short"),
    "header length 2^40": (lambda h, d: _pack(h, d, 2**40), r"header of 1,099,511,627,776 bytes does not fit"),
    "header length past the end": (lambda h, d: _pack(json.dumps(h).encode(), b"", len(json.dumps(h)) + 10),
                                   r"does not fit in the file's \d+ bytes after"),
    "header not JSON": (lambda h, d: _pack(b"{not json", d), r"\(its header\) is not valid JSON"),
    "header not UTF-8": (lambda h, d: _pack(b'{"\xff": 1}', d), r"\(its header\) is not valid JSON"),
    "header a list": (lambda h, d: _pack(b"[]", d), r"\(its header\) must hold a JSON object.*list"),
    "a tensor name twice": (lambda h, d: _pack(json.dumps(h).replace("}}", '}, "' + WTE + '": '
                                                                      + json.dumps(h[WTE]) + "}").encode(), d),
                            r"the key 'transformer.wte.weight' is given twice"),
    "a 5000-digit integer": (lambda h, d: _pack(json.dumps(h).replace("[5, 4]", "[" + "9" * 5000 + ", 4]").encode(),
                                                d), r"\(its header\) is not valid JSON"),
    "nesting 100000 deep": (lambda h, d: _pack(b"[" * 100000 + b"]" * 100000, d), r"is not valid JSON"),
    "dtype Q4": (_set(WTE, "dtype", "Q4"), r"tensor 'transformer.wte.weight': dtype 'Q4' is not read here"),
    "dtype not a string": (_set(WTE, "dtype", 4), r"'transformer.wte.weight': dtype 4 is not read here"),
    "shape (1e9, 1e9)": (_set(WTE, "shape", [10**9, 10**9]),
                         r"'transformer.wte.weight': shape \(1000000000, 1000000000\) of F32 takes "
                         r"4,000,000,000,000,000,000 bytes, but data_offsets \[0, 80\] hold 80"),
    "a negative size": (_set(WTE, "shape", [-5, -4]), r"'transformer.wte.weight': shape must be a list .* \[-5, -4\]"),
    "shape a string": (_set(WTE, "shape", "5x4"), r"shape must be a list of at most 32 sizes >= 0, got '5x4'"),
    "shape of 33 dimensions": (_set(WTE, "shape", [1] * 33), r"shape must be a list of at most 32 sizes"),
    "a size true": (_set(WTE, "shape", [True, 4]), r"shape must be a list .* got \[True, 4\]"),
    "offsets past the end": (_set(WTE, "data_offsets", [0, 10**12]),
                             r"'transformer.wte.weight': data_offsets must be \[begin, end\] with "
                             r"0 <= begin <= end <= 176 .* got \[0, 1000000000000\]"),
    "offsets reversed": (_set(WTE, "data_offsets", [80, 0]), r"data_offsets must be .* got \[80, 0\]"),
    "offsets not integers": (_set(WTE, "data_offsets", [0.0, 80.0]), r"data_offsets must be .* got \[0.0, 80.0\]"),
    "three offsets": (_set(WTE, "data_offsets", [0, 40, 80]), r"data_offsets must be .* got \[0, 40, 80\]"),
    "overlapping offsets": (_set("transformer.wpe.weight", "data_offsets", [72, 136]),
                            r"'transformer.wpe.weight' has data_offsets \[72, 136\], but the tensor before it "
                            r"ends at 80: .* without overlap"),
    "a gap between tensors": (lambda h, d: _pack({k: v for k, v in h.items() if k != "transformer.wpe.weight"}, d),
                              r"has data_offsets \[144, 160\], but the tensor before it ends at 80: .* without gap"),
    "bytes after the last tensor": (lambda h, d: _pack(h, d + b"\0" * 4),
                                    r"the tensors' bytes end at 176, but the file holds 180 bytes of data"),
    "an entry without data_offsets": (_edit_header(lambda h: h[WTE].pop("data_offsets")),
                                      r"'transformer.wte.weight' must have exactly dtype, shape and data_offsets"),
    "an entry with another field": (_set(WTE, "crc", 0), r"must have exactly dtype, shape and data_offsets"),
    "an entry that is a list": (_edit_header(lambda h: h.__setitem__(WTE, [0, 80])),
                                r"must have exactly dtype, shape and data_offsets, got \[0, 80\]"),
    "a NaN weight": (lambda h, d: _pack(h, np.float32(np.nan).tobytes() + d[4:]),
                     r"tensor 'transformer.wte.weight' holds NaN or infinite values"),
    "an infinite bfloat16 weight": (lambda h, d: _pack(*_with_bf16_inf()),
                                    r"tensor 'transformer.wpe.weight' holds NaN or infinite values"),
    "a float64 weight beyond float32's range": (lambda h, d: _pack(*_layout({**_gpt2_tensors(), WTE: _huge()}, "F64")),
                                                r"tensor 'transformer.wte.weight' holds values beyond the range of "
                                                r"float32; load it as float64"),
    "two float32 tensors on the same bytes": (_share_range("F32"),
                                              r"'transformer.ln_f.(weight|bias)' has data_offsets .* without overlap"),
    "two bfloat16 tensors on the same bytes": (_share_range("BF16"),
                                               r"'transformer.ln_f.(weight|bias)' has data_offsets .* without overlap"),
}


# -- boundary 2: the sharded index (attn_cli.hf.files._safetensors_files) ----------------------

SHARD_1 = "model-00001-of-00002.safetensors"


def _weight_map(edit):
    def make(folder):
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        edit(index["weight_map"])
        _write_index(folder, index)
    return make


def _name_shard(name, create=None):
    """Every tensor of shard 1 mapped to ``name``; ``create(path)`` makes what it names."""
    def make(folder):
        if create is not None:
            create(folder / name)
        _weight_map(lambda m: m.update({k: name for k, v in m.items() if v == SHARD_1}))(folder)
    return make


def _fifo(path):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this system")
    os.mkfifo(path)


def _too_long(name):
    """A case: the JSON file ``name`` padded with spaces to 2,000 bytes, JSON_LIMIT lowered to 1,000."""
    def make(folder, monkeypatch):
        path = folder / name
        path.write_text(path.read_text().ljust(2000))
        monkeypatch.setattr(hf.files, "JSON_LIMIT", 1000)
    make.needs_monkeypatch = True
    return make


INDEX_CASES = {
    "no weight_map": (lambda f: _write_index(f, {"metadata": {}}), r"weight_map must be a non-empty object.*None"),
    "weight_map a list": (lambda f: _write_index(f, {"weight_map": [SHARD_1]}),
                          r"weight_map must be a non-empty object.*\['model-00001"),
    "weight_map empty": (lambda f: _write_index(f, {"weight_map": {}}), r"weight_map must be a non-empty object"),
    "a file name not a string": (_weight_map(lambda m: m.update({WTE: 1})), r"weight_map must be a non-empty object"),
    "the index a FIFO": (lambda f: ((f / "model.safetensors.index.json").unlink(),
                                    _fifo(f / "model.safetensors.index.json")), r"index.json is not a regular file"),
    "model.safetensors a FIFO": (lambda f: ((f / "model.safetensors.index.json").unlink(),
                                            _fifo(f / "model.safetensors")),
                                 r"model.safetensors is not a regular file"),
    "names a FIFO": (_name_shard("pipe.safetensors", _fifo), r"names 'pipe.safetensors', which is not a regular file"),
    "names a folder": (_name_shard("dir.safetensors", Path.mkdir),
                       r"names 'dir.safetensors', which is not a regular file"),
    "names a missing file": (_name_shard("gone.safetensors"), r"names 'gone.safetensors', which is not a regular"),
    "names a file above the folder": (_name_shard("../model.safetensors"),
                                      r"names '../model.safetensors', not a file name in"),
    "names an absolute path": (_name_shard("/dev/zero"), r"names '/dev/zero', not a file name in"),
    "names a file in a subfolder": (_name_shard("sub/x.safetensors"), r"names 'sub/x.safetensors', not a file name"),
    "index not JSON": (lambda f: _write_index(f, "{"), r"model.safetensors.index.json is not valid JSON"),
    "index a list": (lambda f: _write_index(f, "[]"), r"index.json must hold a JSON object"),
    "index larger than JSON_LIMIT": (_too_long("model.safetensors.index.json"),
                                     r"index.json is 2,000 bytes, more than the 1,000"),
    "a tensor in two shards": (lambda f: (f / "model-00002-of-00002.safetensors").write_bytes(
        _pack(*_layout({WTE: np.zeros((5, 4)), "transformer.ln_f.weight": np.ones(4),
                        "transformer.ln_f.bias": np.zeros(4)}))),
        r"tensor 'transformer.wte.weight' is in both model-00001-of-00002.safetensors and model-00002"),
}


# -- boundary 3: a Hugging Face config.json (attn_cli.hf.read_config, check_config) -----------

def _config(base, **changes):
    """A case: config.json is ``base`` with ``changes`` (a value DROP removes the key)."""
    def make(folder):
        config = {k: v for k, v in {**base, **changes}.items() if v is not DROP}
        if base is LLAMA:
            _folder(folder, config, _llama_tensors())
        else:
            (folder / "config.json").write_text(json.dumps(config))
    return make


DROP = object()


def _config_text(text):
    def make(folder):
        (folder / "config.json").write_bytes(text if isinstance(text, bytes) else text.encode())
    return make


CONFIG_CASES = {
    "a list": (_config_text("[1, 2]"), r"config.json must hold a JSON object \{...\}, got list \[1, 2\]"),
    "not JSON": (_config_text("{'vocab_size': 5}"), r"config.json is not valid JSON"),
    "not UTF-8": (_config_text(b'{"vocab_size": "\xe9"}'), r"config.json is not valid JSON"),
    "a key twice": (_config_text('{"n_embd": 4, "n_embd": 8}'), r"config.json: the key 'n_embd' is given twice"),
    "larger than JSON_LIMIT": (_too_long("config.json"), r"config.json is 2,000 bytes, more than the 1,000"),
    "a FIFO": (lambda f: ((f / "config.json").unlink(), _fifo(f / "config.json")),
               r"config.json is not a regular file \(a FIFO, device or folder\)"),
    "a folder": (lambda f: ((f / "config.json").unlink(), (f / "config.json").mkdir()),
                 r"config.json is not a regular file"),
    "architectures a string": (_config(GPT2, architectures="GPT2LMHeadModel"),
                               r"config.json: architectures must be a list of names.*'GPT2LMHeadModel'"),
    "no n_embd": (_config(GPT2, n_embd=DROP), r"config.json: the key 'n_embd' is missing \(int"),
    "no hidden_size": (_config(LLAMA, hidden_size=DROP), r"config.json: the key 'hidden_size' is missing"),
    "rms_norm_eps null": (_config(LLAMA, rms_norm_eps=None),
                          r"config.json: rms_norm_eps must be a number >= 0, got None"),
    "n_head a string": (_config(GPT2, n_head="2"), r"config.json: n_head must be an int >= 1, got '2'"),
    "n_layer true": (_config(GPT2, n_layer=True), r"config.json: n_layer must be an int >= 0, got True"),
    "n_head 0": (_config(GPT2, n_head=0), r"config.json: n_head must be an int >= 1, got 0"),
    "layer_norm_epsilon NaN": (_config_text(json.dumps({**GPT2, "layer_norm_epsilon": float("nan")})),
                               r"config.json: layer_norm_epsilon must be a number >= 0, got nan"),
    "max_position_embeddings 1e10 (a float)": (_config(LLAMA, max_position_embeddings=1e10),
                                               r"max_position_embeddings must be an int >= 1, got 10000000000.0"),
    "tie_word_embeddings 'yes'": (_config(LLAMA, tie_word_embeddings="yes"),
                                  r"tie_word_embeddings must be a bool, got 'yes'"),
    "rope factor a string": (_config(LLAMA, rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": "2"}),
                             r"config.json: rope_parameters.factor must be a number >= 0, got '2'"),
    # The lower bounds: GPT-2 (V + P + 2) C + L (4 C^2 + 4 C), Llama (V + 1) C + L (2 C hs (nh + nkv) + 3 C H + 2 C).
    "n_embd 1000000": (_config(GPT2, n_embd=1_000_000, n_layer=1),
                       r"config.json describes at least 4,000,015,000,000 parameters \(14.6 TiB in float32\), but "
                       r"the safetensors files hold 44 values"),
    "vocab_size 10^12": (_config(GPT2, vocab_size=10**12), r"describes at least 4,000,000,000,024 parameters"),
    "n_positions 10^10": (_config(GPT2, n_positions=10**10), r"describes at least 40,000,000,028 parameters"),
    "num_hidden_layers 10^6": (_config(LLAMA, num_hidden_layers=10**6), r"describes at least 128,000,024 param"),
    "head_dim 10^12 (a rope table of terabytes)": (_config(LLAMA, head_dim=10**12),
                                                   r"config.json: head_dim = 1,000,000,000,000 is more than the "
                                                   r"65,536 read here"),
    "activation_function relu": (_config(GPT2, activation_function="relu"),
                                 r"config.json: activation_function 'relu' is not supported"),
    "n_embd not a multiple of n_head": (_config(GPT2, n_head=3), r"config.json: n_embd = 4 is not divisible by n_head"),
    "an odd head size": (_config(LLAMA, head_dim=3, num_attention_heads=4, num_key_value_heads=2),
                         r"config.json: the head size must be even"),
    "llama3 rope without factor": (_config(LLAMA, rope_parameters={"rope_type": "llama3", "rope_theta": 1e4}),
                                   r"config.json: llama3 scaling needs factor > 0, got None"),
}


# -- boundary 4: a checkpoint of numpy-attn train (attn_cli.checkpoint.load_checkpoint) ------

def _run(folder):
    config = GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=4)
    checkpoint.save_checkpoint(str(folder), init_gpt_params(config, np.random.default_rng(0)), config,
                               np.arange(5) * 7, np.float32, {"steps": 1})


def _run_meta(edit):
    def make(folder):
        meta = json.loads((folder / "config.json").read_text())
        edit(meta)
        (folder / "config.json").write_text(json.dumps(meta))
    return make


TRAIN_CASES = {
    "config.json a list": (lambda f: (f / "config.json").write_text("[]"), r"no \"gpt\" settings"),
    "config.json not JSON": (lambda f: (f / "config.json").write_text("{"), r"config.json is not valid JSON"),
    "n_embd a string": (_run_meta(lambda m: m["gpt"].update(n_embd="4")), r"gpt.n_embd must be int, got '4'"),
    "vocab_size 10^12": (_run_meta(lambda m: m["gpt"].update(vocab_size=10**12)), r"gpt.vocab_size = 10+ is out of"),
    "model.npz cut short": (lambda f: (f / "model.npz").write_bytes((f / "model.npz").read_bytes()[:100]),
                            r"model.npz is damaged"),
    "model.npz not a zip": (lambda f: (f / "model.npz").write_bytes(b"PK not a zip"), r"model.npz is damaged"),
    "no model.npz": (lambda f: (f / "model.npz").unlink(), r"no model.npz in"),
}


def _fifo(path):
    os.mkfifo(path)


# What train finds in an existing --out before it writes: a config.json that no run wrote (or that
# cannot be read without hanging) makes the folder foreign, refused even with --force.
OUT_CASES = {
    "config.json a FIFO": (lambda f: _fifo(f / "config.json"), r"config.json, which is not a regular file"),
    "config.json a folder": (lambda f: (f / "config.json").mkdir(), r"config.json, which is not a regular file"),
    "config.json a list": (lambda f: (f / "config.json").write_text("[]"), r"no config.json of numpy-attn train"),
    "config.json not JSON": (lambda f: (f / "config.json").write_text("{"), r"no config.json of numpy-attn train"),
    "config.json not UTF-8": (lambda f: (f / "config.json").write_bytes(b"\xff\xfe{}"),
                              r"no config.json of numpy-attn train"),
    "config.json 100 MB": (lambda f: (f / "config.json").write_bytes(b" " * (100 << 20)),
                           r"no config.json of numpy-attn train"),
    "model.npz beside no config": (lambda f: (f / "model.npz").write_bytes(b"user data"),
                                   r"no config.json of numpy-attn train"),
    "model.npz a FIFO": (lambda f: _fifo(f / "model.npz"), r"model.npz, which is not a regular file"),
}


# -- the boundaries and their cases ------------------------------------------------------------

BOUNDARIES = {
    "safetensors file": HEADER_CASES,
    "sharded index": INDEX_CASES,
    "Hugging Face config.json": CONFIG_CASES,
    "train checkpoint": TRAIN_CASES,
    "train --out folder": OUT_CASES,
}
# Every function of the reading modules that opens or parses a file, and the boundary whose cases
# reach it. A function added to these modules that reads a file must be named here (and so get
# cases), or test_every_reading_function_has_cases fails.
# Every module of attn_cli/hf is read: files.py reads the files, and a family's reader must not.
READING_MODULES = (*sorted(f"attn_cli/hf/{p.name}" for p in (ROOT / "attn_cli" / "hf").glob("*.py")),
                   "attn_cli/checkpoint.py")
READERS = {
    "attn_cli/hf/files.py:_read_json": ("Hugging Face config.json", "sharded index"),
    "attn_cli/hf/files.py:_parse_json": ("Hugging Face config.json", "sharded index", "safetensors file"),
    "attn_cli/hf/files.py:_header": ("safetensors file",),
    "attn_cli/hf/files.py:_read_safetensors": ("safetensors file",),
    "attn_cli/checkpoint.py:_headers": ("train checkpoint",),
    "attn_cli/checkpoint.py:load_checkpoint": ("train checkpoint",),
    "attn_cli/checkpoint.py:file_sha256": ("train checkpoint",),
    "attn_cli/checkpoint.py:is_run_config": ("train --out folder",),
    "attn_cli/checkpoint.py:_keep": ("train --out folder",),
}
READ_CALLS = {"open", "read_text", "read_bytes", "load", "loads", "memmap", "ZipFile", "fromfile"}


def _reading_functions():
    """'path:function' of each function in READING_MODULES that calls one of READ_CALLS (open()
    only when not for writing: a mode without "r" writes; os.open, which these modules use only for
    a folder's descriptor or a new file, reads no content)."""
    found = set()
    for module in READING_MODULES:
        tree = ast.parse((ROOT / module).read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef):
                continue
            for call in ast.walk(node):
                if not isinstance(call, ast.Call):
                    continue
                name = getattr(call.func, "attr", getattr(call.func, "id", None))
                if name == "open" and getattr(call.func, "value", None) is not None and getattr(
                        call.func.value, "id", None) == "os":
                    continue
                mode = call.args[1].value if name == "open" and len(call.args) > 1 and isinstance(
                    call.args[1], ast.Constant) else "r"
                if name in READ_CALLS and "r" in mode:
                    found.add(f"{module}:{node.name}")
    return found


def test_every_reading_function_has_cases():
    readers = _reading_functions()
    assert readers == set(READERS), (f"reading functions without a boundary in READERS: "
                                     f"{sorted(readers - set(READERS))}; named but no longer reading: "
                                     f"{sorted(set(READERS) - readers)}")
    empty = [b for names in READERS.values() for b in names if not BOUNDARIES.get(b)]
    assert not empty, f"boundaries without cases: {empty}"
    print("hostile cases per boundary:", {b: len(cases) for b, cases in BOUNDARIES.items()})


def _cases(table):
    return [pytest.param(make, pattern, id=name) for name, (make, pattern) in table.items()]


def assert_refused(load, folder, named, pattern, error=CheckpointError):
    """``load(folder)`` raises ``error``, naming ``named`` and matching ``pattern``, within
    PEAK_LIMIT bytes; the command line says the same in one line, exit status 2."""
    with watch_allocations() as peak, pytest.raises(error) as caught:
        load(folder)
    message = str(caught.value)
    assert str(named) in message, f"the message does not name {named}: {message}"
    assert re.search(pattern, message), f"{message!r} does not match {pattern!r}"
    assert peak[0] < PEAK_LIMIT, f"{peak[0]:,} bytes allocated before the refusal: {message}"
    return message


def assert_cli_refuses(argv, message):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = cli.main(argv)
    assert status == 2 and message in err.getvalue() and "Traceback" not in err.getvalue(), (status, err.getvalue())


def assert_hf_case_refused(folder, monkeypatch, make, pattern, named, dtype="float32"):
    """Damage the valid folder with ``make``; load_checkpoint and generate --hf refuse it, loading
    the params in ``dtype``."""
    make(folder, monkeypatch) if getattr(make, "needs_monkeypatch", False) else make(folder)
    message = assert_refused(lambda f: load_checkpoint(f, dtype), folder, named(folder), pattern)
    assert_cli_refuses(["generate", "--hf", str(folder), "--ids", "1", "--dtype", dtype], message)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("make, pattern", _cases(HEADER_CASES))
def test_safetensors_header(tmp_path, monkeypatch, make, pattern, dtype):
    """Loaded in float32 or in bfloat16 (the BF16 files' bits kept as read), each damage is refused
    alike, before its allocation: float64's 1e300 lies beyond either dtype's range."""
    def damage(folder):
        (folder / "model.safetensors").write_bytes(make(*_layout(_gpt2_tensors())))

    # The conversion to dtype comes after the files are read, so its refusal names the folder.
    assert_hf_case_refused(_folder(tmp_path / "model"), monkeypatch, damage,
                           pattern.replace("range of float32", f"range of {dtype}"),
                           lambda f: f if "beyond the range" in pattern else f / "model.safetensors", dtype)


@pytest.mark.parametrize("make, pattern", _cases(INDEX_CASES))
def test_sharded_index(tmp_path, monkeypatch, make, pattern):
    assert_hf_case_refused(_sharded(tmp_path / "model"), monkeypatch, make, pattern, lambda f: f)


@pytest.mark.parametrize("make, pattern", _cases(CONFIG_CASES))
def test_hugging_face_config(tmp_path, monkeypatch, make, pattern):
    assert_hf_case_refused(_folder(tmp_path / "model"), monkeypatch, make, pattern,
             lambda f: f if "no config.json" in pattern else f / "config.json")


@pytest.mark.parametrize("make, pattern", _cases(TRAIN_CASES))
def test_train_checkpoint(tmp_path, make, pattern):
    folder = tmp_path / "run"
    _run(folder)
    make(folder)
    assert_refused(lambda f: checkpoint.load_checkpoint(str(f)), folder, folder, pattern, ValueError)


@pytest.mark.parametrize("make, pattern", _cases(OUT_CASES))
def test_train_out_folder(tmp_path, make, pattern):
    """A foreign file where a run file goes is refused even with --force, naming --out, at once
    (a FIFO is never opened)."""
    out = tmp_path / "out"
    out.mkdir()
    make(out)
    before = sorted(os.listdir(out))
    assert_refused(lambda f: checkpoint.check_out(str(f), force=True), out, out, pattern, ValueError)
    assert sorted(os.listdir(out)) == before, "check_out changed the folder"


# -- beyond the tables: any damage -----------------------------------------------------------

@given(edits=st.lists(st.tuples(st.integers(0, 2**16), st.integers(0, 255)), max_size=6),
       cut=st.none() | st.integers(0, 2**16), bfloat16=st.booleans(), dtype=st.sampled_from(hf.LOAD_DTYPES))
@example(edits=[(0, 255)], cut=None, bfloat16=False, dtype="float32")   # a header length of 255 + the real one
@example(edits=[], cut=300, bfloat16=True, dtype="bfloat16")           # cut inside the data
@example(edits=[(354, 0x48)], cut=None, bfloat16=True, dtype="float16")  # wte[0, 0] >= 2^17, beyond float16
def test_any_damage_to_a_safetensors_file_loads_or_is_refused(edits, cut, bfloat16, dtype):
    """Bytes overwritten anywhere (the header holds most of the file) and the file cut short,
    loaded in any dtype: the folder loads, or a CheckpointError names the file or folder; no other
    exception, and no infinity loaded."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = _folder(Path(tmp))
        data = bytearray(_pack(*_layout(_gpt2_tensors(), "BF16" if bfloat16 else "F32")))
        for position, value in edits:
            data[position % len(data)] = value
        (folder / "model.safetensors").write_bytes(bytes(data[:cut]))
        try:
            params = load_checkpoint(folder, dtype)[2]
        except CheckpointError as err:
            assert str(folder) in str(err), err
        else:
            assert all(np.isfinite(a.astype(np.float32)).all() for _, a in leaves(params)), "an infinity loaded"


ROPE = st.dictionaries(st.sampled_from(["rope_type", "type", *hf.ROPE_KEYS]),
                       st.sampled_from(["default", "linear", "llama3", "yarn"]) | JSON, max_size=5)


@given(base=st.sampled_from(["GPT2LMHeadModel", "LlamaForCausalLM"]), data=st.data())
def test_any_config_value_loads_or_is_refused(base, data):
    """One to three keys of a valid config.json given any JSON value (sizes of any magnitude,
    null, strings, nested objects; rope objects with any keys of theirs): the folder loads, or a
    CheckpointError names config.json (or, for a size that changes a tensor's shape, the tensor)."""
    config, tensors = (GPT2, None) if base == "GPT2LMHeadModel" else (LLAMA, _llama_tensors())
    keys = sorted(hf.CONFIG_KEYS[base])
    changes = data.draw(st.dictionaries(st.sampled_from(keys), JSON, min_size=1, max_size=3), label="changes")
    if base == "LlamaForCausalLM" and data.draw(st.booleans(), label="rope"):
        changes[data.draw(st.sampled_from(["rope_parameters", "rope_scaling"]))] = data.draw(ROPE, label="rope dict")
    with tempfile.TemporaryDirectory() as tmp:
        folder = _folder(Path(tmp), {**config, **changes}, tensors)
        assert_loads_or_names_folder(folder, changes)
