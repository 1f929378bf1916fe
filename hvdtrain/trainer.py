"""What every hvdtrain trainer does the same way, whatever the framework: the start (threads,
backend, world size, reporter, stop signals, the launcher's environment read once), the epoch
loop, the per-step bookkeeping (hvdtrain/meter.py), the checkpoint restore on rank 0, the stop
vote and the result file.

A framework trainer (hvdtrain/torch/train.py, hvdtrain/tf/train.py) subclasses `EpochTrainer`
and implements the abstract hooks below; `EpochTrainer.__init__` runs the whole start in a fixed
order and asks it for the parts (device, data, model, checkpoint load and save, ...). Its backend
subclasses the framework's interface (hvdtrain/torch/backend.py, hvdtrain/tf/backend.py), which
extends the collectives of `hvdtrain.collectives.Collectives` that this module uses.

Whoever runs the steps drives the trainer through its loop API (public methods, below): this
class's `train()`, the TF loops (hvdtrain/tf/loops.py), or a backend that owns its loop
(Lightning's callback, hvdtrain/torch/lightning_module.py):

    steps = trainer.start_epoch()
    for each of the steps: trainer.before_step(); ...one step...; if trainer.step_done(stats): break
    train_metrics, stopped_by = trainer.epoch_steps_done()
    trainer.end_epoch(train_metrics, val_metrics, stopped_by)    # records, checkpoints
    result = trainer.finish(stopped_by)                          # once, after the last epoch
"""
from __future__ import annotations

import abc
import dataclasses
import socket
import time

import numpy as np

from hvdtrain import backends, options, recipes
from hvdtrain import checkpoint as ckpt
from hvdtrain.cluster.netsockets import exposed, listening
from hvdtrain.collectives import Collectives
from hvdtrain.config import TrainConfig
from hvdtrain.data.datasets import check_enough_samples
from hvdtrain.errors import UsageError, exit_at_once_on_uncaught_exception
from hvdtrain.lifecycle import Lifecycle, start_rank
from hvdtrain.meter import StepMeter, divergence
from hvdtrain.phases import PhaseClock, phases_summary, slowest_rank_line
from hvdtrain.report import Rank0Reporter
from hvdtrain.result_file import checksum_arrays, environment_fingerprint, library_versions, throughput_summary, write_json
from hvdtrain.runtime import decode_workers
from hvdtrain.watchdog import AT_CHECKPOINT


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """How many optimizer steps, from the data sizes (plan_steps)."""
    steps_per_epoch: int
    schedule_steps: int   # what the LR schedule spans: every epoch, whatever --steps says
    total_steps: int      # where this run stops: the schedule's end, or --steps
    train_size: int = 0   # samples an epoch draws from (a resize's rest of an epoch: their count)


def plan_steps(cfg: TrainConfig, train_size: int, val_size: int) -> StepPlan:
    """The step plan for cfg's ranks; too little data for them is a usage error, found alike on
    every rank before any collective."""
    if cfg.validates:
        check_enough_samples(val_size, cfg.world_size, "the validation set")
    check_enough_samples(train_size, cfg.world_size, "the training set")
    per_rank, per_step = train_size // cfg.world_size, cfg.batch_size * cfg.batches_per_allreduce
    steps_per_epoch = per_rank // per_step  # drop_last: every rank runs as many steps
    if steps_per_epoch == 0:
        raise UsageError(f"each of the {cfg.world_size} ranks gets {per_rank} training samples, fewer than "
                         f"one step's {per_step} (--batch-size x --batches-per-allreduce)")
    # The schedule spans all epochs; --steps only stops early (a run stopped by --steps and
    # resumed follows the same LR curve as one that never stopped).
    schedule_steps = cfg.epochs * steps_per_epoch
    return StepPlan(steps_per_epoch, schedule_steps, min(schedule_steps, cfg.steps) if cfg.steps else schedule_steps,
                    train_size)


class EpochTrainer(Lifecycle, abc.ABC):
    framework = "?"
    prog = "hvdtrain"
    # False: the loss is the user's, and the steps' "correct" counts nothing (no accuracy reported).
    reports_accuracy = True
    # What writes TensorBoard scalars (hvdtrain/report.py); None: torch's SummaryWriter.
    tensorboard_writer = None
    sample_unit = "img"  # what the rates count: "samples" for a user's vectors (_build_data says)

    def __init__(self, cfg: TrainConfig):
        """The whole start, on every rank, in this order; the framework trainer's hooks supply
        the parts. A subclass that needs more arguments sets them before calling this."""
        self._start_backend(cfg)
        self.reporter = Rank0Reporter(self.is_rank0, None, self.prog)
        # The stop request, the position, rank 0's writer, --checkpoint-every's interval: the
        # lifecycle every entry point shares (hvdtrain/lifecycle.py).
        Lifecycle.__init__(self, self.backend, self.cfg, self.env.job_id, self.watchdog)
        self._said_data_bound = False  # the input-bound line: once a run
        self.writing = False  # every rank: rank 0 writes a checkpoint in the background now
        self._check_outputs()
        self.loss_reference: float | None = None  # what --divergence-factor multiplies
        self.listeners: dict[int, list[str]] = {}  # rank -> addresses beyond loopback (_log_start)
        self.resized: str | None = None  # how a resume with --allow-resize changed the position
        self.meter = StepMeter(self.backend, self.reporter, lambda: self.stop.signal_name, self._current_lr,
                               self.cfg.log_interval, self.cfg.warmup_steps,
                               self.cfg.batch_size * self.cfg.batches_per_allreduce, self._check_divergence,
                               self._stats_to_host)
        self.meter.checkpoint_vote = self.checkpoint_interval.vote
        self.device_name = self._setup_device()
        self.plan = plan_steps(self.cfg, *self._build_data())
        self._build_model()
        resumed_from, saved = self._restore_on_rank0()
        self._wrap_and_broadcast(saved, resumed=resumed_from is not None)
        # Each rank's weights as training starts (resumed, then rank 0's broadcast): in the result
        # file beside the final ones, the evidence that every rank, and a resume, started from them.
        self.start_checksum = checksum_arrays(self._state_arrays())
        self._open_tensorboard()
        self._use_phase_clock(self._phase_clock())
        self._log_start(resumed_from)

    def _start_backend(self, cfg: TrainConfig) -> None:
        """Threads, watchdog and network settings, then the backend (lifecycle.start_rank); the
        ranks agree on cfg."""
        exit_at_once_on_uncaught_exception()
        started = start_rank(cfg, self.prog, self._set_threads, backends.start)  # hvdtrain/lifecycle.py
        self.env, self.threads, self.watchdog = started.env, started.threads, started.watchdog
        self.network = started.network
        self.backend: Collectives = started.backend  # hvd.init(), init_process_group, ...
        self.cfg = cfg.with_world_size(self.backend.world_size)
        if self.cfg.num_workers is None:  # the decode workers follow the cores the job gave this rank
            self.cfg = dataclasses.replace(self.cfg, num_workers=decode_workers(self.threads))
        self.rank, self.world_size = self.backend.rank, self.backend.world_size
        self.is_rank0 = self.rank == 0
        self._check_ranks_agree()

    def _open_tensorboard(self) -> None:
        """Rank 0 with --log-dir: from here on, scalars go to TensorBoard too (once the start has
        succeeded: a failed start leaves no event file)."""
        if self.cfg.log_dir and self.is_rank0:
            self.reporter = self.meter.reporter = Rank0Reporter(True, self.cfg.log_dir, self.prog,
                                                                writer_factory=self.tensorboard_writer)

    def _use_phase_clock(self, clock: PhaseClock | None) -> None:
        if clock is None:
            self.meter.phases.disable()
        else:
            self.meter.phases = clock

    def _check_ranks_agree(self) -> None:
        """Every rank's options, gathered before any training collective. Ranks given different
        options (an MPMD launch, a per-rank wrapper script) would otherwise hang in mismatched
        collectives or, worse, train to different weights and exit 0. Options declared per_rank
        (hvdtrain/config.py: local resources, outputs only rank 0 writes) may differ."""
        mine = options.shared(self.cfg)
        every = self.backend.allgather_object(mine, "options_agree")
        problems = []
        for key in mine:
            ranks_by_value: dict[str, list[int]] = {}
            for rank, theirs in enumerate(every):
                ranks_by_value.setdefault(repr(theirs.get(key)), []).append(rank)
            if len(ranks_by_value) > 1:
                problems.append(f"--{key.replace('_', '-')}: " + ", ".join(
                    f"{value} on rank{'s' if len(ranks) > 1 else ''} {','.join(map(str, ranks))}"
                    for value, ranks in ranks_by_value.items()))
        if problems:
            raise UsageError("the ranks were started with different options (every rank needs the same): "
                             + "; ".join(problems))

    # ------------------------------------------------------------------ hooks: the start, in order
    @abc.abstractmethod
    def _set_threads(self, threads: int) -> None:
        """Set the framework's CPU threads, before it runs its first op."""

    @abc.abstractmethod
    def _setup_device(self) -> str:
        """Choose this rank's device (the backend has started); its name, for the log and the result."""

    @abc.abstractmethod
    def _build_data(self) -> tuple[int, int]:
        """Build the datasets of cfg; (training samples, validation samples), for the step plan."""

    @abc.abstractmethod
    def _build_model(self) -> None:
        """Build the model (and what steps it: optimizer, loop) on every rank, seeded alike; the
        step plan (self.plan) is known."""

    @abc.abstractmethod
    def _load_checkpoint(self, path: str) -> tuple[dict, ckpt.Position, object]:
        """Rank 0: load the checkpoint at `path` into the model built; (its config, its position,
        what _wrap_and_broadcast restores once the model is wrapped, or None)."""

    @abc.abstractmethod
    def _wrap_and_broadcast(self, saved, resumed: bool) -> None:
        """Every rank: make the model and optimizer the backend's, restore `saved` (rank 0's
        load, None elsewhere), and start every rank from rank 0's weights (and optimizer state
        when `resumed`). self.position is the one training starts from."""

    @abc.abstractmethod
    def _phase_clock(self) -> PhaseClock | None:
        """The clock that times the phases of a step (hvdtrain/phases.py), or None where this
        trainer does not mark them."""

    def log(self, line: str, every_rank: bool = False) -> None:  # rank 0's reporter (the lifecycle's lines)
        self.reporter.info(line)

    def _loop_description(self) -> str:
        """What the start's log line adds about the loop (after the launcher)."""
        return ""

    def _start_lines(self) -> list[str]:
        """The start's lines the framework adds: how the batches are made, what was compiled."""
        return []

    # ------------------------------------------------------------------ hooks: the run
    @abc.abstractmethod
    def _train_epoch(self) -> tuple[dict, str | None]:
        """Run the rest of the current epoch through the loop API: (train metrics, stopped by)."""

    @abc.abstractmethod
    def _validate(self) -> dict:
        """val_loss, val_acc and val_count over the whole validation set, on every rank."""

    @abc.abstractmethod
    def _checkpoint_file(self) -> tuple[str, object, bool]:
        """Rank 0: (path, write(fileobj), signed) of the state at self.position: a background write
        stages it to host memory before the next steps change it (checkpoint.Writer's background)."""

    @abc.abstractmethod
    def _state_arrays(self) -> list:
        """The model's parameters and buffers (BatchNorm statistics) as float64 numpy arrays, for
        the per-rank checksum: ranks whose statistics diverge must not look alike."""

    @abc.abstractmethod
    def _average_statistics(self) -> None:
        """Every rank: replace the BatchNorm statistics by their mean over ranks (each rank's
        are of its own batches), so that validation, checkpoints and the result see one model."""

    @abc.abstractmethod
    def _current_lr(self) -> float:
        """The learning rate of the optimizer now."""

    def _result_extras(self) -> dict:
        return {}

    def _rank_extras(self) -> dict:
        """What this rank adds to its entry of the result's per-rank list."""
        return {}

    def _stats_to_host(self, stats):
        """A step's (loss sum, correct, count), or a sum of them, as a float64 numpy array."""
        return np.asarray(stats, dtype=np.float64)

    # ------------------------------------------------------------------ the loop API
    def start_epoch(self) -> int:
        """The steps to run now: the rest of the current epoch, within --steps."""
        at = self.position
        steps = min(self.plan.steps_per_epoch - at.step_in_epoch, self.plan.total_steps - at.global_step)
        self.meter.start_epoch(steps, at.global_step, f"epoch {at.epoch + 1}/{self.cfg.epochs}")
        return steps

    def before_step(self) -> None:
        """A step starts (after the warm-up steps, every rank starts the clock together)."""
        self.meter.before_step()

    def step_done(self, stats) -> bool:
        """A loop finished one optimizer step with (loss sum, correct, count): move on one
        position and let the meter count it; an interval checkpoint when one is due. True: every
        rank stops now."""
        self.position = self.position.after_step()
        self.watchdog.beat(self.position.global_step)
        stop = self.meter.after_step(self.position.global_step, stats)
        at = self.position
        # Not at an epoch's last step, whose checkpoint end_epoch writes anyway.
        mid_epoch = at.step_in_epoch < self.plan.steps_per_epoch and at.global_step < self.plan.total_steps
        voted = False
        if mid_epoch:  # the vote is taken here (at an epoch's end it waits for the next epoch's steps)
            voted, self.meter.checkpoint_due = self.meter.checkpoint_due, False
        if self.writing:
            self._check_background_write()
        if not stop and self.checkpoint_interval.due(at.global_step, mid_epoch, voted):
            # The position in the middle of the epoch, as a stop signal's checkpoint; by default
            # written in the background while the next steps run (--checkpoint-write).
            self._checkpoint(background=self.cfg.checkpoint_write == "background")
            self.checkpoint_interval.written()
        return stop

    def _check_background_write(self) -> None:
        """Every rank, after each step while rank 0 writes a checkpoint in the background: has it
        ended, and how? A failure (disk full, a read-only file system) ends every rank with rank 0's line
        at the next step, not at the next checkpoint; a small reduction, only while a write runs."""
        busy, failed = self.backend.allreduce_sum(np.array(self.writer.state(), dtype=np.float64), "checkpoint_write")
        self.heard_from_writer(busy, failed)
        self.writing = busy > 0

    def epoch_steps_done(self) -> tuple[dict, str | None]:
        """The epoch's steps are over, all or stopped: every rank stops the clock together.
        (This epoch's train metrics, the signal that stopped it or None.)"""
        return self.meter.end_epoch()

    def _check_divergence(self, loss: float) -> None:
        """The meter's check of each reduced loss: every rank sees the same value and stops here
        together, when it is not finite or above --divergence-factor x the run's first loss (the first
        step's; after a resume, the first epoch's mean: a trained model's loss is no yardstick).
        No checkpoint: its weights would be diverged too, and it would become the newest."""
        if self.loss_reference is None:
            history = self.position.history
            self.loss_reference = history[0]["train_loss"] if history else self.meter.first_loss
        problem = divergence(loss, self.loss_reference, self.cfg.divergence_factor, self.position.global_step,
                             "--divergence-factor")
        if problem is None:
            return
        newest = ckpt.latest_checkpoint(self.cfg.checkpoint_dir) if self.cfg.checkpoint_dir else None
        raise UsageError(f"{problem} (a lower --base-lr?); stopped without writing a checkpoint; the newest "
                         f"checkpoint is {newest or 'none'}")

    def _log_start(self, resumed_from: str | None):
        # What each rank listens on once its backend has started (Gloo, a TCPStore, gRPC), beyond
        # the loopback interface: said, and kept in the result file.
        placement = self.backend.allgather_object((self.rank, socket.gethostname(), self.device_name, self.threads,
                                                   exposed(listening())), "placement")
        self.listeners = {rank: addresses for rank, *_, addresses in placement}
        cfg = self.cfg
        self.reporter.info(f"{self.backend.name} on {self.world_size} rank(s) via {self.env.launcher}"
                           f"{self._loop_description()}; global batch {cfg.global_batch_size}, lr {cfg.lr:g}, "
                           f"{self.plan.steps_per_epoch} steps/epoch, {self.plan.total_steps} steps in all")
        for rank, host, device, threads, _ in placement:
            self.reporter.info(f"  rank {rank}: {host} {device} threads={threads}")
        # The options of this trainer only (TF's log has no --amp or --num-workers); the result
        # file keeps every field, as checkpoints do.
        others = options.not_of(type(cfg), self.framework)
        self.reporter.info(f"config: { {k: v for k, v in cfg.to_dict().items() if k not in others} }")
        self.reporter.info(f"recipe: {recipes.describe(cfg)}")
        self.reporter.info(f"backend: {self.backend.describe()}")
        for line in self._start_lines():
            self.reporter.info(line)
        heard = {rank: addresses for rank, addresses in self.listeners.items() if addresses}
        if self.network and not heard:
            self.reporter.info(f"every rank on this host: {self.network} (no listener beyond loopback)")
        for rank, addresses in heard.items():
            why = backends.get(cfg.framework, cfg.backend).exposed_because
            self.reporter.info(f"rank {rank} listens beyond loopback on {', '.join(addresses)}"
                               + (f": {why}" if why else ""))
        if resumed_from:
            self.reporter.info(f"resumed from {resumed_from} at epoch {self.position.epoch}, "
                               f"step {self.position.global_step}")
            if self.resized:
                self.reporter.info(self.resized)
        if not cfg.validates:
            why = ("synthetic data has random labels: validation loss and accuracy would mean nothing"
                   if cfg.dataset == "synthetic" else "--validation off")
            self.reporter.info(f"no validation pass ({why}; --validation on runs it)")

    def _restore_on_rank0(self) -> tuple[str | None, object]:
        """The newest checkpoint of cfg.checkpoint_dir that loads (checkpoint.resume_on_rank0: the
        one resume policy, damaged ones moved aside), through _load_checkpoint. A checkpoint of
        another global batch is refused unless --allow-resize, which recomputes the position
        (self.resized says how). Returns (the checkpoint's path or None, the state the load
        returned, on rank 0 only: what the framework restores after wrapping)."""
        loaded = {}  # rank 0: the state of the checkpoint that loads

        def load(path: str) -> dict:
            saved_config, position, loaded["state"] = self._load_checkpoint(path)
            resized = None
            changes = ckpt.resize_changes(saved_config, self.cfg)
            if changes and not self.cfg.allow_resize:
                raise ckpt.refuse_resize(path, changes)
            if changes:
                position, resized = ckpt.rescale_position(position, saved_config, self.cfg,
                                                          self.plan.steps_per_epoch, self.plan.train_size)
            return {"path": path, "position": position, "resized": resized}

        if not self.cfg.checkpoint_dir:
            return None, None
        status = ckpt.resume_on_rank0(self.backend, self.is_rank0, self.cfg.checkpoint_dir, load,
                                      self.reporter.info, "restore_status")
        if status.get("position") is not None:
            self.position = status["position"]
        self.resized = status.get("resized")
        return status.get("path"), loaded.get("state")

    def _check_outputs(self) -> None:
        """Before the first step, not after an epoch of work: rank 0 finds out whether every output
        can be written, removes temporary files a crash left, and every rank learns the answer."""
        error = None
        if self.is_rank0:
            error = ckpt.check_writable(self.cfg.checkpoint_dir, self.cfg.log_dir, self.cfg.result_json)
            if not error and self.cfg.checkpoint_dir:
                for path in ckpt.remove_stale_temporaries(self.cfg.checkpoint_dir):
                    self.reporter.info(f"removed {path}, left by an interrupted checkpoint write")
        error = self.backend.broadcast_object(error, "outputs_writable")
        if error:
            raise UsageError(error)

    def _checkpoint(self, background: bool = False) -> None:
        """Rank 0 writes a checkpoint (inline, or in the background); every rank learns whether
        it could, so that a failed write (disk full, quota) ends every rank with its line instead
        of a hang or a traceback. A write still in the background is waited for first: its end,
        or its failure, is said before anything else is written."""
        if not self.cfg.checkpoint_dir:
            return
        self.watchdog.beat(where=AT_CHECKPOINT)
        self._average_statistics()  # the checkpoint holds every rank's BatchNorm statistics, not rank 0's
        self.write(self.cfg.checkpoint_dir, self._checkpoint_file, self.cfg.keep_checkpoints, background)
        self.writing = background
        self.watchdog.beat(where="after writing a checkpoint")

    def train(self) -> dict:
        cfg = self.cfg
        stopped_by = None
        while self.position.epoch < cfg.epochs and self.position.global_step < self.plan.total_steps:
            train_metrics, stopped_by = self._train_epoch()
            # No validation after a stop signal: Slurm kills the job KillWait seconds after
            # SIGTERM, too soon for a validation pass (the resumed run validates at the epoch's end).
            val_metrics = self._validate() if cfg.validates and not stopped_by else {}
            self.end_epoch(train_metrics, val_metrics, stopped_by)
            if stopped_by:
                break
        return self.finish(stopped_by)

    def end_epoch(self, train_metrics: dict, val_metrics: dict, stopped_by: str | None) -> None:
        """The current epoch ended, complete or not: record it (unless stopped), move the position
        on and checkpoint."""
        at, steps_per_epoch = self.position, self.plan.steps_per_epoch
        epoch_done = at.step_in_epoch >= steps_per_epoch
        if not stopped_by:
            if not self.reports_accuracy:  # a loss of the user's: the step's "correct" counted nothing
                train_metrics = {**train_metrics, "train_acc": None}
            record = {"epoch": at.epoch + 1 if epoch_done else at.epoch + at.step_in_epoch / steps_per_epoch,
                      "global_step": at.global_step, **train_metrics, **val_metrics,
                      # Since this process's first step (a resumed run counts from its restart):
                      # the scaling study's time per epoch and time to an accuracy.
                      "elapsed_s": time.monotonic() - (self.meter.first_step_at or time.monotonic())}
            self.position = self.position.recorded(record)
            rate = self.meter.images_per_sec
            # None until a step after the untimed ones was timed (a short run: --steps 2)
            speed = f"{rate * self.world_size:.1f} {self.sample_unit}/s" if rate else f"{self.sample_unit}/s n/a"
            def acc(value):
                return "" if value is None else f" acc {value:.4f}"
            val = (f"val loss {val_metrics['val_loss']:.4f}{acc(val_metrics['val_acc'])} "
                   f"({val_metrics['val_count']} samples)" if val_metrics else "no validation")
            self.reporter.info(f"epoch {record['epoch']:.2f}: train loss {train_metrics['train_loss']:.4f}"
                               f"{acc(train_metrics['train_acc'])} | {val} | {speed}")
            if val_metrics:
                self.reporter.scalars(at.global_step, {"val/loss": val_metrics["val_loss"],
                                                       **({"val/acc": val_metrics["val_acc"]}
                                                          if val_metrics["val_acc"] is not None else {})})
        self._report_phases()
        if epoch_done:
            self.position = self.position.next_epoch()
        self._checkpoint()

    def _report_phases(self) -> None:
        """Rank 0 names the slowest rank of the epoch and its phase (hvdtrain/phases.py): every
        rank reports the same throughput in synchronous training, so the slow one is only seen here."""
        mine = self.meter.epoch_phases_ms
        ranks = self.backend.allgather_object({"rank": self.rank, "host": socket.gethostname(),
                                               "phases_ms": mine}, "epoch_phases")
        if mine is None or not self.is_rank0:
            return
        self.reporter.info(f"step time: {phases_summary(mine)} on rank 0; {slowest_rank_line(ranks)}")
        self.reporter.scalars(self.position.global_step, {f"phases_ms/{phase}": ms for phase, ms in mine.items()})
        self._say_if_data_bound(ranks)

    DATA_BOUND_SHARE = 0.2  # of a step spent waiting for data: said once, with the remedy

    def _say_if_data_bound(self, ranks: list[dict]) -> None:
        """Once a run, when a rank waited for its input a large share of its steps (as Lightning
        warns of too few DataLoader workers): the device was idle that long."""
        if self._said_data_bound:
            return
        timed = [r for r in ranks if r["phases_ms"] and sum(r["phases_ms"].values()) > 0]
        if not timed:
            return
        worst = max(timed, key=lambda r: r["phases_ms"]["data"] / sum(r["phases_ms"].values()))
        data_ms, step_ms = worst["phases_ms"]["data"], sum(worst["phases_ms"].values())
        if data_ms / step_ms >= self.DATA_BOUND_SHARE:
            self._said_data_bound = True
            self.reporter.info(f"input-bound: rank {worst['rank']} waited {data_ms:.1f} of its {step_ms:.1f} ms a step "
                               f"({data_ms / step_ms:.0%}) for data; {self._data_remedy()}")

    def _data_remedy(self) -> str:
        return "give each rank more cores (--cpus-per-task)"

    def finish(self, stopped_by: str | None) -> dict:
        """After the last epoch (or a stop), every rank: the per-rank figures gathered, the result
        file written by rank 0, the backend shut down. Returns the result."""
        cfg, b = self.cfg, self.backend
        m = self.meter
        self._average_statistics()
        per_rank = b.allgather_object({"rank": self.rank, "host": socket.gethostname(), "device": self.device_name,
                                       "threads": self.threads, "images_per_sec": m.images_per_sec,
                                       "timed_samples": m.timed_samples, "timed_seconds": m.timed_seconds,
                                       "timed_steps": m.timed_steps_total, "phases_ms": m.phases_ms(),
                                       "start_checksum": self.start_checksum,
                                       "param_checksum": checksum_arrays(self._state_arrays()),
                                       **self._rank_extras()}, "per_rank")
        env = self.env
        requeue = None
        if stopped_by:
            self.reporter.info(f"stopped by {stopped_by} at step {self.position.global_step}; checkpoint written")
            requeue = self.requeue_if_asked(stopped_by)
        result = {
            "framework": self.framework, **b.describe(), **self._result_extras(),
            "config": cfg.to_dict(), "world_size": self.world_size, "launcher": env.launcher, "ranks": per_rank,
            "throughput": throughput_summary([r["images_per_sec"] for r in per_rank], self.sample_unit)
            if all(r["images_per_sec"] for r in per_rank) else None,
            "final": self.position.history[-1] if self.position.history else None,
            "history": list(self.position.history),
            "loss_log": m.loss_log, "global_step": self.position.global_step, "epoch": self.position.epoch,
            "stopped_by": stopped_by, "requeue": requeue, "resized": self.resized, "network": self.network,
            "listening_beyond_loopback": self.listeners,
            "versions": library_versions(), "environment": environment_fingerprint(),
        }
        if cfg.result_json and self.is_rank0:
            write_json(cfg.result_json, result)
            self.reporter.info(f"result file {cfg.result_json}")
        if result["throughput"]:
            t = result["throughput"]
            self.reporter.info(f"throughput: {t['total_images_per_sec']:.1f} {self.sample_unit}/s in all, "
                               f"{t['min_rank_images_per_sec']:.1f} on the slowest of {self.world_size} rank(s): "
                               f"training samples per second, timed on every rank between barriers after "
                               f"{cfg.warmup_steps} warm-up step(s)")
        self.reporter.close()
        b.barrier()
        b.shutdown()
        self.watchdog.stop()
        return result
