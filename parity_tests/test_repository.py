"""The repository stands on its own: its text refers only to files a user of it can open; and its
test files share code through modules that are not test files, never by importing one another."""

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Built from pieces so that this file does not match itself.
OUTSIDE = [
    re.compile(r"\.\./" + "shared"),                       # the workspace folder beside a clone
    re.compile("DESIGN" + r"\.md"),                          # a design page that is not in the repo
    re.compile(r"\b" + "issue" + r"s? #?\d+", re.IGNORECASE),   # tracker numbers
]


def _tracked_text_files():
    try:
        names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    # .ci/run is CI's own script: it is where the workspace's folders are legitimately named.
    return [ROOT / n for n in names
            if n.endswith((".py", ".md", ".sh", ".cfg", ".toml", ".txt")) and not n.startswith(".ci/")]


def test_text_refers_only_to_the_repository():
    found = []
    for path in _tracked_text_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if any(p.search(line) for p in OUTSIDE):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "text that points outside the repository:\n" + "\n".join(found)


def test_the_patterns_can_match():
    """Guard against a pattern that never fires (the test above would then pass vacuously)."""
    samples = ["see " + "../" + "shared/x", "DESIGN" + ".md section 6", "(issue" + " 3)"]
    for pattern, sample in zip(OUTSIDE, samples, strict=True):
        assert pattern.search(sample), (pattern.pattern, sample)


# -- test files share through kits, never through one another ---------------------------------------

def imported_test_files(source):
    """The test files (parity_tests/test_*.py, by module name) that Python ``source`` imports, at any
    depth: ``from parity_tests.test_x import ...``, ``from parity_tests import test_x``,
    ``import parity_tests.test_x`` and their relative forms."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if re.fullmatch(r"parity_tests\.test_\w+", a.name)}
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            package = module == "parity_tests" or (node.level == 1 and not module)
            if package:
                found |= {a.name for a in node.names if a.name.startswith("test_")}
            elif module.startswith("parity_tests.test_") or (node.level == 1 and module.startswith("test_")):
                found.add(module.split(".")[-1])
    return found


def test_no_test_file_imports_another():
    """What several test files share lives in a module that is not a test file (helpers.py,
    strategies.py, model_kit.py, attention_kit.py, gemma_kit.py): a test file that imports another
    runs or re-collects that file's tests and ties the two files' edits together."""
    tests = Path(__file__).resolve().parent
    found = [f"{path.name} imports {', '.join(sorted(names))}"
             for path in sorted(tests.glob("*.py"))
             if (names := imported_test_files(path.read_text(encoding="utf-8")))]
    assert not found, "test files imported (move what they share to a kit module):\n" + "\n".join(found)


@pytest.mark.parametrize("source", [
    "from parity_tests.test_hf import save",
    "from parity_tests import helpers, test_gemma2",
    "import parity_tests.test_llama as llama_tests",
    "from .test_gpt import models",
    "from . import test_qwen3",
    "def f():\n    from parity_tests.test_mla import hf_rotary\n",
])
def test_an_imported_test_file_is_found(source):
    """Guard against a check that never fires: each form of import names its test file."""
    assert imported_test_files(source), source


def test_imports_of_shared_modules_are_not_test_files():
    source = ("from parity_tests.model_kit import save\nfrom parity_tests import helpers\n"
              "import parity_tests.strategies\n")
    assert not imported_test_files(source), imported_test_files(source)
