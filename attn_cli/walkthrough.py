"""``numpy-attn walkthrough``: self-attention step by step, NumPy and PyTorch side by side.

The computation is in ``walk_steps``, the terminal output in ``walk_render``, the heatmaps in
``plots``; this module holds the command's options and puts the three together. torch is
imported only when the PyTorch side runs; matplotlib only for ``--plot``.
"""

import argparse
import math
import os

import ml_dtypes

from attn_cli import term
from attn_cli.source_example import SOURCE_DESCRIPTION

DTYPES = ("float32", "float64", "bfloat16", "float16")

# Decimals printed by default: float32 and float64 show 4. A low-precision dtype shows those it
# keeps near 1, the size of the walkthrough's numbers: between 1 and 2, float16's numbers are
# 2^-10 = 0.001 apart (3 decimals), bfloat16's 2^-7 = 0.008 apart (2 decimals; a third is noise).
DECIMALS = {"float32": 4, "float64": 4, "float16": 3, "bfloat16": 2}

HELP = "attention step by step, NumPy and PyTorch side by side"

# The heatmaps --plot writes (one figure per step; every head of step 7 in one; step 9's gradient).
PLOT_FILES = ("step4_weight_free.png", "step5_qkv.png", "step6_causal.png", "step7_heads.png",
              "step9_dscores.png")

EXAMPLES = """examples:
  numpy-attn walkthrough                        "The cat sat on the mat", every table
  numpy-attn walkthrough --color always | less -R   in colour through a pager
  numpy-attn walkthrough --brief                each step's key table only
  numpy-attn walkthrough --example source       the source example's numbers, checkable by eye
  numpy-attn walkthrough "A dog ran" --dim 4 --heads 2 --focus dog --plot plots
"""


def add_arguments(p):
    term.describe(p, (
        "Nine steps of self-attention (tokens, embeddings, positions, weight-free attention, "
        "Q/K/V projections, the causal mask, multi-head attention, decoding with a key/value "
        "cache, and the backward of the Q/K/V step: its gradients by numpy_attn's hand-written "
        "backward and by autograd), each computed by numpy_attn and by torch_attn, printed side "
        "by side with the largest absolute difference between them. Colour only on a terminal: "
        "through a pager, pass --color always (less -R)."), EXAMPLES)
    p.add_argument("text", metavar="TEXT", nargs="?", default=None,
                   help='the text to walk through (default "The cat sat on the mat"; at most 32 '
                        "GPT-2 tokens)")
    p.add_argument("--dim", type=int, default=None,
                   help="embedding width C (default 4; 3 with --example source)")
    p.add_argument("--d-out", type=int, default=None, dest="d_out",
                   help="width of the queries, keys and values of step 5 (default 2)")
    p.add_argument("--heads", type=int, default=None,
                   help="heads of step 7; must divide --dim (default: the fewest heads above one "
                        "whose size is at least 2, so 2 heads of size 2 for --dim 4)")
    p.add_argument("--seed", type=int, default=123, help="seed of the drawn embeddings and weights (default 123)")
    p.add_argument("--positional", action=argparse.BooleanOptionalAction, default=None,
                   help="add sinusoidal positions to the embeddings (default: on, off with --example source)")
    p.add_argument("--focus", default=None,
                   help="the token followed through step 5: a 0-based position or a token (default the second)")
    p.add_argument("--example", choices=("source",), default=None,
                   help=f"source: replay the worked example of {SOURCE_DESCRIPTION}, its "
                        "embeddings and W matrices typed in, so the printed tables can be checked "
                        "against it")
    p.add_argument("--precision", type=int, default=None,
                   help="decimals printed (default 4; 3 for float16, 2 for bfloat16: the digits they keep)")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="dtype of both sides (default float32, as PyTorch); bfloat16 and float16 "
                        "round the float32 walkthrough's inputs and compute every step in that dtype")
    p.add_argument("--brief", action="store_true",
                   help="print each step's key table only (every table is still compared)")
    p.add_argument("--no-torch", action="store_true", help="run the NumPy side alone; torch is not imported")
    p.add_argument("--plot", metavar="DIR", default=None,
                   help="write PNG heatmaps of the attention weights of each step (all heads of "
                        "step 7 in one figure) and of step 9's gradient dscores to DIR")
    p.add_argument("--force", action="store_true", help="let --plot overwrite heatmaps already in DIR")
    term.add_color_option(p)


def keeps(dtype, precision):
    """The line saying what a low-precision ``dtype`` keeps, and so how many decimals are printed."""
    bits = ml_dtypes.finfo(dtype).nmant + 1                  # the stored bits and the implicit one
    return (f"{dtype.name} keeps {bits} significant bits, about {bits * math.log10(2):.1f} decimal "
            f"digits (float32 keeps 24, about 7.2): between 1 and 2 its numbers are "
            f"{float(ml_dtypes.finfo(dtype).eps):.2g} apart, so {precision} decimals are printed "
            "(--precision changes it). The inputs are the float32 walkthrough's, rounded to "
            f"{dtype.name}; each step computes in float32 inside and rounds its output to {dtype.name}.")


def run(args, out=None, color=None):
    """The command: prepare, run both sides, print, plot. Returns the exit status."""
    from attn_cli import plots, walk_render, walk_steps

    out, color = term.output(args, out, color)
    if args.plot is not None:
        plots.check_plot_dir(args.plot)
        taken = [f for f in PLOT_FILES if os.path.exists(os.path.join(args.plot, f))]
        if taken and not args.force:
            raise ValueError(f"{args.plot} already holds {', '.join(taken)}; pass --force to "
                             "overwrite, or choose another --plot folder")
    inputs = walk_steps.prepare(args)
    sides = [walk_steps.NumpySide()]
    torch_missing = False
    if not args.no_torch:
        try:
            sides.append(walk_steps.TorchSide())
        except ImportError:
            torch_missing = True
    results = {side.name: walk_steps.pipeline(side, inputs) for side in sides}
    precision = DECIMALS[inputs.dtype.name] if args.precision is None else args.precision
    p = walk_render.Printer(inputs, results, out, term.Style(color), precision,
                            term.width_of(out), brief=args.brief)
    title = f"numpy-attn walkthrough of {inputs.text!r}"     # repr: control characters escaped
    if inputs.source:
        title += f" (--example source: the worked example of {SOURCE_DESCRIPTION})"
    p.line(title, "title", indent="")
    p.line(f"{len(inputs.ids)} GPT-2 tokens, C = {inputs.C} (--dim), d = {inputs.d_out} (--d-out), "
           f"{inputs.num_heads} heads (--heads), {inputs.dtype.name}, seed {inputs.seed}")
    p.line(f"positions {'added' if inputs.positional else 'left out'} (--positional), "
           f"focus {inputs.labels[inputs.focus]!r} (--focus)")
    if inputs.dtype.name in DECIMALS and inputs.dtype.name not in ("float32", "float64"):
        p.line(keeps(inputs.dtype, precision))
    if len(sides) == 2:
        p.line("Every step runs twice, in numpy_attn (backward by hand: step 9) and in "
               "torch_attn (autograd). Each table shows NumPy left and PyTorch right (NumPy above and "
               "PyTorch below when both do not fit, in groups of columns when one does not), "
               "then their largest difference.")
        if args.brief:
            p.line('--brief: a table whose two sides print the same digits is shown once, under '
                   '"NumPy and PyTorch alike".')
    elif torch_missing:
        p.line("PyTorch is not installed, so only the NumPy side runs: "
               "pip install -c constraints.txt -e '.[torch]' to see both.", "bad")
    else:
        p.line("The NumPy side alone (--no-torch): torch is not imported.")
    walk_render.print_steps(p, inputs)
    walk_render.print_summary(p)
    if args.plot is not None:
        files = plots.write_heatmaps(p.heatmaps, inputs.labels, args.plot)
        p.line(f"{len(files)} heatmaps written to {args.plot}:")
        for file in files:
            p.raw(f"wrote {file}")          # a path whole, whatever the width
    return 0
