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

Everything is NumPy: numpy_attn's operations, no torch.
"""

import sys
from typing import NamedTuple

import numpy as np

from attn_cli import tokenizer
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


if __name__ == "__main__":
    main()
