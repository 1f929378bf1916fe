"""Workloads of the comparison: one definition, used by every backend.

A workload fixes the architecture, the data and its order (seed), the per-rank batch, the LR
schedule and the number of steps; `trainer_args()` turns it into the options that both
`hvdtrain.torch` and `hvdtrain.tf` accept, so no backend can drift from it.

    python -c "from hvdtrain.compare.workloads import WORKLOADS; print(*WORKLOADS, sep='\\n')"
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
    purpose: str = "throughput"  # throughput | parity (losses only) | accuracy
    given_args: tuple[str, ...] = ()  # a user's own trainer options (`custom`), used as given

    def trainer_args(self, batch_size: int | None = None, base_lr: float | None = None) -> list[str]:
        """The options for both trainers; `batch_size` and `base_lr` replace the workload's (strong
        scaling changes them with the size)."""
        overrides = []
        if batch_size is not None:
            overrides += ["--batch-size", str(batch_size)]
        if base_lr is not None:
            overrides += ["--base-lr", repr(base_lr)]
        if self.given_args:  # the trainer's parser takes the last of a repeated option
            return [*self.given_args, *overrides]
        args = ["--model", self.model, "--dataset", self.dataset, "--batch-size", str(self.batch_size),
                "--optimizer", self.optimizer, "--base-lr", str(self.base_lr), "--lr-schedule", self.lr_schedule,
                "--epochs", str(self.epochs), "--image-size", str(self.image_size),
                "--synthetic-size", str(self.synthetic_size), "--warmup-steps", str(self.warmup_steps),
                "--seed", str(self.seed), "--weight-decay", "0"]
        if self.steps:
            args += ["--steps", str(self.steps)]
        return [*args, *overrides]

    def scaled_args(self, ranks: int, smallest_ranks: int, scaling: str) -> list[str]:
        """The options at `ranks` ranks. Weak scaling: as they are (the per-rank batch is fixed).
        Strong: the global batch of the smallest size (batch x its ranks) split over `ranks`, and
        --base-lr divided by ranks / smallest_ranks, since the trainer multiplies it by the world
        size: every size then trains with the same global batch and the same LR."""
        if scaling == "weak":
            return self.trainer_args()
        global_batch = self.batch_size * smallest_ranks
        if global_batch % ranks:
            raise UsageError(f"strong scaling: the global batch {global_batch} (per-rank batch {self.batch_size} x "
                             f"{smallest_ranks} rank(s) of the smallest size) does not divide over {ranks} ranks; "
                             "choose sizes that divide it, or another --batch-size")
        return self.trainer_args(batch_size=global_batch // ranks, base_lr=self.base_lr * smallest_ranks / ranks)

    def scaling_rule(self, smallest_ranks: int, scaling: str) -> str:
        if scaling == "weak":
            return (f"Weak scaling: per-rank batch {self.batch_size} at every size, so the global batch grows with "
                    f"the ranks; LR = base LR {self.base_lr:g} x ranks (the linear scaling rule).")
        return (f"Strong scaling: global batch {self.batch_size * smallest_ranks} at every size (per-rank batch = "
                f"{self.batch_size * smallest_ranks} / ranks); LR {self.base_lr * smallest_ranks:g} at every size "
                f"(--base-lr {self.base_lr:g} x {smallest_ranks} / ranks, which the trainer multiplies by the ranks).")


WORKLOADS = {w.name: w for w in [
    # Throughput: ImageNet-shaped ResNets on random images (the reference figures: ResNet-18, batch 16, 224).
    Workload("resnet50-synthetic", "resnet50", "synthetic", batch_size=8, optimizer="sgd", base_lr=0.01,
             steps=10, image_size=224, synthetic_size=512),
    Workload("resnet18-synthetic", "resnet18", "synthetic", batch_size=16, optimizer="sgd", base_lr=0.01,
             steps=12, image_size=224, synthetic_size=512),
    # Small and fast: for tests and quick checks on a laptop-like machine.
    Workload("resnet18-synthetic-small", "resnet18", "synthetic", batch_size=8, optimizer="sgd", base_lr=0.01,
             steps=6, image_size=64, synthetic_size=128, warmup_steps=2),
    # Parity in seconds (the test suite's comparison): the digits CNN for 2 epochs; the pairs'
    # losses must agree, accuracies across frameworks are not compared (digits-cnn does that).
    Workload("digits-cnn-quick", "mnist_cnn", "digits", batch_size=32, optimizer="adam", base_lr=0.003,
             lr_schedule="cosine", epochs=2, image_size=8, purpose="parity"),
    # Accuracy: the real 8x8 digits, MNIST-style CNN, 20 epochs (about 98.5% in torch and TF).
    Workload("digits-cnn", "mnist_cnn", "digits", batch_size=32, optimizer="adam", base_lr=0.003, lr_schedule="cosine",
             epochs=20, image_size=8, purpose="accuracy"),
]}


def custom_workload(trainer_args: list[str]) -> Workload:
    """A workload from a user's own trainer options (`--train-args`): the model's recipe fills
    what they leave out, as the trainer does; it validates unless it trains on synthetic data."""
    from hvdtrain.config import build_parser, config_from_args

    parser = build_parser("torch", [], "trainer options")

    def refuse(message):
        raise UsageError(f"--train-args: {message}")

    parser.error = refuse
    cfg = config_from_args("torch", parser.parse_args(trainer_args))
    return Workload("custom", cfg.model, cfg.dataset, cfg.batch_size, cfg.optimizer, cfg.base_lr,
                    purpose="throughput" if cfg.dataset == "synthetic" else "accuracy",
                    given_args=tuple(trainer_args))


def get_workload(name: str) -> Workload:
    if name not in WORKLOADS:
        raise UsageError(f"unknown workload '{name}'; valid: {', '.join(WORKLOADS)}")
    return WORKLOADS[name]
