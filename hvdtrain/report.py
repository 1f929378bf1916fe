"""Rank-0 side effects in one place: log lines, the progress bar, TensorBoard scalars.

Nothing here calls a collective, so it is safe to call from rank 0 only.
"""
from __future__ import annotations

import sys
import time


class Rank0Reporter:
    def __init__(self, is_rank0: bool, log_dir: str | None = None, prog: str = "hvdtrain"):
        self.is_rank0 = is_rank0
        self.prog = prog
        self._tb = None
        if is_rank0 and log_dir:
            from torch.utils.tensorboard import SummaryWriter  # tensorboard's writer; no TF needed

            self._tb = SummaryWriter(log_dir)

    def info(self, msg: str) -> None:
        if self.is_rank0:
            print(f"[{time.strftime('%H:%M:%S')}] {self.prog}: {msg}", flush=True)

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
