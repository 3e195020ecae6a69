"""What a result depends on besides the code: the machine (CPU, vector extensions, memory), what a
timed process sees (its CPUs, BLAS kernel and thread pools, NumPy's SIMD targets, torch's CPU
capability), the git commit measured, and the load average. Every run's header is built from these.
"""

import os
import platform
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]     # the checkout (or the folder holding the packages)

USABLE_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()

# The vector extensions that decide which kernels NumPy, OpenBLAS and torch run (from the
# /proc/cpuinfo flags): results from machines with and without AVX-512 are not comparable.
VECTOR_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512bw",
                "avx512vl", "avx512_vnni", "avx512_bf16", "amx_tile")


def machine():
    """CPU model, core counts and memory of this machine (from /proc where it exists)."""
    info = dict(cpu=platform.processor() or platform.machine(), logical_cpus=os.cpu_count(),
                usable_cpus=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
                physical_cores=None, memory_gib=None, os=platform.platform(),
                vector_extensions=None)
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        cores, core = set(), {}
        for line in cpuinfo.read_text().splitlines():
            key, _, value = (part.strip() for part in line.partition(":"))
            if key == "model name":
                info["cpu"] = value
            elif key == "flags" and info["vector_extensions"] is None:
                flags = set(value.split())
                info["vector_extensions"] = [f for f in VECTOR_FLAGS if f in flags]
            elif key in ("physical id", "core id"):
                core[key] = value
                if len(core) == 2:
                    cores.add((core["physical id"], core["core id"]))
                    core = {}
        info["physical_cores"] = len(cores) or None
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        kib = int(meminfo.read_text().split("MemTotal:")[1].split()[0])
        info["memory_gib"] = round(kib / 2**20, 1)
    return info


def process_env(library, device):
    """What a timed process sees: versions, thread pools and the BLAS kernel in use."""
    import numpy as np
    from threadpoolctl import threadpool_info

    import numpy_attn

    env = dict(numpy=np.__version__, python=platform.python_version(),
               threadpools=threadpool_info(),
               cpus=sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
               numpy_attn_path=str(Path(numpy_attn.__file__).resolve().parent))
    env["numpy_simd"] = numpy_simd()
    if library == "torch":
        import torch

        env.update(torch=torch.__version__, torch_threads=torch.get_num_threads(),
                   torch_interop_threads=torch.get_num_interop_threads(),
                   torch_cpu_capability=torch.backends.cpu.get_cpu_capability())
        if device == "cuda":
            props = torch.cuda.get_device_properties(0)
            env.update(gpu=torch.cuda.get_device_name(0), gpu_memory_bytes=props.total_memory,
                       cuda=torch.version.cuda,
                       tf32_matmul=torch.backends.cuda.matmul.allow_tf32)
    return env


def numpy_simd():
    """The SIMD targets NumPy found on this CPU beyond its baseline (e.g. ['X86_V3']), or None.

    np.show_runtime() prints them; the dict it reads is private, so its absence is tolerated.
    """
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    except ImportError:
        return None
    return [name for name in __cpu_dispatch__ if __cpu_features__.get(name)]


def git_state():
    """The commit measured, and whether the working tree differed from it (None outside git)."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=30).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD")
        return dict(commit=commit, dirty=bool(git("status", "--porcelain", "--untracked-files=no"))) if commit else None
    except (OSError, subprocess.SubprocessError):
        return None


def load_average():
    """The 1-minute load average (None where the OS has none)."""
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


# The load average counts the threads that are running or waiting for a CPU. A timed process
# keeps its own --threads busy, and a BLAS or OpenMP call ends when its slowest thread does, so
# one other runnable thread on any of its cores stretches the whole call. Others' load L per CPU
# means each core is wanted by someone else about L of the time: at 0.5 every second time slice
# of a core is shared, which on the 2-core machines here moved a median by 10-20% between runs
# minutes apart, as much as the differences being measured. Below it the drift stays within the
# quartiles; above it a ratio of two rows timed one after the other cannot be trusted.
BUSY_LOAD_PER_CPU = 0.5
LOAD_SAMPLE_S = 5.0      # one getloadavg() every 5 s: the average itself moves slower than that


class LoadWatch:
    """The load average before a run, sampled every LOAD_SAMPLE_S seconds while it runs (by a
    daemon thread, so a run of minutes keeps a handful of readings), and after: ``stop()``."""

    def __init__(self):
        self.before, self.during = load_average(), []
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self):
        while not self._stopped.wait(LOAD_SAMPLE_S):
            self.during.append(load_average())

    def stop(self):
        """(before, [during], after) once sampling has stopped."""
        self._stopped.set()
        self._thread.join()
        return self.before, [x for x in self.during if x is not None], load_average()


def load_report(before, during, after, threads, cpus):
    """The ``load_average`` entry of a results dict: the readings, the load of other processes per
    CPU (the largest reading less the run's own ``threads``, which are runnable while it times,
    and in the minute after), and a warning, once, where that is above BUSY_LOAD_PER_CPU."""
    readings = [x - (threads if i else 0) for i, x in enumerate([before, *during, after]) if x is not None]
    others = max(0.0, *readings) / max(cpus or 1, 1) if readings else None
    warning = None
    if others is not None and others > BUSY_LOAD_PER_CPU:
        warning = (f"the machine was busy: other processes kept {others:.2f} threads per CPU runnable "
                   f"(above {BUSY_LOAD_PER_CPU}, beside this run's {threads}), so the times drift between "
                   "rows timed one after the other; rerun with --interleave (ratios paired within a round), "
                   "fewer --threads, or on a quiet machine")
    return dict(before=before, during=during, after=after, threads=threads, cpus=cpus,
                others_per_cpu=None if others is None else round(others, 2), threshold=BUSY_LOAD_PER_CPU,
                warning=warning)


def facts(load, threads):
    """The part of a results dict that says where and on what it ran: the load average (``load``,
    the run's LoadWatch, is stopped here) with its warning, the machine, the git commit, the
    versions. The warning is also printed on stderr, once."""
    import numpy as np
    import threadpoolctl
    import torch

    # Other processes' load makes timings noisy (threads wait for descheduled siblings).
    load_average = load_report(*load.stop(), threads, USABLE_CPUS)
    if load_average["warning"]:
        print(f"python -m benchmarks: warning: {load_average['warning']}", file=sys.stderr)
    return dict(load_average=load_average, machine=machine(), git=git_state(),
                versions=dict(python=platform.python_version(), numpy=np.__version__,
                              torch=torch.__version__, threadpoolctl=threadpoolctl.__version__))
