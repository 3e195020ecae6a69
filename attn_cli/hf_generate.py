"""``numpy-attn generate --hf DIR``: continue a prompt with a Hugging Face checkpoint, in NumPy.

The folder is one that ``huggingface-cli download gpt2 --local-dir gpt2`` (or ``save_pretrained``)
writes: config.json and model.safetensors, read by attn_cli.hf. GPT-2 folders take ``--prompt``
text, encoded with GPT-2's tokenizer (attn_cli.tokenizer), and print text. Llama folders come with
tokenizers this project does not implement, so they take ``--ids 1,2,3`` and print ids. Both
decode with a key/value cache (numpy_attn/kv_cache.py): the prompt runs once, then each new token
alone, while the context fits in block_size; ``--no-cache`` runs the whole context for every token
instead (the same tokens, more slowly).
"""

import numpy as np

from numpy_attn.softmax import softmax_forward


def parse_ids(text):
    """``"1,2,3"`` -> [1, 2, 3]; a clear ValueError for anything else."""
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--ids must be comma-separated integers such as 1,2,3, got {text!r}") from None
    if not ids:
        raise ValueError("--ids is empty: give at least one token id, such as 1,2,3")
    return ids


def next_token(logits, temperature, top_k, rng):
    """Greedy at temperature 0, else a draw from softmax(logits / temperature) over the top_k."""
    logits = logits.astype(np.float64)
    if temperature == 0:
        return int(np.argmax(logits))
    logits = logits / temperature
    if top_k is not None and top_k < len(logits):
        kth = np.sort(logits)[-top_k]
        logits = np.where(logits < kth, -np.inf, logits)                    # keep the top k
    probs, _ = softmax_forward(logits)
    return int(rng.choice(len(probs), p=probs))


def generate(forward, ids, block_size, max_new_tokens, temperature=1.0, top_k=None, rng=None,
             kv_cache=None):
    """Extend ``ids`` by ``max_new_tokens`` ids; ``forward(ids (1, T)) -> logits (1, T, V)``.

    With a ``kv_cache``, ``forward(ids, kv_cache=kv_cache)`` is given only the ids the cache has
    not seen (the prompt, then one token) while all ids fit in block_size; once the context
    slides every position moves, so it runs the last block_size ids afresh, without the cache.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    ids = list(ids)
    for _ in range(max_new_tokens):
        if kv_cache is None or len(ids) > block_size:
            logits = forward(np.array([ids[-block_size:]]))                  # (1, T) -> (1, T, V)
        else:
            logits = forward(np.array([ids[kv_cache.length:]]), kv_cache=kv_cache)   # (1, T_new) -> (1, T_new, V)
        ids.append(next_token(logits[0, -1], temperature, top_k, rng))
    return ids


def run(args):
    """Load ``args.hf``, continue the prompt or the ids, print text (GPT-2) or ids (Llama)."""
    from attn_cli.hf import load_checkpoint
    from numpy_attn.gpt import gpt_forward, gpt_kv_cache
    from numpy_attn.llama import llama_forward, llama_kv_cache

    kind, config, params = load_checkpoint(args.hf, np.float32)
    new_cache = gpt_kv_cache if kind == "gpt2" else llama_kv_cache
    kv_cache = new_cache(config, 1, params["wte"].dtype) if args.cache and config.n_layer else None
    if kind == "gpt2":
        from attn_cli import tokenizer

        if args.ids is not None:
            prompt_ids = parse_ids(args.ids)
        elif args.prompt:
            prompt_ids = tokenizer.encode(args.prompt)
        else:
            raise ValueError("give --prompt TEXT (or --ids 1,2,3) to continue")
        out = generate(lambda ids, **kw: gpt_forward(ids, params, config, **kw)[0], prompt_ids,
                       config.block_size, args.max_new_tokens, args.temperature, args.top_k,
                       np.random.default_rng(args.seed), kv_cache)
        print(tokenizer.decode(out) if args.ids is None else ",".join(map(str, out)))
        return 0
    if args.ids is None:
        raise ValueError(f"{args.hf} is a Llama checkpoint, whose tokenizer numpy-attn does not "
                         "implement: give the prompt as token ids, --ids 1,2,3 (its tokenizer "
                         "gives them), and read the continuation as ids")
    out = generate(lambda ids, **kw: llama_forward(ids, params, config, **kw)[0], parse_ids(args.ids),
                   config.block_size, args.max_new_tokens, args.temperature, args.top_k,
                   np.random.default_rng(args.seed), kv_cache)
    print(",".join(map(str, out)))
    return 0
