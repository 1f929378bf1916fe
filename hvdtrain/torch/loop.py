"""Horovod for your own torch training loop: a few calls, each one line of a single-GPU script.

    run = hvdtrain.torch.loop.start(seed=0, checkpoint_every="30m")  # hvd.init(), device, guards
    model, optimizer = run.prepare(model, optimizer)          # to the device, LR x ranks, rank 0's weights
    start_epoch = run.resume("ckpt", model, optimizer)        # the newest checkpoint's epoch, or 0
    for epoch in range(start_epoch, epochs):
        for x, y in run.loader(train_set, batch_size, epoch):  # this rank's shard (batch_size per rank)
            ...; optimizer.step(); run.step_done()             # step_done: the watchdog's heartbeat
            if run.should_stop(): break                        # a stop signal on any rank: all stop here
        run.save("ckpt", model, optimizer)                     # rank 0 writes where the loop is (mid-epoch too)
        if run.stopped_by: break
    run.finish()                                               # mpirun -np 2 / srun --mpi=pmix -n 2 python train.py

Horovod only (torchrun users have torch.distributed). Every call but `log` runs on every rank at the
same points; bad input ends every rank with one line, exit 2. Example: torch_examples/own_loop.py.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from hvdtrain import checkpoint as ckpt
from hvdtrain.config import TrainConfig
from hvdtrain.errors import UsageError, exit_at_once_on_uncaught_exception, exits_on_usage_error, in_one_line
from hvdtrain.lifecycle import LoopLifecycle, start_rank
from hvdtrain.report import say
from hvdtrain.runtime import decode_workers
from hvdtrain.torch import checkpoint_file, images, loader
from hvdtrain.torch.backend_horovod import HorovodBackend
from hvdtrain.torch.checkpoint_writer import ProcessWrites
from hvdtrain.torch.devices import rank_device
from hvdtrain.torch.feeder import DeviceFeeder

PROG = "hvdtrain.torch.loop"




@exits_on_usage_error(PROG)
def start(seed: int = 0, *, watchdog_seconds: float | None = None, threads: int | None = None,
          checkpoint_every: str | int | None = None) -> "Run":
    """hvd.init() with hvdtrain's settings, device, threads, stop signals, watchdog (armed first).
    checkpoint_every: 2000 (steps) or '30m' (rank 0's clock): should_stop() then also writes a
    checkpoint in the middle of the epoch, into run.resume()'s directory."""
    every = None if checkpoint_every is None else str(checkpoint_every)
    # (Checked with a stand-in directory: run.resume() names the real one.)
    cfg = TrainConfig(seed=seed, watchdog_seconds=watchdog_seconds, threads_per_rank=threads, checkpoint_every=every,
                      checkpoint_dir="run.resume's" if every else None)
    exit_at_once_on_uncaught_exception()
    started = start_rank(cfg, PROG, torch.set_num_threads, HorovodBackend)  # hvdtrain/lifecycle.py
    backend = started.backend
    device = rank_device(backend.local_rank, backend.local_world_size)  # refuses ranks sharing a GPU
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(seed)
    cfg = dataclasses.replace(cfg, num_workers=decode_workers(started.threads))  # loader()'s default
    return Run(backend, cfg, device, started.watchdog, started.env.job_id)


class _SeededSteps:
    """The training batches, torch's generator seeded before each one by (seed, step, rank), as
    the trainer seeds its steps: the random ops of your step (dropout) are a function of the step,
    so a resumed run draws what an uninterrupted one would have."""

    def __init__(self, run: "Run", batches):
        self.run, self.batches = run, batches

    def __len__(self):
        return len(self.batches)

    @property
    def dataset(self):  # your dataset, as a DataLoader's .dataset
        return self.batches.dataset

    @property
    def batch_size(self):  # per rank
        return self.batches.batch_size

    def __iter__(self):
        from hvdtrain.torch.train import step_seed

        run = self.run
        for batch in self.batches:
            torch.manual_seed(step_seed(run.cfg.seed, run.position.global_step, run.rank))
            yield batch


class Run(LoopLifecycle):
    """One rank's part of the job: rank, local_rank, world_size, device, is_rank0, stopped_by. Its
    stop vote, checkpoints, requeue and end are hvdtrain/lifecycle.py's."""

    background_writes = ProcessWrites  # interval checkpoints: staged, then written by another process

    def __init__(self, backend, cfg: TrainConfig, device: torch.device, watchdog, job_id: str | None = None):
        super().__init__(backend, cfg, job_id, watchdog)
        self.device = device
        self._prepared: list = []  # the optimizers prepare() wrapped

    def log(self, line: str, every_rank: bool = False) -> None:  # rank 0 (or each) prints; no collective
        if self.is_rank0 or every_rank:
            say(line)

    def prepare(self, model, optimizer, *, scale_lr: bool = True):
        """(model on the device, Horovod's optimizer, LR x world size), rank 0's weights. Schedulers after."""
        model.to(self.device)  # in place: the optimizer keeps its parameters
        for group in optimizer.param_groups if scale_lr else ():
            group["lr"] *= self.world_size
        # A new optimizer: gradients averaged in backward (contiguous copies for channels-last).
        optimizer = self.backend.wrap_optimizer(optimizer, model, self.cfg)
        self.backend.broadcast_state(model, optimizer, optimizer_state=False)  # its state is still empty
        self._prepared.append(optimizer)
        return model, optimizer

    @exits_on_usage_error(PROG)
    def loader(self, dataset, batch_size: int, epoch: int, *, num_workers: int | None = None):
        """This rank's seeded shard of `epoch` (batch_size per rank; a resumed epoch's rest), drop_last,
        on the device: the next batches are read and copied while your step runs (hvdtrain/torch/feeder.py).
        num_workers: the rank's cores less one by default (in-memory tensors need none)."""
        cfg = dataclasses.replace(self.cfg, batch_size=batch_size,
                                  num_workers=self.cfg.num_workers if num_workers is None else num_workers)
        self.batching = [self.world_size, batch_size]
        resumed = epoch == self.position.epoch and self.resumed_batching in (None, self.batching)
        skip = self.position.step_in_epoch if resumed else 0  # other shards than the checkpoint's: all again
        self.position = dataclasses.replace(self.position, epoch=epoch, step_in_epoch=skip)
        fed = self._batches(cfg, dataset, "train", epoch=epoch, skip_batches=skip)
        self.batches_in_epoch = skip + len(fed)
        return _SeededSteps(self, fed)

    def eval_loader(self, dataset, batch_size: int):  # each sample on one rank: sum, count, run.sum
        return self._batches(dataclasses.replace(self.cfg, batch_size=batch_size), dataset, "val")

    def _batches(self, cfg, dataset, split: str, **where) -> DeviceFeeder:
        """`split`'s batches of `dataset` on the device (hvdtrain/torch/loader.py); uint8 images of
        hvdtrain's datasets (or yours that say how: hvdtrain/torch/images.py) as normalised floats."""
        plan = loader.plan_loader(cfg, dataset, split, self.device)
        made = loader.create_loader(plan, dataset, self.rank, self.world_size, **where)
        return DeviceFeeder(made, self.device, lambda x: images.to_model_input(x, plan.normalization),
                            threaded=plan.feeder_thread, dataset=dataset)

    def sum(self, values) -> torch.Tensor:  # over ranks, float64 on the CPU: e.g. (loss sum, count)
        local = np.atleast_1d(torch.as_tensor(values).detach().cpu().double().numpy())
        return torch.from_numpy(self.backend.allreduce_sum(local, "loop_sum"))

    # step_done() after each batch's optimizer step: the position, the watchdog (hvdtrain/lifecycle.py)

    @exits_on_usage_error(PROG)
    def should_stop(self) -> bool:
        """Did SIGUSR1/SIGTERM reach any rank? A vote: every rank stops at the same step, then save()s.
        With start(checkpoint_every=), also the interval checkpoint, when one is due (the same step
        on every rank: a number of steps, or rank 0's clock, which votes here)."""
        return super().should_stop()

    @exits_on_usage_error(PROG)
    def resume(self, checkpoint_dir: str, model, optimizer) -> int:
        """Rank 0 loads the newest checkpoint that reads, every rank takes it: the epoch to start at."""
        if not any(optimizer is o for o in self._prepared):
            raise UsageError("run.resume() takes the optimizer run.prepare() returned (Horovod's starts empty)")
        self.saving_to = (checkpoint_dir, model, optimizer)  # where interval checkpoints go
        self.watchdog.beat(where="resuming")
        status = ckpt.resume_on_rank0(self.backend, self.is_rank0, checkpoint_dir,
                                      lambda path: self._take(path, self._read(path), model, optimizer),
                                      self.log, "loop_resume")
        if status:
            self.resumed_at(status)
            self.backend.broadcast_state(model, optimizer, optimizer_state=True)
        return self.position.epoch

    @staticmethod
    def _read(path: str) -> dict:
        distrust = ckpt.trust_problem(path, torch.__version__, trusted=False)  # torch < 2.6
        if distrust:
            raise UsageError(distrust)
        return torch.load(path, map_location="cpu", weights_only=True)

    @staticmethod
    def _take(path: str, state: dict, model, optimizer) -> dict:
        kept = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
        try:  # it reads but does not fit: no older one will (and it is not damaged: never moved aside)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            position = ckpt.Position.from_checkpoint(state)
        except Exception as err:  # noqa: BLE001 - one line, naming the file
            raise UsageError(f"checkpoint {path} does not fit this model or optimizer ({in_one_line(err)})") from None
        for group, settings in zip(optimizer.param_groups, kept):
            group.update(settings)  # this run's LR (scaled for its world size), not the checkpoint's
        return {"path": path, "position": position, "batching": state.get("batching")}

    @exits_on_usage_error(PROG)
    def save(self, checkpoint_dir: str, model, optimizer, *, keep: int = 3, background: bool = False) -> None:
        """Rank 0 writes model, optimizer, position atomically, keeps `keep`; a failure ends every rank.
        background: while your next steps run (the state staged to host memory before your next
        optimizer step, then written by a writer process: hvdtrain/torch/checkpoint_writer.py);
        run.should_stop() then says its failure on every rank at the next step."""
        self._save(checkpoint_dir, model, optimizer, keep, background)

    def _save(self, checkpoint_dir: str, model, optimizer, keep: int, background: bool = False) -> None:
        self.checkpoint(checkpoint_dir, lambda: self.backend.average_buffers(model),
                        lambda at: checkpoint_file.capture(checkpoint_dir, at, model, optimizer, batching=self.batching),
                        keep, background)

    @exits_on_usage_error(PROG)
    def finish(self) -> None:
        """Last, every rank: after SIGUSR1 (Slurm's time-limit warning) rank 0 requeues the job."""
        self.end()

    def _close(self) -> None:
        loader.close_loaders()
        self.writer.close()
