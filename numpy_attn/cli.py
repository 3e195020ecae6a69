"""The ``numpy-attn`` command: ``numpy-attn --version``, ``numpy-attn tokenize TEXT``.

Subcommands that compare NumPy with torch import torch inside themselves, never at module level.
"""

import argparse
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
