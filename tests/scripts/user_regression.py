"""A user's own regression, none of hvdtrain's built-in workloads: a Dataset class of its own, a
small network with BatchNorm (buffers) and dropout, and a loss of its own (mean squared error).

Through the command line, each part named by FILE.py:FUNCTION:

    mpirun -np 2 python -m hvdtrain.torch --model tests/scripts/user_regression.py:build_model \\
        --dataset tests/scripts/user_regression.py:datasets --loss tests/scripts/user_regression.py:mse

Through hvdtrain.torch.fit (options as JSON):

    mpirun -np 2 python tests/scripts/user_regression.py '{"backend": "ddp", "epochs": 4}'
"""
import json
import sys

import torch
from torch import nn
from torch.utils.data import Dataset


class Regression(Dataset):
    """y = x . w + noise, x in R^8."""

    def __init__(self, n: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 8, generator=g)
        self.y = (self.x @ (torch.arange(1.0, 9.0) / 14) + 0.1 * torch.randn(n, generator=g)).unsqueeze(1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))


def datasets():
    return Regression(512, seed=0), Regression(128, seed=1)


def mse(outputs, targets):
    return ((outputs - targets) ** 2).mean()


if __name__ == "__main__":
    import hvdtrain.torch

    torch.manual_seed(0)  # the same initial weights at every run (rank 0's are broadcast anyway)
    train, val = datasets()
    result = hvdtrain.torch.fit(build_model(), train, val, loss=mse, **json.loads(sys.argv[1]))
    if result["config"]["result_json"] is None:
        print(json.dumps(result["final"]))
