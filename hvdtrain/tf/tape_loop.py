"""hvdtrain's guards for your own TensorFlow GradientTape loop: a few calls, each one line of a
single-process script (Horovod underneath; the TF twin of hvdtrain/torch/loop.py).

    import hvdtrain.tf
    job = hvdtrain.tf.start_tape_loop(seed=0)   # before TensorFlow builds anything: hvd.init(), GPU, threads, guards
    import keras, tensorflow as tf             # Keras 3 (tf_keras too, with TF_USE_LEGACY_KERAS=1)
    optimizer = keras.optimizers.SGD(lr * job.world_size)    # LR x ranks: the global batch grows with them
    start_epoch = job.resume("ckpt", model, optimizer)       # the newest checkpoint's epoch, or 0; rank 0's variables

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = job.tape(tape)                                 # Horovod: gradients averaged over ranks
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for epoch in range(start_epoch, epochs):
        for x, y in job.dataset((x_train, y_train), batch_size, epoch):  # this rank's shard; a resumed epoch's rest
            loss = train_step(x, y)
            job.step_done()                                   # the position, the watchdog's heartbeat
            if job.should_stop(): break                       # a stop signal on any rank: all stop here
        job.save("ckpt", model, optimizer)                    # rank 0 writes where the loop is (mid-epoch too)
        if job.stopped_by: break
    x_mine, y_mine = job.shard(x_val, y_val)                  # each sample on one rank: job.sum / job.average
    job.finish()                                              # requeue after SIGUSR1; mpirun -np 2 python train.py

`resume`, `broadcast`, `should_stop`, `sum`, `average`, `save` and `finish` are collective: every
rank makes them at the same points (`dataset`, `shard`, `step_done`, `tape` and `log` are not).
`resume` (and `broadcast`, for a loop without checkpoints) builds the optimizer's variables, so
every rank starts from rank 0's model *before* the first step. Checkpoints are .npz files of the
model's variables (Dropout's random state too: a resumed run draws what an unstopped one would)
and the optimizer's (hvdtrain/tf/npz_checkpoint.py), written by rank 0 atomically through
hvdtrain/tf/keras_callbacks.py's Job (the same code as hvdtrain.tf.callbacks'); a resume keeps this
run's learning rate. start_tape_loop(checkpoint_every=N or "30m") makes should_stop() also write
one in the middle of epochs, in the background, so that a crash without a signal costs that much. Bad input ends
every rank with one line, exit 2. Example: tf_examples/tape_loop_digits.py.
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np

from hvdtrain import checkpoint as ckpt
from hvdtrain.errors import UsageError, exits_on_usage_error
from hvdtrain.lifecycle import LoopLifecycle
from hvdtrain.test_hooks import injected_delay
from hvdtrain.tf import internals, keras_callbacks
from hvdtrain.tf.keras_callbacks import PROG, Job
from hvdtrain.watchdog import Watchdog

WRITER = "hvdtrain.tf.tape_loop"  # in each checkpoint's meta


@exits_on_usage_error(PROG)
def start(seed: int | None = 0, *, threads: int | None = None, watchdog_seconds: float | None = None,
          checkpoint_every: str | int | None = None) -> "TapeJob":
    """Every rank, before TensorFlow builds anything: the Keras of a GradientTape loop (Keras 3,
    or tf_keras with TF_USE_LEGACY_KERAS=1), this rank's CPU threads, hvd.init() with hvdtrain's
    settings, this rank's GPU, the stop signals, Keras' random seed (the same on every rank; None:
    unseeded), and the watchdog, armed until finish(). checkpoint_every: 2000 (steps) or '30m'
    (rank 0's clock): should_stop() then also writes a checkpoint in the middle of the epoch, into
    job.resume()'s directory, in the background."""
    return keras_callbacks.start_job(TapeJob, seed, threads, watchdog_seconds, checkpoint_every)


def _plain_learning_rate(keras, optimizer) -> float | None:
    """The optimizer's learning rate as a number, or None when it is a schedule."""
    lr = optimizer.learning_rate
    if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule) or callable(lr) and not hasattr(lr, "numpy"):
        return None
    return float(lr.numpy() if hasattr(lr, "numpy") else lr)


def _optimizer_variables(optimizer) -> list:
    variables = optimizer.variables  # Keras 3: a list; Keras 2's legacy optimizers: a method
    return list(variables() if callable(variables) else variables)


class TapeJob(Job, LoopLifecycle):
    """This rank's part of a GradientTape loop: rank, local_rank, world_size, is_rank0, device,
    position (a hvdtrain.checkpoint.Position), stopped_by (the signal should_stop() agreed on)."""
    loop = "custom"
    api = "hvdtrain.tf.start_tape_loop()"
    written_by = WRITER
    start_call, handle = "start_tape_loop", "job"  # the lifecycle's error lines (hvdtrain/lifecycle.py)

    def __init__(self, keras, backend, cfg, job_id):
        super().__init__(keras, backend, cfg, job_id)
        self.watch(Watchdog(cfg.watchdog_seconds, PROG, self.rank, self.world_size))
        self.slowed = injected_delay(self.rank)

    @exits_on_usage_error(PROG)
    def optimizer(self, optimizer):  # Job's, for model.fit
        raise UsageError("job.optimizer() and job.callbacks() are for model.fit (hvdtrain.tf.start()); a GradientTape "
                         "loop averages its gradients in tape = job.tape(tape)")

    callbacks = optimizer

    def tape(self, tape):
        """Horovod's DistributedGradientTape around `tape` (in or out of a tf.function): its
        gradient() returns the gradients averaged over ranks. Sources may be Keras 3 variables:
        Horovod is handed the tf.Variable inside each, so that a site's Horovod without the
        Keras 3 fixes works too ('Variable' object has no attribute 'ref')."""
        import tensorflow as tf

        sources = _TfVariableSources(self.backend.distributed_tape(tape, self.cfg))
        # Called from the user's tf.function, whose AutoGraph would otherwise convert Horovod's
        # gradient() and everything it calls at the first trace (about 2 CPU-s a rank here); it
        # branches on Python values only, so it is traced as it is.
        sources.gradient = tf.autograph.experimental.do_not_convert(sources.gradient)
        return sources

    # ------------------------------------------------------------------ data
    def shard(self, *arrays):
        """This rank's share of each array (every world_size-th sample from rank): each sample on
        exactly one rank, for an evaluation summed with job.sum. Not collective."""
        mine = tuple(a[self.rank::self.world_size] for a in arrays)
        return mine[0] if len(mine) == 1 else mine

    @exits_on_usage_error(PROG)
    def dataset(self, arrays, batch_size: int, epoch: int, *, shuffle: bool = True):
        """A tf.data.Dataset of this rank's batches of `epoch`: the samples in an order seeded by
        (seed, epoch), the same on every rank, dealt out to the ranks, `batch_size` per rank, as many
        full batches on every rank (the rest dropped); of a resumed epoch, the batches not yet stepped."""
        arrays = tuple(arrays) if isinstance(arrays, (tuple, list)) else (arrays,)
        lengths = {len(a) if hasattr(a, "__len__") and hasattr(a, "__getitem__") else None for a in arrays}
        if None in lengths or any(type(a).__module__.startswith("tensorflow") for a in arrays):
            found = ", ".join(f"{type(a).__module__}.{type(a).__name__}" for a in arrays)
            raise UsageError(f"job.dataset() takes in-memory arrays, e.g. (x, y) of numpy arrays (data that fits in "
                             f"memory: it deals them out and resumes mid-epoch); got {found}")
        if len(lengths) != 1:
            raise UsageError(f"job.dataset(): the arrays hold different numbers of samples ({sorted(lengths)})")
        if not isinstance(batch_size, int) or batch_size < 1 or not isinstance(epoch, int) or epoch < 0:
            raise UsageError(f"job.dataset(): batch_size must be an integer >= 1 and epoch one >= 0 "
                             f"(got {batch_size!r}, {epoch!r})")
        [count] = lengths
        per_rank = count // self.world_size
        if per_rank < batch_size:
            raise UsageError(f"job.dataset(): {count} samples on {self.world_size} rank(s) make {per_rank} per "
                             f"rank, less than one batch of {batch_size}")
        batches = per_rank // batch_size
        order = np.random.default_rng([self.cfg.seed, epoch]).permutation(count) if shuffle else np.arange(count)
        mine = order[self.rank::self.world_size][:batches * batch_size]
        self.batching = [self.world_size, batch_size]
        resumed = epoch == self.position.epoch and self.resumed_batching in (None, self.batching)
        skip = min(self.position.step_in_epoch, batches) if resumed else 0  # other shards: the epoch again
        self.position = dataclasses.replace(self.position, epoch=epoch, step_in_epoch=skip)
        self.batches_in_epoch = batches
        import tensorflow as tf

        taken = [np.asarray(a)[mine[skip * batch_size:]] for a in arrays]
        slices = taken[0] if len(taken) == 1 else tuple(taken)  # one array: batches of it, not 1-tuples
        return tf.data.Dataset.from_tensor_slices(slices).batch(batch_size).prefetch(1)

    # ------------------------------------------------------------------ steps
    def step_done(self) -> None:
        """After each optimizer step: the position (for save), the watchdog's heartbeat. Not collective."""
        super().step_done()
        if self.slowed:
            time.sleep(self.slowed)  # test-only: a rank made slow on purpose (hvdtrain/phases.py)

    @exits_on_usage_error(PROG)
    def should_stop(self) -> bool:
        """Did SIGUSR1/SIGTERM reach any rank? A vote: every rank stops at the same step, then save()s.
        With start(checkpoint_every=), also the interval checkpoint, when one is due (the same step
        on every rank: a number of steps, or rank 0's clock, which votes here), written in the
        background; rank 0's writer (running, failed) rides in the same vote."""
        return super().should_stop()

    def sum(self, values) -> np.ndarray:
        """`values` (numbers, or an array of them) summed over ranks, as float64."""
        return self.backend.allreduce_sum(np.atleast_1d(np.asarray(values, dtype=np.float64)), "tape_sum")

    def average(self, total, count) -> float:
        """sum(total) / sum(count) over ranks: a mean over every rank's samples, e.g. (loss sum, samples)."""
        total, count = self.sum([total, count])
        return float(total / count) if count else float("nan")

    # ------------------------------------------------------------------ state
    def _checkpointed(self, model, optimizer) -> dict:
        # model.variables: weights and Keras 3's random generators' state (Dropout), not only weights.
        return {"model": list(model.variables), "optimizer": _optimizer_variables(optimizer)}

    def _check_model(self, model, optimizer, where: str) -> None:
        if not isinstance(model, self.keras.Model):
            raise UsageError(f"{where} takes a Keras model of the Keras hvdtrain.tf.start_tape_loop() chose "
                             f"({self.keras.__name__}); got {type(model).__module__}.{type(model).__name__}")
        if not model.variables:
            raise UsageError(f"the model has no weights yet: build it before {where} (a keras.Input first, "
                             "or model.build(input_shape))")
        if not hasattr(optimizer, "apply_gradients") or not hasattr(optimizer, "variables"):
            raise UsageError(f"{where} takes the Keras optimizer the loop applies the gradients with; got "
                             f"{type(optimizer).__module__}.{type(optimizer).__name__}")

    def _build_optimizer(self, model, optimizer) -> None:
        """The optimizer's variables (iterations, slots) now, not in the first step: the
        checkpoint and the broadcast need them."""
        if not internals.create_slots(optimizer, model.trainable_variables) and \
                not getattr(optimizer, "built", getattr(optimizer, "_built", False)):
            optimizer.build(model.trainable_variables)

    @exits_on_usage_error(PROG)
    def broadcast(self, model, optimizer) -> None:
        """Every rank takes rank 0's model and optimizer variables (the optimizer built first), before
        the first step or at any point later; resume() does it, call it yourself without resume()."""
        self._check_model(model, optimizer, "job.broadcast()")
        self._build_optimizer(model, optimizer)
        self.watchdog.beat(where="broadcasting rank 0's variables")
        variables = self._checkpointed(model, optimizer)
        self.backend.broadcast_variables(variables["model"] + variables["optimizer"])

    @exits_on_usage_error(PROG)
    def resume(self, checkpoint_dir: str | None, model, optimizer) -> int:
        """Rank 0 loads the newest checkpoint of `checkpoint_dir` that reads (model, optimizer state;
        this run's learning rate kept), then every rank takes rank 0's variables: the epoch to start at
        (job.dataset then skips the batches a stopped epoch had done). None: only the broadcast."""
        self._check_model(model, optimizer, "job.resume()")
        self._build_optimizer(model, optimizer)
        self.saving_to = (checkpoint_dir, model, optimizer) if checkpoint_dir else None
        self.watchdog.beat(where="resuming")
        # This run's LR (scaled for its world size), not the one the checkpoint was written with:
        # the LR is among the saved variables (Keras 3's `_learning_rate`, a legacy tf_keras
        # optimizer's hyperparameter); a schedule is a function of the step, restored with it.
        kept = _plain_learning_rate(self.keras, optimizer)
        status = self._load_on_rank0(checkpoint_dir, model, optimizer)
        if kept is not None:
            optimizer.learning_rate = kept
        if status.get("path"):
            self.resumed_at({**status, "position": ckpt.Position.from_checkpoint(status["position"])})
        self.broadcast(model, optimizer)
        return self.position.epoch

    @exits_on_usage_error(PROG)
    def save(self, checkpoint_dir: str, model, optimizer, *, keep: int = 3) -> None:
        """Every rank: BatchNorm statistics averaged over ranks, then rank 0 writes the model's and
        the optimizer's variables and where the loop is (the next epoch, or a stopped epoch's
        unstepped batches) atomically; the newest `keep` kept. A failure ends every rank."""
        if not checkpoint_dir or not isinstance(checkpoint_dir, str):   # every rank: none waits for rank 0
            raise UsageError(f"job.save(): checkpoint_dir must be a directory path (got {checkpoint_dir!r})")
        if not isinstance(keep, int) or keep < 1:
            raise UsageError(f"job.save(): keep must be an integer >= 1 (got {keep!r})")
        self._check_model(model, optimizer, "job.save()")
        if self.batches_in_epoch is None:
            raise UsageError("job.save() writes where the loop is, which job.dataset() knows: take each epoch's "
                             "batches from job.dataset(arrays, batch_size, epoch)")
        self._save(checkpoint_dir, model, optimizer, keep=keep)

    def _save(self, checkpoint_dir: str, model, optimizer, keep: int, background: bool = False) -> None:
        # Horovod averages gradients only: the non-trainable weights (BatchNorm's statistics) here.
        self.checkpoint(checkpoint_dir, lambda: self.backend.average_variables(model.non_trainable_weights),
                        lambda at: self._capture(checkpoint_dir, at, model, optimizer, {"batching": self.batching}),
                        keep, background)

    @exits_on_usage_error(PROG)
    def finish(self) -> None:
        """Last, every rank: after SIGUSR1 (Slurm's time-limit warning) rank 0 requeues the job
        (not after SIGTERM: scancel); a background write still running ends (its failure said on
        every rank); the watchdog stops; Horovod shuts down."""
        self.end()


class _TfVariableSources:
    """A DistributedGradientTape whose gradient() is given each source's tf.Variable, as
    hvdtrain's own TF trainer gives them (hvdtrain/tf/devices.py tf_variable): Horovod 0.28.1 as
    released keys sources by Variable.ref(), which Keras 3 variables lack. The gradients are the
    same: a Keras 3 variable's ops read that tf.Variable, which is what the tape watched."""

    def __init__(self, tape):
        self._tape = tape

    def gradient(self, target, sources, *args, **kwargs):
        from hvdtrain.tf.devices import tf_variable
        import tensorflow as tf

        return self._tape.gradient(target, tf.nest.map_structure(tf_variable, sources), *args, **kwargs)

    def __getattr__(self, name):
        if name == "_tape":
            raise AttributeError(name)
        return getattr(self._tape, name)
