"""Parity at the benchmark size, before any timing: a fast wrong answer is not a result.

For one op at one size, the NumPy pair is the reference; every torch implementation that will be
timed must reproduce its output and every gradient (for the same random ``dout``) to within
``TOLERANCE`` (see there), and keep the run's dtype. This runs in the
parent process, where both libraries are loaded: nothing here is timed.
"""

import numpy as np

from benchmarks import calls

# Errors are measured against max(max |reference|, 1) of each tensor: relative for the usual
# tensors, absolute for small ones. Inputs are drawn at unit scale, and some gradients are zero in
# exact arithmetic and hold only rounding noise (the key bias: softmax ignores a shift shared by
# all keys), which no relative test can pass. float32 keeps ~7 digits and a sum over S = 2048
# terms can lose ~3 to rounding order (BLAS blocking, flash-style kernels): 1e-4 leaves room
# and still catches any real bug, which shows up at 1e-2 or worse. float64 likewise at 1e-9.
# float16 and bfloat16: NumPy computes in float32 and rounds once, so its result is within half
# an ulp of the float32 one; torch's kernels compute in float32 too but may round in between (the
# flash kernel rounds its probabilities before P @ V, docs/precision.md): F.sdpa's output and
# gradients came within 1.8 ulps (of the dtype, at 1) of float32-then-round at B = 4, nh = 8,
# hs = 64, T = 128 to 2048, causal or not (float16 1.7e-3, bfloat16 1.3e-2). 8 ulps at 1 leave
# four times that and still catch a real bug (a wrong scale or term is off by far more).
TOLERANCE = {np.dtype(np.float16): 8 * 2.0**-10, np.dtype(calls.dtype_of("bfloat16")): 8 * 2.0**-7,
             np.dtype(np.float32): 1e-4, np.dtype(np.float64): 1e-9}


class ParityError(AssertionError):
    """An implementation disagrees with the NumPy reference: its timings would mean nothing."""


def rel_err(actual, expected):
    """max |actual - expected| / max(max |expected|, 1), computed in float64."""
    a, e = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.max(np.abs(a - e), initial=0.0) / max(np.max(np.abs(e), initial=0.0), 1.0))


def _named(out, grads):
    """[(name, array)]: the output, then each gradient by its input's dotted path."""
    return [("out", out)] + [(f"grad {path}", g) for path, g in calls.leaves(grads)]


def check(op, size, dtype, seed, targets, tolerance=None):
    """Compare every (impl, device) in ``targets`` with the NumPy pair at ``size``.

    Returns {(impl, device): {"ok", "max_rel_err", "worst", "tol"}} (NumPy itself: error 0) and
    raises ParityError listing every disagreement, dtype other than the run's, or exception.
    """
    import torch

    dtype = np.dtype(dtype)
    tol = TOLERANCE[dtype] if tolerance is None else tolerance
    where = f"{op.name} B={size.B} nh={size.nh} T={size.T} hs={size.hs} {dtype}"
    try:   # e.g. an operation that does not take this dtype: its message, not a traceback
        diff, static = calls.make_inputs(op, size, dtype, seed)
        fwd, _ = calls.numpy_calls(op, diff, static, None)
        dout = calls.make_dout(fwd()[0].shape, dtype, seed)
        out, grads = calls.numpy_calls(op, diff, static, dout)[1]()
    except (TypeError, ValueError) as err:
        raise ParityError(f"parity failed for {where}:\n  numpy raised {type(err).__name__}: {err}") from None
    reference = _named(out, calls.numpy_grads(diff, grads))
    problems = [f"numpy {name} is {a.dtype}, not {dtype}"
                for name, a in reference if a.dtype != dtype]
    results = {("numpy", "cpu"): dict(ok=not problems, max_rel_err=0.0, worst=None, tol=tol)}
    for impl, device in targets:
        if impl == "numpy":
            continue
        tensors = calls.to_device(diff, device)
        _, fwd_bwd = calls.torch_calls(op, impl, tensors, static, calls.to_tensor(dout, device))
        try:
            out_t, grads_t = fwd_bwd()
        except Exception as err:   # e.g. a twin that builds a mask on the CPU for CUDA inputs
            problems.append(f"{impl} {device} raised {type(err).__name__}: {err}")
            continue
        actual = _named(out_t, calls.rebuild(diff, iter(grads_t)))
        errors = {}
        for (name, a), (_, e) in zip(actual, reference, strict=True):
            if a.dtype != getattr(torch, dtype.name):
                problems.append(f"{impl} {device} {name} is {a.dtype}, not {dtype}")
            errors[name] = rel_err(a.detach().cpu().double().numpy(), e)   # float64 holds every dtype
        problems += [f"{impl} {device} {name}: relative error {err:.2e} > {tol:.0e}"
                     for name, err in errors.items() if not err <= tol]   # NaN fails too
        worst = max(errors, key=errors.get)
        ok = errors[worst] <= tol
        results[(impl, device)] = dict(ok=ok, max_rel_err=errors[worst], worst=worst, tol=tol)
    if problems:
        raise ParityError(f"parity failed for {where}:\n  " + "\n  ".join(problems))
    return results
