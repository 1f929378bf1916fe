"""Workloads of the comparison: one definition, used by every backend.

A workload fixes the architecture, the data and its order (seed), the per-rank batch, the LR
schedule and the number of steps; `trainer_args()` turns it into the options that both
`hvdtrain.torch` and `hvdtrain.tf` accept, so no backend can drift from it.

    python -c "from hvdtrain.workloads import WORKLOADS; print(*WORKLOADS, sep='\\n')"
"""
from __future__ import annotations

from dataclasses import dataclass

from hvdtrain.errors import UsageError


@dataclass(frozen=True)
class Workload:
    name: str
    model: str
    dataset: str
    batch_size: int              # per rank
    optimizer: str
    base_lr: float
    lr_schedule: str = "constant"
    epochs: int = 1
    steps: int | None = None
    image_size: int = 224
    synthetic_size: int = 1024
    warmup_steps: int = 3        # steps excluded from timing
    seed: int = 42
    purpose: str = "throughput"  # throughput | accuracy

    def trainer_args(self) -> list[str]:
        args = ["--model", self.model, "--dataset", self.dataset, "--batch-size", str(self.batch_size),
                "--optimizer", self.optimizer, "--base-lr", str(self.base_lr), "--lr-schedule", self.lr_schedule,
                "--epochs", str(self.epochs), "--image-size", str(self.image_size),
                "--synthetic-size", str(self.synthetic_size), "--warmup-steps", str(self.warmup_steps),
                "--seed", str(self.seed), "--weight-decay", "0"]
        if self.steps:
            args += ["--steps", str(self.steps)]
        return args


WORKLOADS = {w.name: w for w in [
    # Throughput: ImageNet-shaped ResNets on random images (issue figures: ResNet-18, batch 16, 224).
    Workload("resnet50-synthetic", "resnet50", "synthetic", batch_size=8, optimizer="sgd", base_lr=0.01,
             steps=10, image_size=224, synthetic_size=512),
    Workload("resnet18-synthetic", "resnet18", "synthetic", batch_size=16, optimizer="sgd", base_lr=0.01,
             steps=12, image_size=224, synthetic_size=512),
    # Small and fast: for tests and quick checks on a laptop-like machine.
    Workload("resnet18-synthetic-small", "resnet18", "synthetic", batch_size=8, optimizer="sgd", base_lr=0.01,
             steps=6, image_size=64, synthetic_size=128, warmup_steps=2),
    # Accuracy: the real 8x8 digits, MNIST-style CNN, 20 epochs (about 98.5% in torch and TF).
    Workload("digits-cnn", "mnist_cnn", "digits", batch_size=32, optimizer="adam", base_lr=0.003, lr_schedule="cosine",
             epochs=20, image_size=8, purpose="accuracy"),
]}


def get_workload(name: str) -> Workload:
    if name not in WORKLOADS:
        raise UsageError(f"unknown workload '{name}'; valid: {', '.join(WORKLOADS)}")
    return WORKLOADS[name]
