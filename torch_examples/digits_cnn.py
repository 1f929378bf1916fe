"""Horovod + PyTorch on real handwritten digits: the shape of Horovod's pytorch_mnist example.

Single-process code with the Horovod lines added; each is marked `# Horovod:`.

    python torch_examples/digits_cnn.py                      # 1 process
    mpirun -np 2 python torch_examples/digits_cnn.py         # 2 ranks
    srun --mpi=pmix -n 2 python torch_examples/digits_cnn.py

Prints `final val accuracy: 0.9xxx over 397 samples` (>= 0.95 expected).
"""
import argparse

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=15)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.003)
args = parser.parse_args()

hvd.init()                                          # Horovod: initialize.
torch.manual_seed(42)
torch.set_num_threads(1)                            # Horovod: one core per rank on a small CPU node.

digits = load_digits()
x = torch.tensor(digits.images[:, None] / 16.0, dtype=torch.float32)
y = torch.tensor(digits.target)
order = torch.tensor(np.random.default_rng(0).permutation(len(y)))
x, y = x[order], y[order]
train, val = TensorDataset(x[397:], y[397:]), TensorDataset(x[:397], y[:397])

# Horovod: each rank reads its own part of the training set.
sampler = DistributedSampler(train, num_replicas=hvd.size(), rank=hvd.rank(), seed=42)
loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 32, 3), nn.Conv2d(32, 64, 3)
        self.fc1, self.fc2 = nn.Linear(64 * 2 * 2, 128), nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        return self.fc2(F.dropout(F.relu(self.fc1(x.flatten(1))), 0.5, self.training))


model = Net()
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr * hvd.size())   # Horovod: scale LR by ranks.
# Horovod: average gradients over ranks, and start from rank 0's weights.
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)

for epoch in range(args.epochs):
    model.train()
    sampler.set_epoch(epoch)                        # Horovod: a new shuffle each epoch.
    for data, target in loader:
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

# Every validation sample is evaluated once, on one rank: sum (correct, count), then divide.
model.eval()
mine = val[hvd.rank()::hvd.size()]                  # Horovod: this rank's share, no duplicates.
with torch.no_grad():
    correct = (model(mine[0]).argmax(1) == mine[1]).sum()
totals = hvd.allreduce(torch.tensor([float(correct), float(len(mine[1]))]), op=hvd.Sum)  # Horovod
if hvd.rank() == 0:                                 # Horovod: print once.
    print(f"final val accuracy: {totals[0] / totals[1]:.4f} over {int(totals[1])} samples")
