"""``numpy-attn train``: the mini GPT of ``numpy_attn/gpt.py`` trained in NumPy.

GPT-2 BPE tokens of a corpus (by default the text of the standard library's
``pydoc_data.topics``, which ships with every Python; or ``--text FILE``), remapped to the ids
present so that the embedding stays small: model id i stands for GPT-2 id ``vocab[i]``, with
``vocab`` the sorted distinct GPT-2 ids of the corpus, stored in the checkpoint. The first 90% of
the tokens train, the last 10% are held out. Random windows of ``block_size + 1`` tokens give the
batches (inputs and the next tokens); AdamW updates the weights. ``--compare-torch`` trains the
torch twin beside it from the same weights, batches and dropout masks, prints both losses and
their difference at every step, and at the end whether the first steps agreed as closely as
rounding allows (``AGREEMENT``).

Mixed precision (``--dtype bfloat16`` or ``float16``), as mixed-precision training does it
(Micikevicius et al., 2018): the optimiser keeps float32 master weights and float32 AdamW moments;
each step casts the masters to the low dtype, runs the forward and the backward in it (every
operation computing in float32 inside and rounding its output, as PyTorch's CPU kernels), casts
the gradients up to float32 and steps there. float16, whose smallest normal number is 6e-5, adds
dynamic loss scaling (``numpy_attn.optim.loss_scale_init``): the gradient of the loss enters the
backward multiplied by a scale S (2^15 at first), the gradients are divided by S in float32, and a
step whose gradients overflowed is skipped and S halved; the summary gives the steps skipped and the
final S. bfloat16 has float32's range and needs no scaling. ``--compare-torch`` then trains torch's
own equivalent: the twin under ``torch.autocast("cpu", dtype)`` with float32 weights (matmuls in the
low dtype), for float16 with ``torch.amp.GradScaler("cpu")`` and ``torch.optim.AdamW``. The
checkpoint holds the float32 masters; config.json says ``"dtype": "float32"`` and the dtype the
steps ran in as ``"compute_dtype"``.

Output, in the folder ``--out``: ``model.npz`` and ``config.json`` (see ``attn_cli.checkpoint``),
``loss.png`` (when matplotlib is present), and nothing else; no other file there is touched. A
folder holding a run, or other files, is taken only with ``--force``; a file of one of those names
that no run wrote is never replaced. A run whose loss diverges stops and writes nothing.
"""

import contextlib
import dataclasses
import math
import os
import sys
import time

import ml_dtypes
import numpy as np

from attn_cli import term
from attn_cli.checkpoint import (
    CHECKPOINT,
    CONFIG,
    DEFAULT_OUT,
    PLOT,
    check_out,
    save_checkpoint,
    termination_raises,
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
  numpy-attn train --dtype bfloat16 --compare-torch   mixed precision, beside torch's autocast

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

DTYPES = ("float32", "float64", "bfloat16", "float16")
MIXED = ("bfloat16", "float16")            # mixed precision: float32 masters, steps in the low dtype
DEFAULT_LR, DEFAULT_WEIGHT_DECAY = 1e-2, 0.01   # AdamW's, as --lr and --weight-decay

# --compare-torch: (the first steps, spacings of the loss in the compute dtype) within which the
# twins' losses agree. Each step's loss may differ by a few roundings (NumPy and torch add in
# other orders), and training amplifies a difference about tenfold every ten steps. Measured with
# the defaults (seed 0) on an Intel AVX-512 machine, with OpenBLAS's SkylakeX kernel, with
# OPENBLAS_CORETYPE=Haswell, with NumPy's and torch's AVX-512 paths disabled, and with 2 threads:
# float32 and float64 both at most 2 spacings in the first 20 steps, then 6 to 14 (float32) and
# 51 (float64) by step 30; 4 leaves a factor of 2. Mixed precision: 2 spacings of the low dtype at
# step 1, as parity_tests/test_train.py derives (measured 0.4 for bfloat16, 0.3 for float16);
# from step 2 the roundings differ by design.
AGREEMENT = {"float32": (20, 4), "float64": (20, 4), "bfloat16": (1, 2), "float16": (1, 2)}
# After those steps the difference depends on the machine; the largest measured, with the defaults.
DRIFT = {"float32": ("the largest difference measured over the default 500 steps was 3.8e-1 (step "
                     "491) on an Intel AVX-512 machine (1.4e-1 by step 300; by step 150 6.3e-2, "
                     "with OpenBLAS's SkylakeX kernel and with its Haswell one alike), and 8.8e-2 "
                     "over 300 steps on another machine"),
         "float64": "6.7e-11 by step 60 and 8.3e-4 by step 100 on the Intel machine"}


def compute_dtype(name):
    """The NumPy dtype of ``--dtype`` (bfloat16 is ml_dtypes')."""
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def master_dtype(name):
    """The dtype of the weights the optimiser keeps: float32 for the mixed-precision dtypes."""
    return np.dtype(np.float32) if name in MIXED else np.dtype(name)


def loss_and_grads(params, config, ids, targets, rng=None, loss_scale=1.0):
    """Mean cross-entropy of the next tokens and the gradients of ``loss_scale`` * loss, in the
    parameters' dtype; also the forward cache. The scale enters as the gradient of the loss itself,
    d(scale * loss) / d loss = scale, so the backward carries scaled gradients from its first step."""
    logits, cache = gpt_forward(ids, params, config, rng=rng)                 # (B, T, V)
    loss, loss_cache = cross_entropy_forward(logits, targets)
    dloss = np.full((), loss_scale, loss.dtype)                               # 1 unless float16's scaling
    dlogits = cross_entropy_backward(dloss, loss_cache)                       # (B, T, V)
    return float(loss), gpt_backward(dlogits, cache), cache


def step(params, state, scaler, config, ids, targets, rng, hyper, dtype):
    """One AdamW step: ``(params, state, scaler, loss, cache, skipped)``.

    ``dtype`` float32 or float64: the step runs on ``params`` themselves. bfloat16 or float16
    (mixed precision): ``params`` and ``state`` are float32 masters, the forward and backward run on
    their cast to ``dtype``, the gradients come back to float32 divided by the loss scale, and
    ``scaler`` (float16's loss scaling, else None) decides whether the step is taken. A
    FloatingPointError (raised by np.errstate) or a non-finite loss means the run diverged; with a
    scaler, gradients that overflowed float16 only skip the step.
    """
    if dtype.name not in MIXED:
        with np.errstate(over="raise", invalid="raise", divide="raise"):
            loss, grads, cache = loss_and_grads(params, config, ids, targets, rng)
            params, state = optim.adamw_step(params, grads, state, **hyper)
        return params, state, scaler, loss, cache, False
    scale = 1.0 if scaler is None else scaler["scale"]
    # float16's scaled gradients may overflow: counted by unscale_grads, they skip the step
    raised = "raise" if scaler is None else "ignore"
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        model = tree_map(lambda p: p.astype(dtype), params)                  # the masters, rounded
        with np.errstate(over=raised, invalid=raised):
            loss, grads, cache = loss_and_grads(model, config, ids, targets, rng, scale)
        grads, found_inf = optim.unscale_grads(grads, scale)                 # float32, / scale
        skipped = False
        if scaler is not None:
            scaler, skipped = optim.loss_scale_update(scaler, found_inf)
        elif found_inf:
            raise FloatingPointError("the gradients overflowed")
        if not skipped:
            params, state = optim.adamw_step(params, grads, state, **hyper)   # in float32
    return params, state, scaler, loss, cache, skipped


def model_weights(params, dtype):
    """The weights a step computes with: ``params`` cast to ``dtype`` (themselves when equal)."""
    return tree_map(lambda p: p.astype(dtype, copy=False), params)


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
    with termination_raises(), limit_blas_threads(args.threads, required=True), writer_lock(args.out):
        return _train(args, *data)


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
    dtype = compute_dtype(args.dtype)
    rng = np.random.default_rng(args.seed)
    params = init_gpt_params(config, rng, master_dtype(args.dtype))    # float32 masters when mixed
    state = optim.adamw_init(params)
    scaler = optim.loss_scale_init() if dtype == np.float16 else None
    hyper = dict(lr=args.lr, weight_decay=args.weight_decay)
    precision = (f"{dtype.name}" if args.dtype not in MIXED else
                 f"mixed precision: float32 master weights and AdamW state, forward and backward in "
                 f"{dtype.name}" + (f" with dynamic loss scaling from {scaler['scale']:g}" if scaler else ""))
    say(f"corpus {source}: {len(train_data) + len(val_data)} GPT-2 tokens, {len(vocab)} distinct (the vocabulary); "
        f"{sum(p.size for p in flatten(params).values())} parameters, {precision}; "
        f"{args.threads} BLAS thread{'s' if args.threads > 1 else ''} (--threads)")
    say(LOSSES)
    twin = _TorchTwin(params, config, hyper, args.threads, args.dtype) if args.compare_torch else None
    if twin is not None:
        say(_drift_note(args.dtype))
    every = max(1, args.steps // 10)
    losses, twin_losses, held_out, seconds, twin_seconds, skipped = [], [], [], 0.0, 0.0, []
    progress = term.Progress(args.steps, enabled=sys.stderr.isatty() or args.progress)
    for number in range(1, args.steps + 1):
        ids, targets = get_batch(train_data, args.batch_size, T, rng)
        start = time.perf_counter()
        loss, overflow = None, False
        try:
            params, state, scaler, loss, cache, skip = step(params, state, scaler, config, ids, targets,
                                                            rng, hyper, dtype)
        except FloatingPointError:      # a number overflowed on the way
            overflow = True
        if overflow or not math.isfinite(loss) or not all(np.isfinite(p).all() for p in flatten(params).values()):
            raise _diverged(args, number, loss, losses)
        seconds += time.perf_counter() - start
        losses.append(loss)
        if skip:
            skipped.append(number)
        line = f"loss {loss:.4f}" + ("  (skipped: the gradients overflowed float16)" if skip else "")
        if twin is not None:
            start = time.perf_counter()
            twin_losses.append(twin.step(ids, targets, cache.masks if config.dropout else None))
            twin_seconds += time.perf_counter() - start
            line += f"  torch {twin_losses[-1]:.4f}  diff {loss - twin_losses[-1]:+.2e}"
        if twin is not None or args.verbose:
            print(f"step {number:>5}  {line}")
        if number % every == 0 or number == args.steps:
            # The same held-out windows every time (their own seed), so the points compare.
            val_rng = np.random.default_rng(args.seed + 1)
            try:
                with np.errstate(over="raise", invalid="raise", divide="raise"):
                    held_out.append((number, evaluate(model_weights(params, dtype), config, val_data,
                                                      args.batch_size, val_rng)))
            except FloatingPointError:
                raise _diverged(args, number, loss, losses, "held-out") from None
            line += f"  held-out {held_out[-1][1]:.4f}"
            if twin is not None:
                twin.held_out.append((number, twin.evaluate(val_data, args.batch_size,
                                                            np.random.default_rng(args.seed + 1))))
            if twin is not None or args.verbose:
                print(f"step {number:>5}  held-out loss {held_out[-1][1]:.4f}"
                      + (f"  torch {twin.held_out[-1][1]:.4f}" if twin is not None else ""))
        progress.step(line)
    tokens = args.steps * args.batch_size * T
    val = held_out[-1][1]
    # The training text on the held-out loss's footing: no dropout, as many windows, fixed seed.
    try:
        with np.errstate(over="raise", invalid="raise", divide="raise"):
            seen = evaluate(model_weights(params, dtype), config, train_data, args.batch_size,
                            np.random.default_rng(args.seed + 1))
    except FloatingPointError:
        raise _diverged(args, args.steps, losses[-1], losses, "training-text") from None
    say(f"NumPy: {tokens / seconds:,.0f} tokens/s; training loss {losses[0]:.4f} -> "
        f"{losses[-1]:.4f} (last batch; mean of the last {every} steps "
        f"{np.mean(losses[-every:]):.4f}), held-out loss {val:.4f}; the training text measured "
        f"the same way {seen:.4f}")
    if scaler is not None:
        say(f"loss scaling (float16): the scale went from {optim.loss_scale_init()['scale']:g} to "
            f"{scaler['scale']:g}; {len(skipped)} of {args.steps} steps skipped (gradients that "
            f"overflowed float16)" + (f": steps {_some(skipped)}" if skipped else ""))
    if twin is not None:
        diff = np.abs(np.array(losses) - twin_losses)
        say(f"torch: {tokens / twin_seconds:,.0f} tokens/s; largest loss difference "
            f"{diff.max():.2e} (step {int(diff.argmax()) + 1}); {_agreement(losses, twin_losses, args.dtype)}; "
            f"held-out loss {twin.held_out[-1][1]:.4f}" + twin.summary())
    facts = {"corpus": source, "steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
             "weight_decay": args.weight_decay, "seed": args.seed, "compute_dtype": dtype.name,
             "final_loss": losses[-1], "val_loss": val, "train_text_loss": seen, "held_out": held_out}
    if scaler is not None:
        facts["loss_scale"] = {"final": scaler["scale"], "skipped_steps": skipped}
    if twin is not None:
        facts["torch_val_loss"] = twin.held_out[-1][1]

    def plot(file):
        return _plot(losses, held_out, twin_losses, file, source)

    for name in save_checkpoint(args.out, params, config, vocab, master_dtype(args.dtype), facts,
                                force=args.force, plot=plot):
        print(f"wrote {os.path.join(args.out, name)}")
    return 0


def _diverged(args, step, loss, losses, evaluated=None):
    """The error for a run whose loss diverged at ``step`` (``loss`` None: it overflowed); with
    ``evaluated`` ("held-out"), the step's loss was finite and that evaluation, run with the
    weights after the step, overflowed."""
    value = f"{args.dtype} overflowed" if loss is None else f"{loss:.4g}"
    first = f", from {losses[0]:.4f} at step 1" if losses else ""
    after = "" if evaluated is None else (f" the {evaluated} loss, with the weights after that step, "
                                          f"overflowed {args.dtype};")
    # AdamW multiplies every weight by 1 - lr x weight_decay a step: past lr x weight_decay = 2 that
    # factor is below -1 and the weights grow without bound whatever the gradients. The option
    # blamed is then the one raised furthest past its default.
    decay = args.lr * args.weight_decay
    if decay > 2 and args.weight_decay / DEFAULT_WEIGHT_DECAY > args.lr / DEFAULT_LR:
        cause = (f" each step multiplies every weight by 1 - --lr x --weight-decay = {1 - decay:g}, which "
                 f"makes them grow without bound. Lower --weight-decay (now {args.weight_decay:g}; the "
                 f"default is {DEFAULT_WEIGHT_DECAY:g})")
    else:
        cause = (f" the steps were too large for the weights to stay finite. Lower --lr (now {args.lr:g}; "
                 f"the default is 1e-2)")
    return ValueError(f"the loss diverged at step {step} (loss {value}{first}):{after}{cause} and train "
                      f"again; nothing was written to {args.out}")


def _some(numbers, shown=10):
    """``numbers`` as text, the first ``shown`` of them and how many more."""
    more = len(numbers) - shown
    return ", ".join(map(str, numbers[:shown])) + (f" and {more} more" if more > 0 else "")


def say(text):
    """Print prose wrapped to the terminal (80 columns when piped)."""
    print("\n".join(term.wrap(text, term.width_of(sys.stdout))))


def _drift_note(dtype):
    """What --compare-torch should show: AGREEMENT's bound for the first steps, which the run's
    summary checks (_agreement), then a drift whose size depends on the machine."""
    steps, allowed = AGREEMENT[dtype]
    first = "step 1" if steps == 1 else f"the first {steps} steps"
    if dtype in MIXED:
        return ("Mixed precision on both sides, but not the same roundings: NumPy rounds every "
                f"operation's output to {dtype} (each computing in float32 inside), torch's autocast "
                f"rounds the matmuls' inputs to {dtype} and runs most of the rest in float32. NumPy's "
                f"loss is a {dtype} number (spacing {_spacing(dtype)} between 4 and 8), torch's a float32 "
                f"one, so on {first} they agree within {allowed} spacings of NumPy's loss (checked at the "
                "end), and training drifts them further apart from there; what compares is the trend "
                "and the final held-out losses.")
    return ("NumPy and torch add in different orders, so their losses differ by rounding, and "
            "training amplifies any difference step by step (AdamW divides by the gradients' size, "
            f"so tiny gradients count fully). In {dtype} the two losses agree within {allowed} "
            f"spacings (ulps) of the {dtype} loss for {first}, which the end of the run checks; "
            f"after that the difference grows about tenfold every ten steps until the two are "
            f"different models. How far apart they then are depends on the machine (the BLAS "
            f"kernel for its CPU, the threads): {DRIFT[dtype]}, so that part is reported, not "
            "checked.")


def _agreement(losses, twin_losses, dtype):
    """Whether the first steps' losses agree as AGREEMENT says rounding allows, as text: the
    largest difference in spacings (ulps) of NumPy's loss, and where."""
    steps, allowed = AGREEMENT[dtype]
    eps = float(ml_dtypes.finfo(compute_dtype(dtype)).eps)
    spacings = [abs(a - b) / (eps * 2.0 ** math.floor(math.log2(max(abs(a), 1e-30))))
                for a, b in zip(losses[:steps], twin_losses[:steps], strict=True)]
    worst = int(np.argmax(spacings))
    first = "step 1 differs" if len(spacings) == 1 else f"the first {len(spacings)} steps differ"
    found = f"{first} by at most {spacings[worst]:.3g} spacings of the {dtype} loss (step {worst + 1})"
    if spacings[worst] <= allowed:
        return f"{found}, within the {allowed} that rounding allows: as expected"
    return (f"{found}, more than the {allowed} that rounding allows: the twins disagree "
            "(python -m pytest -m twin_parity shows which operation)")


def _spacing(dtype):
    """The distance between neighbouring ``dtype`` numbers in [4, 8), as text."""
    return f"{float(ml_dtypes.finfo(compute_dtype(dtype)).eps) * 4:g}"


class _TorchTwin:
    """The torch twin trained beside NumPy: the same weights, batches, masks and AdamW; for
    bfloat16 and float16, torch's own mixed precision (autocast, float16 with GradScaler)."""

    def __init__(self, params, config, hyper, threads, dtype):
        import torch

        from torch_attn import optim as torch_optim

        torch.set_num_threads(threads)
        self.torch, self.optim, self.config, self.hyper = torch, torch_optim, config, hyper
        self.params = tree_map(lambda p: torch.from_numpy(p.copy()).requires_grad_(), params)
        self.state = torch_optim.adamw_init(self.params)
        self.held_out = []
        # Mixed precision: float32 weights, autocast to the low dtype; float16 also scales the loss.
        self.autocast = getattr(torch, dtype) if dtype in MIXED else None
        self.scaler = self.builtin = None
        self.skipped = 0
        if dtype == "float16":
            # GradScaler steps a torch.optim optimiser: torch.optim.AdamW, which the twin equals.
            self.builtin = torch.optim.AdamW([p for _, p in flatten(self.params).items()], **hyper)
            self.scaler = torch.amp.GradScaler("cpu", init_scale=optim.loss_scale_init()["scale"])

    def _context(self):
        if self.autocast is None:
            return contextlib.nullcontext()
        return self.torch.autocast("cpu", dtype=self.autocast)

    def _loss(self, ids, targets, masks=None, config=None):
        from torch_attn.gpt import gpt
        from torch_attn.loss import cross_entropy

        torch = self.torch
        with self._context():
            return cross_entropy(gpt(torch.from_numpy(ids), self.params, config or self.config, masks=masks),
                                 torch.from_numpy(targets))

    def step(self, ids, targets, masks):
        torch = self.torch
        if masks is not None:
            masks = {"emb": torch.from_numpy(masks["emb"]),
                     "blocks": [{k: torch.from_numpy(m) for k, m in b.items()} for b in masks["blocks"]]}
        loss = self._loss(ids, targets, masks)
        if self.scaler is not None:
            scale = self.scaler.get_scale()
            self.scaler.scale(loss).backward()
            self.scaler.step(self.builtin)
            self.scaler.update()
            self.builtin.zero_grad()
            self.skipped += self.scaler.get_scale() < scale          # halved: the step was skipped
            return float(loss.detach())
        loss.backward()
        grads = tree_map(lambda p: p.grad, self.params)
        params, self.state = self.optim.adamw_step(self.params, grads, self.state, **self.hyper)
        self.params = tree_map(lambda p: p.requires_grad_(), params)
        return float(loss.detach())

    def evaluate(self, data, B, rng, batches=4):
        """``evaluate`` on the torch side: the same windows (the same ``rng``), no dropout."""
        config = dataclasses.replace(self.config, dropout=0.0)
        with self.torch.no_grad():
            return float(np.mean([float(self._loss(*get_batch(data, B, config.block_size, rng), config=config))
                                  for _ in range(batches)]))

    def summary(self):
        """GradScaler's figures, for float16."""
        if self.scaler is None:
            return ""
        return (f"; GradScaler: the scale went to {self.scaler.get_scale():g}, {self.skipped} "
                "steps skipped")


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
    p.add_argument("--lr", type=float, default=DEFAULT_LR, help="AdamW learning rate (default 1e-2)")
    p.add_argument("--weight-decay", type=float, default=DEFAULT_WEIGHT_DECAY, dest="weight_decay",
                   help="AdamW decoupled weight decay (default 0.01)")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="dtype of the weights and arithmetic (default float32); bfloat16 and float16 "
                        "train in mixed precision: float32 master weights and AdamW state, the "
                        "forward and backward in the low dtype, float16 with dynamic loss scaling")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights, batches and dropout (default 0)")
    p.add_argument("--compare-torch", action="store_true", dest="compare_torch",
                   help="train the torch twin beside NumPy and print both losses per step (in "
                        "float32 and float64 they agree within 4 spacings of the loss for the first "
                        "20 steps, which the run checks, then drift apart by rounding, by as much as "
                        "the machine makes them)")
    p.add_argument("--threads", type=int, default=1,
                   help="BLAS and torch threads, set whatever OMP_NUM_THREADS and the like say "
                        "(default 1: on matrices this small more threads mostly wait for each "
                        "other, and one thread gives the same losses for the same seed everywhere)")
    p.add_argument("--verbose", action="store_true", help="print the loss of every step")
    p.add_argument("--progress", action="store_true",
                   help="progress even when stderr is not a terminal (a line per step)")
