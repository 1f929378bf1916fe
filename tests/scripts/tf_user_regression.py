"""A user's own Keras regression for hvdtrain.tf.fit: a model built before fit() (with BatchNorm
statistics and dropout), data given as an unbatched tf.data.Dataset of (input, target) pairs,
and a loss of its own, in Keras' (y_true, y_pred) order.

    mpirun -np 2 python tests/scripts/tf_user_regression.py fit '{"epochs": 4}'      # tf_keras, model.fit
    mpirun -np 2 python tests/scripts/tf_user_regression.py custom '{"epochs": 4}'   # Keras 3, compiled loss

`fit`: a tf_keras model, its loss given as loss= (fit picks loop "fit" from the model's Keras).
`custom`: a Keras 3 model compiled with loss "mse", no loss= (fit uses the compiled loss).
"""
import json
import sys

import numpy as np

from hvdtrain.tf import keras_compat

which = sys.argv[1]
options = {"epochs": 4, "batch_size": 32, "threads_per_rank": 1,
           **json.loads(sys.argv[2] if len(sys.argv) > 2 else "{}")}
keras = keras_compat.select(which)  # tf_keras for "fit", Keras 3 for "custom"
import tensorflow as tf  # noqa: E402

import hvdtrain.tf  # noqa: E402


def regression(n: int, seed: int):
    """y = x . w + noise, x in R^8."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 8)).astype(np.float32)
    y = (x @ (np.arange(1.0, 9.0) / 14) + 0.1 * rng.standard_normal(n)).astype(np.float32)[:, None]
    return tf.data.Dataset.from_tensor_slices((x, y))


def mse(y_true, y_pred):
    return tf.reduce_mean(tf.square(y_true - y_pred), axis=-1)  # per sample, as Keras' losses


keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32), keras.layers.BatchNormalization(),
                          keras.layers.ReLU(), keras.layers.Dropout(0.1), keras.layers.Dense(1)])
if which == "custom":
    model.compile(optimizer="sgd", loss="mse")  # its loss is used; its optimizer is not
    result = hvdtrain.tf.fit(model, regression(512, 0), regression(203, 1), **options)
else:
    result = hvdtrain.tf.fit(model, regression(512, 0), regression(203, 1), loss=mse, **options)
final = result["final"]
print(f"final val loss: {final['val_loss']:.4f} over {final['val_count']} samples", flush=True)
