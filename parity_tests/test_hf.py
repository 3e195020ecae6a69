"""Hugging Face checkpoints in NumPy: attn_cli/hf.py reads folders that transformers saved.

No download: each test builds a small random GPT2LMHeadModel or LlamaForCausalLM, saves it with
``save_pretrained`` (safetensors) into a temporary folder, loads the folder with attn_cli.hf, and
compares the logits of numpy_attn (gpt.py, llama.py) with transformers', and the gradients of the
cross-entropy loss (NumPy's hand-written backward and the torch twin's autograd) with
transformers' autograd.

Tolerances.
- float64: the logits within 1e-10 of the largest logit (relative), gradients likewise relative to
  the largest gradient of the model (some are zero but for rounding: the key bias's, since adding
  q . b_k to every score of a row leaves its softmax unchanged). Both programs compute in float64 (Llama's RMS norm and
  rotary angles are moved to float64 by model_kit.exact_hf_llama, as transformers computes them
  in float32 whatever the model's dtype); what remains is reordered rounding, about 1e-15.
- float32: transformers runs unchanged. Two float32 programs that round differently differ by a
  few ulps (2^-24 = 6e-8) per operation; each layer norm or RMS norm multiplies its input's error
  by its rstd (see helpers.layer_norm_tol), and a logit sums C products whose terms may cancel:
  rtol 1e-4 * max rstd and an atol of 1e-5 * max rstd times the largest |value| compared,
  the project's float32 tolerance applied to the scale of the logits (measured: below 1e-6).
"""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers
from safetensors.numpy import load_file, save_file

from attn_cli.hf import CheckpointError, load_checkpoint
from numpy_attn._tree import flatten
from numpy_attn.gpt import gpt_backward, gpt_forward
from numpy_attn.llama import llama_backward, llama_forward
from numpy_attn.loss import cross_entropy_backward, cross_entropy_forward
from parity_tests.helpers import (
    BFLOAT16,
    LOW_DTYPES,
    assert_close,
    assert_error_budget,
    to_numpy,
    to_torch,
    tree_map,
    tree_to_torch,
)
from parity_tests.model_kit import (
    LLAMA3,
    compare,
    exact_hf_llama,
    hf_gpt2_model,
    hf_llama_model,
    hf_logits_and_grads,
    random_ids,
    randomise,
    save,
    to_hf_names,
)
from torch_attn.gpt import gpt
from torch_attn.llama import llama


def _loss(logits, ids):
    """Next-token cross-entropy (torch): logits (B, T, V) at t predict ids at t + 1."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


# -- GPT-2 ------------------------------------------------------------------------------------------


def _gpt2_hf_grads_as_ours(model, config):
    """transformers' parameter gradients in our names: c_attn split into q, k, v."""
    grads = {k: to_numpy(p.grad) for k, p in model.named_parameters()}
    C = config.n_embd
    out = {"wte": grads["transformer.wte.weight"], "wpe": grads["transformer.wpe.weight"],
           "ln_f.w": grads["transformer.ln_f.weight"], "ln_f.b": grads["transformer.ln_f.bias"]}
    if not config.tie_weights:
        out["head.w"] = grads["lm_head.weight"].T
    for i in range(config.n_layer):
        h = f"transformer.h.{i}."
        for j, name in enumerate("qkv"):
            out[f"blocks.{i}.attn.{name}.w"] = grads[h + "attn.c_attn.weight"][:, j * C:(j + 1) * C]
            out[f"blocks.{i}.attn.{name}.b"] = grads[h + "attn.c_attn.bias"][j * C:(j + 1) * C]
        pairs = {"attn.o": "attn.c_proj", "ffn.fc": "mlp.c_fc", "ffn.proj": "mlp.c_proj",
                 "ln1": "ln_1", "ln2": "ln_2"}
        for ours, theirs in pairs.items():
            out[f"blocks.{i}.{ours}.w"] = grads[h + theirs + ".weight"]
            out[f"blocks.{i}.{ours}.b"] = grads[h + theirs + ".bias"]
    return out


def _flat(tree):
    return flatten(tree)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("tie", [True, False])
def test_gpt2_checkpoint_matches_transformers(tmp_path, tie, dtype):
    model = hf_gpt2_model(tie, dtype)
    kind, config, params = load_checkpoint(save(model, tmp_path), dtype)
    assert kind == "gpt2" and config.gelu == "tanh" and config.tie_weights == tie, config
    ids = random_ids(config.vocab_size)
    logits, cache = gpt_forward(ids, params, config)
    hf_logits = model(input_ids=to_torch(ids)).logits
    rstds = [cache.ln_f[1]] + [r for c in cache.blocks for r in (c.ln1[1], c.ln2[1])]
    err = compare(f"gpt2 checkpoint logits (tied={tie})", logits, to_numpy(hf_logits), dtype, rstds)
    print(f"gpt2 {np.dtype(dtype)} tied={tie}: largest logit difference {err:.2e}")
    # Gradients of the loss: transformers' autograd, the twin's autograd, our backward.
    _loss(hf_logits, to_torch(ids)).backward()
    theirs = _gpt2_hf_grads_as_ours(model, config)
    tparams = tree_to_torch(params, requires_grad=True)
    _loss(gpt(to_torch(ids), tparams, config), to_torch(ids)).backward()
    twin = {k: to_numpy(v.grad) for k, v in _flat(tparams).items()}
    loss, loss_cache = cross_entropy_forward(logits[:, :-1], ids[:, 1:])
    dlogits = np.zeros_like(logits)
    dlogits[:, :-1] = cross_entropy_backward(np.ones((), logits.dtype), loss_cache)
    ours = _flat(gpt_backward(dlogits, cache))
    assert ours.keys() == theirs.keys() == twin.keys(), (sorted(ours), sorted(theirs))
    scale = max(float(np.abs(g).max()) for g in theirs.values())
    for name, g in theirs.items():
        compare(f"gpt2 checkpoint d{name} (twin)", twin[name], g, dtype, rstds, scale)
        compare(f"gpt2 checkpoint d{name} (backward)", ours[name], g, dtype, rstds, scale)


def test_gpt2_original_release_layout(tmp_path):
    """The original GPT-2 files name tensors without "transformer." and store the causal-mask
    buffers h.N.attn.bias: both are read."""
    model = hf_gpt2_model(True, np.float64)
    save(model, tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    renamed = {k.removeprefix("transformer."): v for k, v in tensors.items()}
    for i in range(model.config.n_layer):
        renamed[f"h.{i}.attn.bias"] = np.tril(np.ones((1, 1, 9, 9), np.float32))
    save_file(renamed, str(tmp_path / "model.safetensors"))
    _, config, params = load_checkpoint(tmp_path, np.float64)
    assert len(params["blocks"]) == model.config.n_layer, sorted(params["blocks"])
    ids = random_ids(config.vocab_size)
    logits = gpt_forward(ids, params, config)[0]
    expected = to_numpy(model(input_ids=to_torch(ids)).logits)
    assert logits.shape == expected.shape, (logits.shape, expected.shape)
    compare("gpt2 original layout logits", logits, expected, np.float64)


# -- Llama ------------------------------------------------------------------------------------------

LINEAR = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}
DEFAULT = {"rope_type": "default", "rope_theta": 10000.0}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("rope, tie, bias", [(LLAMA3, False, False), (LINEAR, True, False),
                                             (DEFAULT, False, True)])
def test_llama_checkpoint_matches_transformers(tmp_path, rope, tie, bias, dtype):
    """Grouped-query heads (4 on 2), head size 8 for C = 16, two layers; llama3 scaling with an
    original context of 4 so that all three bands act on 7 positions."""
    model = hf_llama_model(rope, tie, bias, dtype)
    kind, config, params = load_checkpoint(save(model, tmp_path), dtype)
    assert kind == "llama" and config.n_kv_head == 2 and config.tie_weights == tie, config
    if dtype == np.float64:
        model = exact_hf_llama(model, config)
    ids = random_ids(config.vocab_size)
    logits, cache = llama_forward(ids, params, config)
    rstds = [cache.norm[1]] + [r for c in cache.blocks for r in (c.attn_norm[1], c.mlp_norm[1])]
    loss, loss_cache = cross_entropy_forward(logits[:, :-1], ids[:, 1:])
    dlogits = np.zeros_like(logits)
    dlogits[:, :-1] = cross_entropy_backward(np.ones((), logits.dtype), loss_cache)
    hf_logits, theirs = hf_logits_and_grads(model, ids, None, dlogits)
    label = f"llama checkpoint ({rope['rope_type']}, tied={tie}, bias={bias})"
    err = compare(f"{label} logits", logits, hf_logits, dtype, rstds)
    print(f"llama {np.dtype(dtype)} {rope['rope_type']} tied={tie}: largest logit difference {err:.2e}")
    tparams = tree_to_torch(params, requires_grad=True)
    (llama(to_torch(ids), tparams, config) * to_torch(dlogits)).sum().backward()
    twin = to_hf_names(tree_map_grad(tparams), config)
    ours = to_hf_names(llama_backward(dlogits, cache), config)
    assert ours.keys() == theirs.keys(), (sorted(ours), sorted(theirs))
    scale = max(float(np.abs(g).max()) for g in theirs.values())
    for name, g in theirs.items():
        compare(f"{label} d{name} (twin)", twin[name], g, dtype, rstds, scale)
        compare(f"{label} d{name} (backward)", ours[name], g, dtype, rstds, scale)


def tree_map_grad(tree):
    return tree_map(lambda t: to_numpy(t.grad), tree)


def test_bfloat16_checkpoint_is_widened_exactly(tmp_path):
    """safetensors.numpy cannot hold bfloat16; the loader widens it to float32 bit by bit."""
    model = hf_llama_model(DEFAULT, True, False, np.float32).to(torch.bfloat16)
    _, config, params = load_checkpoint(save(model, tmp_path), np.float32)
    expected = to_numpy(model.model.layers[0].self_attn.k_proj.weight.float()).T
    assert_close("bfloat16 k_proj widened", params["blocks"]["0"]["attn"]["k"]["w"], expected, rtol=0, atol=0)


def _bits(a):
    """The 16 bits of each value of a bfloat16 or float16 array, to compare values exactly."""
    return np.asarray(a).view(np.uint16)


def test_bfloat16_checkpoint_loads_as_bfloat16_bit_for_bit(tmp_path):
    """dtype="bfloat16" keeps every stored bfloat16 as it is (no widening and rounding back): each
    parameter equals transformers' bfloat16 one bit for bit (k_proj, transposed to (C_in, C_out))."""
    model = hf_llama_model(DEFAULT, False, True, np.float32).to(torch.bfloat16)
    _, config, params = load_checkpoint(save(model, tmp_path), "bfloat16")
    assert {a.dtype for a in _flat(params).values()} == {BFLOAT16}, {a.dtype for a in _flat(params).values()}
    theirs = {k: to_numpy(p) for k, p in model.named_parameters()}
    ours = to_hf_names(params, config)
    assert ours.keys() == theirs.keys(), (sorted(ours), sorted(theirs))
    for name, expected in theirs.items():
        np.testing.assert_array_equal(_bits(ours[name]), _bits(expected), err_msg=f"{name} changed on loading")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_float32_checkpoint_is_rounded_once_to_a_low_dtype(tmp_path, dtype):
    """A float32 file loaded as bfloat16 or float16: each value rounded once, to nearest, from the
    stored float32 (what ml_dtypes' and NumPy's casts do); every parameter, bit for bit."""
    folder = save(hf_llama_model(LLAMA3, False, True, np.float32), tmp_path)
    _, _, wide = load_checkpoint(folder, np.float32)
    low = _flat(load_checkpoint(folder, dtype)[2])
    for name, a in _flat(wide).items():
        expected = a.astype(LOW_DTYPES[dtype][0])
        assert low[name].dtype == expected.dtype, (name, low[name].dtype)
        np.testing.assert_array_equal(_bits(low[name]), _bits(expected), err_msg=f"{name} ({dtype})")


@pytest.mark.parametrize("stored", [torch.float32, torch.bfloat16])
def test_a_value_beyond_float16s_range_is_refused_by_name(tmp_path, stored):
    """70000 (beyond float16's largest, 65504) in one weight: loading as float16 names the tensor and
    the dtype to load it in instead; it does not come back as inf. bfloat16 holds it (its range is
    float32's), so loading as bfloat16 works."""
    model = hf_llama_model(DEFAULT, False, False, np.float32)
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[3, 2] = 70000.0
    folder = save(model.to(stored), tmp_path)
    name = "model.layers.1.mlp.up_proj.weight"
    keep = "bfloat16" if stored == torch.bfloat16 else "float32"
    with pytest.raises(CheckpointError, match=rf"{tmp_path}: tensor '{name}' holds values beyond the range of "
                                              rf"float16; load it as {keep}"):
        load_checkpoint(folder, "float16")
    _, _, params = load_checkpoint(folder, "bfloat16")
    assert float(params["blocks"]["1"]["mlp"]["up"]["w"][2, 3]) == 70144.0, "70000 rounded to bfloat16"


@pytest.mark.parametrize("dtype", [np.int32, "float8", None, "complex64", [np.float32]])
def test_a_dtype_that_cannot_be_loaded_is_refused(tmp_path, dtype):
    folder = save(hf_gpt2_model(True, np.float32), tmp_path)
    with pytest.raises(TypeError, match=r"dtype must be one of float32, float64, bfloat16, float16, got "):
        load_checkpoint(folder, dtype)


def test_sharded_checkpoint(tmp_path):
    model = hf_llama_model(LINEAR, False, False, np.float64)
    model.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file(), "the model was not sharded"
    _, config, params = load_checkpoint(tmp_path, np.float64)
    ids = random_ids(config.vocab_size)
    compare("sharded llama logits", llama_forward(ids, params, config)[0],
             hf_logits_and_grads(exact_hf_llama(model, config), ids, None,
                                 np.zeros((2, 7, config.vocab_size)))[0], np.float64)


# -- bfloat16 and float16 checkpoints: their logits' error against float64, ours beside transformers' --

def _low_folder(family, dtype, folder):
    """A small random model saved by save_pretrained in ``dtype`` (bfloat16, float16): GPT-2 with
    the released model's config but its sizes (gelu_new, a tied head, eps 1e-5: transformers'
    GPT2Config defaults), or a Llama with grouped-query heads and llama3 rope; weights as randomise
    draws them (every layer matters to the logits)."""
    if family == "gpt2":
        config = transformers.GPT2Config(vocab_size=256, n_positions=32, n_embd=64, n_layer=2, n_head=4)
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(
            vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=32, rope_parameters=dict(LLAMA3), rms_norm_eps=1e-5)
        model = transformers.LlamaForCausalLM(config)
    return save(randomise(model, 0).to(LOW_DTYPES[dtype][1]), folder)


@pytest.mark.error_budget
@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("dtype", LOW_DTYPES)
def test_low_precision_checkpoint_logits_meet_the_error_budget(tmp_path, family, dtype):
    """The folder's bfloat16 (float16) weights run three ways on the same ids: ours as ``generate
    --hf DIR --dtype bfloat16`` runs them (loaded as stored, every operation in float32 rounded
    once to the dtype; and the twin on the same params), transformers in that dtype
    (from_pretrained with its dtype), and the truth, transformers in float64 on the same weights
    (for Llama with its norm and rotary angles in float64 too, exact_hf_llama). Ours must be within
    FlashAttention's budget: max |ours - truth| <= 2 max |transformers' - truth| + one ulp."""
    folder = _low_folder(family, dtype, tmp_path)
    kind, config, params = load_checkpoint(folder, dtype)
    ids = random_ids(config.vocab_size, B=2, T=16)
    forward, twin = (gpt_forward, gpt) if kind == "gpt2" else (llama_forward, llama)
    ours = forward(ids, params, config)[0]
    with torch.no_grad():
        twin_logits = to_numpy(twin(to_torch(ids), tree_to_torch(params), config))
        lowp = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=LOW_DTYPES[dtype][1]).eval()
        theirs = to_numpy(lowp(input_ids=to_torch(ids)).logits)
        truth_model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
        if kind == "llama":
            truth_model = exact_hf_llama(truth_model, config)
        truth = to_numpy(truth_model(input_ids=to_torch(ids)).logits)
    errors = {who: float(np.abs(x.astype(np.float64) - truth).max()) for who, x in
              {"ours": ours, "twin": twin_logits, "transformers": theirs}.items()}
    print(f"{kind} {dtype} checkpoint, max |logit - float64 truth| (largest |logit| "
          f"{float(np.abs(truth).max()):.3g}): " + ", ".join(f"{k} {v:.3g}" for k, v in errors.items()))
    for who, logits in {"numpy": ours, "twin": twin_logits}.items():
        assert_error_budget(f"hf_checkpoint[{who}]", dtype, {f"{kind}.logits": (logits, theirs, truth)})


# -- bad checkpoints --------------------------------------------------------------------------------

def _edit(folder, tensors=None, config=None):
    if tensors is not None:
        save_file(tensors, str(folder / "model.safetensors"))
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))


def test_bad_checkpoints(tmp_path):
    save(hf_gpt2_model(True, np.float32), tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    config = json.loads((tmp_path / "config.json").read_text())

    missing = {k: v for k, v in tensors.items() if k != "transformer.h.1.mlp.c_fc.weight"}
    _edit(tmp_path, missing)
    with pytest.raises(CheckpointError, match=r"tensor 'transformer.h.1.mlp.c_fc.weight' is missing "
                                              r"\(expected shape \(12, 48\)\)"):
        load_checkpoint(tmp_path)

    _edit(tmp_path, {**tensors, "transformer.h.7.attn.c_attn.weight": np.zeros((12, 36), np.float32)})
    with pytest.raises(CheckpointError, match=r"unexpected tensors \['transformer.h.7.attn.c_attn.weight'\]"):
        load_checkpoint(tmp_path)

    _edit(tmp_path, {**tensors, "transformer.wpe.weight": np.zeros((8, 12), np.float32)})
    with pytest.raises(CheckpointError, match=r"'transformer.wpe.weight' has shape \(8, 12\), expected \(9, 12\)"):
        load_checkpoint(tmp_path)

    _edit(tmp_path, tensors, {**config, "architectures": ["BertForMaskedLM"]})
    with pytest.raises(CheckpointError, match=r"architecture \['BertForMaskedLM'\] is not supported"):
        load_checkpoint(tmp_path)

    _edit(tmp_path, config={**config, "activation_function": "relu"})
    with pytest.raises(CheckpointError, match="activation_function 'relu' is not supported"):
        load_checkpoint(tmp_path)

    _edit(tmp_path, config={**config, "scale_attn_by_inverse_layer_idx": True})
    with pytest.raises(CheckpointError, match="scale_attn_by_inverse_layer_idx = True is not supported"):
        load_checkpoint(tmp_path)

    (tmp_path / "model.safetensors").unlink()
    _edit(tmp_path, config=config)
    with pytest.raises(CheckpointError, match="has no model.safetensors"):
        load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="has no config.json"):
        load_checkpoint(tmp_path / "nowhere")


def test_bad_llama_config(tmp_path):
    save(hf_llama_model(DEFAULT, False, False, np.float32), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    _edit(tmp_path, config={**config, "rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "factor": 2.0}})
    with pytest.raises(CheckpointError, match="rope_type 'longrope' is not supported"):
        load_checkpoint(tmp_path)
    _edit(tmp_path, config={**config, "hidden_act": "gelu"})
    with pytest.raises(CheckpointError, match="hidden_act 'gelu' is not supported"):
        load_checkpoint(tmp_path)
    # transformers 4 wrote rope_theta and rope_scaling (with "type") beside the other keys.
    old = {k: v for k, v in config.items() if k != "rope_parameters"}
    _edit(tmp_path, config={**old, "rope_theta": 123.0, "rope_scaling": {"type": "linear", "factor": 2.0}})
    _, llama_config, _ = load_checkpoint(tmp_path)
    assert llama_config.rope_theta == 123.0, llama_config
    assert llama_config.rope_scaling == {"rope_type": "linear", "factor": 2.0}, llama_config


def test_gpt2_params_allocate_nothing_the_weights_do_not_hold(tmp_path):
    """With no MLP weight to take the width from, the GPT-2 reader must not build a (C, 4C) array
    to read a shape off (29 TiB for n_embd = 10^6): a missing tensor is refused by name instead."""
    import tracemalloc

    from attn_cli.hf import _gpt2_params, _Tensors
    from numpy_attn.gpt import GPTConfig

    config = GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=2, n_embd=10**6, bias=True,
                       positions="learned", gelu="tanh")
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match=r"tensor 'wte.weight' is missing"):
            _gpt2_params(_Tensors({}, tmp_path, np.float32), config)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20, f"{peak:,} bytes allocated to refuse a folder without tensors"


def _data_bytes(path):
    """The bytes of a safetensors file's tensors: the file less its 8-byte length and its header."""
    with open(path, "rb") as f:
        return path.stat().st_size - 8 - int.from_bytes(f.read(8), "little")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpt2_checkpoint_is_held_once(tmp_path, dtype):
    """Loading holds the weights once: each tensor is read straight into its array (no bytes
    object and then a converted copy, no array of booleans for the finiteness check), and the tied
    head is wte. So the peak allocation while load_checkpoint runs is the file's data bytes and
    one layer's c_attn (split into q, k, v before it is dropped), and the arrays of the params
    add up to exactly the data bytes. A bfloat16 file loaded as bfloat16 is held as stored: no
    float32 copy of it is ever made (which would be twice its data)."""
    import tracemalloc

    config = transformers.GPT2Config(vocab_size=1024, n_positions=64, n_embd=128, n_layer=1, n_head=4)
    model = transformers.GPT2LMHeadModel(config).eval().to(getattr(torch, dtype))
    folder = save(model, tmp_path)
    data = _data_bytes(folder / "model.safetensors")                    # 1.3 MiB of float32, 0.65 of bfloat16
    tracemalloc.start()
    try:
        _, _, params = load_checkpoint(folder, dtype)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    held = {id(a.base if a.base is not None else a): a.base if a.base is not None else a
            for a in _flat(params).values()}
    assert sum(a.nbytes for a in held.values()) == data, "the params' arrays are not the file's data, once"
    # Beyond the data, the reader allocates one c_attn's weight and bias again while it splits
    # them (C * 3C * 4 + 3C * 4 bytes in float32, half in bfloat16), the parsed header (16
    # entries: a few KiB), the file object's 8 KiB buffer and the Python objects of the dicts:
    # those last well under 64 KiB (bfloat16's finiteness check widens one chunk of 8192 values
    # at a time: 32 KiB of float32, freed before the next). A second copy of any other weight
    # matrix is at least C * C * 2 = 32 KiB (c_proj in bfloat16), of the whole data 0.65 MiB, and
    # a float32 copy of wte alone 0.5 MiB.
    C, size = config.n_embd, np.dtype(BFLOAT16 if dtype == "bfloat16" else dtype).itemsize
    extra = peak - data - (3 * C * C + 3 * C) * size
    assert extra < 64 * 1024, f"loading {data:,} bytes of weights allocated {peak:,} at its peak ({extra:,} more " \
                              "than the data and one c_attn)"


def test_params_do_not_change_when_the_file_does(tmp_path):
    """The params are the process's own arrays, not a map of the file: a checkpoint overwritten or
    cut short after loading (a save_pretrained into the same folder) changes none of them."""
    model = hf_gpt2_model(True, np.float32)
    folder = save(model, tmp_path)
    _, _, params = load_checkpoint(folder, np.float32)
    before = {name: a.copy() for name, a in _flat(params).items()}
    path = folder / "model.safetensors"
    with open(path, "r+b") as f:
        f.seek(8 + int.from_bytes(f.read(8), "little"))
        f.write(b"\xff" * (path.stat().st_size - f.tell()))          # every weight's bytes NaN
    for name, a in _flat(params).items():
        np.testing.assert_array_equal(a, before[name], err_msg=f"{name} changed with the file")
    path.write_bytes(b"")                                               # cut to nothing
    for name, a in _flat(params).items():
        np.testing.assert_array_equal(a, before[name], err_msg=f"{name} changed with the file")
