"""The tables of docs/linear_attention.md: linear attention as a memory that each token writes and
each query reads.

Prints the page's three tables. Run from the repository root with GPT-2's vocabulary (offline:
TIKTOKEN_CACHE_DIR, see the README's "The tokenizer offline"):

    python docs/linear_attention.py

1. The sentence's GPT-2 tokens, each given a key of length 1 and a value of width DIM = 4 drawn
   from its token id, are written one by one into a (4, 4) state by the delta rule with beta = 1
   and no decay (numpy_attn/gated_delta_rule.py's gated_delta_rule_forward, q = k and scale 1, so
   that its output is the state's reading of each token's own key). The table gives what reading
   the state with each key returns against the value written: before the write, right after it,
   and after the last token.
2. Its first KEPT tokens written under orthonormal keys (the identity's rows) with a decay of
   DECAY per step: reading each key after the last write returns its value times DECAY to the
   number of steps since.
3. The bytes a Qwen3.5 layer keeps per sequence: a full-attention layer's key/value cache, which
   grows with the tokens, beside a linear-attention layer's state, which does not.
4. The whole cache of one sequence for each hybrid family (Qwen3.5, Qwen3-Next, Kimi Linear, OLMo
   Hybrid) and a softmax-only one (Qwen3-8B), at its released sizes (RELEASED), from the family's
   own cache constructor (numpy_attn's FAMILY.kv_cache, built for one token): a softmax layer's
   key/value bytes per token, a linear layer's fixed state and convolution window, and the whole
   model's cache at CACHE_LENGTHS tokens.

Everything is NumPy: numpy_attn's operations, no torch.
"""

import sys
from typing import NamedTuple

import ml_dtypes
import numpy as np

from attn_cli import tokenizer
from numpy_attn._family import families
from numpy_attn.gated_delta_rule import gated_delta_rule_forward

SENTENCE = "The cat sat on the mat"
DIM = 4            # dk = dv: a state of 4 x 4 numbers, smaller than the sentence
SEED = 0
DECAY = 0.8        # exp(g) per step in the second table: g = log 0.8
KEPT = DIM         # orthonormal keys: at most dk of them

# Qwen3.5's layer sizes: the defaults of transformers' Qwen3_5TextConfig (transformers 5.24);
# parity_tests/test_docs_linear_attention.py checks them against the installed transformers.
QWEN3_5 = {
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "num_key_value_heads": 4,
    "head_dim": 256,
}
ITEMSIZE = 2                   # bytes of a bfloat16, the checkpoints' dtype
LENGTHS = (1024, 8192, 32768)
MIB = 2**20


def every_fourth(n_layer, first):
    """Layer types with layers first, first + 4, ... full attention and the others linear."""
    return tuple("full_attention" if i >= first and (i - first) % 4 == 0 else "linear_attention"
                 for i in range(n_layer))


# Each family's released sizes, in its numpy_attn config's fields (the config.json names in the
# comments): the defaults of transformers 5.24's configs, which are the released models' (Qwen3.5's
# text model; Qwen3-Next-80B-A3B; Kimi-Linear-48B-A3B; OLMo Hybrid 7B), and Qwen3-8B's config.json
# for a model of softmax layers only. parity_tests/test_docs_linear_attention.py checks the four
# hybrids against the installed transformers. Only what the cache holds is given; the rest (vocabulary,
# widths of the feed-forward networks) stays at the config's small defaults.
RELEASED = {
    "Qwen3-8B (softmax only)": ("qwen3", dict(          # hidden_size, num_hidden_layers, heads, kv heads, head_dim
        n_embd=4096, n_layer=36, n_head=32, n_kv_head=8, head_dim=128)),
    "Qwen3.5": ("qwen3_5", dict(
        n_embd=4096, n_layer=32, n_head=16, n_kv_head=4, head_dim=256, layer_types=every_fourth(32, 3),
        linear_k_heads=16, linear_v_heads=32, linear_k_dim=128, linear_v_dim=128, conv_kernel=4)),
    "Qwen3-Next": ("qwen3_next", dict(
        n_embd=2048, n_layer=48, n_head=16, n_kv_head=2, head_dim=256, layer_types=every_fourth(48, 3),
        linear_k_heads=16, linear_v_heads=32, linear_k_dim=128, linear_v_dim=128, conv_kernel=4)),
    "Kimi Linear": ("kimi_linear", dict(                # MLA: kv_lora_rank, qk_rope_head_dim; KDA heads
        n_embd=2304, n_layer=27, n_head=32, kv_lora_rank=512, qk_rope_head_dim=64, layer_types=every_fourth(27, 4),
        linear_num_heads=32, linear_head_dim=128, conv_kernel=4)),
    "OLMo Hybrid": ("olmo_hybrid", dict(
        n_embd=3840, n_layer=32, n_head=30, n_kv_head=30, layer_types=every_fourth(32, 3),
        linear_k_heads=30, linear_v_heads=30, linear_k_dim=96, linear_v_dim=192, conv_kernel=4)),
}
CACHE_LENGTHS = (4096, 32768, 131072)
GIB = 2**30


class Written(NamedTuple):
    """A sequence written into the state: its keys and values and every state along the way."""

    keys: np.ndarray        # (T, DIM), each of length 1
    values: np.ndarray      # (T, DIM)
    states: np.ndarray      # (T + 1, DIM, DIM), states[t] = S_t, S_0 = 0
    reads: np.ndarray       # (T, DIM), S_t^T k_t: the op's output with q = k, scale 1
    decay: float


def token_vectors(ids):
    """A key of length 1 and a value (DIM,) for each token id, drawn from the id and SEED: the same
    token always gets the same pair. -> keys (T, DIM), values (T, DIM)."""
    pairs = [np.random.default_rng((SEED, int(i))).standard_normal((2, DIM)) for i in ids]
    keys = np.stack([key / np.linalg.norm(key) for key, _ in pairs])          # (T, DIM)
    values = np.stack([value for _, value in pairs])                          # (T, DIM)
    return keys, values


def write(keys, values, decay=1.0, beta=1.0):
    """Write values (T, DIM) under keys (T, DIM) into a zero state, one token at a time -> Written.

    One batch row and one head; q = k and scale = 1 make the output row t the state's reading of
    k_t just after k_t's write."""
    T = keys.shape[0]
    g = np.full((1, 1, T), np.log(decay))                                     # (B, nh, T)
    betas = np.full((1, 1, T), float(beta))                                   # (B, nh, T)
    reads, _, cache = gated_delta_rule_forward(keys[None, None], keys[None, None], values[None, None], g, betas,
                                               scale=1.0)                     # reads (1, 1, T, DIM)
    return Written(keys, values, cache.states[0, 0], reads[0, 0], decay)


def recall_errors(written):
    """|S^T k_t - v_t| for each token t read from three states -> (before, after, last), (T,) each:
    before its write (the decayed S_(t-1), what the delta compares v_t with), right after it,
    and after the last token."""
    keys, values, states = written.keys, written.values, written.states
    T = keys.shape[0]
    before = np.einsum("tkv,tk->tv", written.decay * states[:T], keys)      # (T, DIM)
    last = keys @ states[T]                                                   # (T, DIM)
    return tuple(np.linalg.norm(reads - values, axis=-1) for reads in (before, written.reads, last))


def tokens(ids):
    """Each id's text, its spaces stripped (a label)."""
    return [tokenizer.decode([i]).strip() for i in ids]


def write_table(words, written):
    """Table 1: each token's recall error before its write, right after it and after the last token."""
    before, after, last = recall_errors(written)
    lines = ["| t | token | \\|v_t\\| | before the write | right after it | after the last token | \\|S_t\\| |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for t, word in enumerate(words):
        lines.append(f"| {t + 1} | `{word}` | {np.linalg.norm(written.values[t]):.3f} | {before[t]:.3f} | "
                     f"{after[t]:.3f} | {last[t]:.3f} | {np.linalg.norm(written.states[t + 1]):.3f} |")
    return "\n".join(lines)


def decay_table(words, written):
    """Table 2: each key read after the last write, as a share of its value, beside DECAY^steps."""
    T = len(words)
    last = written.keys @ written.states[T]                                   # (T, DIM)
    d = f"{written.decay:g}"
    lines = [f"| t | token | writes since, n | {d}^n | \\|S^T k_t\\| / \\|v_t\\| | \\|S^T k_t - {d}^n v_t\\| |",
             "|---:|---|---:|---:|---:|---:|"]
    for t, word in enumerate(words):
        since = T - 1 - t
        faded = written.decay**since
        share = np.linalg.norm(last[t]) / np.linalg.norm(written.values[t])
        lines.append(f"| {t + 1} | `{word}` | {since} | {faded:.3f} | {share:.3f} | "
                     f"{np.linalg.norm(last[t] - faded * written.values[t]):.3f} |")
    return "\n".join(lines)


def layer_bytes(config=QWEN3_5, itemsize=ITEMSIZE):
    """What one layer keeps per sequence -> (kv bytes per token, state bytes, convolution window bytes).

    Full attention: a key and a value of head_dim for each of its num_key_value_heads per token.
    Linear attention: one (dk, dv) state per value head (the key heads are shared among them, as
    key/value heads are in grouped-query attention), and the short convolution's last
    kernel - 1 inputs of q, k and v together (what the next step needs; transformers' cache holds
    kernel of them)."""
    kv_per_token = 2 * config["num_key_value_heads"] * config["head_dim"] * itemsize
    state = (config["linear_num_value_heads"] * config["linear_key_head_dim"] * config["linear_value_head_dim"]
             * itemsize)
    conv_dim = (2 * config["linear_num_key_heads"] * config["linear_key_head_dim"]
                + config["linear_num_value_heads"] * config["linear_value_head_dim"])
    window = (config["linear_conv_kernel_dim"] - 1) * conv_dim * itemsize
    return kv_per_token, state, window


def size_table(config=QWEN3_5, lengths=LENGTHS):
    """Table 3: one layer's bytes per sequence at each length, in MiB."""
    kv_per_token, state, window = layer_bytes(config)
    lines = ["| tokens | key/value cache (full attention) | state + convolution window (linear attention) |",
             "|---:|---:|---:|"]
    for T in lengths:
        lines.append(f"| {T:,} | {T * kv_per_token / MIB:.2f} MiB | {(state + window) / MIB:.2f} MiB |")
    lines.append(f"\nPer token the cache grows by {kv_per_token:,} bytes; the state is {state:,} bytes and the "
                 f"window {window:,}, whatever the length: the cache outgrows them at "
                 f"{-(-(state + window) // kv_per_token):,} tokens.")
    return "\n".join(lines)


class FamilyCache(NamedTuple):
    """What one sequence's cache holds in a family's model, in bfloat16 (bytes)."""

    full_layers: int
    linear_layers: int
    kv_per_token: int       # one softmax layer's keys and values of one token
    state: int              # one linear layer's recurrent state
    window: int             # one linear layer's convolution window
    per_token: int          # what each token adds to the whole cache (every softmax layer)
    fixed: int              # the linear layers' states and windows, whatever the length


def family_cache(name):
    """FamilyCache of RELEASED[name], read off the family's cache constructor built for one token."""
    family, fields = RELEASED[name]
    f = families()[family]
    config = f.config(vocab_size=8, block_size=1, **fields)
    one = f.kv_cache(config, 1, np.dtype(ml_dtypes.bfloat16), 1)
    states = [s for s in getattr(one, "states", []) if s is not None]
    full = config.n_layer - len(states)
    return FamilyCache(full, len(states), one.bytes_per_token // full,
                       states[0]["recurrent"].nbytes if states else 0, states[0]["conv"].nbytes if states else 0,
                       one.bytes_per_token, getattr(one, "state_nbytes", 0))


def family_table(lengths=CACHE_LENGTHS):
    """Table 4: each family's layers, per-layer bytes and whole cache at each length (GiB)."""
    lines = ["| model | softmax + linear layers | K/V per token, one softmax layer | state + window, one linear "
             "layer | " + " | ".join(f"cache at {T // 1024}k tokens" for T in lengths) + " |",
             "|---|---:|---:|---:|" + "---:|" * len(lengths)]
    for name in RELEASED:
        c = family_cache(name)
        linear = f"{c.state:,} + {c.window:,} bytes" if c.linear_layers else "-"
        lines.append(f"| {name} | {c.full_layers} + {c.linear_layers} | {c.kv_per_token:,} bytes | {linear} | "
                     + " | ".join(f"{(T * c.per_token + c.fixed) / GIB:.2f} GiB" for T in lengths) + " |")
    return "\n".join(lines)


def main():
    try:
        ids = np.array(tokenizer.encode(SENTENCE))
        words = tokens(ids)
    except tokenizer.TokenizerUnavailable as err:
        sys.exit(str(err))
    keys, values = token_vectors(ids)
    print(write_table(words, write(keys, values)))
    print()
    print(decay_table(words[:KEPT], write(np.eye(DIM)[:KEPT], values[:KEPT], decay=DECAY)))
    print()
    print(size_table())
    print()
    print(family_table())


if __name__ == "__main__":
    main()
