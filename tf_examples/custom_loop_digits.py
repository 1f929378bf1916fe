"""A custom GradientTape training loop with Horovod on the 8x8 handwritten digits: the shape of
Horovod's examples/tensorflow2/tensorflow2_mnist.py, on TensorFlow 2.21 and its Keras 3.

    mpirun -np 2 python tf_examples/custom_loop_digits.py
    srun --mpi=pmix -n 2 python tf_examples/custom_loop_digits.py

Stated result: rank 0 prints `val_accuracy=...` >= 0.95 (all 397 validation digits, each
counted once) after the default 300 steps on 2 ranks. Every Horovod line is marked `# Horovod:`.
"""
import argparse

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

parser = argparse.ArgumentParser(description="GradientTape loop on the digits with Horovod")
parser.add_argument("--steps", type=int, default=300, help="steps in all (each rank runs all of them)")
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
parser.add_argument("--lr", type=float, default=0.05, help="for one rank; scaled by the number of ranks")
parser.add_argument("--log-interval", type=int, default=50)
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
           .repeat()
           .shuffle(1000, seed=hvd.rank())
           .batch(args.batch_size))

model = keras.Sequential([
    keras.Input((8, 8, 1)),
    keras.layers.Conv2D(32, 3, activation="relu"),
    keras.layers.Conv2D(64, 3, activation="relu"),
    keras.layers.MaxPooling2D(2),
    keras.layers.Dropout(0.25),
    keras.layers.Flatten(),
    keras.layers.Dense(128, activation="relu"),
    keras.layers.Dropout(0.5),
    keras.layers.Dense(10),
])
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
# Horovod: scale the learning rate by the number of ranks: the global batch grows with them.
opt = keras.optimizers.SGD(learning_rate=args.lr * hvd.size(), momentum=0.9)


def tf_variables(variables):
    # Horovod's tape and broadcast take tf.Variables; Keras 3 wraps each in its own Variable.
    return [v.value for v in variables]


@tf.function
def training_step(images, labels):
    with tf.GradientTape() as tape:
        loss = loss_fn(labels, model(images, training=True))

    # Horovod: wrap the tape; its gradients come back averaged over ranks.
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, tf_variables(model.trainable_variables))
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss


for step, (images, labels) in enumerate(dataset.take(args.steps)):
    loss = training_step(images, labels)
    if step == 0:
        # Horovod: broadcast the initial variable states from rank 0 to all other processes, so
        # that every rank continues from the same weights; after the first step, once the
        # optimizer has created its variables. (Outside the tf.function: a `first_batch`
        # argument, as in Horovod's example, would trace the whole step twice.)
        hvd.broadcast_variables(tf_variables(model.weights), root_rank=0)
        hvd.broadcast_variables(tf_variables(opt.variables), root_rank=0)
    if step == 0 or (step + 1) % args.log_interval == 0:
        # Horovod: the mean loss over ranks, after the first step and at log intervals only (a
        # collective costs a round trip).
        loss = hvd.allreduce(loss, name="loss")
        if hvd.rank() == 0:
            print(f"step {step + 1}: loss {float(loss):.4f}", flush=True)

# Horovod: each rank scores its own slice of the validation set; summing (correct, count) over
# ranks counts every validation digit exactly once.
x_mine, y_mine = x_val[hvd.rank()::hvd.size()], y_val[hvd.rank()::hvd.size()]
correct = np.sum(np.argmax(model(x_mine, training=False), axis=1) == y_mine)
totals = hvd.allreduce(tf.constant([correct, len(y_mine)], dtype=tf.float64), op=hvd.Sum, name="val")
correct, count = totals.numpy()
if hvd.rank() == 0:
    print(f"val_accuracy={correct / count:.4f} ({int(count)} samples, {hvd.size()} ranks)", flush=True)
