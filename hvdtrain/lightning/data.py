"""`ImageDataModule`: hvdtrain's image pipeline as a LightningDataModule, for any strategy.

    data = hvdtrain.lightning.ImageDataModule("$SCRATCH/imagenet-shards", image_size=224, batch_size=64)
    trainer.fit(MyResNet(num_classes=1000), datamodule=data)

An image folder (train/ and val/ class folders) or hvdtrain's shards (`python -m hvdtrain.shards
write`), read as `python -m hvdtrain.torch` reads them (hvdtrain/torch/data.py, loader.py): JPEGs decoded to
uint8 by libjpeg-turbo in the decode workers (the rank's cores less one by default), the one crop
rule of every framework (a function of seed, epoch and sample), each rank its share of each
epoch (a few shards per rank from shards), every validation image on exactly one rank, workers
kept across epochs (hvdtrain/torch/loader.py, as the trainer's). On a GPU batches arrive uint8 and
are made normalised floats on the device (`on_after_batch_transfer`), as timm's loader does: the
host never builds float images; where the CPU trains, the decode workers normalise them.

The loaders are hvdtrain's, not plain DataLoaders, so Lightning leaves their sampling alone (no
DistributedSampler injected); they follow `trainer.current_epoch`. Validation shards differ by at
most one image between ranks: metrics from torchmetrics (reduced as sums over ranks) are exact;
`self.log(..., sync_dist=True)` averages the ranks' means.
"""
from __future__ import annotations

import dataclasses
import os

import lightning.pytorch as pl

from hvdtrain.cluster.env import ClusterEnv
from hvdtrain.config import TrainConfig
from hvdtrain.errors import UsageError
from hvdtrain.runtime import decode_workers, threads_per_rank
from hvdtrain.torch import data as torch_data, images, loader


def data_kind(data_dir: str) -> str:
    """"shards" for hvdtrain's shards (the manifest.json hvdtrain.shards writes), else "imagefolder"."""
    return "shards" if os.path.isfile(os.path.join(data_dir, "manifest.json")) else "imagefolder"


class _EpochLoader:
    """One split's batches as an iterable Lightning takes as it is: each iteration is hvdtrain's
    loader for the trainer's current epoch (its order and crops), on this rank."""

    def __init__(self, module: "ImageDataModule", split: str):
        self.module, self.split = module, split
        self._made = (None, None)  # (epoch, loader): Lightning asks its length, then iterates it

    def _loader(self):
        m, trainer = self.module, self.module.trainer
        epoch = trainer.current_epoch if self.split == "train" else 0
        if self._made[0] != epoch:  # the epoch's order once (a permutation of 1.28 M samples), not per call
            dataset = m.train_set if self.split == "train" else m.val_set
            plan = loader.plan_loader(m.cfg, dataset, self.split, trainer.strategy.root_device)
            self._made = (epoch, loader.create_loader(plan, dataset, trainer.global_rank, trainer.world_size, epoch))
        return self._made[1]

    def __len__(self):
        return len(self._loader())

    def __iter__(self):
        return iter(self._loader())


class ImageDataModule(pl.LightningDataModule):
    def __init__(self, data_dir: str, image_size: int = 224, batch_size: int = 64, num_workers: int | None = None,
                 seed: int = 42, channels_last: bool = False):
        super().__init__()
        if not data_dir or not os.path.isdir(data_dir):
            raise UsageError(f"ImageDataModule: no directory {data_dir!r} (an image folder with train/ and val/, "
                             f"or hvdtrain's shards)")
        # The trainer's own checks of these options (hvdtrain/config.py): one clear line each.
        self.cfg = TrainConfig(dataset=data_kind(data_dir), data_dir=data_dir, image_size=image_size,
                               batch_size=batch_size, num_workers=num_workers, seed=seed)
        self.channels_last = channels_last
        # The listing (a folder) or the index (shards), in each process: its classes for the model.
        self.train_set, self.val_set, _, self.classes, _ = torch_data.build_datasets(self.cfg)
        self.normalization = torch_data.input_normalization(self.val_set)

    def setup(self, stage: str | None = None) -> None:
        if self.cfg.num_workers is None:  # the rank's cores less the one its main process uses
            per_node = ClusterEnv.from_environ().local_world_size
            self.cfg = dataclasses.replace(self.cfg, num_workers=decode_workers(threads_per_rank(None, per_node)))

    def train_dataloader(self):
        return _EpochLoader(self, "train")

    def val_dataloader(self):
        return _EpochLoader(self, "val")

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        x, y = batch[0], batch[1]
        return images.to_model_input(x, self.normalization, self.channels_last), y

    def teardown(self, stage: str | None = None) -> None:
        if stage == "fit":
            loader.close_loaders()  # the workers kept across epochs end with the run
