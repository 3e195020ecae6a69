"""Entry point: ``python -m benchmarks`` (see benchmarks/cli.py for the options)."""

from benchmarks.cli import main

raise SystemExit(main())
