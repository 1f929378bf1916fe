"""A Keras model of your own on the real 8x8 handwritten digits (scikit-learn's, no download),
trained by hvdtrain.tf.fit: the single-process script with one call in place of `model.fit`
(hvdtrain's lines are marked `# hvdtrain:`).

    python tf_examples/keras_model_fit.py                                  # 1 process
    mpirun -np 2 python tf_examples/keras_model_fit.py                     # 2 ranks, the custom loop
    mpirun -np 2 python tf_examples/keras_model_fit.py '{"loop": "fit"}'   # Keras model.fit (tf_keras)
    srun --mpi=pmix -n 2 python tf_examples/keras_model_fit.py             # in a Slurm allocation

Prints `final val accuracy: 0.9xxx over 397 samples` (>= 0.9 expected on 2 ranks). The argument
is fit's options as JSON, e.g. '{"epochs": 3, "checkpoint_dir": "ckpt", "result_json": "r.json"}'.
"""
import json
import sys

from hvdtrain.data.datasets import digits_split
from hvdtrain.tf import keras_compat

options = {"epochs": 8, "batch_size": 32, "optimizer": "adam", "base_lr": 0.003, "threads_per_rank": 1,
           **(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {})}
# hvdtrain: the Keras the loop runs on, chosen before TensorFlow is imported: Keras 3 for the
# custom loop (a GradientTape step), tf_keras (Keras 2) for loop "fit", as Horovod's Keras layer needs.
keras = keras_compat.select(options.get("loop", "custom"))
import hvdtrain.tf  # noqa: E402


def build_model():
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dropout(0.25),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),  # logits: hvdtrain's default loss is the cross-entropy of logits
    ])


split = digits_split()  # 1400 training and 397 validation digits, (N, 1, 8, 8) in [0, 1]
x_train, x_val = split.x_train.transpose(0, 2, 3, 1), split.x_val.transpose(0, 2, 3, 1)  # channels-last

# hvdtrain: a function that builds the model (called once each rank has its threads and GPU, every
# rank seeded alike); each rank trains its shard, from rank 0's weights; validation is exact.
result = hvdtrain.tf.fit(build_model, (x_train, split.y_train), (x_val, split.y_val), **options)
final = result["final"]
print(f"final val accuracy: {final['val_acc']:.4f} over {final['val_count']} samples", flush=True)
