"""``python -m benchmarks.bandwidth``: the memory bandwidth a matrix-vector product reaches here,
the floor of a decoding step at batch 1, which reads every weight once a token.

x (1, n) @ W (n, n) in float32, W larger than the last-level cache (1 GiB by default), in NumPy
and in torch on the same buffer, at each thread count asked; the two libraries take turns, round
after round, and each figure is the median over the rounds (the first round warms up and is not
counted). A product reads W's bytes once (x and the result are n floats each), so bytes / time is
the bandwidth it streams at. With ``--per-token-mib M`` the report adds the time a token cannot go
below when M MiB of weights are read per token (GPT-2 124M in float32: 475 MiB).
"""

import argparse
import math
import os
import statistics
import sys
import time

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from benchmarks import machine


def measure(mib, threads, rounds):
    """{"numpy, t thread(s)": GB/s, "torch, ...": GB/s} for each t in threads, and W's side n."""
    import torch

    n = int(math.isqrt(mib * 2**20 // 4))
    w = np.random.default_rng(0).random((n, n), dtype=np.float32)   # (n, n): the weights streamed
    x = np.ones((1, n), np.float32)                                  # (1, n): one token's activations
    tw, tx = torch.from_numpy(w), torch.from_numpy(x)                # the same buffer
    products = {"numpy": lambda: x @ w, "torch": lambda: tx @ tw}
    rates = {}
    old_threads = torch.get_num_threads()
    try:
        for t in threads:
            torch.set_num_threads(t)
            times = {lib: [] for lib in products}
            with threadpool_limits(t, user_api="blas"):
                for r in range(rounds + 1):
                    for lib, product in products.items():
                        start = time.perf_counter()
                        product()
                        if r:                            # round 0 warms up
                            times[lib].append(time.perf_counter() - start)
            for lib, samples in times.items():
                rates[f"{lib}, {t} thread(s)"] = w.nbytes / statistics.median(samples) / 1e9
    finally:
        torch.set_num_threads(old_threads)
    return n, rates


def report_lines(n, rates, rounds, per_token_mib, load):
    info = machine.machine()
    blas = [f"{i['internal_api']} {i['version']} {i.get('architecture')}" for i in threadpool_info()
            if i["user_api"] == "blas"]
    lines = [f"machine: {info['cpu']}, vector extensions {' '.join(info['vector_extensions'] or [])}; "
             f"BLAS {', '.join(blas)}; load average {load[0]:.2f} before, {load[1]:.2f} after",
             f"x (1, {n}) @ W ({n}, {n}) float32, W {n * n * 4 / 2**20:.0f} MiB, median of {rounds} rounds"]
    for name, gbs in rates.items():
        floor = f"   a token reading {per_token_mib} MiB: at least {per_token_mib * 2**20 / gbs / 1e6:.1f} ms" \
            if per_token_mib else ""
        lines.append(f"  {name:20} {gbs:6.1f} GB/s{floor}")
    return lines


def _positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.bandwidth", description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=_positive_int, default=1024, help="W's size in MiB; default %(default)s "
                   "(above the last-level cache)")
    p.add_argument("--threads", type=_positive_int, nargs="+", default=[1, 2], help="default 1 2")
    p.add_argument("--rounds", type=_positive_int, default=7, help="default %(default)s")
    p.add_argument("--per-token-mib", type=_positive_int, help="also print the time a token needs to read "
                   "this many MiB of weights at each bandwidth")
    args = p.parse_args(argv)
    memory_gib = machine.machine()["memory_gib"]
    if memory_gib is not None and args.mib > memory_gib * 1024 / 2:
        p.error(f"--mib {args.mib} asks for more than half of this machine's {memory_gib} GiB of memory")
    load = [os.getloadavg()[0]]
    n, rates = measure(args.mib, args.threads, args.rounds)
    load.append(os.getloadavg()[0])
    print("\n".join(report_lines(n, rates, args.rounds, args.per_token_mib, load)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
