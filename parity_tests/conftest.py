"""Hypothesis profiles, BLAS/OpenMP threads (one unless OMP_NUM_THREADS says), and a report of
the largest errors seen.

Profiles, chosen by HYPOTHESIS_PROFILE (or ``ci`` when the CI variable is set):
    default   a quick local run
    ci        derandomized, so CI sees the same examples on every run
    thorough  many more examples; run after changing an operation
"""

import json
import os

# Before NumPy or torch is imported: on small arrays extra threads only cost time, so one thread
# unless the environment asks for more. The suite must pass either way: run it once with
# OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 MKL_NUM_THREADS=2 after changing a tolerance.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
THREADS = int(os.environ["OMP_NUM_THREADS"])

import pytest  # noqa: E402
from hypothesis import HealthCheck, Phase, settings  # noqa: E402

from parity_tests import helpers  # noqa: E402

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
BUDGET_JSON = "test-precision.json"  # the multiples of PyTorch's low-precision error; git-ignored


def pytest_terminal_summary(terminalreporter, config):
    """The ten comparisons closest to their tolerance on the terminal; every one in ERROR_FILE."""
    if helpers.budget_rows():
        (config.rootpath / BUDGET_JSON).write_text(json.dumps(helpers.budget_rows(), indent=1) + "\n",
                                                   encoding="utf-8")
    lines = helpers.error_report()
    if not lines:
        return
    path = config.rootpath / ERROR_FILE
    path.write_text("Largest error seen per compared tensor and dtype (by name), and the share of "
                    "its tolerance it used.\n" + "\n".join(lines) + "\n", encoding="utf-8")
    (config.rootpath / ERROR_JSON).write_text(json.dumps(helpers.error_rows(), indent=1) + "\n",
                                              encoding="utf-8")
    terminalreporter.write_sep("-", "largest errors seen: the ten closest to their tolerance")
    for line in helpers.error_report(most=10):
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"all {len(lines)} compared tensors: {path}")
