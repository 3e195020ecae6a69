"""Package-level tests: imports stay light, and the numpy-attn command works."""

import subprocess
import sys
from pathlib import Path

import pytest

import numpy_attn
from attn_cli import cli
from parity_tests.helpers import needs_vocab


def test_import_leaves_torch_and_tiktoken_out():
    """Importing numpy_attn, every operation module and the command's entry point imports NumPy only."""
    code = (
        "import sys, pkgutil, importlib, numpy_attn\n"
        "for m in pkgutil.walk_packages(numpy_attn.__path__, 'numpy_attn.'):\n"
        "    importlib.import_module(m.name)\n"
        "importlib.import_module('attn_cli.cli')\n"
        "print(sorted(n for n in ('torch', 'tiktoken') if n in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", f"imported at module level: {result.stdout}"


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"numpy-attn {numpy_attn.__version__}"


def test_console_script_is_installed():
    script = Path(sys.executable).with_name("numpy-attn")   # beside the interpreter in a venv
    result = subprocess.run([str(script), "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and numpy_attn.__version__ in result.stdout, result


@needs_vocab
def test_tokenize_prints_ids_and_strings(capsys):
    assert cli.main(["tokenize", "The cat sat on the mat"]) == 0
    out = capsys.readouterr().out
    assert "6 GPT-2 tokens" in out
    assert "3797  ' cat'" in out


def test_no_subcommand_prints_help(capsys):
    assert cli.main([]) == 2
    assert "tokenize" in capsys.readouterr().out


@pytest.mark.parametrize("command", list(cli.COMMANDS) + [None])
def test_help_is_wrapped_to_the_terminal(command):
    """At COLUMNS=80 every help line fits, the description refilled at word boundaries; only an
    example command too long for a line (no explanation beside it) stands whole, to be copied."""
    import os

    argv = [sys.executable, "-m", "attn_cli.cli"] + ([command] if command else []) + ["--help"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    too_long = [line for line in lines if len(line) > 80
                and not (line.startswith("  numpy-attn ") and "  " not in line.strip())]
    assert not too_long, too_long
    if command:
        parser = cli.build_parser()
        description = parser._subparsers._group_actions[0].choices[command].description
        words = " ".join(lines).split()
        assert " ".join(description.split()) in " ".join(words), "the description, every word whole"
