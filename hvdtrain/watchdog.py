"""A per-rank progress watchdog: a rank that completes no training step for too long ends the job.

Why: a rank frozen by the OS (a stuck GPU driver, an NFS stall, a swap storm) or blocked in Python
(a read that never returns) leaves every other rank waiting in its next collective, and Horovod's
own stall check cannot help when its background thread is itself blocked in MPI: the job would
hang, silent, until the walltime. Here a thread of each rank watches the steps; past the limit it
prints one line naming the rank, the step and how long, and exits the process with status 3,
without any shutdown that would wait for the others. The launcher (mpirun, srun
--kill-on-bad-exit, horovodrun) then ends the whole job, frozen ranks included. The watchdog never
writes a checkpoint: the newest one on disk stays the last good one.

The limit: `--watchdog-seconds S`, else 20 times the slowest step seen so far, at least 300 s.
Until the first step of this process ends (start-up, compilation, the first collectives) the
limit is at least 300 s whatever S is. `--watchdog-seconds 0` turns it off.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

from hvdtrain.report import say

FLOOR_SECONDS = 300.0
STEP_FACTOR = 20.0
EXIT_STALLED = 3
# After SIGTERM (scancel, or srun --kill-on-bad-exit ending the job because a rank failed), a rank
# that makes no progress for this long (or 3 x its slowest step) is waiting in a collective for a
# rank that is gone: it ends itself then, not at Slurm's SIGKILL KillWait later (30-60 s at sites).
# A healthy rank goes on stepping to the stop vote and writes its checkpoint meanwhile.
TERM_GRACE_SECONDS = 15.0
TERM_STEP_FACTOR = 3.0
EXIT_TERMINATED = 143  # 128 + SIGTERM, as if the signal had ended it
WRITING = "writing a checkpoint"  # beat(where=WRITING) while rank 0 writes (checkpoint.Writer): no grace cut short
AT_CHECKPOINT = "at a checkpoint"  # a checkpoint's collectives, where a rank may wait for one that is gone


class _SignalWatcher:
    """SIGTERM seen by a thread as it arrives: the main thread's own handler runs only between
    Python bytecodes, never while it waits inside a collective (Horovod's, MPI's, NCCL's). The
    C-level handler writes each signal's number to a pipe (signal.set_wakeup_fd), read here; the
    pipe another part of the process set before goes on receiving them."""

    def __init__(self):
        self.terminated_at: float | None = None
        read, write = os.pipe()
        os.set_blocking(write, False)
        self.previous = signal.set_wakeup_fd(write)  # the main thread only: the caller checks
        threading.Thread(target=self._read, args=(read,), name="hvdtrain-signals", daemon=True).start()

    def _read(self, fd: int) -> None:
        while True:
            try:
                received = os.read(fd, 64)
            except OSError:
                return
            if self.previous >= 0:
                try:
                    os.write(self.previous, received)
                except OSError:
                    pass
            if signal.SIGTERM in received and self.terminated_at is None:
                self.terminated_at = time.monotonic()


_watcher: _SignalWatcher | None = None


def _signal_watcher() -> _SignalWatcher | None:
    global _watcher
    if _watcher is None and threading.current_thread() is threading.main_thread():
        _watcher = _SignalWatcher()
    return _watcher


class Watchdog:
    def __init__(self, limit_seconds: float | None, prog: str, rank: int, world_size: int):
        self.fixed = limit_seconds
        self.prog, self.rank, self.world_size = prog, rank, world_size
        self.last_beat = time.monotonic()
        self.step: int | None = None       # the step of the last beat; None: none timed yet
        self.first_step_done = False
        self.slowest_step = 0.0
        self.where = "starting up"
        self._stop = threading.Event()
        self._thread = None
        self.signals = _signal_watcher() if self.enabled else None
        if self.enabled:
            self._thread = threading.Thread(target=self._watch, name="hvdtrain-watchdog", daemon=True)
            self._thread.start()

    @property
    def enabled(self) -> bool:
        return self.fixed != 0

    def limit(self) -> float:
        if self.fixed:
            return self.fixed if self.first_step_done else max(self.fixed, FLOOR_SECONDS)
        return max(FLOOR_SECONDS, STEP_FACTOR * self.slowest_step)

    def beat(self, step: int | None = None, where: str | None = None) -> None:
        """A step ended (`step`), or other progress (validation batches, a checkpoint: `where`)."""
        now = time.monotonic()
        if step is not None:
            if self.step is not None and step == self.step + 1:
                self.slowest_step = max(self.slowest_step, now - self.last_beat)
            self.first_step_done = True
            self.step, self.where = step, f"after step {step}"
        else:
            self.step = None  # the next interval is not a step's time
            self.where = where or self.where
        self.last_beat = now

    def stop(self) -> None:
        self._stop.set()

    def _terminated_and_stuck(self) -> float | None:
        """Seconds since SIGTERM without progress, when that is over the grace; else None."""
        since = self.signals.terminated_at if self.signals is not None else None
        if since is None or self.where == WRITING:
            return None
        waited = time.monotonic() - max(since, self.last_beat)
        return waited if waited > max(TERM_GRACE_SECONDS, TERM_STEP_FACTOR * self.slowest_step) else None

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            stuck = self._terminated_and_stuck()
            if stuck is not None:
                say(f"{self.prog}: error [rank {self.rank}/{self.world_size}]: SIGTERM, then no progress for "
                    f"{stuck:.0f} s ({self.where}): this rank waits in a collective for a rank that is gone (the first "
                    f"failure is another rank's line; the launcher is ending the job); ending this rank now, not at "
                    f"the launcher's SIGKILL (Slurm's KillWait); the newest checkpoint is unchanged", sys.stderr)
                os._exit(EXIT_TERMINATED)
            waited, limit = time.monotonic() - self.last_beat, self.limit()
            if waited > limit:
                how = "--watchdog-seconds" if self.fixed else f"20 x the slowest step, at least {FLOOR_SECONDS:.0f} s"
                say(f"{self.prog}: error [rank {self.rank}/{self.world_size}]: no progress for {waited:.0f} s "
                      f"({self.where}; limit {limit:.0f} s: {how}): a rank is frozen or blocked (this one, or one "
                      f"this one waits for in a collective); ending the job, the newest checkpoint is unchanged",
                    sys.stderr)
                os._exit(EXIT_STALLED)


def horovod_stall_settings(limit_seconds: float | None) -> dict[str, str]:
    """Horovod's own stall shutdown, a backstop behind the watchdog (and with it turned off): a
    collective some ranks joined and others did not for this long shuts Horovod down."""
    return {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": f"{max(900.0, 2 * (limit_seconds or 0)):.0f}"}
