"""Horovod for the TF trainer: the product's backend (hvdtrain/backends.py lists them all).

It answers what the loops ask (declared in hvdtrain/tf/backend.py): wrap a GradientTape (custom loop) or a Keras
optimizer plus its callbacks (fit loop), broadcast variables from rank 0, average BatchNorm
statistics, and the collectives of hvdtrain.collectives.

    tape = backend.distributed_tape(tape, cfg)          # gradients averaged over ranks
    grads = backend.reduce_gradients(grads, cfg)        # the same, for the step split into phases
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from hvdtrain.cluster.horovod_ops import import_horovod, start_horovod
from hvdtrain.tf.backend import TFBackend
from hvdtrain.tf.devices import pin_gpu, tf_variable


class HorovodBackend(TFBackend):
    name = "horovod"
    # gradient_scale, scope and run: the defaults. The loss of a rank's batch is used as is
    # (Horovod averages the gradients), and a step needs no strategy around it.

    def __init__(self, cfg):
        self.hvd = hvd = import_horovod("horovod.tensorflow")
        self.tuning = start_horovod(hvd, cfg, not tf.config.list_physical_devices("GPU"))
        self.rank, self.local_rank = hvd.rank(), hvd.local_rank()
        self.world_size, self.local_world_size = hvd.size(), hvd.local_size()
        self.device = pin_gpu(self.local_rank, self.local_world_size)

    def _reduce_options(self, cfg) -> dict:
        hvd = self.hvd
        return {"compression": hvd.Compression.fp16 if cfg.fp16_allreduce else hvd.Compression.none,
                "op": hvd.Adasum if cfg.use_adasum else hvd.Average}

    # Custom loop ---------------------------------------------------------------------------
    def distributed_tape(self, tape, cfg):
        # Horovod: tape.gradient() returns the gradients allreduced (averaged) over ranks.
        return self.hvd.DistributedGradientTape(tape, **self._reduce_options(cfg))

    def reduce_gradients(self, grads, cfg):
        # What DistributedGradientTape.gradient() does with the tape's gradients, with the same
        # options: one hvd.allreduce per gradient, fused by Horovod's background thread. Here in
        # a tf.function of its own, after the last local gradient, so that the loop can time the
        # wait for the other ranks apart from compute.
        options = self._reduce_options(cfg)
        return [None if g is None else self.hvd.allreduce(g, **options) for g in grads]

    # Keras fit loop ------------------------------------------------------------------------
    def keras_optimizer(self, optimizer, cfg):
        from hvdtrain.tf.keras_compat import import_horovod_keras

        hvd_keras = import_horovod_keras()
        # Horovod: allreduce gradients inside the optimizer's compute-gradients step.
        return hvd_keras.DistributedOptimizer(optimizer, **self._reduce_options(cfg))

    def fit_callbacks(self) -> list:
        from hvdtrain.tf.keras_compat import import_horovod_keras

        callbacks = import_horovod_keras().callbacks
        return [
            # Horovod: copy rank 0's variables (and optimizer slots) to every rank after the
            # first batch. The trainer broadcasts once before fit already (hvdtrain/tf/train.py);
            # this keeps variables Keras creates lazily in the first step in sync too.
            callbacks.BroadcastGlobalVariablesCallback(0),
            # Horovod: average the epoch's logged metrics over ranks, before other callbacks read them.
            callbacks.MetricAverageCallback(),
        ]

    def lr_warmup_callback(self, initial_lr: float, warmup_epochs: int, steps_per_epoch: int):
        from hvdtrain.tf.keras_compat import import_horovod_keras

        # Horovod: ramp the LR from initial_lr / size to initial_lr over the first epochs.
        return import_horovod_keras().callbacks.LearningRateWarmupCallback(
            initial_lr=initial_lr, warmup_epochs=warmup_epochs, steps_per_epoch=steps_per_epoch)

    def lr_schedule_callback(self, initial_lr: float, multiplier, start_epoch: int, steps_per_epoch: int):
        from hvdtrain.tf.keras_compat import import_horovod_keras

        return import_horovod_keras().callbacks.LearningRateScheduleCallback(
            initial_lr=initial_lr, multiplier=multiplier, start_epoch=start_epoch, staircase=False,
            momentum_correction=False, steps_per_epoch=steps_per_epoch)

    # State and metrics ---------------------------------------------------------------------
    def broadcast_variables(self, variables):
        if variables:
            # Horovod: every rank takes rank 0's values.
            self.hvd.broadcast_variables([tf_variable(v) for v in variables], root_rank=0)

    def average_variables(self, variables):
        """BatchNorm moving statistics are per rank under Horovod, which reduces gradients only:
        average them before evaluation and checkpoints."""
        variables = [v for v in variables if tf.as_dtype(v.dtype).is_floating]
        if variables:
            averaged = self.hvd.grouped_allreduce([tf.convert_to_tensor(v) for v in variables],
                                                  op=self.hvd.Average, name="hvdtrain.buffers")
            for v, avg in zip(variables, averaged):
                v.assign(avg)

    # Eager collectives are matched across ranks by name: every rank calls them in the same
    # order, each under a name that says what it is for.
    def allreduce_sum(self, values, name: str) -> np.ndarray:
        tensor = tf.constant(np.asarray(values, dtype=np.float64))
        return self.hvd.allreduce(tensor, op=self.hvd.Sum, name=f"hvdtrain.{name}").numpy()

    def broadcast_object(self, obj, name: str):
        return self.hvd.broadcast_object(obj, root_rank=0, name=f"hvdtrain.{name}")

    def allgather_object(self, obj, name: str) -> list:
        return self.hvd.allgather_object(obj, name=f"hvdtrain.{name}")

    def barrier(self):
        # horovod.tensorflow has no barrier(): a blocking allreduce returns only when every rank
        # has joined it.
        self.allreduce_sum([0.0], "barrier")

    def describe(self) -> dict:
        from hvdtrain.result_file import horovod_build_flags

        return {"backend": self.name, "horovod_build_flags": horovod_build_flags(self.hvd),
                "horovod_tuning": self.tuning}

    def shutdown(self):
        self.hvd.shutdown()
