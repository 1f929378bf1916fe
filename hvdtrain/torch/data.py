"""torch's samples and their order, from hvdtrain.data.datasets: the datasets the trainer builds from
its options, the seeded wrapper that hands hvdtrain's crop its key, and which samples each rank
takes in an epoch. No distributed code here: rank and world size are plain numbers. The loaders
over them are made by hvdtrain/torch/loader.py."""
from __future__ import annotations

import itertools

import numpy as np

import torch
from torch.utils.data import Dataset, DistributedSampler, Sampler, Subset

from hvdtrain.data import datasets
from hvdtrain.torch import images


class ArrayDataset(Dataset):
    """Sample i: image x[i % len(x)], label y[i] (see datasets.ArraySplit)."""

    def __init__(self, x, y):
        self.x, self.y = torch.from_numpy(x), torch.from_numpy(y)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i % len(self.x)], self.y[i]


class SeededSamples(Dataset):
    """Random augmentation as a function of (seed, epoch, sample index), not of which DataLoader
    worker draws the sample or when: a run resumed in the middle of an epoch augments every
    remaining sample as an uninterrupted run would, so both end with the same weights."""

    def __init__(self, dataset, seed: int):
        self.dataset, self.seed, self.epoch = dataset, seed, 0

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, key):
        # (epoch, i) from the training loader's sampler (WithEpoch): workers kept across epochs
        # hold the copy of this dataset made when they started, whose `epoch` is the first one's.
        epoch, i = key if isinstance(key, tuple) else (self.epoch, key)
        torch.manual_seed((self.seed * 1_000_003 + epoch * 1_000_000_007 + i) % (2**63))  # a user's transforms
        read_sample, j = _sample_reader(self.dataset, i)  # hvdtrain's images (or yours): the crop's key
        return read_sample(j, (self.seed, epoch, i)) if read_sample else self.dataset[i]


def _sample_reader(dataset, i: int):
    """(the `read_sample(i, crop_key)` of `dataset` or of the dataset under its Subsets, i there),
    or (None, i) where there is none."""
    while isinstance(dataset, Subset):
        dataset, i = dataset.dataset, dataset.indices[i]
    return getattr(dataset, "read_sample", None), i


def crops_keyed(dataset) -> bool:
    """Whether `dataset`'s crops are keyed by (seed, epoch, sample): SeededSamples over a dataset
    that takes the key (`read_sample`)."""
    return isinstance(dataset, SeededSamples) and _sample_reader(dataset.dataset, 0)[0] is not None


class SkipSampler(Sampler):
    """The first `skip` indices of `sampler` dropped: resuming in the middle of an epoch sees
    exactly the samples an uninterrupted run would have seen next."""

    def __init__(self, sampler, skip: int):
        self.sampler, self.skip = sampler, skip

    def __iter__(self):
        return itertools.islice(iter(self.sampler), self.skip, None)

    def __len__(self):
        return max(0, len(self.sampler) - self.skip)


class WithEpoch(Sampler):
    """`sampler`'s indices as (epoch, index): see SeededSamples."""

    def __init__(self, sampler, epoch: int):
        self.sampler, self.epoch = sampler, epoch

    def __iter__(self):
        return ((self.epoch, i) for i in self.sampler)

    def __len__(self):
        return len(self.sampler)


def build_datasets(cfg):
    """(train, val, in_channels, num_classes, image_size) for cfg.dataset. Image files (a folder
    tree, shards) give uint8 images, normalised where the loader's plan says (hvdtrain/torch/loader.py)."""
    if cfg.dataset == "digits":
        split = datasets.digits_split()
    elif cfg.dataset == "synthetic":
        split = datasets.synthetic_split(cfg.synthetic_size, cfg.image_size, seed=cfg.seed)
    elif cfg.dataset == "shards":
        train = images.ShardImages(cfg.data_dir, "train", images.train_augment(cfg.image_size))
        val = images.ShardImages(cfg.data_dir, "val", images.val_augment(cfg.image_size))
        return SeededSamples(train, cfg.seed), val, 3, len(train.classes), cfg.image_size
    else:
        classes = datasets.check_imagefolder(cfg.data_dir)
        train = images.image_folder(f"{cfg.data_dir}/train", images.train_augment(cfg.image_size))
        val = images.image_folder(f"{cfg.data_dir}/val", images.val_augment(cfg.image_size))
        return SeededSamples(train, cfg.seed), val, 3, len(classes), cfg.image_size
    return (ArrayDataset(split.x_train, split.y_train), ArrayDataset(split.x_val, split.y_val),
            split.in_channels, split.num_classes, split.image_size)


def input_normalization(dataset):
    """The (mean, std) with which the device normalises `dataset`'s uint8 images, or None: a
    dataset says it by its `input_normalization` attribute (hvdtrain's image datasets do, a
    user's may), seen through SeededSamples and Subset."""
    while isinstance(dataset, (SeededSamples, Subset)):
        dataset = dataset.dataset
    return getattr(dataset, "input_normalization", None)


class ShardBlockedSampler(Sampler):
    """A rank's samples of an epoch stored in shards, a few shards per rank
    (datasets.shard_blocked_order): its decode workers open those, not every shard."""

    def __init__(self, sample_shards, seed: int, epoch: int, rank: int, world_size: int):
        self.sample_shards, self.seed, self.epoch = sample_shards, seed, epoch
        self.rank, self.world_size = rank, world_size

    def __iter__(self):
        order = datasets.shard_blocked_order(self.sample_shards, self.seed, self.epoch, self.rank, self.world_size)
        return iter(order.tolist())

    def __len__(self):
        return len(self.sample_shards) // self.world_size


def sample_shards(dataset):
    """Each sample's shard (an array), or None: a dataset says it by its `sample_shards` attribute
    (ShardImages does, a user's may), seen through SeededSamples."""
    while isinstance(dataset, SeededSamples):
        dataset = dataset.dataset
    return getattr(dataset, "sample_shards", None)


def rank_order(dataset, seed: int, rank: int, world_size: int, epoch: int, seen_before: tuple = ()):
    """Rank `rank`'s shuffled share of `epoch`: a few shards' samples where the dataset is stored
    in shards, else DistributedSampler's. drop_last: every rank runs the same number of steps, or
    a collective would hang. After a resize in the epoch's middle (seen_before, see
    checkpoint.Position), the rank's share of the samples not yet seen (datasets.rest_of_epoch)."""
    if isinstance(dataset, SeededSamples):
        dataset.epoch = epoch  # workers get a copy of the dataset when the epoch's iterator starts
    shards_of = sample_shards(dataset)
    if seen_before:
        def orders(size):
            if shards_of is not None:
                return datasets.shard_blocked_orders(shards_of, seed, epoch, size)
            return [np.fromiter(rank_order(dataset, seed, r, size, epoch), np.int64) for r in range(size)]
        return datasets.rest_of_epoch(orders, len(dataset), seen_before, world_size)[rank].tolist()
    if shards_of is not None:
        sampler = ShardBlockedSampler(shards_of, seed, epoch, rank, world_size)
    else:
        sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                     seed=seed, drop_last=True)
        sampler.set_epoch(epoch)
    return sampler


def rank_batches(dataset, seed: int, batch_size: int, rank: int, world_size: int, epoch: int,
                 seen_before: tuple = ()) -> list[list[int]]:
    """The sample indices of each of rank `rank`'s training batches in `epoch` (none skipped)."""
    indices = list(rank_order(dataset, seed, rank, world_size, epoch, seen_before))
    return [indices[i:i + batch_size] for i in range(0, len(indices) - batch_size + 1, batch_size)]


def interleaved_batches(dataset, seed: int, batch_size: int, world_size: int, epoch: int, skip_batches: int,
                        seen_before: tuple = ()) -> list[list[int]]:
    """Every rank's batches in one list, rank r's i-th batch at position i x world_size + r: what
    a library that shards by batches (Accelerate's `prepare`: batch k to rank k mod N) turns back
    into exactly each rank's own batches."""
    shards = [rank_batches(dataset, seed, batch_size, rank, world_size, epoch, seen_before)[skip_batches:]
              for rank in range(world_size)]
    return [shard[i] for i in range(len(shards[0])) for shard in shards]
