"""Horovod data-parallel training of torchvision models on CPUs or GPUs.

    srun python -m hvdtrain.torch --model resnet50 --dataset synthetic --image-size 64 --steps 20
    mpirun -np 2 python -m hvdtrain.torch --model mnist_cnn --dataset digits --epochs 8
    horovodrun -np 2 -H localhost:2 --gloo python -m hvdtrain.torch --model resnet18 --steps 10

Every rank runs this file; rank 0 alone logs, writes checkpoints and the result file. The
backend (Horovod, or DDP for comparison) is chosen once in `Trainer.__init__`.
"""
from __future__ import annotations

import os
import random
import sys
import time

import torch
import torch.nn.functional as F

from hvdtrain import checkpoint as ckpt
from hvdtrain.cluster import ClusterEnv
from hvdtrain.config import TrainConfig, build_parser, config_from_args
from hvdtrain.datasets import check_imagefolder
from hvdtrain.errors import UsageError, report_and_exit
from hvdtrain.report import Rank0Reporter
from hvdtrain.schedule import lr_factor
from hvdtrain.runtime import StopRequest, threads_per_rank
from hvdtrain.torch import data
from hvdtrain.trainer import EpochTrainer, stop_reason, stop_votes
from hvdtrain.torch.backends import make_backend
from hvdtrain.torch.models import CHANNELS_LAST_MODELS, MODELS, build_model, check_model_name

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

    def __init__(self, cfg: TrainConfig):
        env = ClusterEnv.from_environ()
        self.threads = threads_per_rank(cfg.threads_per_rank, env.local_world_size)
        torch.set_num_threads(self.threads)
        self.backend = b = make_backend(cfg, self.threads)
        self.cfg = cfg = cfg.with_world_size(b.world_size)
        self.rank, self.world_size = b.rank, b.world_size
        self.is_rank0 = b.rank == 0
        self.reporter = Rank0Reporter(self.is_rank0, None, PROG)
        self.stop = StopRequest()
        self.device = self._pick_device(b.local_rank)
        if cfg.amp and self.device.type != "cuda":
            raise UsageError("--amp needs a CUDA GPU; this rank has none")

        self.train_ds, self.val_ds, in_channels, self.num_classes, image_size = data.build_datasets(cfg)
        self._plan_steps(len(self.train_ds), len(self.val_ds))

        torch.manual_seed(cfg.seed)
        model = build_model(cfg.model, in_channels, self.num_classes, image_size).to(self.device)
        self.channels_last = self.device.type == "cuda" and cfg.model in CHANNELS_LAST_MODELS
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.raw_model = model

        self.epoch, self.step_in_epoch, self.global_step, self.history = 0, 0, 0, []
        self._steps_run = 0  # steps this process ran: the first cfg.warmup_steps are not timed
        self._saved = None  # rank 0, after a resume: the checkpoint's state
        resumed_from = self._restore_on_rank0(lambda path: self._load(path, model))
        saved, self._saved = self._saved, None
        self.model = b.wrap_model(model, self.device)
        # The optimizer state is loaded into the wrapped optimizer: Horovod's DistributedOptimizer
        # is a new optimizer object and would drop the state of the one it wraps.
        self.optimizer = b.wrap_optimizer(make_optimizer(cfg, model.parameters()), self.model, cfg)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_factor(cfg, self.steps_per_epoch, self.schedule_steps))
        self.scaler = torch.amp.GradScaler("cuda") if cfg.amp else None
        if saved is not None:
            self.optimizer.load_state_dict(saved["optimizer"])
            self.scheduler.load_state_dict(saved["scheduler"])
            if self.scaler is not None and saved.get("scaler"):
                self.scaler.load_state_dict(saved["scaler"])
        b.broadcast_state(model, self.optimizer, optimizer_state=resumed_from is not None)
        if resumed_from is not None:
            self.scheduler.load_state_dict(b.broadcast_object(self.scheduler.state_dict(), "scheduler"))
        if cfg.log_dir and self.is_rank0:
            self.reporter = Rank0Reporter(True, cfg.log_dir, PROG)
        self.device_name = str(self.device)
        self._log_start(env, resumed_from)

    # ------------------------------------------------------------------ set-up helpers
    def _pick_device(self, local_rank: int) -> torch.device:
        if torch.cuda.is_available():
            # One GPU per rank: ranks of a node take GPUs 0..local_size-1.
            device = torch.device("cuda", local_rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
            return device
        return torch.device("cpu")

    def _checkpoint_config(self) -> dict:
        return {**self.cfg.to_dict(), "num_classes": self.num_classes}

    def _load(self, path: str, model):
        """Rank 0: the checkpoint's model state now (before DDP wraps the model: DDP broadcasts
        rank 0's weights); the rest is kept for the optimizer once wrapped. Returns its position."""
        state = torch.load(path, map_location="cpu", weights_only=True)
        ckpt.check_compatible(path, {**state["config"], "format_version": state["format_version"]},
                              self._checkpoint_config())
        model.load_state_dict(state["model"])
        # A trial load: the optimizer state must fit now, while a failure still reaches every rank.
        make_optimizer(self.cfg, model.parameters()).load_state_dict(state["optimizer"])
        self._saved = state
        return state["epoch"], state["step_in_epoch"], state["global_step"], state["history"]

    # ------------------------------------------------------------------ the loop
    def _param_arrays(self):
        return [p.detach().cpu().double().numpy() for p in self.raw_model.parameters()]

    def _train_epoch(self):
        cfg, b = self.cfg, self.backend
        k = cfg.batches_per_allreduce
        loader = data.train_loader(self.train_ds, cfg, self.rank, self.world_size, self.epoch, self.step_in_epoch)
        self.model.train()
        window = torch.zeros(3, dtype=torch.float64)      # loss sum, correct, count since last reduce
        totals = torch.zeros(3, dtype=torch.float64)
        stopped_by = None
        timing, timed_steps = False, 0
        steps_left = min(self.steps_per_epoch - self.step_in_epoch, self.total_steps - self.global_step)
        bar = self.reporter.progress(steps_left, f"epoch {self.epoch + 1}/{cfg.epochs}")
        for i, (x, y) in enumerate(loader):
            if i == steps_left:
                break
            if not timing and self._steps_run >= cfg.warmup_steps:
                b.barrier()  # every rank starts the clock together: no rank-0-only timing
                timing, t0 = True, time.perf_counter()
            torch.manual_seed(step_seed(cfg.seed, self.global_step, self.rank))
            x = x.to(self.device, non_blocking=True)
            y = y.to(self.device, non_blocking=True)
            if self.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            self.optimizer.zero_grad()  # Horovod's wrapper takes no set_to_none (torch defaults to True)
            for j, (xc, yc) in enumerate(zip(x.chunk(k), y.chunk(k))):
                with b.no_sync(self.model, self.optimizer, j == k - 1), \
                        torch.autocast(self.device.type, enabled=cfg.amp):
                    out = self.model(xc)
                    loss = F.cross_entropy(out, yc)
                # Each micro-batch's loss weighs its share of the step's batch: the accumulated
                # gradient is that of the whole batch.
                scaled = loss * (len(yc) / len(y))
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
                window += torch.tensor([loss.item() * len(yc), (out.argmax(1) == yc).sum().item(), len(yc)],
                                       dtype=torch.float64)
            b.step(self.optimizer, self.scaler)
            self.scheduler.step()
            self.global_step += 1
            self.step_in_epoch += 1
            self._steps_run += 1
            timed_steps += timing
            bar.update(1)
            last = i == steps_left - 1
            if self.global_step % cfg.log_interval == 0 or last:
                reduced, stop = self._reduce_window(window)
                totals += reduced
                window.zero_()
                interval_loss = reduced[0].item() / max(1.0, reduced[2].item())
                self.loss_log.append([self.global_step, interval_loss])
                self.reporter.scalars(self.global_step, {"train/loss": interval_loss,
                                                         "train/lr": self.scheduler.get_last_lr()[0]})
                bar.set_postfix(loss=f"{interval_loss:.4f}")
                if stop:
                    stopped_by = stop
                    break
        bar.close()
        if timing:
            b.barrier()
            self.timed_seconds += time.perf_counter() - t0
            self.timed_samples += timed_steps * cfg.batch_size * k
        count = max(1.0, totals[2].item())
        return {"train_loss": totals[0].item() / count, "train_acc": totals[1].item() / count}, stopped_by

    def _reduce_window(self, window):
        # One allreduce for the metrics and the stop votes: every rank stops at the same step and
        # knows which signal stopped it.
        votes = torch.tensor(stop_votes(self.stop.signal_name), dtype=torch.float64)
        out = self.backend.allreduce_sum(torch.cat([window, votes]))
        return out[:3], stop_reason(out[3].item(), out[4].item())

    @torch.no_grad()
    def _validate(self) -> dict:
        self.backend.average_buffers(self.raw_model)  # one set of BatchNorm statistics
        self.model.eval()
        sums = torch.zeros(3, dtype=torch.float64)
        for x, y in data.val_loader(self.val_ds, self.cfg, self.rank, self.world_size):
            x, y = x.to(self.device), y.to(self.device)
            if self.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            with torch.autocast(self.device.type, enabled=self.cfg.amp):
                out = self.model(x)
            sums += torch.tensor([F.cross_entropy(out.float(), y, reduction="sum").item(),
                                  (out.argmax(1) == y).sum().item(), len(y)], dtype=torch.float64)
        total = self.backend.allreduce_sum(sums)
        count = int(total[2].item())
        return {"val_loss": total[0].item() / count, "val_acc": total[1].item() / count, "val_count": count}

    # ------------------------------------------------------------------ checkpoints and results
    def _save_checkpoint(self):
        if not self.cfg.checkpoint_dir or not self.is_rank0:
            return
        state = {
            "format_version": ckpt.FORMAT_VERSION,
            "config": self._checkpoint_config(),
            "model": self.raw_model.state_dict(),        # unwrapped: no "module." prefix
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler else None,
            "epoch": self.epoch, "step_in_epoch": self.step_in_epoch, "global_step": self.global_step,
            "history": self.history,
            "rng": {"torch": torch.get_rng_state(), "python": list(random.getstate()[1])},
        }
        path = os.path.join(self.cfg.checkpoint_dir, ckpt.checkpoint_name(self.global_step, self.epoch, "pt"))
        ckpt.atomic_write(path, lambda f: torch.save(state, f))
        ckpt.prune(self.cfg.checkpoint_dir, self.cfg.keep_checkpoints)
        self.reporter.info(f"checkpoint {path}")


def main(argv=None) -> None:
    parser = build_parser("torch", list(MODELS), f"python -m {PROG}")
    args = parser.parse_args(argv)
    try:
        cfg = config_from_args("torch", args)
        check_model_name(cfg.model)
        if cfg.dataset == "imagefolder":
            check_imagefolder(cfg.data_dir)
        Trainer(cfg).train()
    except UsageError as err:
        report_and_exit(err, PROG)
    sys.stdout.flush()
