"""Your own Keras model, compile and `model.fit`, on image files (a folder of class folders or
hvdtrain's shards) read by hvdtrain's pipeline: this rank's share of each epoch, hvdtrain's crops
(the windows torch and DALI take for the same sample), exact validation, and the callbacks of
keras_own_fit.py (checkpoints, resume, stop signals, the watchdog).

    mpirun -np 2 python tf_examples/keras_own_fit_images.py --data-dir $DATA_DIR --checkpoint-dir ckpt
    srun --mpi=pmix -n 2 python tf_examples/keras_own_fit_images.py --data-dir $SCRATCH/imagenet-shards

No images at hand? The real 8x8 digits as JPEG files (scikit-learn's, no download):

    python -c "from hvdtrain.data.datasets import write_digits_imagefolder as w; w('digits-jpeg', 1000, 1000, fmt='jpeg')"

Stated result on those (1,400 training and 397 validation images of 32 px), 2 ranks, the default
10 epochs: rank 0 prints `val_accuracy=...` >= 0.5 (0.65 on 2026-11-27, and the same on a rerun:
crops and order are functions of the seed, epoch and sample; hvdtrain's crops, down to 8 % of a
digit, make the task hard and the last epochs' figures swing between 0.50 and 0.70), and every
rank `rank R: weights checksum ...`, the same on all. Run it again and it resumes where the newest
checkpoint left off.
Every hvdtrain line is marked `# hvdtrain:`.
"""
import argparse
import hashlib

import hvdtrain.tf  # hvdtrain:

parser = argparse.ArgumentParser(description="a Keras model of your own, fit on image files read by hvdtrain")
parser.add_argument("--data-dir", required=True, help="train/ and val/ class folders, or shards")
parser.add_argument("--image-size", type=int, default=32)
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--batch-size", type=int, default=16, help="per rank")
parser.add_argument("--lr", type=float, default=0.05, help="for one rank; hvdtrain scales it by the number of ranks")
parser.add_argument("--checkpoint-dir", default="ckpt-keras-own-fit-images")
args = parser.parse_args()

# hvdtrain: before TensorFlow builds anything: Keras 2 for tf.keras, hvd.init(), this rank's GPU and threads.
hvd = hvdtrain.tf.start(seed=0)
import tf_keras as keras  # noqa: E402  # hvdtrain: Keras 2, not `import keras`

# hvdtrain: the files as the trainer reads them: this rank's batches, seeded crops, normalised floats (NHWC).
images = hvd.image_data(args.data_dir, image_size=args.image_size, batch_size=args.batch_size, epochs=args.epochs)

model = keras.Sequential([
    keras.Input((args.image_size, args.image_size, 3)),
    keras.layers.Conv2D(32, 3, padding="same", use_bias=False),
    keras.layers.BatchNormalization(momentum=0.9),
    keras.layers.ReLU(),
    keras.layers.Conv2D(64, 3, strides=2, padding="same", use_bias=False),
    keras.layers.BatchNormalization(momentum=0.9),
    keras.layers.ReLU(),
    keras.layers.Conv2D(128, 3, strides=2, padding="same", use_bias=False),
    keras.layers.BatchNormalization(momentum=0.9),
    keras.layers.ReLU(),
    keras.layers.GlobalAveragePooling2D(),
    keras.layers.Dense(len(images.classes)),
])
optimizer = hvd.optimizer(keras.optimizers.legacy.SGD(args.lr, momentum=0.9))  # hvdtrain: gradients averaged
model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])

# hvdtrain: rank 0's weights (the newest checkpoint's, if any), averaged metrics, LR x ranks, checkpoints.
callbacks = hvdtrain.tf.callbacks(model, checkpoint_dir=args.checkpoint_dir, warmup_epochs=1)
history = model.fit(images.train(callbacks.initial_epoch), steps_per_epoch=images.steps_per_epoch,  # hvdtrain:
                    epochs=args.epochs, initial_epoch=callbacks.initial_epoch, callbacks=callbacks,
                    validation_data=images.val, verbose=2 if hvd.is_rank0 else 0)

if hvd.is_rank0 and history.history.get("val_accuracy"):  # averaged over ranks by the callbacks
    print(f"val_accuracy={history.history['val_accuracy'][-1]:.4f} ({images.val_samples} samples on rank 0 of "
          f"{hvd.world_size})", flush=True)
checksum = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()[:16]
print(f"rank {hvd.rank}: weights checksum {checksum}", flush=True)
