"""The entry points the README names, run by a Python that lacks a package they need, say in one
line what to install or which environment to activate, and exit with status 2: no traceback.

The package is hidden in a fresh interpreter by an import hook ahead of every other finder, as
if it were not installed; the entry point then runs as the command line would run it."""

import subprocess
import sys
from pathlib import Path

import pytest

from attn_cli.environment import missing_module_line

ROOT = Path(__file__).resolve().parent.parent

HIDE = """
import runpy, sys

class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == {hidden!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

for loaded in [m for m in sys.modules if m.partition(".")[0] == {hidden!r}]:
    del sys.modules[loaded]
sys.meta_path.insert(0, Hide())
"""

ENTRY_POINTS = {
    # the command line, as Python code run after the hook
    "python -m benchmarks": "sys.argv = ['benchmarks', '--quick']\n"
                            "runpy.run_module('benchmarks', run_name='__main__', alter_sys=True)",
    "numpy-attn": "from attn_cli.cli import main\nraise SystemExit(main(['show', 'softmax']))",
    # the suite's conftest, collecting one file in this process
    "python -m pytest": "import pytest\n"
                        "raise SystemExit(pytest.main(['-n', '0', '-p', 'no:cacheprovider', '--collect-only', "
                        "'-q', 'parity_tests/test_erf.py']))",
}


def run_without(hidden, entry_point):
    code = HIDE.format(hidden=hidden) + ENTRY_POINTS[entry_point]
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


@pytest.mark.parametrize("entry_point", sorted(ENTRY_POINTS))
@pytest.mark.parametrize("hidden", ["ml_dtypes", "numpy"])
def test_a_missing_package_is_one_line_saying_what_to_do(entry_point, hidden):
    result = run_without(hidden, entry_point)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{entry_point}: error: the module {hidden!r} is not installed")
    assert "source .venv/bin/activate" in lines[0] and "pip install -c constraints.txt -e '.[" in lines[0]


def test_the_command_names_torch_when_a_command_needs_it():
    """A module imported inside a command (torch, by the walkthrough's twin) gets the same line,
    naming that command, where the command does not already offer to go on without it."""
    code = HIDE.format(hidden="torch") + (
        "import attn_cli.show as show\n"
        "def run(args):\n    import torch  # noqa: F401\n"
        "show.run = run\n"
        "from attn_cli.cli import main\nraise SystemExit(main(['show', 'softmax']))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                            timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("numpy-attn show: error: the module 'torch' is not installed"), result.stderr
    assert "'.[torch,plots]'" in result.stderr


def test_our_own_missing_modules_are_not_an_install_to_do():
    """A module of the repository's own that is missing is a fault in the checkout: no advice to
    install, the traceback stays."""
    for name in ("numpy_attn.nothing", "benchmarks.nothing", "attn_cli"):
        assert missing_module_line(ModuleNotFoundError("x", name=name), "numpy-attn", "torch") is None
    assert missing_module_line(ModuleNotFoundError("x"), "numpy-attn", "torch") is None
    line = missing_module_line(ModuleNotFoundError("x", name="ml_dtypes.bfloat16"), "numpy-attn", "torch")
    assert "'ml_dtypes'" in line
