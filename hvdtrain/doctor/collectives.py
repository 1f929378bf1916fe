"""The doctor's collectives: allreduce, broadcast and allgather checked through Horovod (torch's or
TensorFlow's ops), timed, and the same allreduce through the MPI library directly (mpi4py), with
nccl-tests' bandwidth figures."""
from __future__ import annotations

import time

from hvdtrain.doctor.health import numpy_health, tf_gpu_health, torch_health


def bus_bandwidth(nbytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for an allreduce, as nccl-tests define them: busbw = algbw x 2(n-1)/n,
    the traffic each link carries, comparable across rank counts."""
    algbw = nbytes / seconds / 1e9 if seconds > 0 else float("inf")
    return algbw, algbw * (2 * (world_size - 1) / world_size if world_size > 1 else 1.0)


# ------------------------------------------------------------------ the same allreduce through MPI
def _import_mpi4py():
    """mpi4py's MPI module, told never to initialise or finalise MPI itself: Horovod initialised it
    (mpi4py then only attaches to it) and Horovod finalises it; a second MPI_Finalize would fail."""
    import mpi4py

    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = False
    from mpi4py import MPI
    return MPI


def mpi4py_for_comparison(hvd, size: int):
    """(mpi4py's MPI module, None) when this rank can run the allreduce through the MPI library
    Horovod runs on, else (None, why not)."""
    if not hvd.mpi_built():
        return None, "this Horovod is built without MPI"
    if not hvd.mpi_enabled():
        return None, ("Horovod runs with Gloo (horovodrun --gloo, or HOROVOD_CONTROLLER=gloo), "
                      "so MPI is not initialised")
    try:
        MPI = _import_mpi4py()
    except Exception as err:  # noqa: BLE001 - the reason is the report
        return None, f"mpi4py does not import ({_one_line(err)})"
    if not MPI.Is_initialized() or MPI.Is_finalized():
        # mpi4py built against another MPI library than the one Horovod loaded.
        return None, "mpi4py's MPI library is not the one Horovod initialised"
    if MPI.COMM_WORLD.Get_size() != size:
        return None, f"MPI's world has {MPI.COMM_WORLD.Get_size()} ranks, Horovod's {size}"
    if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        # Horovod's background thread keeps calling MPI: calls from this thread beside it are
        # only allowed at MPI_THREAD_MULTIPLE (which Horovod asks for, and warns without).
        return None, "MPI was initialised below MPI_THREAD_MULTIPLE, so no MPI call may run beside Horovod's"
    return MPI, None


def time_mpi_allreduce(MPI, nbytes: int, iters: int) -> float:
    """Seconds per MPI_Allreduce (sum) of `nbytes` of float32 in host memory across COMM_WORLD:
    two warm-ups, a barrier, then `iters` timed, as Horovod's are timed."""
    import numpy as np

    comm = MPI.COMM_WORLD
    send = np.ones(max(1, nbytes // 4), dtype=np.float32)
    recv = np.empty_like(send)
    for _ in range(2):
        comm.Allreduce(send, recv, op=MPI.SUM)
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        comm.Allreduce(send, recv, op=MPI.SUM)
    return (time.perf_counter() - start) / iters


class TorchOps:
    def __init__(self, hvd, gpu: int | None):
        import torch
        self.torch, self.hvd = torch, hvd
        self.device = torch.device("cpu") if gpu is None else torch.device("cuda", gpu)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)

    def gpus(self) -> int:
        return self.torch.cuda.device_count() if self.torch.cuda.is_available() else 0

    def allreduce_check(self, size: int) -> bool:
        t = self.torch.full((1000,), float(self.hvd.rank() + 1), device=self.device)
        total = self.hvd.allreduce(t, op=self.hvd.Sum, name="doctor.sum")
        avg = self.hvd.allreduce(t, name="doctor.avg")
        return bool((total == size * (size + 1) / 2).all()) and bool((avg == (size + 1) / 2).all())

    def broadcast_check(self) -> bool:
        t = self.torch.arange(1000, dtype=self.torch.float32, device=self.device) * (self.hvd.rank() + 1)
        got = self.hvd.broadcast(t, root_rank=0, name="doctor.bcast")
        return bool((got == self.torch.arange(1000, dtype=self.torch.float32, device=self.device)).all())

    def allgather_object(self, obj, name: str = "doctor.gather"):
        return self.hvd.allgather_object(obj, name=name)

    def health(self, threads: int, slowdown: int) -> dict:
        return torch_health(self.torch, self.device, threads, slowdown)

    def time_allreduce(self, nbytes: int, iters: int) -> float:
        t = self.torch.ones(max(1, nbytes // 4), dtype=self.torch.float32, device=self.device)
        for i in range(2):
            self.hvd.allreduce(t, name=f"doctor.warm.{nbytes}")
        self._sync()
        start = time.perf_counter()
        for i in range(iters):
            self.hvd.allreduce(t, name=f"doctor.bw.{nbytes}")
        self._sync()
        return (time.perf_counter() - start) / iters

    def _sync(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()


class TFOps:
    def __init__(self, hvd, gpu: int | None):
        import tensorflow as tf
        self.tf, self.hvd, self.gpu = tf, hvd, gpu

    def gpus(self) -> int:
        return len(self.tf.config.list_physical_devices("GPU"))

    def allreduce_check(self, size: int) -> bool:
        t = self.tf.fill([1000], float(self.hvd.rank() + 1))
        total = self.hvd.allreduce(t, op=self.hvd.Sum, name="doctor.sum")
        avg = self.hvd.allreduce(t, name="doctor.avg")
        return bool(self.tf.reduce_all(total == size * (size + 1) / 2)) and bool(self.tf.reduce_all(avg == (size + 1) / 2))

    def broadcast_check(self) -> bool:
        base = self.tf.range(1000, dtype=self.tf.float32)
        got = self.hvd.broadcast(base * float(self.hvd.rank() + 1), root_rank=0, name="doctor.bcast")
        return bool(self.tf.reduce_all(got == base))

    def allgather_object(self, obj, name: str = "doctor.gather"):
        return self.hvd.allgather_object(obj, name=name)

    def health(self, threads: int, slowdown: int) -> dict:
        # The CPU kernel in numpy: these checks run where torch's Horovod ops are missing.
        return tf_gpu_health(self.tf, self.gpu, slowdown) if self.gpu is not None else numpy_health(slowdown)

    def time_allreduce(self, nbytes: int, iters: int) -> float:
        t = self.tf.ones([max(1, nbytes // 4)], dtype=self.tf.float32)
        for _ in range(2):
            self.hvd.allreduce(t, name=f"doctor.warm.{nbytes}").numpy()
        start = time.perf_counter()
        for _ in range(iters):
            self.hvd.allreduce(t, name=f"doctor.bw.{nbytes}").numpy()
        return (time.perf_counter() - start) / iters


def _mpi_library() -> str:
    try:
        # After hvd.init: under Horovod's MPI controller MPI is initialised and mpi4py only attaches;
        # under Gloo it stays uninitialised (the library version needs no MPI_Init).
        MPI = _import_mpi4py()

        # The C string comes with its terminating NUL (Open MPI 4).
        return " ".join(MPI.Get_library_version().replace("\0", "").split("\n")[0].split())
    except Exception as err:  # noqa: BLE001
        return f"unknown ({type(err).__name__})"


def _one_line(err: Exception) -> str:
    """An exception as its type and the first line of its message."""
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
