"""`Guards`: hvdtrain's guards for a Lightning run, as one callback (added by
HorovodStrategy unless `guards=False`; under another strategy, pass it in `callbacks=`).

    trainer = pl.Trainer(strategy="horovod", callbacks=[Guards(checkpoint_every="30m")])

- Stop signals: Slurm's SIGUSR1 (`#SBATCH --signal=USR1@600`) or SIGTERM (scancel, preemption)
  only set a flag; every rank votes at the same step (each `log_every_n_steps` optimizer steps),
  then every rank stops there and rank 0 writes one checkpoint. After SIGUSR1 rank 0 requeues the
  job, and Lightning resumes from that checkpoint when the requeued job calls `fit` again.
  (Lightning's own handler saves inside the signal handler, wherever each rank happens to be:
  under Horovod a collective out of step on one rank.)
- Checkpoints are Lightning's own files, written by `trainer.save_checkpoint` (rank 0, atomic),
  named as Lightning's Slurm resume looks for them: `hpc_ckpt_N.ckpt` in `default_root_dir`,
  the newest `keep` kept. Under Slurm a `fit` without `ckpt_path` resumes from the newest; elsewhere
  `fit(..., ckpt_path="hpc")` does.
- `checkpoint_every`: also in the middle of epochs, every N optimizer steps ("2000") or every
  interval of rank 0's clock ("30m", agreed at a vote).
- The watchdog (hvdtrain/watchdog.py): a rank that makes no progress for too long ends the job
  with one line naming it.
- A training loss that is not finite, or above `divergence_factor` x the first one, stops every
  rank without a checkpoint (the newest stays the last good one), in one line.
- Each epoch, rank 0 prints each rank's step time split into data, compute (forward, backward;
  under Horovod the gradients' wait apart as sync) and optimizer, names a slow rank, and says
  once when ranks wait for their input (too few DataLoader workers or cores).
"""
from __future__ import annotations

import os
import re
import time

import lightning.pytorch as pl
import torch

from hvdtrain import checkpoint as ckpt
from hvdtrain.cluster.env import ClusterEnv
from hvdtrain.config import TrainConfig
from hvdtrain.meter import Votes, divergence
from hvdtrain.errors import UsageError
from hvdtrain.phases import PHASES, phases_summary, slowest_rank_line
from hvdtrain.report import say
from hvdtrain.runtime import StopRequest, requeue_after_stop
from hvdtrain.watchdog import AT_CHECKPOINT, Watchdog

PROG = "hvdtrain.lightning"
HPC_NAME = re.compile(r"^hpc_ckpt_(\d+)\.ckpt$")
DATA_BOUND_SHARE = 0.2  # of a step spent waiting for the next batch: said once, with the remedy


def hpc_checkpoints(directory: str) -> list[tuple[int, str]]:
    """(N, path) of the hpc_ckpt_N.ckpt files in `directory`, oldest first."""
    if not os.path.isdir(directory):
        return []
    found = [(int(m.group(1)), os.path.join(directory, name))
             for name in os.listdir(directory) if (m := HPC_NAME.match(name))]
    return sorted(found)


class Guards(pl.Callback):
    def __init__(self, checkpoint_every: str | int | None = None, watchdog_seconds: float | None = None,
                 divergence_factor: float = 1000.0, keep: int = 3, vote_every_n_steps: int | None = None):
        # The options' own checks (hvdtrain/config.py), as the command line's.
        cfg = TrainConfig(checkpoint_every=None if checkpoint_every is None else str(checkpoint_every),
                          checkpoint_dir="the trainer's default_root_dir", watchdog_seconds=watchdog_seconds,
                          divergence_factor=divergence_factor)
        self.interval_spec = cfg.checkpoint_interval
        self.watchdog_seconds, self.divergence_factor, self.keep = watchdog_seconds, divergence_factor, keep
        self.vote_every_n_steps = vote_every_n_steps
        self.stopped_by: str | None = None
        self.watchdog = None
        self.stop = None
        self.first_loss: float | None = None
        self._said_data_bound = False
        # Seconds waited so far for the gradients' reduction, where the strategy measures it apart
        # (HorovodStrategy sets this): the breakdown's sync. Otherwise inside compute.
        self.gradient_wait_seconds = lambda: 0.0

    # ------------------------------------------------------------------ start and end
    def on_fit_start(self, trainer, pl_module) -> None:
        self.rank, self.world_size, self.is_rank0 = trainer.global_rank, trainer.world_size, trainer.is_global_zero
        self.directory = str(trainer.default_root_dir)
        self.every = self.vote_every_n_steps or trainer.log_every_n_steps or 50
        self.interval = ckpt.Interval(self.interval_spec, self.is_rank0)
        self.watchdog = Watchdog(self.watchdog_seconds, PROG, self.rank, self.world_size)
        self.stopped_by = None

    def on_train_start(self, trainer, pl_module) -> None:
        # Lightning installs its signal handlers just before the loop: hvdtrain's replace them
        # for the run (Lightning restores its predecessors' at teardown).
        self.stop = StopRequest()
        self.steps_since_vote = 0
        self.window = torch.zeros(2, dtype=torch.float64, device=trainer.strategy.root_device)
        self.on_train_epoch_start(trainer, pl_module)  # a resume in the middle of an epoch starts no epoch

    def on_fit_end(self, trainer, pl_module) -> None:
        job_id = ClusterEnv.from_environ().job_id  # as the trainer requeues
        requeue = requeue_after_stop(self.stopped_by, job_id, self.is_rank0)
        if requeue:
            self._log(requeue)
        self._end()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._end()

    def _end(self) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()

    def _log(self, line: str) -> None:
        if self.is_rank0:
            say(f"{PROG}: {line}")

    # ------------------------------------------------------------------ each epoch: the time breakdown
    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.timed_steps = 0
        self.batch_end_at = None  # the epoch's first batch (the loader's start) is not timed
        self.sync_at_start = self.gradient_wait_seconds()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        now = time.perf_counter()
        self.timing = self.batch_end_at is not None
        if self.timing:
            self.seconds["data"] += now - self.batch_end_at
        self.batch_start_at, self.before_step_at = now, None

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.before_step_at = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.perf_counter()
        if self.timing:
            sync = self.gradient_wait_seconds() - self.sync_at_start
            computed = (self.before_step_at or now) - self.batch_start_at
            self.seconds["compute"] += computed - sync
            self.seconds["sync"] += sync
            self.seconds["optimizer"] += now - (self.before_step_at or now)
            self.timed_steps += 1
        self.sync_at_start = self.gradient_wait_seconds()
        self.watchdog.beat(trainer.global_step)
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):  # kept on the device: read at the vote only
            self.window += torch.stack((loss.detach().double().reshape(()), loss.new_ones((), dtype=torch.float64)))
        if self.before_step_at is not None or not pl_module.automatic_optimization:
            self._after_optimizer_step(trainer)
        self.batch_end_at = time.perf_counter()
        self.seconds["other"] += self.batch_end_at - now if self.timing else 0.0

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if self.watchdog is not None:
            self.watchdog.beat(where="validating")

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        steps = max(1, self.timed_steps)
        mine = torch.tensor([self.seconds[p] * 1000.0 / steps for p in PHASES] + [float(self.timed_steps)],
                            dtype=torch.float64, device=trainer.strategy.root_device)
        gathered = trainer.strategy.all_gather(mine).reshape(-1, len(PHASES) + 1).cpu().tolist()
        if not self.is_rank0 or not self.timed_steps:
            return
        ranks = [{"rank": r, "host": "", "phases_ms": dict(zip(PHASES, row[:-1]))} for r, row in enumerate(gathered)]
        self._log(f"step time: {phases_summary(ranks[0]['phases_ms'])} on rank 0; {slowest_rank_line(ranks)}")
        worst = max(ranks, key=lambda r: r["phases_ms"]["data"] / max(1e-9, sum(r["phases_ms"].values())))
        data_ms, step_ms = worst["phases_ms"]["data"], sum(worst["phases_ms"].values())
        if not self._said_data_bound and step_ms > 0 and data_ms / step_ms >= DATA_BOUND_SHARE:
            self._said_data_bound = True
            self._log(f"input-bound: rank {worst['rank']} waited {data_ms:.1f} of its {step_ms:.1f} ms a step "
                      f"({data_ms / step_ms:.0%}) for data; more DataLoader workers (num_workers) or more cores "
                      f"per rank (--cpus-per-task)")

    # ------------------------------------------------------------------ the vote, stops and checkpoints
    def _after_optimizer_step(self, trainer) -> None:
        self.steps_since_vote += 1
        step = trainer.global_step
        steps, _ = self.interval_spec
        if self.steps_since_vote >= self.every:
            self._vote(trainer)
            if self.stopped_by:
                return
        if steps and step % steps == 0:
            self._log(f"checkpoint at step {step} (every {steps} steps): {self._save(trainer)}")

    def _vote(self, trainer) -> None:
        self.steps_since_vote = 0
        # The stop vote (meter.Votes: Lightning writes checkpoints itself, so no writer's state)
        # and the window's (loss sum, count), in one reduction.
        voted = Votes.mine(self.stop.signal_name, self.interval.vote()).to_array()
        mine = torch.cat((torch.tensor(voted, dtype=torch.float64, device=self.window.device), self.window))
        reduced = trainer.strategy.reduce(mine, reduce_op="sum").cpu().tolist()
        votes, (loss_sum, count) = Votes.from_array(reduced[:len(voted)]), reduced[len(voted):]
        self.window.zero_()
        if count:
            self._check_loss(loss_sum / count, trainer)
        self.stopped_by = votes.stopped_by  # scancel's SIGTERM wins: no requeue
        timed = votes.checkpoint_due > 0
        if self.stopped_by:
            path = self._save(trainer)
            self._log(f"stopped by {self.stopped_by} at step {trainer.global_step} (epoch {trainer.current_epoch}); "
                      f"checkpoint written: {path}")
            trainer.should_stop = True
        elif timed:
            self._log(f"checkpoint at step {trainer.global_step} (every {self.interval.seconds:g} s of rank 0's "
                      f"clock): {self._save(trainer)}")

    def _check_loss(self, loss: float, trainer) -> None:
        if self.first_loss is None:
            self.first_loss = loss
        problem = divergence(loss, self.first_loss, self.divergence_factor, trainer.global_step, "divergence_factor")
        if problem is None:
            return
        newest = hpc_checkpoints(self.directory)
        raise UsageError(f"{problem} (a lower learning rate?); stopped without writing a checkpoint; the newest "
                         f"checkpoint is {newest[-1][1] if newest else 'none'}")

    def _save(self, trainer) -> str:
        """Every rank: one checkpoint, written by rank 0; the newest `keep` kept. Its path."""
        self.watchdog.beat(where=AT_CHECKPOINT)  # rank 0's write itself: HorovodStrategy.save_checkpoint
        newest = hpc_checkpoints(self.directory) if self.is_rank0 else []
        number = trainer.strategy.broadcast(newest[-1][0] + 1 if newest else 1)
        path = os.path.join(self.directory, f"hpc_ckpt_{number}.ckpt")
        trainer.save_checkpoint(path, weights_only=False)  # rank 0 writes; every rank returns after it
        if self.is_rank0:
            for _, old in hpc_checkpoints(self.directory)[:-self.keep]:
                os.remove(old)
        self.interval.written()
        self.watchdog.beat(where="after writing a checkpoint")
        return path
