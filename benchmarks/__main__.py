"""Entry point: ``python -m benchmarks`` (see benchmarks/cli.py for the options)."""

import os
import sys

from benchmarks.cli import main

try:
    status = main()
except BrokenPipeError:
    # stdout closed early (``| head``): the files are already written; exit quietly, as cat does.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    status = 1
raise SystemExit(status)
