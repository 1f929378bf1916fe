"""hvdtrain.torch's loaders without ranks (fast tier): the loader Accelerate shards gives each
rank exactly DDP's batches, the way Accelerate itself shards it."""
import pytest
import torch

import loaders
from hvdtrain.config import TrainConfig
from hvdtrain.torch import data, loader

accelerate_data_loader = pytest.importorskip("accelerate.data_loader")


@pytest.mark.parametrize("world_size,skip", [(1, 0), (2, 0), (2, 3), (3, 1)])
def test_interleaved_loader_sharded_by_accelerate_gives_each_rank_its_ddp_batches(world_size, skip):
    cfg = TrainConfig(framework="torch", model="mnist_cnn", dataset="digits", batch_size=4, num_workers=0, seed=7)
    dataset = data.ArrayDataset(torch.arange(103, dtype=torch.float32).reshape(103, 1).numpy(),
                                torch.zeros(103, dtype=torch.int64).numpy())
    for epoch in (0, 1):
        everyone = loaders.interleaved_train_loader(dataset, cfg, world_size, epoch, skip).batch_sampler
        for rank in range(world_size):
            # Accelerate's own sharding of a batch sampler: batch k to rank k mod N.
            shard = list(accelerate_data_loader.BatchSamplerShard(everyone, num_processes=world_size,
                                                                  process_index=rank))
            ddp = [x[:, 0].long().tolist() for x, _ in loaders.train_loader(dataset, cfg, rank, world_size, epoch, skip)]
            assert shard == ddp and len(ddp) == 103 // world_size // 4 - skip, (rank, epoch)


def test_in_memory_batches_are_gathered_whole_and_equal_the_per_sample_batches(monkeypatch):
    """ArrayDataset (fewer images than labels: x[i % len(x)]), a TensorDataset and a Subset of
    each give the loaders one gather per batch, and those batches are what collating the samples
    one by one gives (values, dtypes, shapes), in the sampler's order."""
    cfg = TrainConfig(framework="torch", model="mnist_cnn", dataset="digits", batch_size=4, num_workers=2, seed=3)
    images = torch.arange(7 * 2 * 3, dtype=torch.float32).reshape(7, 2, 3)
    array = data.ArrayDataset(images.numpy(), torch.arange(30, dtype=torch.int64).numpy())
    tensors = torch.utils.data.TensorDataset(torch.randn(30, 5), torch.arange(30) % 4, torch.rand(30) > 0.5)
    for dataset in (array, tensors, torch.utils.data.Subset(array, [29, 3, 8, 15, 22, 7, 1, 0, 9])):
        expected = [torch.utils.data.default_collate([dataset[i] for i in batch])
                    for batch in loaders.interleaved_train_loader(dataset, cfg, 1, 0, 0).batch_sampler]
        calls = []
        monkeypatch.setattr(type(dataset), "__getitem__", lambda self, i: calls.append(i))
        got = list(loaders.interleaved_train_loader(dataset, cfg, 1, 0, 0))
        monkeypatch.undo()
        assert calls == [] and len(got) == len(expected) > 0
        for g, e in zip(got, expected):
            assert len(g) == len(e) and all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(g, e))
    val = [b for b in loaders.val_loader(array, cfg, 1, 2)]
    assert torch.equal(torch.cat([y for _, y in val]), torch.arange(15, 30))
    assert torch.equal(torch.cat([x for x, _ in val]), images[torch.arange(15, 30) % 7])


def test_datasets_that_may_change_their_samples_are_read_a_sample_at_a_time():
    """A TensorDataset subclass with its own __getitem__ (a transform) is not gathered: its
    __getitem__ runs for every sample. Columns that require grad still load; the loader's dataset
    answers for the user's dataset's attributes."""
    cfg = TrainConfig(framework="torch", model="mnist_cnn", dataset="digits", batch_size=4, num_workers=0, seed=3)

    class Doubled(torch.utils.data.TensorDataset):
        def __getitem__(self, i):
            x, y = super().__getitem__(i)
            return x * 2, y

    doubled = Doubled(torch.ones(12, 3), torch.arange(12))
    assert all(torch.equal(x, torch.full((4, 3), 2.0)) for x, _ in loaders.interleaved_train_loader(doubled, cfg, 1, 0, 0))
    features = torch.utils.data.TensorDataset(torch.randn(12, 3, requires_grad=True), torch.arange(12))
    features.classes = ["a", "b"]
    made = loaders.interleaved_train_loader(features, cfg, 1, 0, 0)
    assert len(list(made)) == 3 and made.dataset.classes == ["a", "b"]


def test_normalisation_constants_are_made_once_per_device():
    """to_model_input's mean and std are made once per device: made at every batch, on a GPU each
    was a blocking copy from pageable memory (a host wait where it runs on the compute stream).
    The result is (x / 255 - mean) / std and the uint8 batch is left as it was."""
    from hvdtrain.torch import images

    normalization = images.IMAGENET_NORMALIZATION
    x = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    before = x.clone()
    first = images.to_model_input(x, normalization)
    constants = images._normalization_constants(normalization, x.device)
    assert images._normalization_constants(normalization, torch.device("cpu")) is constants
    images.to_model_input(x, normalization)
    assert images._normalization_constants(normalization, x.device) is constants
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in normalization)
    assert torch.allclose(first, (x.float() / 255 - mean) / std, atol=1e-5) and torch.equal(x, before)
    assert images.to_model_input(x.float(), normalization).dtype == torch.float32  # floats pass unchanged
    assert torch.equal(images.to_model_input(x.float(), normalization), x.float())


def test_tensors_already_on_a_device_are_not_pinned(monkeypatch):
    """A user's TensorDataset of GPU tensors met pin_memory=True ("cannot pin
    'torch.cuda.FloatTensor'"). Tensors off the host (meta tensors stand in for the GPU's here)
    get a loader that does not pin, where CUDA would pin; host tensors keep the pinned gather."""
    from torch.utils.data import Subset, TensorDataset

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = TrainConfig(batch_size=2, num_workers=0)
    on_device = TensorDataset(torch.empty(4, 3, device="meta"), torch.empty(4, dtype=torch.int64, device="meta"))
    assert loader._device_columns(on_device) and loader._device_columns(Subset(on_device, [0, 1]))
    plan = loader.plan_loader(cfg, on_device, "train")
    assert not plan.pin_memory and loader._dataloader(None, on_device, plan, batch_size=2).pin_memory is False
    on_host = TensorDataset(torch.zeros(4, 3), torch.zeros(4, dtype=torch.int64))
    assert not loader._device_columns(on_host)
    plan = loader.plan_loader(cfg, on_host, "train")
    assert plan.pin_memory and loader._dataloader(None, on_host, plan, batch_size=2).pin_memory is True


def _trained(batches, steps: int) -> list[int]:
    return [int(i) for batch in batches[:steps] for i in batch]


@pytest.mark.parametrize("in_shards", [False, True])
def test_a_resize_in_the_middle_of_an_epoch_trains_the_rest_exactly_once(in_shards):
    """2 ranks train 7 steps of 4 of epoch 1, then 3 ranks (a resize) the rest: every sample of
    the epoch is trained once, none twice, but for fewer than one global batch left out; then
    3 ranks train 2 steps and 2 ranks the rest again (two resizes in one epoch). Rank orders
    as the trainer's loaders give them: DistributedSampler's, or from shards a few shards each."""
    from hvdtrain import checkpoint as ckpt

    cfg = TrainConfig(framework="torch", model="mnist_cnn", dataset="digits", batch_size=4, num_workers=0, seed=7)
    n = 203
    dataset = data.ArrayDataset(torch.arange(n, dtype=torch.float32).reshape(n, 1).numpy(),
                                torch.zeros(n, dtype=torch.int64).numpy())
    if in_shards:
        dataset.sample_shards = torch.arange(n).numpy() // 10  # 21 shards of 10 samples (the last 3)

    def batches(world, seen_before=()):
        return [loaders.rank_batches(dataset, cfg, r, world, 1, seen_before) for r in range(world)]
    first = [_trained(b, 7) for b in batches(2)]  # 2 x 7 x 4 = 56 samples
    at = ckpt.Position(1, 7, 7 + n // 2 // 4)
    cfg3 = TrainConfig(**{**cfg.__dict__, "world_size": 3})
    moved, _ = ckpt.rescale_position(at, {"world_size": 2, "batch_size": 4, "batches_per_allreduce": 1}, cfg3,
                                     steps_per_epoch=n // 3 // 4, train_size=n)
    rest = batches(3, moved.seen_before)
    steps = n // 3 // 4 - moved.step_in_epoch
    assert all(len(b) == steps for b in rest)  # what the position leaves is what the loaders hold
    trained = sum(first, []) + sum((_trained(b, steps) for b in rest), [])
    assert len(trained) == len(set(trained)) and n - len(trained) < 3 * 4, (len(trained), len(set(trained)))
    # The loader a resumed rank builds skips into that order, not into the plain one.
    resumed = [x[:, 0].long().tolist() for x, _ in loaders.train_loader(dataset, cfg, 2, 3, 1, 1, moved.seen_before)]
    assert resumed == rest[2][1:]
    # Two steps at 3 ranks, then back to 2: the rest of the rest.
    later = ckpt.Position(1, moved.step_in_epoch + 2, moved.global_step + 2, (), moved.seen_before, moved.order_start)
    back, _ = ckpt.rescale_position(later, {"world_size": 3, "batch_size": 4, "batches_per_allreduce": 1}, cfg,
                                    steps_per_epoch=n // 2 // 4, train_size=n)
    last = batches(2, back.seen_before)
    steps_left = n // 2 // 4 - back.step_in_epoch
    trained = sum(first, []) + sum((_trained(b, 2) for b in rest), []) + sum((_trained(b, steps_left) for b in last), [])
    assert len(trained) == len(set(trained)) and n - len(trained) < 2 * 4
    if in_shards:  # a rank of the rest still reads a few shards, not all of them
        assert max(len({i // 10 for i in _trained(b, steps)}) for b in rest) <= 12  # of 21


def test_a_resize_at_imagenet_scale_loses_and_repeats_nothing():
    """Computed at the users' scale: 1,281,167 samples in 1,100 shards, 8 ranks x 96 a step
    resized to 32 ranks halfway (614,400 samples seen). Before, the rest of the epoch was the new
    order's from sample 614,400: 25.1 % of the epoch never seen, 24.8 % seen twice."""
    import numpy as np

    from hvdtrain.data import datasets

    n = 1_281_167
    shards = np.arange(n) * 1100 // n
    orders = lambda size: datasets.shard_blocked_orders(shards, 0, 3, size)  # noqa: E731
    per_rank = 614_400 // 8
    seen = np.concatenate([order[:per_rank] for order in orders(8)])
    rest = np.concatenate(datasets.rest_of_epoch(orders, n, ((8, per_rank),), 32))
    every = np.concatenate([seen, rest])
    assert len(np.unique(every)) == len(every) and n - len(every) < 32
