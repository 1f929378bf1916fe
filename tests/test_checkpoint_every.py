"""--checkpoint-every's values (hvdtrain/config.py): steps or a time with its unit; a bad value is
one line; the option needs a checkpoint directory. Training with it: tests/test_interval_checkpoints.py."""
import pytest

from hvdtrain.config import TrainConfig
from hvdtrain.errors import UsageError


@pytest.mark.parametrize("text, interval", [("2000", (2000, None)), ("90s", (None, 90.0)), ("30m", (None, 1800.0)),
                                            ("2h", (None, 7200.0)), ("0.5s", (None, 0.5)), (" 15M ", (None, 900.0)),
                                            (None, (None, None))])
def test_steps_or_a_time(text, interval):
    assert TrainConfig(checkpoint_dir="ckpt", checkpoint_every=text).checkpoint_interval == interval


@pytest.mark.parametrize("text", ["0", "-5", "1.5", "30x", "m", "0m", "nan s", "inf"])
def test_a_bad_value_is_one_line(text):
    with pytest.raises(UsageError, match=r"--checkpoint-every takes a number of steps \(2000\) or of seconds, "
                                         rf"minutes or hours \(90s, 30m, 2h\), above 0; got '{text}'"):
        TrainConfig(checkpoint_dir="ckpt", checkpoint_every=text)


def test_it_needs_a_checkpoint_directory():
    with pytest.raises(UsageError, match="--checkpoint-every needs --checkpoint-dir"):
        TrainConfig(checkpoint_every="100")
