"""Peak extra memory of the attention forward against sequence length: reference vs FlashAttention.

"flash" is the tuned numpy_attn/kernels/flash_attention.py (one tile per thread); the readable
numpy_attn/flash_attention.py holds the same O(T) state but works on every head at once, so its
tiles take B * nh times as much.

Regenerates docs/images/flash_attention_memory.png and prints the table of docs/flash_attention.md.
Run from the repository root with matplotlib installed ('.[tests]' has it):

    python docs/flash_attention_memory.py

tracemalloc counts every NumPy allocation made during one forward call (B = 4, nh = 8, hs = 64,
float32, S = T); the output itself is included. The reference is measured up to T = 2048, where
it already needs 1.5 GiB; beyond that its curve is extrapolated as T^2, marked as such.
"""

import tracemalloc
from pathlib import Path

import numpy as np

from numpy_attn.attention import scaled_dot_product_attention_forward
from numpy_attn.kernels.flash_attention import flash_attention_forward

B, NH, HS = 4, 8, 64
LENGTHS = (256, 512, 1024, 2048, 4096)
REFERENCE_MAX_T = 2048
PNG = Path(__file__).parent / "images" / "flash_attention_memory.png"


def peak_mib(forward, T):
    """Peak memory (MiB) allocated during one forward on fresh (B, nh, T, hs) inputs."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, NH, T, HS), dtype=np.float32) for _ in range(3))
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        result = forward(q, k, v)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    del result
    return peak / 2**20


def main():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    flash = [peak_mib(flash_attention_forward, T) for T in LENGTHS]
    measured = [T for T in LENGTHS if T <= REFERENCE_MAX_T]
    reference = [peak_mib(scaled_dot_product_attention_forward, T) for T in measured]
    last = reference[-1]
    extrapolated = [last * (T / measured[-1]) ** 2 for T in LENGTHS if T > REFERENCE_MAX_T]

    print("| T | reference (MiB) | flash (MiB) |\n|---:|---:|---:|")
    for i, T in enumerate(LENGTHS):
        if T <= REFERENCE_MAX_T:
            ref = f"{reference[i]:.0f}"
        else:
            ref = f"~{extrapolated[i - len(measured)]:.0f} (T^2, not run)"
        print(f"| {T} | {ref} | {flash[i]:.1f} |")

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.loglog(measured, reference, "o-", label="reference (scores and weights, T x S)")
    ax.loglog([measured[-1], *LENGTHS[len(measured):]], [last, *extrapolated], "o:", color="C0",
              label="reference, extrapolated as T^2")
    ax.loglog(LENGTHS, flash, "s-", label="flash (output, lse and per-thread tiles)")
    ax.set_xticks(LENGTHS, labels=[str(T) for T in LENGTHS])
    ax.minorticks_off()
    ax.set_xlabel("sequence length T (= S)")
    ax.set_ylabel("peak extra memory of the forward (MiB)")
    ax.set_title(f"float32, B={B}, nh={NH}, hs={HS} (tracemalloc)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    PNG.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(PNG, dpi=100)
    print(f"wrote {PNG}")


if __name__ == "__main__":
    main()
