"""Input checks shared by the NumPy operations: each raises an error that names what is wrong."""

import functools
import math
import numbers
import types

import numpy as np

# The float dtypes every operation takes, by name: bfloat16 is the one ml_dtypes registers with
# NumPy (numpy_attn does not import it; an array of it says its name like any other).
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
LOW_PRECISION = ("float16", "bfloat16")


@functools.cache
def _name(dtype):
    """``dtype.name``, remembered: NumPy builds the name anew on each read (a few microseconds),
    and the checks and casts read it hundreds of times for each token a model decodes."""
    return dtype.name


def check_float(name, x):
    """Raise TypeError unless ``x`` is a float16, bfloat16, float32 or float64 NumPy array."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a NumPy array, got {type(x).__name__}")
    if _name(x.dtype) not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got dtype {x.dtype}")


def check_finite(name, a):
    """Raise ValueError unless the array ``a`` holds no NaN or inf. A float16 or bfloat16 array
    holding inf is said to have overflowed: a model's inputs are checked finite, so its first inf
    is a value past the dtype's largest, rounded to inf by the step that computed ``a``."""
    if not np.isfinite(a).all():
        raise ValueError(f"{name} of shape {a.shape} holds NaN or inf{_overflow_text(a)}")


# For a low-precision dtype: its largest finite value, and the dtypes whose range holds more.
_RANGES = {"float16": ("65504", "bfloat16 or float32 (largest 3.4e38)"),
           "bfloat16": ("3.39e38", "float64 (largest 1.8e308)")}


def _overflow_text(a):
    """'' unless ``a`` is float16 or bfloat16 and holds inf: then that the dtype overflowed."""
    if _name(a.dtype) not in LOW_PRECISION or not np.isinf(a).any():
        return ""
    largest, wider = _RANGES[_name(a.dtype)]
    return (f" ({a.dtype} overflowed: values past its largest, {largest}, round to inf where it was "
            f"computed from finite inputs; {wider} holds them)")


def opmath(dtype):
    """The dtype an operation on ``dtype`` computes in: float32 for float16 and bfloat16 (what
    PyTorch's CPU kernels call the "opmath" type: they load the low-precision inputs, compute in
    float32 and round once at the end, docs/precision.md), ``dtype`` itself for float32 and float64."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if _name(dtype) in LOW_PRECISION else dtype


def upcast(x):
    """``x`` in its opmath dtype: a float32 copy of a float16 or bfloat16 array, ``x`` itself
    (not a copy) otherwise; None stays None."""
    return None if x is None else x.astype(opmath(x.dtype), copy=False)


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


def check_in_dtype(name, value, dtype, op=""):
    """Raise ValueError unless the real number ``value`` is finite in ``dtype``'s opmath dtype, the
    one an operation on ``dtype`` computes it in, and not 0 there unless it is 0: a float64 number
    such as 1e300 becomes inf in float32, 1e-50 becomes 0, and either turns the result into NaN,
    inf or zeros without a word. ``op`` prefixes the message."""
    computed = opmath(dtype)
    what = _lost_in(value, computed)
    if what:
        prefix = f"{op}: " if op else ""
        raise ValueError(f"{prefix}{name} must be finite (and not 0 unless it is 0) in {computed}, the dtype it "
                         f"is computed in: {name} = {value!r} {what}")


@functools.lru_cache(maxsize=256)
def _lost_in(value, computed):
    """How ``value`` is lost in the dtype ``computed``, or "" if it is not; remembered, as a model
    checks the same eps and scale in every layer for each token it decodes."""
    with np.errstate(over="ignore", under="ignore"):
        try:
            cast = computed.type(value)
        except OverflowError:                                      # a Python int beyond float64
            cast = computed.type(np.inf)
    if np.isfinite(cast) and (cast != 0 or value == 0):
        return ""
    return ("underflows to 0" if np.isfinite(cast) else
            "overflows to inf" if isinstance(value, numbers.Integral) or is_finite_number(value) else "is not finite")


def is_finite_number(value):
    """math.isfinite, False rather than OverflowError for a Python int beyond float64."""
    try:
        return math.isfinite(value)
    except OverflowError:                                          # a Python int beyond float64
        return False


def check_scale(scale, op="", dtype=None):
    """Raise unless the score scale is None or a finite real number (NumPy scalars included):
    TypeError for another type, ValueError for inf or NaN, which would make every score inf or
    NaN and the output NaN without a word, and with the inputs' ``dtype`` for a scale that
    overflows or underflows where it is used (check_in_dtype). ``op`` prefixes the message."""
    prefix = f"{op}: " if op else ""
    if scale is None:
        return
    if isinstance(scale, bool | np.bool_) or not isinstance(scale, numbers.Real):
        raise TypeError(f"{prefix}scale must be a finite number or None, got {type(scale).__name__} {scale!r}")
    if not is_finite_number(scale):
        raise ValueError(f"{prefix}scale must be a finite number or None, got {scale!r}")
    if dtype is not None:
        check_in_dtype("scale", scale, dtype, op)


def check_token_ids(ids, block_size):
    """Return ``ids`` as an array; raise unless it is an integer (B, T) array with
    T <= block_size (the embedding checks the ids against the vocabulary)."""
    ids = np.asarray(ids)
    check_ndim("ids", ids, 2)
    check_integer("token ids", ids)
    if ids.shape[1] > block_size:
        raise ValueError(f"sequence length T = {ids.shape[1]} of ids {ids.shape} exceeds "
                         f"block_size = {block_size}")
    return ids


def check_config(config, fields):
    """Return ``{name: value}`` of a config's ``fields`` as Python int/float/bool/str, or raise
    naming ``ClassName.field`` and the value given.

    ``fields`` is ``{name: (kind, low)}``: kind ``int``, ``float``, ``bool``, ``str``, a tuple of
    the strings allowed, or ``int | None`` for a field that may be None; ``low`` the smallest
    value allowed, ``POSITIVE`` (above 0, as an eps must be) or None. TypeError for the wrong type
    (a bool is not an integer, and a string is not a bool: tie_weights="false" would be true),
    ValueError for a value out of bounds. NumPy scalars are accepted and stored as Python values,
    so that a config writes to JSON.
    """
    cls = type(config).__name__
    values = {}
    for name, (kind, low) in fields.items():
        value = getattr(config, name)
        optional = isinstance(kind, types.UnionType)               # int | None
        kind = kind.__args__[0] if optional else kind
        if optional and value is None:
            values[name] = None
            continue
        is_bool = isinstance(value, bool | np.bool_)
        if (kind is bool) != is_bool or not isinstance(value, _ABSTRACT.get(kind, str) | np.bool_):
            wanted = ("None or " if optional else "") + _KIND_NAMES.get(kind, "a str")
            raise TypeError(f"{cls}.{name} must be {wanted}, got {type(value).__name__} {value!r}")
        if isinstance(kind, tuple) and value not in kind:          # the strings allowed
            raise ValueError(f"{cls}.{name} must be {' or '.join(map(repr, kind))}, got {value!r}")
        if low is POSITIVE and not value > 0:
            raise ValueError(f"{cls}.{name} must be a number > 0, got {value!r}")
        if low is not None and low is not POSITIVE and value < low:
            bound = f"a number >= {low}" if kind is float else \
                "a positive integer" if low == 1 else f"an integer >= {low}"
            raise ValueError(f"{cls}.{name} must be {bound}, got {value!r}")
        values[name] = str(value) if isinstance(kind, tuple) else kind(value)
    return values


POSITIVE = "> 0"          # check_config's bound for a value that must lie above 0
_ABSTRACT = {int: numbers.Integral, float: numbers.Real, bool: bool, str: str}
_KIND_NAMES = {int: "an integer", float: "a real number", bool: "a bool", str: "a str"}


def check_positions(positions, B, T, limit=None):
    """Raise unless ``positions`` is None or an integer array of shape (T,) or (B, T) whose values,
    with a ``limit`` (a learned position table's length), lie in [0, limit)."""
    if positions is None:
        return
    positions = np.asarray(positions)
    check_integer("positions", positions)
    if positions.shape not in ((T,), (B, T)):
        raise ValueError(f"positions must have shape ({T},) or ({B}, {T}) to match ids ({B}, {T}), "
                         f"got {positions.shape}")
    low, high = positions.min(initial=0), positions.max(initial=0)
    if limit is not None and (low < 0 or high >= limit):
        raise ValueError(f"positions must lie in [0, block_size = {limit}), got values {low}..{high}")


def check_model_attn_mask(attn_mask, scores_shape):
    """Raise unless ``attn_mask`` is None or a bool array (True = may attend) that broadcasts to
    the scores' shape (B, nh, T, S) without growing it."""
    if attn_mask is None:
        return
    if not isinstance(attn_mask, np.ndarray) or attn_mask.dtype != np.bool_:
        raise TypeError(f"attn_mask must be a bool NumPy array (True where a query may attend), got "
                        f"{getattr(attn_mask, 'dtype', type(attn_mask).__name__)}")
    try:
        fits = np.broadcast_shapes(attn_mask.shape, scores_shape) == tuple(scores_shape)
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"attn_mask of shape {attn_mask.shape} does not broadcast to the scores' shape "
                         f"(B, nh, T, S) = {tuple(scores_shape)}")


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


def check_attention_inputs(q, k, v, attn_mask=None, is_causal=False, dropout_p=0.0, rng=None,
                           broadcast=False):
    """Raise on inputs scaled dot-product attention cannot take, naming the argument at fault.

    q (..., T, hs), k (..., S, hs), v (..., S, hv): float arrays of one dtype, finite; k and v may
    have fewer heads (axis -3) than q when they divide q's (grouped-query attention). With
    ``broadcast`` the other leading dimensions of q and of k, v need only broadcast against each
    other (as in torch.nn.functional.scaled_dot_product_attention); without, they are equal. attn_mask is
    None, bool, or float of q's dtype without NaN or +inf, and broadcasts to the scores (..., T, S)
    without growing them. TypeError for wrong types, ValueError for wrong shapes and values.
    """
    for name, a in (("q", q), ("k", k), ("v", v)):
        check_float(name, a)
        if a.ndim < 2:
            raise ValueError(f"{name} must have shape (..., length, head size), got {a.shape}")
    check_same_dtype(q=q, k=k, v=v)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k head sizes differ: q {q.shape}, k {k.shape}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v lengths differ: k {k.shape}, v {v.shape}")
    if k.shape[:-2] != v.shape[:-2]:
        raise ValueError(f"k and v leading dimensions differ: k {k.shape}, v {v.shape}")
    error = _heads_error(q.shape, k.shape, broadcast)
    if error:
        raise ValueError(error + layout_hint(q.shape, k.shape,
                                             lambda qs, ks: not _heads_error(qs, ks, broadcast)))
    gqa = _grouped(q.shape, k.shape, broadcast)
    for name, a in (("q", q), ("k", k), ("v", v)):
        check_finite(name, a)
    if attn_mask is not None:
        if not isinstance(attn_mask, np.ndarray):
            raise TypeError(f"attn_mask must be a NumPy array, got {type(attn_mask).__name__}")
        if is_causal:
            raise ValueError(f"attn_mask of shape {attn_mask.shape} and is_causal=True are both "
                             "given (PyTorch's SDPA refuses this too); pass one mask, e.g. "
                             "attn_mask & np.tri(T, S, dtype=bool)")
        if attn_mask.dtype != np.bool_ and attn_mask.dtype != q.dtype:
            raise ValueError(f"attn_mask of shape {attn_mask.shape} must be bool (True = may "
                             f"attend) or float of q's dtype {q.dtype}, got dtype {attn_mask.dtype}")
        if attn_mask.dtype != np.bool_ and not np.all(attn_mask < np.inf):
            raise ValueError(f"attn_mask of shape {attn_mask.shape} holds NaN or +inf; a float mask "
                             "is added to the scores, -inf where a query may not attend")
        lead = q.shape[:-2] if not broadcast else np.broadcast_shapes(
            q.shape[:-3] if gqa else q.shape[:-2],
            k.shape[:-3] if gqa else k.shape[:-2]) + (q.shape[-3:-2] if gqa else ())
        scores_shape = lead + (q.shape[-2], k.shape[-2])
        try:   # at least (T, S) or (1, S), as PyTorch requires, and no growing the output's shape
            fits = attn_mask.ndim >= 2 and np.broadcast_shapes(attn_mask.shape, scores_shape) == scores_shape
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(f"attn_mask of shape {attn_mask.shape} does not broadcast to the "
                             f"scores' shape {scores_shape} (q {q.shape}, k {k.shape})")
    if not 0 <= dropout_p < 1:
        raise ValueError(f"dropout_p must lie in [0, 1), got {dropout_p}")
    if dropout_p > 0 and not isinstance(rng, np.random.Generator):
        raise TypeError(f"dropout_p = {dropout_p} needs rng, an np.random.Generator, got {rng!r}")


def _heads_error(q_shape, k_shape, broadcast):
    """What is wrong with q's and k's leading dimensions and head axes (-3), or None when they fit
    (check_attention_inputs' rule)."""
    gqa = _grouped(q_shape, k_shape, broadcast)
    if broadcast:   # the head axis by grouped-query attention, or else every leading axis broadcasts
        lead = (q_shape[:-3], k_shape[:-3]) if gqa else (q_shape[:-2], k_shape[:-2])
        try:
            np.broadcast_shapes(*lead)
            fits = True
        except ValueError:
            fits = False
    else:
        fits = (q_shape[:-2] == k_shape[:-2]
                or (gqa and len(q_shape) == len(k_shape) and q_shape[:-3] == k_shape[:-3]))
    if not fits:
        rule = "or ones that broadcast, " if broadcast else ""
        return (f"q {q_shape} and k {k_shape} must have the same leading dimensions, "
                f"{rule}or differ only in the head axis -3 (grouped-query attention)")
    if gqa and q_shape[-3] % k_shape[-3]:
        return (f"grouped-query attention needs the query head count {q_shape[-3]} to "
                f"be a multiple of the key/value head count {k_shape[-3]}: "
                f"q {q_shape}, k {k_shape}")
    return None


def _grouped(q_shape, k_shape, broadcast):
    """Whether the head axes (-3) differ as grouped-query heads: they differ, and with
    ``broadcast`` neither is 1 (a 1 broadcasts)."""
    return (min(len(q_shape), len(k_shape)) >= 3 and q_shape[-3] != k_shape[-3]
            and (not broadcast or min(q_shape[-3], k_shape[-3]) > 1))


def layout_hint(q_shape, k_shape, fits):
    """For shapes an attention refuses: the advice to swap the length and head axes where
    ``fits(q_shape, k_shape)`` holds with them swapped, as it does for (B, T, nh, hs) arrays (the
    layout of x.reshape(B, T, nh, hs) before its transpose); else ""."""
    if min(len(q_shape), len(k_shape)) < 3:
        return ""
    if not fits(*[s[:-3] + (s[-2], s[-3], s[-1]) for s in (q_shape, k_shape)]):
        return ""
    four = len(q_shape) == len(k_shape) == 4
    lead, axes = ("B, ", "1, 2") if four else ("..., ", "-3, -2")
    return (f"; these shapes fit as ({lead}T, nh, hs), length before heads: attention takes "
            f"({lead}nh, T, hs), so pass q.swapaxes({axes}) (torch: q.transpose({axes})), and the "
            f"same for k and v")


def check_no_past(op, attended, past):
    """Raise ValueError if ``past`` of the ``attended`` keys came from a key/value cache: their
    tokens' inputs are not in the backward's cache, so there is nothing to send their gradient to
    (the cache is for inference only)."""
    if past:
        own = attended - past
        raise ValueError(f"{op}: the forward attended over {attended} keys of which only {own} came "
                         "from its input; the rest came from a key/value cache, which is for "
                         "inference only")


def check_softcap(softcap, name="softcap", dtype=None):
    """Raise unless ``softcap`` is None (no cap) or a finite real number > 0, the c of
    c * tanh(x / c): TypeError for another type (a bool included), ValueError for c <= 0, inf or
    NaN (c = 0 divides by zero, a negative c flips every sign, inf or NaN gives NaN), and with the
    inputs' ``dtype`` for a c that overflows or underflows where it is used (check_in_dtype)."""
    if softcap is None:
        return
    if isinstance(softcap, bool | np.bool_) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"{name} must be a finite number > 0 or None, got {type(softcap).__name__} {softcap!r}")
    if not (is_finite_number(softcap) and softcap > 0):
        raise ValueError(f"{name} must be a finite number > 0 or None, got {softcap!r}")
    if dtype is not None:
        check_in_dtype(name, softcap, dtype)


def check_window(window, name="window"):
    """Raise unless ``window`` is None (no window) or an integer >= 1: the number of keys, the
    query's own included, that a query sees under sliding-window attention. TypeError for another
    type (a bool or a float such as 4.0 included), ValueError for 0 or less (no key at all)."""
    if window is None:
        return
    if isinstance(window, bool | np.bool_) or not isinstance(window, numbers.Integral):
        raise TypeError(f"{name} must be a positive integer or None, got {type(window).__name__} {window!r}")
    if window < 1:
        raise ValueError(f"{name} must be a positive integer or None, got {window!r}")


def check_window_is_causal(window, is_causal):
    """Raise unless ``window`` is None or an integer >= 1 (check_window) given with is_causal,
    whose alignment it follows: a sliding window restricts the causal mask. An attn_mask of
    one's own is combined with masks.sliding_window_mask instead."""
    check_window(window)
    if window is not None and not is_causal:
        raise ValueError(f"window = {window} needs is_causal (True, \"top_left\" or \"bottom_right\"): it "
                         "restricts the causal mask; with an attn_mask, combine it with "
                         "numpy_attn.masks.sliding_window_mask instead")


def check_sinks(sinks, q, op=""):
    """Raise unless ``sinks`` is None or a finite (nh,) array of q's dtype, nh = q.shape[-3] the
    query heads (one learned sink logit each, grouped-query heads included; attention_sinks.py
    passes attention's output as q): TypeError for another type or dtype, ValueError for another
    shape (or a q without a head axis), NaN or inf. ``op`` prefixes the message."""
    prefix = f"{op}: " if op else ""
    if sinks is None:
        return
    if not isinstance(sinks, np.ndarray):
        raise TypeError(f"{prefix}sinks must be a NumPy array (nh,) or None, got {type(sinks).__name__} {sinks!r}")
    if sinks.dtype != q.dtype:
        raise TypeError(f"{prefix}sinks must have q's dtype {q.dtype}, got dtype {sinks.dtype}: {sinks!r}")
    heads = q.shape[-3:-2] if q.ndim >= 3 else None
    if heads is None or sinks.shape != heads:
        expected = f"(nh,) = {heads}" if heads is not None else "(nh,), but q has no head axis"
        raise ValueError(f"{prefix}sinks must have shape {expected}, one per query head (q {q.shape}), "
                         f"got shape {sinks.shape}")
    if not np.isfinite(sinks).all():
        raise ValueError(f"{prefix}sinks must be finite, got {sinks!r}")
