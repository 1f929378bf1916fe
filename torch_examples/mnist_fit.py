"""The IDRIS/JSC courses' MNIST CNN, trained by hvdtrain.torch.fit: the single-process script with
one call in place of its training loop (marked `# hvdtrain:`). Real 8x8 handwritten digits
(scikit-learn's), no download.

    python torch_examples/mnist_fit.py                       # 1 process
    mpirun -np 2 python torch_examples/mnist_fit.py          # 2 ranks
    srun --mpi=pmix -n 2 python torch_examples/mnist_fit.py  # in a Slurm allocation

Prints `final val accuracy: 0.9xxx over 397 samples` (>= 0.95 expected). Extra arguments are
fit's options as JSON, e.g. '{"epochs": 3, "backend": "ddp", "checkpoint_dir": "ckpt"}'.
"""
import json
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.utils.data import TensorDataset

import hvdtrain.torch


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 32, 3), nn.Conv2d(32, 64, 3)
        self.dropout = nn.Dropout(0.25)
        self.fc1, self.fc2 = nn.Linear(64 * 2 * 2, 128), nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        return self.fc2(self.dropout(F.relu(self.fc1(torch.flatten(x, 1)))))


def digits():
    data = load_digits()
    x = torch.tensor(data.images[:, None] / 16.0, dtype=torch.float32)
    y = torch.tensor(data.target)
    order = torch.tensor(np.random.default_rng(0).permutation(len(y)))
    x, y = x[order], y[order]
    return TensorDataset(x[397:], y[397:]), TensorDataset(x[:397], y[:397])


if __name__ == "__main__":  # DataLoader workers re-import this file: train only here
    train, val = digits()
    options = {"epochs": 12, "batch_size": 32, "optimizer": "adam", "base_lr": 0.003, "threads_per_rank": 1,
               **(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {})}
    # hvdtrain: every rank trains its shard; rank 0's weights broadcast first; validation is exact.
    result = hvdtrain.torch.fit(Net(), train, val, **options)
    final = result["final"]
    print(f"final val accuracy: {final['val_acc']:.4f} over {final['val_count']} samples", flush=True)
