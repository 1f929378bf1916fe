"""The data-parallel backends of each trainer, in one table: what `--backend` accepts, what
`hvdtrain.compare` runs, and the options each backend refuses for reasons of its own.

    python -m hvdtrain.torch --backend ddp ...     # torch: horovod (the product) | ddp | accelerate | lightning
    python -m hvdtrain.tf --backend mwms ...       # tf: horovod (the product) | mwms

A backend lives in its own module (hvdtrain/<framework>/backend_<name>.py) and is imported only
when chosen, so that this table, the CLI and the option checks need neither torch, TensorFlow nor
Horovod. Its class is built as `Class(cfg)` and subclasses its framework's
interface (INTERFACES: `hvdtrain.collectives.Collectives` plus everything that framework's
trainer calls; tests/test_backend_interfaces.py checks every row against it).

An option a backend cannot honour is refused before anything starts, never silently ignored:
an option only some backends honour says which in its TrainConfig field (`backends=`,
hvdtrain/config.py), and the others refuse it when it is given; the refusals below are each
backend's own, and each names the option and says what to use instead.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Refusal:
    applies: Callable  # (TrainConfig) -> bool
    message: str


@dataclass(frozen=True)
class Backend:
    framework: str           # torch | tf
    name: str                # as --backend spells it
    module: str              # imported only when this backend is chosen
    cls: str
    label: str               # its name in hvdtrain.compare's reports
    summary: str
    refusals: tuple[Refusal, ...] = ()
    compare_args: tuple[str, ...] = ()  # trainer options hvdtrain.compare adds for it
    parity_with: str | None = None      # the label of the backend whose losses it must reproduce
    # Why its ranks listen beyond loopback even when every rank is on one host ("": they do not).
    exposed_because: str = ""

    def trainer_args(self) -> list[str]:
        """The trainer command for this backend (after the Python interpreter)."""
        return ["-m", f"hvdtrain.{self.framework}", "--backend", self.name, *self.compare_args]

    def implementation(self) -> type:
        """The backend's class (imports its module, and with it its framework)."""
        return getattr(importlib.import_module(self.module), self.cls)

    def interface(self) -> type:
        """The class every backend of this framework subclasses."""
        module, cls = INTERFACES[self.framework]
        return getattr(importlib.import_module(module), cls)

    def start(self, cfg):
        """Import the backend's module and start it (hvd.init(), init_process_group, ...)."""
        return self.implementation()(cfg)


# What each framework's trainer asks of a backend: (module, class).
INTERFACES = {"torch": ("hvdtrain.torch.backend", "TorchBackend"), "tf": ("hvdtrain.tf.backend", "TFBackend")}


# Both TF backends run hvdtrain.tf's loops, which do one allreduce per backward pass.
_TF_COMMON = (
    Refusal(lambda cfg: cfg.batches_per_allreduce != 1,
            "--batches-per-allreduce > 1 is not supported by hvdtrain.tf yet (use hvdtrain.torch, or a "
            "larger --batch-size)"),
)

BACKENDS: tuple[Backend, ...] = (
    Backend("torch", "horovod", "hvdtrain.torch.backend_horovod", "HorovodBackend", "horovod-torch",
            "the default: Horovod's DistributedOptimizer, rank 0's state broadcast",
            refusals=(
                # Adasum's optimizer applies each update inside backward, before GradScaler can
                # unscale the gradients (about 65536 x too large) or skip a step that overflowed.
                Refusal(lambda cfg: cfg.use_adasum and cfg.amp == "fp16",
                        "--amp fp16 with --use-adasum is not supported: Horovod's Adasum optimizer steps inside "
                        "backward, on gradients still multiplied by the loss scale (use --amp bf16, which has no "
                        "loss scale, or averaging)"),
                # Adasum keeps a copy of each parameter and reduces the deltas in place: Horovod's
                # ops take contiguous tensors only (hvdtrain/torch/horovod_layout.py).
                # Untested with a compiled model: refused rather than run unchecked.
                Refusal(lambda cfg: cfg.compile != "off" and cfg.use_adasum,
                        "--compile with --use-adasum is not supported (untested: Horovod's Adasum optimizer steps "
                        "inside backward): use --compile off, or averaging"),
                Refusal(lambda cfg: cfg.compile != "off" and cfg.fp16_allreduce,
                        "--compile with --fp16-allreduce is not supported (untested): use --compile off, or "
                        "full-precision allreduces"),
                Refusal(lambda cfg: cfg.use_adasum and cfg.channels_last == "on",
                        "--channels-last on with --use-adasum is not supported (Horovod's Adasum optimizer reduces "
                        "the parameters' own layout, which must be contiguous): use --channels-last off"))),
    Backend("torch", "ddp", "hvdtrain.torch.backend_ddp", "DDPBackend", "ddp",
            "torch DistributedDataParallel, for comparison",
            parity_with="horovod-torch"),
    Backend("torch", "accelerate", "hvdtrain.torch.backend_accelerate", "AccelerateBackend", "accelerate",
            "Hugging Face Accelerate (optional: hvdtrain[compare]), for comparison",
            parity_with="ddp"),
    Backend("torch", "lightning", "hvdtrain.torch.backend_lightning", "LightningBackend", "lightning",
            "PyTorch Lightning, Trainer(strategy='ddp') (optional: hvdtrain[compare]), for comparison",
            refusals=(# Lightning accumulates over whole batches, hvdtrain over slices of one batch:
                      # not the same step, so no parity.
                      Refusal(lambda cfg: cfg.batches_per_allreduce != 1,
                              "--batches-per-allreduce > 1 with --backend lightning is not supported (Lightning "
                              "accumulates whole batches: use --backend ddp or horovod)"),
                      Refusal(lambda cfg: bool(cfg.checkpoint_dir),
                              "--checkpoint-dir with --backend lightning: Lightning writes checkpoints of its own, "
                              "which hvdtrain does not resume (the lightning backend is for comparison; use "
                              "--backend horovod or ddp)")),
            parity_with="ddp"),
    Backend("tf", "horovod", "hvdtrain.tf.backend_horovod", "HorovodBackend", "horovod-tf",
            "the default: Horovod's DistributedGradientTape / DistributedOptimizer, rank 0's state broadcast",
            refusals=_TF_COMMON + (
                Refusal(lambda cfg: cfg.use_adasum and cfg.fp16_allreduce,
                        "--use-adasum with --fp16-allreduce is not supported by Horovod-TF"),),
            compare_args=("--loop", "custom")),
    Backend("tf", "mwms", "hvdtrain.tf.backend_mwms", "MWMSBackend", "tf-mwms",
            "tf.distribute MultiWorkerMirroredStrategy, for comparison",
            refusals=_TF_COMMON + (
                Refusal(lambda cfg: cfg.loop != "custom",
                        "--backend mwms runs the GradientTape loop only: use --loop custom"),),
            compare_args=("--loop", "custom"), parity_with="horovod-tf",
            exposed_because="TensorFlow's gRPC server (one per worker) binds every interface, and TensorFlow has "
                            "no option to bind one address; keep the nodes behind the cluster's firewall"),
)


def names(framework: str) -> list[str]:
    return [b.name for b in BACKENDS if b.framework == framework]


def get(framework: str, name: str) -> Backend | None:
    return next((b for b in BACKENDS if b.framework == framework and b.name == name), None)


def by_label(label: str) -> Backend | None:
    return next((b for b in BACKENDS if b.label == label), None)


def problems(cfg) -> list[str]:
    """What is wrong with cfg's backend choice: an unknown backend, or options it refuses."""
    backend = get(cfg.framework, cfg.backend)
    if backend is None:
        return [f"unknown backend '{cfg.backend}'; valid: {', '.join(names(cfg.framework))}"]
    return [r.message for r in backend.refusals if r.applies(cfg)]


def start(cfg):
    """Start the backend cfg names; cfg was checked by TrainConfig, so it exists."""
    return get(cfg.framework, cfg.backend).start(cfg)
