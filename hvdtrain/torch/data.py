"""torch datasets and loaders built from hvdtrain.datasets: no distributed code here except the
samplers, which take rank and world size as plain numbers."""
from __future__ import annotations

import atexit
import itertools

import numpy as np

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, Subset, TensorDataset, default_collate

from hvdtrain import augment, datasets
from hvdtrain.errors import UsageError
from hvdtrain.torch import images, internals, workers


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
        # (epoch, i) from train_loader's sampler: workers kept across epochs hold the copy of this
        # dataset made when they started, whose `epoch` is the first one's.
        epoch, i = key if isinstance(key, tuple) else (self.epoch, key)
        torch.manual_seed((self.seed * 1_000_003 + epoch * 1_000_000_007 + i) % (2**63))  # a user's transforms
        with augment.reading_sample(self.seed, epoch, i):  # hvdtrain's crop (images.TrainCrop)
            return self.dataset[i]


class SkipSampler(Sampler):
    """The first `skip` indices of `sampler` dropped: resuming in the middle of an epoch sees
    exactly the samples an uninterrupted run would have seen next."""

    def __init__(self, sampler, skip: int):
        self.sampler, self.skip = sampler, skip

    def __iter__(self):
        return itertools.islice(iter(self.sampler), self.skip, None)

    def __len__(self):
        return max(0, len(self.sampler) - self.skip)


class _WithEpoch(Sampler):
    """`sampler`'s indices as (epoch, index): see SeededSamples."""

    def __init__(self, sampler, epoch: int):
        self.sampler, self.epoch = sampler, epoch

    def __iter__(self):
        return ((self.epoch, i) for i in self.sampler)

    def __len__(self):
        return len(self.sampler)


class _CurrentSampler(Sampler):
    """The sampler of a loader kept across epochs (see _kept_loader): this epoch's, set before
    each iteration. The indices are drawn in the rank's process, so a new one takes effect there."""

    def __init__(self):
        self.current = ()

    def __iter__(self):
        return iter(self.current)

    def __len__(self):
        return len(self.current)


def build_datasets(cfg):
    """(train, val, in_channels, num_classes, image_size) for cfg.dataset. Image files (a folder
    tree, shards) give uint8 images, normalised on the device (hvdtrain/torch/images.py)."""
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


def feeds_on_thread(loader) -> bool:
    """Whether `loader`'s batches can be fetched on the feeder's thread (hvdtrain/torch/feeder.py):
    made by workers, or gathered whole from memory; not when the main process would call a
    dataset's __getitem__, which may draw from torch's global generator."""
    return loader.num_workers > 0 or isinstance(loader.dataset, _Gathered)


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


def _epoch_sampler(dataset, cfg, rank: int, world_size: int, epoch: int) -> Sampler:
    """Rank `rank`'s shuffled share of `epoch`: a few shards' samples where the dataset is
    stored in shards, else DistributedSampler's. drop_last: every rank runs the same number of
    steps, or a collective would hang."""
    shards_of = sample_shards(dataset)
    if shards_of is not None:
        sampler = ShardBlockedSampler(shards_of, cfg.seed, epoch, rank, world_size)
    else:
        sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                     seed=cfg.seed, drop_last=True)
        sampler.set_epoch(epoch)
    if isinstance(dataset, SeededSamples):
        dataset.epoch = epoch  # workers get a copy of the dataset when the epoch's iterator starts
    return sampler


def _rank_order(dataset, cfg, rank: int, world_size: int, epoch: int, seen_before: tuple):
    """This rank's sampler of `epoch`; after a resize in its middle (seen_before, see
    checkpoint.Position), the rank's share of the samples not yet seen (datasets.rest_of_epoch)."""
    sampler = _epoch_sampler(dataset, cfg, rank, world_size, epoch)
    if not seen_before:
        return sampler
    shards_of = sample_shards(dataset)

    def orders(size):
        if shards_of is not None:
            return datasets.shard_blocked_orders(shards_of, cfg.seed, epoch, size)
        return [np.fromiter(_epoch_sampler(dataset, cfg, r, size, epoch), np.int64) for r in range(size)]
    return datasets.rest_of_epoch(orders, len(dataset), seen_before, world_size)[rank].tolist()


def train_loader(dataset, cfg, rank: int, world_size: int, epoch: int, skip_batches: int, seen_before: tuple = ()):
    """This rank's batches of `epoch`, the first `skip_batches` of its order left out (a resume)."""
    batch = cfg.batch_size * cfg.batches_per_allreduce
    sampler = SkipSampler(_rank_order(dataset, cfg, rank, world_size, epoch, seen_before), skip_batches * batch)
    if isinstance(dataset, SeededSamples):
        sampler = _WithEpoch(sampler, epoch)
    return _kept_loader(("train", rank, world_size, batch), dataset, cfg, sampler,
                        batch_size=batch, drop_last=True, pin_memory=torch.cuda.is_available())


def rank_batches(dataset, cfg, rank: int, world_size: int, epoch: int, seen_before: tuple = ()) -> list[list[int]]:
    """The sample indices of each batch `train_loader` gives rank `rank` in `epoch` (none skipped)."""
    batch = cfg.batch_size * cfg.batches_per_allreduce
    indices = list(_rank_order(dataset, cfg, rank, world_size, epoch, seen_before))
    return [indices[i:i + batch] for i in range(0, len(indices) - batch + 1, batch)]


def interleaved_train_loader(dataset, cfg, world_size: int, epoch: int, skip_batches: int,
                             seen_before: tuple = ()) -> DataLoader:
    """One loader over every rank's batches, rank r's i-th batch at position i x world_size + r:
    the unsharded loader a library that shards by batches (Accelerate's `prepare`: batch k to
    rank k mod N) turns back into exactly the batches `train_loader` gives each rank."""
    shards = [rank_batches(dataset, cfg, rank, world_size, epoch, seen_before)[skip_batches:]
              for rank in range(world_size)]
    batches = [shard[i] for i in range(len(shards[0])) for shard in shards]
    return _loader(dataset, cfg, batch_sampler=batches, pin_memory=torch.cuda.is_available())


def val_loader(dataset, cfg, rank: int, world_size: int):
    # Not a DistributedSampler: it pads with duplicates so that shards are equal. Here every
    # validation sample is seen exactly once; metrics are reduced as (sum, count).
    # Pinned batches: the copy to the GPU is asynchronous.
    indices = datasets.exact_shard(len(dataset), rank, world_size)
    return _kept_loader(("val", rank, world_size, cfg.batch_size), dataset, cfg, range(len(indices)),
                        shard=indices, batch_size=cfg.batch_size, pin_memory=torch.cuda.is_available())


# Loaders whose workers are kept from one epoch (or validation pass) to the next, by (role, rank,
# world size, batch size, id of the dataset): (dataset, loader, its _CurrentSampler). And loaders a
# library made from one of those (Accelerate's prepare copies persistent_workers), by id.
_kept: dict = {}


def _kept_loader(key: tuple, dataset, cfg, sampler, shard=None, **kwargs) -> DataLoader:
    """A loader over `dataset` (or its Subset `shard`) drawing `sampler`'s indices. With workers,
    one loader per key for the whole run, its workers kept (persistent_workers): a worker starts
    in milliseconds from the forkserver, but then imports the user's script and its modules again
    (seen: 12 s an epoch for 2 workers), and its first batches leave the step waiting."""
    shown = dataset if shard is None else Subset(dataset, shard)
    if not _workers(shown, cfg):
        return _loader(shown, cfg, sampler=sampler, **kwargs)
    key = (*key, id(dataset), cfg.num_workers)
    kept = _kept.get(key)
    if kept is None or kept[0] is not dataset:
        current = _CurrentSampler()
        kept = _kept[key] = (dataset, _loader(shown, cfg, sampler=current, persistent_workers=True,
                                              loader_class=_KeptLoader, **kwargs), current)
    kept[2].current = sampler
    return kept[1]


class _KeptLoader(DataLoader):
    def __iter__(self):
        iterator = super().__iter__()
        _close_at_exit()
        return iterator


def _close_at_exit() -> None:
    # At the interpreter's exit, _at_exit then runs before torch's handler for persistent
    # workers (registered as an iterator is made) and multiprocessing's: last in, first out.
    atexit.unregister(_at_exit)
    atexit.register(_at_exit)


def _at_exit() -> None:
    """close_loaders, then any worker of ours still alive (a loader copied by a library that
    close_with_kept was not told of): each would hold multiprocessing's exit join forever."""
    import multiprocessing

    close_loaders()
    for child in multiprocessing.active_children():
        if child._start_method == "forkserver" and child.is_alive():  # ours: hvdtrain/torch/workers.py
            child.kill()
            child.join(timeout=5)


def close_with_kept(loader):
    """`loader`, a library's copy of a kept loader (Accelerate's prepare_data_loader), whose
    workers are kept too: ended by close_loaders with ours. Returns it."""
    if getattr(loader, "persistent_workers", False):
        _kept[("copy", id(loader))] = (None, loader, None)
        _close_at_exit()
    return loader


def close_loaders() -> None:
    """End the workers of the loaders kept across epochs, at once, even in the middle of a decode.
    They ignore SIGTERM, which is how torch and multiprocessing end workers still alive at the
    interpreter's exit: its join would then wait forever (seen, before loaders were kept); and
    torch's own shutdown waits up to 10 s for each busy worker. So they are killed, after torch's
    SIGCHLD check forgets them (it would call their end an error), then torch shuts down the rest
    (its queues, its pinning thread)."""
    while _kept:
        _, (_, loader, _) = _kept.popitem()
        internals.end_loader_workers(loader)


def _loader(dataset, cfg, loader_class=DataLoader, **kwargs) -> DataLoader:
    num_workers = _workers(dataset, cfg)
    unguarded = workers.unguarded_main() if num_workers else None
    if unguarded:
        path, line = unguarded
        raise UsageError(f"{path} trains at its top level (line {line}): DataLoader worker processes import it "
                         "again and would each start training; put the training under `if __name__ == "
                         "\"__main__\":` (or pass num_workers=0)")
    if not num_workers:
        gatherable = _gatherable(dataset)
        if gatherable:
            return DataLoader(_Gathered(dataset, gatherable, kwargs.get("pin_memory", False)), num_workers=0,
                              collate_fn=_collate_gathered, **kwargs)
        if _device_columns(dataset):  # a user's tensors already on the GPU: nothing to pin or copy
            kwargs["pin_memory"] = False  # ("cannot pin 'torch.cuda.FloatTensor'")
        return DataLoader(dataset, num_workers=0, **kwargs)
    collate = images.worker_collate(dataset)
    if collate is not None:
        kwargs.setdefault("collate_fn", collate)
    return loader_class(dataset, num_workers=num_workers, multiprocessing_context=workers.worker_context(),
                        worker_init_fn=workers.init_worker, **kwargs)


def _gatherable(dataset):
    """(columns, wrap, Subset indices or None) of an in-memory dataset whose batches can be
    gathered whole, else None. Exactly ArrayDataset, TensorDataset and a plain Subset of either:
    a subclass may change __getitem__ (a transform), which a gather would skip. Host tensors
    only: a user's TensorDataset may hold GPU tensors, which stay as they are."""
    inner, indices = dataset, None
    if type(dataset) is Subset:
        inner, indices = dataset.dataset, dataset.indices
    if type(inner) is ArrayDataset:
        columns, wrap = (inner.x, inner.y), len(inner.x)  # x[i % len(x)]: see ArrayDataset
    elif type(inner) is TensorDataset:
        columns, wrap = inner.tensors, None
    else:
        return None
    if not columns or not all(isinstance(c, torch.Tensor) and c.device.type == "cpu" for c in columns):
        return None
    return columns, wrap, indices


def _device_columns(dataset) -> bool:
    """Whether an in-memory dataset (a TensorDataset or ArrayDataset, or a Subset of one) holds
    tensors off the host: the user's own, put on the GPU before training."""
    inner = dataset.dataset if type(dataset) is Subset else dataset
    columns = inner.tensors if type(inner) is TensorDataset else \
        (inner.x, inner.y) if type(inner) is ArrayDataset else ()
    return any(isinstance(c, torch.Tensor) and c.device.type != "cpu" for c in columns)


class _Gathered(Dataset):
    """An in-memory dataset (see _gatherable) whose batches are one gather each, into pinned
    memory when the loader pins, instead of a sample at a time then stacked and copied again to
    pin. The batches are the same tensors; on an H100 the per-sample path kept the GPU idle 25 of
    ResNet-50's 59 ms a step (AMP, batch 128, 224x224 synthetic)."""

    def __init__(self, dataset, gatherable, pin: bool):
        self.dataset, self.pin = dataset, pin
        self.columns, self.wrap, indices = gatherable
        self.indices = None if indices is None else torch.as_tensor(indices, dtype=torch.int64)

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        return self.dataset[i]

    def __getitems__(self, indices):
        index = torch.as_tensor(indices, dtype=torch.int64)
        if self.indices is not None:
            index = self.indices[index]
        return _Batch(self._take(column, index % self.wrap if self.wrap and i == 0 else index)
                      for i, column in enumerate(self.columns))

    def _take(self, column, index):
        out = torch.empty((len(index), *column.shape[1:]), dtype=column.dtype, pin_memory=self.pin)
        return torch.index_select(column.detach(), 0, index, out=out)  # as the per-sample path: no autograd

    def __getattr__(self, name):  # loader.dataset.<attribute> reaches the user's dataset
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)


class _Batch(tuple):
    """A batch already gathered by _Gathered, which the collate function passes through."""


def _collate_gathered(batch):
    return list(batch) if isinstance(batch, _Batch) else default_collate(batch)


def _workers(dataset, cfg) -> int:
    """DataLoader workers for `dataset`: none for tensors in memory (ours, a user's TensorDataset,
    a shard of either), which the main process indexes faster than workers could send them, and
    which would only cost a process start per epoch and per validation pass (a worker of a user's
    script imports that script's imports again: seen costing 12 s an epoch for 2 workers)."""
    in_memory = isinstance(dataset.dataset if isinstance(dataset, Subset) else dataset, (ArrayDataset, TensorDataset))
    return 0 if in_memory else cfg.num_workers
