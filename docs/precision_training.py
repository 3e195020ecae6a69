"""The mini GPT trained in float32 and in bfloat16 mixed precision, ours beside torch's.

Runs ``numpy-attn train --compare-torch`` with its defaults (500 steps on the pydoc topics, seed 0)
once per dtype, into a temporary folder, reads the per-step losses and the held-out losses from
what it prints, and draws docs/images/precision_training.png: the training loss of each step
(averaged over 20 steps, as one batch's loss jumps) and the held-out points, NumPy and torch, per
dtype. In bfloat16 NumPy runs every operation in bfloat16 (float32 inside, rounded once) on a
bfloat16 cast of float32 master weights; torch runs its own CPU autocast. Prints the final losses
side by side.

    python docs/precision_training.py [--dtypes float32 bfloat16] [--steps N] [--out PATH]
"""

import argparse
import contextlib
import io
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

IMAGE = Path(__file__).resolve().parent / "images" / "precision_training.png"
STEP = re.compile(r"^step +(\d+)  loss ([\d.]+)(?:  \(skipped[^)]*\))?  torch ([\d.]+)", re.M)
HELD_OUT = re.compile(r"^step +(\d+)  held-out loss ([\d.]+)  torch ([\d.]+)", re.M)
SMOOTH = 20


def train(dtype, steps, folder):
    """{"steps": [(n, ours, torch's)], "held_out": [(n, ours, torch's)], "stdout": text} of one run."""
    from attn_cli import cli

    out = io.StringIO()
    argv = ["train", "--dtype", dtype, "--compare-torch", "--out", str(Path(folder) / dtype)]
    if steps is not None:
        argv += ["--steps", str(steps)]
    with contextlib.redirect_stdout(out):
        status = cli.main(argv)
    text = out.getvalue()
    if status != 0:
        raise SystemExit(f"numpy-attn train --dtype {dtype} failed:\n{text}")
    parse = lambda pattern: [(int(n), float(a), float(b)) for n, a, b in pattern.findall(text)]   # noqa: E731
    return {"steps": parse(STEP), "held_out": parse(HELD_OUT), "stdout": text}


def smooth(values, window=SMOOTH):
    """The running mean over ``window`` steps (shorter at the start)."""
    values = np.asarray(values, dtype=np.float64)
    sums = np.cumsum(np.concatenate([[0.0], values]))
    lo = np.maximum(np.arange(1, len(values) + 1) - window, 0)
    return (sums[1:] - sums[lo]) / (np.arange(1, len(values) + 1) - lo)


def draw(runs, path):
    """The figure: one panel per dtype, the smoothed training loss and the held-out points."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5 * len(runs), 4), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(runs), sharey=True, squeeze=False)[0]
    for ax, (dtype, run) in zip(axes, runs.items(), strict=True):
        n, ours, theirs = (np.array(column) for column in zip(*run["steps"], strict=True))
        ax.plot(n, smooth(ours), color="C0", label=f"NumPy, training (mean of {SMOOTH} steps)")
        ax.plot(n, smooth(theirs), color="C1", linestyle="--", label=f"torch, training (mean of {SMOOTH} steps)")
        h, h_ours, h_theirs = (np.array(column) for column in zip(*run["held_out"], strict=True))
        ax.plot(h, h_ours, "o-", color="C0", markersize=4, label=f"NumPy, held-out ({h_ours[-1]:.4f} at the end)")
        ax.plot(h, h_theirs, "s--", color="C1", markersize=4, label=f"torch, held-out ({h_theirs[-1]:.4f} at the end)")
        how = "" if dtype in ("float32", "float64") else " (mixed precision; torch: autocast)"
        ax.set_title(f"{dtype}{how}", fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("cross-entropy loss")
    fig.suptitle("numpy-attn train --compare-torch (defaults: mini GPT, pydoc topics, seed 0)", fontsize=11)
    fig.savefig(path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"],
                        choices=["float32", "float64", "bfloat16", "float16"])
    parser.add_argument("--steps", type=int, default=None, help="steps of each run (default: train's 500)")
    parser.add_argument("--out", type=Path, default=IMAGE, help=f"the PNG to write (default {IMAGE})")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        runs = {dtype: train(dtype, args.steps, folder) for dtype in args.dtypes}
    draw(runs, args.out)
    print(f"{'dtype':<10} {'train, last 20 (NumPy / torch)':>32} {'held-out at the end (NumPy / torch)':>38}")
    for dtype, run in runs.items():
        _, ours, theirs = zip(*run["steps"][-SMOOTH:], strict=True)
        _, h_ours, h_theirs = run["held_out"][-1]
        print(f"{dtype:<10} {np.mean(ours):>15.4f} / {np.mean(theirs):<14.4f} {h_ours:>19.4f} / {h_theirs:<16.4f}")
        lines = run["stdout"].splitlines()
        last_step = max(i for i, line in enumerate(lines) if line.startswith("step "))
        for line in lines[last_step + 1:]:              # train's summary, before the files it wrote
            if not line.startswith("wrote "):
                print(f"    {line}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
