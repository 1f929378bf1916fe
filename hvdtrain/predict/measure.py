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


def decode_rate(cfg, workers: int) -> tuple[float, int]:
    """(images a second one decode worker makes on cfg's training data, the samples there):
    `workers` workers of the trainer's loader (hvdtrain/torch/loader.py), timed over 10 batches a
    worker once the batches they made ahead while starting are taken. Planned for the GPU where
    there is one (the workers then leave the normalisation to it, as in training)."""
    import dataclasses

    import torch

    from hvdtrain.errors import UsageError
    from hvdtrain.torch import loader
    from hvdtrain.torch.workload import from_config

    cfg = dataclasses.replace(cfg, num_workers=workers)
    dataset = from_config(cfg).train_data
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    plan = loader.plan_loader(cfg, dataset, "train", device, feeder=False)
    ahead, timed = 2 * max(1, workers), 10 * max(1, workers)  # the DataLoader's 2 a worker made ahead
    made = iter(loader.create_loader(plan, dataset, 0, 1, epoch=0))
    try:
        for _ in range(ahead):
            next(made)
        started, images = time.perf_counter(), 0
        for _ in range(timed):
            images += len(next(made)[0])
        seconds = time.perf_counter() - started
    except StopIteration:
        raise UsageError(f"--measure-input: the training data has fewer than {(ahead + timed) * plan.batch_size} "
                         "samples, too few to measure a decode rate") from None
    finally:
        loader.close_loaders()
    return images / seconds / max(1, workers), len(dataset)


def data_files(cfg) -> list[str]:
    """The files the training split reads: its shards, or its image files."""
    root = cfg.data_dir or ""
    if cfg.dataset == "shards":
        return sorted(glob.glob(os.path.join(root, "train", "*.tar")) or glob.glob(os.path.join(root, "train-*.tar")))
    return sorted(p for p in glob.glob(os.path.join(root, "train", "*", "*")) if os.path.isfile(p))


def read_rate(paths: list[str], readers: int, limit_bytes: int = 2 * 2**30) -> float:
    """GB/s `readers` threads read over the files (up to about limit_bytes of them), as many as a
    node's decode workers read at once, each file's page cache dropped first."""
    from concurrent.futures import ThreadPoolExecutor

    chosen, size = [], 0
    for path in paths:
        chosen.append(path)
        size += os.path.getsize(path)
        if size >= limit_bytes:
            break

    def read(path: str) -> int:
        n = 0
        with open(path, "rb", buffering=0) as f:
            try:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            except (AttributeError, OSError):
                pass
            while chunk := f.read(4 * 2**20):
                n += len(chunk)
        return n

    started = time.perf_counter()
    with ThreadPoolExecutor(max(1, readers)) as pool:
        total = sum(pool.map(read, chosen))
    seconds = time.perf_counter() - started
    return total / seconds / 1e9 if total and seconds > 0 else 0.0
