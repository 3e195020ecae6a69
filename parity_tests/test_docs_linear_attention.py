"""docs/linear_attention.md and its script: the script runs without writing anything, the page shows
exactly what it prints, and the numbers obey what the page says of them: an exact recall right
after a write with beta = 1, the interference of six keys in four dimensions, a decay of 0.8^n, and
state sizes from transformers' own Qwen3.5 defaults."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import numpy_attn
from parity_tests.helpers import load_docs_script, needs_vocab

ROOT = Path(numpy_attn.__file__).resolve().parent.parent
SCRIPT = ROOT / "docs" / "linear_attention.py"
PAGE = ROOT / "docs" / "linear_attention.md"
# Float64, keys of length 1, values and state entries below 5 in size (|S_t| <= 4.1 in the table):
# each read S^T k is a sum of 4 products, off by at most 4 * 5 * 1.1e-16 ~ 2e-15 per component, and
# the write's u_t (|u_t| < 7) lands scaled by k . k, which is 1 up to 4 roundings: 7 * 4.4e-16
# ~ 3e-15 more. Over 4 components that is under 2 * 5e-15 = 1e-14; 1e-13 leaves a margin of 10.
RECALL_TOL = 1e-13


memory = load_docs_script(SCRIPT)


@pytest.fixture(scope="module")
def sentence():
    """words, the sentence written with beta = 1 and no decay, and the orthonormal keys written with DECAY."""
    ids = np.array(memory.tokenizer.encode(memory.SENTENCE))
    keys, values = memory.token_vectors(ids)
    kept = memory.KEPT
    decayed = memory.write(np.eye(memory.DIM)[:kept], values[:kept], decay=memory.DECAY)
    return memory.tokens(ids), memory.write(keys, values), decayed


def test_the_readme_links_the_page():
    assert "(docs/linear_attention.md)" in (ROOT / "README.md").read_text(encoding="utf-8")


@needs_vocab
def test_the_script_writes_nothing_and_the_page_shows_what_it_prints(tmp_path):
    mine = tmp_path / "notes.txt"
    mine.write_text("the user's own file\n")
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"] and mine.read_text() == "the user's own file\n"
    page = PAGE.read_text(encoding="utf-8")
    blocks = done.stdout.strip().split("\n\n")
    assert len(blocks) == 5 and all(block.startswith("| ") for block in blocks[:3] + blocks[4:]), done.stdout
    for block in blocks:
        assert block in page, f"the page differs from the script's output:\n{block}"
    assert page.count("`python docs/linear_attention.py`") >= 2, "the page names the command that made its tables"


# The page's tables are compared with the script's as text: float64 results of fixed inputs printed
# to 3 decimals. Another BLAS kernel sums a product of 4 terms in another order, which moves a
# value below 5 by a few float64 roundings: under 1e-14. A value at least 1e-9 from the point where
# its last printed digit changes prints the same on every machine.
PRINTED_MARGIN = 1e-9


@needs_vocab
def test_the_pages_tables_print_the_same_on_every_machine(sentence):
    words, written, decayed = sentence
    printed = [np.linalg.norm(v) for v in written.values]
    printed += [e for errors in memory.recall_errors(written) for e in errors]
    printed += [np.linalg.norm(s) for s in written.states[1:]]
    last = decayed.keys @ decayed.states[-1]
    T = len(decayed.keys)
    printed += [np.linalg.norm(last[t]) / np.linalg.norm(decayed.values[t]) for t in range(T)]
    printed += [np.linalg.norm(last[t] - memory.DECAY ** (T - 1 - t) * decayed.values[t]) for t in range(T)]
    assert len(printed) == 5 * len(words) + 2 * T
    for value in printed:
        scaled = value * 1000
        margin = abs(scaled - np.floor(scaled) - 0.5) / 1000
        assert margin >= PRINTED_MARGIN, f"{value!r} lies {margin:.1e} from where its 3 decimals change"


# -- what the page says of the numbers ----------------------------------------------------------

@needs_vocab
def test_a_key_written_with_beta_1_is_recalled_exactly_right_after(sentence):
    words, written, _ = sentence
    assert words == ["The", "cat", "sat", "on", "the", "mat"]
    assert np.allclose(np.linalg.norm(written.keys, axis=-1), 1, rtol=0, atol=1e-15), "the keys have length 1"
    # The op's output with q = k and scale 1 is the state's reading of each key after its write.
    reads = np.einsum("tkv,tk->tv", written.states[1:], written.keys)
    np.testing.assert_allclose(written.reads, reads, rtol=0, atol=RECALL_TOL, err_msg="o_t is S_t^T k_t")
    before, after, last = memory.recall_errors(written)
    assert (after < RECALL_TOL).all(), f"right after the write: {after}"
    assert before[0] == np.linalg.norm(written.values[0]), "an empty state reads 0: the first error is |v|"
    assert (before[1:] > 0.1).all(), "before its write no token is recalled"


@needs_vocab
def test_six_keys_in_four_dimensions_overwrite_each_other(sentence):
    _, written, _ = sentence
    _, _, last = memory.recall_errors(written)
    assert last[-1] < RECALL_TOL, "the last token is recalled exactly"
    assert (last[:-1] > 0.1).all(), f"after the last token an earlier one is still recalled: {last}"
    assert last[0] > np.linalg.norm(written.values[0]), "`The` reads worse than an empty memory would"
    assert last[4] == last[:-1].min(), "`the`, written just before `mat`, keeps the most"
    # Without the delta (S_t = S_(t-1) + k_t v_t^T) the recall is off right after the write
    # already, by more than 1 at some token: the exact recall above is the delta's doing.
    plain = np.cumsum(written.keys[:, :, None] * written.values[:, None, :], axis=0)       # (T, dk, dv)
    errors = np.linalg.norm(np.einsum("tkv,tk->tv", plain, written.keys) - written.values, axis=-1)
    assert errors[1:].max() > 1, errors


@needs_vocab
def test_the_decay_fades_each_orthonormal_entry_by_its_age(sentence):
    words, _, decayed = sentence
    T = len(decayed.keys)
    assert T == memory.DIM and np.array_equal(decayed.keys, np.eye(T)), "orthonormal keys"
    last = decayed.keys @ decayed.states[-1]                                              # (T, dv)
    # Each entry is v_t times T - 1 - t factors of exp(log 0.8), each exact to an ulp: RECALL_TOL.
    expected = memory.DECAY ** (T - 1 - np.arange(T))[:, None] * decayed.values
    np.testing.assert_allclose(last, expected, rtol=0, atol=RECALL_TOL, err_msg="S^T k_t = 0.8^n v_t")
    assert words[:T] == ["The", "cat", "sat", "on"]


def test_the_sizes_are_transformers_qwen3_5_defaults():
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen3_5TextConfig()
    for name, value in memory.QWEN3_5.items():
        assert getattr(config, name) == value, f"{name}: transformers {getattr(config, name)}, the script {value}"
    types = config.layer_types
    assert types.count("linear_attention") == 3 * types.count("full_attention"), "three linear layers in four"
    assert all(types[k] == "full_attention" for k in range(3, len(types), 4))


def test_the_cache_grows_with_the_tokens_and_the_state_does_not():
    kv_per_token, state, window = memory.layer_bytes()
    assert kv_per_token == 2 * 4 * 256 * 2 and state == 32 * 128 * 128 * 2 == memory.MIB
    assert window == 3 * (2 * 16 * 128 + 32 * 128) * 2
    # The page: at 1,024 tokens the cache is "nearly four times" the state and window.
    assert 3.5 < 1024 * kv_per_token / (state + window) < 4
    table = memory.size_table()
    assert "| 32,768 | 128.00 MiB | 1.05 MiB |" in table
    crossing = -(-(state + window) // kv_per_token)
    assert (crossing - 1) * kv_per_token < state + window <= crossing * kv_per_token


def test_the_script_uses_numpy_only():
    """Everything computed with numpy_attn: the script imports neither torch nor transformers."""
    imports = re.findall(r"^\s*(?:from|import) (\w+)", SCRIPT.read_text(encoding="utf-8"), flags=re.M)
    assert not {"torch", "torch_attn", "transformers"} & set(imports), imports
    assert "numpy_attn" in imports


# Table 4's sizes: the hybrid families' against the installed transformers' config defaults, under
# the config.json names each numpy_attn field reads (attn_cli/hf).
HF_FIELDS = {"n_embd": "hidden_size", "n_layer": "num_hidden_layers", "n_head": "num_attention_heads",
             "n_kv_head": "num_key_value_heads", "head_dim": "head_dim", "layer_types": "layer_types",
             "linear_k_heads": "linear_num_key_heads", "linear_v_heads": "linear_num_value_heads",
             "linear_k_dim": "linear_key_head_dim", "linear_v_dim": "linear_value_head_dim",
             "conv_kernel": "linear_conv_kernel_dim", "kv_lora_rank": "kv_lora_rank",
             "qk_rope_head_dim": "qk_rope_head_dim", "linear_num_heads": "linear_num_heads",
             "linear_head_dim": "linear_head_dim"}
HF_CONFIGS = {"qwen3_5": "Qwen3_5TextConfig", "qwen3_next": "Qwen3NextConfig", "kimi_linear": "KimiLinearConfig",
              "olmo_hybrid": "OlmoHybridConfig"}


def test_the_families_released_sizes_are_transformers_defaults():
    transformers = pytest.importorskip("transformers")
    checked = set()
    for family, fields in memory.RELEASED.values():
        if family not in HF_CONFIGS:
            continue
        config = getattr(transformers, HF_CONFIGS[family])()
        for name, value in fields.items():
            theirs = getattr(config, HF_FIELDS[name])
            assert (tuple(theirs) if name == "layer_types" else theirs) == value, (family, name, theirs, value)
        checked.add(family)
    assert checked == set(HF_CONFIGS)


def test_the_family_table_is_each_cache_constructors_bytes_as_counted_by_hand():
    """Each row's bytes from the family's cache constructor equal the count from its sizes: a softmax
    layer 2 nkv hs (or MLA's latent rkv + dr) numbers a token, a linear layer nv dk dv numbers of state
    and K - 1 inputs of its convolution's channels, bfloat16 (2 bytes); the whole cache T tokens of
    every softmax layer and every linear layer's state and window. And the page's ratios hold."""
    def by_hand(fields):
        f = dict(fields)
        types = f.get("layer_types", ("full_attention",) * f["n_layer"])
        full, linear = types.count("full_attention"), types.count("linear_attention")
        hs = f.get("head_dim", f["n_embd"] // f["n_head"])                     # OLMo: hidden size / heads
        kv = 2 * ((f["kv_lora_rank"] + f["qk_rope_head_dim"]) if "kv_lora_rank" in f else 2 * f["n_kv_head"] * hs)
        if "linear_num_heads" in f:
            nh, d = f["linear_num_heads"], f["linear_head_dim"]
            state, channels = nh * d * d, 3 * nh * d
        elif linear:
            state = f["linear_v_heads"] * f["linear_k_dim"] * f["linear_v_dim"]
            channels = 2 * f["linear_k_heads"] * f["linear_k_dim"] + f["linear_v_heads"] * f["linear_v_dim"]
        else:
            state = channels = 0
        window = (f.get("conv_kernel", 1) - 1) * channels * 2
        return memory.FamilyCache(full, linear, kv, 2 * state, window, full * kv, linear * (2 * state + window))
    table = memory.family_table()
    for name, (_, fields) in memory.RELEASED.items():
        c = memory.family_cache(name)
        assert c == by_hand(fields), (name, c, by_hand(fields))
        row = next(line for line in table.splitlines() if line.startswith(f"| {name} |"))
        for T in memory.CACHE_LENGTHS:
            assert f"| {(T * c.per_token + c.fixed) / memory.GIB:.2f} GiB" in row, (name, T, row)
    whole = {name: 131072 * c.per_token + c.fixed for name, c in ((n, memory.family_cache(n)) for n in memory.RELEASED)}
    assert 4.4 < whole["Qwen3-8B (softmax only)"] / whole["Qwen3.5"] < 4.6          # the page: 4.5x
    assert 20.5 < whole["Qwen3-8B (softmax only)"] / whole["Kimi Linear"] < 21.5     # 21x
    hybrids = [memory.family_cache(n) for n in memory.RELEASED if "softmax" not in n]
    assert 22 * 2**20 < min(c.fixed for c in hybrids) and max(c.fixed for c in hybrids) < 38 * 2**20
    # the tokens from which the softmax layers' share outgrows the fixed part: the page's 230 to 3,400
    assert [round(c.fixed / c.per_token, -1) for c in hybrids] == [800, 1610, 3410, 230]
