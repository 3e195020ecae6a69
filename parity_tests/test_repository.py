"""The repository stands on its own: its text refers only to files a user of it can open; its
packages import one another without a loop; and its test files share code through modules that are
not test files, never by importing one another."""

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


# -- imports --------------------------------------------------------------------------------------

PACKAGES = ("numpy_attn", "torch_attn", "attn_cli", "benchmarks")


def import_graph(root, packages):
    """{module: the project's modules it imports}, from every import statement of every file,
    those inside functions included (an import put off into a function still closes a loop).
    ``from p import m`` counts as importing the module p.m where it is one, else p."""
    files = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def module_of(name):
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:                                   # from . import x, from ..y import z
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                imported.update(f"{base}.{alias.name}" for alias in node.names)
        graph[name] = {m for m in map(module_of, imported) if m and m != name}
    return graph


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan's algorithm), sorted."""
    index, low, stack, found = {}, {}, [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_package_imports_in_a_circle():
    """No module of the shipped packages imports, directly or through others, a module that
    imports it back: each package reads from its leaves up (benchmarks/cli.py at the top)."""
    graph = import_graph(ROOT, PACKAGES)
    found = cycles(graph)
    assert not found, f"modules that import each other, directly or in a circle: {found}"


def test_the_cycle_check_can_fail():
    """Guard: a loop through three modules and one through two are found, apart from the rest."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"}}
    assert cycles(graph) == [["a", "b", "c"], ["e", "f"]]
    assert "benchmarks.cli" in import_graph(ROOT, PACKAGES)["benchmarks.__main__"]


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
