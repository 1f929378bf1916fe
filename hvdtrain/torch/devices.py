"""The torch device of a rank: hvdtrain.cluster.env.gpu_for_rank (the one device decision, which
imports no torch and is unit-tested on the CPU) given the GPUs torch sees.

    python -c "from hvdtrain.torch.devices import rank_device; print(rank_device(0, 1))"
"""
from __future__ import annotations

import ctypes
import os

import torch

from hvdtrain.cluster.env import gpu_for_rank, shares_gpu


def visible_gpus() -> int:
    """The GPUs this process sees (CUDA_VISIBLE_DEVICES, or the task's own under per-task binding)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def nccl_version() -> tuple[int, int, int] | None:
    """The NCCL this process runs with: the libnccl.so.2 loaded (torch's, or a newer one put
    first with LD_PRELOAD), asked at run time. torch.cuda.nccl.version() is the version torch
    was compiled against, which a preloaded library does not change (the first GPU run of the
    shared mode read 2.28.9 from it with 2.30.7 loaded)."""
    try:
        lib = ctypes.CDLL("libnccl.so.2")  # the one already loaded by torch, found by its soname
        code = ctypes.c_int()
        if lib.ncclGetVersion(ctypes.byref(code)) == 0:
            return code.value // 10000, code.value // 100 % 100, code.value % 100
    except (OSError, AttributeError):
        pass
    try:
        version = torch.cuda.nccl.version()
    except Exception:  # a build without NCCL (CPU, ROCm without RCCL)
        return None
    if isinstance(version, int):  # torch < 1.13: 2.30.7 as 23007
        return version // 10000, version // 100 % 100, version % 100
    return tuple(version[:3])


def shared_gpu(local_world_size: int) -> bool:
    """Whether the local ranks share GPUs (HVDTRAIN_SHARE_GPU=1, a test mode: hvdtrain/cluster/env.py);
    if so, NCCL is told to allow it (NCCL >= 2.30), before any communicator exists."""
    if not shares_gpu(local_world_size, visible_gpus()):
        return False
    os.environ.setdefault("NCCL_MULTI_RANK_GPU_ENABLE", "1")
    return True


def rank_device(local_rank: int, local_world_size: int) -> torch.device:
    """cuda:N for this rank (N from gpu_for_rank), else the CPU; refuses ranks sharing a GPU
    unless HVDTRAIN_SHARE_GPU=1 asks for it."""
    gpu = gpu_for_rank(local_rank, local_world_size, visible_gpus())
    shared_gpu(local_world_size)
    return torch.device("cpu") if gpu is None else torch.device("cuda", gpu)


def node_devices(local_world_size: int) -> list[torch.device]:
    """Every local rank's device, as this process sees them: what Lightning's parallel_devices
    lists (its strategy takes entry `local_rank`). Under per-task binding all are cuda:0, each
    task's own GPU; without binding cuda:0..local size-1."""
    return [rank_device(r, local_world_size) for r in range(local_world_size)]
