"""``numpy-attn generate``: continue a prompt with a checkpoint of ``numpy-attn train``.

Greedy decoding (``--temperature 0``) or sampling at a temperature, optionally from the ``--top-k``
most likely tokens, with ``--seed``; a prompt longer than the context (``block_size``) is refused,
and once prompt and new tokens pass it the context is the last ``block_size`` tokens. The model
runs each new token only, reading the past ones' keys and values from a key/value cache sized for
the prompt and the new tokens, until the context is full; ``--no-cache`` runs the whole context
for every token instead (the same tokens). ``continue_ids`` (attn_cli/decoding.py) is the sampling
loop of both this command and ``generate --hf`` (attn_cli/hf_generate.py).

``--dtype`` runs the model in float32, bfloat16 or float16 (default: the dtype the checkpoint was
saved in): its parameters are rounded once to it, and the key/value cache takes it (half the bytes a
token of float32 in either low dtype).
"""

import dataclasses
import os

import numpy as np

from attn_cli import term
from attn_cli.checkpoint import CHECKPOINT, DEFAULT_OUT
from attn_cli.decoding import continue_ids
from attn_cli.hf import load_dtype
from numpy_attn._family import families
from numpy_attn._tree import leaves, unflatten
from numpy_attn.gpt import gpt_forward, gpt_kv_cache

HELP = "continue a prompt with a checkpoint of numpy-attn train"

EXPECT = ("What to expect: the default model (two blocks of width 32, trained for 500 steps, about "
          "half a minute) has learnt which tokens tend to follow which in the Python documentation, not "
          "grammar or meaning. Its continuations are word salad with the corpus's vocabulary and "
          "some of its phrases; that is expected, and a run of many more steps and a wider model "
          "(--n-embd, --n-layer) does better.")

EXAMPLES = f"""examples:
  numpy-attn generate --prompt "The with statement"
  numpy-attn generate --prompt "The with statement" --top-k 10            the 10 likeliest only
  numpy-attn generate --checkpoint my-run --prompt "A list" --top-k 40 --temperature 0.8
  numpy-attn generate --hf gpt2 --prompt "The meaning of life is" --temperature 0       greedy
  numpy-attn generate --hf TinyLlama --ids 1,450,6593,310 --max-new-tokens 8
  numpy-attn generate --hf TinyLlama --ids 1,450,6593,310 --dtype bfloat16      as stored, half the cache

The checkpoint defaults to {DEFAULT_OUT}, the folder numpy-attn train writes by default. Greedy
decoding (--temperature 0) suits a real model such as GPT-2; the small default model, greedy, ends
the line and then repeats the token it saw most after one (indentation spaces), so sample it.
"""


# The dtypes --dtype takes: the model runs in it and its key/value cache holds it.
DTYPES = ("float32", "bfloat16", "float16")


def generate(params, config, ids, max_new_tokens, temperature=1.0, top_k=None, rng=None, cache=True):
    """Extend ``ids`` (T0,) by ``max_new_tokens`` ids of the mini GPT ``params``, ``config``
    (numpy_attn/gpt.py, dropout off): continue_ids with its forward and, with ``cache``, its
    key/value cache."""
    config = dataclasses.replace(config, dropout=0.0)
    dtype = params["wte"].dtype
    new_cache = (lambda max_len: gpt_kv_cache(config, 1, dtype, max_len)) if cache and config.n_layer else None
    return continue_ids(lambda x, **kw: gpt_forward(x, params, config, **kw)[0], ids, config.block_size,
                        max_new_tokens, temperature, top_k, rng, new_cache)


def params_in(params, dtype, source):
    """``params`` (a tree of float arrays) rounded once to ``dtype`` (a NumPy dtype): a ValueError
    names the first parameter of ``source`` whose values lie beyond the range of ``dtype`` (a
    float32 weight above float16's 65504), rather than running the model with an infinity."""
    out = {}
    for path, a in leaves(params):
        with np.errstate(over="ignore"):                 # an overflow is refused below, by name
            out[path] = a.astype(dtype, copy=False)
        if not np.isfinite(out[path]).all():
            raise ValueError(f"{source}: parameter {path} holds values beyond the range of {dtype} "
                             f"(largest |value| {float(np.abs(a).max()):.6g}); leave out --dtype to generate "
                             f"in {a.dtype}, as saved")
    return unflatten(out)


def add_arguments(p):
    term.describe(p, ("Continue --prompt with the mini GPT of a numpy-attn train run, in NumPy. "
                     + EXPECT), EXAMPLES)
    p.add_argument("--checkpoint", metavar="PATH", default=None,
                   help=f"a run folder of numpy-attn train, or its model.npz (default {DEFAULT_OUT}, "
                        "train's default --out)")
    p.add_argument("--prompt", help="the text to continue")
    titles = [family.title for family in families().values()]
    p.add_argument("--hf", metavar="DIR", default=None,
                   help=f"a Hugging Face folder (config.json + model.safetensors) of {', '.join(titles[:-1])} "
                        f"or {titles[-1]}, instead of a train checkpoint; see attn_cli/hf_generate.py")
    p.add_argument("--ids", metavar="1,2,3", default=None,
                   help="with --hf: the prompt as token ids (every family but GPT-2 needs them: numpy-attn "
                        "has GPT-2's tokenizer only); prints ids")
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
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="the dtype the model runs in and its key/value cache holds (bfloat16 and float16: half "
                        "the cache's bytes a token); default float32 for --hf (a bfloat16 folder is widened), "
                        "the dtype it was saved in for a train checkpoint")
    p.add_argument("--no-absorb", action="store_false", dest="absorb",
                   help="with --hf DIR of a DeepSeek-V3 model: decode with the naive cache of every head's "
                        "keys and values, not the absorbed latent cache (the same tokens)")


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
    if not args.absorb:
        raise ValueError("--no-absorb goes with --hf DIR of a DeepSeek-V3 model (multi-head latent attention); "
                         "a train checkpoint has none")
    path = args.checkpoint
    if path is not None and not os.path.exists(path):
        raise ValueError(f"--checkpoint {path}: no such folder; give a run folder of numpy-attn train "
                         "(or its model.npz)")
    if path is None:
        path = DEFAULT_OUT
        if not os.path.exists(os.path.join(path, CHECKPOINT)):
            raise ValueError(f"no checkpoint in {path}: run numpy-attn train first (it writes "
                             f"{path}), or name a run folder with --checkpoint")
    params, config, vocab = load_checkpoint(path)
    if args.dtype is not None:
        params = params_in(params, load_dtype(args.dtype), path)
    if not args.prompt:
        raise ValueError("the prompt is empty: give some text to continue")
    ids = to_model_ids(tokenizer.encode(args.prompt), vocab)
    out = generate(params, config, ids, args.max_new_tokens, args.temperature, args.top_k,
                   np.random.default_rng(args.seed), cache=args.cache)
    print(tokenizer.decode(vocab[out]))
    return 0

