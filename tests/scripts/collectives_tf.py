"""Horovod allreduce and broadcast of TensorFlow tensors: every rank checks what it receives."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

hvd.init()
rank, size = hvd.rank(), hvd.size()
assert size == 2, f"rank {rank}: expected 2 ranks, got {size}"

summed = hvd.allreduce(tf.constant([rank + 1.0, 10.0 * rank]), op=hvd.Sum, name="sum").numpy()
expected = np.array([sum(r + 1.0 for r in range(size)), sum(10.0 * r for r in range(size))])
assert np.array_equal(summed, expected), f"rank {rank}: allreduce sum {summed} != {expected}"

averaged = hvd.allreduce(tf.fill([3], float(rank)), op=hvd.Average, name="avg").numpy()
assert np.allclose(averaged, (size - 1) / 2), f"rank {rank}: average {averaged}"

value = tf.range(4.0) + 100 if rank == 0 else tf.zeros(4)
received = hvd.broadcast(value, root_rank=0, name="bcast").numpy()
assert np.array_equal(received, np.arange(4.0) + 100), f"rank {rank}: broadcast got {received}"

var = tf.Variable(tf.fill([2], float(rank + 7)))
hvd.broadcast_variables([var], root_rank=0)
assert np.array_equal(var.numpy(), [7.0, 7.0]), f"rank {rank}: broadcast_variables got {var.numpy()}"
print(f"COLLECTIVES-OK tf rank {rank}/{size} sum={summed.tolist()}", flush=True)
