"""What PyTorch's CPU kernels compute in float32 inside a float16 or bfloat16 op, by measurement.

For each operation, on inputs rounded to the low dtype, torch's low-precision result is compared
bit for bit with two candidates:

    once   the same torch op run in float32 on the same rounded inputs, rounded once at the end
    steps  the op written as a chain of low-precision steps, each step's result rounded to the
           low dtype, reductions (sums, dot products) added one term at a time in the low dtype

The share of elements equal to each says which one the kernel does (and the backward's, through
autograd, the same way). Then the baseline of FlashAttention's error rule: for attention and
softmax, the largest |torch_lowp - truth| beside |float32-then-round - truth|, truth being
float64 on the same rounded inputs, against the sequence length; drawn to
docs/images/precision_error.png. Last, attention's output error against the sequence length in
float32, float16 and bfloat16, numpy_attn's beside PyTorch's, drawn to
docs/images/precision_attention.png. Runs on one thread, so that the results do not depend on how
a reduction is split between threads.

Its first line names the machine: the CPU, the vector extensions a kernel may choose by, torch's
CPU capability and whether its oneDNN computes in float16 and bfloat16 there, and NumPy's BLAS
kernel. A few kernels take another path on another CPU (``Op.machine_verdicts``), so their
verdicts are that machine's; the page quotes the line above its table.

    python docs/precision_measure.py [--small] [--out PATH] [--attention-out PATH]

``--small`` measures small sizes (the test's run); ``--out`` and ``--attention-out`` name the
two PNGs to write.
"""

import argparse
import math
import os
import platform
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

IMAGE = Path(__file__).resolve().parent / "images" / "precision_error.png"
ATTENTION_IMAGE = IMAGE.with_name("precision_attention.png")
LOWP = {"float16": torch.float16, "bfloat16": torch.bfloat16}
# Machine epsilon (the ulp at 1) of each dtype the attention plot compares.
EPS = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}
LENGTHS = (64, 128, 256, 512, 1024, 2048, 4096)
SMALL_LENGTHS = (64, 128)
EXACT = 0.999      # share of equal elements above which a candidate is what the kernel computes
NEAR = 0.9         # above which it is what the kernel computes up to a few ties in rounding


# ---- the low-precision steps: every result rounded to the dtype of its inputs ---------------

def seq_sum(x):
    """Sum over the last axis one term at a time, each partial sum rounded: (..., n) -> (..., 1)."""
    acc = x[..., 0]
    for i in range(1, x.shape[-1]):
        acc = acc + x[..., i]
    return acc.unsqueeze(-1)


def seq_matmul(a, b):
    """a @ b with the products and every partial sum rounded: (..., M, K), (..., K, N) -> (..., M, N)."""
    acc = a[..., :, 0:1] * b[..., 0:1, :]
    for k in range(1, a.shape[-1]):
        acc = acc + a[..., :, k:k + 1] * b[..., k:k + 1, :]
    return acc


def softmax_steps(x):
    e = torch.exp(x - x.amax(-1, keepdim=True))      # the maximum is exact in any dtype
    return e / seq_sum(e)


def softmax_steps_grad(inputs, dout):
    (x,) = inputs
    y = softmax_steps(x)
    return [y * (dout - seq_sum(dout * y))]


def log_softmax_steps(x):
    shifted = x - x.amax(-1, keepdim=True)
    return shifted - torch.log(seq_sum(torch.exp(shifted)))


def log_softmax_steps_grad(inputs, dout):
    (x,) = inputs
    return [dout - torch.exp(log_softmax_steps(x)) * seq_sum(dout)]


def matmul_steps_grad(inputs, dout):
    x, w = inputs
    return [seq_matmul(dout, w.transpose(-1, -2)), seq_matmul(x.transpose(-1, -2), dout)]


def embedding_steps_grad(inputs, dout):
    ids, w = inputs
    dw = torch.zeros_like(w)
    for t, i in enumerate(ids.tolist()):              # one scatter-add at a time, each rounded
        dw[i] = dw[i] + dout[t]
    return [None, dw]


def tanh_steps_grad(inputs, dout):
    (x,) = inputs
    y = torch.tanh(x)
    return [dout * (1 - y * y)]


def erf_steps_grad(inputs, dout):
    (x,) = inputs
    return [dout * (2 / math.sqrt(math.pi) * torch.exp(-(x * x)))]


def attention_steps(q, k, v):
    scores = seq_matmul(q, k.transpose(-1, -2)) * (1 / math.sqrt(q.shape[-1]))
    return seq_matmul(softmax_steps(scores), v)


def layer_norm_steps(x, w, b):
    C = x.shape[-1]
    mean = seq_sum(x) / C
    xc = x - mean
    var = seq_sum(xc * xc) / C
    return xc * torch.rsqrt(var + 1e-5) * w + b


def rms_norm_steps(x, w):
    ms = seq_sum(x * x) / x.shape[-1]
    return x * torch.rsqrt(ms + 1e-6) * w


def per_batch(loss):
    """One mean loss per batch of a stack: (R, N, V), (R, N) -> (R,), so that the shares count R
    losses instead of one."""
    return lambda logits, targets: torch.stack([loss(x, t) for x, t in zip(logits, targets, strict=True)])


def cross_entropy_steps(logits, targets):
    picked = log_softmax_steps(logits).gather(-1, targets.unsqueeze(-1))    # (N, 1)
    return -(seq_sum(picked.T) / len(targets)).reshape(())


def gelu_tanh_steps(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * (x * x * x))))


def sdpa(backend):
    def attention(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v)
    return attention


# ---- third candidates, in float32 from low-precision values, rounded once by the caller -----

def softmax_from_saved(inputs, out, dout):
    y, dy = out.float(), dout.float()
    return [y * (dy - (dy * y).sum(-1, keepdim=True))]


def log_softmax_from_saved(inputs, out, dout):
    dy = dout.float()
    return [dy - torch.exp(out.float()) * dy.sum(-1, keepdim=True)]


def tanh_from_saved(inputs, out, dout):
    y = out.float()
    return [dout.float() * (1 - y * y)]


def sigmoid_from_saved(inputs, out, dout):
    y = out.float()
    return [dout.float() * (1 - y) * y]


def cascade_sum(x, levels=8):
    """A sum in the dtype of ``x`` through ``levels`` partial sums, each level adding the one below
    every 2**power terms: (N,) -> (). The low-precision cascade we find nll_loss's mean to match."""
    power = max(4, math.ceil(math.log2(len(x))) // levels)
    mask = (1 << power) - 1
    partial = [torch.zeros((), dtype=x.dtype) for _ in range(levels)]
    for b in range(len(x)):
        partial[0] = partial[0] + x[b]
        for j in range(levels - 1):
            if b & (mask << (j * power)):
                break
            partial[j + 1], partial[j] = partial[j + 1] + partial[j], torch.zeros((), dtype=x.dtype)
    total = partial[0]
    for level in partial[1:]:
        total = total + level
    return total


def cross_entropy_per_node(logits, targets):
    """log_softmax in float32 rounded to the low dtype, then nll_loss's mean as a low-precision
    cascade sum divided by N."""
    picked = F.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1))[:, 0]     # (N,)
    return -cascade_sum(picked) / len(targets)


def cross_entropy_from_saved(inputs, out, dout):
    """Two autograd nodes, each float32 inside and rounded at its end: nll_loss's gradient
    (-dout / N at the targets, in the low dtype), then log_softmax's from its saved output."""
    logits, targets = inputs                                    # (R, N, V), (R, N)
    N = targets.shape[-1]
    dlogp = torch.zeros_like(logits).scatter(-1, targets.unsqueeze(-1), (-dout / N)[:, None, None].expand(
        *targets.shape, 1))
    logp = F.log_softmax(logits, -1)
    return [log_softmax_from_saved(None, logp, dlogp)[0], None]


def layer_norm_bias_by_rows(inputs, out, dout):
    """dbias as the rows of dout added one at a time in the low dtype (dx and dweight: no candidate)."""
    return [None, None, seq_sum(dout.reshape(-1, dout.shape[-1]).T)[:, 0]]


def attention_p_rounded(q, k, v):
    """Float32 scores and softmax, the unnormalised probabilities rounded to the low dtype before
    P @ V (float32 accumulation), divided by the float32 row sum at the end."""
    scores = (q.float() @ k.float().transpose(-1, -2)) * (1 / math.sqrt(q.shape[-1]))
    p = torch.exp(scores - scores.amax(-1, keepdim=True))
    return (p.to(q.dtype).float() @ v.float()) / p.sum(-1, keepdim=True)


SAVED = "float32 from the saved low-dtype output"
PER_NODE = "per autograd node: log_softmax float32 rounded once, nll_loss summed in the low dtype"


# ---- the operations measured -----------------------------------------------------------------

# An op torch hands to oneDNN in a low dtype where the CPU has that dtype's arithmetic
# (avx512_fp16, avx512_bf16, AMX; machine() says where oneDNN does) still computes in float32 and
# rounds once, but sums or evaluates in another order: the share equal to "once" moves across
# EXACT with the machine.
ONCE_ON_SOME_MACHINES = ("float32, rounded once", "float32, rounded once (nearly)")

class Op(NamedTuple):
    name: str                  # as the page's table names it
    torch_call: str            # the torch function measured
    fn: Callable               # torch's op, run in the low dtype and in float32
    steps: Callable            # the same op as low-precision steps
    inputs: Callable           # (generator, small) -> [float64 tensors, or int64 ids]
    grads: tuple               # names of the inputs whose gradient is measured ("" to skip one)
    steps_grad: Callable = None   # the backward as low-precision steps; None: autograd through steps
    # A third candidate, where once and steps both miss: (label, forward or None, backward or None),
    # each taking the low-precision inputs (the backward also the low-precision output and dout)
    # and computing in float32; its result is rounded once.
    alt: tuple = None
    # The verdicts the op's may move between from one machine to another, where its kernel takes
    # another path by the CPU (why: beside each op that has some); empty: the same on every machine.
    machine_verdicts: tuple = ()


def normal(g, *shape, scale=1.0):
    return torch.randn(shape, generator=g, dtype=torch.float64) * scale


def rows(g, small, scale=1.0):
    return [normal(g, 8, 64 if small else 256, scale=scale)]


def embedding_inputs(g, small):
    T = 64 if small else 512
    return [torch.randint(0, 8, (T,), generator=g), normal(g, 16, 32)]   # 8 ids for T tokens: repeats


def matmul_inputs(g, small):
    K = 64 if small else 256
    return [normal(g, 16, K), normal(g, K, 32)]


def attention_inputs(g, small):
    T = 32 if small else 128
    return [normal(g, 2, 2, T, 32) for _ in range(3)]


def layer_norm_inputs(g, small):
    C = 64 if small else 256
    return [normal(g, 8, C, scale=2.0) + 1.0, 1 + 0.1 * normal(g, C), 0.1 * normal(g, C)]


def rms_norm_inputs(g, small):
    C = 64 if small else 256
    return [normal(g, 8, C, scale=2.0), 1 + 0.1 * normal(g, C)]


def cross_entropy_inputs(g, small):
    R, N, V = (32, 16, 64) if small else (64, 64, 512)
    return [normal(g, R, N, V, scale=3.0), torch.randint(0, V, (R, N), generator=g)]


def unary(g, small):
    return [normal(g, 64, 64 if small else 256, scale=3.0)]


OPS = (
    Op("embedding", "F.embedding", F.embedding, lambda ids, w: w[ids], embedding_inputs, ("", "weight"),
       embedding_steps_grad),
    Op("softmax", "F.softmax", lambda x: F.softmax(x, -1), softmax_steps, lambda g, s: rows(g, s, 3.0), ("x",),
       softmax_steps_grad, (SAVED, None, softmax_from_saved)),
    Op("log_softmax", "F.log_softmax", lambda x: F.log_softmax(x, -1), log_softmax_steps,
       lambda g, s: rows(g, s, 3.0), ("x",), log_softmax_steps_grad,
       (SAVED, None, log_softmax_from_saved)),
    Op("linear (matmul)", "x @ w", torch.matmul, seq_matmul, matmul_inputs, ("x", "w"), matmul_steps_grad,
       machine_verdicts=ONCE_ON_SOME_MACHINES),
    Op("softcap (tanh)", "torch.tanh", torch.tanh, torch.tanh, unary, ("x",), tanh_steps_grad,
       (SAVED, None, tanh_from_saved)),
    # Where torch's CPU capability has vectors (AVX2, AVX-512) the flash kernel exponentiates with a
    # vectorized approximation of its own, not torch.exp's, so the third candidate (torch ops) misses
    # some of its roundings; without (ATEN_CPU_CAPABILITY=default) both take the C library's exp and
    # the candidate meets it.
    Op("attention (flash)", "F.scaled_dot_product_attention, flash CPU kernel", sdpa(SDPBackend.FLASH_ATTENTION),
       attention_steps, attention_inputs, ("q", "k", "v"), None,
       ("float32, P rounded before P @ V", attention_p_rounded, None),
       machine_verdicts=("float32, P rounded before P @ V", "float32, P rounded before P @ V (nearly)",
                         "none of these")),
    Op("attention (math)", "F.scaled_dot_product_attention, math backend", sdpa(SDPBackend.MATH),
       attention_steps, attention_inputs, ("q", "k", "v")),
    Op("layer_norm", "F.layer_norm", lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b, 1e-5), layer_norm_steps,
       layer_norm_inputs, ("x", "weight", "bias"), None,
       ("rows summed one at a time in the low dtype", None, layer_norm_bias_by_rows)),
    Op("rms_norm", "F.rms_norm", lambda x, w: F.rms_norm(x, x.shape[-1:], w, 1e-6), rms_norm_steps,
       rms_norm_inputs, ("x", "weight")),
    Op("erf", "torch.erf", torch.erf, torch.erf, unary, ("x",), erf_steps_grad),
    Op("gelu (exact)", "F.gelu", F.gelu, lambda x: 0.5 * x * (1 + torch.erf(x * (1 / math.sqrt(2)))), unary,
       ("x",), machine_verdicts=ONCE_ON_SOME_MACHINES),
    Op("gelu (tanh)", "F.gelu(approximate='tanh')", lambda x: F.gelu(x, approximate="tanh"), gelu_tanh_steps,
       unary, ("x",)),
    Op("sigmoid", "torch.sigmoid", torch.sigmoid, lambda x: 1 / (1 + torch.exp(-x)), unary, ("x",), None,
       (SAVED, None, sigmoid_from_saved)),
    Op("silu", "F.silu", F.silu, lambda x: x * torch.sigmoid(x), unary, ("x",)),
    Op("cross_entropy", "F.cross_entropy", per_batch(F.cross_entropy), per_batch(cross_entropy_steps),
       cross_entropy_inputs, ("logits", ""), None, (PER_NODE, per_batch(cross_entropy_per_node),
                                                    cross_entropy_from_saved)),
)


# ---- the machine ------------------------------------------------------------------------------

# The CPU flags a kernel of torch or of NumPy's BLAS may choose its path by, as /proc/cpuinfo names them.
VECTOR_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16")
MACHINE = "Measured on: "


def machine():
    """One line naming what the verdicts depend on: the CPU and its vector extensions, torch and
    its CPU capability, whether its oneDNN computes in float16 and bfloat16 here, NumPy's BLAS."""
    cpu, flags = platform.processor() or platform.machine(), None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = (part.strip() for part in line.partition(":"))
            if key == "model name":
                cpu = value
            elif key == "flags" and flags is None:
                flags = set(value.split())
    except OSError:
        pass
    vector = "flags unknown" if flags is None else " ".join(f for f in VECTOR_FLAGS if f in flags) or "no AVX2"
    onednn = []
    for name, check in (("float16", "_is_mkldnn_fp16_supported"), ("bfloat16", "_is_mkldnn_bf16_supported")):
        try:                                  # private, as the check torch itself makes before handing over
            onednn.append(f"{name} {'yes' if getattr(torch.ops.mkldnn, check)() else 'no'}")
        except (AttributeError, RuntimeError):
            onednn.append(f"{name} unknown")
    try:
        from threadpoolctl import threadpool_info

        blas = "; ".join(f"{pool['internal_api']} {pool.get('version') or ''} {pool.get('architecture') or ''}".strip()
                         for pool in threadpool_info() if pool["user_api"] == "blas") or "none found"
    except ImportError:
        blas = "unknown (no threadpoolctl)"
    import numpy

    return (f"{MACHINE}{cpu} ({vector}); torch {torch.__version__}, CPU capability "
            f"{torch.backends.cpu.get_cpu_capability()}, oneDNN arithmetic in {', '.join(onednn)}; "
            f"NumPy {numpy.__version__}, BLAS {blas}; one thread")


# ---- measuring -------------------------------------------------------------------------------

def equal_share(a, b):
    """The share of elements of ``a`` and ``b`` that are bit for bit the same value."""
    return (a.float() == b.float()).double().mean().item()


def verdict(once, steps, third=None, label=""):
    """What the kernel computes, from the shares of elements equal to each candidate."""
    candidates = [("float32, rounded once", once), ("each step rounded", steps)]
    if third is not None:
        candidates.append((label, third))
    exact = [name for name, share in candidates if share >= EXACT]
    if len(exact) > 1:
        return "either: " + " / ".join(exact)
    if exact:
        return exact[0]
    name, share = max(candidates, key=lambda candidate: candidate[1])
    return f"{name} (nearly)" if share >= NEAR else "none of these"


def grads_of(out, leaves, dout, wanted):
    floats = [t for t, name in zip(leaves, wanted, strict=True) if name]
    got = iter(torch.autograd.grad(out, floats, dout))
    return [next(got) if name else None for name in wanted]


def leaves(tensors, wanted, dtype):
    """The inputs in ``dtype`` as fresh autograd leaves (integer ids pass through)."""
    return [t.detach().to(dtype).requires_grad_(bool(name)) if t.is_floating_point() else t
            for t, name in zip(tensors, wanted, strict=True)]


def measure_op(op, dtype, small):
    """{tensor name: (share equal to once, to steps, to the third candidate or None)} for the
    output and each gradient."""
    g = torch.Generator().manual_seed(0)
    raw = op.inputs(g, small)
    low = leaves(raw, op.grads, dtype)
    f32, steps_in = leaves(low, op.grads, torch.float32), leaves(low, op.grads, dtype)
    out_low, out_f32, out_steps = op.fn(*low), op.fn(*f32), op.steps(*steps_in)
    label, alt_out, alt_grad = op.alt or ("", None, None)
    plain = [t.detach() for t in low]
    third = equal_share(out_low, alt_out(*plain).to(dtype)) if alt_out else None
    found = {"out": (equal_share(out_low, out_f32.to(dtype)), equal_share(out_low, out_steps), third)}
    dout = normal(g, *out_low.shape).to(dtype)
    g_low = grads_of(out_low, low, dout, op.grads)
    g_f32 = grads_of(out_f32, f32, dout.float(), op.grads)
    if op.steps_grad:
        g_steps = op.steps_grad([t.detach() for t in steps_in], dout)
    else:
        g_steps = grads_of(out_steps, steps_in, dout, op.grads)
    g_alt = alt_grad(plain, out_low.detach(), dout) if alt_grad else [None] * len(op.grads)
    for name, a, once, steps, alt in zip(op.grads, g_low, g_f32, g_steps, g_alt, strict=True):
        if name:
            third = equal_share(a, alt.to(dtype)) if alt is not None else None
            found["d" + name] = (equal_share(a, once.to(dtype)), equal_share(a, steps), third)
    return found


def measure(small=False):
    """[(op, tensor, dtype name, (once, steps, third))], one entry per output, gradient and dtype."""
    table = []
    for op in OPS:
        for name, dtype in LOWP.items():
            table += [(op, tensor, name, shares) for tensor, shares in measure_op(op, dtype, small).items()]
    return table


def format_table(table):
    lines = ["| op | torch | tensor | dtype | = once | = steps | = third | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for op, tensor, dtype, (once, steps, third) in table:
        label = op.alt[0] if op.alt else ""
        shown = "" if third is None else f"{third:.1%}"
        cells = [op.name, f"`{op.torch_call}`", tensor, dtype, f"{once:.1%}", f"{steps:.1%}", shown,
                 verdict(once, steps, third, label)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---- the baseline of the error rule -----------------------------------------------------------

def max_errors(fn, inputs, dtype):
    """(max |torch_lowp - truth|, max |float32 rounded once - truth|, max |truth|) on rounded inputs."""
    low = [t.to(dtype) for t in inputs]
    truth = fn(*[t.double() for t in low])
    torch_err = (fn(*low).double() - truth).abs().max().item()
    once_err = (fn(*[t.float() for t in low]).to(dtype).double() - truth).abs().max().item()
    return torch_err, once_err, truth.abs().max().item()


def baseline(lengths):
    """[(op, dtype name, T, torch error, once error, max |truth|)] for attention (T queries and keys,
    hs 64) and softmax (16 rows of T logits)."""
    found = []
    for T in lengths:
        g = torch.Generator().manual_seed(T)
        qkv = [normal(g, 1, 1, T, 64) for _ in range(3)]
        logits = [normal(g, 16, T, scale=3.0)]
        for name, dtype in LOWP.items():
            found.append(("attention", name, T, *max_errors(F.scaled_dot_product_attention, qkv, dtype)))
            found.append(("softmax", name, T, *max_errors(lambda x: F.softmax(x, -1), logits, dtype)))
    return found


def default_backend(T=256):
    """Which backend F.scaled_dot_product_attention picks on CPU: the names of those whose output
    equals the default's bit for bit, per dtype."""
    g = torch.Generator().manual_seed(T)
    qkv = [normal(g, 1, 2, T, 64) for _ in range(3)]
    picked = {}
    for name, dtype in LOWP.items():
        low = [t.to(dtype) for t in qkv]
        default = F.scaled_dot_product_attention(*low)
        picked[name] = [backend.name for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.MATH)
                        if torch.equal(sdpa(backend)(*low), default)]
    return "F.scaled_dot_product_attention's default on CPU equals, bit for bit: " + "; ".join(
        f"{name}: {', '.join(found) or 'neither backend'}" for name, found in picked.items())


def format_baseline(found):
    lines = ["| op | dtype | T | max \\|torch - truth\\| | max \\|float32 once - truth\\| | ratio |",
             "|---|---|---|---|---|---|"]
    for op, dtype, T, torch_err, once_err, _ in found:
        ratio = torch_err / once_err if once_err else math.inf
        lines.append(f"| {op} | {dtype} | {T} | {torch_err:.3g} | {once_err:.3g} | {ratio:.2f} |")
    return "\n".join(lines)


def draw(found, path):
    """Error against T, one panel per op, torch's and float32-once's line per dtype."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), dpi=90, layout="constrained")
    FigureCanvasAgg(fig)
    for ax, op in zip(fig.subplots(1, 2), ("attention", "softmax"), strict=True):
        for dtype, colour in zip(LOWP, ("tab:blue", "tab:orange"), strict=True):
            mine = [row for row in found if row[0] == op and row[1] == dtype]
            lengths = [row[2] for row in mine]
            ax.plot(lengths, [row[3] for row in mine], "o-", color=colour, label=f"{dtype}: torch")
            ax.plot(lengths, [row[4] for row in mine], "s--", color=colour, label=f"{dtype}: float32, rounded once")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_title(f"{op}: max |error| against float64")
        ax.legend(fontsize=8)
    save_png(fig, path)


def save_png(fig, path):
    """Write ``fig`` to ``path`` through a temporary file in the same folder, renamed over the old
    one: an interruption leaves the old picture whole and no temporary behind."""
    handle, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    os.close(handle)
    try:
        fig.savefig(partial, format="png")
        os.replace(partial, path)
    finally:
        Path(partial).unlink(missing_ok=True)


# ---- attention in float32, float16 and bfloat16: ours beside PyTorch's ---------------------------

def ulp(value, dtype):
    """The spacing of ``dtype`` (a name of EPS) at ``|value|`` (a normal number)."""
    return EPS[dtype] * 2.0 ** math.floor(math.log2(abs(value)))


def to_numpy(t):
    """A torch tensor as a NumPy array of its dtype (bfloat16: ml_dtypes', through the same bits)."""
    import ml_dtypes

    if t.dtype == torch.bfloat16:
        return t.view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def attention_errors(lengths):
    """[(dtype name, T, max |truth|, one ulp there, max |ours - truth|, max |torch - truth|)] for
    one head of size 64, T queries and keys, inputs N(0, 1) rounded to the dtype: ours is
    numpy_attn's attention in that dtype, torch's F.scaled_dot_product_attention in it (its
    default CPU backend), truth the float64 math backend on the same rounded inputs."""
    from numpy_attn.attention import scaled_dot_product_attention_forward

    found = []
    for T in lengths:
        g = torch.Generator().manual_seed(T)
        qkv = [normal(g, 1, 1, T, 64) for _ in range(3)]
        for name, dtype in {"float32": torch.float32, **LOWP}.items():
            low = [t.to(dtype) for t in qkv]
            truth = sdpa(SDPBackend.MATH)(*[t.double() for t in low])
            theirs = F.scaled_dot_product_attention(*low)
            ours, _ = scaled_dot_product_attention_forward(*map(to_numpy, low))
            if ours.dtype.name != name:
                raise TypeError(f"numpy_attn's attention returned {ours.dtype} for {name} inputs")
            top = truth.abs().max().item()
            found.append((name, T, top, ulp(top, name), float(abs(ours.astype("float64") - truth.numpy()).max()),
                          (theirs.double() - truth).abs().max().item()))
    return found


def format_attention(found):
    lines = ["| dtype | T | max \\|truth\\| | one ulp there | max \\|ours - truth\\| | max \\|torch - truth\\| "
             "| ours / torch |", "|---|---|---|---|---|---|---|"]
    for dtype, T, top, one_ulp, ours, theirs in found:
        ratio = ours / theirs if theirs else math.inf
        lines.append(f"| {dtype} | {T} | {top:.3g} | {one_ulp:.3g} | {ours:.3g} | {theirs:.3g} | {ratio:.2f} |")
    return "\n".join(lines)


def draw_attention(found, path):
    """Attention's error against T: left the max |error|, right the same in ulps of max |truth|;
    one colour per dtype, PyTorch's line solid, ours dashed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), dpi=90, layout="constrained")
    FigureCanvasAgg(fig)
    absolute, in_ulps = fig.subplots(1, 2)
    for dtype, colour in zip(EPS, ("tab:green", "tab:blue", "tab:orange"), strict=True):
        mine = [row for row in found if row[0] == dtype]
        lengths = [row[1] for row in mine]
        for ax, scale in ((absolute, [1.0] * len(mine)), (in_ulps, [row[3] for row in mine])):
            ax.plot(lengths, [row[5] / s for row, s in zip(mine, scale, strict=True)], "o-", color=colour,
                    label=f"{dtype}: torch F.sdpa")
            ax.plot(lengths, [row[4] / s for row, s in zip(mine, scale, strict=True)], "s--", color=colour,
                    label=f"{dtype}: numpy_attn")
    for ax, title in ((absolute, "attention output: max |error| against float64"),
                      (in_ulps, "the same, in ulps of max |truth| (of each dtype)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_title(title)
    absolute.legend(fontsize=8)
    save_png(fig, path)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Measure what torch's CPU kernels compute in float32 "
                                     "inside float16 and bfloat16 ops, and draw the error baseline.")
    parser.add_argument("--small", action="store_true", help="small sizes (a quick check, as the test runs)")
    parser.add_argument("--out", type=Path, default=IMAGE, help=f"the PNG to write (default {IMAGE})")
    parser.add_argument("--attention-out", type=Path, default=ATTENTION_IMAGE,
                        help=f"the PNG of attention's error in three dtypes (default {ATTENTION_IMAGE})")
    args = parser.parse_args(argv)
    for option, path in (("--out", args.out), ("--attention-out", args.attention_out)):
        if not path.parent.is_dir():
            parser.error(f"{option} {str(path)!r}: no folder {str(path.parent)!r}")
    torch.set_num_threads(1)
    print(machine() + "\n")
    print(format_table(measure(args.small)))
    found = baseline(SMALL_LENGTHS if args.small else LENGTHS)
    print(f"\n{default_backend()}\n")
    print(format_baseline(found))
    attention = attention_errors(SMALL_LENGTHS if args.small else LENGTHS)
    print("\n" + format_attention(attention))
    for option, path, write, rows in (("--out", args.out, draw, found),
                                      ("--attention-out", args.attention_out, draw_attention, attention)):
        try:
            write(rows, path)
        except OSError as err:
            sys.exit(f"{option} {str(path)!r}: cannot write it: {err.strerror or err}")
        print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
