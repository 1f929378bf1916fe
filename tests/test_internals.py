"""The framework internals hvdtrain reaches (hvdtrain/torch/internals.py, hvdtrain/tf/internals.py)
still exist and still do what hvdtrain uses them for, on the installed versions: an upgrade that
removes or renames one fails here, not as a hang or a skipped refusal in a job. Each framework in
its own process (TensorFlow and torch are not imported into one here)."""
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow  # two fresh interpreters importing whole frameworks: 10-20 s

TORCH_SIDE = """
import torch
from torch.utils.data import DataLoader

from hvdtrain.torch import internals

if __name__ == "__main__":
    # A loader whose worker lives across epochs: ended at once, torch's SIGCHLD check told first.
    loader = DataLoader(list(range(8)), batch_size=2, num_workers=1, persistent_workers=True)
    next(iter(loader))
    [worker] = loader._iterator._workers
    internals.end_loader_workers(loader)
    assert loader._iterator is None and not worker.is_alive()
    internals.end_loader_workers(loader)  # nothing live: nothing to do

    floats = internals.shared_floats(6)
    assert floats.is_shared() and floats.numel() == 6 and floats.dtype == torch.float32

    x = torch.ones(3, requires_grad=True)
    y = (x * 2).sum()
    seen = []
    y.register_hook(lambda grad: internals.at_end_of_backward(lambda: seen.append(x.grad is not None)))
    y.backward()
    assert seen == [True], seen  # once, after the last gradient

    from lightning.pytorch import Trainer
    from lightning.pytorch.strategies import DDPStrategy
    assert internals.layer_sync(DDPStrategy()) is None
    synced = Trainer(strategy=DDPStrategy(), sync_batchnorm=True, accelerator="cpu", devices=1, logger=False)
    assert internals.layer_sync(synced.strategy) is not None
    print("torch internals ok")
"""

TF_SIDE = """
from hvdtrain.tf import internals, keras_compat

keras_compat.select("fit")  # Keras 2 (tf_keras) as hvdtrain.tf.start() makes it
import numpy as np
import tf_keras

model = tf_keras.Sequential([tf_keras.layers.Dense(2, input_shape=(3,))])
optimizer = tf_keras.optimizers.legacy.SGD(0.1)
assert internals.create_slots(optimizer, model.trainable_variables) and optimizer.iterations is not None
assert not internals.averages_over_ranks(optimizer)
hvd_keras = keras_compat.import_horovod_keras()
assert internals.averages_over_ranks(hvd_keras.DistributedOptimizer(tf_keras.optimizers.legacy.SGD(0.1)))
model.compile(optimizer=optimizer, loss="mse", steps_per_execution=3)
assert internals.steps_per_execution(model) == 3
try:
    internals.steps_per_execution(object())
    raise AssertionError("a model without steps_per_execution was taken as 1")
except RuntimeError as err:
    assert "has no steps_per_execution" in str(err)

import keras  # Keras 3's TF optimizer, as MWMS's phased step uses it
keras_optimizer = keras.optimizers.SGD(0.1)
with internals.summed_already(keras_optimizer):
    assert keras_optimizer._all_reduce_sum_gradients([1, 2]) == [1, 2]
assert keras_optimizer._all_reduce_sum_gradients.__func__ is type(keras_optimizer)._all_reduce_sum_gradients
print("tf internals ok")
"""


@pytest.fixture(scope="module")
def sides():
    """Both sides at once (each is mostly its framework's import)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    procs = {name: subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=env)
             for name, code in (("torch", TORCH_SIDE), ("tf", TF_SIDE))}
    done = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=180)
        done[name] = (proc.returncode, out, err)
    return done


def _ok(side) -> str:
    returncode, out, err = side
    assert returncode == 0, out + err[-3000:]
    return out


def test_torch_and_lightning_internals_hvdtrain_reaches_still_work(sides):
    assert "torch internals ok" in _ok(sides["torch"])


def test_tensorflow_keras_and_horovod_internals_hvdtrain_reaches_still_work(sides):
    assert "tf internals ok" in _ok(sides["tf"])
