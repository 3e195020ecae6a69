"""The decoding loop both ``numpy-attn generate`` commands share: a train checkpoint's
(attn_cli/generate.py) and a Hugging Face folder's (attn_cli/hf_generate.py). continue_ids extends
a prompt a token at a time with a model's forward and, when given, its key/value cache; next_token
draws each token, greedy or sampled.
"""

import os

import numpy as np

from attn_cli.hf.files import bytes_text
from numpy_attn.softmax import softmax_forward

# A prompt enters the cache this many ids at a time, each chunk's forward with for_backward=False,
# which holds one block's activations at a time (numpy_attn/_model.py). A forward that kept them
# for a backward held them for every block and prompt token: GPT-2 124M (a 475 MiB file) with a
# 512-token prompt peaked at 1158 MiB in one such forward and 632 MiB in chunks of 64. Without them
# chunks can be larger, and a linear's BLAS call runs faster on more rows (84 GFLOP/s on 64 rows of
# (768, 2304), 94 on 256, one thread). Prefill of 512 tokens, one thread (two), median of 4: chunks
# of 64 1.61 s (0.99), 128 1.29 s (0.81), 256 1.24 s (0.78), 512 1.34-1.39 s (0.93), peak 566-630 MiB.
PREFILL_CHUNK = 256


def continue_ids(forward, ids, block_size, max_new_tokens, temperature=1.0, top_k=None, rng=None,
                 new_cache=None):
    """Extend ``ids`` by ``max_new_tokens`` ids; ``forward(ids (1, T), logits_to_keep=1,
    for_backward=False) -> logits (1, 1, V)``, the last position's, with nothing kept for a backward:
    the one sampling loop, for train checkpoints and Hugging Face folders alike (see next_token).
    Each step reads the last logits only, so the model's head runs on one position, not on all T
    of a long prompt (as transformers' generate asks for).

    ``new_cache(max_len)``, when given, makes the model's key/value cache, sized by what this call
    decodes (the prompt and the new tokens, at most block_size), never by the context alone: a
    config may claim a context of billions. While all ids fit in block_size,
    ``forward(ids, kv_cache=kv_cache)`` is given only the ids the cache has not seen (the prompt,
    PREFILL_CHUNK ids at a time, then one token); once the context slides every position moves, so
    it runs the last block_size ids afresh, without the cache. A prompt longer than block_size is
    refused, not cut.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if len(ids) > block_size:
        raise ValueError(f"the prompt is {len(ids)} tokens, longer than the context of block_size = {block_size}")
    ids = list(ids)
    kv_cache = None if new_cache is None else decoding_cache(new_cache, len(ids) + max_new_tokens, block_size)
    for _ in range(max_new_tokens):
        if kv_cache is None or len(ids) > block_size:
            logits = forward(np.array([ids[-block_size:]]), logits_to_keep=1, for_backward=False)   # (1, 1, V)
        else:   # the ids the cache has not seen: the prompt in chunks, then the last new id
            for start in range(kv_cache.length, len(ids), PREFILL_CHUNK):
                chunk = np.array([ids[start:start + PREFILL_CHUNK]])                         # (1, <= PREFILL_CHUNK)
                logits = forward(chunk, kv_cache=kv_cache, logits_to_keep=1, for_backward=False)   # (1, 1, V)
        ids.append(next_token(logits[0, -1], temperature, top_k, rng))
    return ids


def next_token(logits, temperature, top_k, rng):
    """Greedy at temperature 0, else a draw from softmax(logits / temperature) over the top_k."""
    logits = logits.astype(np.float64)
    if not np.isfinite(logits).all():          # argmax would pick a NaN's position without a word
        raise ValueError("the model's logits hold NaN or infinite values: its weights or inputs are broken")
    if temperature == 0:
        return int(np.argmax(logits))
    # The largest logit moved to 0 first: the softmax is the same, and a temperature as small as
    # 1e-300 then sends the others to -inf (a greedy draw) instead of every logit to +-inf (NaN).
    with np.errstate(over="ignore"):
        logits = (logits - logits.max()) / temperature
    if top_k is not None and top_k < len(logits):
        kth = np.sort(logits)[-top_k]
        logits = np.where(logits < kth, -np.inf, logits)                    # keep the top k
    probs, _ = softmax_forward(logits)
    return int(rng.choice(len(probs), p=probs))


def decoding_cache(new_cache, tokens, block_size):
    """``new_cache(max_len)`` for ``tokens`` tokens, at most block_size, once its size in bytes is
    known to fit in the memory this process may take (memory_limits): else a ValueError giving
    the bytes and the limit, before the allocation. The size counts every layer from a cache of
    one slot: a full layer holds max_len tokens, a sliding one min(window, max_len)."""
    max_len = min(tokens, block_size)
    need = cache_bytes(new_cache(1), max_len)
    for what, memory in memory_limits().items():
        if need > memory:
            raise ValueError(f"the key/value cache for {max_len:,} tokens (the prompt and --max-new-tokens, "
                             f"within the context of {block_size:,}{_windows_text(new_cache(1))}) needs "
                             f"{need:,} bytes ({bytes_text(need)}), more than {what}, {bytes_text(memory)}: "
                             f"lower --max-new-tokens")
    return new_cache(max_len)


def cache_bytes(one, max_len):
    """Bytes of ``one`` (a cache of one slot) grown to max_len slots: every key/value layer's bytes a
    token times its slots (max_len, or min(window, max_len) on a sliding layer), times the batch, and
    the states of a fixed size a cache may hold besides (``state_nbytes``: Qwen3.5's Gated DeltaNet
    layers) and the layers of a second head size it holds in a cache of their own (``wide``: Gemma
    4's wider global heads). A cache without sliding layers (MLA's) grows by its bytes_per_token a slot."""
    windows = getattr(one, "windows", None)
    if windows is None:
        return one.bytes_per_token * max_len
    B, nkv, _, hs = one.dims
    layer_bytes = nkv * (hs + one.v_hs) * one.buffer_k.itemsize             # one key/value layer, a token
    wide = getattr(one, "wide", None)
    return B * sum(layer_bytes * (max_len if w is None else min(w, max_len)) for w in windows) + \
        getattr(one, "state_nbytes", 0) + (0 if wide is None else cache_bytes(wide, max_len))


def _windows_text(one):
    """', sliding layers hold min(window, tokens): windows [...]' where the cache has them, else ''."""
    windows = sorted({w for w in getattr(one, "windows", ()) if w is not None})
    return f"; sliding layers hold min(window, tokens), windows {windows}" if windows else ""


def physical_memory():
    """The machine's memory in bytes, or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def memory_limits():
    """{what: bytes} of every limit on the memory this process may still take, where the system
    says it: the machine's memory; the address-space limit (ulimit -v, RLIMIT_AS) less the
    address space in use; the cgroup's limit less its use. A refusal names the one exceeded."""
    limits = {}
    memory = physical_memory()
    if memory is not None:
        limits["this machine's memory"] = memory
    address_space = address_space_limit()
    if address_space is not None:
        left = max(0, address_space - _in_use("/proc/self/statm"))
        limits["the address space left under ulimit -v (RLIMIT_AS)"] = left
    cgroup = cgroup_memory_limit()
    if cgroup is not None:
        limits["the memory left under this cgroup's limit"] = cgroup
    return limits


def address_space_limit():
    """The soft RLIMIT_AS in bytes (ulimit -v), or None where there is none."""
    try:
        import resource
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, AttributeError, ValueError, OSError):
        return None
    return None if soft == resource.RLIM_INFINITY or soft < 0 else soft


def cgroup_memory_limit(root="/sys/fs/cgroup"):
    """Bytes the cgroup may still take: its limit less its use, v2 (memory.max, memory.current)
    or v1 (memory/memory.limit_in_bytes, memory.usage_in_bytes); None where neither says."""
    for limit, usage in (("memory.max", "memory.current"),
                         ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        text = _read(os.path.join(root, limit))
        if text is None or not text.isdigit():      # absent, or "max": no limit at this level
            continue
        used = _read(os.path.join(root, usage))
        cap = int(text)
        if cap >= 2**62:                            # v1 writes "no limit" as a page-rounded 2^63 - 1
            continue
        return max(0, cap - (int(used) if used is not None and used.isdigit() else 0))
    return None


def _read(path):
    """The file's text, stripped, or None where it cannot be read."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _in_use(statm):
    """Bytes of address space this process holds now (the first field of /proc/self/statm, in
    pages), 0 where it cannot be read."""
    text = _read(statm)
    try:
        return int(text.split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, IndexError, ValueError, OSError):
        return 0
