"""A user's own Keras model (and loss) on image files from TensorFlow's command line: `python -m
hvdtrain.tf --model FILE.py:FUNCTION --loss FILE.py:FUNCTION` on shards under mpirun -np 2, and its
mistakes in one line."""
from __future__ import annotations

import json
import os

import pytest

from conftest import PYTHON, REPO, assert_job_failed_with, digits_shards, launch

pytestmark = pytest.mark.slow

MODEL = os.path.join(REPO, "tests", "scripts", "keras_own_model.py")


def tf_run(tmp_path, data, model, *extra, check=True, np=2):
    result = tmp_path / "result.json"
    run = launch("mpirun", np, [PYTHON, "-m", "hvdtrain.tf", "--model", model, "--dataset", "shards", "--data-dir", data,
                                "--image-size", "16", "--batch-size", "8", "--epochs", "1", "--threads-per-rank", "1",
                                "--result-json", str(result), *extra], timeout=240, check=check)
    return json.loads(result.read_text()) if check else run


def test_a_users_keras_model_and_loss_train_on_shards(tmp_path):
    data = digits_shards(str(tmp_path))
    done = tf_run(tmp_path, data, f"{MODEL}:small_cnn", "--loss", f"{MODEL}:cross_entropy")
    assert done["config"]["model"] == f"{MODEL}:small_cnn" and done["config"]["loss"] == f"{MODEL}:cross_entropy"
    assert done["history"][-1]["val_count"] == 49  # exact validation, each sample once
    assert len({r["param_checksum"] for r in done["ranks"]}) == 1, done["ranks"]  # one model on both ranks
    # Its mistakes, in one line naming them: logits too few for the labels, a file that is not there.
    wrong = tf_run(tmp_path, data, f"{MODEL}:four_outputs", check=False)
    assert_job_failed_with(wrong, "--model: the training set's labels go up to 9, but the model gives 4 outputs", 2)
    missing = tf_run(tmp_path, data, "no_such_file.py:build", check=False, np=1)
    assert_job_failed_with(missing, f"--model no_such_file.py:build: no file {os.path.join(REPO, 'no_such_file.py')}", 1)
