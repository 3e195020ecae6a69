"""The ``numpy-attn`` command: ``--version``, ``tokenize TEXT``, ``show OP``.

Subcommands that compare NumPy with torch import torch inside themselves, never at module level.
"""

import argparse
import os
import sys

from numpy_attn import __version__


def _tokenize(args):
    from numpy_attn import tokenizer

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


def _show(args):
    from numpy_attn import show

    return show.run(args, color=use_color(args.color, sys.stdout))


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
        "show",
        help="an operation's NumPy forward and backward beside its torch twin",
        description="Print numpy_attn/OP.py beside torch_attn/OP.py, lines aligned where the twins "
                    "mirror each other, or write every operation to one HTML page.",
    )
    p.add_argument("op", metavar="OP", nargs="?", default=None, help="an operation, e.g. softmax (see --list)")
    p.add_argument("--list", action="store_true", help="list the operations and exit")
    p.add_argument("--html", metavar="FILE", default=None,
                   help="write every operation, side by side, to one self-contained HTML page")
    _add_color_option(p)
    p.set_defaults(func=_show)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    from numpy_attn.tokenizer import TokenizerUnavailable

    try:
        return args.func(args)
    except (TokenizerUnavailable, ValueError, TypeError) as err:
        print(f"numpy-attn {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
