"""Open files by path, at most as many at once as this process's open-file limit allows.

A rank's decode workers each read samples of every shard in an epoch (ImageNet: about 1,100
shards), and each worker is a process with its own limit, often 1,024 by default on clusters:
one descriptor kept per shard read ended workers with "Too many open files" (issue 46). Here a
process first raises its soft limit to the hard one (no privilege needed), then keeps the most
recently read files open, up to the limit less a reserve for everything else a worker opens
(sockets, shared memory, libraries): where the hard limit holds every shard, each is opened
once per process, as before; where it does not, the least recently read are closed.

Threads (tf.data's parallel reads) share one instance: a file being read is never closed under
its reader (a count of readers per file), and only one descriptor per file is kept.
"""
from __future__ import annotations

import collections
import os
import threading

from hvdtrain.errors import UsageError

# Descriptors left for what else a process opens: torch's workers pass tensors through shared
# memory (a descriptor each, briefly), Python and CUDA libraries, sockets, the log.
RESERVE = 128
MINIMUM = 8  # fewer files open at once than this would reopen a file for nearly every read


def raise_soft_limit() -> tuple[int, int]:
    """The soft open-file limit raised to the hard one where it is lower; returns (soft, hard)."""
    try:
        import resource
    except ImportError:  # not a POSIX system: nothing to raise, nothing known
        return (1 << 20, 1 << 20)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 20) if soft != resource.RLIM_INFINITY else 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= hard:
        return (hard if soft == resource.RLIM_INFINITY else soft), hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard, hard
    except (ValueError, OSError):
        return soft, hard


def files_to_keep(files: int, soft_limit: int) -> int:
    """How many of `files` to keep open at once under `soft_limit`: all where they fit beside the
    reserve, else the limit less the reserve."""
    return max(1, min(files, soft_limit - RESERVE))


def check_limit(what: str, soft_limit: int, hard_limit: int) -> None:
    """One line where even the hard limit leaves too few descriptors to read `what` sensibly."""
    if hard_limit - RESERVE < MINIMUM:
        raise UsageError(f"the open-file limit is {soft_limit} (hard {hard_limit}): too low to read {what}, which "
                         f"needs at least {RESERVE + MINIMUM} (raise it: ulimit -n, or ask the site)")


class OpenFiles:
    """Read-only descriptors of `paths`, by index, the least recently used closed beyond `keep`
    (computed in each process at its first read: a forked worker has its own limit and files)."""

    def __init__(self, paths: list[str], keep: int | None = None):
        self.paths, self.keep_asked = list(paths), keep
        self._reset()

    def _reset(self):
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._open: collections.OrderedDict[int, int] = collections.OrderedDict()  # index -> fd, oldest first
        self._readers: collections.Counter = collections.Counter()
        self.keep = self.keep_asked or files_to_keep(len(self.paths), raise_soft_limit()[0])
        self.opened = 0  # files opened by this process: how often the limit made it reopen

    def pread(self, index: int, size: int, offset: int) -> bytes:
        if self._pid != os.getpid():  # a forked worker: its own descriptors and limit
            self._reset()
        fd = self._acquire(index)
        try:
            return os.pread(fd, size, offset)
        finally:
            with self._lock:
                self._readers[index] -= 1

    def _acquire(self, index: int) -> int:
        with self._lock:
            fd = self._open.get(index)
            if fd is not None:
                self._open.move_to_end(index)
            else:
                fd = os.open(self.paths[index], os.O_RDONLY)
                self.opened += 1
                self._open[index] = fd
                self._close_beyond_keep()
            self._readers[index] += 1
            return fd

    def _close_beyond_keep(self):
        """Close the least recently read files no thread is reading, down to `keep` (a file in
        use stays open: the count may exceed `keep` by the threads reading at this moment)."""
        excess = len(self._open) - self.keep
        for index in list(self._open):
            if excess <= 0:
                break
            if self._readers[index] == 0:
                os.close(self._open.pop(index))
                excess -= 1

    def close(self):
        with self._lock:
            while self._open:
                os.close(self._open.popitem()[1])

    def __getstate__(self):  # sent to DataLoader workers: no descriptors, no lock
        return {"paths": self.paths, "keep_asked": self.keep_asked}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._reset()
