"""Keras `model.fit` with Horovod on the 8x8 handwritten digits: the shape of Horovod's
examples/tensorflow2/tensorflow2_keras_mnist.py, working on TensorFlow 2.21 (needs tf-keras).

    mpirun -np 2 python tf_examples/keras_fit_digits.py
    srun --mpi=pmix -n 2 python tf_examples/keras_fit_digits.py

Stated result: rank 0 prints `val_accuracy=...` >= 0.95 (all 397 validation digits, each
counted once) after the default 10 epochs on 2 ranks. Every Horovod line is marked `# Horovod:`.
"""
import argparse
import os
import sys

# Horovod: this script keeps Horovod's Keras 2 model.fit path, as many existing scripts do:
# tf.keras routed to tf-keras (Keras 2) before TensorFlow is imported, and `import keras` too,
# which an unpatched Horovod 0.28.1's own `from keras import backend` needs. The Horovod that
# hvdtrain's set-up builds also runs Keras 3 (tf_examples/README.md, "Horovod under Keras 3").
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import tf_keras  # noqa: E402

sys.modules["keras"] = tf_keras

import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

parser = argparse.ArgumentParser(description="Keras fit on the digits with Horovod")
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
parser.add_argument("--lr", type=float, default=0.05, help="for one rank; scaled by the number of ranks")
parser.add_argument("--checkpoint-dir", default=None, help="rank 0 saves the weights here every epoch")
parser.add_argument("--log-dir", default=None, help="rank 0 writes TensorBoard logs here")
args = parser.parse_args()

# Horovod: initialize Horovod.
hvd.init()

# Horovod: pin one GPU per process, if there are GPUs.
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

digits = load_digits()  # 1797 images, 8x8, values 0..16
x = (digits.images / 16.0).astype("float32")[..., None]
y = digits.target.astype("int64")
order = np.random.default_rng(0).permutation(len(y))
x, y = x[order], y[order]
x_val, y_val, x_train, y_train = x[:397], y[:397], x[397:], y[397:]

# Horovod: each rank trains on its own shard of the training set.
dataset = (tf.data.Dataset.from_tensor_slices((x_train, y_train))
           .shard(hvd.size(), hvd.rank())
           .shuffle(1000, seed=hvd.rank())
           .batch(args.batch_size, drop_remainder=True)
           .repeat())
# Horovod: the ranks share the epoch, so each runs 1/size of its steps.
steps_per_epoch = len(y_train) // hvd.size() // args.batch_size

model = tf.keras.Sequential([
    tf.keras.Input((8, 8, 1)),
    tf.keras.layers.Conv2D(32, 3, activation="relu"),
    tf.keras.layers.Conv2D(64, 3, activation="relu"),
    tf.keras.layers.MaxPooling2D(2),
    tf.keras.layers.Dropout(0.25),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(128, activation="relu"),
    tf.keras.layers.Dropout(0.5),
    tf.keras.layers.Dense(10),
])

# Horovod: scale the learning rate by the number of ranks: the global batch grows with them.
scaled_lr = args.lr * hvd.size()
# The legacy optimizer: Horovod's LR callbacks drive it through Keras 2's optimizer API.
opt = tf.keras.optimizers.legacy.SGD(learning_rate=scaled_lr, momentum=0.9)
# Horovod: average the gradients over ranks.
opt = hvd.DistributedOptimizer(opt)

model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              optimizer=opt, metrics=["accuracy"])

callbacks = [
    # Horovod: broadcast initial variable states from rank 0 to all other processes, so that
    # every rank starts from the same weights.
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    # Horovod: average the metrics over ranks at the end of every epoch.
    hvd.callbacks.MetricAverageCallback(),
    # Horovod: ramp the learning rate up from args.lr to scaled_lr over the first epoch; a large
    # learning rate at the start is what hurts large-batch training (Goyal et al., 2017).
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=1, verbose=1),
]
# Horovod: checkpoints and TensorBoard logs on rank 0 only, so that ranks do not overwrite each other.
if hvd.rank() == 0 and args.checkpoint_dir:
    callbacks.append(tf.keras.callbacks.ModelCheckpoint(
        os.path.join(args.checkpoint_dir, "weights-{epoch:02d}"), save_weights_only=True))
if hvd.rank() == 0 and args.log_dir:
    callbacks.append(tf.keras.callbacks.TensorBoard(args.log_dir))

# Horovod: progress lines on rank 0 only.
model.fit(dataset, steps_per_epoch=steps_per_epoch, epochs=args.epochs, callbacks=callbacks,
          verbose=2 if hvd.rank() == 0 else 0)

# Horovod: each rank scores its own slice of the validation set; summing (correct, count) over
# ranks counts every validation digit exactly once.
x_mine, y_mine = x_val[hvd.rank()::hvd.size()], y_val[hvd.rank()::hvd.size()]
correct = np.sum(np.argmax(model.predict(x_mine, verbose=0), axis=1) == y_mine)
correct, count = hvd.allreduce(np.array([correct, len(y_mine)], dtype=np.float64), op=hvd.Sum)
if hvd.rank() == 0:
    print(f"val_accuracy={correct / count:.4f} ({int(count)} samples, {hvd.size()} ranks)", flush=True)
