"""A user's dataset whose reading fails in rank 1's decode worker at its 200th sample, as a
job's would: `killed` as the kernel's out-of-memory killer ends a worker (SIGKILL), `raising` as
a parallel file system's read error (OSError). Each line "failing at T" (T: the clock) is printed
just before, for a test that times how long the job takes to end after the failure.

    srun python -m hvdtrain.torch --model tests/scripts/failing_dataset.py:build_model \\
        --dataset tests/scripts/failing_dataset.py:killed --num-workers 1"""
import os
import signal
import time

import torch
from torch import nn
from torch.utils.data import Dataset, get_worker_info


class FailsInRank1(Dataset):
    def __init__(self, n: int, how: str | None):
        self.n, self.how, self.reads = n, how, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rank = os.environ.get("SLURM_PROCID", os.environ.get("OMPI_COMM_WORLD_RANK"))
        if self.how and get_worker_info() is not None and rank == "1":
            self.reads += 1
            if self.reads == 200:
                print(f"failing at {time.time():.3f}", flush=True)
                if self.how == "killed":
                    os.kill(os.getpid(), signal.SIGKILL)
                raise OSError(5, "Input/output error", f"/gpfs/data/train/sample-{i}.jpg")
        return torch.full((8,), float(i % 7)), i % 2


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 2))


def killed():
    return FailsInRank1(4096, "killed"), FailsInRank1(64, None)


def raising():
    return FailsInRank1(4096, "raising"), FailsInRank1(64, None)
