"""Rank 0's checkpoint writes, one at a time, inline or on a thread of their own (Writer)."""
from __future__ import annotations

import os
import threading
import time

from hvdtrain import test_hooks
from hvdtrain.watchdog import WRITING
from hvdtrain.checkpoint import files


class Writer:
    """Rank 0's checkpoint writes, one at a time: inline, or (`background`) on a thread of their
    own while the next steps run. The caller hands over a state already copied to host memory;
    the thread serialises it, signs it and renames it into place (atomic_write), then prunes. A
    second write waits for the first to end, never overlaps it. A failed write is kept, with the
    newest checkpoint at that moment, for the caller to say on every rank (`error`): never lost in
    the thread."""

    # Seconds each write sleeps after its first bytes: a slow parallel file system, for the test
    # that kills rank 0 in the middle of a background write.
    SLOW_WRITE = test_hooks.slow_checkpoint_write()

    def __init__(self, say=None):
        # Told while rank 0 writes (its own bytes, on a slow file system, may take long) and when
        # it is done: the watchdog holds its SIGTERM grace off then, never while a collective waits.
        self.watchdog = None
        self.thread: threading.Thread | None = None
        self.failed: str | None = None  # the failed write's one line
        self.written: str | None = None  # the last path written, until say_written says it
        self.say = say or (lambda line: None)  # rank 0's log: "checkpoint PATH" once written

    def save(self, directory: str, capture, *, keep: int, background: bool = False) -> str | None:
        """Rank 0, every API's checkpoint: the write before this one ends first (its failure, or
        its path, said before anything else is written), then `capture()` -> (path, write(fileobj),
        signed) copies the state to host memory and write() writes it. The failure's one line, for
        the caller to broadcast to every rank, or None."""
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

    def say_written(self) -> None:
        if self.written and not self.busy():
            self.say(f"checkpoint {self.written}")
            self.written = None

    def write(self, path: str, write, *, signed: bool, keep: int, background: bool = False) -> None:
        """Write `path` (write(fileobj) serialises the state), then keep the newest `keep`.
        Inline, a failure raises OSError or the serialiser's error; in the background it is kept
        for `error()`."""
        self.wait()
        if self.SLOW_WRITE:
            write = self._slowed(write)
        if not background:
            self._write(path, write, signed, keep)
            return
        self.thread = threading.Thread(target=self._write_kept, args=(path, write, signed, keep),
                                       name="hvdtrain-checkpoint-writer", daemon=True)
        self.thread.start()

    def busy(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def wait(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None

    def error(self) -> str | None:
        """The failed write's line (once), or None."""
        failed, self.failed = self.failed, None
        return failed

    def _write(self, path, write, signed, keep):
        files.atomic_write(path, write, signed=signed)
        files.prune(os.path.dirname(path), keep)
        self.written = path

    def _write_kept(self, path, write, signed, keep):
        try:
            self._write(path, write, signed, keep)
        except BaseException as err:  # noqa: BLE001 - said by the caller on every rank
            self.failed = files.write_failure(os.path.dirname(path), err)

    def _slowed(self, write):
        def slowed(f):  # the temporary file exists: a kill meanwhile is a kill mid-write
            time.sleep(self.SLOW_WRITE)
            write(f)
        return slowed
