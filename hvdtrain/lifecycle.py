"""One run's lifecycle for every entry point: the start (`start_rank`); then the epoch trainer
(hvdtrain/trainer.py) and hvdtrain.tf's `Job` (Keras's fit, through its Guard callback) are a
`Lifecycle`, hvdtrain.torch.loop's `Run` and the tape loop's `TapeJob` a `LoopLifecycle` (the
user's loop calls step_done, should_stop, save, finish). Each adds only how its framework reads
and writes its state.

- where the run is: the position (epoch, batches stepped in it, steps in all), the batching a
  resumed epoch was cut into, where interval checkpoints go (`saving_to`);
- the stop vote, every rank at the same step: the stop signal any rank got (SIGTERM outweighs
  SIGUSR1), whether rank 0's clock says an interval checkpoint is due, whether rank 0's
  background write runs or failed (meter.Votes, by name); a failed write ends every rank there;
- the checkpoint: written once, by rank 0, at the position a resume starts from (the next epoch,
  or a stopped epoch's unstepped batches); a failure ends every rank with rank 0's line;
- the end: the requeue after Slurm's warning (runtime.requeue_after_stop), a write in flight
  finished, the watchdog stopped, the backend shut down.

The epoch trainer's stop vote rides in its step's reduction (hvdtrain/meter.py, with meter.Votes);
Lightning's guards (hvdtrain/lightning/guards.py) vote in the strategy's reduction, with
meter.Votes and runtime.requeue_after_stop.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from hvdtrain import checkpoint as ckpt
from hvdtrain.cluster import tuning
from hvdtrain.cluster.env import ClusterEnv
from hvdtrain.cluster.netsockets import loopback_settings
from hvdtrain.errors import UsageError
from hvdtrain.meter import Votes
from hvdtrain.runtime import StopRequest, requeue_after_stop, threads_per_rank
from hvdtrain.watchdog import AT_CHECKPOINT, Watchdog


@dataclasses.dataclass(frozen=True)
class Started:
    """A rank's start: the launcher's environment, its threads, its watchdog, the network settings
    applied, its backend."""
    env: ClusterEnv
    threads: int
    watchdog: Watchdog
    network: dict
    backend: object


def start_rank(cfg, prog: str, set_threads, start_backend) -> Started:
    """Every entry point's start, in this order: the launcher's environment read once (a backend
    may export torchrun's variables for its own rendezvous later, which must not change what the
    run reports as its launcher), this rank's threads (cfg.threads_per_rank, or its share of the
    node's cores), the watchdog, armed before the backend starts (a rank missing at hvd.init() is
    a hang too), Open MPI's and Gloo's settings (all ranks on this host: off the network, before
    MPI_Init; the user's own win), then start_backend(cfg) (hvd.init(), init_process_group, ...)."""
    env = ClusterEnv.from_environ()
    threads = threads_per_rank(cfg.threads_per_rank, env.local_world_size)
    watchdog = Watchdog(cfg.watchdog_seconds, prog, env.rank, env.world_size)
    set_threads(threads)  # before the framework's first op
    network = tuning.apply(loopback_settings(env))
    return Started(env, threads, watchdog, network, start_backend(cfg))


class Lifecycle:
    """What every one of them has: the stop request, the position, rank 0's writer and the
    interval, the vote, the write, the requeue."""

    # What runs rank 0's background writes (checkpoint.Writer's default: a thread); a framework's
    # own (torch: a writer process, hvdtrain/torch/checkpoint_writer.py).
    background_writes = None

    def __init__(self, backend, cfg, job_id: str | None, watchdog=None):
        self.backend, self.cfg, self.job_id = backend, cfg, job_id
        self.rank, self.local_rank, self.world_size = backend.rank, backend.local_rank, backend.world_size
        self.is_rank0 = self.rank == 0
        self.stop = StopRequest()  # from now on SIGUSR1/SIGTERM are remembered for the next vote
        self.position = ckpt.Position()
        self.checkpoint_interval = ckpt.Interval(cfg.checkpoint_interval, self.is_rank0)  # checkpoint_every=
        # Rank 0's checkpoint writes (interval ones in the background).
        self.writer = ckpt.Writer(say=self.log, background=self.background_writes() if self.background_writes else None)
        self.watchdog = None
        if watchdog is not None:
            self.watch(watchdog)
        if self.is_rank0 and any(cfg.checkpoint_interval) and cfg.checkpoint_write == "background":
            self.writer.prepare()

    def log(self, line: str, every_rank: bool = False) -> None:
        raise NotImplementedError

    def watch(self, watchdog) -> None:
        """The watchdog whose heartbeat the steps and checkpoint writes beat."""
        self.watchdog = self.writer.watchdog = watchdog

    def vote(self, interval: ckpt.Interval | None = None) -> Votes:
        """Every rank, at the same step: what each saw, summed (meter.Votes). A background write
        that failed ends every rank here, with rank 0's line."""
        interval = interval or self.checkpoint_interval
        mine = Votes.mine(self.stop.signal_name, interval.vote(), self.writer.state())
        votes = Votes.from_array(self.backend.allreduce_sum(np.array(mine.to_array(), dtype=np.float64), "stop_vote"))
        self.heard_from_writer(votes.writing, votes.write_failed)
        return votes

    def heard_from_writer(self, writing: float, write_failed: float) -> None:
        """Every rank, after a reduction that carried rank 0's writer state (Writer.state()): a
        background write that failed ends every rank here with rank 0's line; one that ended is said."""
        if write_failed:
            raise UsageError(self.backend.broadcast_object(self.writer.error(), "checkpoint_write_error"))
        if not writing:
            self.writer.say_written()

    def write(self, checkpoint_dir: str, capture, keep: int, background: bool = False) -> None:
        """Every rank: rank 0 writes what capture() returns, atomically; every rank learns how it went
        (a background write: that it started), and all end together on a failure."""
        error = self.writer.save(checkpoint_dir, capture, keep=keep, background=background) if self.is_rank0 else None
        error = self.backend.broadcast_object(error, "checkpoint_written")
        if error:
            raise UsageError(error)

    def requeue_if_asked(self, stopped_by: str | None) -> str | None:
        """Rank 0, after SIGUSR1 (Slurm's time-limit warning) only (runtime.requeue_after_stop): its line."""
        requeue = requeue_after_stop(stopped_by, self.job_id, self.is_rank0)
        if requeue:
            self.log(requeue)
        return requeue


class LoopLifecycle(Lifecycle):
    """The lifecycle of a loop the user writes (Run, TapeJob): its steps, its stop vote with the
    interval checkpoint, its checkpoints' position, its end. Keras's fit (Job) runs these through
    its Guard callback instead."""
    start_call = "start"  # the call whose checkpoint_every= asks for interval checkpoints
    handle = "run"        # what the user's code calls this object (its error lines name run.resume())

    def __init__(self, backend, cfg, job_id: str | None, watchdog=None):
        super().__init__(backend, cfg, job_id, watchdog)
        self.stopped_by: str | None = None  # the signal the vote agreed on
        self.batches_in_epoch = self.batching = self.resumed_batching = None  # batching: [ranks, batch size]
        self.saving_to = None  # (directory, model, optimizer) of resume(): where interval checkpoints go

    # ------------------------------------------------------------------ the steps
    def step_done(self) -> None:
        """After each optimizer step: the position, the watchdog's heartbeat. Not collective."""
        self.position = self.position.after_step()
        self.watchdog.beat(self.position.global_step)

    def should_stop(self) -> bool:
        """Did SIGUSR1/SIGTERM reach any rank? A vote: every rank stops at the same step, then
        saves. With checkpoint_every=, also the interval checkpoint, when one is due (the same step
        on every rank: a number of steps, or rank 0's clock, which votes here), written in the
        background; rank 0's writer (running, failed) rides in the same vote."""
        votes = self.vote()
        self.stopped_by = votes.stopped_by
        at = self.position
        mid_epoch = self.batches_in_epoch is None or at.step_in_epoch < self.batches_in_epoch
        if not self.stopped_by and self.checkpoint_interval.due(at.global_step, mid_epoch, votes.checkpoint_due > 0):
            if self.saving_to is None:
                raise UsageError(f"{self.start_call}(checkpoint_every=) writes into {self.handle}.resume()'s directory: "
                                 f"call {self.handle}.resume(checkpoint_dir, model, optimizer) before the loop")
            self._save(*self.saving_to, keep=3, background=True)
        if self.stopped_by:
            self.log(f"stopped by {self.stopped_by} in epoch {at.epoch + 1} after {at.step_in_epoch} batch(es)")
        return self.stopped_by is not None

    # ------------------------------------------------------------------ checkpoints
    def _save(self, checkpoint_dir: str, model, optimizer, keep: int, background: bool = False) -> None:
        """The framework's checkpoint of model and optimizer here (its `checkpoint(...)` call)."""
        raise NotImplementedError

    def resumed_at(self, status: dict) -> None:
        """Rank 0's checkpoint, read by every rank (checkpoint.resume_on_rank0's status): where the run is."""
        self.position = status["position"]
        self.resumed_batching = status.get("batching")
        self.log(f"resumed from {status['path']} at epoch {self.position.epoch + 1} after "
                 f"{self.position.step_in_epoch} batch(es)")

    def checkpoint(self, checkpoint_dir: str, average, capture, keep: int, background: bool = False) -> None:
        """Every rank: `average()` (BatchNorm statistics: every rank's, not rank 0's), then rank 0
        writes capture(at), at the position a resume starts from (the next epoch, or this one's
        unstepped batches after a stop or a break); the newest `keep` kept. background: while the
        next steps run (the state staged to host memory first; torch: written by a writer process,
        TensorFlow: on a thread); the next vote says its failure on every rank."""
        self.watchdog.beat(where=AT_CHECKPOINT)
        average()
        done = self.batches_in_epoch is not None and self.position.step_in_epoch >= self.batches_in_epoch
        at = self.position.next_epoch() if done else self.position
        self.write(checkpoint_dir, lambda: capture(at), keep, background)
        self.checkpoint_interval.written()
        self.watchdog.beat(where="after writing a checkpoint")

    # ------------------------------------------------------------------ the end
    def end(self) -> None:
        """Last, every rank: the requeue after SIGUSR1 (not after SIGTERM: scancel); a background
        write still running ends, its failure said on every rank; the watchdog stops; what the
        framework holds closes (`_close`); the backend shuts down."""
        self.requeue_if_asked(self.stopped_by)
        error = self.backend.broadcast_object(self.writer.finish() if self.is_rank0 else None, "last_write")
        self.watchdog.stop()
        self._close()
        self.backend.shutdown()
        if error:
            raise UsageError(error)

    def _close(self) -> None:
        """What the framework's loop holds until the end (the torch loaders' kept workers)."""
