"""Open files by path, as few at once as the reads need and never more than this process's
open-file limit allows.

A rank's decode workers read samples of a few shards an epoch (datasets.shard_blocked_order:
about shards / ranks + 1; 139 of ImageNet's 1,100 at 8 ranks, 6 at 256), another few the next
epoch, and each worker is a process with its own limit, often 1,024 by default on clusters. So a
process keeps open the files it is reading now, and closes the others:

- **Idle files close.** A file not read for IDLE_READS x (the mean gap between two reads of one
  file) reads of this reader is closed: a file of the epoch being read is read about every
  (files being read) reads, so closing it by mistake is a chance of e^-20. The gap is measured on
  the files being read, not counted from the files open: counted so, the shards of earlier epochs
  would keep the threshold high while they linger (a worker holding 2.7 epochs' shards where an
  epoch is 4,000 of its reads). The shards of an earlier epoch close a few thousand reads into the next one, so
  descriptors stay near one epoch's working set over a whole run, not a sum over its epochs
  (kept until the limit, a worker at 8 ranks reaches it by the 12th of 90 epochs).
- **One budget per process**, the soft limit (raised to the hard one, no privilege needed) less
  RESERVE for CUDA, NCCL, MPI, sockets, shared memory and libraries, shared by every reader in
  the process (a TensorFlow rank reads train and val in one): beyond its share, the least
  recently read file closes.
- **Said once** when the limit makes most reads open their file again (a parallel file system's
  metadata servers then see an open per sample).

Threads (tf.data's parallel reads) share one instance: a file being read is never closed under
its reader (a count of readers per file), and only one descriptor per file is kept.
"""
from __future__ import annotations

import collections
import os
import sys
import threading
import weakref

from hvdtrain.errors import UsageError

# Descriptors left for what else a process opens: a GPU rank's CUDA device files, NCCL's and MPI's
# sockets (a few per peer), torch's workers' shared-memory tensors (a descriptor each, briefly),
# Python and CUDA libraries, the log.
RESERVE = 256
MINIMUM = 8  # fewer files open at once than this would reopen a file for nearly every read
IDLE_READS = 20  # a file not read for this many x (the mean gap between a file's reads) reads is closed
GAP_WEIGHT = 256  # the mean gap is a moving average over about this many reads
SWEEP_EVERY = 64  # reads between two looks for idle files
SAY_AFTER_READS = 2000  # the reopening line needs this many reads to judge

_readers_here: "weakref.WeakSet[OpenFiles]" = weakref.WeakSet()  # this process's readers (the budget's share)
_said: set[int] = set()  # processes that said the reopening line


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


def files_to_keep(files: int, soft_limit: int, readers: int = 1) -> int:
    """How many of `files` one of `readers` readers in a process keeps open at once under
    `soft_limit`: all where they fit beside the reserve, else its share of the limit less the reserve."""
    return max(1, min(files, (soft_limit - RESERVE) // max(1, readers)))


def check_limit(what: str, soft_limit: int, hard_limit: int) -> None:
    """One line where even the hard limit leaves too few descriptors to read `what` sensibly."""
    if hard_limit - RESERVE < MINIMUM:
        raise UsageError(f"the open-file limit is {soft_limit} (hard {hard_limit}): too low to read {what}, which "
                         f"needs at least {RESERVE + MINIMUM} (raise it: ulimit -n, or ask the site)")


class OpenFiles:
    """Read-only descriptors of `paths`, by index: idle ones closed, and the least recently used
    beyond this reader's share of the process's budget (computed in each process at its first
    read: a forked worker has its own limit, files and readers)."""

    def __init__(self, paths: list[str], keep: int | None = None):
        self.paths, self.keep_asked = list(paths), keep
        self._reset()

    def _reset(self):
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._open: collections.OrderedDict[int, int] = collections.OrderedDict()  # index -> fd, oldest first
        self._last_read: dict[int, int] = {}  # index -> this reader's read count at its last read
        self._readers: collections.Counter = collections.Counter()
        self.reads = 0
        self.mean_gap: float | None = None  # reads between two reads of one open file, on average
        self.opened = 0  # files opened by this process: how often the limit made it reopen
        self.most_open = 0  # the most files this reader held open at once
        _readers_here.add(self)
        self._soft_limit = raise_soft_limit()[0]  # in this process, before its first file

    @property
    def keep(self) -> int:
        """The most files this reader keeps open: its share of the process's budget."""
        readers = sum(1 for r in _readers_here if r._pid == self._pid)
        return self.keep_asked or files_to_keep(len(self.paths), self._soft_limit, readers)

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
            self.reads += 1
            fd = self._open.get(index)
            if fd is not None:
                gap = self.reads - self._last_read[index]
                self.mean_gap = gap if self.mean_gap is None else self.mean_gap + (gap - self.mean_gap) / GAP_WEIGHT
                self._open.move_to_end(index)
            else:
                fd = os.open(self.paths[index], os.O_RDONLY)
                self.opened += 1
                self._open[index] = fd
                self._close_beyond(self.keep)
                self.most_open = max(self.most_open, len(self._open))
            self._last_read[index] = self.reads
            if self.reads % SWEEP_EVERY == 0:
                self._close_idle()
                self._say_if_reopening()
            self._readers[index] += 1
            return fd

    def _close_beyond(self, keep: int):
        """Close the least recently read files no thread is reading, down to `keep` (a file in
        use stays open: the count may exceed `keep` by the threads reading at this moment)."""
        excess = len(self._open) - keep
        for index in list(self._open):
            if excess <= 0:
                break
            if self._readers[index] == 0:
                os.close(self._open.pop(index))
                excess -= 1

    def _close_idle(self):
        """Close the files not read for IDLE_READS x (the mean gap between a file's reads) reads: an
        earlier epoch's. Before any file was read twice, the files open stand in for the gap."""
        idle_after = IDLE_READS * max(MINIMUM, self.mean_gap if self.mean_gap is not None else len(self._open))
        for index in list(self._open):  # least recently read first: stop at the first one still read
            if self.reads - self._last_read[index] <= idle_after:
                break
            if self._readers[index] == 0:
                os.close(self._open.pop(index))

    def _say_if_reopening(self):
        """Once per process: the limit makes most reads open their file again."""
        if self.reads < SAY_AFTER_READS or 2 * self.opened < self.reads or self._pid in _said:
            return
        _said.add(self._pid)
        soft, hard = raise_soft_limit()
        print(f"hvdtrain: the open-file limit ({soft}, hard {hard}) keeps {self.keep} of the files read here open at "
              f"once: {self.opened} of {self.reads} reads opened their file again (slow on a parallel file "
              f"system); raise it (ulimit -n, or ask the site)", file=sys.stderr, flush=True)

    def close(self):
        with self._lock:
            while self._open:
                os.close(self._open.popitem()[1])

    def __getstate__(self):  # sent to DataLoader workers: no descriptors, no lock
        return {"paths": self.paths, "keep_asked": self.keep_asked}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._reset()
