"""The shared trainer (hvdtrain/trainer.py) with a stand-in framework and one stand-in rank (fast
tier): the start runs its steps in one fixed order and asks the framework for each part, a
resume hands every hook the checkpoint's position, the loop API moves the position and records
each epoch, and the position is stored in checkpoints under the keys of format 1."""
from types import SimpleNamespace

import os

import numpy as np
import pytest

from hvdtrain import checkpoint as ckpt, lifecycle
from hvdtrain import trainer as trainer_module
from hvdtrain.config import TrainConfig
from hvdtrain.errors import UsageError
from hvdtrain.trainer import EpochTrainer, StepPlan, plan_steps


class OneRank:
    name, rank, world_size, local_rank, local_world_size = "horovod", 0, 1, 0, 1

    def allreduce_sum(self, values, name):
        return np.asarray(values, dtype=np.float64)

    def broadcast_object(self, obj, name):
        return obj

    def allgather_object(self, obj, name):
        return [obj]

    def barrier(self):
        pass

    def describe(self):
        return {"backend": self.name}

    def shutdown(self):
        pass


class Recording(EpochTrainer):
    """Each hook notes that it ran, and what the trainer knew then."""
    framework = "torch"

    def __init__(self, cfg, saved_position=None):
        self.calls, self.saved_position, self.checkpoints = [], saved_position, []
        super().__init__(cfg)

    def _set_threads(self, threads):
        self.calls.append("set_threads")

    def _setup_device(self):
        self.calls.append("setup_device")
        return "cpu"

    def _build_data(self):
        self.calls.append("build_data")
        return 40, 10  # 40 samples, one rank, batch 8: 5 steps per epoch

    def _build_model(self):
        self.calls.append(("build_model", self.plan))

    def _load_checkpoint(self, path):
        self.calls.append("load_checkpoint")
        return self.cfg.to_dict(), self.saved_position, "rank 0's state"

    def _wrap_and_broadcast(self, saved, resumed):
        self.calls.append(("wrap_and_broadcast", saved, resumed, self.position))

    def _phase_clock(self):
        self.calls.append("phase_clock")
        return None

    def _train_epoch(self):
        steps = self.start_epoch()
        for _ in range(steps):
            self.before_step()
            if self.step_done([2.0, 1.0, 8.0]):
                break
        return self.epoch_steps_done()

    def _validate(self):
        return {"val_loss": 0.5, "val_acc": 0.75, "val_count": 10}

    def _checkpoint_file(self):
        at = self.position.to_checkpoint()
        self.checkpoints.append(at)
        return (os.path.join(self.cfg.checkpoint_dir, f"ckpt-e{at['epoch']:04d}-s{at['global_step']:08d}.pt"),
                lambda f: f.write(b"state"), False)

    def _state_arrays(self):
        return [np.zeros(2)]

    def _average_statistics(self):
        pass

    def _current_lr(self):
        return 0.1


@pytest.fixture
def one_rank(monkeypatch):
    """The trainer's start without a launcher: one stand-in rank, no signal handlers installed
    in pytest's process, no environment variables exported."""
    monkeypatch.setattr(trainer_module.backends, "start", lambda cfg: OneRank())
    monkeypatch.setattr(lifecycle.tuning, "apply", lambda settings: {})
    monkeypatch.setattr(lifecycle, "StopRequest", lambda: SimpleNamespace(signal_name=None))


def config(**options) -> TrainConfig:
    return TrainConfig(framework="torch", model="mnist_cnn", dataset="digits", batch_size=8, epochs=2,
                       watchdog_seconds=0, warmup_steps=0, log_interval=2, **options)


def test_the_start_asks_for_each_part_in_order(one_rank):
    t = Recording(config())
    assert t.calls == ["set_threads", "setup_device", "build_data", ("build_model", StepPlan(5, 10, 10, 40)),
                       ("wrap_and_broadcast", None, False, ckpt.Position()), "phase_clock"]
    assert t.device_name == "cpu" and not t.meter.phases.enabled and t.cfg.world_size == 1


def test_a_resume_starts_every_hook_after_the_load_from_the_checkpoints_position(one_rank, tmp_path):
    (tmp_path / ckpt.checkpoint_name(7, 1, "pt")).write_bytes(b"read by the stand-in's load")
    saved = ckpt.Position(1, 2, 7, ({"epoch": 1, "global_step": 5},))
    t = Recording(config(checkpoint_dir=str(tmp_path)), saved_position=saved)
    assert t.calls[4:] == ["load_checkpoint", ("wrap_and_broadcast", "rank 0's state", True, saved), "phase_clock"]
    assert t.position == saved


def test_the_loop_api_moves_the_position_records_epochs_and_checkpoints(one_rank, tmp_path):
    t = Recording(config(checkpoint_dir=str(tmp_path), steps=8))
    result = t.train()
    assert t.position == ckpt.Position(1, 3, 8, tuple(result["history"]))
    assert [(r["epoch"], r["global_step"]) for r in result["history"]] == [(1, 5), (1.6, 8)]
    assert [c["global_step"] for c in t.checkpoints] == [5, 8]
    assert result["global_step"] == 8 and result["epoch"] == 1 and result["loss_log"][-1] == [8, 0.25]


def test_plan_steps():
    assert plan_steps(config(world_size=2), train_size=100, val_size=10) == StepPlan(6, 12, 12, 100)
    assert plan_steps(config(world_size=2, steps=5), train_size=100, val_size=10).total_steps == 5
    with pytest.raises(UsageError, match="each of the 2 ranks gets 3 training samples, fewer than one step's 8"):
        plan_steps(config(world_size=2), train_size=7, val_size=10)


def test_the_position_keeps_the_checkpoint_format_of_version_1():
    """Checkpoints written before Position existed hold these four keys at their top level (the
    torch state dict, the TF meta JSON): they load, and new ones are written the same way."""
    written_before = {"format_version": 1, "epoch": 2, "step_in_epoch": 3, "global_step": 45,
                      "history": [{"epoch": 1, "global_step": 21}, {"epoch": 2, "global_step": 42}]}
    position = ckpt.Position.from_checkpoint(written_before)
    assert position == ckpt.Position(2, 3, 45, ({"epoch": 1, "global_step": 21}, {"epoch": 2, "global_step": 42}))
    assert position.to_checkpoint() == {k: v for k, v in written_before.items() if k != "format_version"}
    assert list(position.to_checkpoint()) == ["epoch", "step_in_epoch", "global_step", "history"]
    assert position.after_step().next_epoch() == ckpt.Position(3, 0, 46, position.history)
