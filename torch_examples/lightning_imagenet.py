"""The courses' Lightning ImageNet training (a LightningModule around torchvision's ResNet-50, a
LightningDataModule, pl.Trainer under srun) on Horovod: `import hvdtrain.lightning` makes
`strategy="horovod"` exist; every other Trainer argument is as for `ddp`. The data module is
hvdtrain's image pipeline (an image folder or hvdtrain's shards); your own works as well.

    srun python torch_examples/lightning_imagenet.py --data-dir $SCRATCH/imagenet-shards   # one task per GPU
    mpirun -np 2 python torch_examples/lightning_imagenet.py --data-dir DIR --arch resnet18 --image-size 64 --epochs 1
    python torch_examples/lightning_imagenet.py ... --strategy ddp                        # the same under DDP

The job script: `python -m hvdtrain.slurm --script torch_examples/lightning_imagenet.py -- --data-dir ...`.
"""
import argparse
import os

import lightning.pytorch as pl
import torch
import torchmetrics
import torchvision

import hvdtrain.lightning  # Trainer(strategy="horovod"), hvdtrain.lightning.ImageDataModule


class ImageNetModule(pl.LightningModule):
    def __init__(self, arch: str = "resnet50", num_classes: int = 1000, lr: float = 0.1, epochs: int = 90):
        super().__init__()
        self.save_hyperparameters()
        self.model = torchvision.models.get_model(arch, weights=None, num_classes=num_classes)
        self.val_accuracy = torchmetrics.classification.MulticlassAccuracy(num_classes, average="micro")

    def forward(self, x):
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        out = self(x)
        self.val_accuracy(out, y)
        self.log("val_loss", torch.nn.functional.cross_entropy(out, y), sync_dist=True)
        self.log("val_acc", self.val_accuracy)  # torchmetrics: reduced over every rank, exact

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9, weight_decay=1e-4)
        return [optimizer], [torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.hparams.epochs)]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", required=True, help="an image folder (train/, val/) or hvdtrain's shards")
    p.add_argument("--arch", default="resnet50")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=64, help="per GPU (per process)")
    p.add_argument("--epochs", type=int, default=90)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--strategy", default="horovod")
    p.add_argument("--max-steps", type=int, default=-1)
    p.add_argument("--root", default=os.environ.get("HVDTRAIN_RUN_DIR", "lightning_runs"),
                   help="checkpoints and logs (Trainer default_root_dir; default: the job script's run directory)")
    args = p.parse_args()

    gpu = torch.cuda.is_available()
    data = hvdtrain.lightning.ImageDataModule(args.data_dir, image_size=args.image_size, batch_size=args.batch_size,
                                              channels_last=gpu)
    model = ImageNetModule(args.arch, data.classes, args.lr, args.epochs)
    if gpu:
        model = model.to(memory_format=torch.channels_last)
    trainer = pl.Trainer(
        strategy=args.strategy,
        accelerator="gpu" if gpu else "cpu",
        devices=int(os.environ.get("SLURM_GPUS_ON_NODE", 1)) if gpu else 1,  # as the Jean Zay page sets it
        num_nodes=int(os.environ.get("SLURM_NNODES", 1)),
        precision="16-mixed" if gpu else "bf16-mixed",
        max_epochs=args.epochs, max_steps=args.max_steps,
        default_root_dir=args.root,  # hpc_ckpt_N.ckpt: the guards' checkpoints, resumed after a requeue
        enable_progress_bar=False,
    )
    trainer.fit(model, datamodule=data)
    metrics = {name: f"{float(value):.4f}" for name, value in trainer.callback_metrics.items()}
    if trainer.is_global_zero:
        print(f"epoch {trainer.current_epoch}, step {trainer.global_step}: {metrics}", flush=True)


if __name__ == "__main__":
    main()
