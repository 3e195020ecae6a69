"""``numpy-attn generate``: continue a prompt with a checkpoint of ``numpy-attn train``.

Greedy decoding (``--temperature 0``) or sampling at a temperature, optionally from the ``--top-k``
most likely tokens, with ``--seed``; the context is the last ``block_size`` tokens. The model runs
each new token only, reading the past ones' keys and values from a key/value cache, until the
context is full; ``--no-cache`` runs the whole context for every token instead (the same tokens).
"""

import dataclasses
import os

import numpy as np

from attn_cli import term
from attn_cli.checkpoint import CHECKPOINT, DEFAULT_OUT
from numpy_attn.gpt import gpt_forward, gpt_kv_cache
from numpy_attn.softmax import softmax_forward

HELP = "continue a prompt with a checkpoint of numpy-attn train"

EXPECT = ("What to expect: the default model (two blocks of width 32, trained for 500 steps, about "
          "25 s) has learnt which tokens tend to follow which in the Python documentation, not "
          "grammar or meaning. Its continuations are word salad with the corpus's vocabulary and "
          "some of its phrases; that is expected, and a run of many more steps and a wider model "
          "(--n-embd, --n-layer) does better.")

EXAMPLES = f"""examples:
  numpy-attn generate --prompt "The with statement"
  numpy-attn generate --prompt "The with statement" --temperature 0       greedy
  numpy-attn generate --checkpoint my-run --prompt "A list" --top-k 40 --temperature 0.8
  numpy-attn generate --hf gpt2 --prompt "The meaning of life is" --temperature 0
  numpy-attn generate --hf TinyLlama --ids 1,450,6593,310 --max-new-tokens 8

The checkpoint defaults to {DEFAULT_OUT}, the folder numpy-attn train writes by default.
"""


def generate(params, config, ids, max_new_tokens, temperature=1.0, top_k=None, rng=None, cache=True):
    """Extend ``ids`` (T0,) by ``max_new_tokens`` model ids: greedy at temperature 0, else sampled
    from softmax(logits / temperature), restricted to the top_k most likely when given; with
    ``cache``, decoding with a key/value cache while the context fits (see _next_logits)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    config = dataclasses.replace(config, dropout=0.0)
    ids = list(ids)
    kv_cache = gpt_kv_cache(config, 1, params["wte"].dtype) if cache and config.n_layer else None
    for _ in range(max_new_tokens):
        logits = _next_logits(params, config, ids, kv_cache)                # (V,)
        if temperature == 0:
            ids.append(int(np.argmax(logits)))
            continue
        logits = logits / temperature
        if top_k is not None and top_k < len(logits):
            kth = np.sort(logits)[-top_k]
            logits = np.where(logits < kth, -np.inf, logits)                # keep the top k
        probs, _ = softmax_forward(logits)
        ids.append(int(rng.choice(len(probs), p=probs)))
    return ids


def _next_logits(params, config, ids, kv_cache):
    """Logits (V,) in float64 of the token after ``ids``. With a cache, while all ids fit in
    block_size, the model runs only the ids the cache has not seen (the prompt, then one token);
    once the context slides, every position moves, so it runs the last block_size ids afresh."""
    if kv_cache is None or len(ids) > config.block_size:
        context = np.array([ids[-config.block_size:]])                      # (1, T)
        return gpt_forward(context, params, config)[0][0, -1].astype(np.float64)
    new = np.array([ids[kv_cache.length:]])                                 # (1, T_new)
    return gpt_forward(new, params, config, kv_cache=kv_cache)[0][0, -1].astype(np.float64)


def add_arguments(p):
    term.describe(p, ("Continue --prompt with the mini GPT of a numpy-attn train run, in NumPy. "
                     + EXPECT), EXAMPLES)
    p.add_argument("--checkpoint", metavar="PATH", default=None,
                   help=f"a run folder of numpy-attn train, or its model.npz (default {DEFAULT_OUT}, "
                        "train's default --out)")
    p.add_argument("--prompt", help="the text to continue")
    p.add_argument("--hf", metavar="DIR", default=None,
                   help="a Hugging Face GPT-2 or Llama folder (config.json + model.safetensors) "
                        "instead of a train checkpoint; see attn_cli/hf_generate.py")
    p.add_argument("--ids", metavar="1,2,3", default=None,
                   help="with --hf: the prompt as token ids (Llama folders need it); prints ids")
    p.add_argument("--max-new-tokens", type=int, default=40, dest="max_new_tokens",
                   help="tokens to add (default 40)")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="sampling temperature; 0 is greedy (default 1.0)")
    p.add_argument("--top-k", type=int, default=None, dest="top_k",
                   help="sample from the k most likely tokens only")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling (default 0)")
    p.add_argument("--no-cache", action="store_false", dest="cache",
                   help="run the whole context for every new token instead of decoding with a "
                        "key/value cache (slower; the same tokens)")


def run(args):
    """Continue ``--prompt`` with the checkpoint's model and print the text."""
    from attn_cli import tokenizer
    from attn_cli.checkpoint import load_checkpoint
    from attn_cli.train import to_model_ids

    for option, value, low in (("--max-new-tokens", args.max_new_tokens, 0), ("--seed", args.seed, 0),
                               ("--top-k", 1 if args.top_k is None else args.top_k, 1)):
        if value < low:
            raise ValueError(f"{option} must be at least {low}, got {value}")
    if not (np.isfinite(args.temperature) and args.temperature >= 0):
        raise ValueError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    if args.hf is not None:
        from attn_cli import hf_generate

        return hf_generate.run(args)
    if args.ids is not None:
        raise ValueError("--ids goes with --hf DIR (a Hugging Face folder); give --prompt text here")
    path = args.checkpoint
    if path is None:
        path = DEFAULT_OUT
        if not os.path.exists(os.path.join(path, CHECKPOINT)):
            raise ValueError(f"no checkpoint in {path}: run numpy-attn train first (it writes "
                             f"{path}), or name a run folder with --checkpoint")
    params, config, vocab = load_checkpoint(path)
    if not args.prompt:
        raise ValueError("the prompt is empty: give some text to continue")
    ids = to_model_ids(tokenizer.encode(args.prompt), vocab)
    if len(ids) > config.block_size:
        raise ValueError(f"the prompt is {len(ids)} tokens, longer than the context of "
                         f"block_size = {config.block_size}")
    out = generate(params, config, ids, args.max_new_tokens, args.temperature, args.top_k,
                   np.random.default_rng(args.seed), cache=args.cache)
    print(tokenizer.decode(vocab[out]))
    return 0

