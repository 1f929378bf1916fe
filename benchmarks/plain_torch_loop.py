"""A plain single-process torch training loop: the reference the GPU check holds hvdtrain to.

    python benchmarks/plain_torch_loop.py --model resnet50 --batch-size 128 --image-size 224 --amp --steps 200

No Horovod, no DDP, no data loader: one random batch made once on the device, torchvision's model
(channels-last on CUDA, as hvdtrain.torch does), SGD with momentum, autocast + GradScaler with
--amp. Prints `PLAIN img/s=X` over the timed steps (CUDA synchronised before each clock read).
"""
from __future__ import annotations

import argparse
import time

import torch
import torchvision


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--amp", action="store_true", help="mixed precision (CUDA): autocast + GradScaler")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args()

    device = torch.device(a.device)
    torch.backends.cudnn.benchmark = True
    model = getattr(torchvision.models, a.model)(num_classes=1000).to(device)
    x = torch.randn(a.batch_size, 3, a.image_size, a.image_size, device=device)
    y = torch.randint(0, 1000, (a.batch_size,), device=device)
    if device.type == "cuda":
        model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type, enabled=a.amp)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, enabled=a.amp):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(a.warmup_steps):
        step()
    synchronize()
    start = time.perf_counter()
    for _ in range(a.steps):
        step()
    synchronize()
    print(f"PLAIN img/s={a.batch_size * a.steps / (time.perf_counter() - start):.2f}", flush=True)


if __name__ == "__main__":
    main()
