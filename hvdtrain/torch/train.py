"""Horovod data-parallel training of torchvision models on CPUs or GPUs.

    srun python -m hvdtrain.torch --model resnet50 --dataset synthetic --image-size 64 --steps 20
    mpirun -np 2 python -m hvdtrain.torch --model mnist_cnn --dataset digits --epochs 8
    horovodrun -np 2 -H localhost:2 --gloo python -m hvdtrain.torch --model resnet18 --steps 10

Every rank runs this file; rank 0 alone logs, writes checkpoints and the result file. The
backend (Horovod; DDP, Accelerate or Lightning for comparison) is started once, by
`EpochTrainer.__init__` (hvdtrain/trainer.py), which then asks this trainer for the parts.
"""
from __future__ import annotations

import dataclasses
import random
import warnings

import torch
import torch.nn.functional as F

from hvdtrain import checkpoint as ckpt
from hvdtrain import cli
from hvdtrain.config import TrainConfig
from hvdtrain.errors import UsageError
from hvdtrain.phases import PhaseClock
from hvdtrain.runtime import feeder_thread_pays, rank_cores
from hvdtrain.schedule import lr_factor
from hvdtrain.torch import checkpoint_file, compiled, compute_mode, dali, images, internals, loader
from hvdtrain.torch.feeder import DeviceFeeder
from hvdtrain.torch.checkpoint_writer import ProcessWrites
from hvdtrain.trainer import EpochTrainer
from hvdtrain.torch.models import MODELS
from hvdtrain.torch.workload import TorchWorkload, from_config
from hvdtrain.torch.cuda_phases import CudaPhaseClock
from hvdtrain.torch.devices import rank_device

PROG = "hvdtrain.torch"


def make_optimizer(cfg: TrainConfig, params):
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def step_seed(seed: int, global_step: int, rank: int) -> int:
    """Seed for the random ops (dropout, augmentation) of one step on one rank: a function of the
    step, not of history, so that a resumed run draws what an uninterrupted one would have."""
    return (seed * 1_000_003 + global_step * 7919 + rank) % (2**63)


class Trainer(EpochTrainer):
    framework = "torch"
    prog = PROG

    background_writes = ProcessWrites  # interval checkpoints: staged, then written by another process

    def __init__(self, cfg: TrainConfig, workload: TorchWorkload):
        self.workload = workload  # what to train (hvdtrain/torch/workload.py): built-in or the user's
        self.loss_fn = workload.loss or F.cross_entropy
        self.reports_accuracy = workload.loss is None
        super().__init__(cfg)

    def train(self) -> dict:
        # A backend that owns its loop (Lightning's Trainer.fit) runs it, fed by this trainer.
        return self.backend.fit(self) if self.backend.owns_loop else super().train()

    def _set_threads(self, threads: int) -> None:
        torch.set_num_threads(threads)

    def _current_lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]  # what the optimizer steps with, not the scheduler's view

    # ------------------------------------------------------------------ the start (EpochTrainer.__init__)
    def _setup_device(self) -> str:
        b = self.backend
        self.device = rank_device(b.local_rank, b.local_world_size)  # hvdtrain/torch/devices.py
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        compute_mode.deterministic_kernels(self.cfg.deterministic)
        self.cuda_math = compute_mode.cuda_math(self.device, self.cfg.deterministic)
        return str(self.device)

    def _build_data(self) -> tuple[int, int]:
        self.val_batches = None  # the validation loader, once _validate builds it
        cfg, b = self.cfg, self.backend
        self.train_ds, self.val_ds = self.workload.train_data, self.workload.val_data
        self.num_classes = self.workload.num_classes
        self.sample_unit = self.workload.sample_unit
        # How the batches are made, decided once (hvdtrain/torch/loader.py). The feeder's thread
        # only where it pays: a GPU, or a core left beside the compute threads and decode workers.
        feeder = (cfg.feeder == "on" and b.loaders_read_ahead
                  and feeder_thread_pays(self.device.type != "cpu", rank_cores(self.env.local_world_size),
                                         self.threads, cfg.num_workers))
        self.loader_plans = {split: loader.plan_loader(cfg, dataset, split, self.device, sharding=b.loader_sharding,
                                                       feeder=feeder)
                             for split, dataset in (("train", self.train_ds), ("val", self.val_ds)) if dataset is not None}
        if cfg.loader == "dali":  # installed, and image files to decode: said before any step
            dali.require()
            dali.EncodedImages(self.train_ds)
        return len(self.train_ds), len(self.val_ds) if self.val_ds is not None else 0

    def _build_model(self) -> None:
        cfg = self.cfg
        torch.manual_seed(cfg.seed)
        model = self.workload.build_model().to(self.device)
        self.channels_last = compute_mode.channels_last(cfg.channels_last, cfg.model, self.device, cfg.use_adasum)
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.raw_model = model  # unwrapped: what checkpoints and checksums hold

    def _checkpoint_config(self) -> dict:
        return {**self.cfg.to_dict(), "num_classes": self.num_classes}

    def _load_checkpoint(self, path: str):
        """Rank 0: the checkpoint's model state now (before DDP wraps the model: DDP broadcasts
        rank 0's weights). Returns its position, and the state (for the optimizer, once wrapped)."""
        distrust = ckpt.trust_problem(path, torch.__version__, self.cfg.trust_checkpoints)
        if distrust:
            raise UsageError(distrust)
        state = torch.load(path, map_location="cpu", weights_only=True)
        ckpt.check_compatible(path, {**state["config"], "format_version": state["format_version"]},
                              self._checkpoint_config())
        self.raw_model.load_state_dict(state["model"])
        # A trial load: the optimizer state must fit now, while a failure still reaches every rank.
        make_optimizer(self.cfg, self.raw_model.parameters()).load_state_dict(state["optimizer"])
        return state["config"], ckpt.Position.from_checkpoint(state), state

    def _wrap_and_broadcast(self, saved, resumed: bool) -> None:
        cfg, b, model = self.cfg, self.backend, self.raw_model
        self.model = b.wrap_model(model, self.device)
        # Compiled in place, after the backend's wrapper: the whole model through it (DDP's
        # compiled path), regions inside it (hvdtrain/torch/compiled.py); the keys stay the eager ones.
        names = compiled.compile_model(self.model if cfg.compile == "model" else model, cfg.compile,
                                       cfg.compile_backend)
        self.compiled_line = compiled.describe(cfg.compile, cfg.compile_backend, names, cfg.backend)
        # The optimizer state is loaded into the wrapped optimizer: Horovod's DistributedOptimizer
        # is a new optimizer object and would drop the state of the one it wraps.
        self.optimizer = b.wrap_optimizer(make_optimizer(cfg, model.parameters()), self.model, cfg)
        self.scaler = compute_mode.grad_scaler(cfg.amp, self.device)
        if self.scaler is not None:
            # GradScaler skips the optimizer step of a step whose gradients overflowed (the first
            # ones, while it finds its scale), and torch then warns that the LR schedule stepped
            # without it: expected, and the schedule is a function of the step anyway.
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
        if saved is not None:
            self.optimizer.load_state_dict(saved["optimizer"])
        # Not the checkpoint's scheduler: it (and the optimizer's initial_lr) carries the LR of
        # the run that wrote it, which another --base-lr or global batch (--allow-resize) would
        # silently keep. The LR is a function of the step and this run's config, so every rank
        # builds the same scheduler at the step training starts from: nothing to broadcast.
        for group in self.optimizer.param_groups:
            group["initial_lr"] = cfg.lr
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_factor(cfg, self.plan.steps_per_epoch, self.plan.schedule_steps),
            last_epoch=self.position.global_step - 1)
        b.broadcast_state(model, self.optimizer, optimizer_state=resumed)
        if self.scaler is not None and resumed:
            # Every rank's loss scale, not rank 0's alone: the gradients are averaged scaled, and
            # a rank unscaling by another scale (a fresh 65536) would apply another update.
            scaler_state = saved.get("scaler") if saved is not None else None
            scaler_state = b.broadcast_object(scaler_state, "scaler_state")
            if scaler_state:
                self.scaler.load_state_dict(scaler_state)

    def prepare_inputs(self, x):
        """A batch's inputs, on the device, as the model takes them: uint8 images normalised,
        channels-last where chosen. Run by the feeder on its side stream, and by Lightning's steps."""
        return images.to_model_input(x, self.loader_plans["train"].normalization, self.channels_last)

    def _start_lines(self) -> list[str]:
        return [*(plan.describe() for split, plan in self.loader_plans.items() if split == "train" or self.cfg.validates),
                *([self.compiled_line] if self.cfg.compile != "off" else [])]

    def _batches(self, split: str, **where):
        """`split`'s batches on the device (its plan's loader, the library's copy where the backend
        shards them itself), the next ones prepared during the current step (hvdtrain/torch/feeder.py)."""
        plan = self.loader_plans[split]
        made = loader.create_loader(plan, self.train_ds if split == "train" else self.val_ds, self.rank,
                                    self.world_size, **where)
        return DeviceFeeder(self.backend.adopt_loader(made), self.device, self.prepare_inputs,
                            threaded=plan.feeder_thread)

    def _data_remedy(self) -> str:
        return (f"each rank has {self.threads} core(s) and {self.cfg.num_workers} decode worker(s) (--num-workers): "
                "give each rank more cores (--cpus-per-task; the workers follow), read image files from shards "
                "(python -m hvdtrain.shards; docs/data.md)")

    def _phase_clock(self):
        if self.backend.owns_loop:
            return None  # Lightning runs the step: its phases are not ours to mark
        return CudaPhaseClock(self.device) if self.device.type == "cuda" else PhaseClock()

    # ------------------------------------------------------------------ the loop
    def _state_arrays(self):
        state = (*self.raw_model.parameters(), *self.raw_model.buffers())
        return [t.detach().cpu().double().numpy() for t in state]

    def _stats_to_host(self, stats):
        return stats.cpu().numpy() if torch.is_tensor(stats) else super()._stats_to_host(stats)

    def finish(self, stopped_by):
        try:
            return super().finish(stopped_by)
        finally:
            loader.close_loaders()  # the workers kept across epochs (hvdtrain/torch/loader.py)
            self.writer.close()

    def _rank_extras(self) -> dict:
        # Each rank's AMP loss scale: equal on every rank, or the ranks apply different updates.
        return {"grad_scale": self.scaler.get_scale() if self.scaler else None,
                "channels_last": self.channels_last}

    def _result_extras(self) -> dict:
        train = self.loader_plans["train"]
        return {"cuda_math": self.cuda_math, "feeder_thread": train.feeder_thread,
                "images_normalised_in": "the step's process" if train.normalised_in == "device" else train.normalised_in,
                "crops": images.crops_check(self.train_ds, self.cfg.seed),  # the comparison's check
                # What a step allreduces (hvdtrain.predict's exchange): the trainable parameters' bytes.
                "gradient_bytes": sum(p.numel() * p.element_size() for p in self.raw_model.parameters()
                                      if p.requires_grad)}

    def _average_statistics(self) -> None:
        self.backend.average_buffers(self.raw_model)

    def _train_epoch(self):
        cfg, b, meter = self.cfg, self.backend, self.meter
        k = cfg.batches_per_allreduce
        at = self.position
        batches = self._batches("train", epoch=at.epoch, skip_batches=at.steps_into_order, seen_before=at.seen_before)
        self.model.train()
        steps = self.start_epoch()
        for i, (x, y) in enumerate(batches):
            if i == steps:
                break
            self.before_step()
            torch.manual_seed(step_seed(cfg.seed, self.position.global_step, self.rank))
            meter.phase("data")
            # Loss sum, correct, count of this step, kept on the device: the meter reads them at
            # log intervals only, so that no step waits for the GPU to copy a number back.
            stats = torch.zeros(3, dtype=torch.float64, device=self.device)
            for j, (xc, yc) in enumerate(zip(x.chunk(k), y.chunk(k))):
                with b.no_sync(self.model, self.optimizer, j == k - 1), \
                        compute_mode.autocast(cfg.amp, self.device):
                    out = self.model(xc)
                    loss = self._loss(out, yc)
                if j == 0:
                    # The last step's gradients are freed here, after the forward pass, as
                    # Lightning does, not before it: backward can then reuse their memory, and
                    # the comparison with Lightning runs the same step order
                    # (benchmarks/grad_free_order.py: 0.5-6.5 % per step on one CPU thread,
                    # within the noise of a shared 2-core machine). Horovod's wrapper takes no set_to_none
                    # (torch defaults to True).
                    self.optimizer.zero_grad()
                # Each micro-batch's loss weighs its share of the step's batch: the accumulated
                # gradient is that of the whole batch.
                scaled = loss * (len(yc) / len(y))
                scaled = self.scaler.scale(scaled) if self.scaler else scaled
                self._mark_compute_when_gradients_are_done(scaled)
                b.backward(scaled)
                meter.phase("sync")  # DDP: waiting for its last buckets' allreduce, inside backward()
                correct = (out.argmax(1) == yc).sum().double() if self.reports_accuracy else stats.new_zeros(())
                # In place, from Python numbers: new_tensor(len(yc)) was a blocking copy from host
                # memory, a wait for the GPU at every micro-batch.
                stats[0] += loss.detach().double() * len(yc)
                stats[1] += correct
                stats[2] += len(yc)
            b.finish_gradients(self.optimizer)  # Horovod: wait for the allreduces backward started
            meter.phase("sync")
            b.step(self.optimizer, self.scaler)
            self.scheduler.step()
            meter.phase("optimizer")
            if self.step_done(stats):
                break
        return self.epoch_steps_done()

    def _loss(self, outputs, targets):
        loss = self.loss_fn(outputs, targets)
        if not (torch.is_tensor(loss) and loss.ndim == 0):
            what = f"a tensor of shape {tuple(loss.shape)}" if torch.is_tensor(loss) else f"a {type(loss).__name__}"
            raise UsageError(f"--loss {self.cfg.loss} returned {what}, not a scalar tensor (reduce it, e.g. .mean())")
        return loss

    def _sample_losses(self, outputs, targets):
        """Each validation sample's loss, summed and counted exactly over the ranks' shards
        (Accelerate gathers them and drops its padding): the user's loss is called per sample."""
        outputs = outputs.float()
        if self.workload.loss is None:
            return F.cross_entropy(outputs, targets, reduction="none")
        return torch.stack([self._loss(outputs[i:i + 1], targets[i:i + 1]) for i in range(len(targets))])

    def _mark_compute_when_gradients_are_done(self, loss) -> None:
        """Mark the end of compute when autograd has computed the last gradient, which is before
        backward() returns: DDP waits there for its buckets' allreduce (in a callback autograd runs
        at the end of backward, queued after this one), and that wait is sync, not compute."""
        if not self.meter.phases.running:
            return
        # The loss's own hook runs first in backward, where a callback may be queued.
        loss.register_hook(lambda grad: internals.at_end_of_backward(lambda: self.meter.phase("compute")))

    @torch.no_grad()
    def _validate(self) -> dict:
        self._average_statistics()  # one set of BatchNorm statistics
        self.model.eval()
        b = self.backend
        sums = torch.zeros(3, dtype=torch.float64, device=self.device)  # read once, at the end
        self.watchdog.beat(where="validating")  # a rank stuck on its first batch says so too
        # By default an exact shard per rank, the sums reduced once; Accelerate's way: its own
        # sharded loader, every rank gathering every sample's figures (gather_for_metrics).
        if self.val_batches is None:  # the same batches at every pass: built once
            self.val_batches = self._batches("val")
        for x, y in self.val_batches:
            self.watchdog.beat(where="validating")
            with compute_mode.autocast(self.cfg.amp, self.device):
                out = self.model(x)
            correct = out.argmax(1) == y if self.reports_accuracy else torch.zeros_like(y, dtype=torch.bool)
            losses, correct = b.gather_for_metrics((self._sample_losses(out, y), correct))
            sums += torch.stack((losses.double().sum(), correct.double().sum(), sums.new_tensor(len(losses))))
        total = b.validation_totals(sums.cpu().numpy())
        count = int(total[2])
        return {"val_loss": float(total[0]) / count, "val_acc": float(total[1]) / count if self.reports_accuracy else None,
                "val_count": count}

    # ------------------------------------------------------------------ checkpoints and results
    def _checkpoint_file(self):
        at = self.position
        return checkpoint_file.capture(  # the model unwrapped: no "module." prefix
            self.cfg.checkpoint_dir, at, self.raw_model, self.optimizer,
            samples_in_epoch=at.step_in_epoch * self.cfg.global_batch_size, config=self._checkpoint_config(),
            scheduler=self.scheduler.state_dict(), scaler=self.scaler.state_dict() if self.scaler else None,
            rng={"torch": torch.get_rng_state(), "python": list(random.getstate()[1])})


def prepared(cfg: TrainConfig, workload: TorchWorkload) -> TrainConfig:
    """cfg for this workload: no validation pass when it has no validation set."""
    if workload.val_data is None:
        if cfg.validation == "on":
            raise UsageError(f"--validation on, but --dataset {cfg.dataset} has no validation set")
        cfg = dataclasses.replace(cfg, validation="off")
    return cfg


def run(cfg: TrainConfig, workload: TorchWorkload | None = None) -> dict:
    """Train cfg's workload (or `workload`, fit's): the result."""
    workload = workload or from_config(cfg)
    return Trainer(prepared(cfg, workload), workload).train()


def main(argv=None) -> None:
    cli.main("torch", MODELS, lambda cfg: run(cfg), argv)
