"""Hypothesis profiles, one BLAS/OpenMP thread, and a summary of the largest errors seen.

Profiles, chosen by HYPOTHESIS_PROFILE (or ``ci`` when the CI variable is set):
    default   a quick local run
    ci        derandomized, so CI sees the same examples on every run
    thorough  many more examples; run before resolving an issue
"""

import os

# Before NumPy or torch is imported: on small arrays extra threads only cost time.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

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
def _one_thread():
    """Pin NumPy's BLAS and torch's intra-op pool to one thread for the whole session."""
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    with threadpool_limits(limits=1):
        yield


def pytest_report_header(config):
    return f"hypothesis profile: {settings.get_current_profile_name()}"


def pytest_terminal_summary(terminalreporter):
    """Print the largest error seen per compared tensor (for the issue notes)."""
    lines = helpers.error_report()
    if lines:
        terminalreporter.write_sep("-", "largest errors seen")
        for line in lines:
            terminalreporter.write_line(line)
