"""``numpy-attn train``: the mini GPT of ``numpy_attn/gpt.py`` trained in NumPy.

GPT-2 BPE tokens of a corpus (by default the text of the standard library's
``pydoc_data.topics``, which ships with every Python; or ``--text FILE``), remapped to the ids
present so that the embedding stays small: model id i stands for GPT-2 id ``vocab[i]``, with
``vocab`` the sorted distinct GPT-2 ids of the corpus, stored in the checkpoint. The first 90% of
the tokens train, the last 10% are held out. Random windows of ``block_size + 1`` tokens give the
batches (inputs and the next tokens); AdamW updates the weights. ``--compare-torch`` trains the
torch twin beside it from the same weights, batches and dropout masks, and prints both losses and
their difference at every step.

Output, in the folder ``--out``: ``model.npz`` and ``config.json`` (see ``attn_cli.checkpoint``),
``loss.png`` (when matplotlib is present), and nothing else; no other file there is touched. A
folder holding a run, or other files, is taken only with ``--force``; a file of one of those names
that no run wrote is never replaced. A run whose loss diverges stops and writes nothing.
"""

import contextlib
import dataclasses
import math
import os
import signal
import sys
import threading
import time

import numpy as np

from attn_cli import term
from attn_cli.checkpoint import (
    CHECKPOINT,
    CONFIG,
    DEFAULT_OUT,
    PLOT,
    check_out,
    save_checkpoint,
    writer_lock,
)
from numpy_attn import optim
from numpy_attn._threads import limit_blas_threads
from numpy_attn._tree import flatten, tree_map
from numpy_attn.gpt import GPTConfig, gpt_backward, gpt_forward, init_gpt_params
from numpy_attn.loss import cross_entropy_backward, cross_entropy_forward

HELP = "train the mini GPT in NumPy (--compare-torch: beside the torch twin)"

LOSSES = ("Two losses are reported: the training loss is the cross-entropy of the batch just "
          "trained on (it jumps from batch to batch, and falls as the model fits the text); the "
          "held-out loss is measured without dropout on the last 10% of the corpus, which is never "
          "trained on, and says how well the model predicts text it has not seen. At the end the "
          "training text is measured the same way (no dropout, the same number of windows), so the "
          "two compare. A held-out loss well above that means the model is memorising; one below it "
          "means the held-out text is easier: the last 10% of the default corpus is 42% "
          "whitespace-only tokens (indentation, blank lines), against 23% in the rest, so its loss "
          "sits far below the training loss (about 3.4 against 4.8 after the default 500 steps).")

EXAMPLES = f"""examples:
  numpy-attn train                              500 steps on the pydoc topics, ~30 s
  numpy-attn train --steps 2000 --out long-run  longer, into another folder
  numpy-attn train --compare-torch --force      the torch twin beside NumPy, loss by loss
  numpy-attn train --text my.txt --dtype float64

Writes {DEFAULT_OUT}/{CHECKPOINT}, {CONFIG} and {PLOT} by default; numpy-attn generate reads them.
"""


# -- data -----------------------------------------------------------------------------------------

def load_corpus(path=None):
    """The text of ``path``, or of the standard library's pydoc topics; refuses an empty corpus."""
    if path is None:
        from pydoc_data.topics import topics

        text, source = "".join(topics[k] for k in sorted(topics)), "pydoc_data.topics"
    else:
        try:
            with open(path, encoding="utf-8") as f:
                text, source = f.read(), path
        except OSError as err:
            raise ValueError(f"--text {path} cannot be read: {err.strerror or err}") from None
        except UnicodeDecodeError as err:
            raise ValueError(f"--text {path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
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


# -- the command ------------------------------------------------------------------------------------

def run(args):
    """Train, print the losses (beside torch's with --compare-torch), save the checkpoint."""
    _check_arguments(args)
    data = _prepare(args)                 # the corpus and the model's sizes, then --out: all of it
    check_out(args.out, args.force)       # before spending a minute on training
    with _termination_raises(), limit_blas_threads(args.threads, required=True), writer_lock(args.out):
        return _train(args, *data)


@contextlib.contextmanager
def _termination_raises():
    """SIGTERM and SIGHUP end the run by SystemExit (status 128 + the signal), as Ctrl-C does by
    KeyboardInterrupt, so that the lock is released and a folder this run created but did not
    fill is removed; their default would end the process on the spot."""
    def leave(signum, frame):
        raise SystemExit(128 + signum)

    names = [s for s in ("SIGTERM", "SIGHUP") if hasattr(signal, s)]
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {getattr(signal, s): signal.signal(getattr(signal, s), leave) for s in names}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _check_arguments(args):
    """Every numeric option in its range; ValueError naming the option."""
    for option, value, low in (("--steps", args.steps, 1), ("--batch-size", args.batch_size, 1),
                               ("--block-size", args.block_size, 1), ("--n-layer", args.n_layer, 0),
                               ("--n-head", args.n_head, 1), ("--n-embd", args.n_embd, 1),
                               ("--seed", args.seed, 0), ("--threads", args.threads, 1)):
        if value < low:
            raise ValueError(f"{option} must be at least {low}, got {value}")
    if args.n_embd % args.n_head:
        raise ValueError(f"--n-embd {args.n_embd} is not divisible by --n-head {args.n_head}")
    if not 0 <= args.dropout < 1:
        raise ValueError(f"--dropout must lie in [0, 1), got {args.dropout}")
    for option, value in (("--lr", args.lr), ("--weight-decay", args.weight_decay)):
        if not (np.isfinite(value) and value >= 0):
            raise ValueError(f"{option} must be a finite number >= 0, got {value}")


def _prepare(args):
    """(source, vocab, train_data, val_data, config): the corpus tokenized and split, and the
    model's sizes; ValueError naming --text when the corpus cannot serve."""
    from attn_cli import tokenizer

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
    return source, vocab, train_data, val_data, config


def _train(args, source, vocab, train_data, val_data, config):
    T = config.block_size
    dtype = np.dtype(args.dtype)
    rng = np.random.default_rng(args.seed)
    params = init_gpt_params(config, rng, dtype)
    state = optim.adamw_init(params)
    hyper = dict(lr=args.lr, weight_decay=args.weight_decay)
    say(f"corpus {source}: {len(train_data) + len(val_data)} GPT-2 tokens, {len(vocab)} distinct (the vocabulary); "
        f"{sum(p.size for p in flatten(params).values())} parameters, {dtype.name}; "
        f"{args.threads} BLAS thread{'s' if args.threads > 1 else ''} (--threads)")
    say(LOSSES)
    twin = _TorchTwin(params, config, hyper, args.threads) if args.compare_torch else None
    if twin is not None:
        say(_drift_note(dtype))
    every = max(1, args.steps // 10)
    losses, twin_losses, held_out, seconds, twin_seconds = [], [], [], 0.0, 0.0
    for step in range(1, args.steps + 1):
        ids, targets = get_batch(train_data, args.batch_size, T, rng)
        start = time.perf_counter()
        loss, overflow = None, False
        try:
            with np.errstate(over="raise", invalid="raise", divide="raise"):
                loss, grads, cache = loss_and_grads(params, config, ids, targets, rng)
                params, state = optim.adamw_step(params, grads, state, **hyper)
        except FloatingPointError:      # a number overflowed on the way
            overflow = True
        if overflow or not math.isfinite(loss) or not all(np.isfinite(p).all() for p in flatten(params).values()):
            raise _diverged(args, step, loss, losses)
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
        if step % every == 0 or step == args.steps:
            # The same held-out windows every time (their own seed), so the points compare.
            val_rng = np.random.default_rng(args.seed + 1)
            try:
                with np.errstate(over="raise", invalid="raise", divide="raise"):
                    held_out.append((step, evaluate(params, config, val_data, args.batch_size, val_rng)))
            except FloatingPointError:
                raise _diverged(args, step, loss, losses) from None
            line += f"  held-out {held_out[-1][1]:.4f}"
            if twin is not None or args.verbose:
                print(f"step {step:>5}  held-out loss {held_out[-1][1]:.4f}")
        if sys.stderr.isatty() or args.progress:
            term.progress(step, args.steps, line)
    tokens = args.steps * args.batch_size * T
    val = held_out[-1][1]
    # The training text on the held-out loss's footing: no dropout, as many windows, fixed seed.
    try:
        with np.errstate(over="raise", invalid="raise", divide="raise"):
            seen = evaluate(params, config, train_data, args.batch_size, np.random.default_rng(args.seed + 1))
    except FloatingPointError:
        raise _diverged(args, args.steps, losses[-1], losses) from None
    say(f"NumPy: {tokens / seconds:,.0f} tokens/s; training loss {losses[0]:.4f} -> "
        f"{losses[-1]:.4f} (last batch; mean of the last {every} steps "
        f"{np.mean(losses[-every:]):.4f}), held-out loss {val:.4f}; the training text measured "
        f"the same way {seen:.4f}")
    if twin is not None:
        diff = np.abs(np.array(losses) - twin_losses)
        say(f"torch: {tokens / twin_seconds:,.0f} tokens/s; largest loss difference "
            f"{diff.max():.2e} (step {int(diff.argmax()) + 1})")
    facts = {"corpus": source, "steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
             "weight_decay": args.weight_decay, "seed": args.seed, "final_loss": losses[-1],
             "val_loss": val, "train_text_loss": seen, "held_out": held_out}

    def plot(file):
        return _plot(losses, held_out, twin_losses, file, source)

    for name in save_checkpoint(args.out, params, config, vocab, dtype, facts, force=args.force, plot=plot):
        print(f"wrote {os.path.join(args.out, name)}")
    return 0


def _diverged(args, step, loss, losses):
    """The error for a run whose loss diverged at ``step`` (``loss`` None: it overflowed)."""
    value = f"{args.dtype} overflowed" if loss is None else f"{loss:.4g}"
    first = f", from {losses[0]:.4f} at step 1" if losses else ""
    return ValueError(f"the loss diverged at step {step} (loss {value}{first}): the steps were too "
                      f"large for the weights to stay finite. Lower --lr (now {args.lr:g}; the "
                      f"default is 1e-2) and train again; nothing was written to {args.out}")


def say(text):
    """Print prose wrapped to the terminal (80 columns when piped)."""
    print("\n".join(term.wrap(text, term.width_of(sys.stdout))))


def _drift_note(dtype):
    """What --compare-torch should show, measured with the default settings (seed 0)."""
    common = ("NumPy and torch add in different orders, so their losses differ by rounding, and "
              "training amplifies any difference step by step (AdamW divides by the gradients' "
              "size, so tiny gradients count fully): ")
    if dtype == np.float32:
        return common + ("in float32 they agree to about 1e-6 for the first tens of steps, then "
                         "drift apart to 1e-3..1e-1 after a few hundred; that is expected. With "
                         "--dtype float64 they agree to about 1e-14 at first and to 1e-12 still "
                         "after 50 steps.")
    return common + ("in float64 they agree to about 1e-14 at first and to 1e-12 after 50 steps; "
                     "over a hundred steps or more they drift apart too.")


class _TorchTwin:
    """The torch twin trained beside NumPy: the same weights, batches, masks and AdamW."""

    def __init__(self, params, config, hyper, threads):
        import torch

        from torch_attn import optim as torch_optim

        torch.set_num_threads(threads)
        self.torch, self.optim, self.config, self.hyper = torch, torch_optim, config, hyper
        self.params = tree_map(lambda p: torch.from_numpy(p.copy()).requires_grad_(), params)
        self.state = torch_optim.adamw_init(self.params)

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
        grads = tree_map(lambda p: p.grad, self.params)
        params, self.state = self.optim.adamw_step(self.params, grads, self.state, **self.hyper)
        self.params = tree_map(lambda p: p.requires_grad_(), params)
        return float(loss.detach())


def _plot(losses, held_out, twin_losses, file, source):
    """The loss curve as a PNG into ``file`` (a path or a binary file); False, with a note,
    without matplotlib."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("matplotlib is not installed: no loss plot (pip install matplotlib)")
        return False
    from attn_cli import plots

    plots.write_loss_plot(losses, held_out, file, twin_losses,
                          title=f"mini GPT trained in NumPy on {os.path.basename(source)}")
    return True


# -- arguments ------------------------------------------------------------------------------------------

def add_arguments(p):
    """The options of ``numpy-attn train``."""
    term.describe(p, "Train the mini GPT of numpy_attn/gpt.py in NumPy. " + LOSSES, EXAMPLES)
    p.add_argument("--text", metavar="FILE", default=None,
                   help="train on this UTF-8 file (default: the standard library's pydoc topics)")
    p.add_argument("--out", metavar="DIR", default=DEFAULT_OUT,
                   help=f"folder for model.npz, config.json and loss.png; nothing else in it is touched, "
                        f"and it is never replaced itself (default {DEFAULT_OUT})")
    p.add_argument("--force", action="store_true",
                   help="overwrite a run already in --out, or write beside other files there (a file "
                        "of those names that train did not write is never replaced)")
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
                   help="train the torch twin beside NumPy and print both losses per step (in "
                        "float32 they drift apart after tens of steps, by rounding; with --dtype "
                        "float64 they match closely, to about 1e-12 for the first 50 steps)")
    p.add_argument("--threads", type=int, default=1,
                   help="BLAS and torch threads, set whatever OMP_NUM_THREADS and the like say "
                        "(default 1: on matrices this small more threads mostly wait for each "
                        "other, and one thread gives the same losses for the same seed everywhere)")
    p.add_argument("--verbose", action="store_true", help="print the loss of every step")
    p.add_argument("--progress", action="store_true", help="a progress bar even when stderr is not a terminal")
