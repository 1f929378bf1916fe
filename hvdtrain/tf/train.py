"""Horovod data-parallel training of Keras models on TensorFlow 2.21, with `model.fit` or with a
GradientTape loop.

    mpirun -np 2 python -m hvdtrain.tf --model mnist_cnn --dataset digits --loop custom --epochs 8
    mpirun -np 2 python -m hvdtrain.tf --model mnist_cnn --dataset digits --loop fit --epochs 8
    srun --mpi=pmix -n 2 python -m hvdtrain.tf --model resnet50 --dataset synthetic --image-size 64 --steps 20

Every rank runs this file; rank 0 alone logs, writes checkpoints and the result file. The
command line, checkpoint policy and result file are those of hvdtrain.torch. What it trains is a
workload (hvdtrain/tf/workload.py): the command line's built-in model and dataset, or the model,
arrays and loss given to hvdtrain.tf.fit (hvdtrain/tf/api.py). Import this module only after
`keras_compat.select()` (main() and fit() do it): it imports tensorflow.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from hvdtrain import checkpoint as ckpt
from hvdtrain.config import TrainConfig
from hvdtrain.data.datasets import BadSample
from hvdtrain.errors import UsageError
from hvdtrain.phases import PhaseClock
from hvdtrain.tf import devices, npz_checkpoint
from hvdtrain.tf.data import READ_AHEAD_BATCHES, READ_PER_CALL, model_input
from hvdtrain.tf.loops import make_loop, step_stats
from hvdtrain.tf.workload import TFWorkload, from_config
from hvdtrain.trainer import EpochTrainer

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
    prog = PROG
    tensorboard_writer = TFSummaryWriter

    def __init__(self, cfg: TrainConfig, keras, workload: TFWorkload):
        self.keras = keras  # the Keras the loop runs on (keras_compat.select): the hooks build with it
        self.workload = workload  # what to train (hvdtrain/tf/workload.py): built-in or the user's
        self.reports_accuracy = workload.loss is None
        self.threads_left = None  # why TensorFlow's own thread counts stay, if they do
        super().__init__(cfg)

    def _set_threads(self, threads: int) -> None:
        try:
            set_threads(threads)
        except RuntimeError:
            # TensorFlow runs already (fit() was given a model or a tf.data.Dataset made before
            # it): its pools are sized, and stay as they are.
            threading = tf.config.threading
            self.threads_left = (f"TensorFlow was started before hvdtrain (a model or dataset made first): its own "
                                 f"threads stay (intra-op {threading.get_intra_op_parallelism_threads()}, inter-op "
                                 f"{threading.get_inter_op_parallelism_threads()}; 0: one per core), not {threads}; "
                                 "give fit() a function that builds the model, and arrays, to have them set")

    # ------------------------------------------------------------------ the start (EpochTrainer.__init__)
    def _setup_device(self) -> str:
        return self.backend.device  # pinned by the backend, before TensorFlow placed anything

    def _build_data(self) -> tuple[int, int]:
        if self.threads_left:
            self.reporter.info(self.threads_left)
        fingerprint = self.workload.fingerprint
        if fingerprint is not None:  # before any rank trains on a shard of data the others do not have
            every = self.backend.allgather_object(fingerprint, "data_fingerprint")
            if len(set(every)) > 1:
                ranks = ", ".join(f"rank {r}: {f}" for r, f in enumerate(every))
                raise UsageError(f"fit() was given other data on other ranks (checksums {ranks}): every rank must "
                                 "pass the same samples in the same order (hvdtrain shards and shuffles them itself; "
                                 "an unseeded shuffle before fit() gives each rank its own order)")
        # A GPU's custom loop: uint8 images copied ahead to the device and normalised there.
        # (DALI normalises on the device itself.)
        self.uint8_input = devices.uint8_input(self.backend.device, self.cfg.loop) and self.cfg.loader != "dali"
        self.data = self.workload.data(self.threads, uint8=self.uint8_input)
        self.input_normalization = self.data.input_normalization  # the step's (tf/data.py model_input)
        self.sample_unit = self.workload.sample_unit
        self.data_threads: dict = {}  # tf.data's pools, read off the training pipeline
        return self.data.train_size, self.data.val_size

    def _build_model(self) -> None:
        cfg, b, keras, d = self.cfg, self.backend, self.keras, self.data
        # The same seed on every rank: tf.distribute mirrors Keras' random-seed state from worker 0
        # (dropout draws the same masks on every worker), and Horovod's path does the same so that
        # the two start from the same weights and draw the same numbers (hvdtrain.compare's parity).
        keras.utils.set_random_seed(cfg.seed)
        with b.scope():  # tf.distribute creates mirrored variables in its scope; Horovod: no-op
            self.model = self.workload.build_model(keras, d)
            self.loop = make_loop(cfg, keras, self.model, b, self, self.workload.loss)
        loss = self.workload.loss
        normalization = self.input_normalization
        self._eval_step = tf.function(
            lambda x, y: step_stats(y, self.model(model_input(x, normalization), training=False), loss)[0],
            reduce_retracing=True, autograph=False)

    def _wrap_and_broadcast(self, saved, resumed: bool) -> None:
        # Horovod: every rank starts from rank 0's weights and optimizer state. Horovod's examples
        # broadcast after the first step, when the optimizer has made its slots; here they exist
        # already, and broadcasting first keeps a resumed run's first step on the loaded weights.
        # (Nothing else to restore: _load_checkpoint assigned the variables, and the LR is a
        # function of the step and this run's config.)
        self.backend.broadcast_variables(self.model.weights + self.loop.optimizer_variables())

    def _phase_clock(self):
        # The custom loop's step split into compute, sync and optimizer functions, timed by the
        # host clock between their calls (hvdtrain/tf/loops.py): when asked for
        # (HVDTRAIN_TF_PHASES=1: the split costs throughput on small steps), on a CPU only, where a
        # call returns when its kernels have run. On a GPU it returns when they are queued, and
        # host marks would need a device synchronisation: no breakdown there, nor under Keras
        # fit, which runs the step itself.
        return PhaseClock() if self.loop.split else None

    def _loop_description(self) -> str:
        return f"; --loop {self.cfg.loop} on {self.keras.__name__} {self.keras.__version__}"

    def _checkpoint_config(self) -> dict:
        return {**self.cfg.to_dict(), "num_classes": self.data.num_classes}

    def _load_checkpoint(self, path: str):
        """Rank 0: weights and optimizer slots from an .npz checkpoint, assigned now; returns its
        config and position (and no state: everything is in the variables already; the LR is a
        function of the step and this run's config)."""
        meta, arrays = npz_checkpoint.read(path)
        current = self._checkpoint_config()
        # (--loop too: fit's tf_keras legacy optimizer and custom's Keras 3 one keep different slots.)
        ckpt.check_compatible(path, {**meta["config"], "format_version": meta["format_version"]}, current)
        # The loss is among those keys (--loss); a checkpoint of before it was written without it.
        saved_loss = meta["config"].get("loss", "cross_entropy")
        if saved_loss != current["loss"]:
            raise UsageError(f"checkpoint {path} does not match this run: loss: checkpoint {saved_loss!r}, this "
                             f"run {current['loss']!r} (use another checkpoint_dir)")
        variables = self._checkpointed()
        problem = npz_checkpoint.mismatch(variables, arrays)
        if problem:
            raise ValueError(problem)
        npz_checkpoint.assign(variables, arrays)
        return meta["config"], ckpt.Position.from_checkpoint(meta), None

    # ------------------------------------------------------------------ the loop
    def _state_arrays(self):
        return [v.numpy().astype(np.float64) for v in self.model.weights]  # BatchNorm statistics too

    def _average_statistics(self) -> None:
        self.backend.average_variables(self.model.non_trainable_weights)

    def _start_lines(self) -> list[str]:
        splits = ("train", "val") if self.data.val_size and self.cfg.validates else ("train",)
        return [self.data.describe(split, self.cfg.batch_size) for split in splits]

    def _result_extras(self) -> dict:
        # What "threads per rank" meant here: every pool this rank's TensorFlow runs on.
        threading = tf.config.threading
        images = ("the step, on the device" if self.input_normalization is not None
                  else "DALI" if self.data.per_sample and self.data.loader == "dali"
                  else "the tf.data map" if self.data.per_sample else None)
        return {"keras": f"{self.keras.__name__} {self.keras.__version__}", "images_normalised_in": images,
                "crops": self.data.crops_check(self.cfg.seed),  # the comparison's check
                "tf_threads": {"intra_op": threading.get_intra_op_parallelism_threads(),
                               "inter_op": threading.get_inter_op_parallelism_threads(),
                               **self.data_threads}}

    def _train_epoch(self):
        cfg = self.cfg
        steps = self.start_epoch()
        # Exactly the steps this call runs (--steps may end the epoch early): the loop ends on the
        # exhausted pipeline and no batch is made that will not be trained on. (The end of a
        # pipeline once waited 18-19 s for tf.data's autotuner, now off: hvdtrain/tf/data.py.)
        at = self.position
        dataset = self.data.train(at.epoch, at.steps_into_order, self.rank, self.world_size,
                                  at.steps_into_order + steps, cfg.batch_size, cfg.seed, at.seen_before)
        pools = dataset.options().threading  # as the pipeline really runs, for the result file
        if self.uint8_input:  # the next batches copied to the device while a step runs (the last stage)
            dataset = dataset.apply(tf.data.experimental.prefetch_to_device(devices.input_device(self.backend.device)))
        self.data_threads = {"tf_data_private_pool": pools.private_threadpool_size,
                             "tf_data_max_intra_op": pools.max_intra_op_parallelism}
        # The loop calls self.before_step() and self.step_done(stats) for each step.
        try:
            self.loop.run_epoch(dataset, at.epoch, steps, at.step_in_epoch)
        except tf.errors.OpError as err:
            order = self.data.train_order(at.epoch, self.rank, self.world_size, cfg.seed, at.seen_before)
            self._name_bad_sample(err, "train", order[:(at.steps_into_order + steps) * cfg.batch_size],
                                  self.position.steps_into_order)
        return self.epoch_steps_done()

    def _name_bad_sample(self, err: tf.errors.OpError, split: str, order, batches_done: int):
        """A pipeline error names an op, not the file: decode the samples it may have been reading
        (from the batch after the last one used) alone, and end with one line naming the bad one.
        Any other error is raised as it was."""
        start = batches_done * self.cfg.batch_size
        bad = self.data.bad_sample(split, order[start:start + READ_AHEAD_BATCHES * self.cfg.batch_size + READ_PER_CALL])
        if bad:
            raise BadSample(bad) from None
        raise err

    def _current_lr(self) -> float:
        lr = self.loop.optimizer.learning_rate
        return float(lr.numpy() if hasattr(lr, "numpy") else lr)

    def _validate(self) -> dict:
        self._average_statistics()  # one set of BatchNorm statistics
        sums = np.zeros(3)
        self.watchdog.beat(where="validating")  # a rank stuck on its first batch says so too
        batches = 0
        try:
            for x, y in self.data.val(self.rank, self.world_size, self.cfg.batch_size):
                self.watchdog.beat(where="validating")
                sums += self._eval_step(x, y).numpy()
                batches += 1
        except tf.errors.OpError as err:
            self._name_bad_sample(err, "val", self.data.val_order(self.rank, self.world_size), batches)
        total = self.backend.allreduce_sum(sums, "val_sums")
        count = int(total[2])
        return {"val_loss": float(total[0]) / count, "val_acc": float(total[1]) / count if self.reports_accuracy else None,
                "val_count": count}

    # ------------------------------------------------------------------ checkpoints and results
    def _checkpointed(self) -> dict:
        return {"model": self.model.weights, "optimizer": self.loop.optimizer_variables()}

    def _checkpoint_file(self):
        path, write = npz_checkpoint.capture(self.cfg.checkpoint_dir, self.position, self._checkpointed(),
                                             {"config": self._checkpoint_config()})
        return path, write, False


def run(cfg: TrainConfig, keras, workload: TFWorkload | None = None) -> dict:
    """Train cfg's built-in workload (or `workload`, fit's) on `keras` (keras_compat.select's, or
    the Keras of fit's model): the result."""
    return Trainer(cfg, keras, workload or from_config(cfg)).train()
