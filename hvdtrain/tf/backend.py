"""What the TF trainer (hvdtrain/tf/train.py) and its loops (hvdtrain/tf/loops.py) ask of their
backend, declared once: every backend of hvdtrain/backends.py for TF subclasses `TFBackend`.

Abstract methods must be written by each backend; the others default to what Horovod does
(no strategy scope, a step called as it is). The Keras fit loop's methods exist only where
`--loop fit` is allowed (Horovod); backends.py refuses `--loop fit` for the others before
anything starts, so their defaults, which raise, are never reached.

    with b.scope(): model, optimizer           # tf.distribute: mirrored variables
    b.run(replica_step, x, y)                  # inside the tf.function of a step
    tape = b.distributed_tape(tape, cfg)       # gradients reduced over ranks (the step in one function)

The custom loop's step split into phases (hvdtrain/tf/loops.py) runs the same reduction in a
tf.function of its own, then the update where the optimizer does not reduce again:

    grads = b.reduce_gradients(grads, cfg)         # the sync phase
    b.apply_reduced(optimizer, grads, variables)   # the optimizer phase
"""
from __future__ import annotations

import abc
import contextlib

from hvdtrain.collectives import Collectives


class TFBackend(Collectives):
    local_world_size: int  # ranks on this host: which GPU is this rank's
    device: str            # this rank's device, for the log and the result file
    # What each rank's loss is multiplied by: 1 where the backend averages the gradients
    # (Horovod), 1 / world size where it sums them (tf.distribute).
    gradient_scale: float = 1.0

    # ------------------------------------------------------------------ the custom loop
    def scope(self):
        """The context the model and optimizer are built in."""
        return contextlib.nullcontext()

    def run(self, step_fn, *args):
        """One replica step, inside the step's tf.function."""
        return step_fn(*args)

    @abc.abstractmethod
    def distributed_tape(self, tape, cfg):
        """The tape whose gradient() the step applies: reduced over ranks where the optimizer does not."""

    @abc.abstractmethod
    def reduce_gradients(self, grads, cfg):
        """The local gradients of a step reduced over ranks exactly as the step in one function
        reduces them (distributed_tape's, or the optimizer's), inside a tf.function of their own."""

    def apply_reduced(self, optimizer, grads, variables) -> None:
        """The Keras optimizer's update with gradients reduced already (by reduce_gradients),
        inside a tf.function of its own; a backend whose optimizer reduces the gradients it is
        given (tf.distribute) keeps it from reducing them again."""
        optimizer.apply_gradients(zip(grads, variables))

    # ------------------------------------------------------------------ state
    @abc.abstractmethod
    def broadcast_variables(self, variables) -> None:
        """Every rank takes rank 0's values of `variables`."""

    @abc.abstractmethod
    def average_variables(self, variables) -> None:
        """Every rank: the floating-point `variables` (BatchNorm statistics) replaced by their mean over ranks."""

    # ------------------------------------------------------------------ the Keras fit loop
    def keras_optimizer(self, optimizer, cfg):
        """`optimizer` reducing gradients over ranks inside model.fit."""
        raise NotImplementedError(self._no_fit_loop())

    def fit_callbacks(self) -> list:
        """Callbacks that go first in model.fit's list, in this order."""
        raise NotImplementedError(self._no_fit_loop())

    def lr_warmup_callback(self, initial_lr: float, warmup_epochs: int, steps_per_epoch: int):
        raise NotImplementedError(self._no_fit_loop())

    def lr_schedule_callback(self, initial_lr: float, multiplier, start_epoch: int, steps_per_epoch: int):
        raise NotImplementedError(self._no_fit_loop())

    def _no_fit_loop(self) -> str:
        return f"--backend {self.name} has no Keras fit loop (use --loop custom)"
