"""The training configuration: one frozen dataclass, built in one place from the command line.

Both trainers (`python -m hvdtrain.torch`, `python -m hvdtrain.tf`) share this CLI, derived from
the fields' declarations (hvdtrain/options.py): adding an option is adding its field. Derived
values (global batch, scaled learning rate) are properties, so they can never disagree with the
fields.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import os
from dataclasses import dataclass

from hvdtrain import backends, options, plugins, recipes
from hvdtrain.errors import UsageError
from hvdtrain.options import FREE, MATCH, RESIZE, declared, opt

DATASETS = ("synthetic", "imagefolder", "shards", "digits")
OPTIMIZERS = ("sgd", "adam", "adamw")
LR_SCHEDULES = ("cosine", "step", "constant")
AMP_MODES = ("off", "fp16", "bf16")


@declared
@dataclass(frozen=True)
class TrainConfig:
    # Each field declares itself once (hvdtrain/options.py): its help, whether ranks may differ in
    # it (per_rank), what a resume does when it differs (MATCH / RESIZE / FREE), and where it
    # applies; the command line, the checks below, the ranks' agreement and the resume rules
    # follow from that.
    framework: str = opt("torch", help="the trainer: torch or tf", flag=False, per_rank=False, resume=MATCH)
    model: str = opt("resnet50", help="one of: {models}; or your own, FILE.py:FUNCTION or package.module:FUNCTION "
                                      "(a function of no arguments returning the model)", per_rank=False, resume=MATCH)
    dataset: str = opt("synthetic", help="one of: {datasets}; or your own, FILE.py:FUNCTION (returning (train, val) "
                                         "datasets of (input, target) pairs; val may be None)", per_rank=False,
                       resume=MATCH)
    loss: str = opt("cross_entropy", help="cross_entropy (accuracy reported too), or your own FILE.py:FUNCTION: "
                                          "torch: (outputs, targets) -> scalar tensor; TensorFlow: Keras' order, "
                                          "(y_true, y_pred) -> loss", per_rank=False, resume=MATCH,
                    frameworks=("torch", "tf"))
    data_dir: str | None = opt(None, help="imagefolder: the root holding train/ and val/ class folders; shards: the "
                                          "directory python -m hvdtrain.shards wrote", per_rank=True,
                               resume=FREE)
    epochs: int = opt(1, help="epochs to train", per_rank=False, resume=FREE, at_least=1)
    steps: int | None = opt(None, help="stop after this many optimizer steps in all", per_rank=False, resume=FREE,
                            at_least=1)
    batch_size: int = opt(32, help="samples per rank per backward pass", per_rank=False, resume=RESIZE, at_least=1)
    image_size: int = opt(224, help="synthetic/imagefolder image side", per_rank=False, resume=MATCH, at_least=8)
    # (synthetic: the validation set is a quarter of it)
    synthetic_size: int = opt(1024, help="synthetic training samples", per_rank=False, resume=FREE, at_least=1)
    # Set by the model's recipe (hvdtrain/recipes.py) unless given; these defaults are ImageNet's.
    base_lr: float = opt(recipes.IMAGENET.base_lr, help="LR for one rank; x world size x batches per allreduce",
                         per_rank=False, resume=FREE, above=0.0)
    warmup_epochs: float = opt(recipes.IMAGENET.warmup_epochs, help="linear LR warm-up from base LR", per_rank=False,
                               resume=FREE, at_least=0.0)
    lr_schedule: str = opt(recipes.IMAGENET.lr_schedule, help="the LR after the warm-up", per_rank=False,
                           resume=FREE, choices=LR_SCHEDULES)
    optimizer: str = opt(recipes.IMAGENET.optimizer, help="the optimizer", per_rank=False, resume=MATCH,
                         choices=OPTIMIZERS)
    momentum: float = opt(recipes.IMAGENET.momentum, help="SGD momentum", per_rank=False, resume=FREE, at_least=0.0)
    weight_decay: float = opt(recipes.IMAGENET.weight_decay, help="weight decay", per_rank=False, resume=FREE,
                              at_least=0.0)
    recipe: str = opt(recipes.IMAGENET.name, help="the model's recipe, which set the options not given", flag=False,
                      per_rank=False, resume=FREE)
    # Ranks may differ in how they spelled the same options.
    recipe_overrides: tuple[str, ...] = opt((), help="the recipe options given on the command line", flag=False,
                                            per_rank=True, resume=FREE)
    fp16_allreduce: bool = opt(False, help="compress gradients to fp16 for the allreduce", per_rank=False,
                               resume=FREE, backends=("horovod", "ddp", "lightning"))
    batches_per_allreduce: int = opt(1, help="backward passes accumulated locally per allreduce", per_rank=False,
                                     resume=RESIZE, at_least=1)
    use_adasum: bool = opt(False, help="Adasum reduction instead of averaging", per_rank=False, resume=FREE,
                           backends=("horovod",))
    # A choice, not a GPU switch: autocast runs on CPUs too (torch >= 2.4), so CI runs the GPU
    # templates' options. fp16 needs the GradScaler; bf16 has float32's range and needs none.
    amp: str = opt("off", help="mixed precision: fp16 (autocast + GradScaler; --amp alone) or bf16 (autocast, "
                               "no scaler), on GPUs and CPUs", per_rank=False, resume=FREE, frameworks=("torch",),
                   choices=AMP_MODES, const="fp16")
    channels_last: str = opt("auto", help="channels-last memory format for the model and its inputs (auto: for "
                                          "ResNets on a CUDA GPU, where cuDNN is faster with it)", per_rank=False,
                             resume=FREE, frameworks=("torch",), choices=("auto", "on", "off"))
    deterministic: bool = opt(False, help="deterministic kernels: cuDNN's autotuning off, torch.use_deterministic_"
                                          "algorithms (a warning for an op without one); slower: for debugging and "
                                          "parity checks between runs", per_rank=False, resume=FREE,
                              frameworks=("torch",))
    seed: int = opt(42, help="seed of the weights, the data order and the random ops", per_rank=False, resume=FREE)
    num_workers: int | None = opt(None, help="DataLoader workers per rank, which decode image files (default: the "
                                             "rank's cores less one, --cpus-per-task under Slurm; in-memory data "
                                             "needs none)", per_rank=True, resume=FREE, frameworks=("torch",),
                                  at_least=0)
    loader: str = opt("torch", help="what decodes image files: torch (the framework's own: torch's DataLoader "
                                    "workers, TensorFlow's tf.data) or dali (NVIDIA DALI: on the GPU, or its CPU "
                                    "mode on CPUs; pip install nvidia-dali-cuda130, and for TensorFlow pip install "
                                    "--no-build-isolation nvidia-dali-tf-plugin-cuda130)", per_rank=False,
                      resume=FREE, frameworks=("torch", "tf"), backends=("horovod", "ddp", "mwms"),
                      choices=("torch", "dali"))
    compile: str = opt("off", help="torch.compile: regions (each top-level child of the model compiled alone, a "
                                   "ResNet's stages: Horovod's allreduces start region by region during the "
                                   "backward) or model (the whole model: DDP's compiled path; under Horovod every "
                                   "allreduce waits for the whole backward); checkpoints keep the eager keys",
                       per_rank=False, resume=FREE, frameworks=("torch",), backends=("horovod", "ddp"),
                       choices=("off", "model", "regions"))
    compile_backend: str = opt("inductor", help="torch.compile's backend (aot_eager: no code generated, a quick "
                                                "check)", per_rank=False, resume=FREE, frameworks=("torch",),
                               choices=("inductor", "aot_eager", "eager"))
    feeder: str = opt("on", help="read and copy the next batches to the device on a thread while the step runs "
                                 "(off: in series with the step, to measure what it saves)", per_rank=False,
                      resume=FREE, frameworks=("torch",), choices=("on", "off"))
    threads_per_rank: int | None = opt(None, help="CPU compute threads per rank (default: cores of the allocation / "
                                                  "ranks per node)", per_rank=True, resume=FREE, at_least=1)
    checkpoint_dir: str | None = opt(None, help="write a checkpoint here every epoch (rank 0)", per_rank=True,
                                     resume=FREE)
    checkpoint_every: str | None = opt(None, help="also checkpoint in the middle of epochs: every N steps ('2000') or "
                                                  "every interval of time ('30m', '90s', '2h'; rank 0's clock, agreed "
                                                  "by every rank at a log interval): a crash without a signal then "
                                                  "costs that much", per_rank=False, resume=FREE)
    checkpoint_write: str = opt("background", help="write --checkpoint-every's checkpoints while the next steps run, "
                                                   "the state staged to host memory first (torch: a writer process; "
                                                   "TensorFlow: a thread) (inline: between two steps, the GPU waiting; "
                                                   "epoch ends and stops are always inline)",
                                per_rank=False, resume=FREE, choices=("background", "inline"))
    resume: bool = opt(False, help="resume from the newest checkpoint (also automatic when --checkpoint-dir holds "
                                   "one)", per_rank=False, resume=FREE)
    keep_checkpoints: int = opt(3, help="checkpoints kept, the newest", per_rank=False, resume=FREE, at_least=1)
    log_dir: str | None = opt(None, help="TensorBoard scalars (rank 0)", per_rank=True, resume=FREE)
    log_interval: int = opt(10, help="steps between progress reductions", per_rank=False, resume=FREE, at_least=1)
    result_json: str | None = opt(None, help="write config, throughput, metrics and checksums here", per_rank=True,
                                  resume=FREE)
    warmup_steps: int = opt(2, help="steps run before the throughput clock starts, and left out of it (caches, "
                                    "cuDNN's autotuning; not the LR warm-up, which is --warmup-epochs)",
                            per_rank=False, resume=FREE, at_least=0)
    validation: str = opt("auto", help="a validation pass after each epoch (auto: yes, except on synthetic data, "
                                       "whose random labels make validation loss and accuracy meaningless)",
                          per_rank=False, resume=FREE, choices=("auto", "on", "off"))
    # fit (tf_keras legacy optimizer) and custom (Keras 3 optimizer) keep different slots.
    loop: str = opt("custom", help="Keras fit or GradientTape loop", per_rank=False, resume=MATCH,
                    frameworks=("tf",), choices=("fit", "custom"))
    backend: str = opt("horovod", help="{backends}", per_rank=False, resume=FREE, choices=backends.names)
    horovod_tuning: str = opt("auto", help="auto: set Horovod/Open MPI knobs from the cores per rank "
                                           "(docs/horovod-overhead.md)", per_rank=False, resume=FREE,
                              choices=("auto", "off"))
    cycle_time_ms: float | None = opt(None, help="HOROVOD_CYCLE_TIME in ms (default: Horovod's own, 1)",
                                      per_rank=False, resume=FREE, backends=("horovod",), above=0.0)
    mpi_yield: str = opt("auto", help="Open MPI yields the core while waiting (auto: on CPU ranks, never on GPU ranks)",
                         per_rank=False, resume=FREE, choices=("auto", "on", "off"))
    watchdog_seconds: float | None = opt(None, help="end the job when a rank completes no step for this long "
                                                    "(default: 20 x the slowest step seen, at least 300 s; 0: off); "
                                                    "see hvdtrain/watchdog.py", per_rank=False, resume=FREE)
    divergence_factor: float = opt(1000.0, help="stop, without a checkpoint, when the training loss exceeds this "
                                                "many times its first logged value (non-finite losses always stop; "
                                                "0: off)", per_rank=False, resume=FREE, at_least=0.0)
    allow_resize: bool = opt(False, help="resume a checkpoint written with another world size, --batch-size or "
                                         "--batches-per-allreduce: LR rescaled and the position recomputed from the "
                                         "samples seen", per_rank=False, resume=FREE)
    trust_checkpoints: bool = opt(False, help="on torch < 2.6, also resume checkpoints that hvdtrain did not sign "
                                              "for this user (torch < 2.6 can run code from a crafted checkpoint: "
                                              "CVE-2025-32434)", per_rank=False, resume=FREE)
    world_size: int = opt(1, help="ranks, filled in by the trainer once its backend has started", flag=False,
                          per_rank=True, resume=RESIZE)

    @property
    def validates(self) -> bool:
        return self.validation == "on" or (self.validation == "auto" and self.dataset != "synthetic")

    def __post_init__(self):
        if isinstance(self.amp, bool):  # --amp was a switch (checkpoints, result files, fit(amp=True))
            object.__setattr__(self, "amp", "fp16" if self.amp else "off")
        problems = options.range_problems(self)  # at_least / above, as declared
        if self.dataset not in DATASETS and not plugins.is_reference(self.dataset):
            problems.append(f"unknown dataset '{self.dataset}'; valid: {', '.join(DATASETS)}")
        if self.optimizer not in OPTIMIZERS:
            problems.append(f"unknown optimizer '{self.optimizer}'; valid: {', '.join(OPTIMIZERS)}")
        if self.amp not in AMP_MODES:
            problems.append(f"unknown --amp mode '{self.amp}'; valid: {', '.join(AMP_MODES)}")
        if self.lr_schedule not in LR_SCHEDULES:
            problems.append(f"unknown LR schedule '{self.lr_schedule}'; valid: {', '.join(LR_SCHEDULES)}")
        if self.resume and not self.checkpoint_dir:
            problems.append("--resume needs --checkpoint-dir")
        if self.checkpoint_every is not None:
            try:
                self.checkpoint_interval
            except ValueError as err:
                problems.append(str(err))
            if not self.checkpoint_dir:
                problems.append("--checkpoint-every needs --checkpoint-dir")
        if self.watchdog_seconds is not None and not (math.isfinite(self.watchdog_seconds) and self.watchdog_seconds >= 0):
            problems.append(f"--watchdog-seconds must be >= 0 (0: off; got {self.watchdog_seconds:g})")
        problems += backends.problems(self)  # unknown backend, or its own refusals
        if backends.get(self.framework, self.backend):
            problems += options.unhonoured(self)  # options declared for other backends only
        if problems:
            raise UsageError("; ".join(problems))

    # Derived values -----------------------------------------------------------------------
    @property
    def checkpoint_interval(self) -> tuple[int | None, float | None]:
        """--checkpoint-every as (steps, None) or (None, seconds); (None, None) when not given."""
        text = str(self.checkpoint_every).strip().lower() if self.checkpoint_every is not None else ""
        if not text:
            return None, None
        units = {"s": 1, "m": 60, "h": 3600}
        number, unit = (text[:-1], text[-1]) if text[-1] in units else (text, "")
        try:
            value = float(number) if unit else int(number)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or value <= 0:
            raise ValueError(f"--checkpoint-every takes a number of steps (2000) or of seconds, minutes or hours "
                             f"(90s, 30m, 2h), above 0; got {self.checkpoint_every!r}")
        return (None, value * units[unit]) if unit else (value, None)

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

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        """to_dict's inverse: a saved config (a result file's), its derived keys left out."""
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in fields})

    def with_world_size(self, world_size: int) -> "TrainConfig":
        return dataclasses.replace(self, world_size=world_size)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    # Options whose default comes from the model's recipe say so instead of "(default: None)";
    # others without a value say "(default: none)".
    def _get_help_string(self, action):
        if action.default is None:
            return action.help if "default:" in (action.help or "") else f"{action.help} (default: none)"
        return super()._get_help_string(action)


# The command line's option groups, in the order --help shows them (every flag in one: tested).
OPTION_GROUPS = {
    "model and data": ("model", "dataset", "loss", "data_dir", "image_size", "synthetic_size", "validation",
                       "num_workers"),
    "optimisation": ("epochs", "steps", "batch_size", "batches_per_allreduce", "base_lr", "warmup_epochs",
                     "lr_schedule", "optimizer", "momentum", "weight_decay", "seed", "deterministic", "loop"),
    "checkpoints and resume": ("checkpoint_dir", "checkpoint_every", "checkpoint_write", "resume", "keep_checkpoints", "allow_resize", "trust_checkpoints"),
    "reliability": ("watchdog_seconds", "divergence_factor"),
    "output": ("log_dir", "log_interval", "result_json", "warmup_steps"),
    "performance tuning": ("amp", "channels_last", "compile", "compile_backend", "loader", "feeder", "threads_per_rank", "fp16_allreduce", "use_adasum",
                           "horovod_tuning", "cycle_time_ms", "mpi_yield"),
    "backend": ("backend",),
}

LAUNCH_EXAMPLES = """Run it on every rank, under a launcher (one process without one):
  srun python -m hvdtrain.{fw} --model resnet50 --dataset imagefolder --data-dir $DATA   (in an sbatch script)
  mpirun -np 4 python -m hvdtrain.{fw} --model mnist_cnn --dataset digits --epochs 8
  horovodrun -np 4 -H localhost:4 --gloo python -m hvdtrain.{fw} --model resnet18 --dataset synthetic
"""


def build_parser(framework: str, models: list[str], prog: str) -> argparse.ArgumentParser:
    """The command line of `framework`'s trainer: every TrainConfig field declared a flag for it,
    in field order. Recipe options default to None, which the model's recipe fills."""
    recipes_text = "; ".join(f"{m}: {r.name} ({', '.join(f'{k} {v}' for k, v in r.options().items())})"
                             for m, r in recipes.MODEL_RECIPES.items())
    p = argparse.ArgumentParser(prog=prog, description=f"Data-parallel training ({framework}) with Horovod (or, for "
                                                       f"comparison, the other --backend choices).",
                                formatter_class=_HelpFormatter,
                                epilog=LAUNCH_EXAMPLES.format(fw=framework) +
                                f"\nRecipes, the defaults per model (hvdtrain/recipes.py): {recipes_text}.")
    groups = {name: p.add_argument_group(name) for name in OPTION_GROUPS}
    group_of = {field: groups[name] for name, fields in OPTION_GROUPS.items() for field in fields}
    words = {"models": ", ".join(models), "datasets": ", ".join(DATASETS),
             "backends": "; ".join(f"{b.name}: {b.summary}" for b in backends.BACKENDS if b.framework == framework)}
    for field in dataclasses.fields(TrainConfig):
        o = options.option(field)
        if not o.flag or framework not in o.frameworks:
            continue
        help_text = o.help.format(**words)
        if field.name in recipes.OPTIONS:
            help_text += " (default: the model's recipe, below)"
        kind = options.value_type(TrainConfig, field.name)
        group = group_of[field.name]
        if kind is bool:
            group.add_argument(*options.flag_spellings(field.name), dest=field.name, action="store_true",
                               help=help_text)
            continue
        choices = o.choices(framework) if callable(o.choices) else o.choices
        group.add_argument(*options.flag_spellings(field.name), dest=field.name, type=None if kind is str else kind,
                           metavar=None if choices else options.flag(field.name)[2:].upper().replace("-", "_"),
                       default=None if field.name in recipes.OPTIONS else field.default,
                       **({"nargs": "?", "const": o.const} if o.const is not None else {}),
                       choices=choices, help=help_text)
    return p


def config_from_args(framework: str, args: argparse.Namespace) -> TrainConfig:
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    return config_from_values(framework, {k: v for k, v in vars(args).items() if k in fields})


def config_from_values(framework: str, values: dict) -> TrainConfig:
    """The configuration from option values by field name (the command line's, or fit()'s keyword
    arguments: an option of another framework or no option at all is refused in one line)."""
    known = set(options.flags(TrainConfig, framework)) - {"framework"}
    unknown = sorted(set(values) - known)
    if unknown:
        hints = [f"{name} (did you mean {close[0]}?)" if (close := difflib.get_close_matches(name, known, 1)) else name
                 for name in unknown]
        raise UsageError(f"unknown option{'s' if len(unknown) > 1 else ''} for hvdtrain.{framework}: {', '.join(hints)}")
    values = {k: v for k, v in values.items() if v is not None or k not in recipes.OPTIONS}
    # The model's recipe fills what the command line left out.
    recipe = recipes.for_model(values.get("model", TrainConfig.model))
    given = tuple(k for k in recipes.OPTIONS if values.get(k) is not None)
    values.update({k: v for k, v in recipe.options().items() if k not in given})
    cfg = TrainConfig(framework=framework, recipe=recipe.name, recipe_overrides=given, **values)
    if cfg.data_dir is not None:
        cfg = dataclasses.replace(cfg, data_dir=os.path.abspath(cfg.data_dir))
    return cfg
