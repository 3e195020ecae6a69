"""The ``numpy-attn`` command: ``--version`` and one subcommand per module of ``COMMANDS``.

Each command module owns its options and its work: ``HELP`` (one line for the command list),
``add_arguments(parser)`` and ``run(args) -> exit status``. Modules are imported when the parser is
built; torch and matplotlib are imported only inside the commands that need them. A third-party
module missing where it is imported ends the command with one line saying what to install.
"""

import argparse
import difflib
import importlib
import os
import sys
import textwrap

from attn_cli.environment import missing_module_line, needs_environment

# name -> module in attn_cli, in the order ``numpy-attn --help`` lists them.
COMMANDS = {
    "walkthrough": "walkthrough",
    "show": "show",
    "tokenize": "tokens",
    "train": "train",
    "generate": "generate",
    "site": "site",
    "check": "check",
    "exercise": "exercise",
}

# What the README's set-up installs for the commands: torch for the comparisons, matplotlib
# and pygments for the pictures and pages.
EXTRAS = "torch,plots"


class HelpFormatter(argparse.HelpFormatter):
    """Help wrapped at word boundaries to the terminal's width (COLUMNS, else the terminal's, as
    argparse measures it). A description's paragraphs are refilled; an indented line (an example:
    a command, a gap of spaces, what it does) is kept as written where it fits, else its
    explanation goes under it. A command is never cut, so that it can be copied."""

    def _fill_text(self, text, width, indent):
        out, paragraph = [], []

        def flush():
            out.extend(textwrap.wrap(" ".join(paragraph), width, initial_indent=indent,
                                     subsequent_indent=indent, break_on_hyphens=False,
                                     break_long_words=False))
            paragraph.clear()

        for line in text.splitlines():
            if line.strip() and not line[:1].isspace():
                paragraph.append(line.strip())
                continue
            flush()
            command, gap, explanation = line.strip().partition("  ")
            if len(indent + line) <= width or not gap:
                out.append((indent + line).rstrip())
            else:                              # the example's explanation under its command
                lead = indent + line[: len(line) - len(line.lstrip())]
                out.append(lead + command)
                out.extend(textwrap.wrap(explanation.strip(), width, initial_indent=lead + "    ",
                                         subsequent_indent=lead + "    ", break_on_hyphens=False))
        flush()
        return "\n".join(out)


def build_parser():
    # Imported here, so that a missing NumPy reaches main's one line.
    from numpy_attn import __version__

    parser = argparse.ArgumentParser(
        prog="numpy-attn",
        formatter_class=HelpFormatter,
        description="Transformer attention in NumPy and PyTorch, side by side.",
        epilog="Run numpy-attn COMMAND --help for a command's options and examples.",
    )
    parser.add_argument("--version", action="version", version=f"numpy-attn {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    parser.commands = {}                      # name -> its parser, for messages about its options
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"attn_cli.{module_name}")
        p = sub.add_parser(name, help=module.HELP)
        module.add_arguments(p)
        p.formatter_class = HelpFormatter     # in place of term.describe's raw description
        p.set_defaults(func=module.run)
        parser.commands[name] = p
    return parser


def unrecognized(extras, parser):
    """argparse's message for arguments that no option of ``parser`` takes, with the nearest
    option for each misspelt one (``--breif``: did you mean '--brief'?)."""
    options = [s for action in parser._actions for s in action.option_strings if s.startswith("--")]
    hints = []
    for arg in extras:
        close = difflib.get_close_matches(arg.partition("=")[0], options, n=1) if arg.startswith("-") else []
        if close:
            hints.append(f"{arg!r}: did you mean {close[0]!r}?")
    return "; ".join([f"unrecognized arguments: {' '.join(extras)}", *hints])


def _quiet_closed_pipe():
    """The reader of our output has gone (``numpy-attn walkthrough | head``): send what is left,
    including what Python flushes at exit, nowhere."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):       # stdout is not a real file (a test's StringIO)
        pass


def main(argv=None):
    with needs_environment("numpy-attn", EXTRAS):
        parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:      # the command's own usage and error, exit status 2, as argparse's parse_args
        command = parser.commands.get(args.command, parser)
        command.error(unrecognized(extras, command))
    if args.command is None:
        parser.print_help()
        return 2
    from attn_cli.tokenizer import TokenizerUnavailable

    try:
        return args.func(args)
    except BrokenPipeError:             # before OSError, of which it is a kind
        _quiet_closed_pipe()
        return 0
    except (TokenizerUnavailable, ImportError, ValueError, TypeError, OSError) as err:
        missing = (missing_module_line(err, f"numpy-attn {args.command}", EXTRAS)
                   if isinstance(err, ModuleNotFoundError) else None)
        print(missing or f"numpy-attn {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
