"""One rank of the overhead study: train ResNet-18 on random images, with or without Horovod.

    mpirun -np 2 python benchmarks/overhead_probe.py --mode compute     # no Horovod at all
    mpirun -np 2 python benchmarks/overhead_probe.py --mode idle        # hvd.init(), no collective
    mpirun -np 2 python benchmarks/overhead_probe.py --mode allreduce   # only the gradient allreduce
    mpirun -np 2 python benchmarks/overhead_probe.py --mode sequential  # backward, then allreduce: no overlap

Each process times its own steps and prints `PROBE rank=R img/s=X other_threads_cpu=Y`, where Y
is the CPU time of all threads but the main one, in cores (1.0 = a whole core), over the timed
steps: Horovod's background thread shows up there.
"""
import argparse
import os
import threading
import time

import psutil
import torch
import torch.nn.functional as F
import torchvision

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=("compute", "idle", "allreduce", "sequential"), required=True)
p.add_argument("--batch-size", type=int, default=16)
p.add_argument("--image-size", type=int, default=224)
p.add_argument("--steps", type=int, default=6)
p.add_argument("--warmup-steps", type=int, default=2)
args = p.parse_args()

torch.set_num_threads(1)
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", 0))
if args.mode != "compute":
    import horovod.torch as hvd

    hvd.init()  # the background thread starts cycling (idle: nothing is ever reduced)
    rank = hvd.rank()

model = torchvision.models.resnet18(weights=None)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
y = torch.randint(0, 1000, (args.batch_size,))


grads = [torch.zeros_like(p) for p in model.parameters()]


def step():
    if args.mode == "allreduce":
        # The step's communication alone: every gradient, reduced as Horovod's optimizer would.
        hvd.grouped_allreduce(grads, op=hvd.Average, name="grads")
        return
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    if args.mode == "sequential":
        # All gradients reduced after the whole backward pass: no overlap with compute.
        reduced = hvd.grouped_allreduce([p.grad for p in model.parameters()], op=hvd.Average, name="grads")
        for p, g in zip(model.parameters(), reduced):
            p.grad.copy_(g)
    opt.step()


def other_threads_cpu():
    me = threading.get_native_id()
    return sum(t.user_time + t.system_time for t in psutil.Process().threads() if t.id != me)


for _ in range(args.warmup_steps):
    step()
cpu0, t0 = other_threads_cpu(), time.perf_counter()
for _ in range(args.steps):
    step()
elapsed = time.perf_counter() - t0
print(f"PROBE rank={rank} img/s={args.batch_size * args.steps / elapsed:.3f} "
      f"other_threads_cpu={(other_threads_cpu() - cpu0) / elapsed:.3f}", flush=True)
