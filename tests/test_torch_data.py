"""hvdtrain.torch's loaders without ranks (fast tier): the loader Accelerate shards gives each
rank exactly DDP's batches, the way Accelerate itself shards it."""
import pytest
import torch

from hvdtrain.config import TrainConfig
from hvdtrain.torch import data

accelerate_data_loader = pytest.importorskip("accelerate.data_loader")


@pytest.mark.parametrize("world_size,skip", [(1, 0), (2, 0), (2, 3), (3, 1)])
def test_interleaved_loader_sharded_by_accelerate_gives_each_rank_its_ddp_batches(world_size, skip):
    cfg = TrainConfig(framework="torch", model="mnist_cnn", dataset="digits", batch_size=4, num_workers=0, seed=7)
    dataset = data.ArrayDataset(torch.arange(103, dtype=torch.float32).reshape(103, 1).numpy(),
                                torch.zeros(103, dtype=torch.int64).numpy())
    for epoch in (0, 1):
        everyone = data.interleaved_train_loader(dataset, cfg, world_size, epoch, skip).batch_sampler
        for rank in range(world_size):
            # Accelerate's own sharding of a batch sampler: batch k to rank k mod N.
            shard = list(accelerate_data_loader.BatchSamplerShard(everyone, num_processes=world_size,
                                                                  process_index=rank))
            ddp = [x[:, 0].long().tolist() for x, _ in data.train_loader(dataset, cfg, rank, world_size, epoch, skip)]
            assert shard == ddp and len(ddp) == 103 // world_size // 4 - skip, (rank, epoch)
