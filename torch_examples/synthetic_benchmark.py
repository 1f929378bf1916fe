"""Synthetic ResNet-50 throughput with Horovod, measured on every rank.

    mpirun -np 2 python torch_examples/synthetic_benchmark.py --image-size 64 --batch-size 8
    srun --mpi=pmix -n 4 python torch_examples/synthetic_benchmark.py          # GPUs: one per rank

Each rank times the same steps between barriers; rank 0 prints every rank's img/s and the total.
"""
import argparse
import time

import horovod.torch as hvd
import torch
import torch.nn.functional as F
import torchvision

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="resnet50")
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--image-size", type=int, default=224)
parser.add_argument("--warmup-steps", type=int, default=2)
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--threads", type=int, default=1)
args = parser.parse_args()

hvd.init()                                                        # Horovod
device = torch.device("cuda", hvd.local_rank()) if torch.cuda.is_available() else torch.device("cpu")
torch.set_num_threads(args.threads)

model = getattr(torchvision.models, args.model)(weights=None).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())  # Horovod
hvd.broadcast_parameters(model.state_dict(), root_rank=0)                                   # Horovod

data = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
target = torch.randint(0, 1000, (args.batch_size,), device=device)


def step():
    optimizer.zero_grad()
    F.cross_entropy(model(data), target).backward()
    optimizer.step()


for _ in range(args.warmup_steps):
    step()
hvd.barrier()                                                     # Horovod: start together
start = time.perf_counter()
for _ in range(args.steps):
    step()
if device.type == "cuda":
    torch.cuda.synchronize()
hvd.barrier()                                                     # Horovod: stop together
rate = args.batch_size * args.steps / (time.perf_counter() - start)
rates = hvd.allgather_object(rate)                                # Horovod: every rank's figure
if hvd.rank() == 0:
    for rank, r in enumerate(rates):
        print(f"rank {rank}: {r:.1f} img/s")
    print(f"total: {sum(rates):.1f} img/s on {hvd.size()} rank(s)")
