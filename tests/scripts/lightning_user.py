"""A user's Lightning script as the courses write it (a LightningModule, a LightningDataModule over
a plain DataLoader, pl.Trainer), with `import hvdtrain.lightning` its one hvdtrain line; the tests
run it under `strategy="horovod"` and `"ddp"`. Each rank writes what it saw to OUT.rank<R>.json.

    mpirun -np 2 python lightning_user.py --strategy horovod --out run --epochs 2
    mpirun -np 2 python lightning_user.py --out a --root a + --out b --root b --accumulate 2   # two fits
"""
import argparse
import json
import os
import sys
import time

import lightning.pytorch as pl
import torch
import torchmetrics
from torch.utils.data import DataLoader, TensorDataset

import hvdtrain.lightning  # noqa: F401  - the one line: Trainer(strategy="horovod")


def regression_data(n: int = 256, features: int = 16, classes: int = 4):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, classes, generator=g)
    return TensorDataset(x, (x @ w).argmax(1), torch.arange(n))


class Data(pl.LightningDataModule):
    def __init__(self, batch_size: int):
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage=None):
        self.train, self.val = regression_data(), regression_data(64)

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=self.batch_size)


class Net(pl.LightningModule):
    def __init__(self, lr: float, fail_at: tuple[int, int] | None = None, step_sleep: float = 0.0,
                 diverge_at: int | None = None):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        self.lr, self.fail_at, self.step_sleep, self.diverge_at = lr, fail_at, step_sleep, diverge_at
        self.seen, self.losses, self.batches = [], [], 0
        self.started_at = None
        self.samples_seen = torchmetrics.SumMetric()  # reduced over ranks when computed
        self.collectives = None

    def training_step(self, batch, batch_idx):
        x, y, index = batch
        if self.fail_at and (self.global_rank, self.global_step) == self.fail_at:
            raise ValueError(f"a bad sample on rank {self.global_rank}")
        if self.step_sleep:
            time.sleep(self.step_sleep)
        self.seen += index.tolist()
        self.batches += 1
        self.samples_seen.update(torch.tensor(float(len(index))))
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        if self.diverge_at is not None and self.global_step >= self.diverge_at:
            loss = loss * float("nan")
        self.losses.append(loss.item())
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y, _ = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self.net(x), y), sync_dist=True)

    def on_train_start(self):
        self.started_at = {"epoch": self.current_epoch, "global_step": self.global_step}

    def on_train_end(self):
        # Lightning's collectives, as a user's module calls them: under horovod, Horovod's.
        rank, strategy = self.global_rank, self.trainer.strategy
        self.collectives = {
            "all_gather": self.all_gather(torch.tensor([rank, 10 + rank])).tolist(),
            "reduce_sum": float(strategy.reduce(torch.tensor(rank + 1.0), reduce_op="sum")),
            "reduce_mean": float(strategy.reduce(torch.tensor(rank + 1.0))),
            "reduce_max": float(strategy.reduce(torch.tensor(rank + 1.0), reduce_op="max")),
            "broadcast": strategy.broadcast({"from": rank}),
            "any": strategy.reduce_boolean_decision(rank == 1, all=False),
            "samples_seen": float(self.samples_seen.compute()),
        }
        strategy.barrier()

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 3, gamma=0.5)}


def module():  # for python -m hvdtrain.lightning.compare --module lightning_user.py:module
    return Net(0.05)


def datamodule():
    return Data(16)


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--strategy", default="horovod")
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--precision", default="32-true")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--ckpt-path")
    p.add_argument("--root", default=".")
    p.add_argument("--fail-at", help="RANK:STEP raises there")
    p.add_argument("--diverge-at", type=int)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--clip", type=float)
    p.add_argument("--sync-batchnorm", action="store_true")
    p.add_argument("--fp16-scaler", action="store_true", help="16-mixed with a GradScaler on the CPU")
    p.add_argument("--checkpoint-every", help="HorovodStrategy(checkpoint_every=...)")
    args = p.parse_args(argv)

    pl.seed_everything(0)
    fail_at = tuple(int(v) for v in args.fail_at.split(":")) if args.fail_at else None
    model = Net(args.lr, fail_at, args.step_sleep, args.diverge_at)
    ranks_here = int(os.environ.get("SLURM_NTASKS_PER_NODE") or os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE") or 1)
    strategy = args.strategy
    if args.checkpoint_every:
        strategy = hvdtrain.lightning.HorovodStrategy(checkpoint_every=args.checkpoint_every)
    plugins = []
    if args.fp16_scaler:  # Lightning makes "16-mixed" bf16 on a CPU; torch's CPU GradScaler runs fp16's path
        from lightning.pytorch.plugins import MixedPrecision

        plugins = [MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))]
    trainer = pl.Trainer(strategy=strategy, accelerator="cpu", devices=ranks_here, num_nodes=1, plugins=plugins,
                         max_epochs=args.epochs, accumulate_grad_batches=args.accumulate,
                         **({} if plugins else {"precision": args.precision}),
                         gradient_clip_val=args.clip, default_root_dir=args.root, log_every_n_steps=2,
                         sync_batchnorm=args.sync_batchnorm,
                         enable_progress_bar=False, enable_model_summary=False, logger=False,
                         callbacks=[pl.callbacks.ModelCheckpoint(dirpath=os.path.join(args.root, "ckpt"),
                                                                 save_last=True, save_top_k=-1)])
    trainer.fit(model, datamodule=Data(args.batch_size), ckpt_path=args.ckpt_path)
    state = {k: v.tolist() for k, v in model.state_dict().items()}
    record = {"rank": trainer.global_rank, "world_size": trainer.world_size, "local_rank": trainer.local_rank,
              "node_rank": trainer.node_rank, "seen": model.seen, "batches": model.batches, "losses": model.losses,
              "started_at": model.started_at, "global_step": trainer.global_step, "epoch": trainer.current_epoch,
              "state": state, "strategy": type(trainer.strategy).__name__,
              "optimizer": type(trainer.optimizers[0]).__module__, "collectives": model.collectives,
              "lr": trainer.optimizers[0].param_groups[0]["lr"]}
    with open(f"{args.out}.rank{trainer.global_rank}.json", "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    # Several fits one after the other in one launch, their options separated by "+" (the tests'
    # variants, without paying each one's start-up): `... --out a + --out b --accumulate 2`.
    groups, group = [], []
    for arg in sys.argv[1:] + ["+"]:
        if arg == "+":
            groups.append(group)
            group = []
        else:
            group.append(arg)
    for group in groups:
        main(group)
