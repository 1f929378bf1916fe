"""The per-step bookkeeping every trainer does the same way, written once: metric sums, the
warm-up clock between barriers, the stop vote, the loss log, TensorBoard scalars and the
progress bar. The torch loop, the TF custom loop and the Keras `fit` callback all call it inline:

    meter.start_epoch(steps, first_step, label)
    for each step:
        meter.before_step()                       # after the warm-up steps: barrier, start the clock
        meter.phase("data")                       # the batch is here (hvdtrain/phases.py)
        ...one optimizer step, marking "compute", "sync", "optimizer"...
        if meter.after_step(global_step, stats):  # stats: (loss sum, correct, count) of the step
            break                                 # every rank got the same stop signal
    metrics, stopped_by = meter.end_epoch()       # barrier, stop the clock; the epoch's means

Why: metrics are reduced as (sum, count) at log intervals only, never as means of means and
never per batch, and the stop vote rides in the same allreduce, so every rank stops at the same
step and knows which signal stopped it. Every rank starts and stops the clock together
(barriers), so throughput is never rank 0's view alone.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable

import numpy as np

from hvdtrain.collectives import Collectives
from hvdtrain.phases import PhaseClock
from hvdtrain.test_hooks import injected_delay


@dataclasses.dataclass(frozen=True)
class Votes:
    """What every rank adds to a step's reduction, by name: the stop signal it saw, whether rank
    0's clock says an interval checkpoint is due, whether rank 0's background write is running or
    failed. Summed over ranks: a field above 0 is what some rank voted."""
    usr1: float = 0.0
    term: float = 0.0
    checkpoint_due: float = 0.0
    writing: float = 0.0
    write_failed: float = 0.0

    @classmethod
    def mine(cls, signal_name: str | None, checkpoint_due: bool = False,
             writer_state: tuple[bool, bool] = (False, False)) -> "Votes":
        return cls(float(signal_name == "SIGUSR1"), float(signal_name == "SIGTERM"), float(checkpoint_due),
                   *map(float, writer_state))

    def to_array(self) -> list[float]:
        return [getattr(self, f.name) for f in dataclasses.fields(self)]

    @classmethod
    def from_array(cls, values) -> "Votes":
        return cls(*map(float, values))

    @property
    def stopped_by(self) -> str | None:
        """The signal every rank agrees stopped the run: SIGTERM on any rank outweighs SIGUSR1."""
        return stop_reason(self.usr1, self.term)


def divergence(loss: float, reference: float, factor: float, step: int, option: str) -> str | None:
    """None while a reduced training loss is finite and at most `factor` x `reference` (the run's
    first loss; factor 0: no bound); else the stop's words, up to the remedy each caller adds.
    The torch and TF trainers' check and the Lightning guards' (every rank sees the same loss)."""
    if math.isfinite(loss) and not (factor and reference > 0 and loss > factor * reference):
        return None
    how = "" if not math.isfinite(loss) else f", over {factor:g} x the first loss {reference:.4g} ({option})"
    return f"the training loss is {loss:.4g} at step {step}{how}: training diverged"


def stop_reason(usr1_votes: float, term_votes: float) -> str | None:
    """The signal every rank agrees stopped the run: SIGTERM on any rank outweighs SIGUSR1."""
    return "SIGTERM" if term_votes > 0 else "SIGUSR1" if usr1_votes > 0 else None


class StepMeter:
    def __init__(self, backend: Collectives, reporter, signal_name: Callable[[], str | None],
                 current_lr: Callable[[], float], log_interval: int, warmup_steps: int, samples_per_step: int,
                 check_loss: Callable[[float], None] = lambda loss: None,
                 to_host: Callable[[object], np.ndarray] = lambda stats: np.asarray(stats, dtype=np.float64)):
        self.backend, self.reporter = backend, reporter
        self.signal_name, self.current_lr = signal_name, current_lr
        # Called with each reduced interval loss (the same on every rank); it may raise to stop
        # the run (the trainer's divergence check).
        self.check_loss = check_loss
        # The loop's step stats may stay on its device (a torch tensor on the GPU): they are added
        # up there and copied to the host (to_host) only when reduced, never once per step.
        self.to_host = to_host
        self.log_interval, self.warmup_steps, self.samples_per_step = log_interval, warmup_steps, samples_per_step
        self.steps_run = 0              # steps this process ran: the first warmup_steps are not timed
        self.first_step_at = None
        self.timed_seconds, self.timed_samples, self.timed_steps_total = 0.0, 0, 0
        # Where the timed steps' time goes (hvdtrain/phases.py): the trainer marks each phase's end
        # (and may replace this host clock by a device one before training).
        self.phases = PhaseClock()
        self.epoch_phases_ms: dict | None = None  # the last epoch's, per timed step
        self._phases_at_epoch_start = dict(self.phases.seconds)
        self.injected_delay = injected_delay(backend.rank)  # test-only: a rank made slow on purpose
        self.loss_log: list[list] = []  # [global step, mean loss over the interval]
        self.first_loss: float | None = None  # this process's first step's loss, over all ranks
        # This rank's vote for a timed checkpoint (the trainer's: rank 0's clock), and the outcome
        # of the last vote, the same on every rank.
        self.checkpoint_vote: Callable[[], bool] = lambda: False
        self.checkpoint_due = False

    def phase(self, name: str) -> None:
        """The trainer's mark: phase `name` of this step ends now (timed steps only)."""
        self.phases.mark(name)
        if name == "data" and self.injected_delay:
            time.sleep(self.injected_delay)  # counts as compute, as a slow GPU or node would

    def _note_epoch_phases(self) -> None:
        now = dict(self.phases.seconds)
        before, self._phases_at_epoch_start = self._phases_at_epoch_start, now
        if self.phases.enabled and self.timed_steps:
            self.epoch_phases_ms = {p: 1000.0 * (now[p] - before[p]) / self.timed_steps for p in now}

    def phases_ms(self) -> dict | None:
        """Milliseconds per timed step in each phase, this rank."""
        return self.phases.per_step_ms(self.timed_steps_total)

    @property
    def images_per_sec(self) -> float | None:
        return self.timed_samples / self.timed_seconds if self.timed_seconds else None

    def start_epoch(self, steps: int, first_step: int, label: str) -> None:
        """`steps` steps follow, the first of which makes the global step `first_step + 1`."""
        self.window = None              # loss sum, correct, count since the last reduction (device)
        self.totals = np.zeros(3)
        self.last_step = first_step + steps
        self.stopped_by, self.timing, self.timed_steps, self.t0 = None, False, 0, 0.0
        self.epoch_phases_ms = None
        self.bar = self.reporter.progress(steps, label)

    def before_step(self) -> None:
        if self.first_step_at is None:  # a run's elapsed time (history's elapsed_s) counts from here
            self.first_step_at = time.monotonic()
        if not self.timing and self.steps_run >= self.warmup_steps:
            self.backend.barrier()  # every rank starts the clock together
            self.timing, self.t0 = True, time.perf_counter()
            self.phases.start()

    def after_step(self, global_step: int, stats) -> bool:
        """Count one finished step (now at `global_step`) with its (loss sum, correct, count);
        at a log interval or the epoch's last step, reduce over ranks and hand the interval's
        loss to check_loss. True: stop now."""
        self.steps_run += 1
        self.timed_steps += self.timing
        stats = np.asarray(stats, dtype=np.float64) if isinstance(stats, (list, tuple)) else stats
        self.window = stats if self.window is None else self.window + stats
        self.bar.update(1)
        if self.first_loss is None:
            # The yardstick of the divergence stop (trainer.py): the loss before any update of
            # this run, as every rank sees it; the first interval's mean could already have diverged.
            first = self.backend.allreduce_sum(self.to_host(stats), "first_loss")
            self.first_loss = float(first[0] / max(1.0, first[2]))
        self.phases.mark("other")
        if global_step % self.log_interval and global_step != self.last_step:
            return False
        metrics = self.to_host(self.window)  # loss sum, correct, count
        reduced = self.backend.allreduce_sum(np.array([*metrics, *Votes.mine(self.signal_name(),
                                                                              self.checkpoint_vote()).to_array()]),
                                             "train_window")
        votes = Votes.from_array(reduced[len(metrics):])
        # One rank's clock (rank 0's) says a timed checkpoint is due: every rank knows it here, at
        # the same step.
        self.checkpoint_due = votes.checkpoint_due > 0
        self.phases.mark("sync")  # the metrics' reduction waits for every rank too
        self.totals += reduced[:3]
        self.window = None
        interval_loss = float(reduced[0] / max(1.0, reduced[2]))
        self.loss_log.append([global_step, interval_loss])
        self.reporter.scalars(global_step, {"train/loss": interval_loss, "train/lr": float(self.current_lr())})
        self.bar.set_postfix(loss=f"{interval_loss:.4f}")
        self.stopped_by = votes.stopped_by
        self.phases.mark("other")
        self.check_loss(interval_loss)
        return self.stopped_by is not None

    def end_epoch(self) -> tuple[dict, str | None]:
        self.bar.close()
        if self.timing:
            self.backend.barrier()
            self.phases.mark("sync")  # the epoch's closing barrier waits for the other ranks
            self.timed_seconds += time.perf_counter() - self.t0
            self.phases.stop()
            self.timed_steps_total += self.timed_steps
            self._note_epoch_phases()
            self.timed_samples += self.timed_steps * self.samples_per_step
        count = max(1.0, float(self.totals[2]))
        return ({"train_loss": float(self.totals[0]) / count, "train_acc": float(self.totals[1]) / count},
                self.stopped_by)
