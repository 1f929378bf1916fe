"""Horovod data-parallel training of Keras models on TensorFlow 2.21, with `model.fit` or with a
GradientTape loop.

    mpirun -np 2 python -m hvdtrain.tf --model mnist_cnn --dataset digits --loop custom --epochs 8
    mpirun -np 2 python -m hvdtrain.tf --model mnist_cnn --dataset digits --loop fit --epochs 8
    srun --mpi=pmix -n 2 python -m hvdtrain.tf --model resnet50 --dataset synthetic --image-size 64 --steps 20

Every rank runs this file; rank 0 alone logs, writes checkpoints and the result file. The
command line, checkpoint policy and result file are those of hvdtrain.torch. Import this module
only after `keras_compat.select()` (main() does it): it imports tensorflow.
"""
from __future__ import annotations

import json
import os
import time
import zipfile

import numpy as np
import tensorflow as tf

from hvdtrain import checkpoint as ckpt
from hvdtrain.cluster import ClusterEnv
from hvdtrain.config import TrainConfig
from hvdtrain.errors import UsageError
from hvdtrain.report import Rank0Reporter
from hvdtrain.runtime import StopRequest, threads_per_rank
from hvdtrain.tf.backends import make_backend
from hvdtrain.tf.data import build_data
from hvdtrain.tf.loops import make_loop, step_stats
from hvdtrain.tf.models import build_model
from hvdtrain.trainer import EpochTrainer, stop_reason, stop_votes

PROG = "hvdtrain.tf"


class TFSummaryWriter:
    """TensorBoard scalars through tf.summary, in the writer shape Rank0Reporter expects."""

    def __init__(self, log_dir: str):
        self._writer = tf.summary.create_file_writer(log_dir)

    def add_scalar(self, name: str, value: float, step: int) -> None:
        with self._writer.as_default():
            tf.summary.scalar(name, value, step=step)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def set_threads(threads: int) -> None:
    # Must happen before TensorFlow runs its first op. TensorFlow's default is one thread per core
    # of the machine for each pool, in every rank: N ranks on a node would oversubscribe it N times.
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)


class Trainer(EpochTrainer):
    framework = "tf"

    def __init__(self, cfg: TrainConfig, keras):
        env = ClusterEnv.from_environ()
        self.threads = threads_per_rank(cfg.threads_per_rank, env.local_world_size)
        set_threads(self.threads)
        self.backend = b = make_backend(cfg, self.threads)
        self.cfg = cfg = cfg.with_world_size(b.world_size)
        self.rank, self.world_size = b.rank, b.world_size
        self.is_rank0 = b.rank == 0
        self.keras = keras
        self.reporter = Rank0Reporter(self.is_rank0, None, PROG)
        self.stop = StopRequest()
        if cfg.batches_per_allreduce != 1:
            raise UsageError("--batches-per-allreduce > 1 is not supported by hvdtrain.tf yet")

        self.data = d = build_data(cfg)
        self._plan_steps(d.train_size, d.val_size)

        # The same seed on every rank: tf.distribute mirrors Keras' random-seed state from worker 0
        # (dropout draws the same masks on every worker), and Horovod's path does the same so that
        # the two start from the same weights and draw the same numbers (hvdtrain.compare's parity).
        keras.utils.set_random_seed(cfg.seed)
        with b.scope():  # tf.distribute creates mirrored variables in its scope; Horovod: no-op
            self.model = build_model(keras, cfg.model, d.in_channels, d.num_classes, d.image_size)
            self.loop = make_loop(cfg, keras, self.model, b, self)
        self.epoch, self.step_in_epoch, self.global_step, self.history = 0, 0, 0, []
        self._steps_run = 0  # steps this process ran: the first cfg.warmup_steps are not timed
        resumed_from = self._restore_on_rank0(self._load)
        # Horovod: every rank starts from rank 0's weights and optimizer state. Horovod's examples
        # broadcast after the first step, when the optimizer has made its slots; here they exist
        # already, and broadcasting first keeps a resumed run's first step on the loaded weights.
        b.broadcast_variables(self.model.weights + self.loop.optimizer_variables())
        if cfg.log_dir and self.is_rank0:
            self.reporter = Rank0Reporter(True, cfg.log_dir, PROG, writer_factory=TFSummaryWriter)
        self._eval_step = tf.function(lambda x, y: step_stats(y, self.model(x, training=False))[0],
                                      reduce_retracing=True)
        self.device_name = self.backend.device
        self._log_start(env, resumed_from, f"; --loop {cfg.loop} on {keras.__name__} {keras.__version__}")

    # ------------------------------------------------------------------ set-up helpers
    def _checkpoint_config(self) -> dict:
        return {**self.cfg.to_dict(), "num_classes": self.data.num_classes}

    def _load(self, path: str):
        """Rank 0: weights and optimizer slots from an .npz checkpoint; returns its position."""
        if not zipfile.is_zipfile(path):
            raise ValueError("not an .npz archive")
        with np.load(path, allow_pickle=False) as saved:
            meta = json.loads(str(saved["meta"]))
            current = self._checkpoint_config()
            diffs = ckpt.incompatibilities({**meta["config"], "format_version": meta["format_version"]}, current)
            if meta["config"].get("loop") != current["loop"]:
                # fit (tf_keras legacy optimizer) and custom (Keras 3 optimizer) keep different slots.
                diffs.append(f"loop: checkpoint {meta['config'].get('loop')!r}, this run {current['loop']!r}")
            if diffs:
                raise UsageError(f"checkpoint {path} does not match this run: " + "; ".join(diffs))
            for prefix, variables in (("model", self.model.weights),
                                      ("optimizer", self.loop.optimizer_variables())):
                arrays = [saved[f"{prefix}/{i}"] for i in range(meta[f"num_{prefix}"])]
                if len(arrays) != len(variables):
                    raise ValueError(f"{len(arrays)} {prefix} arrays for {len(variables)} variables")
                for var, value in zip(variables, arrays):
                    if tuple(var.shape) != value.shape:
                        raise ValueError(f"{prefix} variable {var.name}: shape {tuple(var.shape)} != saved {value.shape}")
                    var.assign(value)
        return meta["epoch"], meta["step_in_epoch"], meta["global_step"], meta["history"]

    # ------------------------------------------------------------------ the loop
    def _param_arrays(self):
        return [v.numpy().astype(np.float64) for v in self.model.trainable_weights]

    def _result_extras(self) -> dict:
        return {"keras": f"{self.keras.__name__} {self.keras.__version__}"}

    def _train_epoch(self):
        cfg = self.cfg
        steps = min(self.steps_per_epoch - self.step_in_epoch, self.total_steps - self.global_step)
        dataset = self.data.train(self.epoch, self.step_in_epoch, self.rank, self.world_size,
                                  self.steps_per_epoch, cfg.batch_size, cfg.seed)
        self._window = np.zeros(3)      # ce sum, correct, count since the last reduction
        self._totals = np.zeros(3)
        self._stop, self._timing, self._timed_steps = None, False, 0
        self._last_step = self.global_step + steps
        self._bar = self.reporter.progress(steps, f"epoch {self.epoch + 1}/{cfg.epochs}")
        self.loop.run_epoch(dataset, self.epoch, steps, self.step_in_epoch)
        self._bar.close()
        if self._timing:
            self.backend.barrier()
            self.timed_seconds += time.perf_counter() - self._t0
            self.timed_samples += self._timed_steps * cfg.batch_size
        stopped_by = self._stop
        count = max(1.0, self._totals[2])
        return {"train_loss": self._totals[0] / count, "train_acc": self._totals[1] / count}, stopped_by

    def before_step(self) -> None:
        """Called by the loop before each step: starts the clock once the warm-up steps are done."""
        if not self._timing and self._steps_run >= self.cfg.warmup_steps:
            self.backend.barrier()  # every rank starts the clock together: no rank-0-only timing
            self._timing, self._t0 = True, time.perf_counter()

    def after_step(self, stats: np.ndarray) -> bool:
        """Called by the loop after each step with its (ce sum, correct, count); True: stop now."""
        self.global_step += 1
        self.step_in_epoch += 1
        self._steps_run += 1
        self._timed_steps += self._timing
        self._window += stats
        self._bar.update(1)
        if self.global_step % self.cfg.log_interval and self.global_step != self._last_step:
            return False
        # One allreduce for the metrics and the stop votes: every rank stops at the same step and
        # knows which signal stopped it.
        reduced = self.backend.allreduce_sum([*self._window, *stop_votes(self.stop.signal_name)], "train_window")
        self._totals += reduced[:3]
        self._window[:] = 0
        interval_loss = reduced[0] / max(1.0, reduced[2])
        self.loss_log.append([self.global_step, interval_loss])
        self.reporter.scalars(self.global_step, {"train/loss": interval_loss,
                                                 "train/lr": float(self._current_lr())})
        self._bar.set_postfix(loss=f"{interval_loss:.4f}")
        self._stop = stop_reason(reduced[3], reduced[4])
        return self._stop is not None

    def _current_lr(self) -> float:
        lr = self.loop.optimizer.learning_rate
        return float(lr.numpy() if hasattr(lr, "numpy") else lr)

    def _validate(self) -> dict:
        self.backend.average_variables(self.model.non_trainable_weights)  # one set of BatchNorm statistics
        sums = np.zeros(3)
        for x, y in self.data.val(self.rank, self.world_size, self.cfg.batch_size):
            sums += self._eval_step(x, y).numpy()
        total = self.backend.allreduce_sum(sums, "val_sums")
        count = int(total[2])
        return {"val_loss": total[0] / count, "val_acc": total[1] / count, "val_count": count}

    # ------------------------------------------------------------------ checkpoints and results
    def _save_checkpoint(self):
        if not self.cfg.checkpoint_dir or not self.is_rank0:
            return
        weights = [v.numpy() for v in self.model.weights]
        slots = [v.numpy() for v in self.loop.optimizer_variables()]
        meta = {"format_version": ckpt.FORMAT_VERSION, "config": self._checkpoint_config(),
                "epoch": self.epoch, "step_in_epoch": self.step_in_epoch, "global_step": self.global_step,
                "history": self.history, "num_model": len(weights), "num_optimizer": len(slots)}
        arrays = {"meta": np.array(json.dumps(meta)),
                  **{f"model/{i}": w for i, w in enumerate(weights)},
                  **{f"optimizer/{i}": s for i, s in enumerate(slots)}}
        path = os.path.join(self.cfg.checkpoint_dir, ckpt.checkpoint_name(self.global_step, self.epoch, "npz"))
        ckpt.atomic_write(path, lambda f: np.savez(f, **arrays))
        ckpt.prune(self.cfg.checkpoint_dir, self.cfg.keep_checkpoints)
        self.reporter.info(f"checkpoint {path}")
