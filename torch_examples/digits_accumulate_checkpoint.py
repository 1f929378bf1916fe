"""A custom PyTorch loop with Horovod's knobs: gradient accumulation (backward_passes_per_step),
fp16 gradient compression, and checkpoints written by rank 0 and resumed on every rank.

    mpirun -np 2 python torch_examples/digits_accumulate_checkpoint.py --checkpoint /tmp/digits.pt
    # run it again: it resumes from the checkpoint and trains the remaining epochs

Prints `epoch N: loss L` per epoch and `final val accuracy: A` on rank 0.
"""
import argparse
import os

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=12)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--accumulate", type=int, default=2, help="backward passes per allreduce")
parser.add_argument("--checkpoint", default="digits_checkpoint.pt")
parser.add_argument("--stop-after", type=int, default=None, help="stop after this epoch (to try resume)")
args = parser.parse_args()

hvd.init()                                                  # Horovod
torch.manual_seed(0)
torch.set_num_threads(1)

digits = load_digits()
x = torch.tensor(digits.images.reshape(-1, 64) / 16.0, dtype=torch.float32)
y = torch.tensor(digits.target)
order = torch.tensor(np.random.default_rng(0).permutation(len(y)))
x, y = x[order], y[order]
train = TensorDataset(x[397:], y[397:])
sampler = DistributedSampler(train, num_replicas=hvd.size(), rank=hvd.rank(), seed=0)   # Horovod
loader = DataLoader(train, batch_size=args.batch_size * args.accumulate, sampler=sampler, drop_last=True)

model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * hvd.size() * args.accumulate, momentum=0.9)
optimizer = hvd.DistributedOptimizer(                                              # Horovod
    optimizer, named_parameters=model.named_parameters(),
    compression=hvd.Compression.fp16, backward_passes_per_step=args.accumulate)
start_epoch = 0
# Horovod: only rank 0 reads the checkpoint; the epoch and the state are broadcast from it. The
# optimizer state goes into the wrapped optimizer: DistributedOptimizer starts with an empty one.
if hvd.rank() == 0 and os.path.exists(args.checkpoint):
    state = torch.load(args.checkpoint, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start_epoch = state["epoch"]
    print(f"resumed from {args.checkpoint} at epoch {start_epoch}")
start_epoch = hvd.broadcast_object(start_epoch, root_rank=0)                       # Horovod
if start_epoch > 0:
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)                          # Horovod
hvd.broadcast_parameters(model.state_dict(), root_rank=0)                          # Horovod

last = args.epochs if args.stop_after is None else min(args.epochs, args.stop_after)
for epoch in range(start_epoch, last):
    sampler.set_epoch(epoch)
    total = torch.zeros(2)
    for data, target in loader:
        optimizer.zero_grad()
        for xs, ys in zip(data.chunk(args.accumulate), target.chunk(args.accumulate)):
            loss = F.cross_entropy(model(xs), ys)
            (loss / args.accumulate).backward()              # Horovod reduces on the last pass
            total += torch.tensor([loss.item() * len(ys), len(ys)])
        optimizer.step()
    total = hvd.allreduce(total, op=hvd.Sum)                  # Horovod: loss over all ranks
    if hvd.rank() == 0:
        print(f"epoch {epoch + 1}: loss {total[0] / total[1]:.4f}", flush=True)
        tmp = args.checkpoint + ".tmp"                        # write, then rename: never half a file
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch + 1}, tmp)
        os.replace(tmp, args.checkpoint)

mine_x, mine_y = x[:397][hvd.rank()::hvd.size()], y[:397][hvd.rank()::hvd.size()]
with torch.no_grad():
    correct = torch.tensor([float((model(mine_x).argmax(1) == mine_y).sum()), float(len(mine_y))])
correct = hvd.allreduce(correct, op=hvd.Sum)                  # Horovod
if hvd.rank() == 0:
    print(f"final val accuracy: {correct[0] / correct[1]:.4f}")
