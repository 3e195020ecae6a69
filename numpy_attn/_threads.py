"""Limit the BLAS thread pool behind NumPy's matmul: one helper for the kernels, the commands and
the benchmarks. threadpoolctl is imported here, on first use, so that numpy_attn itself still
needs NumPy alone.
"""

import contextlib


def limit_blas_threads(n, required=False):
    """Limit BLAS to ``n`` threads; the limit holds at once, and is undone on leaving a ``with``.

    Without threadpoolctl: a do-nothing context when ``required`` is false (BLAS keeps its
    setting), else ImportError saying what to install.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"the BLAS thread count must be a positive integer, got {n!r}")
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        if required:
            raise ImportError("limiting BLAS threads needs threadpoolctl: "
                              "pip install threadpoolctl") from None
        return contextlib.nullcontext()
    return threadpool_limits(limits=n, user_api="blas")
