"""Where in a training step the last step's gradients are freed, and what it costs on a CPU.

    python benchmarks/grad_free_order.py --repeats 3 --steps 3

One process, one compute thread, ResNet-18 (batch 16, 224x224, SGD with momentum), three ways of
ordering one step, alternated within each repeat:

  before    zero_grad() (set_to_none) before the forward pass: hvdtrain's torch loop until 2026-11
  after     zero_grad() after the forward pass, before backward: Lightning's order, hvdtrain's now
  inplace   zero_grad(set_to_none=False) before the forward pass: the buffers kept and zeroed

It prints seconds per step (median over repeats) and each order's time over `after`'s. The
gradients are equal in all three (numerically the same step); only the memory they are written
into differs. Benchmark output, never a test assertion: shared machines are noisy.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
import torchvision

ORDERS = ("before", "after", "inplace")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per order and repeat")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(16, 3, 224, 224), torch.randint(0, 10, (16,))

    def step(order: str) -> None:
        if order == "before":
            optimizer.zero_grad()
        elif order == "inplace":
            optimizer.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model(x), y)
        if order == "after":
            optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    for order in ORDERS:  # warm-up: allocator and oneDNN caches
        step(order)
    seconds = {order: [] for order in ORDERS}
    for _ in range(args.repeats):
        for order in ORDERS:
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step(order)
            seconds[order].append((time.perf_counter() - t0) / args.steps)
    median = {order: statistics.median(times) for order, times in seconds.items()}
    for order in ORDERS:
        print(f"{order:8s} {median[order]:.3f} s/step  (x{median[order] / median['after']:.3f} of after)  "
              f"repeats: {', '.join(f'{t:.3f}' for t in seconds[order])}")


if __name__ == "__main__":
    main()
