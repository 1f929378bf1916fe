"""Every use of TensorFlow's, Keras's and Horovod-TF's private API in hvdtrain, in one place.

Each is something the public API does not offer; each is checked on the versions named beside
it and by tests/test_internals.py, which fails when an upgrade removes or renames what it
reaches (rather than a wrong sum, or a refusal silently skipped, in a user's job).

| what | why | checked on |
|---|---|---|
| tf_keras legacy optimizers' `_create_all_weights` | slots made before the first step: the resume and the broadcast need them (create_slots) | tf_keras 2.15-2.21 |
| Horovod's Keras DistributedOptimizer's `_allreduce_grads` | tell it from a plain optimizer (averages_over_ranks) | horovod 0.28.1 |
| a compiled Keras 2 model's `_steps_per_execution` | interval checkpoints need one batch per execution (steps_per_execution) | tf_keras 2.15-2.21 |
| Keras 3's TF optimizer `_all_reduce_sum_gradients` | MWMS's step split into phases sums gradients once (summed_already) | keras 3.10-3.13 |
"""
from __future__ import annotations

import contextlib


def create_slots(optimizer, variables) -> bool:
    """A Keras 2 legacy optimizer's variables (iterations, slots) made now; False for another
    optimizer (Keras 3's builds them with its public build())."""
    if not hasattr(optimizer, "_create_all_weights"):
        return False
    optimizer._create_all_weights(variables)
    return True


def averages_over_ranks(optimizer) -> bool:
    """Whether a Keras optimizer is Horovod's DistributedOptimizer (it averages gradients)."""
    return hasattr(optimizer, "_allreduce_grads")


def steps_per_execution(model) -> int:
    """Batches a compiled Keras 2 model runs per call of its train function (compile's
    steps_per_execution). Keras 2 keeps it as a private variable; a Keras without it is said, not
    taken as 1 (a refusal that depends on it would be skipped)."""
    value = getattr(model, "_steps_per_execution", None)
    if value is None:
        value = getattr(model, "steps_per_execution", None)  # Keras 3's public name
    if value is None:
        raise RuntimeError(f"{type(model).__module__}.{type(model).__name__} has no steps_per_execution: a "
                           "Keras hvdtrain does not know (tests/test_internals.py)")
    return int(value.numpy()) if hasattr(value, "numpy") else int(value)


@contextlib.contextmanager
def summed_already(optimizer):
    """While a step is traced, Keras' TF optimizer takes its gradients as summed over replicas:
    its _all_reduce_sum_gradients (the replica context's sum, keras/src/backend/tensorflow/
    optimizer.py) returns them as they are. Checked, not assumed: a Keras without it would sum
    them twice."""
    if not callable(getattr(type(optimizer), "_all_reduce_sum_gradients", None)):
        raise RuntimeError(f"{type(optimizer).__module__}.{type(optimizer).__name__} has no "
                           "_all_reduce_sum_gradients: this Keras cannot run the TF step split into phases "
                           "under MWMS (without HVDTRAIN_TF_PHASES=1 it runs in one function)")
    optimizer._all_reduce_sum_gradients = list
    try:
        yield
    finally:
        del optimizer._all_reduce_sum_gradients
