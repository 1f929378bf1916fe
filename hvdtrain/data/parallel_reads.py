"""Many samples' bytes read at once, on a pool of threads: for the readers that run in one
process per rank (TensorFlow's tf.data chunks, `--loader dali`), where one read after another
would cap a rank at 1 / (the file system's latency): 0.5-1 ms a read on a parallel file system is
1,000-2,000 reads a second, under what one GPU trains (ResNet-50: 2,500-3,700 img/s).

    samples = read_many(reader.read, indices)     # [reader.read(i) for i in indices], reads overlapped

The reads wait on I/O and release the GIL (os.pread, open), so threads overlap them even on a rank
with a core or two. torch's DataLoader workers do not need it: each is a process of its own.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

_pool: ThreadPoolExecutor | None = None
_pool_pid: int | None = None
_lock = threading.Lock()


def read_threads(cores: int | None = None) -> int:
    """Reads in flight at once: several per core (they wait, not compute): 8 at least, 32 at most."""
    cores = cores or len(os.sched_getaffinity(0))
    return min(32, max(8, 4 * cores))


def _threads() -> ThreadPoolExecutor:
    global _pool, _pool_pid
    with _lock:
        if _pool is None or _pool_pid != os.getpid():  # a forked process: threads of its own
            _pool, _pool_pid = ThreadPoolExecutor(read_threads(), thread_name_prefix="hvdtrain-read"), os.getpid()
        return _pool


def read_many(read, indices) -> list:
    """[read(i) for i in indices], in that order, the reads overlapped on the pool; the first
    failure (in the indices' order) raised, as the loop would."""
    indices = list(indices)
    if len(indices) <= 1:
        return [read(i) for i in indices]
    return list(_threads().map(read, indices))
