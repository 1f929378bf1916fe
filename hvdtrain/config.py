"""The training configuration: one frozen dataclass, built in one place from the command line.

Both trainers (`python -m hvdtrain.torch`, `python -m hvdtrain.tf`) share this CLI. Derived values
(global batch, scaled learning rate) are properties, so they can never disagree with the fields.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
from dataclasses import dataclass

from hvdtrain import backends, recipes
from hvdtrain.errors import UsageError

DATASETS = ("synthetic", "imagefolder", "digits")
OPTIMIZERS = ("sgd", "adam", "adamw")
LR_SCHEDULES = ("cosine", "step", "constant")


@dataclass(frozen=True)
class TrainConfig:
    framework: str = "torch"
    model: str = "resnet50"
    dataset: str = "synthetic"
    data_dir: str | None = None
    epochs: int = 1
    steps: int | None = None
    batch_size: int = 32                 # per rank, per backward pass
    image_size: int = 224
    synthetic_size: int = 1024           # synthetic training samples (validation: a quarter)
    # Set by the model's recipe (hvdtrain/recipes.py) unless given; these defaults are ImageNet's.
    base_lr: float = recipes.IMAGENET.base_lr  # for one rank; scaled by world size x batches per allreduce
    warmup_epochs: float = recipes.IMAGENET.warmup_epochs
    lr_schedule: str = recipes.IMAGENET.lr_schedule
    optimizer: str = recipes.IMAGENET.optimizer
    momentum: float = recipes.IMAGENET.momentum
    weight_decay: float = recipes.IMAGENET.weight_decay
    recipe: str = recipes.IMAGENET.name
    recipe_overrides: tuple[str, ...] = ()  # recipe options given explicitly
    fp16_allreduce: bool = False
    batches_per_allreduce: int = 1
    use_adasum: bool = False
    amp: bool = False
    seed: int = 42
    num_workers: int = 2
    threads_per_rank: int | None = None
    checkpoint_dir: str | None = None
    resume: bool = False
    keep_checkpoints: int = 3
    log_dir: str | None = None
    log_interval: int = 10
    result_json: str | None = None
    warmup_steps: int = 2                # steps excluded from throughput timing
    validation: str = "auto"             # auto (not on synthetic data) | on | off
    loop: str = "custom"                 # TF only: fit | custom
    backend: str = "horovod"             # hvdtrain/backends.py: torch: horovod | ddp; tf: horovod | mwms
    horovod_tuning: str = "auto"         # auto | off: see hvdtrain/tuning.py
    cycle_time_ms: float | None = None   # HOROVOD_CYCLE_TIME override
    mpi_yield: str = "auto"              # auto | on | off: OMPI_MCA_mpi_yield_when_idle
    watchdog_seconds: float | None = None  # no step for this long ends the job; None: auto; 0: off
    divergence_factor: float = 1000.0    # a loss above this x the first one stops the run; 0: off
    allow_resize: bool = False           # resume a checkpoint written with another global batch
    trust_checkpoints: bool = False      # torch < 2.6: load checkpoints without this user's signature
    world_size: int = 1                  # filled in by the trainer once the launcher is known

    @property
    def validates(self) -> bool:
        return self.validation == "on" or (self.validation == "auto" and self.dataset != "synthetic")

    def __post_init__(self):
        problems = []
        if self.batch_size < 1:
            problems.append(f"--batch-size must be >= 1 (got {self.batch_size})")
        if self.epochs < 1:
            problems.append(f"--epochs must be >= 1 (got {self.epochs})")
        if self.steps is not None and self.steps < 1:
            problems.append(f"--steps must be >= 1 (got {self.steps})")
        if self.batches_per_allreduce < 1:
            problems.append(f"--batches-per-allreduce must be >= 1 (got {self.batches_per_allreduce})")
        if self.image_size < 8:
            problems.append(f"--image-size must be >= 8 (got {self.image_size})")
        if self.dataset not in DATASETS:
            problems.append(f"unknown dataset '{self.dataset}'; valid: {', '.join(DATASETS)}")
        if self.optimizer not in OPTIMIZERS:
            problems.append(f"unknown optimizer '{self.optimizer}'; valid: {', '.join(OPTIMIZERS)}")
        if self.lr_schedule not in LR_SCHEDULES:
            problems.append(f"unknown LR schedule '{self.lr_schedule}'; valid: {', '.join(LR_SCHEDULES)}")
        if self.log_interval < 1:
            problems.append(f"--log-interval must be >= 1 (got {self.log_interval})")
        if self.num_workers < 0:
            problems.append(f"--num-workers must be >= 0 (got {self.num_workers})")
        if self.resume and not self.checkpoint_dir:
            problems.append("--resume needs --checkpoint-dir")
        # Numbers that would otherwise fail deep inside torch/numpy, or train on silently.
        for option, value, low, low_ok in (("--base-lr", self.base_lr, 0.0, False), ("--momentum", self.momentum, 0.0, True),
                                           ("--weight-decay", self.weight_decay, 0.0, True),
                                           ("--warmup-epochs", self.warmup_epochs, 0.0, True),
                                           ("--divergence-factor", self.divergence_factor, 0.0, True)):
            if not math.isfinite(value) or value < low or (value == low and not low_ok):
                problems.append(f"{option} must be a finite number {'>=' if low_ok else '>'} {low:g} (got {value:g})")
        if self.cycle_time_ms is not None and not (math.isfinite(self.cycle_time_ms) and self.cycle_time_ms > 0):
            problems.append(f"--cycle-time-ms must be a finite number > 0 (got {self.cycle_time_ms:g})")
        if self.synthetic_size < 1:
            problems.append(f"--synthetic-size must be >= 1 (got {self.synthetic_size})")
        if self.keep_checkpoints < 1:
            problems.append(f"--keep-checkpoints must be >= 1 (got {self.keep_checkpoints})")
        if self.warmup_steps < 0:
            problems.append(f"--warmup-steps must be >= 0 (got {self.warmup_steps})")
        if self.watchdog_seconds is not None and not (math.isfinite(self.watchdog_seconds) and self.watchdog_seconds >= 0):
            problems.append(f"--watchdog-seconds must be >= 0 (0: off; got {self.watchdog_seconds:g})")
        if self.threads_per_rank is not None and self.threads_per_rank < 1:
            problems.append(f"--threads-per-rank must be >= 1 (got {self.threads_per_rank})")
        problems += backends.problems(self)  # unknown backend, or options it cannot honour
        if problems:
            raise UsageError("; ".join(problems))

    # Derived values -----------------------------------------------------------------------
    @property
    def per_rank_batch_size(self) -> int:
        return self.batch_size

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step over all ranks."""
        return self.batch_size * self.batches_per_allreduce * self.world_size

    @property
    def lr(self) -> float:
        """Linear scaling rule (Goyal et al.): LR grows with the samples per optimizer step.

        Adasum adapts the update itself, so its LR scales only with the local accumulation.
        """
        factor = self.batches_per_allreduce * (1 if self.use_adasum else self.world_size)
        return self.base_lr * factor

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(per_rank_batch_size=self.per_rank_batch_size,
                 global_batch_size=self.global_batch_size, lr=self.lr)
        return d

    def with_world_size(self, world_size: int) -> "TrainConfig":
        return dataclasses.replace(self, world_size=world_size)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    # Options whose default comes from the model's recipe say so instead of "(default: None)".
    def _get_help_string(self, action):
        return action.help if action.default is None else super()._get_help_string(action)


def build_parser(framework: str, models: list[str], prog: str) -> argparse.ArgumentParser:
    d = TrainConfig()
    recipes_text = "; ".join(f"{m}: {r.name} ({', '.join(f'{k} {v}' for k, v in r.options().items())})"
                             for m, r in recipes.MODEL_RECIPES.items())
    p = argparse.ArgumentParser(prog=prog, description=f"Horovod data-parallel training ({framework}).",
                                formatter_class=_HelpFormatter,
                                epilog=f"Recipes, the defaults per model (hvdtrain/recipes.py): {recipes_text}.")
    from_recipe = "(default: the model's recipe, below)"
    p.add_argument("--model", default="resnet50", help=f"one of: {', '.join(models)}")
    p.add_argument("--dataset", default=d.dataset, help=f"one of: {', '.join(DATASETS)}")
    p.add_argument("--data-dir", default=None, help="imagefolder root holding train/ and val/ class folders")
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--steps", type=int, default=None, help="stop after this many optimizer steps in all")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="samples per rank per backward pass")
    p.add_argument("--image-size", type=int, default=d.image_size, help="synthetic/imagefolder image side")
    p.add_argument("--synthetic-size", type=int, default=d.synthetic_size, help="synthetic training samples")
    p.add_argument("--base-lr", type=float, default=None,
                   help=f"LR for one rank; x world size x batches per allreduce {from_recipe}")
    p.add_argument("--warmup-epochs", type=float, default=None, help=f"linear LR warm-up from base LR {from_recipe}")
    p.add_argument("--lr-schedule", default=None, choices=LR_SCHEDULES, help=from_recipe)
    p.add_argument("--optimizer", default=None, choices=OPTIMIZERS, help=from_recipe)
    p.add_argument("--momentum", type=float, default=None, help=f"SGD momentum {from_recipe}")
    p.add_argument("--weight-decay", type=float, default=None, help=from_recipe)
    p.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to fp16 for the allreduce")
    p.add_argument("--batches-per-allreduce", type=int, default=d.batches_per_allreduce,
                   help="backward passes accumulated locally per allreduce")
    p.add_argument("--use-adasum", action="store_true", help="Adasum reduction instead of averaging")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--threads-per-rank", type=int, default=None,
                   help="CPU compute threads per rank (default: cores of the allocation / ranks per node)")
    p.add_argument("--checkpoint-dir", default=None, help="write a checkpoint here every epoch (rank 0)")
    p.add_argument("--resume", action="store_true",
                   help="resume from the newest checkpoint (also automatic when --checkpoint-dir holds one)")
    p.add_argument("--keep-checkpoints", type=int, default=d.keep_checkpoints)
    p.add_argument("--log-dir", default=None, help="TensorBoard scalars (rank 0)")
    p.add_argument("--log-interval", type=int, default=d.log_interval, help="steps between progress reductions")
    p.add_argument("--result-json", default=None, help="write config, throughput, metrics and checksums here")
    p.add_argument("--warmup-steps", type=int, default=d.warmup_steps, help="steps excluded from throughput")
    p.add_argument("--validation", default=d.validation, choices=("auto", "on", "off"),
                   help="a validation pass after each epoch (auto: yes, except on synthetic data, whose "
                        "random labels make validation loss and accuracy meaningless)")
    p.add_argument("--watchdog-seconds", type=float, default=None,
                   help="end the job when a rank completes no step for this long (default: 20 x the slowest "
                        "step seen, at least 300 s; 0: off); see hvdtrain/watchdog.py")
    p.add_argument("--divergence-factor", type=float, default=d.divergence_factor,
                   help="stop, without a checkpoint, when the training loss exceeds this many times its first "
                        "logged value (non-finite losses always stop; 0: off)")
    p.add_argument("--allow-resize", action="store_true",
                   help="resume a checkpoint written with another world size, --batch-size or "
                        "--batches-per-allreduce: LR rescaled and the position recomputed from the samples seen")
    p.add_argument("--trust-checkpoints", action="store_true",
                   help="on torch < 2.6, also resume checkpoints that hvdtrain did not sign for this user "
                        "(torch < 2.6 can run code from a crafted checkpoint: CVE-2025-32434)")
    p.add_argument("--horovod-tuning", default=d.horovod_tuning, choices=("auto", "off"),
                   help="auto: set Horovod/Open MPI knobs from the cores per rank (docs/horovod-overhead.md)")
    p.add_argument("--cycle-time-ms", type=float, default=None,
                   help="HOROVOD_CYCLE_TIME in ms (default: Horovod's own, 1)")
    p.add_argument("--mpi-yield", default=d.mpi_yield, choices=("auto", "on", "off"),
                   help="Open MPI yields the core while waiting (auto: on CPU or < 4 cores per rank)")
    if framework == "torch":
        p.add_argument("--num-workers", type=int, default=d.num_workers, help="DataLoader workers per rank")
        p.add_argument("--amp", action="store_true", help="mixed precision on GPU (autocast + GradScaler)")
    else:
        p.add_argument("--loop", default=d.loop, choices=("fit", "custom"), help="Keras fit or GradientTape loop")
    p.add_argument("--backend", default=d.backend, choices=backends.names(framework),
                   help="; ".join(f"{b.name}: {b.summary}" for b in backends.BACKENDS if b.framework == framework))
    return p


def config_from_args(framework: str, args: argparse.Namespace) -> TrainConfig:
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    values = {k: v for k, v in vars(args).items() if k in fields}
    # The model's recipe fills what the command line left out.
    recipe = recipes.for_model(values.get("model", TrainConfig.model))
    given = tuple(k for k in recipes.OPTIONS if values.get(k) is not None)
    values.update({k: v for k, v in recipe.options().items() if k not in given})
    cfg = TrainConfig(framework=framework, recipe=recipe.name, recipe_overrides=given, **values)
    if cfg.data_dir is not None:
        cfg = dataclasses.replace(cfg, data_dir=os.path.abspath(cfg.data_dir))
    return cfg
