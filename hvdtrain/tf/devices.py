"""TensorFlow device and variable helpers shared by the TF backends and loops."""
from __future__ import annotations

import tensorflow as tf

from hvdtrain import test_hooks
from hvdtrain.cluster.env import gpu_for_rank


def tf_variable(v) -> tf.Variable:
    """The tf.Variable behind a Keras 3 variable (tf_keras' variables are tf.Variables already).
    Horovod's broadcast_variables assigns inside a tf.function, where a Keras 3 variable would
    arrive as a plain tensor."""
    return v if isinstance(v, tf.Variable) else v.value


def pin_gpu(local_rank: int, local_world_size: int) -> str:
    """One GPU per rank, the one hvdtrain.cluster.env.gpu_for_rank picks among those this process sees
    (the torch trainer's decision: GPUs 0..local_size-1 of the node, or each task's own under
    per-task binding); "cpu" where there is none. Must run before TensorFlow initialises its devices."""
    gpus = tf.config.list_physical_devices("GPU")
    index = gpu_for_rank(local_rank, local_world_size, len(gpus))
    if index is None:
        return "cpu"
    gpu = gpus[index]
    tf.config.set_visible_devices(gpu, "GPU")
    tf.config.experimental.set_memory_growth(gpu, True)  # do not take the whole GPU up front
    return gpu.name


def uint8_input(device: str, loop: str) -> bool:
    """Whether the trainer's image batches come as uint8, are copied to the device ahead of the
    step and normalised there (hvdtrain/tf/data.py's model_input): on a GPU, under the custom loop
    (Keras fit runs its own step, which does not normalise). On a CPU the parallel map normalises:
    there is no bus to spare bytes on, and the step would do in series what the map's threads do
    in parallel."""
    return loop == "custom" and (device != "cpu" or test_hooks.tf_uint8_input_on_cpu())


def input_device(device: str) -> str:
    """Where prefetch_to_device copies the next batches: the rank's GPU, or the host."""
    return "/gpu:0" if device != "cpu" else "/cpu:0"
