"""DataLoader worker processes that a rank may start at any moment: never forked from the rank
itself, never killed by a stop signal, never outliving the rank.

    loader = DataLoader(dataset, num_workers=2, multiprocessing_context=worker_context(),
                        worker_init_fn=init_worker)

Why not the default `fork`: a rank runs threads (Horovod's background loop, Gloo's, the
watchdog, the progress bar, TensorBoard's writer), and a fork copies whatever lock one of them
holds at that instant; the child can then hang inside `os.fork` itself (seen: a worker stuck in
`PyOS_AfterFork_Child`, its rank waiting for it, the other rank in a collective, until the
watchdog ended the job). Workers are kept across epochs, but made again whenever a loader is
(another batch size, a resize, a user's loop), so a long run meets that instant sooner or later.
Here workers are forked by a *forkserver*: a fresh
process the rank starts once (fork+exec: no Python runs between the two), single-threaded, with
torch and the data code already imported, so a worker still starts in milliseconds.

Stop signals: Slurm signals every process of a step (scancel: SIGTERM; `--signal=USR1@T`:
SIGUSR1), and a worker killed by one takes its rank down before it can checkpoint. The forkserver
is started with both signals blocked, and the workers it forks inherit that mask: there is no
moment, not even between the fork and `init_worker`, at which they can die of one. The rank
handles them (hvdtrain/runtime.py) and ends its workers itself.

Lifetime: the forkserver asks for SIGKILL when the rank dies, each worker when the forkserver
dies (Linux's parent-death signal), so no worker is left behind however the rank ends (its own
exit, mpirun's kill, the watchdog, SIGKILL).
"""
from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
from multiprocessing import forkserver, resource_tracker

from hvdtrain.runtime import StopRequest

STOP_SIGNALS = StopRequest.SIGNALS  # what the rank handles, workers must not die of
_PRELOAD = "hvdtrain.torch.worker_server"  # imported by the forkserver alone: it sets SERVER_PID
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

QUIET_TRACKER = "ignore:resource_tracker:UserWarning"  # a -W option: the tracker's leak warnings

# Set in the forkserver (and so in every worker it forks) by hvdtrain/torch/worker_server.py.
SERVER_PID: int | None = None


def worker_context():
    """The multiprocessing context for DataLoader workers, its forkserver running. Call it from
    the rank's main thread: the parent-death signal fires when the thread that started the
    forkserver ends, and the main thread lasts as long as the rank."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([_PRELOAD])
    # Blocked here, in the thread that starts the forkserver: the mask is kept across fork and
    # exec. A signal arriving meanwhile waits, and reaches the rank's handler at the unblock.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        # The resource tracker (a helper process the forkserver needs) is started first, as its
        # own start unblocks SIGTERM on the way out (Python's guard for it, bpo-33613); it ignores
        # SIGTERM itself, and inherits SIGUSR1 blocked.
        start_quiet_resource_tracker()
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return context


def start_quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (if nothing has yet) without its leak warning. A
    rank that fails ends at once (os._exit: no atexit handler may wait for a peer that is gone),
    so its loaders' queues never release their semaphores; the tracker unlinks them once the rank
    is gone, which is right, and warned of each ("There appear to be 14 leaked semaphore objects
    to clean up at shutdown") after the rank's one line had said why it ended. The tracker takes
    its warning filters from sys.warnoptions when it starts; the rank's own are left as they were."""
    sys.warnoptions.append(QUIET_TRACKER)
    try:
        resource_tracker.ensure_running()
    finally:
        sys.warnoptions.remove(QUIET_TRACKER)


def unguarded_main() -> tuple[str, int] | None:
    """(script, line) when the running script's top level is training with no `if __name__ ==
    "__main__":` around it, else None. A worker process imports the script again (as
    `__mp_main__`, without running the guarded block): unguarded, each worker would start training
    too, MPI refuses it there, and the workers die. The line is found in the script's syntax tree:
    the top-level statement being run now must sit inside such an `if`."""
    import ast
    import inspect

    frame = inspect.currentframe()
    while frame is not None and not (frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__"):
        frame = frame.f_back
    if frame is None:
        return None
    # A package's __main__ (python -m hvdtrain.torch) is one that multiprocessing never imports again.
    spec = frame.f_globals.get("__spec__")
    if spec is not None and (spec.name or "").endswith("__main__"):
        return None
    path, line = frame.f_code.co_filename, frame.f_lineno
    try:
        with open(path) as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):  # python -c, a notebook, an interactive session
        return None
    for statement in tree.body:
        if statement.lineno <= line <= (statement.end_lineno or statement.lineno):
            guarded = isinstance(statement, ast.If) and "__main__" in ast.unparse(statement.test) \
                and "__name__" in ast.unparse(statement.test)
            return None if guarded else (path, line)
    return None


def init_worker(worker_id: int) -> None:
    """DataLoader worker start-up: ignore the stop signals (they are still blocked from the
    forkserver: none can have arrived unseen), and die with the forkserver."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    die_with_parent()
    if SERVER_PID is not None and os.getppid() != SERVER_PID:
        os._exit(1)  # the forkserver, so the rank, ended before the line above took effect


def die_with_parent() -> None:
    """Ask Linux for SIGKILL when this process's parent ends (a no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
