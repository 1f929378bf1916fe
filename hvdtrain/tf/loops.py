"""The two ways hvdtrain.tf trains one epoch: a GradientTape loop and Keras `model.fit`.

Both make the optimizer for their Keras, run the steps the trainer asks for, and report each
step inline through the trainer's loop API (`trainer.before_step()`, then
`trainer.step_done(stats)` -> stop?), whose step meter times, logs and reduces metrics the same
way for every trainer (hvdtrain/meter.py). Weight decay is an L2 term in the loss
(gradient `weight_decay * w`, as torch's SGD/Adam `weight_decay`), except for AdamW.

    loop = make_loop(cfg, keras, model, backend, trainer, loss)   # loss None: cross-entropy
    loop.run_epoch(dataset, epoch, steps, start_step)   # start_step: where in the epoch it resumes
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from hvdtrain.errors import UsageError
from hvdtrain.phases import tf_split_requested
from hvdtrain.schedule import lr_factor
from hvdtrain.tf import internals
from hvdtrain.tf.data import model_input
from hvdtrain.tf.devices import tf_variable


def make_loop(cfg, keras, model, backend, trainer, loss=None):
    return (FitLoop if cfg.loop == "fit" else CustomLoop)(cfg, keras, model, backend, trainer, loss)


def l2_penalty(variables, weight_decay: float):
    return weight_decay * tf.add_n([tf.nn.l2_loss(v) for v in variables])  # l2_loss = sum(v**2) / 2


def step_stats(labels, logits, loss=None):
    """(sum of the loss over the samples, correct, count) of a batch, float64 (metrics reduce as
    sums), and the batch's mean loss, which the step minimises. loss None: the cross-entropy of
    logits against integer labels, and the correct predictions counted. A user's
    loss(y_true, y_pred) (Keras' order) gives the samples' losses or their mean over the batch, as
    Keras' losses do: its mean times the count is the sum (exact for a short last batch too);
    nothing is counted correct (no accuracy)."""
    if loss is not None:
        mean = tf.reduce_mean(loss(labels, logits))
        n = tf.cast(tf.shape(logits)[0], tf.float64)
        return tf.stack([tf.cast(mean, tf.float64) * n, tf.zeros((), tf.float64), n]), mean
    ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, axis=1), labels), tf.float64))
    n = tf.cast(tf.shape(labels)[0], tf.float64)
    return tf.stack([tf.reduce_sum(tf.cast(ce, tf.float64)), correct, n]), tf.reduce_mean(ce)


class CustomLoop:
    """A GradientTape step in tf.function, on the current Keras (3): in one function with
    Horovod's DistributedGradientTape (or tf.distribute's optimizer) reducing the gradients, or
    split into three functions called one after the other so that the host can time each phase
    (hvdtrain/phases.py): compute (forward, local gradients), sync (their reduction over ranks),
    optimizer (the update).

    The split runs when asked for (HVDTRAIN_TF_PHASES=1), on a CPU: a function's call returns
    there when its kernels have run, so the host clock between calls times each phase; on a GPU
    it returns once they are queued, and timing them would take a device synchronisation: GPUs
    run the step in one function, not split. The split reduces the gradients after the last one
    is computed, not each as it comes during backward (no overlap of the allreduce with
    backward), in three calls instead of one: nothing measurable on ResNet-18, about a quarter of
    the digits CNN's 8 ms step (benchmarks/phases_overhead.py); hence not the default.
    Both ways reduce and apply the gradients with the same operations: the same losses bit for
    bit, and Horovod-TF and MWMS still agree step for step (hvdtrain.compare's parity)."""

    def __init__(self, cfg, keras, model, backend, trainer, loss=None):
        self.cfg, self.model, self.backend, self.trainer = cfg, model, backend, trainer
        user_loss = loss  # None: cross-entropy (step_stats)
        opt = keras.optimizers
        if cfg.optimizer == "sgd":
            self.optimizer = opt.SGD(learning_rate=cfg.lr, momentum=cfg.momentum)
        elif cfg.optimizer == "adam":
            self.optimizer = opt.Adam(learning_rate=cfg.lr)
        else:
            self.optimizer = opt.AdamW(learning_rate=cfg.lr, weight_decay=cfg.weight_decay)
        # Slots now, not in the first step: resume and broadcast need them before training.
        self.optimizer.build(model.trainable_variables)
        self.factor = lr_factor(cfg, trainer.plan.steps_per_epoch, trainer.plan.schedule_steps)
        decay = cfg.weight_decay if cfg.optimizer != "adamw" else 0.0
        # Horovod's tape keys gradients by Variable.ref(), which Keras 3 variables lack: ask for
        # the gradients of the tf.Variables behind them.
        sources = [tf_variable(v) for v in model.trainable_variables]
        self.split = tf_split_requested() and backend.device == "cpu"

        normalization = trainer.input_normalization  # uint8 images, normalised here (tf/data.py model_input)
        # The step's functions are traced without AutoGraph (autograph=False below), as Keras 3's
        # own fit traces its steps: their Python control flow is on Python values only, and
        # AutoGraph's conversion of them and of everything they call (Horovod's tape included)
        # cost 2 CPU-s at every rank's start, a third of a digits run's. A user's loss or model is
        # traced as it is: control flow on tensors goes through tf.cond / tf.while_loop.

        def gradients(x, y, reduce_in_tape):
            with tf.GradientTape() as tape:
                logits = model(model_input(x, normalization), training=True)
                stats, loss = step_stats(y, logits, user_loss)
                if decay:
                    loss += l2_penalty(model.trainable_variables, decay)
                # tf.distribute sums gradients over replicas; Horovod averages them (scale 1).
                loss = loss * backend.gradient_scale
            if reduce_in_tape:  # Horovod: the tape's gradients come back averaged over ranks
                tape = backend.distributed_tape(tape, cfg)
            return stats, tape.gradient(loss, sources)

        if self.split:
            @tf.function(autograph=False)
            def compute(x, y):
                return backend.run(gradients, x, y, False)

            @tf.function(autograph=False)
            def sync(grads):
                return backend.reduce_gradients(grads, cfg)

            @tf.function(autograph=False)
            def update(grads):
                backend.apply_reduced(self.optimizer, grads, model.trainable_variables)
            self.compute, self.sync, self.update = compute, sync, update
        else:
            def replica_step(x, y):
                stats, grads = gradients(x, y, True)
                # tf.distribute: the optimizer all-reduces the gradients
                self.optimizer.apply_gradients(zip(grads, model.trainable_variables))
                return stats

            @tf.function(autograph=False)
            def train_step(x, y):
                return backend.run(replica_step, x, y)  # tf.distribute: strategy.run; Horovod: a call
            self.train_step = train_step

    def optimizer_variables(self) -> list:
        return list(self.optimizer.variables)

    def run_epoch(self, dataset, epoch: int, steps: int, start_step: int) -> None:
        meter = self.trainer.meter
        for i, (x, y) in enumerate(dataset):
            if i == steps:
                break
            self.trainer.before_step()
            meter.phase("data")
            stats = self._split_step(x, y) if self.split else self._step(x, y)
            if self.trainer.step_done(stats.numpy()):
                break

    def _set_lr(self) -> None:
        self.optimizer.learning_rate = self.cfg.lr * self.factor(self.trainer.position.global_step)

    def _step(self, x, y):
        self._set_lr()
        return self.train_step(x, y)

    def _split_step(self, x, y):
        meter = self.trainer.meter
        stats, grads = self.compute(x, y)
        meter.phase("compute")
        if self.backend.world_size > 1:  # (one rank: nothing to reduce, and a call costs ~0.5 ms)
            grads = self.sync(grads)
        meter.phase("sync")
        self._set_lr()
        self.update(grads)
        meter.phase("optimizer")
        return stats


class FitLoop:
    """Keras 2 (tf_keras) `model.fit` with horovod.tensorflow.keras, one fit call per epoch. The
    model is compiled here, with hvdtrain's optimizer and the loss (a model compiled before keeps
    neither its optimizer nor its metrics)."""

    split = False  # Keras runs fit's step: not split into phases (no breakdown)

    def __init__(self, cfg, keras, model, backend, trainer, loss=None):
        self.cfg, self.model, self.trainer = cfg, model, trainer
        if cfg.optimizer == "adamw":
            raise UsageError("--loop fit uses tf-keras's legacy optimizers (Horovod's LR callbacks need "
                             "them), which have no AdamW; use --optimizer sgd|adam or --loop custom")
        if cfg.warmup_epochs != int(cfg.warmup_epochs):
            raise UsageError("--loop fit warms up over whole epochs (Horovod's LearningRateWarmupCallback); "
                             f"got --warmup-epochs {cfg.warmup_epochs:g}")
        legacy = keras.optimizers.legacy
        base = (legacy.SGD(learning_rate=cfg.lr, momentum=cfg.momentum) if cfg.optimizer == "sgd"
                else legacy.Adam(learning_rate=cfg.lr))
        self.optimizer = backend.keras_optimizer(base, cfg)
        # Slots now, not in the first step: resume and broadcast need them before training.
        internals.create_slots(self.optimizer, model.trainable_variables)
        if cfg.weight_decay:
            model.add_loss(lambda: l2_penalty(model.trainable_variables, cfg.weight_decay))
        # The step's loss apart from the L2 term (fit's "loss" log includes it), and the accuracy.
        if loss is None:
            model.compile(optimizer=self.optimizer,
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          metrics=[keras.metrics.SparseCategoricalAccuracy(name="acc"),
                                   keras.metrics.SparseCategoricalCrossentropy(from_logits=True, name="ce")])
            logged = ("ce", "acc")
        else:
            model.compile(optimizer=self.optimizer, loss=loss,
                          metrics=[keras.metrics.MeanMetricWrapper(loss, name="user_loss")])
            logged = ("user_loss", None)
        self.lr_callbacks = self._lr_callbacks(keras, backend)
        self.callbacks = backend.fit_callbacks() + self.lr_callbacks
        self.progress = _Progress(keras, trainer, cfg.batch_size, *logged)

    def _lr_callbacks(self, keras, backend) -> list:
        cfg, spe = self.cfg, self.trainer.plan.steps_per_epoch
        warmup = int(cfg.warmup_epochs)
        callbacks = []
        if warmup:
            callbacks.append(backend.lr_warmup_callback(cfg.lr, warmup, spe))
        if cfg.lr_schedule != "constant":
            factor = lr_factor(cfg, spe, self.trainer.plan.schedule_steps)
            callbacks.append(backend.lr_schedule_callback(cfg.lr, lambda e: factor(round(e * spe)), warmup, spe))
        # Horovod's LR callbacks place a batch at epoch + batch / steps_per_epoch; a fit call
        # that resumes in the middle of an epoch counts its batches from 0.
        return [_ShiftBatches(keras, cb) for cb in callbacks]

    def optimizer_variables(self) -> list:
        return list(self.optimizer.variables())

    def run_epoch(self, dataset, epoch: int, steps: int, start_step: int) -> None:
        for cb in self.lr_callbacks:
            cb.shift = start_step
        self.model.fit(dataset, epochs=epoch + 1, initial_epoch=epoch, steps_per_epoch=steps,
                       callbacks=self.callbacks + [self.progress], verbose=0)


# The two callbacks below subclass the Callback of the Keras that fit runs on (tf_keras), which
# is known only at run time: hence a function that makes the class.
def _ShiftBatches(keras, inner):
    """A callback that forwards to `inner`, passing its batch hooks `batch + shift`."""

    class ShiftBatches(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.inner, self.shift = inner, 0

        def set_model(self, model):
            super().set_model(model)
            inner.set_model(model)

        def set_params(self, params):
            super().set_params(params)
            inner.set_params(params)

        def on_train_begin(self, logs=None):
            inner.on_train_begin(logs)

        def on_epoch_begin(self, epoch, logs=None):
            inner.on_epoch_begin(epoch, logs)

        def on_train_batch_begin(self, batch, logs=None):
            inner.on_train_batch_begin(batch + self.shift, logs)

        def on_train_batch_end(self, batch, logs=None):
            inner.on_train_batch_end(batch + self.shift, logs)

        def on_epoch_end(self, epoch, logs=None):
            inner.on_epoch_end(epoch, logs)

    return ShiftBatches()


def _Progress(keras, trainer, batch_size: int, loss_log: str, accuracy_log: str | None):
    """Reports each fit step to the trainer with its (loss sum, correct, count), recovered from
    Keras' running means of the logs named (no accuracy log: nothing correct), and stops fit when
    the trainer says so."""

    class Progress(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.seen = np.zeros(3)

        def on_train_batch_begin(self, batch, logs=None):
            trainer.before_step()

        def on_train_batch_end(self, batch, logs=None):
            n = (batch + 1) * batch_size  # fit's batches are full: drop_remainder
            correct = logs[accuracy_log] * n if accuracy_log else 0.0
            cumulative = np.array([logs[loss_log] * n, correct, n], dtype=np.float64)
            stats, self.seen = cumulative - self.seen, cumulative
            if trainer.step_done(stats):
                self.model.stop_training = True

    return Progress()

