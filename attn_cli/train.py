"""``numpy-attn train`` and ``numpy-attn generate``: the mini GPT trained and sampled in NumPy.

train: GPT-2 BPE tokens of a corpus (by default the text of the standard library's
``pydoc_data.topics``, which ships with every Python; or ``--text FILE``), remapped to the ids
present so that the embedding stays small: model id i stands for GPT-2 id ``vocab[i]``, with
``vocab`` the sorted distinct GPT-2 ids of the corpus, stored in the checkpoint. Random windows of
``block_size + 1`` tokens give the batches (inputs and the next tokens); AdamW updates the
weights. ``--compare-torch`` trains the torch twin beside it from the same weights, batches and
dropout masks, and prints both losses and their difference at every step.

Output (in ``--out``, refused if it holds a run unless ``--force``): ``model.npz`` (parameters by
path, e.g. ``blocks.0.attn.q.w``, plus ``vocab``; load with ``allow_pickle=False``),
``config.json`` (the GPTConfig, dtype and run facts), ``loss.png`` (when matplotlib is present).

generate: greedy decoding (``--temperature 0``) or sampling at a temperature, optionally from the
``--top-k`` most likely tokens, with ``--seed``; the context is the last ``block_size`` tokens.
"""

import dataclasses
import json
import os
import sys
import time

import numpy as np

from numpy_attn import optim
from numpy_attn.gpt import GPTConfig, gpt_backward, gpt_forward, init_gpt_params
from numpy_attn.loss import cross_entropy_backward, cross_entropy_forward
from numpy_attn.softmax import softmax_forward

CHECKPOINT, CONFIG, PLOT = "model.npz", "config.json", "loss.png"


# -- data -----------------------------------------------------------------------------------------

def load_corpus(path=None):
    """The text of ``path``, or of the standard library's pydoc topics; refuses an empty corpus."""
    if path is None:
        from pydoc_data.topics import topics

        text, source = "".join(topics[k] for k in sorted(topics)), "pydoc_data.topics"
    else:
        with open(path, encoding="utf-8") as f:
            text, source = f.read(), path
    if not text.strip():
        raise ValueError(f"the corpus {source} is empty")
    return text, source


def build_vocab(gpt2_ids):
    """(vocab, ids): vocab (V,) the sorted distinct GPT-2 ids, ids the corpus in model ids [0, V)."""
    gpt2_ids = np.asarray(gpt2_ids, dtype=np.int64)
    vocab = np.unique(gpt2_ids)                               # (V,), sorted
    return vocab, np.searchsorted(vocab, gpt2_ids)            # (N,) in [0, V)


def to_model_ids(gpt2_ids, vocab):
    """Map GPT-2 ids into the model's vocabulary; ValueError naming a token it lacks."""
    gpt2_ids = np.asarray(gpt2_ids, dtype=np.int64)
    ids = np.searchsorted(vocab, gpt2_ids)
    missing = (ids >= len(vocab)) | (vocab[np.minimum(ids, len(vocab) - 1)] != gpt2_ids)
    if missing.any():
        from attn_cli import tokenizer

        piece = tokenizer.token_strings([gpt2_ids[missing][0]])[0]
        raise ValueError(f"token {piece!r} (GPT-2 id {gpt2_ids[missing][0]}) is not in the "
                         f"checkpoint's vocabulary of {len(vocab)} tokens")
    return ids


def get_batch(data, B, T, rng):
    """(ids, targets), each (B, T): random windows of ``data`` and the tokens one step later."""
    starts = rng.integers(0, len(data) - T, size=B)           # (B,)
    windows = starts[:, None] + np.arange(T + 1)              # (B, T + 1)
    return data[windows[:, :-1]], data[windows[:, 1:]]


# -- one step ---------------------------------------------------------------------------------------

def loss_and_grads(params, config, ids, targets, rng=None):
    """Mean cross-entropy of the next tokens and its gradients; also the forward cache."""
    logits, cache = gpt_forward(ids, params, config, rng=rng)                 # (B, T, V)
    loss, loss_cache = cross_entropy_forward(logits, targets)
    dlogits = cross_entropy_backward(np.ones((), loss.dtype), loss_cache)     # (B, T, V)
    return float(loss), gpt_backward(dlogits, cache), cache


def evaluate(params, config, data, B, rng, batches=4):
    """Mean loss over a few random batches of ``data``, without dropout."""
    config = dataclasses.replace(config, dropout=0.0)
    losses = []
    for _ in range(batches):
        ids, targets = get_batch(data, B, config.block_size, rng)
        loss, _ = cross_entropy_forward(gpt_forward(ids, params, config)[0], targets)
        losses.append(float(loss))
    return float(np.mean(losses))


# -- checkpoints ------------------------------------------------------------------------------------

def _flatten(tree, prefix=""):
    if isinstance(tree, dict):
        return {k2: v2 for k, v in tree.items() for k2, v2 in _flatten(v, f"{prefix}{k}.").items()}
    return {prefix[:-1]: tree}


def _unflatten(flat):
    tree = {}
    for path, leaf in flat.items():
        *parents, name = path.split(".")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[name] = leaf
    return tree


def save_checkpoint(out, params, config, vocab, dtype, facts, force=False):
    """Write model.npz and config.json into the folder ``out``; never overwrite without force."""
    os.makedirs(out, exist_ok=True)
    existing = [f for f in (CHECKPOINT, CONFIG, PLOT) if os.path.exists(os.path.join(out, f))]
    if existing and not force:
        raise ValueError(f"{out} already holds {', '.join(existing)}; pass --force to overwrite")
    np.savez(os.path.join(out, CHECKPOINT), vocab=vocab, **_flatten(params))
    meta = {"gpt": dataclasses.asdict(config), "dtype": np.dtype(dtype).name, "tokenizer": "gpt2",
            "vocab": "model id i is GPT-2 id vocab[i], vocab stored in model.npz", **facts}
    with open(os.path.join(out, CONFIG), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2)


def load_checkpoint(path):
    """(params, config, vocab) from a run folder or its model.npz (config.json beside it).

    Raises ValueError when the arrays do not match the config.
    """
    folder = path if os.path.isdir(path) else os.path.dirname(path) or "."
    npz = os.path.join(path, CHECKPOINT) if os.path.isdir(path) else path
    with open(os.path.join(folder, CONFIG), encoding="utf-8") as f:
        meta = json.load(f)
    config = GPTConfig(**meta["gpt"])
    with np.load(npz, allow_pickle=False) as z:
        flat = {k: z[k] for k in z.files}
    vocab = flat.pop("vocab", None)
    expected = _flatten(init_gpt_params(config, np.random.default_rng(0), meta["dtype"]))
    problems = [f"missing {k}" for k in expected if k not in flat]
    problems += [f"unexpected {k}" for k in flat if k not in expected]
    problems += [f"{k} has shape {flat[k].shape} {flat[k].dtype}, the config needs "
                 f"{v.shape} {v.dtype}" for k, v in expected.items()
                 if k in flat and (flat[k].shape != v.shape or flat[k].dtype != v.dtype)]
    if vocab is None or vocab.shape != (config.vocab_size,):
        problems.append(f"vocab must hold vocab_size = {config.vocab_size} ids, got "
                        f"{None if vocab is None else vocab.shape}")
    if problems:
        raise ValueError(f"checkpoint {npz} does not match {CONFIG}: " + "; ".join(problems[:5]))
    return _unflatten(flat), config, vocab


# -- generation -------------------------------------------------------------------------------------

def generate(params, config, ids, max_new_tokens, temperature=1.0, top_k=None, rng=None):
    """Extend ``ids`` (T0,) by ``max_new_tokens`` model ids: greedy at temperature 0, else sampled
    from softmax(logits / temperature), restricted to the top_k most likely when given."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    config = dataclasses.replace(config, dropout=0.0)
    ids = list(ids)
    for _ in range(max_new_tokens):
        context = np.array([ids[-config.block_size:]])                      # (1, T)
        logits = gpt_forward(context, params, config)[0][0, -1].astype(np.float64)   # (V,)
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


# -- the commands -------------------------------------------------------------------------------------

def _progress(step, total, text, stream=sys.stderr, width=30):
    """A one-line progress bar on stderr, redrawn in place."""
    done = int(width * step / total)
    stream.write(f"\r[{'#' * done}{'.' * (width - done)}] {step}/{total} {text}")
    if step == total:
        stream.write("\n")
    stream.flush()


def _limit_threads(n):
    """Limit BLAS (and torch) to n threads where threadpoolctl is installed; a context manager."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        import contextlib

        return contextlib.nullcontext()
    return threadpool_limits(limits=n)


def run_train(args):
    """Train, print the losses (beside torch's with --compare-torch), save the checkpoint."""
    with _limit_threads(args.threads):
        return _train(args)


def _train(args):
    from attn_cli import tokenizer

    out_files = [f for f in (CHECKPOINT, CONFIG, PLOT) if os.path.exists(os.path.join(args.out, f))]
    if out_files and not args.force:      # check before spending a minute on training
        raise ValueError(f"{args.out} already holds {', '.join(out_files)}; pass --force to overwrite")
    text, source = load_corpus(args.text)
    vocab, data = build_vocab(tokenizer.encode(text))
    split = int(0.9 * len(data))
    train_data, val_data = data[:split], data[split:]
    T = args.block_size
    if min(len(train_data), len(val_data)) <= T:
        raise ValueError(f"the corpus {source} has {len(data)} tokens: too few for windows of "
                         f"block_size + 1 = {T + 1} in both the training and validation splits")
    config = GPTConfig(vocab_size=len(vocab), block_size=T, n_layer=args.n_layer,
                       n_head=args.n_head, n_embd=args.n_embd, dropout=args.dropout,
                       tie_weights=not args.untied, positions=args.positions)
    dtype = np.dtype(args.dtype)
    rng = np.random.default_rng(args.seed)
    params = init_gpt_params(config, rng, dtype)
    state = optim.adamw_init(params)
    hyper = dict(lr=args.lr, weight_decay=args.weight_decay)
    print(f"corpus {source}: {len(data)} GPT-2 tokens, {len(vocab)} distinct (the vocabulary); "
          f"{sum(p.size for p in _flatten(params).values())} parameters, {dtype.name}")
    twin = _TorchTwin(params, config, hyper, args.threads) if args.compare_torch else None
    losses, twin_losses, seconds, twin_seconds = [], [], 0.0, 0.0
    for step in range(1, args.steps + 1):
        ids, targets = get_batch(train_data, args.batch_size, T, rng)
        start = time.perf_counter()
        loss, grads, cache = loss_and_grads(params, config, ids, targets, rng)
        params, state = optim.adamw_step(params, grads, state, **hyper)
        seconds += time.perf_counter() - start
        losses.append(loss)
        line = f"loss {loss:.4f}"
        if twin is not None:
            start = time.perf_counter()
            twin_losses.append(twin.step(ids, targets, cache.masks if config.dropout else None))
            twin_seconds += time.perf_counter() - start
            line += f"  torch {twin_losses[-1]:.4f}  diff {loss - twin_losses[-1]:+.2e}"
        if twin is not None or args.verbose:
            print(f"step {step:>5}  {line}")
        if sys.stderr.isatty() or args.progress:
            _progress(step, args.steps, line)
    tokens = args.steps * args.batch_size * T
    val = evaluate(params, config, val_data, args.batch_size, np.random.default_rng(args.seed + 1))
    print(f"NumPy: {tokens / seconds:,.0f} tokens/s; loss {losses[0]:.4f} -> {losses[-1]:.4f} "
          f"(training batch), {val:.4f} on held-out text")
    if twin is not None:
        diff = np.abs(np.array(losses) - twin_losses)
        print(f"torch: {tokens / twin_seconds:,.0f} tokens/s; largest loss difference "
              f"{diff.max():.2e} (step {int(diff.argmax()) + 1})")
    facts = {"corpus": source, "steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
             "weight_decay": args.weight_decay, "seed": args.seed, "final_loss": losses[-1],
             "val_loss": val}
    save_checkpoint(args.out, params, config, vocab, dtype, facts, force=args.force)
    print(f"wrote {os.path.join(args.out, CHECKPOINT)} and {CONFIG}")
    _plot(losses, twin_losses, os.path.join(args.out, PLOT))
    return 0


class _TorchTwin:
    """The torch twin trained beside NumPy: the same weights, batches, masks and AdamW."""

    def __init__(self, params, config, hyper, threads):
        import torch

        from torch_attn import optim as torch_optim

        torch.set_num_threads(threads)
        self.torch, self.optim, self.config, self.hyper = torch, torch_optim, config, hyper
        self.params = self._map(lambda p: torch.from_numpy(p.copy()).requires_grad_(), params)
        self.state = torch_optim.adamw_init(self.params)

    def _map(self, fn, tree):
        return {k: self._map(fn, v) for k, v in tree.items()} if isinstance(tree, dict) else fn(tree)

    def step(self, ids, targets, masks):
        from torch_attn.gpt import gpt
        from torch_attn.loss import cross_entropy

        torch = self.torch
        if masks is not None:
            masks = {"emb": torch.from_numpy(masks["emb"]),
                     "blocks": [{k: torch.from_numpy(m) for k, m in b.items()} for b in masks["blocks"]]}
        loss = cross_entropy(gpt(torch.from_numpy(ids), self.params, self.config, masks=masks),
                             torch.from_numpy(targets))
        loss.backward()
        grads = self._map(lambda p: p.grad, self.params)
        params, self.state = self.optim.adamw_step(self.params, grads, self.state, **self.hyper)
        self.params = self._map(lambda p: p.requires_grad_(), params)
        return float(loss.detach())


def _plot(losses, twin_losses, path):
    """Loss against step as a PNG; skipped with a note without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no loss plot (pip install matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(range(1, len(losses) + 1), losses, label="NumPy")
    if twin_losses:
        ax.plot(range(1, len(twin_losses) + 1), twin_losses, "--", label="torch twin")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (cross-entropy)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"wrote {path}")


def run_generate(args):
    """Continue ``--prompt`` with the checkpoint's model and print the text."""
    from attn_cli import tokenizer

    params, config, vocab = load_checkpoint(args.checkpoint)
    if not args.prompt:
        raise ValueError("the prompt is empty: give some text to continue")
    ids = to_model_ids(tokenizer.encode(args.prompt), vocab)
    if len(ids) > config.block_size:
        raise ValueError(f"the prompt is {len(ids)} tokens, longer than the context of "
                         f"block_size = {config.block_size}")
    out = generate(params, config, ids, args.max_new_tokens, args.temperature, args.top_k,
                   np.random.default_rng(args.seed))
    print(tokenizer.decode(vocab[out]))
    return 0


# -- arguments ------------------------------------------------------------------------------------------

def add_train_arguments(p):
    """The options of ``numpy-attn train``."""
    p.add_argument("--text", metavar="FILE", default=None,
                   help="train on this UTF-8 file (default: the standard library's pydoc topics)")
    p.add_argument("--out", metavar="DIR", default="numpy-attn-run",
                   help="folder for model.npz, config.json and loss.png (default numpy-attn-run)")
    p.add_argument("--force", action="store_true", help="overwrite a run already in --out")
    p.add_argument("--steps", type=int, default=500, help="AdamW steps (default 500)")
    p.add_argument("--batch-size", type=int, default=8, dest="batch_size", help="B (default 8)")
    p.add_argument("--block-size", type=int, default=32, dest="block_size",
                   help="context length T (default 32)")
    p.add_argument("--n-layer", type=int, default=2, dest="n_layer", help="blocks (default 2)")
    p.add_argument("--n-head", type=int, default=2, dest="n_head", help="heads (default 2)")
    p.add_argument("--n-embd", type=int, default=32, dest="n_embd", help="width C (default 32)")
    p.add_argument("--dropout", type=float, default=0.0, help="dropout probability (default 0)")
    p.add_argument("--positions", choices=("learned", "sinusoidal"), default="learned",
                   help="position information (default learned)")
    p.add_argument("--untied", action="store_true", help="a separate output layer (default: tied to wte)")
    p.add_argument("--lr", type=float, default=1e-2, help="AdamW learning rate (default 1e-2)")
    p.add_argument("--weight-decay", type=float, default=0.01, dest="weight_decay",
                   help="AdamW decoupled weight decay (default 0.01)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                   help="dtype of the weights (default float32)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights, batches and dropout (default 0)")
    p.add_argument("--compare-torch", action="store_true", dest="compare_torch",
                   help="train the torch twin beside NumPy and print both losses per step")
    p.add_argument("--threads", type=int, default=1,
                   help="BLAS and torch threads (default 1: on matrices this small more threads "
                        "mostly wait for each other)")
    p.add_argument("--verbose", action="store_true", help="print the loss of every step")
    p.add_argument("--progress", action="store_true", help="a progress bar even when stderr is not a terminal")


def add_generate_arguments(p):
    """The options of ``numpy-attn generate``."""
    p.add_argument("--checkpoint", metavar="PATH", required=True,
                   help="a run folder of numpy-attn train, or its model.npz")
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=int, default=40, dest="max_new_tokens",
                   help="tokens to add (default 40)")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="sampling temperature; 0 is greedy (default 1.0)")
    p.add_argument("--top-k", type=int, default=None, dest="top_k",
                   help="sample from the k most likely tokens only")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling (default 0)")
