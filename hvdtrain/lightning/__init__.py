"""Horovod for your LightningModule: one import, then `strategy="horovod"` as Lightning 1.x had it.

    import lightning.pytorch as pl
    import hvdtrain.lightning                                 # registers "horovod" with Lightning

    trainer = pl.Trainer(strategy="horovod", accelerator="gpu", devices=4, num_nodes=2, precision="16-mixed")
    trainer.fit(MyModule(), datamodule=MyDataModule())        # srun --mpi=pmix ... / mpirun -np 8 python train.py

The other Trainer arguments stay as they are for `ddp` (`devices` the processes a node runs, or 1
in each process as Lightning 1.x's Horovod had it). Horovod's options and hvdtrain's guards come
with the class: `strategy=hvdtrain.lightning.HorovodStrategy(compression="fp16", checkpoint_every="30m")`.
What the guards do: hvdtrain/lightning/guards.py; hvdtrain's image pipeline as a data module:
hvdtrain/lightning/data.py; your module under ddp and horovod side by side: hvdtrain/lightning/
compare.py. Needs Lightning 2.x (`pip install lightning`).
"""
from hvdtrain.lightning.data import ImageDataModule
from hvdtrain.lightning.guards import Guards
from hvdtrain.lightning.strategy import HorovodStrategy, export_mpi_settings

export_mpi_settings()
HorovodStrategy.register()

__all__ = ["Guards", "HorovodStrategy", "ImageDataModule"]
