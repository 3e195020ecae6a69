"""The interruption tests' kit (attn_cli/checkpoint.py's writer and the commands that write through
it: train, site, benchmarks): ``Interrupter`` cuts the k-th file-system call of a write, for
every k in turn, and ``snapshot`` records a folder to check that every entry of the user's is as
it was afterwards."""

import contextlib
import os
import signal
import stat
from pathlib import Path

from attn_cli import checkpoint

# The file-system calls a write may make; Interrupter counts them and interrupts one.
CALLS = ("open", "write", "fsync", "close", "replace", "rename", "link", "unlink", "remove", "mkdir", "rmdir")


def snapshot(root):
    """{relative path: what it is} of everything under ``root``, links not followed: a file's
    bytes and mode, a link's target, a folder's mode."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            st_ = os.lstat(path)
            if stat.S_ISLNK(st_.st_mode):
                found[os.path.relpath(path, root)] = ("link", os.readlink(path))
                if name in dirs:
                    dirs.remove(name)                          # not followed
            elif stat.S_ISDIR(st_.st_mode):
                found[os.path.relpath(path, root)] = ("folder", stat.S_IMODE(st_.st_mode))
            else:
                found[os.path.relpath(path, root)] = ("file", Path(path).read_bytes(), stat.S_IMODE(st_.st_mode))
    return found


def _interrupt():
    raise KeyboardInterrupt("interrupted")


class Interrupter:
    """Replaces the os functions in CALLS by counting wrappers; before the ``k``-th call (from 1)
    ``act()`` runs: by default it raises KeyboardInterrupt, so that the call is not made.
    ``calls`` lists the calls, ``hit`` is the k-th."""

    def __init__(self, monkeypatch, k, act=_interrupt):
        self.k, self.calls, self.hit, self.act = k, [], None, act
        for name in CALLS:
            monkeypatch.setattr(os, name, self._wrap(name, getattr(os, name)))
        monkeypatch.setattr(checkpoint, "open", self._wrap("builtin open", open), raising=False)

    def _wrap(self, name, real):
        def call(*args, **kwargs):
            self.calls.append((name, args))
            if len(self.calls) == self.k:
                self.hit = (name, args)
                self.act()
            return real(*args, **kwargs)
        return call


@contextlib.contextmanager
def default_signals():
    """SIGINT handled as an interactive Python handles it (KeyboardInterrupt), SIGTERM and SIGHUP
    at their default, while the block runs, whatever this process inherited: a shell starts a
    background job (`pytest &`, a CI step) with SIGINT ignored, nohup ignores SIGHUP, Python then
    leaves them ignored, and so would a command started from here, as ignored dispositions survive
    exec (a handler does not: the child gets its own default)."""
    wanted = {signal.SIGINT: signal.default_int_handler}
    wanted.update({getattr(signal, s): signal.SIG_DFL for s in ("SIGTERM", "SIGHUP") if hasattr(signal, s)})
    previous = {signum: signal.signal(signum, handler) for signum, handler in wanted.items()}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
