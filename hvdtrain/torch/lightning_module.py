"""The LightningModule and Callback of the `lightning` comparison backend
(hvdtrain/torch/backend_lightning.py), which imports this module only once Lightning is known to be
importable."""
from __future__ import annotations

import lightning.pytorch as pl
import torch

from hvdtrain.errors import UsageError
from hvdtrain.torch import loader


class TrainerModule(pl.LightningModule):
    """The hvdtrain trainer's model, data, optimizer and LR schedule, as a LightningModule."""

    def __init__(self, hv):
        super().__init__()
        self.hv = hv
        self.model = hv.raw_model

    def forward(self, x):
        return self.model(x)

    def train_dataloader(self):
        # Reloaded every epoch: each epoch's shuffle, as for the other backends.
        hv = self.hv
        at = hv.position
        return loader.create_loader(hv.loader_plans["train"], hv.train_ds, hv.rank, hv.world_size, at.epoch,
                                    at.steps_into_order, at.seen_before)

    def val_dataloader(self):
        hv = self.hv
        return loader.create_loader(hv.loader_plans["val"], hv.val_ds, hv.rank, hv.world_size)

    def configure_optimizers(self):
        return {"optimizer": self.hv.optimizer, "lr_scheduler": {"scheduler": self.hv.scheduler, "interval": "step"}}

    def training_step(self, batch, batch_idx):
        from hvdtrain.torch.train import step_seed

        hv = self.hv
        torch.manual_seed(step_seed(hv.cfg.seed, hv.position.global_step, hv.rank))
        x, y = batch
        out = self.model(hv.prepare_inputs(x))
        loss = hv._loss(out, y)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True, batch_size=len(y))
        # On the device, as the other backends keep them: the meter reads them at log intervals.
        correct = (out.argmax(1) == y).sum().double() if hv.reports_accuracy else loss.new_zeros((), dtype=torch.float64)
        stats = torch.stack((loss.detach().double() * len(y), correct,
                             torch.tensor(float(len(y)), dtype=torch.float64, device=out.device)))
        return {"loss": loss, "stats": stats}

    def validation_step(self, batch, batch_idx):
        x, y = batch
        out = self.model(self.hv.prepare_inputs(x))
        # Sums, reduced over every rank by Lightning (sync_dist): exact over uneven shards, where
        # a mean of the ranks' means would not be.
        for name, value in (("val_loss_sum", self.hv._sample_losses(out, y).sum()),
                            ("val_correct", (out.argmax(1) == y).sum().float() if self.hv.reports_accuracy
                             else out.new_zeros(())),
                            ("val_count", torch.tensor(float(len(y)), device=out.device))):
            self.log(name, value, on_step=False, on_epoch=True, reduce_fx="sum", sync_dist=True, batch_size=len(y))


class WatchTrainer(pl.Callback):
    """hvdtrain's bookkeeping around Lightning's loop, through the trainer's loop API
    (hvdtrain/trainer.py): the step meter (timed between barriers, reduced losses, the stop vote),
    the watchdog, and one history record per epoch."""

    def __init__(self, hv, backend):
        self.hv, self.backend = hv, backend
        self.stopped_by, self.train_metrics, self.val_metrics = None, None, {}

    def setup(self, trainer, pl_module, stage):
        hv = self.hv
        # Lightning's DDP launcher sets torch's threads to cores / processes on this node (2 for
        # one rank here: twice the compute of the other backends' one). Keep the trainer's count,
        # fixed and recorded for every backend alike.
        torch.set_num_threads(hv.threads)
        if (trainer.global_rank, trainer.world_size) != (hv.rank, hv.world_size):
            raise UsageError(f"Lightning's {self.backend.environment} sees rank {trainer.global_rank} of {trainer.world_size}, "
                             f"but this process is rank {hv.rank} of {hv.world_size} ({hv.env.launcher}): the "
                             f"launcher and Lightning disagree")

    def on_train_epoch_start(self, trainer, pl_module):
        self.steps, self.done = self.hv.start_epoch(), 0
        self.train_metrics, self.val_metrics = None, {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.hv.before_step()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.done += 1
        stop = self.hv.step_done(outputs["stats"])
        if stop or self.done >= self.steps:
            # The clock stops here, before Lightning validates, as for the other backends.
            self.train_metrics, self.stopped_by = self.hv.epoch_steps_done()
            trainer.should_stop = trainer.should_stop or stop

    def on_validation_end(self, trainer, pl_module):
        m = trainer.callback_metrics
        if "val_count" in m:
            count = float(m["val_count"])
            self.val_metrics = {"val_loss": float(m["val_loss_sum"]) / count,
                                "val_acc": float(m["val_correct"]) / count if self.hv.reports_accuracy else None,
                                "val_count": int(count)}

    def on_train_epoch_end(self, trainer, pl_module):
        self.backend.threads_in_loop = torch.get_num_threads()  # recorded: what the steps really ran with
        if self.train_metrics is None:  # Lightning ended the epoch before the planned steps
            self.train_metrics, self.stopped_by = self.hv.epoch_steps_done()
        self.hv.end_epoch(self.train_metrics, self.val_metrics if self.hv.cfg.validates else {}, self.stopped_by)
