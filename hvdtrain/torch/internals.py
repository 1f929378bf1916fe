"""Every use of PyTorch's and Lightning's private API in hvdtrain, in one place.

Each is something the public API does not offer; each is checked on the versions named beside
it and by tests/test_internals.py, which fails when a framework upgrade removes or renames what
it reaches (rather than a hang, or a refusal silently skipped, in a user's job).

| what | why | checked on |
|---|---|---|
| DataLoader's iterator: `_iterator`, `_workers`, `_worker_pids_set`, `_shutdown_workers`; `signal_handling._remove_worker_pids` | end kept workers at once, even mid-decode (end_loader_workers) | torch 2.4-2.14 |
| `Tensor._typed_storage()._new_shared(n)` | a batch made in shared memory in a worker, as default_collate does (shared_floats) | torch 2.1-2.14 |
| `Variable._execution_engine.queue_callback` | a callback at the end of backward: the compute phase's end (at_end_of_backward) | torch 2.0-2.14 |
| Lightning's `Strategy._layer_sync` | `Trainer(sync_batchnorm=True)` seen by a strategy (layer_sync) | lightning 2.0-2.6 |
"""
from __future__ import annotations

import torch


def end_loader_workers(loader) -> None:
    """End a DataLoader's live workers at once (killed, even in the middle of a decode), after
    torch's SIGCHLD check forgets them (it would call their end an error); then torch shuts down
    the rest (its queues, its pinning thread). Nothing when it has no live iterator."""
    from torch.utils.data._utils import signal_handling

    iterator = getattr(loader, "_iterator", None)
    if iterator is None:
        return
    if getattr(iterator, "_worker_pids_set", False):
        signal_handling._remove_worker_pids(id(iterator))
        iterator._worker_pids_set = False
    for worker in iterator._workers:
        worker.kill()
    for worker in iterator._workers:
        worker.join(timeout=5)
    iterator._shutdown_workers()
    loader._iterator = None


def shared_floats(count: int) -> torch.Tensor:
    """An empty float32 tensor whose storage of `count` elements is in shared memory: a decode
    worker's batch then goes to the rank without another copy (what default_collate does)."""
    empty = torch.empty(0, dtype=torch.float32)
    return empty.new(empty._typed_storage()._new_shared(count))


def at_end_of_backward(callback) -> None:
    """Run callback() when autograd ends the current backward pass (queued from a hook that runs
    during it), before backward() returns: after the last gradient, before DDP's wait for its
    buckets, which autograd runs as a callback queued later."""
    torch.autograd.Variable._execution_engine.queue_callback(callback)


def layer_sync(strategy):
    """Lightning's layer sync of a strategy (set by `Trainer(sync_batchnorm=True)`), or None."""
    return strategy._layer_sync
