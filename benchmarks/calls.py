"""How each implementation is called, forward and forward+backward, the same way for parity and timing.

The NumPy pair is ``out, cache = forward(**diff, **static)`` then ``backward(dout, cache)``.
The torch implementations (twin, built-in) run on tensors that require grad; their backward is
``torch.autograd.grad(out, leaves, dout)``, which returns fresh gradients (as the NumPy backward
does) instead of accumulating into ``.grad`` across repeats. torch is imported only inside the
torch functions, so the NumPy worker never loads it.

float16 and bfloat16 (``--dtype``): bfloat16 arrays are ml_dtypes', which NumPy knows by name
once ml_dtypes is imported (it imports NumPy only); torch does not read them, so their bits
travel as uint16 (``to_tensor``).
"""

import ml_dtypes
import numpy as np

from numpy_attn._tree import leaves, rebuild

DTYPES = ("float16", "bfloat16", "float32", "float64")
LOW_PRECISION = ("float16", "bfloat16")


def dtype_of(name):
    """The NumPy dtype called ``name`` (bfloat16: ml_dtypes')."""
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def opmath(dtype):
    """The dtype numpy_attn computes ``dtype`` in: float32 for float16 and bfloat16 (it casts up,
    computes and rounds once, docs/precision.md), ``dtype`` itself otherwise."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype.name in LOW_PRECISION else dtype


def make_inputs(op, size, dtype, seed):
    """The op's (diff, static) inputs at ``size``; the same seed gives the same arrays anywhere."""
    return op.inputs(size, np.dtype(dtype), np.random.default_rng([seed, size.T]))


def make_dout(shape, dtype, seed):
    """A random upstream gradient (never ones: it would make the softmax gradient zero); a
    scalar output, a loss, gets 1."""
    rng = np.random.default_rng([seed, 1, *shape])
    return rng.standard_normal(shape).astype(dtype) if shape else np.asarray(1.0, dtype)


def numpy_calls(op, diff, static, dout):
    """(forward, forward+backward) closures over fixed inputs; each returns what it computed."""
    forward, backward = op.numpy_functions()

    def fwd():
        return forward(**diff, **static)

    def fwd_bwd():
        out, cache = forward(**diff, **static)
        return out, backward(dout, cache)

    return fwd, fwd_bwd


def numpy_grads(diff, grads):
    """The NumPy backward's result as a dict keyed like ``diff`` (it returns them in that order)."""
    grads = grads if isinstance(grads, tuple) else (grads,)
    return dict(zip(diff, grads, strict=True))


def to_device(diff, device):
    """``diff`` as torch tensors on ``device`` that require grad (fresh copies of the arrays)."""
    return rebuild(diff, iter([to_tensor(a, device, requires_grad=True) for _, a in leaves(diff)]))


def to_tensor(a, device, requires_grad=False):
    """A fresh torch copy of array ``a`` on ``device`` (bfloat16 as torch.bfloat16: the same bits)."""
    import torch

    a = np.asarray(a)
    if a.dtype.name == "bfloat16":
        t = torch.from_numpy(a.view(np.uint16).copy()).view(torch.bfloat16).to(device)
        return t.requires_grad_(requires_grad)
    return torch.tensor(a, device=device, requires_grad=requires_grad)


def torch_calls(op, impl, tensors, static, dout):
    """(forward, forward+backward) closures for ``impl`` in ("twin", "builtin") on ``tensors``.

    The forward runs with grad enabled, building the graph as a training step would (the NumPy
    forward likewise builds its cache); forward+backward returns ``(out, grads)``.
    """
    import torch

    # Arrays among the other arguments go to the device too, without grad: integer ones (token
    # ids, targets) and nested dicts of them (parameters the loss gives no gradient, e.g. DSA's
    # detached indexer).
    device = next(t for _, t in leaves(tensors)).device
    static = {k: to_tensor(v, device) if isinstance(v, np.ndarray) else
              rebuild(v, iter([to_tensor(a, device) for _, a in leaves(v)])) if isinstance(v, dict) else v
              for k, v in static.items()}
    if impl == "twin":
        twin = op.twin_function()

        def fwd():
            out = twin(**tensors, **static)
            # Twins may return (out, extras), e.g. attention's (out, weights) for plotting.
            return out[0] if isinstance(out, tuple) else out
    else:
        def fwd():
            return op.call_builtin(tensors, static)

    inputs = [t for _, t in leaves(tensors)]

    def fwd_bwd():
        out = fwd()
        return out, torch.autograd.grad(out, inputs, dout)

    return fwd, fwd_bwd
