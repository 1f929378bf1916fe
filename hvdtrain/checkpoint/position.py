"""Where a run is (Position), as a checkpoint stores it, and when the next interval checkpoint is due
(Interval)."""
from __future__ import annotations

import dataclasses
import time


@dataclasses.dataclass(frozen=True)
class Position:
    """Where a run is. A checkpoint stores it as keys at its top level (torch's state dict, TF's
    JSON meta): the first four unchanged since format 1, the last two only after a resize in the
    middle of an epoch (older checkpoints, without them, read as none). to_checkpoint and
    from_checkpoint convert."""
    epoch: int = 0            # epochs completed
    step_in_epoch: int = 0    # optimizer steps done in the current epoch
    global_step: int = 0      # optimizer steps done in all
    history: tuple = ()       # one record (a dict) per epoch ended
    # The current epoch's samples trained at other world sizes, ((world size, samples per rank),
    # ...), and the step at which this world size's order of the rest begins (datasets.rest_of_epoch).
    seen_before: tuple = ()
    order_start: int = 0

    @classmethod
    def from_checkpoint(cls, saved) -> "Position":
        return cls(saved["epoch"], saved["step_in_epoch"], saved["global_step"], tuple(saved["history"]),
                   tuple(tuple(run) for run in saved.get("seen_before", ())), saved.get("order_start", 0))

    def to_checkpoint(self) -> dict:
        resized = {"seen_before": [list(run) for run in self.seen_before], "order_start": self.order_start} \
            if self.seen_before else {}
        return {"epoch": self.epoch, "step_in_epoch": self.step_in_epoch, "global_step": self.global_step,
                "history": list(self.history), **resized}

    @property
    def steps_into_order(self) -> int:
        """The batches of this epoch's order (the data path's) already trained."""
        return self.step_in_epoch - self.order_start

    def after_step(self) -> "Position":
        return dataclasses.replace(self, step_in_epoch=self.step_in_epoch + 1, global_step=self.global_step + 1)

    def recorded(self, record: dict) -> "Position":
        return dataclasses.replace(self, history=(*self.history, record))

    def next_epoch(self) -> "Position":
        return dataclasses.replace(self, epoch=self.epoch + 1, step_in_epoch=0, seen_before=(), order_start=0)


class Interval:
    """--checkpoint-every's decision, taken alike on every rank: every N steps (the same step
    everywhere by construction), or every so many seconds of rank 0's clock, which alone votes
    (`vote()`, in a reduction every rank joins at the same step; `voted`: its outcome). Only in
    the middle of an epoch: the epoch's end has its own checkpoint."""

    def __init__(self, interval: tuple[int | None, float | None], is_rank0: bool):
        (self.steps, self.seconds), self.is_rank0 = interval, is_rank0
        self.written()

    def written(self) -> None:
        """A checkpoint was written now: the clock starts again."""
        self.last = time.monotonic()

    def vote(self) -> bool:
        return bool(self.seconds) and self.is_rank0 and time.monotonic() - self.last >= self.seconds

    def due(self, global_step: int, mid_epoch: bool, voted: bool) -> bool:
        if not mid_epoch:
            return False
        return global_step % self.steps == 0 if self.steps else bool(self.seconds) and voted
