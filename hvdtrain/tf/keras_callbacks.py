"""hvdtrain's guards for your own Keras `model.fit`: a list of callbacks, plus the two calls that
must come before the model and the data.

    import hvdtrain.tf
    hvd = hvdtrain.tf.start(seed=0)      # Keras 2 for tf.keras, hvd.init(), this rank's GPU and threads, signals
    import tf_keras as keras             # Horovod's Keras callbacks drive Keras 2 (hvdtrain/tf/keras_compat.py)
    x, y = x[hvd.rank::hvd.world_size], y[hvd.rank::hvd.world_size]           # this rank's shard
    model.compile(optimizer=hvd.optimizer(keras.optimizers.legacy.SGD(0.05)), loss=...)  # gradients averaged
    callbacks = hvdtrain.tf.callbacks(model, checkpoint_dir="ckpt", warmup_epochs=1)      # resumes here
    model.fit(x, y, epochs=10, initial_epoch=callbacks.initial_epoch, callbacks=callbacks,
              verbose=2 if hvd.is_rank0 else 0)

    mpirun -np 2 python train.py         # srun --mpi=pmix -n 2 python train.py; horovodrun -np 2 python train.py

`callbacks(model, ...)` (every rank, model built and compiled): rank 0 loads the newest checkpoint
of `checkpoint_dir` that reads, then every rank takes rank 0's weights and optimizer state;
`.initial_epoch` is where fit must start. The list holds Horovod's BroadcastGlobalVariablesCallback
and MetricAverageCallback, its LearningRateWarmupCallback (warmup_epochs > 0) and hvdtrain's guard,
which sets the LR to the compiled one x world size, checkpoints on rank 0 at each epoch end
(npz, atomic, the newest `keep` kept: hvdtrain/checkpoint/), votes over ranks on SIGUSR1/SIGTERM
every `stop_check_batches` batches and at each epoch end (every rank stops at the same batch,
with a checkpoint), with `checkpoint_every=` (2000 steps, or '30m' of rank 0's clock, agreed at the
next vote) also checkpoints in the middle of epochs, written in the background while fit goes on,
requeues the Slurm job after SIGUSR1 (not SIGTERM: scancel), and runs the watchdog while fit runs
(hvdtrain/watchdog.py). Put your own callbacks after these: they then see averaged metrics.

A resume in the middle of an epoch (an interval checkpoint, a stop signal's): Keras's fit cannot
start an epoch at a given batch, so fit reads that epoch's first batches again and trains on none
of them; the rest of the epoch trains on the batches an uninterrupted run would. The weights then
equal an uninterrupted run's when fit reads each epoch's batches in an order that depends on the
epoch alone (fit(..., shuffle=False) on data you ordered, or a dataset you order by epoch: Keras's
shuffle=True draws the order anew in every run) and no layer draws random numbers (Keras 2's
Dropout draws from TensorFlow's op seeds, which no checkpoint holds). The resumed epoch's logged
metrics cover the batches trained in this run.

Keras 2 (tf-keras) with its legacy optimizers only: Horovod 0.28.1's Keras layer and its LR
callbacks drive them (hvdtrain/tf/keras_compat.py). Every rank must run as many batches per epoch
(checked at fit's start). Bad input ends every rank with one line and exit status 2.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import time

from hvdtrain import checkpoint as ckpt
from hvdtrain.config import TrainConfig
from hvdtrain.errors import UsageError, exits_on_usage_error
from hvdtrain.lifecycle import Lifecycle, start_rank
from hvdtrain.report import say
from hvdtrain.test_hooks import injected_delay
from hvdtrain.tf import internals, npz_checkpoint
from hvdtrain.watchdog import AT_CHECKPOINT, Watchdog

PROG = "hvdtrain.tf"
WRITER = "hvdtrain.tf.callbacks"  # in each checkpoint's meta: which API wrote it
_job: "Job | None" = None  # the process's Horovod job (Horovod itself is one per process)




@exits_on_usage_error(PROG)
def start(seed: int | None = None, *, threads: int | None = None, watchdog_seconds: float | None = None) -> "Job":
    """Every rank, before TensorFlow builds anything: Keras 2 for tf.keras, this rank's CPU threads,
    hvd.init() with hvdtrain's settings (the watchdog armed around it), this rank's GPU, the stop
    signals' handlers, and Keras' random seed (the same on every rank) when given."""
    return start_job(Job, seed, threads, watchdog_seconds)


def start_job(job_class: type, seed: int | None, threads: int | None, watchdog_seconds: float | None,
              checkpoint_every: str | int | None = None) -> "Job":
    """start() for `job_class`, a Job (or hvdtrain/tf/tape_loop.py's TapeJob), on the Keras of its
    `loop` (keras_compat.select). One per process: a second call returns the first job (one of
    another class: refused)."""
    global _job
    if _job is not None:
        if type(_job) is not job_class:
            raise UsageError(f"{job_class.api} after {_job.api}: one hvdtrain start per process (Horovod "
                             "is one per process, and each chooses its Keras before TensorFlow loads)")
        return _job
    from hvdtrain.tf import keras_compat

    keras = keras_compat.select(job_class.loop)  # before tensorflow is imported (below)
    every = None if checkpoint_every is None else str(checkpoint_every)
    # (checkpoint_every checked with a stand-in directory: the loop's resume() names the real one.)
    cfg = TrainConfig(framework="tf", loop=job_class.loop, seed=0 if seed is None else seed,
                      watchdog_seconds=watchdog_seconds, threads_per_rank=threads, checkpoint_every=every,
                      checkpoint_dir="job.resume's" if every else None)  # checks them
    from hvdtrain.tf.backend_horovod import HorovodBackend
    from hvdtrain.tf.train import set_threads

    started = start_rank(cfg, PROG, set_threads, HorovodBackend)  # hvd.init(), this rank's GPU (hvdtrain/lifecycle.py)
    started.watchdog.stop()  # it watched the start; fit's Guard (or the tape loop) arms its own
    backend, env = started.backend, started.env
    if seed is not None:
        keras.utils.set_random_seed(seed)  # the same initial weights on every rank
    _job = job_class(keras, backend, cfg.with_world_size(backend.world_size), env.job_id)
    return _job


@exits_on_usage_error(PROG)
def callbacks(model, *, checkpoint_dir: str | None = None, checkpoint_every: str | int | None = None,
              warmup_epochs: int = 0, scale_lr: bool = True, keep: int = 3,
              stop_check_batches: int = 10) -> "Callbacks":
    """The callbacks for `model.fit(..., initial_epoch=cbs.initial_epoch, callbacks=cbs)`, every
    rank, after start() and model.compile(); resumes from `checkpoint_dir` now (see above).
    checkpoint_every: 2000 (steps) or '30m' ('90s', '2h'): also a checkpoint in the middle of
    epochs, written in the background."""
    if _job is None:
        raise UsageError("call hvdtrain.tf.start() first, before the model and the data are built")
    return _job.callbacks(model, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                          warmup_epochs=warmup_epochs, scale_lr=scale_lr, keep=keep,
                          stop_check_batches=stop_check_batches)


@contextlib.contextmanager
def _watched(cfg: TrainConfig, rank: int, world_size: int, where: str):
    """The watchdog around one stretch of collectives outside fit (it ends with the stretch:
    the user's own code between them may take as long as it likes)."""
    watchdog = Watchdog(cfg.watchdog_seconds, PROG, rank, world_size)
    watchdog.beat(where=where)
    try:
        yield watchdog
    finally:
        watchdog.stop()


class Callbacks(list):
    """A list of Keras callbacks that also says where fit starts: `initial_epoch`."""
    initial_epoch: int = 0


class Job(Lifecycle):
    """This rank's part: rank, local_rank, world_size, is_rank0, device; optimizer(); callbacks().
    Its stop vote, checkpoint writes and requeue are hvdtrain/lifecycle.py's."""
    loop = "fit"                  # the Keras it runs on: keras_compat.select(loop)
    api = "hvdtrain.tf.start()"   # what started it, for start_job's refusal
    written_by = WRITER           # in its checkpoints' meta

    def __init__(self, keras, backend, cfg: TrainConfig, job_id: str | None):
        super().__init__(backend, cfg, job_id)
        self.keras = keras
        self.device = backend.device

    def log(self, line: str, every_rank: bool = False) -> None:  # rank 0 (or each) prints; no collective
        if self.is_rank0 or every_rank:
            say(f"{PROG}: {line}")

    @exits_on_usage_error(PROG)
    def optimizer(self, optimizer):
        """`optimizer` (a Keras 2 legacy one) averaging its gradients over ranks (Horovod's
        DistributedOptimizer, with the trainer's options: hvdtrain/tf/backend_horovod.py)."""
        self._check_legacy(optimizer, "hvd.optimizer()")
        return self.backend.keras_optimizer(optimizer, self.cfg)

    def _check_legacy(self, optimizer, where: str) -> None:
        if not isinstance(optimizer, self.keras.optimizers.legacy.Optimizer):
            raise UsageError(f"{where} takes a Keras 2 legacy optimizer (tf_keras.optimizers.legacy.SGD, Adam, ...), "
                             f"the API Horovod's LR callbacks drive; got {type(optimizer).__module__}."
                             f"{type(optimizer).__name__}")

    @exits_on_usage_error(PROG)
    def image_data(self, data_dir: str, *, batch_size: int, epochs: int, image_size: int = 224):
        """An image folder (train/ and val/ class folders) or shards (`python -m hvdtrain.shards`)
        read as hvdtrain's trainer reads them, for `model.fit`: `.classes`, `.steps_per_epoch`,
        `.train(callbacks.initial_epoch)` (this rank's batches of each epoch, cropped by hvdtrain's
        rule: a resume reads what the uninterrupted run read), `.val` (this rank's exact share of
        the validation images). hvdtrain/tf/data.py's FitImages."""
        import tensorflow as tf

        from hvdtrain.tf.data import FitImages

        return FitImages(data_dir, image_size=image_size, batch_size=batch_size, rank=self.rank,
                         world_size=self.world_size, seed=self.cfg.seed, epochs=epochs,
                         threads=max(1, tf.config.threading.get_intra_op_parallelism_threads()))

    @exits_on_usage_error(PROG)
    def callbacks(self, model, *, checkpoint_dir=None, checkpoint_every=None, warmup_epochs=0, scale_lr=True,
                  keep=3, stop_check_batches=10) -> Callbacks:
        keras = self.keras
        if not isinstance(model, keras.Model):
            raise UsageError(f"hvdtrain.tf.callbacks() takes a Keras 2 model (tf_keras, imported after "
                             f"hvdtrain.tf.start()); got {type(model).__module__}.{type(model).__name__}")
        optimizer = getattr(model, "optimizer", None)
        if optimizer is None:
            raise UsageError("call model.compile(optimizer=hvd.optimizer(...), ...) before hvdtrain.tf.callbacks()")
        if not internals.averages_over_ranks(optimizer):
            raise UsageError("the model's optimizer does not average gradients over ranks: compile with "
                             "optimizer=hvd.optimizer(keras.optimizers.legacy.SGD(...)), hvd = hvdtrain.tf.start()")
        self._check_legacy(optimizer, "model.compile()")
        if not model.weights:
            raise UsageError("the model has no weights yet: build it before hvdtrain.tf.callbacks() "
                             "(a keras.Input first, or model.build(input_shape))")
        for name, value, least in (("warmup_epochs", warmup_epochs, 0), ("keep", keep, 1),
                                   ("stop_check_batches", stop_check_batches, 1)):
            if not isinstance(value, int) or value < least:
                raise UsageError(f"hvdtrain.tf.callbacks(): {name} must be an integer >= {least} (got {value!r})")
        interval = self._interval(checkpoint_every, checkpoint_dir)
        target_lr = self._scaled_lr(optimizer) if scale_lr else None
        # Slots now, not in the first step: the checkpoint and the broadcast need them.
        internals.create_slots(optimizer, model.trainable_variables)
        with _watched(self.cfg, self.rank, self.world_size, "resuming"):
            position, resumed_batching = self._resume(checkpoint_dir, model, optimizer)
            # Horovod: every rank starts from rank 0's weights and optimizer state (resumed or not),
            # so that the first step is already one model's.
            self.backend.broadcast_variables(model.weights + optimizer.variables())
        if target_lr is not None:  # after the load: a checkpoint holds the LR of its own world size
            keras.backend.set_value(optimizer.learning_rate, target_lr)
        # Horovod's callbacks, as hvdtrain's own Keras fit loop uses them (hvdtrain/tf/loops.py):
        # rank 0's variables again after the first batch (those Keras makes lazily), then the
        # epoch's metrics averaged over ranks before any later callback reads them.
        found = Callbacks(self.backend.fit_callbacks())
        if warmup_epochs:  # Horovod: from target / world size up to target over the first epochs
            lr = target_lr if target_lr is not None else float(keras.backend.get_value(optimizer.learning_rate))
            found.append(self.backend.lr_warmup_callback(lr, warmup_epochs, steps_per_epoch=None))
        found.append(_guard_class(keras)(self, checkpoint_dir, keep, stop_check_batches, position, interval,
                                         resumed_batching))
        found.initial_epoch = position.epoch
        return found

    def _interval(self, checkpoint_every, checkpoint_dir) -> ckpt.Interval:
        """checkpoint_every= checked as --checkpoint-every is (steps, or seconds of rank 0's clock)."""
        if checkpoint_every is not None and not isinstance(checkpoint_every, (str, int)) or checkpoint_every is True:
            raise UsageError(f"hvdtrain.tf.callbacks(): checkpoint_every takes a number of steps (2000) or a time "
                             f"('30m', '90s', '2h'); got {checkpoint_every!r}")
        every = None if checkpoint_every is None else str(checkpoint_every)
        try:
            cfg = dataclasses.replace(self.cfg, checkpoint_every=every, checkpoint_dir=checkpoint_dir)
        except UsageError as err:
            raise UsageError(f"hvdtrain.tf.callbacks(): {str(err).replace('--checkpoint-', 'checkpoint_')}") from None
        return ckpt.Interval(cfg.checkpoint_interval, self.is_rank0)

    def _scaled_lr(self, optimizer) -> float:
        """The compiled LR x world size (the global batch grows with the ranks), read once per
        optimizer: a second callbacks() call does not scale it again."""
        base = getattr(optimizer, "_hvdtrain_base_lr", None)
        if base is None:
            lr = optimizer.learning_rate
            if isinstance(lr, self.keras.optimizers.schedules.LearningRateSchedule):
                raise UsageError("scale_lr: the optimizer's learning rate is a schedule, which hvdtrain cannot scale; "
                                 "scale it by hvd.world_size yourself and pass scale_lr=False")
            base = float(self.keras.backend.get_value(lr))
            optimizer._hvdtrain_base_lr = base
        return base * self.world_size

    # ------------------------------------------------------------------ checkpoints
    def _resume(self, checkpoint_dir, model, optimizer) -> tuple[ckpt.Position, list | None]:
        """Where the newest checkpoint left the run, and the batching it was written with
        ([ranks, batches per epoch]; None when the checkpoint does not say: written before they were saved)."""
        status = self._load_on_rank0(checkpoint_dir, model, optimizer)
        if not status.get("path"):
            return ckpt.Position(), None
        position = ckpt.Position.from_checkpoint(status["position"])
        self.log(f"resumed from {status['path']} at epoch {position.epoch + 1} "
                 f"after {position.step_in_epoch} batch(es)")
        return position, status.get("batching")

    def _load_on_rank0(self, checkpoint_dir, model, optimizer) -> dict:
        """Rank 0 loads the newest checkpoint that reads; every rank learns the outcome (all fail
        together, or none): {} for none, else its path and position."""
        if not checkpoint_dir:
            return {}
        return ckpt.resume_on_rank0(self.backend, self.is_rank0, checkpoint_dir,
                                    lambda path: self._take(path, npz_checkpoint.read(path), model, optimizer),
                                    self.log, "keras_resume")

    def _checkpointed(self, model, optimizer) -> dict:
        """The variables a checkpoint holds, by prefix, in order."""
        return {"model": model.weights, "optimizer": optimizer.variables()}

    def _take(self, path, found, model, optimizer) -> dict:
        meta, arrays = found
        # It reads but does not fit: no older one will.
        variables = self._checkpointed(model, optimizer)
        problem = npz_checkpoint.mismatch(variables, arrays)
        written_by = meta.get("written_by", "the hvdtrain.tf trainer")
        if written_by != self.written_by:
            problem = f"written by {written_by}, read by {self.written_by}"
        if problem:
            raise UsageError(f"checkpoint {path} does not fit this model and optimizer ({problem})")
        npz_checkpoint.assign(variables, arrays)
        return {"path": path, "position": {k: meta[k] for k in ("epoch", "step_in_epoch", "global_step",
                                                                "history")}, "batching": meta.get("batching")}

    def save(self, checkpoint_dir, model, at: ckpt.Position, keep: int, optimizer=None, extra=None,
             background: bool = False) -> None:
        """Every rank: rank 0 writes weights, optimizer state (the model's, unless given) and
        position atomically, `extra` in its meta; a failure ends every rank. background: on rank
        0's writer thread (the values copied first); its end is learnt by a later vote."""
        self.write(checkpoint_dir, lambda: self._capture(checkpoint_dir, at, model, optimizer, extra), keep, background)

    def _capture(self, checkpoint_dir, at: ckpt.Position, model, optimizer=None, extra=None):
        variables = self._checkpointed(model, model.optimizer if optimizer is None else optimizer)
        return (*npz_checkpoint.capture(checkpoint_dir, at, variables, {
            "written_by": self.written_by, "world_size": self.world_size, **(extra or {})}), False)


# The guard subclasses the Callback of the Keras that fit runs on (tf_keras), known only once
# start() has chosen it: hence a function that makes the class.
@functools.lru_cache(maxsize=None)
def _guard_class(keras):
    class Guard(keras.callbacks.Callback):
        """Every rank: the stop vote, rank 0's checkpoints (each epoch's end, the interval's in the
        background), the watchdog, the requeue; a resume in the middle of an epoch."""

        def __init__(self, job: Job, checkpoint_dir, keep: int, check_every: int, position: ckpt.Position,
                     interval: ckpt.Interval, resumed_batching: list | None):
            super().__init__()
            self.job, self.checkpoint_dir, self.keep, self.check_every = job, checkpoint_dir, keep, check_every
            self.position, self.initial_epoch = position, position.epoch
            self.interval, self.resumed_batching = interval, resumed_batching
            self.watchdog, self.stopped_by, self.first_epoch = None, None, True
            self.slowed = injected_delay(job.rank)  # test-only: a rank made slow on purpose (hvdtrain/test_hooks.py)

        @exits_on_usage_error(PROG)
        def on_train_begin(self, logs=None):
            job = self.job
            self.watchdog = Watchdog(job.cfg.watchdog_seconds, PROG, job.rank, job.world_size)
            self.watchdog.beat(where="starting fit")
            job.watch(self.watchdog)
            self.stopped_by, self.first_epoch, self.initial_epoch = None, True, self.position.epoch
            self.writing = False  # a background write in flight: every batch votes until it has ended
            self.trained = None  # Keras's train_function while a resumed epoch's first batches are read again
            self.global_step = int(self.job.keras.backend.get_value(self.model.optimizer.iterations))
            steps = self.params.get("steps")
            counts = job.backend.allgather_object(steps, "keras_steps_per_epoch")
            if len(set(counts)) > 1:  # one rank would wait for the others' allreduce for ever
                raise UsageError(f"the ranks run different numbers of batches per epoch ({counts}, in rank order): "
                                 "give every rank as many samples (drop the remainder), or pass steps_per_epoch")
            self.batching = [job.world_size, steps]
            self.per_execution = internals.steps_per_execution(self.model)
            if self.per_execution != 1 and (self.interval.steps or self.interval.seconds):
                raise UsageError(f"checkpoint_every needs model.compile(steps_per_execution=1) (got "
                                 f"{self.per_execution}): an interval checkpoint may fall after any batch")
            self.skipped = self._batches_to_skip()

        def _batches_to_skip(self) -> int:
            """A checkpoint from the middle of an epoch: fit reads that epoch's first batches again
            and trains on none of them (Keras's fit cannot start an epoch at a given batch), so the
            rest of the epoch trains on the batches an uninterrupted run would have. Only with the
            same batches per epoch on as many ranks; otherwise the epoch again from its first batch."""
            done = self.position.step_in_epoch
            if not done:
                return 0
            again = f"epoch {self.position.epoch + 1} again from its first batch"
            if self.per_execution != 1:
                self.job.log(f"steps_per_execution={self.per_execution}: {again}")
                return 0
            if self.resumed_batching not in (None, self.batching):
                self.job.log(f"the checkpoint's epoch ran {self.resumed_batching[1]} batches on "
                             f"{self.resumed_batching[0]} rank(s), this one {self.batching[1]} on {self.batching[0]}: "
                             f"{again}")
                return 0
            trained = self.trained = self.model.train_function

            def read_again(iterator):  # Keras's loop calls model.train_function(iterator) once a batch
                if self.batches < done:
                    next(iterator)
                    return {}
                self.model.train_function, self.trained = trained, None  # from now on, Keras's own
                return trained(iterator)

            self.model.train_function = read_again
            return done

        @exits_on_usage_error(PROG)
        def on_epoch_begin(self, epoch, logs=None):
            if self.first_epoch and epoch != self.initial_epoch:
                raise UsageError(f"model.fit started at epoch {epoch + 1}, but the run is at epoch "
                                 f"{self.initial_epoch + 1}: pass initial_epoch=callbacks.initial_epoch to fit")
            self.first_epoch, self.batches = False, 0

        @exits_on_usage_error(PROG)
        def on_train_batch_end(self, batch, logs=None):
            # Keras's `batch`: the last batch this call ran (steps_per_execution of them at a time).
            ran, self.batches = batch + 1 - self.batches, batch + 1
            if self.batches <= self.skipped:  # read again, not trained: the previous run trained on it
                self.watchdog.beat(where="reading the resumed epoch's first batches again")
                return
            self.global_step += ran
            self.watchdog.beat(self.global_step)
            if self.slowed:
                time.sleep(self.slowed)
            timed = False
            if (self.batches % self.check_every == 0 or self.writing) and self.stopped_by is None:
                votes = self.job.vote(self.interval)
                self.stopped_by, timed, self.writing = votes.stopped_by, votes.checkpoint_due > 0, votes.writing > 0
                if self.stopped_by:
                    self.model.stop_training = True  # every rank, after this same batch
                    return
            steps = self.params.get("steps")
            mid_epoch = steps is None or self.batches < steps
            if self.checkpoint_dir and self.interval.due(self.global_step, mid_epoch, timed):
                self.job.backend.average_variables(self.model.non_trainable_weights)  # one set of BatchNorm statistics
                self._save(self._here(), background=True)

        def on_test_batch_end(self, batch, logs=None):  # fit's validation
            self.watchdog.beat(where="validating")

        @exits_on_usage_error(PROG)
        def on_epoch_end(self, epoch, logs=None):
            job = self.job
            self.watchdog.beat(where="ending the epoch")
            stopped_mid_epoch = self.stopped_by is not None
            if not stopped_mid_epoch:
                votes = job.vote(self.interval)
                self.stopped_by, self.writing = votes.stopped_by, votes.writing > 0
            # BatchNorm statistics are each rank's own (Horovod averages gradients only): one set.
            job.backend.average_variables(self.model.non_trainable_weights)
            steps = self.params.get("steps")
            at = self._here()
            if not stopped_mid_epoch or self.batches == steps:  # complete: the next run starts at the next epoch
                record = {"epoch": epoch + 1, **{k: float(v) for k, v in (logs or {}).items()}}
                at = at.recorded(record).next_epoch()
            self.position, self.skipped = at, 0
            if self.checkpoint_dir:
                self._save(at)  # after the write in flight, if any (its failure said on every rank)
            if self.stopped_by:
                job.log(f"stopped by {self.stopped_by} in epoch {epoch + 1} after {self.batches} batch(es)"
                        + ("; checkpoint written" if self.checkpoint_dir else "; no checkpoint_dir: nothing saved"))
                self.model.stop_training = True

        def _here(self) -> ckpt.Position:
            return dataclasses.replace(self.position, global_step=self.global_step, step_in_epoch=self.batches)

        def _save(self, at: ckpt.Position, background: bool = False) -> None:
            """Every rank: rank 0 writes (in the background: the values copied first)."""
            self.watchdog.beat(where=AT_CHECKPOINT)
            self.job.save(self.checkpoint_dir, self.model, at, self.keep, extra={"batching": self.batching},
                          background=background)
            self.interval.written()
            self.writing = background  # an inline write (the epoch's end) first ends the one in flight

        def on_train_end(self, logs=None):
            # No write is in flight here: fit ends after an epoch's end, whose inline checkpoint
            # waited for it (a stop, Keras's or another callback's, ends the epoch first too).
            if self.trained is not None:  # a fit that ended before its skip did: later fits get Keras's own
                self.model.train_function, self.trained = self.trained, None
            if self.watchdog is not None:
                self.watchdog.stop()  # the user's code after fit may take as long as it likes
            self.job.requeue_if_asked(self.stopped_by)

    return Guard
