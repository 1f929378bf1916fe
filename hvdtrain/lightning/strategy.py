"""`HorovodStrategy`: Lightning 2.x's Strategy interface over Horovod, started as hvdtrain starts it.

Registered as "horovod" by `import hvdtrain.lightning`. What it does, and why:
- Horovod starts with hvdtrain's settings (hvdtrain/torch/backend_horovod.py: the launcher check,
  Open MPI's settings, GPU ops, the stall backstop) when the strategy is made, so that ranks are
  Horovod's from the first log line; each rank takes hvdtrain's device (hvdtrain/torch/devices.py).
- Rank 0's weights are broadcast at set-up. Optimizer state is not: every rank starts empty or
  loads the same checkpoint, and Horovod's broadcast_optimizer_state would create empty state
  with a zero-gradient step that weight decay turns into a real update.
- Each optimizer `configure_optimizers` returns becomes Horovod's DistributedOptimizer (its own
  parameters only, `accumulate_grad_batches` as its backward passes per step). The allreduces
  start in backward; the strategy waits for them (`synchronize`) right after the step's closure,
  so the precision plugin unscales (16-mixed), clips and steps averaged gradients, and the step
  itself never reduces again (`skip_synchronize` around each step).
- Lightning's collectives (`self.log(sync_dist=True)`, `all_gather`, `broadcast`, `barrier`) and
  torchmetrics' state sync go through Horovod: no torch.distributed process group is started.
- BatchNorm statistics (per rank under Horovod, which reduces gradients only) are averaged before
  validation, checkpoints and the end of training.
- An exception on one rank ends that rank at once, with its traceback and one line naming rank and
  step; the launcher then ends the others (rather than leaving them in their next collective).
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
import warnings

import torch
from lightning.fabric.utilities.rank_zero import rank_zero_only as fabric_rank_zero_only
from lightning.pytorch.strategies import ParallelStrategy, StrategyRegistry
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from lightning_utilities.core.rank_zero import rank_zero_only as utils_rank_zero_only

from hvdtrain.cluster import tuning
from hvdtrain.cluster.env import ClusterEnv
from hvdtrain.config import TrainConfig
from hvdtrain.errors import UsageError, exit_at_once_on_uncaught_exception, in_one_line, report_and_exit
from hvdtrain.lightning.guards import Guards
from hvdtrain.cluster.netsockets import loopback_settings
from hvdtrain.report import say
from hvdtrain.runtime import threads_per_rank
from hvdtrain.torch.backend_horovod import HorovodBackend
from hvdtrain.torch.devices import rank_device
from hvdtrain.torch.horovod_layout import ContiguousCompression, broadcast_tensors
from hvdtrain.torch.internals import layer_sync
from hvdtrain.watchdog import WRITING

PROG = "hvdtrain.lightning"
# torch's LR schedulers warn when the optimizer's step() is not the one they wrapped at their
# creation: Horovod's DistributedOptimizer replaces it on purpose, after configure_optimizers.
warnings.filterwarnings("ignore", message="Seems like `optimizer.step\\(\\)` has been overridden")
COMPRESSIONS = ("none", "fp16")
OPS = ("average", "adasum")


def export_mpi_settings() -> None:
    """hvdtrain's Open MPI settings (hvdtrain/cluster/tuning.py, hvdtrain/cluster/netsockets.py) into this process's
    environment, before anything starts MPI. `Trainer(strategy="horovod")` looks for its cluster
    before it makes the strategy, and under mpirun Lightning's MPIEnvironment starts MPI (mpi4py)
    then; Open MPI reads its settings once, at that start. Without them, CPU ranks' MPI polls
    instead of yielding and takes a core's share from the steps (2 ranks on 2 cores: 20 % slower)."""
    try:
        env = ClusterEnv.from_environ()
    except UsageError:
        return  # said in one line when the strategy starts
    tuning.apply(loopback_settings(env))
    tuning.apply(tuning.horovod_settings("auto", on_cpu=not torch.cuda.is_available()))


class HorovodStrategy(ParallelStrategy):
    """Lightning's Strategy over Horovod. Options (all keyword):

    compression: "none" | "fp16" (gradients sent as float16); op: "average" | "adasum";
    fusion_threshold_mb / cycle_time_ms: Horovod's tensor fusion buffer and cycle
    (HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME); scale_lr: multiply each optimizer's LR by the
    number of ranks as Horovod's examples do (default off: the LR of your `ddp` runs);
    guards: hvdtrain's guards callback (Guards) added unless you pass one, with
    checkpoint_every ("30m", "90s", or steps), watchdog_seconds and divergence_factor."""

    strategy_name = "horovod"

    def __init__(self, accelerator=None, parallel_devices=None, checkpoint_io=None, precision_plugin=None, *,
                 compression: str = "none", op: str = "average", fusion_threshold_mb: float | None = None,
                 cycle_time_ms: float | None = None, scale_lr: bool = False, guards: bool = True,
                 checkpoint_every: str | int | None = None, watchdog_seconds: float | None = None,
                 divergence_factor: float = 1000.0):
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices, cluster_environment=None,
                         checkpoint_io=checkpoint_io, precision_plugin=precision_plugin)
        self.compression, self.op, self.scale_lr = compression, op, scale_lr
        self._num_nodes = 1
        self._root_device: torch.device | None = None  # hvdtrain's device rule, once the accelerator is known
        self.sync_seconds = 0.0  # time spent waiting for the gradients' allreduce (the guards' breakdown)
        self._guards = None  # the trainer's Guards, once set up: their watchdog hears of rank 0's writes
        try:
            # The guards' options checked now, where every rank finds the same problem before any collective.
            self.guard = Guards(checkpoint_every=checkpoint_every, watchdog_seconds=watchdog_seconds,
                                divergence_factor=divergence_factor) if guards else None
            self._start(fusion_threshold_mb, cycle_time_ms, watchdog_seconds)
        except UsageError as err:
            report_and_exit(err, PROG)

    def _start(self, fusion_threshold_mb, cycle_time_ms, watchdog_seconds) -> None:
        if self.compression not in COMPRESSIONS:
            raise UsageError(f"HorovodStrategy(compression={self.compression!r}): one of {', '.join(COMPRESSIONS)}")
        if self.op not in OPS:
            raise UsageError(f"HorovodStrategy(op={self.op!r}): one of {', '.join(OPS)}")
        cfg = TrainConfig(watchdog_seconds=watchdog_seconds, cycle_time_ms=cycle_time_ms,
                          use_adasum=self.op == "adasum", fp16_allreduce=self.compression == "fp16")
        exit_at_once_on_uncaught_exception()
        # Open MPI's settings are in the environment since `import hvdtrain.lightning` (export_mpi_settings).
        threads = threads_per_rank(None, ClusterEnv.from_environ().local_world_size)
        torch.set_num_threads(threads)
        if fusion_threshold_mb is not None:  # asked for by name: wins over an export
            os.environ["HOROVOD_FUSION_THRESHOLD"] = str(int(fusion_threshold_mb * 1024 * 1024))
        self.backend = HorovodBackend(cfg)  # hvd.init() and hvdtrain's checks
        self.hvd = self.backend.hvd
        # Lightning prints on rank 0 only from here on (its own guess reads RANK or SLURM_PROCID).
        rank_zero_only.rank = fabric_rank_zero_only.rank = utils_rank_zero_only.rank = self.global_rank

    @classmethod
    def register(cls) -> None:
        """Make `Trainer(strategy="horovod")` mean this class."""
        if cls.strategy_name not in StrategyRegistry:
            StrategyRegistry.register(cls.strategy_name, cls, description="Horovod data parallelism (hvdtrain)")

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(cls.strategy_name, cls, description="Horovod data parallelism (hvdtrain)")

    # ------------------------------------------------------------------ who and where
    @property
    def global_rank(self) -> int:
        return self.hvd.rank()

    @property
    def local_rank(self) -> int:
        return self.hvd.local_rank()

    @property
    def node_rank(self) -> int:
        return self.hvd.cross_rank()

    @property
    def world_size(self) -> int:
        return self.hvd.size()

    @property
    def num_nodes(self) -> int:
        return self._num_nodes

    @num_nodes.setter
    def num_nodes(self, num_nodes: int) -> None:  # Trainer(num_nodes=), checked in setup_environment
        self._num_nodes = num_nodes

    @property
    def root_device(self) -> torch.device:
        # Asked for at every batch: decided once, when Lightning has set the accelerator's devices.
        if self._root_device is None and self.parallel_devices:
            on_gpu = self.parallel_devices[0].type == "cuda"
            # hvdtrain's rule: one GPU a rank, by local rank, or each task's own under per-task binding.
            self._root_device = rank_device(self.local_rank, self.hvd.local_size()) if on_gpu else torch.device("cpu")
        return self._root_device or torch.device("cpu")

    @property
    def is_distributed(self) -> bool:
        # Lightning asks custom strategies this: True injects the DistributedSampler and makes
        # self.log(sync_dist=True) reduce.
        return True

    @property
    def distributed_sampler_kwargs(self) -> dict:
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    def setup_environment(self) -> None:
        try:
            self._check_layout()
        except UsageError as err:
            report_and_exit(err, PROG)
        if self.root_device.type == "cuda":
            torch.cuda.set_device(self.root_device)
        super().setup_environment()

    def _check_layout(self) -> None:
        """Trainer(devices=, num_nodes=) against the ranks the launcher started, as for `ddp`:
        devices is the processes each node runs (or 1 in each, Lightning 1.x's Horovod form)."""
        devices, per_node, nodes = len(self.parallel_devices or [None]), self.hvd.local_size(), self.hvd.cross_size()
        if devices not in (1, per_node):
            raise UsageError(f"Trainer(devices={devices}) but the launcher started {per_node} process(es) on this "
                             f"node: one process per device (srun --ntasks-per-node={devices}, or devices={per_node})")
        if self.num_nodes not in (1, nodes):
            raise UsageError(f"Trainer(num_nodes={self.num_nodes}) but Horovod's {self.world_size} rank(s) run on "
                             f"{nodes} node(s): launch on {self.num_nodes} nodes, or num_nodes={nodes}")
        environment = self.cluster_environment
        if environment is not None and environment.creates_processes_externally \
                and type(environment).__name__ in ("SLURMEnvironment", "MPIEnvironment") \
                and (environment.global_rank(), environment.world_size()) != (self.global_rank, self.world_size):
            raise UsageError(f"Lightning's {type(environment).__name__} sees rank {environment.global_rank()} of "
                             f"{environment.world_size()}, Horovod rank {self.global_rank} of {self.world_size}: "
                             f"the launcher and Horovod disagree")

    def model_to_device(self) -> None:
        self.model.to(self.root_device)

    # ------------------------------------------------------------------ set-up and the optimizer step
    def setup(self, trainer) -> None:
        super().setup(trainer)  # the model on the device, optimizers made, the precision plugin
        broadcast_tensors(self.hvd, self.lightning_module.state_dict().items(), root_rank=0)  # any layout
        if trainer.state.fn == TrainerFn.FITTING:
            self._refuse_unsupported(trainer)
            self.optimizers = [self._distributed(optimizer, trainer) for optimizer in self.optimizers]
        if self.guard is not None and trainer.state.fn == TrainerFn.FITTING:
            if not any(isinstance(callback, Guards) for callback in trainer.callbacks):
                trainer.callbacks.append(self.guard)
        for callback in trainer.callbacks:
            if isinstance(callback, Guards):
                callback.gradient_wait_seconds = lambda: self.sync_seconds
                self._guards = callback

    def _refuse_unsupported(self, trainer) -> None:
        problem = None
        if layer_sync(self) is not None:
            # Horovod's SyncBatchNorm reduces GPU tensors only, and torch's needs a process group:
            # refused, never silently per rank.
            problem = ("Trainer(sync_batchnorm=True) is not supported: BatchNorm statistics stay per rank and are "
                       "averaged before validation and checkpoints; use strategy='ddp' for synchronised BatchNorm")
        elif self.op == "adasum" and getattr(self.precision_plugin, "scaler", None) is not None:
            # Adasum's optimizer applies the update inside its own reduction, before a GradScaler
            # could unscale the gradients or skip a step that overflowed.
            problem = "op='adasum' with precision='16-mixed': use 'bf16-mixed' or 32-bit, or op='average'"
        elif self.op == "adasum" and trainer.gradient_clip_val:
            problem = "op='adasum' with gradient_clip_val: Adasum combines updates, not gradients; use op='average'"
        if problem:
            report_and_exit(UsageError(f"HorovodStrategy: {problem}"), PROG)

    def _distributed(self, optimizer, trainer):
        """Horovod's DistributedOptimizer over `optimizer` (its parameters, named as in the module)."""
        hvd = self.hvd
        if type(optimizer).__module__.startswith("horovod."):
            return optimizer  # the user's module wrapped it already
        if self.scale_lr:
            for group in optimizer.param_groups:
                group["lr"] *= self.world_size
        mine = {id(p) for group in optimizer.param_groups for p in group["params"]}
        named = [(name, p) for name, p in self.lightning_module.named_parameters() if id(p) in mine]
        passes = trainer.accumulate_grad_batches if self.lightning_module.automatic_optimization else 1
        compression = hvd.Compression.fp16 if self.compression == "fp16" else hvd.Compression.none
        wrapped = hvd.DistributedOptimizer(optimizer, named_parameters=named,
                                           compression=ContiguousCompression(compression),
                                           backward_passes_per_step=passes,
                                           op=hvd.Adasum if self.op == "adasum" else hvd.Average)
        for config in self.lr_scheduler_configs:
            if getattr(config.scheduler, "optimizer", None) is optimizer:
                config.scheduler.optimizer = wrapped  # the same param_groups: the schedule goes on
                if self.scale_lr and hasattr(config.scheduler, "base_lrs"):
                    config.scheduler.base_lrs = [lr * self.world_size for lr in config.scheduler.base_lrs]
        return wrapped

    def optimizer_step(self, optimizer, closure, model=None, **kwargs):
        def closure_then_synchronize():
            result = closure()  # forward, backward: the allreduces start as gradients are ready
            self._synchronize(optimizer)
            return result

        # The closure synchronized: step() must not reduce again (Adasum's step is its reduction).
        # Entered at each step: Horovod's load_state_dict (a resume) resets the setting.
        skip = contextlib.nullcontext() if self.op == "adasum" else optimizer.skip_synchronize()
        with skip:
            return super().optimizer_step(optimizer, closure_then_synchronize, model, **kwargs)

    def _synchronize(self, optimizer) -> None:
        if self.op == "adasum":
            return  # Adasum's step reduces
        start = time.perf_counter()
        optimizer.synchronize()
        self.sync_seconds += time.perf_counter() - start

    # ------------------------------------------------------------------ collectives over Horovod
    def _horovod_op(self, reduce_op):
        name = "mean" if reduce_op is None else str(reduce_op).split(".")[-1].lower()
        ops = {"mean": self.hvd.Average, "avg": self.hvd.Average, "sum": self.hvd.Sum,
               "max": self.hvd.Max, "min": self.hvd.Min}
        if name not in ops:
            raise ValueError(f"HorovodStrategy.reduce: unsupported reduce_op {reduce_op!r} (mean, sum, max, min)")
        return ops[name]

    def reduce(self, tensor, group=None, reduce_op="mean"):
        if not isinstance(tensor, torch.Tensor):
            return tensor
        if group is not None:
            raise ValueError("HorovodStrategy reduces over every rank: group= is not supported")
        op = self._horovod_op(reduce_op)
        if op is self.hvd.Average and not tensor.is_floating_point():
            tensor = tensor.double()
        return self.hvd.allreduce(tensor, op=op)

    def all_gather(self, tensor, group=None, sync_grads=False):
        """(world_size, *shape), as Lightning's DDP gives it; Horovod's allgather carries gradients."""
        if group is not None:
            raise ValueError("HorovodStrategy gathers over every rank: group= is not supported")
        return self.hvd.allgather(tensor.unsqueeze(0))

    def broadcast(self, obj, src: int = 0):
        return self.hvd.broadcast_object(obj, root_rank=src)

    def save_checkpoint(self, checkpoint, filepath, storage_options=None) -> None:
        """Rank 0 writes (Lightning's rule); while it does, the watchdog's SIGTERM grace is held
        off (a large checkpoint on a slow file system), never while a rank waits in a collective."""
        watchdog = self._guards.watchdog if self._guards is not None and self.is_global_zero else None
        if watchdog is not None:
            watchdog.beat(where=WRITING)
        try:
            super().save_checkpoint(checkpoint, filepath, storage_options)
        finally:
            if watchdog is not None:
                watchdog.beat(where="after writing a checkpoint")

    def barrier(self, name: str | None = None) -> None:
        self.hvd.barrier()

    def gather_all_tensors(self, tensor, group=None) -> list:
        """torchmetrics' state sync (`dist_sync_fn`) over Horovod: each rank's tensor, any shape."""
        return [t.to(tensor.device) for t in self.hvd.allgather_object(tensor.detach().cpu())]

    # ------------------------------------------------------------------ one set of BatchNorm statistics
    def lightning_module_state_dict(self) -> dict:
        self.backend.average_buffers(self.lightning_module)  # every rank dumps the checkpoint
        return super().lightning_module_state_dict()

    def on_validation_start(self) -> None:
        self.backend.average_buffers(self.lightning_module)

    def on_test_start(self) -> None:
        self.backend.average_buffers(self.lightning_module)

    def on_train_start(self) -> None:
        self._sync_metrics()

    def on_train_end(self) -> None:
        self.backend.average_buffers(self.lightning_module)

    def _sync_metrics(self) -> None:
        """The module's torchmetrics reduce their state over Horovod (they look for a
        torch.distributed process group otherwise, and would report one rank's share)."""
        if self.world_size == 1:
            return
        try:
            from torchmetrics import Metric
        except ImportError:
            return
        for module in self.lightning_module.modules():
            if isinstance(module, Metric):
                module.dist_sync_fn = self.gather_all_tensors
                module.distributed_available_fn = lambda: True

    # ------------------------------------------------------------------ the end
    def on_exception(self, exception: BaseException) -> None:
        """This rank failed: end it now, with one line naming it, so that the launcher ends the
        others; waiting for them (Lightning's teardown, Horovod's shutdown) could wait forever."""
        if isinstance(exception, UsageError):
            report_and_exit(exception, PROG)  # found alike on every rank (the guards' stops)
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        where = f" at step {trainer.global_step} (epoch {trainer.current_epoch})" if trainer is not None else ""
        if not isinstance(exception, KeyboardInterrupt):
            traceback.print_exception(exception)
        say(f"{PROG}: error [rank {self.global_rank}/{self.world_size}]{where}: {in_one_line(exception)}; "
            f"ending this rank (the launcher ends the others)", sys.stderr)
        sys.stdout.flush()
        os._exit(130 if isinstance(exception, KeyboardInterrupt) else 1)

