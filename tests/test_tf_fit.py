"""hvdtrain.tf.fit on 2 real ranks (mpirun): a user's Keras model on the digits under both loops,
and a user's regression with its own loss, data as a tf.data.Dataset and a model built before.

    python -m pytest -q tests/test_tf_fit.py
"""
from __future__ import annotations

import json
import os

import pytest

from conftest import PYTHON, REPO, launch

pytestmark = pytest.mark.slow  # real ranks: the distributed tier

EXAMPLE = os.path.join(REPO, "tf_examples", "keras_model_fit.py")
REGRESSION = os.path.join(REPO, "tests", "scripts", "tf_user_regression.py")


def assert_same_weights_everywhere(result):
    checksums = [r["param_checksum"] for r in result["ranks"]]
    assert [r["rank"] for r in result["ranks"]] == [0, 1] and checksums[0] == checksums[1], checksums


@pytest.mark.parametrize("loop,keras", [("custom", "keras 3."), ("fit", "tf_keras 2.")])
def test_example_reaches_90_percent_with_equal_ranks(tmp_path, loop, keras):
    out = tmp_path / "result.json"
    run = launch("mpirun", 2, [PYTHON, EXAMPLE, json.dumps({"loop": loop, "epochs": 3, "result_json": str(out)})],
                 timeout=240)
    result = json.loads(out.read_text())
    final = result["final"]
    assert final["val_count"] == 397 and final["val_acc"] >= 0.9, result["history"]
    assert_same_weights_everywhere(result)
    cfg = result["config"]
    assert cfg["loop"] == loop and result["keras"].startswith(keras), (cfg["loop"], result["keras"])
    assert (cfg["model"], cfg["dataset"], cfg["loss"]) == ("__main__:build_model", "numpy:ndarray", "cross_entropy")
    # A model built by fit(): the threads were set (one per rank, every pool).
    assert result["tf_threads"]["intra_op"] == 1 and result["tf_threads"]["inter_op"] == 1, result["tf_threads"]
    assert f"[1,0]<stdout>:final val accuracy: {final['val_acc']:.4f} over 397 samples" in run.output
    assert "Traceback" not in run.output and "error [" not in run.output
    assert result["throughput"]["unit"] == "img" and "img/s in all" in run.output


def test_own_loss_regression_reports_no_accuracy_and_learns(tmp_path):
    out = tmp_path / "result.json"
    run = launch("mpirun", 2, [PYTHON, REGRESSION, "fit", json.dumps({"epochs": 4, "base_lr": 0.01,
                                                                      "result_json": str(out)})], timeout=240)
    result = json.loads(out.read_text())
    cfg, history = result["config"], result["history"]
    # A tf_keras model: fit() picked the Keras fit loop; the recipe's AdamW is Adam there.
    assert cfg["loop"] == "fit" and cfg["optimizer"] == "adam" and cfg["loss"] == "__main__:mse"
    assert cfg["dataset"] == "tensorflow.data:Dataset"
    assert all(h["train_acc"] is None and h["val_acc"] is None for h in history), history
    assert history[-1]["val_count"] == 203, "every validation sample counted once"
    # y's variance is about 1.04 (a constant prediction's loss), its noise's 0.01.
    val_losses = [h["val_loss"] for h in history]
    assert val_losses[-1] < val_losses[0] and val_losses[-1] < 0.2, val_losses
    assert_same_weights_everywhere(result)
    # A model built before fit(): TensorFlow's threads could not be set, and the log says so.
    assert "TensorFlow was started before hvdtrain" in run.output
    # Vectors, not images: the log and the result count samples.
    assert result["throughput"]["unit"] == "samples" and "samples/s in all" in run.output and "img/s" not in run.output
    assert "Traceback" not in run.output and "error [" not in run.output


def test_a_tf_dataset_is_read_unbatched_and_a_batched_one_is_one_line():
    """fit() reads an unbatched tf.data.Dataset into arrays (through a map and a prefetch, or a
    batch() undone by unbatch()). A batched one (model.fit's habit, image_dataset_from_directory's
    default) would count each batch as a sample ("10 training samples" for 200 images): it is one
    line naming its batch size and the fix. An infinite one is one line too. (In this process,
    no ranks.)"""
    import re

    import numpy as np
    import tensorflow as tf

    from hvdtrain.errors import UsageError
    from hvdtrain.tf import workload as wl

    x, y = np.arange(40, dtype=np.float32).reshape(20, 2), np.arange(20) % 3
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    for readable in (ds.map(lambda a, b: (a * 1, b)).prefetch(2), ds.batch(6).unbatch()):
        got_x, got_y = wl.as_arrays(readable, "fit(): train_data", class_labels=True)
        np.testing.assert_array_equal(got_x, x)
        np.testing.assert_array_equal(got_y, y)
    for batched, size in ((ds.batch(6), 6), (ds.padded_batch(4).map(lambda a, b: (a, b)).prefetch(1), 4)):
        with pytest.raises(UsageError, match=re.escape(
                f"fit(): train_data is batched (a batch() in its pipeline, batches of {size}): give it unbatched "
                f"(train_data.unbatch()) and the batch size to fit() (batch_size={size}, per rank)")):
            wl.as_arrays(batched, "fit(): train_data", class_labels=True)
    with pytest.raises(UsageError, match=re.escape("fit(): val_data is infinite (repeat()?)")):
        wl.as_arrays(ds.repeat(), "fit(): val_data", class_labels=True)
