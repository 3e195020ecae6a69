"""config.json read as transformers reads it: a folder that transformers loads decodes to its
greedy ids, or is refused naming the key; never other ids without a word.

Each test saves a tiny random transformers model of a family (two layers, width 16, vocabulary 64),
edits its config.json or its tensors into one kind of input, and compares ``generate --hf``'s ids
with transformers' greedy ids on the same folder (AutoModelForCausalLM.from_pretrained), or our
config with transformers' config class on the same config.json. A comparison that could not fail
is ruled out: where a test decodes, the reading the loader had before (rope_scaling ignored, the
embedding as the head, Gemma 3's default pattern, capped scores) gives other ids, checked first.

The keys checked, per family (transformers 5.24's configuration_<family>.py; "a < b" is b's
precedence over a, "=x" its default where it is not Llama's):

    every family   rope_parameters < rope_scaling (non-empty; whole, with its rope_theta, else the
                   top-level rope_theta); rope_type < type is not read where rope_type is given;
                   partial_rotary_factor (top level, or in the rope object) other than 1 refused;
                   a rope object per layer type refused but for Gemma 3;
                   llama3 and yarn's original_max_position_embeddings =max_position_embeddings;
                   tie_word_embeddings with the file's own lm_head.weight (kept where it differs);
                   layer_types of num_hidden_layers entries (refused otherwise), "attention" read
                   as "full_attention"
    gpt2           n_embd < hidden_size, n_positions < max_position_embeddings, n_head <
                   num_attention_heads, n_layer < num_hidden_layers (an alias beside its key of
                   another value refused); n_inner =4 n_embd (the file's MLP of another width refused)
    llama          head_dim =hidden_size / num_attention_heads, num_key_value_heads =heads
    qwen3          head_dim =128, num_key_value_heads =32, max_position_embeddings =32768
    olmo2          rms_norm_eps =1e-5
    gemma2         head_dim =256, num_key_value_heads =4, max_position_embeddings =8192,
                   tie_word_embeddings =true
    gemma3         as gemma2, max_position_embeddings =131072; rope_parameters per layer type
                   (a flat one refused), rope_scaling merged into full_attention's, rope_theta
                   =1e6, sliding_attention's rope_theta < rope_local_base_freq (=1e4);
                   sliding_window_pattern (=6) where layer_types is absent; attn_logit_softcapping
                   not applied
    gpt_oss        num_local_experts < num_experts; head_dim =64, num_key_value_heads =8,
                   rms_norm_eps =1e-5, max_position_embeddings =131072, rope_theta =150000;
                   rope_parameters absent: YaRN (factor 32 of 4096, beta_fast 32, beta_slow 1)
    deepseek_v3    n_routed_experts < num_local_experts; max_position_embeddings =4096

The keys each family reads are those of its reader's KEYS (attn_cli/hf/<family>.py), checked for
type and bounds by test_hostile_inputs and the families' own tests; the defaults and precedences
above are compared with transformers' config classes by test_config_reads_as_transformers.
"""

import json
import re
import shutil

import numpy as np
import pytest
import torch
import transformers

from attn_cli import cli
from attn_cli.hf import READERS, CheckpointError, load_checkpoint
from attn_cli.hf.config import resolve_keys
from attn_cli.hf_generate import family_functions
from parity_tests.model_kit import hf_greedy, randomise

PROMPT, NEW = [3, 1, 4, 1, 5, 9, 2], 6          # longer than the Gemmas' and gpt-oss' window of 3
ABSENT = object()                                # a key's value that leaves the key out of config.json

# Two layers, width 16, vocabulary 64; the ids of transformers' special tokens left out.
LAYOUT = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, head_dim=8, max_position_embeddings=32, rms_norm_eps=1e-5,
              pad_token_id=None, bos_token_id=None, eos_token_id=None, tie_word_embeddings=False)
GEMMA = dict(LAYOUT, sliding_window=3, query_pre_attn_scalar=8, layer_types=["sliding_attention", "full_attention"])
MODELS = {
    "gpt2": ("GPT2", dict(vocab_size=64, n_positions=32, n_embd=16, n_layer=2, n_head=2, bos_token_id=None,
                          eos_token_id=None, tie_word_embeddings=False)),
    "llama": ("Llama", LAYOUT),
    "qwen3": ("Qwen3", LAYOUT),
    "olmo2": ("Olmo2", LAYOUT),
    "gemma2": ("Gemma2", dict(GEMMA, attn_logit_softcapping=50.0, final_logit_softcapping=30.0)),
    "gemma3": ("Gemma3Text", GEMMA),
    "gpt_oss": ("GptOss", dict(LAYOUT, num_local_experts=4, num_experts_per_tok=2, sliding_window=3,
                               experts_implementation="eager")),
    "deepseek_v3": ("DeepseekV3", dict({k: v for k, v in LAYOUT.items() if k != "head_dim"},   # qk_rope_head_dim's
                                       num_key_value_heads=2, moe_intermediate_size=8, n_routed_experts=4,
                                       num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1,
                                       q_lora_rank=None, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4,
                                       v_head_dim=4, experts_implementation="eager")),
}
MODEL_CLASSES = {"gpt2": "GPT2LMHeadModel", "gemma3": "Gemma3ForCausalLM"}


def _model(family, **changes):
    """A random transformers model of ``family`` (MODELS' sizes, with ``changes``), far from its
    initialisation (model_kit.randomise), computing in float32 with eager attention."""
    prefix, sizes = MODELS[family]
    config = getattr(transformers, f"{prefix}Config")(**{**sizes, **changes}, attn_implementation="eager")
    model_class = getattr(transformers, MODEL_CLASSES.get(family, f"{prefix}ForCausalLM"))
    return randomise(model_class(config), 0).eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """{family: a folder of its model as save_pretrained writes it}, saved once for the module."""
    root = tmp_path_factory.mktemp("families")
    for family in MODELS:
        _model(family).save_pretrained(root / family, safe_serialization=True)
    return {family: root / family for family in MODELS}


def _copy(saved, family, folder, **changes):
    """``family``'s saved folder copied to ``folder``, config.json updated with ``changes`` (ABSENT
    deletes the key); returns the folder."""
    shutil.copytree(saved[family], folder)
    path = folder / "config.json"
    config = {**json.loads(path.read_text()), **changes}
    path.write_text(json.dumps({key: value for key, value in config.items() if value is not ABSENT}))
    return folder


def _theirs(folder, edit=None):
    """transformers' greedy ids on ``folder`` (edit(model), if given, changes the loaded model first)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    if edit is not None:
        edit(model)
    return hf_greedy(model, PROMPT, NEW)


def _ours(folder, capsys):
    """generate --hf's greedy ids on ``folder`` (with the key/value cache)."""
    capsys.readouterr()
    assert cli.main(["generate", "--hf", str(folder), "--ids", ",".join(map(str, PROMPT)), "--max-new-tokens",
                     str(NEW), "--temperature", "0"]) == 0
    return [int(i) for i in capsys.readouterr().out.strip().split(",")]


def _ours_with(folder, **fields):
    """Our greedy ids (no cache) on ``folder`` with config fields changed: a reading the loader no
    longer makes, to show that the test would see it."""
    import dataclasses

    kind, config, params = load_checkpoint(folder)
    config = dataclasses.replace(config, **fields)
    forward = family_functions(kind)[0]
    ids = list(PROMPT)
    for _ in range(NEW):
        logits = forward(np.array([ids]), params, config, for_backward=False)[0]    # (1, T, V)
        ids.append(int(np.argmax(logits[0, -1])))
    return ids


# -- 1. rope_scaling beside rope_parameters: rope_scaling wins ------------------------------------------

LINEAR = {"rope_type": "linear", "factor": 4.0}


@pytest.mark.parametrize("family, changes", [
    ("qwen3", {"rope_scaling": LINEAR}),
    ("llama", {"rope_scaling": {"type": "linear", "factor": 4.0}, "rope_theta": 100.0}),   # older spelling, theta
    ("deepseek_v3", {"rope_scaling": LINEAR}),
    ("gpt_oss", {"rope_scaling": LINEAR}),                                     # over rope_parameters' YaRN
    ("gemma3", {"rope_scaling": LINEAR}),                                      # into full_attention's
])
def test_rope_scaling_beside_rope_parameters_wins(saved, tmp_path, capsys, family, changes):
    """A config.json holding rope_parameters (as transformers 5 writes it) and rope_scaling: the ids
    transformers gives, which read rope_scaling (the same folder without it gives others)."""
    folder = _copy(saved, family, tmp_path / "edited", **changes)
    expected = _theirs(folder)
    without = _theirs(_copy(saved, family, tmp_path / "plain", rope_theta=changes.get("rope_theta", ABSENT)))
    assert expected != without, f"{family}: rope_scaling changes no id; the test would not see it ignored"
    ours = _ours(folder, capsys)
    assert ours == expected, f"{family}: greedy ids {ours} differ from transformers' {expected}"


def test_gpt_oss_without_rope_parameters_decodes_with_its_yarn(saved, tmp_path, capsys):
    """No rope_parameters (nor rope_scaling): transformers' GptOssConfig takes its YaRN (32 times
    4096 positions, beta_fast 32, beta_slow 1), not the default rope."""
    folder = _copy(saved, "gpt_oss", tmp_path / "yarn", rope_parameters=ABSENT)
    expected = _theirs(folder)
    assert _ours_with(folder, rope_scaling=None) != expected, "the rope decides no id"
    assert _ours(folder, capsys) == expected


# -- 2. a tied config whose file holds its own head -------------------------------------------------------

def _embedding_as_head(model):
    with torch.no_grad():
        model.get_output_embeddings().weight.copy_(model.get_input_embeddings().weight)


@pytest.mark.parametrize("family", list(MODELS))
def test_a_tied_config_keeps_the_files_own_head(saved, tmp_path, capsys, family):
    """tie_word_embeddings true, the file's lm_head.weight not the embedding: transformers keeps the
    file's head (it ties only equal tensors); so do we, untying the config."""
    folder = _copy(saved, family, tmp_path / "tied", tie_word_embeddings=True)
    expected = _theirs(folder)
    assert expected != _theirs(folder, _embedding_as_head), f"{family}: the head decides no id"
    assert _ours(folder, capsys) == expected, f"{family}: not the ids of the file's own head"
    config, params = load_checkpoint(folder)[1:]
    assert not config.tie_weights and "head" in params, config


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_tied_config_whose_file_repeats_the_embedding_stays_tied(tmp_path, family):
    """The head stored beside the embedding with its values: one tensor, the config tied."""
    model = _model(family)
    _embedding_as_head(model)
    model.save_pretrained(tmp_path, safe_serialization=True)
    _copy({family: tmp_path}, family, tmp_path / "tied", tie_word_embeddings=True)
    config, params = load_checkpoint(tmp_path / "tied")[1:]
    assert config.tie_weights and "head" not in params, config


# -- 3. Gemma 3: transformers 4's sliding_window_pattern, and no cap on the scores ------------------------

def test_gemma3_sliding_window_pattern_gives_the_layer_types(saved, tmp_path, capsys):
    """No layer_types, sliding_window_pattern 2: layer 1 global (transformers' derivation), where the
    default pattern of 6 makes both layers sliding."""
    folder = _copy(saved, "gemma3", tmp_path / "pattern", layer_types=ABSENT, sliding_window_pattern=2)
    expected = _theirs(folder)
    assert expected != _theirs(_copy(saved, "gemma3", tmp_path / "default", layer_types=ABSENT)), \
        "the pattern decides no id"
    assert _ours(folder, capsys) == expected
    assert load_checkpoint(folder)[1].layer_types == ("sliding_attention", "full_attention")


def test_gemma3_scores_are_not_capped(saved, tmp_path, capsys):
    """attn_logit_softcapping set: transformers' Gemma 3 attention does not apply it, nor do we."""
    folder = _copy(saved, "gemma3", tmp_path / "capped", attn_logit_softcapping=0.5)
    expected = _theirs(folder)
    assert _ours_with(folder, attn_logit_softcap=0.5) != expected, "a cap of 0.5 decides no id"
    assert _ours(folder, capsys) == expected
    assert load_checkpoint(folder)[1].attn_logit_softcap is None


# -- 4. layer_types of another length than num_hidden_layers --------------------------------------------

@pytest.mark.parametrize("family", list(MODELS))
@pytest.mark.parametrize("n", [0, 3])
def test_layer_types_of_another_length_are_refused(saved, tmp_path, capsys, family, n):
    """Every config class of transformers refuses layer_types without one entry per layer (empty
    included), whether its model reads them or not; so do we, naming the key and both numbers."""
    folder = _copy(saved, family, tmp_path / "types", layer_types=["full_attention"] * n)
    with pytest.raises(Exception, match="must be equal to the number of `layer_types`"):
        transformers.AutoConfig.from_pretrained(folder)
    layers = "n_layer" if family == "gpt2" else "num_hidden_layers"
    message = f"layer_types must list {layers} = 2 entries, one per layer, got {n}"
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(folder)
    assert cli.main(["generate", "--hf", str(folder), "--ids", "1,2"]) == 2
    assert message in capsys.readouterr().err


# -- 5. every family's keys: defaults, other spellings, precedence -------------------------------------

def _rope(parameters):
    """(theta, rope_type, factor, original context) of a flat rope_parameters dict: the factor
    where the kind reads one, the original context where llama3 or YaRN read it."""
    kind = parameters.get("rope_type", "default")
    return (float(parameters["rope_theta"]), kind, None if kind == "default" else parameters.get("factor"),
            parameters.get("original_max_position_embeddings") if kind in ("llama3", "yarn") else None)


def _theirs_config(family, hf):
    """What a config class of transformers makes of config.json ``hf``, in _ours_config's terms."""
    c = getattr(transformers, f"{MODELS[family][0]}Config").from_dict(json.loads(json.dumps(hf)))
    if family == "gpt2":
        return {"n_embd": c.n_embd, "n_layer": c.n_layer, "n_head": c.n_head, "block_size": c.n_positions}
    rope = c.rope_parameters
    view = {"n_embd": c.hidden_size, "n_kv_head": c.num_key_value_heads, "rms_eps": c.rms_norm_eps,
            "block_size": c.max_position_embeddings, "rope": _rope(rope.get("full_attention", rope))}
    view["hs"] = c.qk_rope_head_dim if family == "deepseek_v3" else c.head_dim
    if family == "gemma3":
        view["local_theta"] = float(rope["sliding_attention"]["rope_theta"])
    if family in ("gemma2", "gemma3", "gpt_oss"):
        view["layer_types"] = tuple(c.layer_types)
    if family in ("gpt_oss", "deepseek_v3"):
        view["experts"] = c.num_local_experts
    return view


def _ours_config(family, hf):
    """Our config of ``family`` from config.json ``hf`` (as load_checkpoint reads it), viewed."""
    architecture = next(a for a, (f, _) in READERS.items() if f.name == family)
    reader = READERS[architecture][1]
    c = reader.config(resolve_keys(hf, "folder", reader))
    if family == "gpt2":
        return {"n_embd": c.n_embd, "n_layer": c.n_layer, "n_head": c.n_head, "block_size": c.block_size}
    scaling = c.rope_scaling or {}
    view = {"n_embd": c.n_embd, "n_kv_head": c.n_kv_head,
            "rms_eps": c.rms_eps, "block_size": c.block_size, "hs": c.hs,
            "rope": _rope({"rope_theta": c.rope_theta, **scaling})}
    if family == "gemma3":
        view["local_theta"] = c.rope_local_theta
    if family in ("gemma2", "gemma3", "gpt_oss"):
        view["layer_types"] = tuple(c.layer_types)
    if family == "gpt_oss":
        view["experts"] = c.n_experts
    if family == "deepseek_v3":
        view["experts"] = c.n_routed_experts
    return view


# config.json keys (without a base) for the families of Llama's layout: 4 heads on 2, C = 32.
BASE = dict(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=32, rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
BASES = {"gpt2": dict(vocab_size=64, n_positions=32, n_embd=16, n_layer=2, n_head=2),
         "gpt_oss": dict(BASE, num_local_experts=4, num_experts_per_tok=2),
         "deepseek_v3": dict(BASE, num_key_value_heads=4, moe_intermediate_size=8, n_routed_experts=4,
                             num_experts_per_tok=2, n_group=1, topk_group=1, kv_lora_rank=8, qk_nope_head_dim=4,
                             qk_rope_head_dim=4, v_head_dim=4),
         "gemma3": dict(BASE, rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 5e5},
                                               "sliding_attention": {"rope_type": "default"}})}
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}

CONFIG_CASES = [
    # (family, changes to the base config.json: ABSENT removes a key)
    ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    ("llama", {"rope_scaling": {}, "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 7.0}}),
    ("llama", {"rope_parameters": LLAMA3}),                                    # original context from max_position
    ("llama", {"head_dim": ABSENT, "num_key_value_heads": ABSENT, "max_position_embeddings": ABSENT}),
    ("qwen3", {"head_dim": ABSENT, "max_position_embeddings": ABSENT}),
    ("qwen3", {"rope_scaling": {"rope_type": "yarn", "factor": 2.0}, "rope_theta": 300.0}),
    ("qwen3", {"layer_types": ["attention", "full_attention"]}),
    ("olmo2", {"rms_norm_eps": ABSENT, "max_position_embeddings": ABSENT}),
    ("gemma2", {"head_dim": ABSENT, "num_key_value_heads": ABSENT, "max_position_embeddings": ABSENT}),
    ("gemma2", {"layer_types": ["attention", "sliding_attention"]}),
    ("gemma3", {"rope_parameters": ABSENT, "rope_local_base_freq": 3.0}),     # the global theta of 10^6
    ("gemma3", {"rope_local_base_freq": 3.0, "rope_scaling": {"type": "linear", "factor": 2.0}}),
    ("gemma3", {"rope_parameters": ABSENT, "rope_theta": 9.0, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    ("gemma3", {"sliding_window_pattern": 1, "head_dim": ABSENT, "max_position_embeddings": ABSENT}),
    ("gemma3", {"num_hidden_layers": 7}),                                     # the default pattern of 6
    ("gpt_oss", {"rope_parameters": ABSENT}),                                  # its YaRN
    ("gpt_oss", {"head_dim": ABSENT, "rms_norm_eps": ABSENT, "max_position_embeddings": ABSENT,
                 "rope_parameters": {"rope_type": "default"}}),
    ("gpt_oss", {"num_attention_heads": 8, "num_key_value_heads": ABSENT}),
    ("gpt_oss", {"num_experts": 4, "layer_types": ["full_attention", "sliding_attention"]}),
    ("gpt_oss", {"num_local_experts": ABSENT, "num_experts": 4}),
    ("deepseek_v3", {"num_local_experts": 4, "max_position_embeddings": ABSENT,
                     "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 100.0}}),
    ("gpt2", {"hidden_size": 16, "max_position_embeddings": 32, "num_attention_heads": 2, "num_hidden_layers": 2}),
    ("gpt2", {"n_embd": ABSENT, "hidden_size": 16, "n_positions": ABSENT, "max_position_embeddings": 24}),
]


@pytest.mark.parametrize("family, changes", CONFIG_CASES)
def test_config_reads_as_transformers(family, changes):
    """Our config from config.json and transformers' config class from the same: the same sizes,
    norm eps, rope (theta, kind, factor, original context), layer types and experts."""
    hf = {**BASES.get(family, BASE), **changes}
    hf = {key: value for key, value in hf.items() if value is not ABSENT}
    assert _ours_config(family, hf) == _theirs_config(family, hf), (family, changes)


@pytest.mark.parametrize("family, changes, message", [
    ("gpt2", {"hidden_size": 32}, "hidden_size = 32 and n_embd = 16 differ"),
    ("gpt_oss", {"num_experts": 8}, "num_experts = 8 and num_local_experts = 4 differ"),
    ("deepseek_v3", {"num_local_experts": 8}, "num_local_experts = 8 and n_routed_experts = 4 differ"),
    ("gemma3", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}},
     "rope_parameters must hold the settings per layer type"),
    ("llama", {"partial_rotary_factor": 0.5}, "partial_rotary_factor = 0.5 is not supported"),
    ("qwen3", {"rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor = 0.5 is not supported"),
    ("gemma3", {"rope_parameters": {"full_attention": {"rope_theta": 1e6},
                                    "sliding_attention": {"rope_theta": 1e4, "partial_rotary_factor": 0.5}}},
     "partial_rotary_factor = 0.5 is not supported"),
    ("gpt_oss", {"partial_rotary_factor": 0.25}, "partial_rotary_factor = 0.25 is not supported"),
    ("gemma2", {"rope_parameters": {"full_attention": {"rope_theta": 1e6}, "sliding_attention": {"rope_theta": 1e4}}},
     "the rope settings per layer type ('full_attention') are not read for Gemma2"),
])
def test_a_key_transformers_would_read_otherwise_is_refused(saved, tmp_path, capsys, family, changes, message):
    """An alias beside its key with another value (transformers reads the alias), a flat rope for
    Gemma 3 (transformers reads none of it), a partial rotation (transformers rotates part of each
    head), settings per layer type where one rope is read: refused naming the keys."""
    folder = _copy(saved, family, tmp_path / "edited", **changes)
    with pytest.raises(CheckpointError, match=re.escape(message)):
        load_checkpoint(folder)
    assert cli.main(["generate", "--hf", str(folder), "--ids", "1,2"]) == 2
    assert message in capsys.readouterr().err


def test_gpt2_mlp_of_another_width_than_n_inner_is_refused(saved, tmp_path):
    """n_inner (absent: 4 n_embd) sizes transformers' MLP; a file's c_fc of another width is not
    loaded into it, so it is refused naming the tensor, not read at its own width."""
    folder = _copy(saved, "gpt2", tmp_path / "inner", n_inner=32)
    with pytest.raises(CheckpointError, match=r"'transformer.h.0.mlp.c_fc.weight' has shape \(16, 64\), but "
                                              r"config.json's n_inner = 32 asks for a width of 32"):
        load_checkpoint(folder)
    assert load_checkpoint(_copy(saved, "gpt2", tmp_path / "null", n_inner=ABSENT))[1].n_embd == 16
