"""tf.distribute MultiWorkerMirroredStrategy as an hvdtrain.tf backend, for comparison with Horovod.

    mpirun -np 2 python -m hvdtrain.tf --backend mwms --loop custom --model mnist_cnn --dataset digits
    srun --mpi=pmix -n 2 python -m hvdtrain.tf --backend mwms --loop custom ...

One worker per rank, one replica per worker. The cluster is TF_CONFIG built from every rank's
address, gathered over MPI, under srun and mpirun alike: each rank picks a port that is free on
its node. (TF's SlurmClusterResolver derives the ports from the job and step ids, the pattern that
made DDP fail when another program held the port: hvdtrain/torch/backend_ddp.py.) Each rank feeds
its own shard (the datasets are not auto-sharded), exactly as under Horovod.
"""
from __future__ import annotations

import json
import os
import pickle
import socket

import numpy as np
import tensorflow as tf

from hvdtrain.cluster.env import ClusterEnv, free_port
from hvdtrain.cluster.horovod_ops import check_launcher_agrees
from hvdtrain.tf import internals
from hvdtrain.tf.backend import TFBackend
from hvdtrain.tf.devices import pin_gpu


def cluster_resolver(env: ClusterEnv):
    """The resolver for this launch, or None for a single process."""
    if env.world_size == 1:
        return None
    from mpi4py import MPI

    # Under srun without PMIx each rank is an MPI singleton, which would gather its own address alone.
    check_launcher_agrees(MPI.COMM_WORLD.Get_size(), "MPI", env)
    addresses = MPI.COMM_WORLD.allgather(f"{socket.gethostname()}:{free_port()}")
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": addresses},
                                          "task": {"type": "worker", "index": env.rank}})
    return tf.distribute.cluster_resolver.TFConfigClusterResolver()


def collective_implementation(on_gpu: bool) -> str:
    """The CommunicationImplementation MWMS all-reduces with: NCCL on GPUs, where Horovod uses
    NCCL too (AUTO would run TF's own ring all-reduce there: TF picks NCCL only when asked, so the
    Horovod-TF vs MWMS comparison would be NCCL against a ring); AUTO on CPUs, TF's ring (as before)."""
    return "NCCL" if on_gpu else "AUTO"


class MWMSBackend(TFBackend):
    name = "mwms"

    def __init__(self, cfg):
        env = ClusterEnv.from_environ()
        self.rank, self.local_rank = env.rank, env.local_rank
        self.world_size, self.local_world_size = env.world_size, env.local_world_size
        self.device = pin_gpu(self.local_rank, self.local_world_size)
        self.communication = collective_implementation(on_gpu=self.device != "cpu")
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=getattr(tf.distribute.experimental.CommunicationImplementation, self.communication))
        self.strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=cluster_resolver(env),
                                                                  communication_options=options)
        # tf.distribute sums the replicas' gradients: each rank's loss is scaled by 1/world size.
        self.gradient_scale = 1.0 / self.strategy.num_replicas_in_sync

        @tf.function(autograph=False)  # no Python control flow on tensors (hvdtrain/tf/loops.py)
        def all_sum(tensor):
            per_replica = self.strategy.run(tf.identity, args=(tensor,))
            return self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        self._all_sum = all_sum

    def scope(self):
        return self.strategy.scope()

    def run(self, step_fn, *args):
        return self.strategy.run(step_fn, args=args)

    def distributed_tape(self, tape, cfg):
        return tape  # the optimizer all-reduces the gradients under the strategy

    def reduce_gradients(self, grads, cfg):
        # The all-reduce Keras' optimizer makes in a replica context (its
        # _all_reduce_sum_gradients: the replica context's all_reduce, a sum of the list), made here
        # in a tf.function of its own so that the loop can time it apart from compute.
        def all_reduce(grads):
            # Copied onto the replica's device first: the function's inputs have none, and the
            # all-reduce sends its result to its inputs' devices.
            grads = [tf.identity(g) for g in grads]
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, grads)
        return self.strategy.run(all_reduce, args=(grads,))

    def apply_reduced(self, optimizer, grads, variables):
        # Keras' optimizer updates the variables in a merge_call, which only a replica context
        # has, and there it first sums the gradients over the replicas itself: here it is told
        # that they are summed already (by reduce_gradients, with the same all-reduce).
        def apply(grads):
            with internals.summed_already(optimizer):
                optimizer.apply_gradients(zip(grads, variables))
        self.strategy.run(apply, args=(grads,))

    def _sum(self, array: np.ndarray) -> np.ndarray:
        if self.world_size == 1:
            return np.asarray(array)
        return self._all_sum(tf.constant(array)).numpy()

    def broadcast_variables(self, variables):
        """Rank 0's values everywhere: a sum in which the other ranks contribute zeros (exact)."""
        for v in variables:
            value = v.numpy() if self.rank == 0 else np.zeros(v.shape, dtype=v.dtype.as_numpy_dtype
                                                               if hasattr(v.dtype, "as_numpy_dtype") else v.dtype)
            v.assign(self._sum(value))

    def average_variables(self, variables):
        for v in variables:
            if tf.as_dtype(v.dtype).is_floating:
                v.assign(self._sum(v.numpy()) / self.world_size)

    def allreduce_sum(self, values, name: str) -> np.ndarray:
        return self._sum(np.asarray(values, dtype=np.float64))

    def broadcast_object(self, obj, name: str):
        data = pickle.dumps(obj) if self.rank == 0 else b""
        size = int(self._sum(np.array([len(data)], dtype=np.float64))[0])
        buf = np.zeros(size, dtype=np.float64)
        if self.rank == 0:
            buf[:] = np.frombuffer(data, dtype=np.uint8)
        return pickle.loads(self._sum(buf).astype(np.uint8).tobytes())

    def allgather_object(self, obj, name: str) -> list:
        data = pickle.dumps(obj)
        sizes = np.zeros(self.world_size)
        sizes[self.rank] = len(data)
        sizes = self._sum(sizes).astype(int)
        buf = np.zeros((self.world_size, sizes.max()))
        buf[self.rank, :len(data)] = np.frombuffer(data, dtype=np.uint8)
        buf = self._sum(buf).astype(np.uint8)
        return [pickle.loads(buf[r, :sizes[r]].tobytes()) for r in range(self.world_size)]

    def barrier(self):
        self._sum(np.zeros(1))

    def describe(self) -> dict:
        return {"backend": self.name, "num_replicas_in_sync": self.strategy.num_replicas_in_sync,
                "communication": self.communication, "tf_config": os.environ.get("TF_CONFIG")}

    def shutdown(self):
        pass
