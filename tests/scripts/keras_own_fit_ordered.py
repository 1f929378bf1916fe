"""A user's own Keras model.fit with hvdtrain's callbacks and an interval checkpoint, written so
that a resume can end with an uninterrupted run's very weights: the training digits in one fixed
order (shuffled once, the same in every run; fit(shuffle=False)) and no layer that draws random
numbers. 1400 digits on 2 ranks, 32 a batch: 22 batches an epoch (the last of 28).

    mpirun -np 2 python tests/scripts/keras_own_fit_ordered.py --checkpoint-dir ckpt --checkpoint-every 5
"""
import argparse
import hashlib

import numpy as np

import hvdtrain.tf
from hvdtrain.data.datasets import digits_split

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--checkpoint-dir", required=True)
parser.add_argument("--checkpoint-every", required=True)
parser.add_argument("--keep", type=int, default=50)
args = parser.parse_args()

hvd = hvdtrain.tf.start(seed=0)
import tf_keras as keras  # noqa: E402

data = digits_split()
order = np.random.default_rng(0).permutation(len(data.y_train))[hvd.rank::hvd.world_size]
x, y = data.x_train.transpose(0, 2, 3, 1)[order], data.y_train[order]

model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(16, 3, activation="relu"),
                          keras.layers.Flatten(), keras.layers.Dense(10)])
model.compile(optimizer=hvd.optimizer(keras.optimizers.legacy.SGD(0.05, momentum=0.9)),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
callbacks = hvdtrain.tf.callbacks(model, checkpoint_dir=args.checkpoint_dir,
                                  checkpoint_every=args.checkpoint_every, keep=args.keep, stop_check_batches=3)
model.fit(x, y, batch_size=32, epochs=args.epochs, shuffle=False, initial_epoch=callbacks.initial_epoch,
          callbacks=callbacks, verbose=2 if hvd.is_rank0 else 0)
checksum = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()[:16]
print(f"rank {hvd.rank}: weights checksum {checksum}", flush=True)
