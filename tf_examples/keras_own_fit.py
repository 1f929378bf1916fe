"""Your own Keras model, compile and `model.fit`, with hvdtrain's callbacks: on the 8x8
handwritten digits (hvdtrain.data.datasets.digits_split(): scikit-learn's, no download).

    mpirun -np 2 python tf_examples/keras_own_fit.py --checkpoint-dir ckpt
    srun --mpi=pmix -n 2 python tf_examples/keras_own_fit.py --checkpoint-dir ckpt

Stated result: rank 0 prints `val_accuracy=...` >= 0.9 (all 397 validation digits) after the
default 8 epochs on 2 ranks, and every rank `rank R: weights checksum ...`, the same on all.
Rank 0 writes a checkpoint each epoch (and every N steps or minutes with --checkpoint-every); run
it again and it resumes where the newest left off (SIGUSR1 or SIGTERM: every rank stops at the
same batch, with a checkpoint; a resume in the middle of an epoch reads its first batches again
without training on them). Every hvdtrain line
is marked `# hvdtrain:`; without them this is a single-process Keras script.
"""
import argparse
import hashlib

import hvdtrain.tf  # hvdtrain:
from hvdtrain.data.datasets import digits_split  # hvdtrain: the example's data (yours: any arrays)

parser = argparse.ArgumentParser(description="a Keras model of your own, fit with hvdtrain's callbacks")
parser.add_argument("--epochs", type=int, default=8)
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
parser.add_argument("--lr", type=float, default=0.05, help="for one rank; hvdtrain scales it by the number of ranks")
parser.add_argument("--checkpoint-dir", default="ckpt-keras-own-fit")
parser.add_argument("--checkpoint-every", default=None,
                    help="also checkpoint in the middle of epochs: every N steps (2000) or a time (30m, 90s)")
args = parser.parse_args()

# hvdtrain: before TensorFlow builds anything: Keras 2 for tf.keras (Horovod's Keras layer needs it),
# hvd.init(), this rank's GPU and CPU threads, the stop signals, the same seed on every rank.
hvd = hvdtrain.tf.start(seed=0)
import tf_keras as keras  # noqa: E402  # hvdtrain: Keras 2 (what tf.keras now is), not `import keras`

data = digits_split()  # 1400 training and 397 validation digits, (N, 1, 8, 8) in [0, 1]
x_train, x_val = data.x_train.transpose(0, 2, 3, 1), data.x_val.transpose(0, 2, 3, 1)  # channels last
shard = slice(hvd.rank, None, hvd.world_size)  # hvdtrain: this rank's share of the training digits
x_train, y_train = x_train[shard], data.y_train[shard]

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
optimizer = hvd.optimizer(keras.optimizers.legacy.SGD(args.lr, momentum=0.9))  # hvdtrain: gradients averaged
model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])

# hvdtrain: rank 0's weights on every rank (the newest checkpoint's, if any), metrics averaged over
# ranks, LR x ranks after a 1-epoch warm-up, a checkpoint each epoch, stop signals, the watchdog.
callbacks = hvdtrain.tf.callbacks(model, checkpoint_dir=args.checkpoint_dir, warmup_epochs=1,
                                  checkpoint_every=args.checkpoint_every)
model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs, validation_data=(x_val, data.y_val),
          initial_epoch=callbacks.initial_epoch, callbacks=callbacks,  # hvdtrain: where to start, the callbacks
          verbose=2 if hvd.is_rank0 else 0)  # hvdtrain: progress from rank 0

loss, accuracy = model.evaluate(x_val, data.y_val, verbose=0)  # every rank: the same weights, all 397 digits
if hvd.is_rank0:  # hvdtrain: rank 0 reports
    print(f"val_accuracy={accuracy:.4f} ({len(data.y_val)} samples, {hvd.world_size} ranks)", flush=True)
checksum = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()[:16]
print(f"rank {hvd.rank}: weights checksum {checksum}", flush=True)
