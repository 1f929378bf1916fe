"""Rank-0 side effects in one place: log lines, the progress bar, TensorBoard scalars.

Nothing here calls a collective, so it is safe to call from rank 0 only. TensorBoard scalars go
through a writer with `add_scalar(name, value, step)`, `flush()` and `close()`: by default
torch's SummaryWriter; the TF trainer passes `writer_factory` so that it never imports torch.
"""
from __future__ import annotations

import sys
import time
import types


def say(line: str, stream=None) -> None:
    """One log line in one write. Under PYTHONUNBUFFERED `print` writes the text and its newline
    separately, and mpirun's --tag-output tags each piece it reads, so a line could end with a
    stray `[1,0]<stdout>:` and its newline arrive on the next one."""
    stream = stream or sys.stdout
    stream.write(line + "\n")
    stream.flush()


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

        # mininterval keeps a non-tty log (sbatch's %j.out) to a few lines per minute.
        return tqdm(total=total, desc=desc, disable=not self.is_rank0, file=sys.stderr,
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
