"""A user's dataset that writes down which training samples each rank reads, in order: for a
resize test that counts what the trainer really trained (tests/test_reliability.py).

    mpirun -np 2 python -m hvdtrain.torch --model tests/scripts/logged_samples.py:build_model \\
        --dataset tests/scripts/logged_samples.py:datasets --num-workers 1

Each rank's decode worker appends the indices it reads to $SAMPLE_LOG_DIR/rank-R.txt, one per
line, in the order it reads them (with one worker, the order its batches are trained in); the
trainer's own looks at a sample before training (in the rank's process) are not written."""
import os

import torch
from torch import nn
from torch.utils.data import Dataset, get_worker_info

SAMPLES = 300


class Logged(Dataset):
    def __init__(self, n: int, log: bool):
        g = torch.Generator().manual_seed(n)
        self.x, self.y = torch.randn(n, 8, generator=g), torch.randint(0, 2, (n,), generator=g)
        self.log = log

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.log and get_worker_info() is not None:
            rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("SLURM_PROCID", "0"))
            with open(os.path.join(os.environ["SAMPLE_LOG_DIR"], f"rank-{rank}.txt"), "a") as f:
                f.write(f"{int(i)}\n")
        return self.x[i], self.y[i]


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 2))


def datasets():
    return Logged(SAMPLES, log=True), Logged(40, log=False)
