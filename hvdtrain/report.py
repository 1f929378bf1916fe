"""Rank-0 side effects in one place: log lines, the progress bar, TensorBoard scalars.

Nothing here calls a collective, so it is safe to call from rank 0 only. TensorBoard scalars go
through a writer with `add_scalar(name, value, step)`, `flush()` and `close()`: by default
torch's SummaryWriter; the TF trainer passes `writer_factory` so that it never imports torch.
"""
from __future__ import annotations

import sys
import time
import types
import warnings


class _BarStream:
    """The progress bar's stream (stderr), knowing whether the bar left its line open: a bar
    redraws itself with a carriage return and no newline, and a line written then would be glued
    to it ("epoch 1/3: 48%|... loss=...]hvdtrain.torch: error ..."), a hundred characters in."""

    def __init__(self, stream):
        self.stream, self.mid_line = stream, False

    def write(self, text: str) -> None:
        if text:
            self.stream.write(text)
            self.mid_line = not text.endswith("\n")

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name):  # isatty, encoding, fileno: the stream's own
        return getattr(self.stream, name)

    def end_line(self) -> None:
        if self.mid_line:
            self.write("\n")
            self.flush()


_bar_stream: _BarStream | None = None


def end_bar_line() -> None:
    """End the progress bar's open line, if any, before anything else is written."""
    if _bar_stream is not None:
        _bar_stream.end_line()


def say(line: str, stream=None) -> None:
    """One log line in one write, on a line of its own. Under PYTHONUNBUFFERED `print` writes the
    text and its newline separately, and mpirun's --tag-output tags each piece it reads, so a line
    could end with a stray `[1,0]<stdout>:` and its newline arrive on the next one."""
    end_bar_line()
    stream = stream or sys.stdout
    stream.write(line + "\n")
    stream.flush()


def _warnings_on_their_own_line() -> None:
    """Python's warnings (torch's, a library's) also start on a line of their own."""
    if getattr(warnings.showwarning, "hvdtrain", False):
        return
    shown = warnings.showwarning

    def showwarning(*args, **kwargs):
        end_bar_line()
        shown(*args, **kwargs)

    showwarning.hvdtrain = True
    warnings.showwarning = showwarning


class Rank0Reporter:
    def __init__(self, is_rank0: bool, log_dir: str | None = None, prog: str = "hvdtrain",
                 writer_factory=None):
        self.is_rank0 = is_rank0
        self.prog = prog
        self._tb = None
        if is_rank0 and log_dir:
            self._tb = (writer_factory or _torch_summary_writer)(log_dir)

    def info(self, msg: str) -> None:
        if self.is_rank0:
            say(f"[{time.strftime('%H:%M:%S')}] {self.prog}: {msg}")

    def progress(self, total: int, desc: str):
        from tqdm import tqdm

        global _bar_stream
        if _bar_stream is None or _bar_stream.stream is not sys.stderr:
            _bar_stream = _BarStream(sys.stderr)
            _warnings_on_their_own_line()
        # mininterval keeps a non-tty log (sbatch's %j.out) to a few lines per minute.
        return tqdm(total=total, desc=desc, disable=not self.is_rank0, file=_bar_stream,
                    mininterval=5.0, dynamic_ncols=True, leave=False)

    def scalars(self, step: int, values: dict) -> None:
        if self._tb is not None:
            for name, value in values.items():
                self._tb.add_scalar(name, value, step)
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def _torch_summary_writer(log_dir: str):
    # TensorBoard's writer imports all of TensorFlow when it is installed (seconds per rank, and
    # its log noise) unless `tensorboard.compat.notf` is importable, in which case it uses its own
    # stub (see tensorboard/compat/__init__.py). The scalars written are the same.
    sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir)
