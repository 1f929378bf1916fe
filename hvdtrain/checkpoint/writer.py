"""Rank 0's checkpoint writes, one at a time: inline, or in the background (Writer), where a
framework may put its own background (torch: a writer process, hvdtrain/torch/checkpoint_writer.py)."""
from __future__ import annotations

import os
import threading
import time

from hvdtrain import test_hooks
from hvdtrain.watchdog import WRITING
from hvdtrain.checkpoint import files

# Seconds each write sleeps after its first bytes: a slow parallel file system, for the test that
# kills rank 0 in the middle of a background write.
SLOW_WRITE = test_hooks.slow_checkpoint_write()


def write_checkpoint(path: str, write, signed: bool, keep: int, slow: float = 0.0) -> None:
    """Write `path` atomically (write(fileobj) serialises the state), then keep the newest `keep`:
    what every write does, inline, on a thread or in another process."""
    if slow:
        def slowed(f, write=write):  # the temporary file exists: a kill meanwhile is a kill mid-write
            time.sleep(slow)
            write(f)
        write = slowed
    files.atomic_write(path, write, signed=signed)
    files.prune(os.path.dirname(path), keep)


class ThreadWrites:
    """Background writes on a thread of their own (TensorFlow's: the arrays already copied)."""

    def __init__(self):
        self.thread: threading.Thread | None = None
        self.failure: BaseException | None = None

    def prepare(self) -> None:
        """Nothing to start ahead: a thread is made for each write."""

    def start(self, path: str, write, signed: bool, keep: int, slow: float) -> None:
        self.failure = None

        def run():
            try:
                write_checkpoint(path, write, signed, keep, slow)
            except BaseException as err:  # noqa: BLE001 - said by the caller on every rank
                self.failure = err
        self.thread = threading.Thread(target=run, name="hvdtrain-checkpoint-writer", daemon=True)
        self.thread.start()

    def busy(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def wait(self) -> BaseException | None:
        """The write ended: its failure, or None."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        return self.failure

    def close(self) -> None:
        self.wait()


class Writer:
    """Rank 0's checkpoint writes, one at a time: inline, or (`background`) while the next steps
    run. A background write gets what capture() returned (torch: the live state, which its writer
    stages to host memory before it returns; TensorFlow: arrays already copied) and serialises,
    signs and renames it into place (atomic_write), then prunes. A second write waits for the
    first to end, never overlaps it. A failed write is kept, with the newest checkpoint at that
    moment, for the caller to say on every rank (`error`): never lost in the background."""

    def __init__(self, say=None, background=None):
        # Told while rank 0 writes (its own bytes, on a slow file system, may take long) and when
        # it is done: the watchdog holds its SIGTERM grace off then, never while a collective waits.
        self.watchdog = None
        self.background = background or ThreadWrites()
        self.in_flight: str | None = None  # the background write's path
        self.failed: str | None = None  # the failed write's one line
        self.written: str | None = None  # the last path written, until say_written says it
        self.say = say or (lambda line: None)  # rank 0's log: "checkpoint PATH" once written

    def save(self, directory: str, capture, *, keep: int, background: bool = False) -> str | None:
        """Rank 0, every API's checkpoint: the write before this one ends first (its failure, or
        its path, said before anything else is written), then `capture()` -> (path, write(fileobj),
        signed) and the write. The failure's one line, for the caller to broadcast to every rank,
        or None."""
        self._beat(WRITING)
        try:
            error = self.finish()
            if error:
                return error
            try:
                path, write, signed = capture()
                self.write(path, write, signed=signed, keep=keep, background=background)
            except Exception as err:  # noqa: BLE001 - said on every rank by the caller
                return files.write_failure(directory, err)
            self.say_written()
            return None
        finally:
            self._beat("after writing a checkpoint")

    def _beat(self, where: str) -> None:
        if self.watchdog is not None:
            self.watchdog.beat(where=where)

    def state(self) -> list[bool]:
        """[writing now, failed]: what a rank adds to the step's vote (never either off rank 0)."""
        return [self.busy(), self.failed is not None]

    def finish(self) -> str | None:
        """The write in flight ended: its failure's line, or None (its path said)."""
        self.wait()
        error = self.error()
        self.say_written()
        return error

    def prepare(self) -> None:
        """Rank 0, at the start of a run with interval checkpoints: the background made ready now
        (torch's writer process starts while the run starts, not at the first checkpoint)."""
        self.background.prepare()

    def close(self) -> None:
        """The last write ended (its outcome kept for finish()), the background's resources freed."""
        self.wait()
        self.background.close()

    def say_written(self) -> None:
        if self.written and not self.busy():
            self.say(f"checkpoint {self.written}")
            self.written = None

    def write(self, path: str, write, *, signed: bool, keep: int, background: bool = False) -> None:
        """Write `path`, then keep the newest `keep`. Inline, a failure raises OSError or the
        serialiser's error; in the background it is kept for `error()`."""
        self.wait()
        if not background:
            write_checkpoint(path, write, signed, keep, SLOW_WRITE)
            self.written = path
            return
        self.background.start(path, write, signed, keep, SLOW_WRITE)
        self.in_flight = path

    def busy(self) -> bool:
        if self.in_flight is not None and not self.background.busy():
            self.wait()  # ended: its outcome collected now, for the vote
        return self.in_flight is not None

    def wait(self) -> None:
        if self.in_flight is None:
            return
        failure = self.background.wait()
        if failure is not None:
            self.failed = files.write_failure(os.path.dirname(self.in_flight), failure)
        else:
            self.written = self.in_flight
        self.in_flight = None

    def error(self) -> str | None:
        """The failed write's line (once), or None."""
        failed, self.failed = self.failed, None
        return failed
