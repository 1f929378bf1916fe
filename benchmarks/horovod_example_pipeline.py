"""The input pipeline of Horovod's ImageNet example (examples/pytorch/pytorch_imagenet_resnet50.py):
torchvision's ImageFolder decoding with PIL, RandomResizedCrop(224) + flip + ToTensor + Normalize
in the DataLoader's workers (forkserver), a DistributedSampler, hvd.DistributedOptimizer; the
model is the one given, so that benchmarks/cpu_node.py compares input pipelines alone.

    mpirun -np 2 python benchmarks/horovod_example_pipeline.py DIR/train --model FILE.py:FUNCTION --out R.json
"""
import argparse
import importlib.util
import json
import time

import horovod.torch as hvd
import torch
import torch.nn.functional as F
import torch.utils.data.distributed
from torchvision import datasets, transforms


def load_model(spec: str):
    path, function = spec.rsplit(":", 1)
    module_spec = importlib.util.spec_from_file_location("user_model", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return getattr(module, function)()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("train_dir")
    p.add_argument("--model", required=True)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--untimed-steps", type=int, default=3)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    hvd.init()
    torch.set_num_threads(args.threads)
    torch.manual_seed(42)
    kwargs = {"num_workers": args.workers, "persistent_workers": args.workers > 0}
    if args.workers:
        kwargs["multiprocessing_context"] = "forkserver"  # as the example, where supported
    train_dataset = datasets.ImageFolder(args.train_dir, transform=transforms.Compose([
        transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])]))
    sampler = torch.utils.data.distributed.DistributedSampler(train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                                         **kwargs)
    model = load_model(args.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    model.train()
    sampler.set_epoch(0)
    started, timed = None, 0
    for step, (x, y) in enumerate(loader):
        if step == args.untimed_steps:
            started = time.perf_counter()
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        if started is not None:
            timed += len(y)
    rate = hvd.allreduce(torch.tensor(timed / (time.perf_counter() - started)), op=hvd.Sum).item()
    if hvd.rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"total_images_per_sec": rate, "steps": step + 1}, f)


if __name__ == "__main__":
    main()
