"""The parent's side of the timing workers: ``Worker``, the handle on one
``python -m benchmarks._worker`` subprocess (its protocol is described there), and
``revision_tree``, the folder whose numpy_attn is another git revision's (``--against``).
"""

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from attn_cli.checkpoint import signals_held
from benchmarks.machine import ROOT

PREFIX = "BENCH "                          # before each record a worker writes on stdout
PARENT_VAR = "NUMPY_ATTN_BENCH_PARENT"     # the parent's process id, set by Worker


def _describe(label, record):
    """What a progress line says of a record."""
    if record["kind"] == "peak":
        return f"{label} matmul peak"
    if "P" in record:                              # decode
        return f"decode {record['impl']} P={record['P']} {'cached' if record['cache'] else 'uncached'}"
    return f"{record['op']} T={record['T']} {record['impl']} {record['device']} {record['mode']}"


class Worker:
    """The parent's handle on one timing subprocess: ``read()`` its records, ``ask()`` for one
    sample, ``finish()`` to check how it ended. As a context manager it kills a worker still
    running when the parent stops early (an error, Ctrl-C): no orphan keeps timing.

    ``pythonpath`` comes first on the worker's import path (it is also the worker's folder,
    which ``python -m`` puts before everything else): a folder holding another ``numpy_attn``
    times that one with this revision's benchmarks (``--against``).
    """

    def __init__(self, job, progress=None, pythonpath=None, label=None):
        self.label = label or f"{job['library']} {job['device']}"
        self.progress = progress
        path = [pythonpath, str(ROOT), os.environ.get("PYTHONPATH")]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, path)))
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = str(job["threads"])         # read once, when each library loads
        env[PARENT_VAR] = str(os.getpid())         # the worker exits if this process dies
        self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks._worker"], cwd=pythonpath or ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
            if not job.get("serve"):
                self.proc.stdin.close()
        except BrokenPipeError:                    # it died at once: read() reports how
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if not stream.closed:
                try:
                    stream.close()
                except BrokenPipeError:            # a dead worker's stdin: nothing to flush to
                    pass

    def read(self):
        """The next record as a dict (its ``kind`` included), or None once the worker has ended."""
        for line in self.proc.stdout:
            if line.startswith(PREFIX):
                record = json.loads(line[len(PREFIX):])
                if self.progress and record["kind"] in ("peak", "row"):
                    self.progress.step(_describe(self.label, record))
                return record
            sys.stderr.write(line)                 # a library's stray print
        self.finish()
        return None

    def records(self):
        """Every record until the worker ends; then ``finish()``."""
        while (record := self.read()) is not None:
            yield record

    def ask(self, request):
        """Send one request to a serving worker; its ``sample`` record."""
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass                                   # it died: read() reports how
        record = self.read()
        if record is None:
            raise RuntimeError(f"the {self.label} timing worker ended before answering")
        return record

    def finish(self):
        """Close a serving worker's requests and wait; RuntimeError if it failed."""
        if not self.proc.stdin.closed:
            self.proc.stdin.close()
        if self.proc.wait() < 0:                   # the kernel's OOM killer sends SIGKILL
            raise RuntimeError(f"the {self.label} timing worker was killed by signal "
                               f"{-self.proc.returncode} (out of memory? try smaller --seq-lens or --batch)")
        if self.proc.returncode != 0:
            raise RuntimeError(f"the {self.label} timing worker failed with exit status "
                               f"{self.proc.returncode} (its traceback is above)")


# Modules of numpy_attn that the timing worker itself imports (benchmarks/calls.py, _worker.py):
# standard library only, and nothing in them is timed.
HARNESS_HELPERS = ("_tree.py", "_threads.py")


def check_repository():
    """ValueError unless the folder of this checkout (ROOT) is the top of its own git work tree:
    a copy without .git inside another repository would otherwise check out that repository's
    revision (and register a worktree there)."""
    try:
        result = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=ROOT, capture_output=True,
                                text=True, timeout=60)
    except FileNotFoundError:
        raise ValueError("--against needs git, which is not installed") from None
    top = result.stdout.strip()
    if result.returncode == 0 and top and os.path.samefile(top, ROOT):
        return
    where = f"it lies inside the repository at {top}" if result.returncode == 0 and top else "it has no .git"
    raise ValueError(f"--against checks out a revision of this checkout's own git repository, and "
                     f"{ROOT} is not the top of one ({where})")


@contextlib.contextmanager
def revision_tree(rev):
    """A folder whose ``numpy_attn`` is the package at git revision ``rev``: a detached
    ``git worktree`` in a fresh temporary folder, removed and unregistered afterwards, also when
    interrupted: SIGINT, SIGTERM and SIGHUP (the caller has ``termination_raises`` make the last
    two raise) are held while the worktree is made and while it is removed, so that git is never
    cut in the middle, and then act. Nothing outside that folder is written, moved or deleted but
    git's own record of the worktree (which ``git worktree remove`` deletes again). Refused
    (ValueError) where this checkout is not its git repository's top (``check_repository``)."""
    check_repository()
    folder = None
    try:
        with signals_held():
            folder = Path(tempfile.mkdtemp(prefix="numpy-attn-bench-"))
            tree = folder / "tree"
            # Its own session: a Ctrl-C at the terminal reaches this process only, not git.
            subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(tree), rev], cwd=ROOT,
                           check=True, capture_output=True, text=True, timeout=120, start_new_session=True)
        for helper in HARNESS_HELPERS:             # lent to revisions older than them
            if not (tree / "numpy_attn" / helper).exists():
                shutil.copyfile(ROOT / "numpy_attn" / helper, tree / "numpy_attn" / helper)
        (folder / "path").mkdir()
        (folder / "path" / "numpy_attn").symlink_to(tree / "numpy_attn", target_is_directory=True)
        yield str(folder / "path")
    finally:
        if folder is not None:
            with signals_held():
                _remove_tree(folder)


def _remove_tree(folder):
    """Unregister the worktree ``folder``/tree and delete ``folder``: by ``git worktree remove``,
    and where git could not (a worktree half made), by deleting git's record of this worktree
    alone (the folder its .git file names, under the repository's worktrees)."""
    tree = folder / "tree"
    record = None
    with contextlib.suppress(OSError, UnicodeDecodeError):
        text = (tree / ".git").read_text(encoding="utf-8").strip()
        if text.startswith("gitdir: "):
            record = Path(text[len("gitdir: "):])
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                       capture_output=True, timeout=120, start_new_session=True)
    shutil.rmtree(folder, ignore_errors=True)
    if record is not None and record.parent.name == "worktrees" and record.is_dir():
        shutil.rmtree(record, ignore_errors=True)
