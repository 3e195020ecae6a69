"""Hypothesis profiles, BLAS/OpenMP threads (one unless OMP_NUM_THREADS says), a report of the
largest errors seen, and the error_budget marker held to the tests that call assert_error_budget.

Profiles, chosen by HYPOTHESIS_PROFILE (or ``ci`` when the CI variable is set):
    default   a quick local run
    ci        derandomized, so CI sees the same examples on every run
    thorough  many more examples; run after changing an operation
"""

import json
import os
import runpy
import sys
from pathlib import Path

# Before NumPy or torch is imported: on small arrays extra threads only cost time, so one thread
# unless the environment asks for more. The suite must pass either way: run it once with
# OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 MKL_NUM_THREADS=2 after changing a tolerance.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
THREADS = int(os.environ["OMP_NUM_THREADS"])

import pytest  # noqa: E402

from attn_cli.environment import missing_module_line  # noqa: E402  (the standard library only)

try:   # a package missing (pytest run outside the environment): one line saying what to install
    from hypothesis import HealthCheck, Phase, settings

    from attn_cli.checkpoint import replace_file
    from parity_tests import helpers
except ModuleNotFoundError as _missing:
    if missing_module_line(_missing, "python -m pytest", "tests") is None:
        raise
    # pytest reports an exception here with a traceback, pytest.exit too; SystemExit it lets pass.
    print(missing_module_line(_missing, "python -m pytest", "tests"), file=sys.stderr)
    raise SystemExit(2) from None

_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("default", max_examples=40, **_common)
# CI leaves out the target phase: the same examples every run and a bounded time. The default
# and thorough profiles keep it, so Hypothesis climbs towards the largest errors (helpers.target).
settings.register_profile("ci", max_examples=60, derandomize=True, print_blob=True,
                          phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
                          **_common)
settings.register_profile("thorough", max_examples=1000, **_common)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "default")
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """-n auto (pyproject.toml's addopts): as many workers as fit this process's cores at THREADS
    threads each, and at most 8, as each worker holds torch and transformers (about 0.5 GB)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cores // THREADS, 8))


# The project's modules: every one is imported before the first test (_same_draws_everywhere).
PACKAGES = ("numpy_attn", "torch_attn", "attn_cli", "benchmarks")


def project_modules():
    """The names of every module of the project's packages and of every test file (not __main__,
    which would run the benchmark)."""
    import pkgutil

    names = []
    for package in PACKAGES:
        path = [str(TESTS.parent / package)]
        names += [package] + [m.name for m in pkgutil.walk_packages(path, prefix=f"{package}.")
                              if not m.name.endswith(".__main__")]
    return names + [f"parity_tests.{p.stem}" for p in sorted(TESTS.glob("test_*.py"))]


@pytest.fixture(scope="session", autouse=True)
def _same_draws_everywhere():
    """Hypothesis mixes into its draws the constants of the project's modules loaded at that
    moment (a number in the code under test makes a good input). Which are loaded depends on the
    tests run before, so a derandomized test drew differently alone, in the whole suite, and in a
    pytest-xdist worker that happened to run other tests first. With every module of the project
    imported before the first test, a test draws the same examples in any run, order or worker."""
    import importlib

    for name in project_modules():
        importlib.import_module(name)


@pytest.fixture(scope="session", autouse=True)
def _threads():
    """Pin NumPy's BLAS and torch's intra-op pool to THREADS threads for the whole session."""
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(THREADS)
    with threadpool_limits(limits=THREADS):
        yield


def pytest_report_header(config):
    return f"hypothesis profile: {settings.get_current_profile_name()}; BLAS and torch threads: {THREADS}"


ERROR_FILE = "test-errors.txt"      # in the rootdir; git-ignored
ERROR_JSON = "test-errors.json"     # the same per test file, read by numpy-attn site; git-ignored
ERROR_KEYS = {"test_file", "name", "dtype", "max_abs_error", "tolerance_used"}   # one row of ERROR_JSON
BUDGET_JSON = "test-precision.json"  # the multiples of PyTorch's low-precision error; git-ignored

# -- the error_budget marker: `python docs/precision_table.py --run` runs `pytest -m error_budget` ------
# A test that calls assert_error_budget (directly or through any helper) and lacks the marker would
# be left out of that run and its op out of docs/precision.md: it fails here instead, as does a
# marked test that passes without calling it. A run of every budget test writes BUDGET_JSON and
# checks that the page has a row for each op the run recorded and none for another.
BUDGET = "error_budget"
TESTS = Path(__file__).resolve().parent
TABLE_SCRIPT = TESTS.parent / "docs" / "precision_table.py"
# Of this run: the test files collected, the budget tests selected, those that passed or skipped, those
# deselected or failed, and what differs between its records and the page.
_budget_run = {"files": set(), "marked": set(), "done": set(), "left_out": [], "failed": [], "problems": None}


def _worker(config):
    """Whether this process is a pytest-xdist worker: it collects and runs tests, and sends what it
    recorded to the controller (pytest_testnodedown), which writes the reports."""
    return hasattr(config, "workerinput")


def pytest_configure(config):
    config.addinivalue_line("markers", f"{BUDGET}: the test calls assert_error_budget (the conftest holds every "
                                       "such test to the marker); docs/precision_table.py --run runs -m error_budget")


def pytest_addoption(parser):
    parser.addoption("--precision-table-run", action="store_true",
                     help="the run of docs/precision_table.py --run, which rewrites docs/precision.md: "
                          "skip the check that the page has a row for every op the run records")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A passing test fails if it calls assert_error_budget without the marker, or has the marker
    and never calls it."""
    report = (yield).get_result()
    if report.when != "call" or not report.passed:
        return
    called, marked = item.nodeid in helpers.budget_tests(), item.get_closest_marker(BUDGET) is not None
    if called != marked:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} calls assert_error_budget but lacks @pytest.mark.{BUDGET}: "
                           "docs/precision_table.py --run (pytest -m error_budget) would leave its rows out"
                           if called else
                           f"{item.nodeid} has @pytest.mark.{BUDGET} but never called assert_error_budget")


def pytest_deselected(items):
    _budget_run["files"].update(Path(item.path) for item in items)
    _budget_run["left_out"] += [item.nodeid for item in items if item.get_closest_marker(BUDGET)]


def pytest_collection_finish(session):
    _budget_run["files"].update(Path(item.path) for item in session.items)
    _budget_run["marked"] |= {item.nodeid for item in session.items if item.get_closest_marker(BUDGET)}


def pytest_runtest_logreport(report):
    """Every test's outcome (under pytest-xdist the controller sees each worker's reports)."""
    if report.failed:
        _budget_run["failed"].append(report.nodeid)
    elif report.when == "call" or report.skipped:
        _budget_run["done"].add(report.nodeid)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist's controller: fold in what a worker collected and recorded."""
    found = getattr(node, "workeroutput", {}).get("numpy_attn")
    if found is None:
        return
    found = json.loads(found)
    helpers.merge_records(found["records"])
    _budget_run["files"].update(Path(f) for f in found["files"])
    _budget_run["marked"].update(found["marked"])
    _budget_run["left_out"] += [nodeid for nodeid in found["left_out"] if nodeid not in _budget_run["left_out"]]


def every_budget_test_passed(run):
    """Whether ``run`` (its files collected, budget tests deselected, failed, and neither passed nor
    skipped: pending) collected every test file, deselected no budget test, and ran each to a pass
    or a skip: then its records are the whole table's."""
    return set(TESTS.glob("test_*.py")) <= run["files"] and not (run["left_out"] or run["failed"] or run["pending"])


def pytest_sessionfinish(session):
    """BUDGET_JSON from a run of every budget test; unless this is the table script's own run, the
    ops it recorded checked against docs/precision.md's rows, the run failed where they differ.
    A pytest-xdist worker only hands its records to the controller."""
    if _worker(session.config):
        session.config.workeroutput["numpy_attn"] = json.dumps({
            "records": helpers.records(), "files": sorted(map(str, _budget_run["files"])),
            "marked": sorted(_budget_run["marked"]), "left_out": _budget_run["left_out"]})
        return
    rows = helpers.budget_rows()
    failed = {nodeid for nodeid in _budget_run["failed"] if nodeid in _budget_run["marked"]}
    run = dict(files=_budget_run["files"], pending=_budget_run["marked"] - _budget_run["done"] - failed,
               left_out=_budget_run["left_out"], failed=sorted(failed))
    if not rows or not every_budget_test_passed(run):
        return
    (session.config.rootpath / BUDGET_JSON).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    if session.config.getoption("--precision-table-run"):
        return
    table = runpy.run_path(str(TABLE_SCRIPT), run_name="precision_table")
    _budget_run["problems"] = table["page_problems"](rows, table["PAGE"].read_text(encoding="utf-8"))
    if _budget_run["problems"]:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _earlier_error_rows(root):
    """ERROR_JSON's rows of an earlier run, of test files that still exist; none if the file is
    absent or not such a list (it is ours to rewrite: the site reads it, nobody edits it)."""
    try:
        rows = json.loads((root / ERROR_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(rows, list) or not all(isinstance(row, dict) and set(row) == ERROR_KEYS for row in rows):
        return []
    return [row for row in rows if isinstance(row["test_file"], str) and (root / row["test_file"]).is_file()]


def pytest_terminal_summary(terminalreporter, config):
    """The ten comparisons closest to their tolerance on the terminal; every one in ERROR_FILE."""
    if _worker(config):
        return
    if _budget_run["problems"]:
        terminalreporter.write_sep("=", "docs/precision.md is not the budget tests' table", red=True)
        terminalreporter.write_line(f"{_budget_run['problems']}: regenerate it with "
                                    "`python docs/precision_table.py --run`")
    lines = helpers.error_report()
    if not lines:
        return
    path = config.rootpath / ERROR_FILE
    path.write_text("Largest error seen per compared tensor and dtype (by name), and the share of "
                    "its tolerance it used.\n" + "\n".join(lines) + "\n", encoding="utf-8")
    rows = helpers.merged_error_rows(_earlier_error_rows(config.rootpath), helpers.error_rows())
    replace_file(config.rootpath / ERROR_JSON, (json.dumps(rows, indent=1) + "\n").encode())
    terminalreporter.write_sep("-", "largest errors seen: the ten closest to their tolerance")
    for line in helpers.error_report(most=10):
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"all {len(lines)} compared tensors: {path}")
