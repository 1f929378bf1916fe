"""How a split's batches are made: a plan decided once, from the options, the dataset and the
device, and one factory that carries it out (the shape of timm's `create_loader`).

    plan = plan_loader(cfg, dataset, "train", device)    # pure; plan.describe() is the start's line
    batches = create_loader(plan, dataset, rank, world_size, epoch, skip_batches, seen_before)

The plan says all that differs from one run to another: the source (tensors in memory, image
files, a user's dataset), the decoder (torch's DataLoader workers, DALI's graph, or the rank's
own process), the workers, the order (a few shards per rank, DistributedSampler's, or an exact
validation shard), how the ranks share the batches (each its own, or every rank's interleaved in
one loader for a library that shards by batches: Accelerate), the crop (keyed by (seed, epoch,
sample): data.SeededSamples), where uint8 images are normalised (the decode workers where the
CPU trains, else the device) and whether the feeder's thread may fetch the batches. Nothing of it
travels as an attribute set on the dataset or a thread-local.

What the samples are and which each rank takes: hvdtrain/torch/data.py; the crop's rule:
hvdtrain/data/augment.py; DALI's decoder: hvdtrain/torch/dali.py.
"""
from __future__ import annotations

import atexit
import dataclasses

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, Subset, TensorDataset, default_collate

from hvdtrain.data import datasets
from hvdtrain.errors import UsageError
from hvdtrain.torch import data, images, internals, workers


@dataclasses.dataclass(frozen=True)
class LoaderPlan:
    split: str                 # "train" or "val"
    source: str                # "tensors in memory", "image files" (hvdtrain's), "your dataset"
    decoder: str               # "torch" (DataLoader), "dali", or "none" (tensors in memory)
    workers: int               # DataLoader worker processes (DALI: its threads); 0: the rank's process reads
    batch_size: int            # samples a rank takes at a time (training: a step's, all its micro-batches)
    order: str                 # "shard blocks", "DistributedSampler", or "exact shard" (validation)
    sharding: str              # "per rank", or "interleaved" (every rank's batches; the library shards them)
    crops: str                 # "keyed (seed, epoch, sample)", or "the dataset's own"
    normalised_in: str         # "decode workers", "device", "DALI", or "as given"
    normalization: tuple | None  # (mean, std) in [0, 1] units of uint8 images, or None
    gathered: bool             # in-memory tensors gathered a batch at a time (_Gathered)
    pin_memory: bool
    feeder_thread: bool        # fetched on the feeder's thread (hvdtrain/torch/feeder.py)
    seed: int
    image_size: int
    device: str

    def describe(self) -> str:
        workers = f"{self.workers} DALI thread(s)" if self.decoder == "dali" else f"{self.workers} worker(s)"
        normalised = {"device": "on the device", "DALI": "by DALI", "as given": "as given (not uint8 images)"}
        return (f"{self.split} input: {self.source}, decoded by {self.decoder} ({workers}), {self.order} order "
                f"({self.sharding}), crops {self.crops}, normalised "
                f"{normalised.get(self.normalised_in, 'in ' + self.normalised_in)}, {self.batch_size} a batch, "
                f"feeder {'thread' if self.feeder_thread else 'inline'}")


def plan_loader(cfg, dataset, split: str, device="cpu", *, sharding: str = "per rank", feeder: bool = True
                ) -> LoaderPlan:
    """What `split`'s batches of `dataset` will be under cfg on `device`. `feeder`: whether the
    caller's feeder may run a thread at all (the trainer's --feeder and core count)."""
    device = torch.device(device)
    # What the DataLoader reads: validation's is a Subset of the dataset (this rank's exact shard).
    seen = dataset if split == "train" else Subset(dataset, range(0))
    in_memory = isinstance(seen.dataset if isinstance(seen, Subset) else seen, (data.ArrayDataset, TensorDataset))
    ours = images.ours(dataset)
    decoder = "none" if in_memory else "dali" if cfg.loader == "dali" else "torch"
    if decoder == "dali" and sharding != "per rank":  # the options refuse it (--loader: horovod and ddp)
        raise UsageError("--loader dali gives each rank its own batches: a backend that shards them itself "
                         "(Accelerate, Lightning) cannot take them")
    workers = 0 if in_memory else cfg.num_workers or 0
    normalization = data.input_normalization(dataset)
    if normalization is None:
        normalised_in = "as given"
    elif decoder == "dali":
        normalised_in = "DALI"
    elif device.type == "cpu" and decoder == "torch" and workers and ours:
        # No bus to spare on a CPU: the decode workers normalise, in parallel, instead of the
        # rank's main process, in series with the step (30 ms a batch of 32 at 224 px).
        normalised_in = "decode workers"
    else:
        normalised_in = "device"
    train = split == "train"
    gathered = workers == 0 and _gatherable(seen) is not None
    return LoaderPlan(
        split=split, source="tensors in memory" if in_memory else "image files" if ours else "your dataset",
        decoder=decoder, workers=workers,
        batch_size=cfg.batch_size * (cfg.batches_per_allreduce if train else 1),
        order=("shard blocks" if data.sample_shards(dataset) is not None else "DistributedSampler") if train
        else "exact shard", sharding=sharding,
        crops="keyed (seed, epoch, sample)" if train and data.crops_keyed(dataset) else "the dataset's own",
        normalised_in=normalised_in, normalization=normalization, gathered=gathered,
        pin_memory=torch.cuda.is_available() and not _device_columns(dataset),
        # What runs on the feeder's thread draws nothing from torch's global generator: batches
        # made by workers or DALI, or gathered whole from memory; not a dataset's __getitem__.
        feeder_thread=feeder and (decoder == "dali" or workers > 0 or gathered),
        seed=cfg.seed, image_size=cfg.image_size, device=str(device))


def create_loader(plan: LoaderPlan, dataset, rank: int, world_size: int, epoch: int = 0, skip_batches: int = 0,
                  seen_before: tuple = ()):
    """The plan's batches of `dataset` for rank `rank` of `world_size` in `epoch`, the first
    `skip_batches` left out (a resume; after a resize in the epoch, its rest: seen_before)."""
    if plan.split == "val":
        # Not a DistributedSampler: it pads with duplicates so that shards are equal. Here every
        # validation sample is seen exactly once; metrics are reduced as (sum, count). Interleaved:
        # the whole set, which the library shards itself.
        indices = datasets.exact_shard(len(dataset), *((0, 1) if plan.sharding == "interleaved" else (rank, world_size)))
        if plan.decoder == "dali":
            from hvdtrain.torch import dali
            indices = list(indices)
            return dali.DaliLoader(dataset, [indices[i:i + plan.batch_size] for i in range(0, len(indices), plan.batch_size)],
                                   plan, epoch=0)
        return _dataloader(("val", rank, world_size), dataset, plan, range(len(indices)), shard=indices)
    if plan.sharding == "interleaved":
        batches = data.interleaved_batches(dataset, plan.seed, plan.batch_size, world_size, epoch, skip_batches,
                                           seen_before)
        return _dataloader(None, dataset, plan, batch_sampler=batches)
    if plan.decoder == "dali":
        from hvdtrain.torch import dali
        batches = data.rank_batches(dataset, plan.seed, plan.batch_size, rank, world_size, epoch, seen_before)
        return dali.DaliLoader(dataset, batches[skip_batches:], plan, epoch=epoch)
    sampler = data.SkipSampler(data.rank_order(dataset, plan.seed, rank, world_size, epoch, seen_before),
                               skip_batches * plan.batch_size)
    if isinstance(dataset, data.SeededSamples):
        sampler = data.WithEpoch(sampler, epoch)
    return _dataloader(("train", rank, world_size), dataset, plan, sampler, drop_last=True)


# Loaders whose workers are kept from one epoch (or validation pass) to the next (_dataloader), by
# (split, rank, world size, batch size, id of the dataset, workers): (dataset, loader, its
# _CurrentSampler); and, by id, loaders a library made from one of those (Accelerate's prepare
# copies persistent_workers).
_kept: dict = {}


class _CurrentSampler(Sampler):
    """The sampler of a loader kept across epochs (see _dataloader): this epoch's, set before
    each iteration. The indices are drawn in the rank's process, so a new one takes effect there."""

    def __init__(self):
        self.current = ()

    def __iter__(self):
        return iter(self.current)

    def __len__(self):
        return len(self.current)


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


def _dataloader(key: tuple | None, dataset, plan: LoaderPlan, sampler=None, shard=None, **kwargs) -> DataLoader:
    """A DataLoader over `dataset` (or its Subset `shard`) drawing `sampler`'s indices (batches of
    the plan's size), or as kwargs say (a batch sampler). With workers and a key, one loader per
    key for the whole run, its workers kept (persistent_workers): a worker starts in milliseconds
    from the forkserver, but then imports the user's script and its modules again (seen: 12 s an
    epoch for 2 workers), and its first batches leave the step waiting."""
    shown = dataset if shard is None else Subset(dataset, shard)
    if sampler is not None:
        kwargs["batch_size"] = plan.batch_size
    kwargs.setdefault("pin_memory", plan.pin_memory)
    if not plan.workers:
        gatherable = _gatherable(shown) if plan.gathered else None
        if gatherable:
            return DataLoader(_Gathered(shown, gatherable, kwargs["pin_memory"]), sampler=sampler, num_workers=0,
                              collate_fn=_collate_gathered, **kwargs)
        return DataLoader(shown, sampler=sampler, num_workers=0, **kwargs)
    unguarded = workers.unguarded_main()
    if unguarded:
        path, line = unguarded
        raise UsageError(f"{path} trains at its top level (line {line}): DataLoader worker processes import it "
                         "again and would each start training; put the training under `if __name__ == "
                         "\"__main__\":` (or pass num_workers=0)")
    if plan.normalised_in == "decode workers":
        kwargs.setdefault("collate_fn", images.NormalizedBatches(plan.normalization))
    kwargs.update(num_workers=plan.workers, multiprocessing_context=workers.worker_context(),
                  worker_init_fn=workers.init_worker)
    if key is None:
        return DataLoader(shown, sampler=sampler, **kwargs)
    key = (*key, plan.batch_size, id(dataset), plan.workers)
    kept = _kept.get(key)
    if kept is None or kept[0] is not dataset:
        current = _CurrentSampler()
        kept = _kept[key] = (dataset, _KeptLoader(shown, sampler=current, persistent_workers=True, **kwargs), current)
    kept[2].current = sampler
    return kept[1]


def _gatherable(dataset):
    """(columns, wrap, Subset indices or None) of an in-memory dataset whose batches can be
    gathered whole, else None. Exactly ArrayDataset, TensorDataset and a plain Subset of either:
    a subclass may change __getitem__ (a transform), which a gather would skip. Host tensors
    only: a user's TensorDataset may hold GPU tensors, which stay as they are."""
    inner, indices = dataset, None
    if type(dataset) is Subset:
        inner, indices = dataset.dataset, dataset.indices
    if type(inner) is data.ArrayDataset:
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
    tensors off the host: the user's own, put on the GPU before training (nothing to pin or copy:
    "cannot pin 'torch.cuda.FloatTensor'")."""
    inner = dataset.dataset if type(dataset) is Subset else dataset
    columns = inner.tensors if type(inner) is TensorDataset else \
        (inner.x, inner.y) if type(inner) is data.ArrayDataset else ()
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
