"""The suite itself: every operation has the one test that -m twin_parity runs for it, and the records
a pytest-xdist worker sends (parity_tests/conftest.py) merge into what one process would have
recorded, so that test-errors.json and the precision table do not depend on how the tests were shared;
and every module of the project is loaded before any test draws, so that its draws do not either."""

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from attn_cli import show
from parity_tests import conftest, helpers

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_every_operation_has_one_twin_parity_test():
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider",
                           "-m", "twin_parity"], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "HYPOTHESIS_PROFILE": "default"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    per_file = defaultdict(list)
    for nodeid in re.findall(r"^(parity_tests/test_\w+\.py::\S+)$", done.stdout, re.M):
        per_file[nodeid.split("::")[0]].append(nodeid.split("[")[0])   # parametrized: one function
    expected = {f"parity_tests/test_{op.name}.py" for op in show.operations()}
    assert set(per_file) == expected, (sorted(expected - set(per_file)), sorted(set(per_file) - expected))
    several = {name: sorted(set(ids)) for name, ids in per_file.items() if len(set(ids)) != 1}
    assert not several, f"more than one twin_parity test in a file: {several}"


def _one_process(monkeypatch, comparisons):
    """The records (helpers.records()) of a process that ran ``comparisons``: (test file, function
    of no argument) pairs, each run as if pytest were running a test of that file."""
    monkeypatch.setattr(helpers, "_WORST", defaultdict(lambda: (0.0, 0.0)))
    monkeypatch.setattr(helpers, "_WORST_BY_FILE", defaultdict(lambda: (0.0, 0.0)))
    monkeypatch.setattr(helpers, "_BUDGET", {})
    monkeypatch.setattr(helpers, "_BUDGET_FILES", {})
    monkeypatch.setattr(helpers, "_BUDGET_TESTS", set())
    for test_file, compare in comparisons:
        monkeypatch.setenv("PYTEST_CURRENT_TEST", f"{test_file}::test_demo (call)")
        compare()
    return helpers.records()


def test_workers_records_merge_into_one_process_records(monkeypatch):
    truth = np.array([1.0, -2.0, 0.5])
    low = np.float16

    def close(err):
        return lambda: helpers.assert_close("demo.out", truth + err, truth, rtol=0.0, atol=1.0)

    def budget(op, ours_err, torch_err):
        return lambda: helpers.assert_error_budget(op, "float16", {"out": (
            (truth + ours_err).astype(low), (truth + torch_err).astype(low), truth)})

    runs = [("parity_tests/test_b.py", close(0.25)), ("parity_tests/test_a.py", close(0.125)),
            ("parity_tests/test_b.py", budget("demo[numpy]", 0.0, 0.0)),
            ("parity_tests/test_b.py", budget("demo[twin]", 0.0, 0.0)),
            ("parity_tests/test_a.py", budget("demo[numpy]", 0.25, 0.25)),
            ("parity_tests/test_b.py", close(0.5))]
    alone = _one_process(monkeypatch, runs)
    first, second = _one_process(monkeypatch, runs[::2]), _one_process(monkeypatch, runs[1::2])
    _one_process(monkeypatch, [])
    helpers.merge_records(second)
    helpers.merge_records(first)
    merged = helpers.records()
    assert {k: sorted(map(tuple, v)) for k, v in merged.items()} == {k: sorted(map(tuple, v)) for k, v in alone.items()}
    # What was merged, spelled out: the largest error of each name, per file too; a multiple of None
    # (PyTorch's error 0) only where every case had it; the op's first test file by name.
    assert sorted(map(tuple, merged["worst"])) == [("demo.out", "float64", 0.5, 0.5)]
    assert ("parity_tests/test_a.py", "demo.out", "float64", 0.125, 0.125) in map(tuple, merged["worst_by_file"])
    budget_rows = {(r["op"], r["tensor"]): r for r in helpers.budget_rows()}
    assert budget_rows["demo[numpy]", "out"]["multiple"] == 1.0
    assert budget_rows["demo[twin]", "out"]["multiple"] is None
    assert budget_rows["demo[numpy]", "out"]["test_file"] == "parity_tests/test_a.py"


def test_every_module_of_the_project_is_loaded_before_the_first_draw():
    """Hypothesis draws some values from the constants of the loaded modules of the project: the
    conftest imports every one before the first test, so this test, run alone or after any other,
    finds them all loaded."""
    names = conftest.project_modules()
    assert {"numpy_attn.softmax", "torch_attn.softmax", "attn_cli.site", "benchmarks.report",
            "numpy_attn.kernels.flash_attention", "parity_tests.test_suite"} <= set(names), names
    assert "benchmarks.__main__" not in names, "importing it would run the benchmark"
    missing = [name for name in names if name not in sys.modules]
    assert not missing, f"not imported before the tests: {missing}"
