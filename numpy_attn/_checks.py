"""Input checks shared by the NumPy operations: each raises an error that names what is wrong."""

import numpy as np


def check_float(name, x):
    """Raise TypeError unless ``x`` is a float32 or float64 NumPy array."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a NumPy array, got {type(x).__name__}")
    if x.dtype not in (np.float32, np.float64):
        raise TypeError(f"{name} must be float32 or float64, got dtype {x.dtype}")


def check_integer(name, x):
    """Raise TypeError unless the array ``x`` holds integers (bool is not accepted)."""
    if not np.issubdtype(x.dtype, np.integer):
        raise TypeError(f"{name} must be integers, got dtype {x.dtype}")


def check_same_dtype(**arrays):
    """Raise TypeError if the given arrays (None allowed) do not share one dtype.

    NumPy would silently upcast a float32/float64 mix; we refuse so that dtype in = dtype out.
    """
    given = {name: a.dtype for name, a in arrays.items() if a is not None}
    if len(set(given.values())) > 1:
        listing = ", ".join(f"{name} is {dtype}" for name, dtype in given.items())
        raise TypeError(f"arrays must share one dtype: {listing}")


def check_ndim(name, x, ndim):
    """Raise ValueError unless ``x`` has exactly ``ndim`` dimensions."""
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {x.shape}")


def check_axis(name, x, axis):
    """Return ``axis`` normalised to be non-negative; raise ValueError if out of range."""
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} is out of range for {name} of shape {x.shape}")
    return axis % x.ndim


def check_dout(op, dout, shape, dtype, name="dout"):
    """Raise unless the upstream gradient matches what ``op``'s forward produced.

    TypeError for something that is not a float NumPy array of ``dtype`` (a float64 ``dout`` would
    silently turn float32 gradients into float64); ValueError for any other ``shape``, transposed
    layouts included (they would broadcast or reshape into a wrong gradient without a word).
    """
    if not isinstance(dout, np.ndarray):
        raise TypeError(f"{op}: {name} must be a NumPy array of shape {tuple(shape)} and dtype "
                        f"{np.dtype(dtype)}, got {type(dout).__name__}")
    if dout.dtype != dtype:
        raise TypeError(f"{op}: {name} must have the dtype of the forward's output, "
                        f"{np.dtype(dtype)}, got {dout.dtype} (shape {dout.shape})")
    if dout.shape != tuple(shape):
        raise ValueError(f"{op}: {name} must have the shape of the forward's output, "
                         f"{tuple(shape)}, got {dout.shape}")


def check_rng(rng, needed_for):
    """Raise TypeError unless ``rng`` is a ``np.random.Generator``; ``needed_for`` says why one
    is needed (a missing rng is the same mistake as a wrong one, so it is the same error)."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"{needed_for} needs rng: rng must be a np.random.Generator, "
                        f"got {type(rng).__name__}")
