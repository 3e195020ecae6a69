"""The ``numpy-attn`` command: ``--version``, ``tokenize``, ``walkthrough``, ``show``, ``train``, ``generate``.

Subcommands that compare NumPy with torch import torch inside themselves, never at module level.
"""

import argparse
import os
import sys

from numpy_attn import __version__


def _tokenize(args):
    from attn_cli import tokenizer

    ids = tokenizer.encode(args.text)
    pieces = tokenizer.token_strings(ids)
    print(f"{len(ids)} GPT-2 tokens")
    print(f"{'pos':>4}  {'id':>6}  token")
    for pos, (i, piece) in enumerate(zip(ids, pieces, strict=True)):
        print(f"{pos:>4}  {i:>6}  {piece!r}")
    return 0


def use_color(mode, stream):
    """Colour on ``always``; on ``auto`` only for a terminal and when NO_COLOR is unset or empty."""
    if mode == "always":
        return True
    if mode == "never" or os.environ.get("NO_COLOR"):
        return False
    return stream.isatty()


def _walkthrough(args):
    from attn_cli import walkthrough

    return walkthrough.run(args, color=use_color(args.color, sys.stdout))


def _show(args):
    from attn_cli import show

    return show.run(args, color=use_color(args.color, sys.stdout))


def _train(args):
    from attn_cli import train

    return train.run_train(args)


def _generate(args):
    from attn_cli import train

    return train.run_generate(args)


def _add_color_option(p):
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colour: auto (default) uses it on a terminal unless NO_COLOR is set")


def build_parser():
    parser = argparse.ArgumentParser(
        prog="numpy-attn",
        description="Transformer attention in NumPy and PyTorch, side by side.",
    )
    parser.add_argument("--version", action="version", version=f"numpy-attn {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("tokenize", help="print the GPT-2 token ids and strings of TEXT")
    p.add_argument("text", metavar="TEXT")
    p.set_defaults(func=_tokenize)

    p = sub.add_parser(
        "walkthrough",
        help="attention step by step, NumPy and PyTorch side by side",
        description="Seven steps of self-attention (tokens, embeddings, positions, weight-free "
                    "attention, Q/K/V projections, the causal mask, multi-head attention), each "
                    "computed by numpy_attn and by torch_attn, printed side by side with the "
                    "largest absolute difference between them.",
    )
    p.add_argument("text", metavar="TEXT", nargs="?", default=None,
                   help='the text to walk through (default "The cat sat on the mat"; at most 32 '
                        "GPT-2 tokens)")
    p.add_argument("--dim", type=int, default=None, help="embedding width C (default 3)")
    p.add_argument("--d-out", type=int, default=None, dest="d_out",
                   help="width of the queries, keys and values of step 5 (default 2)")
    p.add_argument("--heads", type=int, default=None,
                   help="heads of step 7; must divide --dim (default: the smallest divisor above 1)")
    p.add_argument("--seed", type=int, default=123, help="seed of the drawn embeddings and weights (default 123)")
    p.add_argument("--positional", action=argparse.BooleanOptionalAction, default=None,
                   help="add sinusoidal positions to the embeddings (default: on, off with --example source)")
    p.add_argument("--focus", default=None,
                   help="the token followed through step 5: a 0-based position or a token (default the second)")
    p.add_argument("--example", choices=("source",), default=None,
                   help="source: replay the source's worked example, embeddings and W matrices typed in")
    p.add_argument("--precision", type=int, default=None, help="decimals printed (default 4)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                   help="dtype of both sides (default float32, as PyTorch)")
    p.add_argument("--no-torch", action="store_true", help="run the NumPy side alone; torch is not imported")
    p.add_argument("--plot", metavar="DIR", default=None,
                   help="write PNG heatmaps of the attention weights of each step and head to DIR")
    _add_color_option(p)
    p.set_defaults(func=_walkthrough)

    p = sub.add_parser(
        "show",
        help="an operation's NumPy forward and backward beside its torch twin",
        description="Print numpy_attn/OP.py beside torch_attn/OP.py, lines aligned where the twins "
                    "mirror each other, or write every operation to one HTML page.",
    )
    p.add_argument("op", metavar="OP", nargs="?", default=None, help="an operation, e.g. softmax, or one of its functions, e.g. log_softmax (see --list)")
    p.add_argument("--list", action="store_true", help="list the operations and exit")
    p.add_argument("--html", metavar="FILE", default=None,
                   help="write every operation, side by side, to one self-contained HTML page")
    _add_color_option(p)
    p.set_defaults(func=_show)

    from attn_cli import train  # NumPy only; torch is imported by --compare-torch alone

    p = sub.add_parser("train", help="train the mini GPT in NumPy (--compare-torch: beside the torch twin)")
    train.add_train_arguments(p)
    p.set_defaults(func=_train)
    p = sub.add_parser("generate", help="continue a prompt with a checkpoint of numpy-attn train")
    train.add_generate_arguments(p)
    p.set_defaults(func=_generate)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    from attn_cli.tokenizer import TokenizerUnavailable

    try:
        return args.func(args)
    except (TokenizerUnavailable, ValueError, TypeError, OSError) as err:
        print(f"numpy-attn {args.command}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:   # e.g. `numpy-attn walkthrough | head`: the reader has had enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # no second error at exit
        return 1


if __name__ == "__main__":
    sys.exit(main())
