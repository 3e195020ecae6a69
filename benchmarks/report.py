"""Presenting a run: the machine, the aligned table, JSON, CSV, Markdown, the plot.

Everything here works from the results dict that ``cli.py`` assembles (and that ``--json``
saves), so ``--from-json`` can re-render a saved run without measuring again. Each file is
written whole or not at all, by the checkpoint's ``replace_file`` (attn_cli/checkpoint.py): the
user's old file stays until the new one is complete on disk.
"""

import csv
import io
import json
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path

from attn_cli.checkpoint import replace_file, signals_held
from attn_cli.term import Progress

IMPL_ORDER = {"numpy": 0, "twin": 1, "builtin": 2}

def progress_bar(total, no_progress):
    """The progress bar of a run: on stderr, only where stderr is a terminal (and not
    --no-progress). A log or a pipe gets none: a line per step there buried the warnings and the
    files written among hundreds of lines."""
    return Progress(total, enabled=not no_progress and sys.stderr.isatty())


def _blas(env):
    """'openblas 0.3.31 SkylakeX, num_threads=2 (pthreads)' for each BLAS pool a worker saw."""
    return "; ".join(
        f"{p['internal_api']} {p.get('version') or ''} {p.get('architecture') or ''}, "
        f"num_threads={p['num_threads']} ({p.get('threading_layer', p['user_api'])})".replace("  ", " ")
        for p in env.get("threadpools", []) if p["user_api"] == "blas")


def _vector_extensions(m):
    """'sse4_2 avx avx2 fma f16c (no AVX-512)' from machine()'s flags; 'unknown' without them."""
    flags = m.get("vector_extensions")
    if flags is None:
        return "unknown (no /proc/cpuinfo)"
    return " ".join(flags) + ("" if "avx512f" in flags else " (no AVX-512)")


def machine_lines(results):
    """The machine, its vector extensions, the versions, and each timing worker's CPUs, BLAS
    kernel and thread pools (also the decode runs' header, benchmarks/decode_cache.py)."""
    m = results["machine"]
    lines = [
        f"machine: {m['cpu']}, {m['physical_cores']} cores / {m['logical_cpus']} logical CPUs "
        f"({m['usable_cpus']} usable), {m['memory_gib']} GiB, {m['os']}"
        + (f"; load average {load['before']} before the run, "
           + (f"{min(load['during'])}-{max(load['during'])} during it, " if load.get("during") else "")
           + f"{load['after']} after" if (load := results.get("load_average")) else ""),
        "vector extensions: " + _vector_extensions(m),
        f"python {results['versions']['python']}, numpy {results['versions']['numpy']}, "
        f"torch {results['versions']['torch']}"
        + (f"; numpy-attn at {results['git']['commit'][:10]}"
           + (" with uncommitted changes" if results["git"]["dirty"] else "")
           if results.get("git") else ""),
    ]
    if (results.get("load_average") or {}).get("warning"):
        lines.append(f"warning: {results['load_average']['warning']}")
    for env in results["workers"]:
        where = f"{env['library']} {env['device']}" + (f" @{env['revision']}" if env.get("revision") else "")
        if env.get("cpus") is not None:
            where += f" (CPUs {','.join(map(str, env['cpus']))})"
        if env["library"] == "numpy":
            lines.append(f"{where}: BLAS {_blas(env)}"
                         + (f"; NumPy SIMD {' '.join(env['numpy_simd'])}" if env.get("numpy_simd") else ""))
        else:
            lines.append(f"{where}: torch.get_num_threads() = {env['torch_threads']}, "
                         f"CPU capability {env['torch_cpu_capability']}"
                         + (f", GPU {env['gpu']} (CUDA {env['cuda']}, TF32 matmul "
                            f"{env['tf32_matmul']})" if env["device"] == "cuda" else ""))
    return lines


def header_lines(results):
    """The lines above the table: machine, libraries, thread pools, sizes, conventions."""
    cfg = results["config"]
    lines = machine_lines(results)
    if results.get("environment"):
        lines.append("thread/BLAS environment variables set by the user: "
                     + ", ".join(f"{k}={v}" for k, v in results["environment"].items()))
    lines += peak_lines(results["peaks"])
    lines += [
        f"threads: {cfg['threads']} per timed process; sizes B={cfg['batch']} nh={cfg['heads']} "
        f"hs={cfg['head_size']} T=S in {cfg['seq_lens']}, {cfg['dtype']}; "
        + (f"interleaved: {cfg['interleave']} rounds, each worker one sample per row in turn, "
         f"after {cfg['warmup']} warm-up call(s)" if cfg.get("interleave") else
         f"at least {cfg['repeats']} samples and {cfg['min_time']} s per row after {cfg['warmup']} warm-up call(s)"),
        "time: median per call, IQR = quartiles of the samples; FLOPs: " + results["flops_convention"],
        *_low_precision_lines(cfg["dtype"]),
        "np/this: NumPy's median time / this row's, the one ratio used here (above 1: this row "
        "is faster than NumPy; below 1: NumPy is faster); "
        "parity: max relative error against NumPy at this size; mem: peak extra bytes "
        "(NumPy: tracemalloc, CUDA: max_memory_allocated, torch CPU: not measured)",
    ]
    return lines


def _fastest(peak):
    """GFLOP/s of a peak record's fastest matmul. Runs since 2026-12 time every matmul shape of
    their sizes and keep the fastest, by its fastest sample; older ones timed one square matmul and
    kept its median, so their rate is re-derived from that matmul's fastest sample."""
    if "shapes" in peak:
        return peak["gflops"]
    t = peak.get("time_s") or {}
    return 2 * peak["n"] ** 3 / t["min"] / 1e9 if t.get("min") else peak["gflops"]


def _shape_text(shape):
    """'2048x64 @ 64x2048 (x4)' for the matmul (batch, m, k, n)."""
    batch, m, k, n = shape
    return f"{m}x{k} @ {k}x{n}" + (f" (x{batch})" if batch > 1 else "")


def ceiling(peaks, library, device):
    """The peak record a row of ``library`` on ``device`` is measured against: the fastest matmul
    that any library ran on that device in the dtype ``library`` computes in. The machine's, not
    the library's: on one CPU OpenBLAS and torch's kernels reach different rates, and a row of one
    may pass the other's. None where that library's peak was not measured."""
    own = next((p for p in peaks if (p["library"], p["device"]) == (library, device)), None)
    if own is None:
        return None
    return max((p for p in peaks if (p["device"], p["dtype"]) == (device, own["dtype"])), key=_fastest)


def peak_share(r, peaks):
    """A timed row's GFLOP/s over its ceiling's (a fraction; above 1 the ceiling is wrong), or None."""
    top = ceiling(peaks, "numpy" if r["impl"] == "numpy" else "torch", r["device"])
    return r["gflops"] / _fastest(top) if top and r.get("gflops") else None


def peak_lines(peaks):
    """Each library's matmul peak, then the ceiling that each (device, dtype)'s % peak divides by."""
    lines = []
    for p in peaks:
        if "shapes" in p:
            lines.append(f"matmul peak {p['library']} {p['device']}: {p['gflops']:.1f} GFLOP/s, the fastest of "
                         f"{len(p['shapes'])} matmul shapes of this run's sizes ({_shape_text(p['shape'])} "
                         f"{p['dtype']}, its fastest sample)")
        else:
            lines.append(f"matmul peak {p['library']} {p['device']}: {p['gflops']:.1f} GFLOP/s ({p['n']}x{p['n']} "
                         f"{p['dtype']}, median; {_fastest(p):.1f} in its fastest sample)")
    tops = {(p["device"], p["dtype"]): max((q for q in peaks if (q["device"], q["dtype"]) == (p["device"], p["dtype"])),
                                           key=_fastest) for p in peaks}
    if tops:
        lines.append("% peak: a row's GFLOP/s (of its median time) over the fastest matmul measured on its device in "
                     "the dtype it computes in, whichever library ran it: " + "; ".join(
                         f"{device} {dtype} {_fastest(p):.1f} GFLOP/s ({p['library']})"
                         for (device, dtype), p in tops.items()))
    return lines


def _low_precision_lines(dtype):
    """What a float16 or bfloat16 row times, for each library (nothing for float32, float64)."""
    if dtype not in ("float16", "bfloat16"):
        return []
    return [f"{dtype}: numpy_attn casts its inputs to float32, computes in float32 and rounds the "
            f"result once to {dtype} (NumPy has no BLAS for {dtype}: a float16 matmul is a generic "
            "loop, ml_dtypes' bfloat16 one returns float32), so its rows time float32 arithmetic "
            "plus the casts, and its peak is the float32 matmul's; torch runs its CPU kernels on "
            f"{dtype} tensors (float32 inside most of them, docs/precision.md), its peak is its {dtype} matmul's"]


def _num(x, digits=3):
    """``digits`` significant digits without scientific notation; '-' for None."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if x == 0:
        return "0"
    return f"{x:.{max(0, digits - 1 - math.floor(math.log10(abs(x))))}f}"


COLUMNS = [  # (title, value of a row as text)
    ("op", lambda r: r["op"]),
    ("mode", lambda r: r["mode"]),
    ("T", lambda r: str(r["T"])),
    ("impl", lambda r: impl_label(r)),
    ("device", lambda r: r["device"]),
    ("median ms", lambda r: _num(r["time_s"]["median"] * 1e3)),
    ("IQR ms", lambda r: f"{_num(r['time_s']['q25'] * 1e3)}-{_num(r['time_s']['q75'] * 1e3)}"),
    ("GFLOP/s", lambda r: _num(r["gflops"])),
    ("% peak", lambda r: "-" if not r["share"] else "over" if r["share"] > 1 else _num(100 * r["share"], 2)),
    ("mem MiB", lambda r: _num(r["peak_mem_bytes"] / 2**20) if r["peak_mem_bytes"] is not None else "n/a"),
    ("np/this", lambda r: _num(r["numpy_over_this"])),
    ("parity", lambda r: "ref" if impl_label(r) == "numpy" else
     f"{r['parity']['max_rel_err']:.0e}" if r.get("parity") else "-"),
]


def impl_label(r):
    """'numpy', 'twin', 'builtin', or 'numpy@REV' for a row of numpy_attn at git revision REV."""
    return r["impl"] + (f"@{r['revision']}" if r.get("revision") else "")


def _ratio(r):
    """np/this, with the paired median and quartiles when the run was interleaved."""
    paired = r.get("numpy_over_this_paired")
    if not paired:
        return _num(r["numpy_over_this"])
    return f"{_num(paired['median'])} ({_num(paired['q25'])}-{_num(paired['q75'])})"


def timed_rows(results):
    """The measured rows, sorted for reading: op, mode, T, then numpy, twin, built-in."""
    peaks = results.get("peaks", [])
    rows = [dict(r, share=peak_share(r, peaks)) for r in results["rows"] if r["status"] == "ok"]
    ops = list(dict.fromkeys(r["op"] for r in results["rows"]))
    return sorted(rows, key=lambda r: (ops.index(r["op"]), r["mode"], r["T"],
                                       IMPL_ORDER[r["impl"]], r.get("revision") or "", r["device"]))


def layout(titles, rows, markdown, left):
    """Rows of text as a Markdown table, or aligned columns (the first ``left`` flush left)."""
    if markdown:
        return ["| " + " | ".join(row) + " |" for row in [titles, ["---"] * len(titles), *rows]]
    widths = [max(len(x) for x in col) for col in zip(titles, *rows, strict=True)]
    return ["  ".join(x.ljust(w) if i < left else x.rjust(w)
                      for i, (x, w) in enumerate(zip(row, widths, strict=True))).rstrip()
            for row in [titles, *rows]]


def table_lines(results, markdown=False):
    """The table of rows, the table of ratios, then one line per reason something did not run."""
    timed = timed_rows(results)
    rows = [[text(r) for _, text in COLUMNS] for r in timed]
    lines = layout([title for title, _ in COLUMNS], rows, markdown, left=5)
    over = [r for r in timed if r["share"] and r["share"] > 1]
    if over:   # a share above 100% is never printed: it is the ceiling that is wrong
        which = ", ".join(f"{r['op']} {r['mode']} T={r['T']} {impl_label(r)}" for r in over)
        lines += ["", f"% peak 'over': {len(over)} row(s) ran faster than the matmul peak of their device "
                  f"and dtype ({which}), "
                  "so that peak is wrong (too low: measured while the machine was busy, or on shapes slower "
                  "than the op's) and no share of it is printed"]
    ratios = ratio_rows(results)
    if ratios:
        titles, ratios = ratios
        paired = any(r.get("numpy_over_this_paired") for r in results["rows"])
        lines += ["", "np/this by T: NumPy's time over the row's (above 1: the row is faster than NumPy; below 1: "
                  "slower)" + (", paired: the median over rounds of the ratio within a round (quartiles)"
                               if paired else "") + ":", ""]
        lines += layout(titles, ratios, markdown, left=3)
    speedups = causal_speedup_lines(results)
    lines += [""] * bool(speedups) + speedups
    return lines + [""] * bool(unavailable_lines(results)) + unavailable_lines(results)


def faster_or_slower(ratio):
    """'2.00x faster' for a time ratio (the other's time over this one's) of 2, '3.00x slower' for 1/3."""
    return f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"


def causal_speedup_lines(results):
    """'causal speed-up: ...' lines, one per implementation, mode and T that ran an op both plain
    and causal (OP and OP_causal): how much faster (or slower) the causal run was, from its time
    without the mask over its time with it, of the medians and, interleaved, paired within rounds."""
    rows = {(r["op"], r["mode"], r["T"], impl_label(r), r["device"]): r for r in timed_rows(results)}
    lines = []
    for (op, mode, T, impl, device), plain in rows.items():
        causal = rows.get((f"{op}_causal", mode, T, impl, device))
        if causal is None:
            continue
        a, b = plain["time_s"], causal["time_s"]
        ratio = a["median"] / b["median"]
        text = (f"causal speed-up: {op} {mode} T={T} {impl} {device}: causal {faster_or_slower(ratio)} than "
                f"without the mask (time without / with {ratio:.2f}, above 1: causal faster")
        if "rounds" in a and "rounds" in b:
            text += f"; paired {_paired_text(paired_ratios(a['rounds'], b['rounds']))}"
        text += ")"
        lines.append(text)
    return lines


def ratio_rows(results):
    """(titles, rows): per op, mode and torch implementation, NumPy time / its time at each T."""
    rows = [r for r in timed_rows(results) if impl_label(r) != "numpy" and r["numpy_over_this"]]
    seq_lens = sorted({r["T"] for r in rows})
    table = {}
    for r in rows:
        table.setdefault((r["op"], r["mode"], f"{impl_label(r)} {r['device']}"), {})[r["T"]] = r
    if not table:
        return None
    return (["op", "mode", "vs", *[f"T={T}" for T in seq_lens]],
            [[*key, *[_ratio(by_T[T]) if T in by_T else "-" for T in seq_lens]]
             for key, by_T in table.items()])


def unavailable_lines(results):
    """'not available: <reason>: twin cuda (every op); ...', one line per distinct reason."""
    every = set(results["config"]["ops"])
    by_reason = {}
    for r in results["rows"]:
        if r["status"] != "ok":
            target = f"{r['impl']} {r['device']}"
            by_reason.setdefault(r["reason"], {}).setdefault(target, []).append(r["op"])
    return [f"not available: {reason}: " + "; ".join(
                f"{target} ({'every op' if set(ops) == every else ', '.join(ops)})"
                for target, ops in targets.items())
            for reason, targets in by_reason.items()]


def missing_machine_facts(results):
    """What ``results`` lacks of the description of the machine it ran on, which every figure in
    it depends on: the CPU, its vector extensions, the BLAS kernel, the thread count and the load
    average ([] when complete). Vector extensions may come from /proc/cpuinfo's flags or from the
    SIMD targets NumPy or torch chose, where the machine had no /proc/cpuinfo."""
    if is_breakdown(results):          # python -m benchmarks.flash_breakdown: 1 and 2 threads, its own keys
        facts = {"BLAS kernel": any(b.get("architecture") for b in results.get("blas") or []),
                 "load": bool(results.get("load"))}
    elif is_former_flash_kernel(results):
        env = results.get("environment") or {}
        m = env.get("machine") or {}
        facts = {"CPU": m.get("cpu"), "vector extensions": m.get("vector_extensions") or env.get("numpy_simd"),
                 "BLAS kernel": any(b.get("architecture") for b in env.get("blas") or []),
                 "thread count": env.get("threads"), "load": results.get("load_average")}
    else:
        m, workers = results.get("machine") or {}, results.get("workers") or []
        facts = {"CPU": m.get("cpu"),
                 "vector extensions": m.get("vector_extensions") or any(
                     w.get("numpy_simd") or w.get("torch_cpu_capability") for w in workers),
                 "BLAS kernel": any(p.get("user_api") == "blas" and p.get("architecture")
                                    for w in workers for p in w.get("threadpools") or []),
                 "thread count": (results.get("config") or {}).get("threads"),
                 "load": (results.get("load_average") or {}).get("before") is not None}
    return [name for name, value in facts.items() if not value]


def is_decode(results):
    """Whether ``results`` is a ``--ops decode`` run (tokens per second, no op rows)."""
    return "model" in results.get("config", {})


def is_former_flash_kernel(results):
    """Whether ``results`` was saved by the former ``python -m benchmarks.flash_kernel`` (an
    interleaved kernel-against-F.sdpa run, now ``--interleave``), as in benchmarks/results."""
    return "derived" in results and "environment" in results


def paired_ratios(a, b):
    """Median and quartiles of a[r] / b[r] over rounds r: the two were timed back to back, so a
    change in the machine's speed between rounds cancels in each ratio."""
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    q25, median, q75 = (statistics.quantiles(ratios, n=4, method="inclusive")
                        if len(ratios) > 1 else ratios * 3)
    return dict(median=median, q25=q25, q75=q75)


def _paired_text(ratios):
    return f"{ratios['median']:.3f}, IQR {ratios['q25']:.3f}-{ratios['q75']:.3f}"


def former_flash_kernel_lines(res):
    """The report that tool printed: medians and ratios per case, of the medians and paired."""
    m, env = res["environment"]["machine"], res["environment"]
    blas = "; ".join(f"{b['api']} {b['version']} {b['architecture']}" for b in env["blas"])
    lines = [f"machine: {m['cpu']}, vector extensions: {' '.join(m['vector_extensions'] or ['unknown'])}; "
             f"BLAS {blas}; NumPy SIMD {' '.join(env['numpy_simd'] or ['unknown'])}",
             f"threads {env['threads']}, float32, {res['size']}; load average "
             + " ".join(f"{x:.2f}" for x in res["load_average"]) + f"; {res['duration_s']} s"]
    for r in res["rows"]:
        medians = "  ".join(f"{i} {1e3 * t:.0f} ms" for i, t in r["median_s"].items())
        old = (f"  new/old {r['new_over_old']:.3f} (paired {_paired_text(r['new_over_old_paired'])})"
               if "new_over_old" in r else "")
        memory = ("  peak " + ", ".join(f"{i} {v:.0f} MiB" for i, v in r["kernel_peak_mib"].items())
                  if "kernel_peak_mib" in r else "")
        lines.append(f"{r['case']:>11} T={r['T']:<5} n={r['samples']}  {medians}  kernel/sdpa "
                     f"{r['kernel_over_sdpa']:.3f} (paired {_paired_text(r['kernel_over_sdpa_paired'])}){old}{memory}")
    d = res["derived"]
    return lines + [f"causal forward speed-up over non-causal: causal {faster_or_slower(d['causal_speedup'])} "
                    f"(non-causal time / causal {d['causal_speedup']:.2f}; paired "
                    f"{_paired_text(d['causal_speedup_paired'])})",
                    "ratios: of the medians; paired: the median over rounds of the ratio within a round, "
                    "with its quartiles, which holds when the machine's speed drifts between rounds; "
                    "kernel/sdpa and new/old are times over times (above 1: the kernel, or the new one, is slower)"]


def is_op_run(results):
    """Whether ``results`` holds rows of ops (the sweep), which CSV and plots are made of."""
    return "workers" in results and not is_decode(results)


def is_breakdown(results):
    """Whether ``results`` is a ``python -m benchmarks.flash_breakdown --json`` run."""
    return "instrumented" in results and "roofline" in results


def write_markdown(results, path, report_lines=None):
    """Header lines as a list, then the tables; a run of another kind (decode, breakdown): its
    ``report_lines`` (cli.render's) as a code block."""
    if not is_op_run(results):
        lines = ["```", *report_lines, "```"]
    else:
        lines = ([f"- {line}" for line in header_lines(results)] + [""]
                 + table_lines(results, markdown=True))
    replace_file(path, ("\n".join(lines) + "\n").encode())


def _within_peak(share):
    """``share`` where it is one (at most 1), else None: a row past its peak has no share of it."""
    return share if share is not None and share <= 1 else None


def write_json(results, path):
    """``results`` as JSON at ``path``; ValueError, before writing, where it does not name its
    machine (``missing_machine_facts``): --from-json would refuse the file."""
    missing = missing_machine_facts(results)
    if missing:
        raise ValueError(f"the results do not name their machine's {', '.join(missing)}: {path} not written")
    replace_file(path, (json.dumps(results, indent=1) + "\n").encode())


def write_csv(results, path):
    """One line per row, every row (not-available ones too) with its reason."""
    fields = ["op", "mode", "T", "S", "B", "nh", "hs", "dtype", "impl", "revision", "device", "status",
              "reason", "median_s", "q25_s", "q75_s", "min_s", "max_s", "samples", "flops",
              "gflops", "peak_fraction", "peak_mem_bytes", "numpy_over_this", "numpy_over_this_paired",
              "parity_max_rel_err"]
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fields, extrasaction="ignore")
    writer.writeheader()
    for r in results["rows"]:
        t = r.get("time_s") or {}
        writer.writerow({**r, **{f"{k}_s": v for k, v in t.items() if k != "rounds"},
                         "samples": t.get("samples"),
                         "numpy_over_this_paired": (r.get("numpy_over_this_paired") or {}).get("median"),
                         "peak_fraction": (_within_peak(peak_share(r, results["peaks"]))
                                           if r["status"] == "ok" else None),
                         "parity_max_rel_err": (r.get("parity") or {}).get("max_rel_err")})
    replace_file(path, text.getvalue().encode())


def write_plot(results, path, together=False):
    """Time against T (log-log) and % of matmul peak against T, one row of panels per op; or
    (``together``) every op's time on one panel, the decode steps' on a second (_plot_together)."""
    import matplotlib

    matplotlib.use("Agg")                          # headless: no display needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    rows = timed_rows(results)
    ops = list(dict.fromkeys(r["op"] for r in rows))
    if not ops:
        raise ValueError("nothing was measured, so there is nothing to plot")
    cfg, m = results["config"], results["machine"]
    title = (f"{m['cpu']}, {cfg['threads']} threads, {cfg['dtype']}, "
             f"B={cfg['batch']} nh={cfg['heads']} hs={cfg['head_size']}")
    if together:
        fig = _plot_together(results, lambda panels: (8 * panels, 6.6))
        _save_figure(fig, title, path)
        return
    fig, axes = plt.subplots(len(ops), 2, figsize=(12, 4 * len(ops) + 0.6), squeeze=False,
                             layout="constrained")     # keeps the suptitle clear of the panels
    seq_lens = sorted({r["T"] for r in rows})
    order = {impl_label(r): (IMPL_ORDER[r["impl"]], r.get("revision") or "") for r in rows}
    lines = sorted({(impl_label(r), r["device"]) for r in rows}, key=lambda k: (order[k[0]], k[1]))
    colors = {line: f"C{i}" for i, line in enumerate(lines)}
    for (ax_time, ax_peak), op in zip(axes, ops, strict=True):
        for (impl, device) in lines:
            for mode, style in (("fwd+bwd", "-"), ("fwd", "--")):
                pts = [r for r in rows if (r["op"], impl_label(r), r["device"], r["mode"])
                       == (op, impl, device, mode)]
                if not pts:
                    continue
                kw = dict(color=colors[impl, device], linestyle=style, marker="o",
                          label=f"{impl} {device} {mode}")
                T = [r["T"] for r in pts]
                ax_time.plot(T, [r["time_s"]["median"] * 1e3 for r in pts], **kw)
                ax_peak.plot(T, [100 * _within_peak(r["share"]) if _within_peak(r["share"]) else math.nan
                                 for r in pts], **kw)
        ax_time.set(xscale="log", yscale="log", xlabel="sequence length T (= S)",
                    ylabel="median time per call (ms)", title=f"{op}: time")
        ax_peak.set(xscale="log", xlabel="sequence length T (= S)",
                    ylabel="% of the device's fastest matmul", title=f"{op}: share of matmul peak")
        for ax in (ax_time, ax_peak):
            ax.grid(True, which="both", alpha=0.3)
            ax.set_xticks(seq_lens, [str(T) for T in seq_lens])   # the measured T, not 10^k
            ax.xaxis.set_minor_locator(NullLocator())
        ax_time.legend(fontsize=8)
    _save_figure(fig, title, path)


def _save_figure(fig, title, path):
    """``fig`` under ``title`` as a PNG at ``path``, written whole or not at all."""
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=13)
    png = io.BytesIO()
    fig.savefig(png, dpi=110, format="png")
    plt.close(fig)
    replace_file(path, png.getvalue())


def time_lines(results):
    """The lines of --plot-together: {panel's x label: {(op, implementation, device, mode): [(T, median
    seconds)]}}, every op's rows on one panel, the decode steps (one token over S held) on a second."""
    from benchmarks import registry

    panels = {}
    for r in timed_rows(results):
        op = registry.OPS.get(r["op"])
        axis = "tokens held S (one decode step)" if op and op.decode_step else "sequence length T (= S)"
        key = (r["op"], impl_label(r), r["device"], r["mode"])
        panels.setdefault(axis, {}).setdefault(key, []).append((r["T"], r["time_s"]["median"]))
    return panels


def crossings(a, b):
    """Where the line ``b`` crosses ``a`` (each [(T, seconds)]), on the T both were measured at:
    [(T, seconds)] of each crossing, interpolated straight on the log-log plot."""
    b = dict(b)
    shared = [(T, y, b[T]) for T, y in a if T in b]
    points = []
    for (T0, a0, b0), (T1, a1, b1) in zip(shared, shared[1:], strict=False):
        d0, d1 = math.log(a0 / b0), math.log(a1 / b1)
        if d0 * d1 < 0 or d1 == 0:
            w = d0 / (d0 - d1)                     # where the log ratio reaches 0 along log T
            points.append((math.exp(math.log(T0) + w * math.log(T1 / T0)),
                           math.exp(math.log(a0) + w * math.log(a1 / a0))))
    return points


def _plot_together(results, fig_size):
    """One panel of time against T (log-log) per axis of time_lines, every op on it, each crossing
    of two ops' lines in one mode marked."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    panels = time_lines(results)
    fig, axes = plt.subplots(1, len(panels), figsize=fig_size(len(panels)), squeeze=False, layout="constrained")
    for ax, (axis, lines) in zip(axes[0], panels.items(), strict=True):
        styles = {key[:3]: f"C{i}" for i, key in enumerate(dict.fromkeys(key[:3] for key in lines))}
        for key, pts in lines.items():
            op, impl, device, mode = key
            name = results.get("ops", {}).get(op, {}).get("builtin") if impl == "builtin" else None
            ax.plot(*zip(*[(T, t * 1e3) for T, t in pts], strict=True), marker="o", color=styles[key[:3]],
                    linestyle="-" if mode == "fwd+bwd" else "--", label=f"{op} {name or impl} {device} {mode}")
        for (key, a), (other, b) in ((x, y) for x in lines.items() for y in lines.items()):
            if key[0] < other[0] and key[3] == other[3]:            # two ops, one mode
                for T, t in crossings(a, b):
                    ax.plot([T], [t * 1e3], marker="x", color="black", markersize=9, linestyle="none")
        seq_lens = sorted({T for pts in lines.values() for T, _ in pts})
        ax.set(xscale="log", yscale="log", xlabel=axis, ylabel="median time per call (ms)",
               title=f"time against {axis} (x: two ops' lines cross)")
        ax.grid(True, which="both", alpha=0.3)
        ax.set_xticks(seq_lens, [str(T) for T in seq_lens])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.legend(fontsize=7)
    return fig


def _same_file(a, b):
    """Whether the paths ``a`` and ``b`` name one file (through links, ``..``, or hard links)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:                                # one of them does not exist yet
        return False


def check_outputs(parser, args):
    """Fail now, not after a long run, when an output cannot be written: two outputs to one file
    (the second would replace the first), an output over the --from-json file it reads, a folder,
    a file that exists without --force, a folder where no file can be created."""
    outputs = [(option, path) for option, path in ((f"--{name}", getattr(args, name, None))
                                                   for name in ("json", "csv", "markdown", "plot")) if path]
    for k, (option, path) in enumerate(outputs):
        for other, other_path in outputs[:k]:
            if _same_file(path, other_path):
                parser.error(f"{other} {other_path} and {option} {path} are one file: the second would "
                             "replace the first; give each output its own file")
        if getattr(args, "from_json", None) and _same_file(path, args.from_json):
            parser.error(f"{option} {path} is the file --from-json reads: writing it would replace the "
                         "saved run; give the output another file")
    for path in (Path(path) for _, path in outputs):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            parser.error(f"cannot create the folder of {path}: {err}")
        if path.is_dir():
            parser.error(f"cannot write {path}: it is a folder")
        if path.exists() and not args.force:
            parser.error(f"{path} exists; pass --force to overwrite it")
        try:   # os.access says yes to root everywhere, /proc included: try a file of our own there
            with signals_held():               # a signal now would leave the probe behind
                fd, probe = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".probe")
                try:
                    os.close(fd)
                finally:
                    os.unlink(probe)
        except OSError as err:
            parser.error(f"cannot write {path}: {err.strerror or err}")
