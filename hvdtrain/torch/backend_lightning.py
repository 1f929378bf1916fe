"""PyTorch Lightning for the torch trainer, beside Horovod, DDP and Accelerate for comparison
(`python -m hvdtrain.compare --backends ddp,lightning`), written as IDRIS's Jean Zay page does:
a `LightningModule` around the model, `pl.Trainer(strategy="ddp")`, metrics logged with
`sync_dist=True`, and Lightning's own cluster detection (SLURMEnvironment under srun, which wants
`--ntasks-per-node`; MPIEnvironment under mpirun; TorchElasticEnvironment under torchrun).

Lightning owns the loop (`Trainer.fit`); hvdtrain only watches it through a callback that feeds the
same step meter, step seeds and epoch records as the other backends, so the result file is the
same. For a fair comparison the batches are hvdtrain's (each rank its DistributedSampler shard,
`use_distributed_sampler=False`), the optimizer and LR schedule are the trainer's, and the process
group is started before Lightning (hvdtrain's start-up checks need it; Lightning then reuses it).
An optional dependency (`pip install 'hvdtrain[compare]'`).
"""
from __future__ import annotations

import logging
import warnings

import torch

from hvdtrain.errors import UsageError
from hvdtrain.torch.devices import node_devices
from hvdtrain.torch.torch_distributed import TorchDistributedBackend, import_optional


# --amp as Lightning's precision plugins spell it: its own autocast and GradScaler, as its users
# get them (Lightning refuses fp16 AMP on a CPU: bf16 runs there).
LIGHTNING_PRECISION = {"off": "32-true", "fp16": "16-mixed", "bf16": "bf16-mixed"}


def visible_to_lightning(devices: list[torch.device]) -> dict:
    """Trainer(accelerator=, devices=) for the node's ranks' `devices` (hvdtrain.torch.devices.
    node_devices), which also go to its strategy as parallel_devices (entry local_rank is the
    rank's). Lightning's devices=N would mean GPUs 0..N-1 of every task's view, which per-task
    binding fails (each task sees one GPU: "You requested gpu: [0, 1, 2, 3] But your machine only
    has: [0]", Lightning issue 16828): it is told how many GPUs the ranks use of those this
    process sees, and each rank's device through parallel_devices."""
    return {"accelerator": "gpu" if devices[0].type == "cuda" else "cpu", "devices": len(set(devices))}


class LightningBackend(TorchDistributedBackend):
    name = "lightning"
    owns_loop = True  # Lightning's Trainer.fit runs the epochs (fit below)

    def __init__(self, cfg):
        self.pl = import_optional("lightning.pytorch", "lightning", "PyTorch Lightning")
        from lightning.fabric.utilities.exceptions import MisconfigurationException
        from lightning.pytorch.strategies import DDPStrategy

        # Lightning's start-up banner ("GPU available: ...") and its advice about DataLoader
        # workers are about its own defaults, not this run: keep the trainer's log readable.
        logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
        warnings.filterwarnings("ignore", module="lightning")
        # Started before Lightning: hvdtrain's start-up checks need it; Lightning reuses it.
        env = self._start_process_group()
        devices = node_devices(env.local_world_size)  # the trainer's decision (hvdtrain.cluster.env.gpu_for_rank)
        gpu = devices[0].type == "cuda"
        hook = None
        if cfg.fp16_allreduce:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            hook = default_hooks.fp16_compress_hook
        try:
            # Lightning picks the cluster environment itself, as its users' scripts let it.
            self.trainer = self.pl.Trainer(
                **visible_to_lightning(devices), num_nodes=max(1, env.world_size // env.local_world_size),
                strategy=DDPStrategy(parallel_devices=devices, process_group_backend="nccl" if gpu else "gloo",
                                     ddp_comm_hook=hook),
                max_epochs=cfg.epochs, max_steps=cfg.steps or -1,
                precision=LIGHTNING_PRECISION[cfg.amp],
                use_distributed_sampler=False, reload_dataloaders_every_n_epochs=1,
                limit_val_batches=1.0 if cfg.validates else 0, num_sanity_val_steps=0,
                logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        except (RuntimeError, ValueError, MisconfigurationException) as err:
            # Its SLURM checks (srun -n without --ntasks-per-node), fp16 AMP on a CPU
            # Found alike on every rank, after the process group started: start_process_group ends
            # with a collective, so no rank leaves while a peer is still joining the group.
            raise UsageError(f"PyTorch Lightning refuses this launch: {err}") from None
        self.environment = type(self.trainer.strategy.cluster_environment).__name__
        self.threads_in_loop = None

    def wrap_model(self, model, device):
        return model  # Lightning wraps it in DistributedDataParallel when fit starts

    def wrap_optimizer(self, optimizer, model, cfg):
        return optimizer

    def broadcast_state(self, model, optimizer, optimizer_state: bool):
        pass  # DDP broadcasts rank 0's weights when Lightning wraps the model; no resume (refused)

    def fit(self, trainer):
        """Run `trainer` (hvdtrain.torch.train.Trainer) through Lightning's loop; its result."""
        from hvdtrain.torch.lightning_module import TrainerModule, WatchTrainer

        watch = WatchTrainer(trainer, self)
        self.trainer.callbacks.append(watch)
        self.trainer.fit(TrainerModule(trainer))
        return trainer.finish(watch.stopped_by)

    def describe(self) -> dict:
        return {"backend": self.name, "lightning": self.pl.__version__, "cluster_environment": self.environment,
                "strategy": type(self.trainer.strategy).__name__, "threads_in_loop": self.threads_in_loop,
                "process_group": self.dist.get_backend() if self.dist.is_initialized() else None}
