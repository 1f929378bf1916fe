"""The LR schedule shared by both trainers (fast tier: no ranks)."""
import pytest


def test_lr_schedule_warmup_then_cosine():
    from hvdtrain.config import TrainConfig
    from hvdtrain.schedule import lr_factor

    cfg = TrainConfig(world_size=2, base_lr=0.05, warmup_epochs=1, lr_schedule="cosine")
    f = lr_factor(cfg, steps_per_epoch=10, total_steps=110)
    assert [f(s) for s in (0, 5, 10)] == pytest.approx([0.5, 0.75, 1.0])  # from the one-rank LR
    assert f(60) == pytest.approx(0.5) and f(110) == pytest.approx(0.0, abs=1e-12)
