"""What an entry point says when a package it needs is not installed in the Python that runs it.

Run outside the project's virtual environment, ``python3 -m benchmarks`` would end in a
traceback ending ``No module named 'ml_dtypes'``. The entry points the README names wrap their
work in ``needs_environment``, which turns a missing third-party module into one line instead:
the module, the Python that lacks it, the environment to activate and the command that installs
it. Standard library only, so that it can speak where nothing else is installed.
"""

import contextlib
import sys

# The repository's own packages: one of their modules missing is a fault in the checkout, whose
# traceback says more than advice to install would.
OURS = ("numpy_attn", "torch_attn", "attn_cli", "benchmarks", "parity_tests", "docs")


def missing_module_line(err, command, extras):
    """The line for ``err`` (a ModuleNotFoundError met by ``command``), or None where the module is
    one of the repository's own; ``extras``, the setup.cfg extras the command needs."""
    top = (err.name or "").partition(".")[0]
    if not top or top in OURS:
        return None
    return (f"{command}: error: the module {top!r} is not installed for {sys.executable}: activate "
            f"numpy-attn's environment (source .venv/bin/activate) or install it there, from the "
            f"repository root: pip install -c constraints.txt -e '.[{extras}]'")


@contextlib.contextmanager
def needs_environment(command, extras):
    """Run the block; a third-party module missing ends it with ``missing_module_line``'s line on
    stderr and exit status 2, as the commands' other errors."""
    try:
        yield
    except ModuleNotFoundError as err:
        line = missing_module_line(err, command, extras)
        if line is None:
            raise
        print(line, file=sys.stderr)
        raise SystemExit(2) from None
