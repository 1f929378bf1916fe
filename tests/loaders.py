"""hvdtrain's loader factory (hvdtrain/torch/loader.py) as the tests call it: the options' plan for
a split on the CPU, then its loader for one rank."""
from __future__ import annotations

from hvdtrain.torch import data, loader


def train_loader(dataset, cfg, rank: int, world_size: int, epoch: int, skip_batches: int = 0, seen_before=()):
    plan = loader.plan_loader(cfg, dataset, "train")
    return loader.create_loader(plan, dataset, rank, world_size, epoch, skip_batches, seen_before)


def interleaved_train_loader(dataset, cfg, world_size: int, epoch: int, skip_batches: int = 0, seen_before=()):
    """Every rank's batches in one loader, as a library that shards by batches takes them (Accelerate)."""
    plan = loader.plan_loader(cfg, dataset, "train", sharding="interleaved")
    return loader.create_loader(plan, dataset, 0, world_size, epoch, skip_batches, seen_before)


def val_loader(dataset, cfg, rank: int, world_size: int):
    return loader.create_loader(loader.plan_loader(cfg, dataset, "val"), dataset, rank, world_size)


def rank_batches(dataset, cfg, rank: int, world_size: int, epoch: int, seen_before=()):
    return data.rank_batches(dataset, cfg.seed, cfg.batch_size * cfg.batches_per_allreduce, rank, world_size, epoch,
                             seen_before)
