"""What the prediction measures on the machine it runs on, through the trainer's own code: the
input pipeline's images/sec a decode worker (the torch trainer's loader, its plan and workers,
on the user's data) and the file system's read rate over the data's files.

Both are this node's figures: run it on a compute node of the cluster, where the data is. The
read rate is measured with the page cache asked to drop the files first (posix_fadvise); a
parallel file system may keep its own caches: the figure is then an upper bound."""
from __future__ import annotations

import glob
import os
import time


def decode_rate(cfg, workers: int, batches: int = 20) -> tuple[float, int]:
    """(images a second one decode worker makes on cfg's training data, the samples there):
    `workers` workers of the trainer's loader (hvdtrain/torch/loader.py) over `batches` batches
    after their first."""
    import dataclasses

    import torch

    from hvdtrain.torch import loader
    from hvdtrain.torch.workload import from_config

    cfg = dataclasses.replace(cfg, num_workers=workers)
    dataset = from_config(cfg).train_data
    plan = loader.plan_loader(cfg, dataset, "train", torch.device("cpu"), feeder=False)
    made = iter(loader.create_loader(plan, dataset, 0, 1, epoch=0))
    try:
        next(made)  # the workers started, their first batch made
        started, images = time.perf_counter(), 0
        for _, (x, _) in zip(range(batches), made):
            images += len(x)
        seconds = time.perf_counter() - started
    finally:
        loader.close_loaders()
    return images / seconds / max(1, workers), len(dataset)


def data_files(cfg) -> list[str]:
    """The files the training split reads: its shards, or its image files."""
    root = cfg.data_dir or ""
    if cfg.dataset == "shards":
        return sorted(glob.glob(os.path.join(root, "train", "*.tar")) or glob.glob(os.path.join(root, "train-*.tar")))
    return sorted(p for p in glob.glob(os.path.join(root, "train", "*", "*")) if os.path.isfile(p))


def read_rate(paths: list[str], limit_bytes: int = 2 * 2**30) -> float:
    """GB/s read over the files (up to limit_bytes of them), the page cache dropped first."""
    total, started = 0, time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            try:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            except (AttributeError, OSError):
                pass
            while chunk := f.read(4 * 2**20):
                total += len(chunk)
        if total >= limit_bytes:
            break
    seconds = time.perf_counter() - started
    return total / seconds / 1e9 if total and seconds > 0 else 0.0
