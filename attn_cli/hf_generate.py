"""``numpy-attn generate --hf DIR``: continue a prompt with a Hugging Face checkpoint, in NumPy.

The folder is one that ``huggingface-cli download gpt2 --local-dir gpt2`` (or ``save_pretrained``)
writes: config.json and model.safetensors, read by attn_cli.hf. GPT-2 folders take ``--prompt``
text, encoded with GPT-2's tokenizer (attn_cli.tokenizer), and print text. Llama, Qwen3 and OLMo 2
folders come with tokenizers this project does not implement, so they take ``--ids 1,2,3`` and
print ids (gpt-oss folders too). Both go
through the sampling loop of train checkpoints (attn_cli.decoding.continue_ids): a prompt longer
than the context is refused, and they decode with a key/value cache (numpy_attn/kv_cache.py)
sized for the prompt and the new tokens: the prompt runs once, then each new token alone, while
the context fits in block_size; ``--no-cache`` runs the whole context for every token instead (the
same tokens, more slowly). DeepSeek-V3 folders decode with absorbed multi-head latent attention
(each layer's cache holds the latent and the shared rotary key only, numpy_attn/deepseek_v3.py);
``--no-absorb`` decodes with the naive cache of every head's keys and values instead (the same
tokens), and is refused for a model without MLA.

``--dtype bfloat16`` (or float16) loads the parameters in that dtype (a bfloat16 folder's values as
stored, attn_cli/hf/files.py) instead of float32, and the model runs in it as PyTorch runs such a model:
each operation computes in float32 and rounds its output once (docs/precision.md); the key/value
cache holds that dtype, half the bytes a token of float32.
"""

import numpy as np

from attn_cli.decoding import continue_ids
from numpy_attn._family import families


def parse_ids(text):
    """``"1,2,3"`` -> [1, 2, 3]; a clear ValueError for anything else."""
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--ids must be comma-separated integers such as 1,2,3, got {text!r}") from None
    if not ids:
        raise ValueError("--ids is empty: give at least one token id, such as 1,2,3")
    return ids


def family_functions(kind, absorb=True):
    """(forward, new cache(config, B, dtype, max_len)) of a family of attn_cli.hf (``kind``, its row's
    name in numpy_attn._family); DeepSeek-V3 decodes with absorbed MLA unless ``absorb`` is False.
    gpt-oss's and the Gemmas' sliding layers keep only their window. benchmarks/decode_hf.py times the same."""
    family = families()[kind]
    if not family.absorb:
        return family.forward, family.kv_cache

    def new_cache(config, B, dtype, max_len):
        """Absorbed MLA decoding by default, the naive cache of every head's keys and values on request."""
        return family.kv_cache(config, B, dtype, max_len, absorb)

    return family.forward, new_cache


def run(args):
    """Load ``args.hf``, continue the prompt or the ids, print text (GPT-2) or ids (the others)."""
    from attn_cli.hf import load_checkpoint

    absorb = args.absorb
    kind, config, params = load_checkpoint(args.hf, args.dtype or "float32")
    family = families()[kind]
    if not absorb and not family.absorb:
        absorbing = " and ".join(f.title for f in families().values() if f.absorb)
        what = ("whose multi-head latent attention decodes absorbed only" if hasattr(config, "mla")
                else "without multi-head latent attention")
        raise ValueError(f"--no-absorb: {args.hf} is a {family.title} checkpoint, {what}; only {absorbing} "
                         "decodes absorbed or not")
    if kind == "gpt2" and args.ids is None:
        from attn_cli import tokenizer

        if not args.prompt:
            raise ValueError("give --prompt TEXT (or --ids 1,2,3) to continue")
        prompt, option = tokenizer.encode(args.prompt), "--prompt"
    elif args.ids is None:
        raise ValueError(f"{args.hf} is a {family.title} checkpoint, whose tokenizer numpy-attn does not "
                         "implement: give the prompt as token ids, --ids 1,2,3 (its tokenizer "
                         "gives them), and read the continuation as ids")
    else:
        prompt, option = parse_ids(args.ids), "--ids"
    bad = [i for i in prompt if not 0 <= i < config.vocab_size]
    if bad:
        raise ValueError(f"{option}: token id {bad[0]} is outside the vocabulary of {args.hf}, ids 0 to "
                         f"{config.vocab_size - 1}")
    forward, new_cache = family_functions(kind, absorb)
    dtype = params["wte"].dtype
    out = continue_ids(lambda ids, **kw: forward(ids, params, config, **kw)[0], prompt, config.block_size,
                       args.max_new_tokens, args.temperature, args.top_k, np.random.default_rng(args.seed),
                       (lambda max_len: new_cache(config, 1, dtype, max_len)) if args.cache and config.n_layer
                       else None)
    if option == "--prompt":
        from attn_cli import tokenizer

        print(tokenizer.decode(out))
    else:
        print(",".join(map(str, out)))
    return 0
