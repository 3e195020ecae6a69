"""Entry point: ``python -m benchmarks`` (see benchmarks/cli.py for the options)."""

from attn_cli.environment import needs_environment

with needs_environment("python -m benchmarks", "benchmarks,plots"):
    from benchmarks.cli import main

    status = main()
raise SystemExit(status)
