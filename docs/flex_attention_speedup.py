"""Speedup of FlexAttention's tiled path over its dense path, beside the share of tiles skipped.

Prints the table of docs/flex_attention.md. Run from the repository root:

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python docs/flex_attention_speedup.py [--repeats 5]

Both paths of numpy_attn/flex_attention.py run in this one process on the same inputs (B = 1,
nh = 2, hs = 64, float32, T = S = 4096 by default, blocks of 128), alternating tiled, dense,
tiled, dense ... so that a machine shared with other work slows both alike; the table gives
each path's median time, their ratio, and the load average before and after. Forward, and
forward + backward (the dense path's backward is dense too).
"""

import argparse
import os
import statistics
import time

import numpy as np

from numpy_attn import flex_attention as nf

WINDOW = 256      # as FLEX_WINDOW in benchmarks/registry.py


def document_lengths(T):
    """Packed documents of T // 16 to T // 4 tokens: flex_document_lengths of benchmarks/registry.py
    (copied: this script runs from docs/, where the benchmarks package is not importable)."""
    rng = np.random.default_rng([7, T])
    lengths = []
    while sum(lengths) < T:
        lengths.append(min(int(rng.integers(max(T // 16, 1), max(T // 4, 2))), T - sum(lengths)))
    return lengths


def masks(T):
    return {
        f"sliding_window({WINDOW})": nf.sliding_window(WINDOW),
        "document & causal": nf.and_masks(nf.document(document_lengths(T)), nf.causal),
        "causal": nf.causal,
    }


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    shape = (1, args.heads, args.T, args.head_size)
    q, k, v, dout = (rng.standard_normal(shape, dtype=np.float32) for _ in range(4))
    print(f"T = S = {args.T}, B = 1, nh = {args.heads}, hs = {args.head_size}, float32, blocks of 128, "
          f"{args.repeats} interleaved repeats; load average before {os.getloadavg()}")
    print("| mask | tiles skipped | mode | tiled median (s) | dense median (s) | dense / tiled |")
    print("|---|---:|---|---:|---:|---:|")
    for name, mask_mod in masks(args.T).items():
        block_mask = nf.create_block_mask(mask_mod, None, None, args.T, args.T)
        paths = {"tiled": nf.flex_attention_forward, "dense": nf.dense_flex_attention_forward}
        calls = {}
        for path, forward in paths.items():
            calls[(path, "fwd")] = lambda f=forward, bm=block_mask: f(q, k, v, block_mask=bm)

            def fwd_bwd(f=forward, bm=block_mask):
                _, cache = f(q, k, v, block_mask=bm)
                nf.flex_attention_backward(dout, cache)
            calls[(path, "fwd+bwd")] = fwd_bwd
        out_t = nf.flex_attention_forward(q, k, v, block_mask=block_mask)[0]
        out_d = nf.dense_flex_attention_forward(q, k, v, block_mask=block_mask)[0]
        assert np.allclose(out_t, out_d, rtol=1e-4, atol=1e-5), f"{name}: tiled and dense differ"
        for mode in ("fwd", "fwd+bwd"):
            times = {"tiled": [], "dense": []}
            for _ in range(args.repeats):
                for path in ("tiled", "dense"):
                    times[path].append(timed(calls[(path, mode)]))
            tiled, dense = (statistics.median(times[p]) for p in ("tiled", "dense"))
            print(f"| {name} | {block_mask.fraction_skipped():.1%} | {mode} | {tiled:.3f} | "
                  f"{dense:.3f} | {dense / tiled:.1f} |", flush=True)
    print(f"load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
