"""TensorFlow device and variable helpers shared by the TF backends and loops."""
from __future__ import annotations

import tensorflow as tf

from hvdtrain.cluster import gpu_for_rank


def tf_variable(v) -> tf.Variable:
    """The tf.Variable behind a Keras 3 variable (tf_keras' variables are tf.Variables already).
    Horovod's broadcast_variables assigns inside a tf.function, where a Keras 3 variable would
    arrive as a plain tensor."""
    return v if isinstance(v, tf.Variable) else v.value


def pin_gpu(local_rank: int, local_world_size: int) -> str:
    """One GPU per rank, the one hvdtrain.cluster.gpu_for_rank picks among those this process sees
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
