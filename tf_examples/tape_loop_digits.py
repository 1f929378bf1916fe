"""Your own GradientTape training loop on N ranks: a single-process TensorFlow loop on the 8x8
handwritten digits plus the lines marked `# hvdtrain:` (hvdtrain/tf/tape_loop.py: Horovod
underneath, Keras 3). custom_loop_digits.py is the same loop written with Horovod's own calls.

    python tf_examples/tape_loop_digits.py --checkpoint-dir /tmp/tape             # 1 process
    mpirun -np 2 python tf_examples/tape_loop_digits.py --checkpoint-dir /tmp/tape
    srun --mpi=pmix -n 2 python tf_examples/tape_loop_digits.py --checkpoint-dir /tmp/tape

It checkpoints after each epoch and, run again, resumes from the newest checkpoint. SIGUSR1 or
SIGTERM (Slurm's time-limit warning, scancel) stops every rank at the same step with a checkpoint
of where it was (Slurm's SIGUSR1 also requeues the job); the next run goes on from that step and
ends with the weights an unstopped run has. Prints `epoch N: train loss L`, then
`val_accuracy=A (397 samples, R ranks)` (>= 0.9 after the default 8 epochs on 2 ranks) and each
rank's `weights checksum`. Needs hvdtrain importable (bash scripts/setup.sh, or PYTHONPATH=.).
"""
import argparse

import numpy as np
from sklearn.datasets import load_digits

import hvdtrain.tf  # hvdtrain:
from hvdtrain.result_file import checksum_arrays

parser = argparse.ArgumentParser(description="your own GradientTape loop on the digits, with hvdtrain")
parser.add_argument("--epochs", type=int, default=8)
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
parser.add_argument("--lr", type=float, default=0.05, help="for one rank; scaled by the number of ranks")
parser.add_argument("--checkpoint-dir", default="tape_loop_checkpoints")
parser.add_argument("--checkpoint-every", default=None,
                    help="also checkpoint mid-epoch, every N steps or '30m' (a crash then costs that much)")
args = parser.parse_args()

# hvdtrain: before TensorFlow builds anything: hvd.init(), this rank's GPU and CPU threads, the stop
# signals, the watchdog, the same seed on every rank.
job = hvdtrain.tf.start_tape_loop(seed=0, checkpoint_every=args.checkpoint_every)
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

digits = load_digits()  # 1797 images, 8x8, values 0..16
x = (digits.images / 16.0).astype("float32")[..., None]
y = digits.target.astype("int64")
order = np.random.default_rng(0).permutation(len(y))
x, y = x[order], y[order]
x_val, y_val, x_train, y_train = x[:397], y[:397], x[397:], y[397:]

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
# hvdtrain: the learning rate x the ranks: the global batch grows with them.
optimizer = keras.optimizers.SGD(learning_rate=args.lr * job.world_size, momentum=0.9)
start_epoch = job.resume(args.checkpoint_dir, model, optimizer)  # hvdtrain: newest checkpoint, rank 0's variables


@tf.function
def train_step(images, labels):
    with tf.GradientTape() as tape:
        loss = loss_fn(labels, model(images, training=True))
    tape = job.tape(tape)  # hvdtrain: gradients averaged over ranks (Horovod's DistributedGradientTape)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


for epoch in range(start_epoch, args.epochs):
    loss_sum = seen = 0.0
    for images, labels in job.dataset((x_train, y_train), args.batch_size, epoch):  # hvdtrain: this rank's shard
        loss = train_step(images, labels)
        loss_sum, seen = loss_sum + float(loss) * len(labels), seen + len(labels)
        job.step_done()  # hvdtrain: the position and the watchdog's heartbeat
        if job.should_stop():  # hvdtrain: a stop signal on any rank: every rank stops at this step
            break
    job.save(args.checkpoint_dir, model, optimizer)  # hvdtrain: rank 0 writes where the loop is
    if job.stopped_by:  # hvdtrain
        break
    train_loss = job.average(loss_sum, seen)  # hvdtrain: the mean over every rank's samples
    if job.is_rank0:  # hvdtrain: rank 0 prints
        print(f"epoch {epoch + 1}: train loss {train_loss:.4f}", flush=True)

if not job.stopped_by:  # hvdtrain: after a stop signal, no time to lose
    x_mine, y_mine = job.shard(x_val, y_val)  # hvdtrain: each validation digit on one rank
    correct = np.sum(np.argmax(model(x_mine, training=False), axis=1) == y_mine)
    right, count = job.sum([correct, len(y_mine)])  # hvdtrain: over all ranks: every digit once
    if job.is_rank0:  # hvdtrain
        print(f"val_accuracy={right / count:.4f} ({int(count)} samples, {job.world_size} ranks)", flush=True)
    checksum = checksum_arrays(v.numpy() for v in model.weights)
    print(f"rank {job.rank}: weights checksum {checksum[:16]}", flush=True)
job.finish()  # hvdtrain: requeue after SIGUSR1, Horovod shut down
