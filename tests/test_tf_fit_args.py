"""hvdtrain.tf.fit's checks of its arguments (hvdtrain/tf/workload.py, hvdtrain/tf/api.py), without
TensorFlow: bad input is one line naming what is wrong, and exit status 2.

    python -m pytest -q tests/test_tf_fit_args.py
"""
from __future__ import annotations

import re
import subprocess
import sys
import types

import numpy as np
import pytest

from conftest import ERROR_LINE, REPO, base_env
from hvdtrain.errors import UsageError
from hvdtrain.tf import workload as wl


def test_arrays_are_taken_as_keras_takes_them():
    x, y = wl.as_arrays((np.zeros((4, 3)), np.arange(4).reshape(4, 1)), "train", class_labels=True)
    assert x.dtype == np.float32 and y.dtype == np.int64 and y.shape == (4,)
    x, y = wl.as_arrays([np.zeros((4, 3), np.float16), np.zeros((4, 2))], "train", class_labels=False)
    assert x.dtype == np.float16 and y.dtype == np.float32 and y.shape == (4, 2)


@pytest.mark.parametrize("data,labels,message", [
    ((np.zeros((3, 2)), np.zeros(4)), True, "train: x has 3 samples and y 4"),
    ((np.zeros((0, 2)), np.zeros(0, int)), True, "train is empty"),
    ({"x": 1}, True, "must be numpy arrays (x, y) or an unbatched tf.data.Dataset"),
    ((np.zeros(3), np.zeros(3), np.zeros(3)), True, "got a 3-tuple"),
    ((np.array(["a", "b"]), np.zeros(2)), False, "x holds <U1 values, not numbers"),
    ((np.zeros((2, 2)), np.array([0.5, 1.0])), True, "without loss=, the targets are class labels"),
    ((np.zeros((2, 2)), np.array([0, -1])), True, "integers >= 0"),
])
def test_bad_arrays_are_one_line(data, labels, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        wl.as_arrays(data, "train", class_labels=labels)


def test_validation_samples_must_be_shaped_as_training_ones():
    wl.check_alike((np.zeros((4, 3)), np.zeros(4)), None)
    with pytest.raises(UsageError, match=re.escape("val_data's x is float64 of samples (5,), train_data's float64 of "
                                                   "samples (3,)")):
        wl.check_alike((np.zeros((4, 3)), np.zeros(4)), (np.zeros((2, 5)), np.zeros(2)))


def test_the_loop_follows_the_models_keras():
    assert wl.choose_loop(None, "tf_keras") == "fit"
    assert wl.choose_loop(None, "keras") == "custom"
    assert wl.choose_loop(None, None) == "custom"  # a function: the command line's default
    assert wl.choose_loop("custom", "tf_keras") == "custom"  # the custom loop runs on either Keras
    assert wl.choose_loop("fit", None) == "fit"
    with pytest.raises(UsageError, match=r"loop='fit' runs on Keras 2 \(tf_keras.*Keras 3 model.*or use loop='custom'"):
        wl.choose_loop("fit", "keras")
    with pytest.raises(UsageError, match="loop must be 'fit' or 'custom'"):
        wl.choose_loop("keras", None)


def test_labels_must_index_the_logits():
    wl.check_labels(9, (2, 10))
    with pytest.raises(UsageError, match="labels go up to 9, but the model gives 5 outputs"):
        wl.check_labels(9, (2, 5))
    with pytest.raises(UsageError, match=r"logits of shape \(batch, classes\).*\(2, 8, 8\)"):
        wl.check_labels(9, (2, 8, 8))


def my_loss(y_true, y_pred):
    return np.mean((y_true - y_pred) ** 2, axis=-1)


def test_a_compiled_loss_is_found_and_named():
    losses = types.SimpleNamespace(get=lambda name: {"mse": np.square}[name])
    keras = types.SimpleNamespace(__name__="keras", losses=losses)
    assert wl.compiled_loss(types.SimpleNamespace(loss=None), keras) is None
    assert wl.compiled_loss(types.SimpleNamespace(loss={}), keras) is None  # tf_keras, compiled without one
    assert wl.compiled_loss(types.SimpleNamespace(), keras) is None  # tf_keras, not compiled
    assert wl.compiled_loss(types.SimpleNamespace(loss="mse"), keras) is np.square
    # fit(loss="mse"), as model.compile takes it: the loop's Keras resolves the name.
    assert wl.named_loss("mse", keras) is np.square
    with pytest.raises(UsageError, match="fit\\(\\): loss= 'msee', which keras does not know"):
        wl.named_loss("msee", keras)
    with pytest.raises(UsageError, match="compiled with a list of losses"):
        wl.compiled_loss(types.SimpleNamespace(loss=[np.square, np.square]), keras)
    assert wl.loss_name(None) == "cross_entropy" and wl.loss_name(my_loss) == f"{__name__}:my_loss"
    assert wl.data_name((np.zeros(2), np.zeros(2))) == "numpy:ndarray"


def test_fingerprint_tells_another_order():
    x, y = np.arange(12.0).reshape(6, 2), np.arange(6)
    assert wl.fingerprint(x, y) == wl.fingerprint(x.copy(), y.copy())
    assert wl.fingerprint(x[::-1], y[::-1]) != wl.fingerprint(x, y)
    assert wl.fingerprint(x.astype(np.float32), y) != wl.fingerprint(x, y)


@pytest.mark.parametrize("call,message", [
    ("fit(build, ([[1.0]], [1, 2]))", "fit(): train_data: x has 1 samples and y 2"),
    ("fit(build, (x, y), epoch=3)", "unknown option for hvdtrain.tf: epoch (did you mean epochs?)"),
    ("fit(build, (x, y), loss=42)", "fit(): loss must be a function or a Keras loss, loss(y_true, y_pred), or its "
                                    "name"),
    ("fit(build, (x, y), dataset='digits')", "not as options (dataset=)"),
    ("fit(build, (x, y), backend='mwms')", "fit() trains with Horovod; backend='mwms'"),
    ("fit(build, (x, y), validation='on')", "validation='on', but no val_data was given"),
    ("fit(42, (x, y))", "model must be a Keras model (keras.Model or tf_keras.Model) or a function"),
])
def test_bad_input_is_one_line_and_exit_2(call, message):
    """Before TensorFlow is imported, and before the backend starts."""
    code = ("import numpy as np; from hvdtrain.tf import fit\n"
            "def build(): raise AssertionError('not called')\n"
            "x, y = np.zeros((8, 3)), np.arange(8) % 2\n"
            f"{call}\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=base_env(),
                          timeout=60)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stdout, proc.stderr)
    found = ERROR_LINE.fullmatch(lines[0])
    assert found and found["prog"] == "hvdtrain.tf" and message in found["message"], lines[0]
