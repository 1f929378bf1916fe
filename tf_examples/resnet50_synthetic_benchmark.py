"""Synthetic-data ResNet-50 training throughput with Horovod: the shape of Horovod's
examples/tensorflow2/tensorflow2_synthetic_benchmark.py, on TensorFlow 2.21 and its Keras 3,
reporting the images per second measured on every rank rather than rank 0's times size.

    mpirun -np 2 python tf_examples/resnet50_synthetic_benchmark.py
    srun --mpi=pmix -n 2 python tf_examples/resnet50_synthetic_benchmark.py --image-size 64
    mpirun -np 2 python tf_examples/resnet50_synthetic_benchmark.py --image-size 32 --batch-size 4 \
        --num-warmup-batches 2 --num-batches-per-iter 2 --num-iters 2     # a quick check on a laptop
    mpirun -np 2 python tf_examples/resnet50_synthetic_benchmark.py --model MobileNetV2   # keras.applications

Stated result: rank 0 prints `rank R: X img/sec` for every rank (each X > 0) and
`total: Y img/sec on N ranks` with Y the sum. Every Horovod line is marked `# Horovod:`.
"""
import argparse
import timeit

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser(description="Synthetic ResNet-50 benchmark with Horovod")
parser.add_argument("--model", default="ResNet50", help="a keras.applications model, as in Horovod's example")
parser.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to fp16 for the allreduce")
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
parser.add_argument("--image-size", type=int, default=224)
parser.add_argument("--num-warmup-batches", type=int, default=10, help="steps before timing starts")
parser.add_argument("--num-batches-per-iter", type=int, default=10, help="steps per timed iteration")
parser.add_argument("--num-iters", type=int, default=10, help="timed iterations")
args = parser.parse_args()

# Horovod: initialize Horovod.
hvd.init()

# Horovod: pin one GPU per process, if there are GPUs.
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

model = getattr(keras.applications, args.model)(weights=None, input_shape=(args.image_size, args.image_size, 3))
opt = keras.optimizers.SGD(learning_rate=0.01)
loss_fn = keras.losses.SparseCategoricalCrossentropy()

data = tf.random.uniform([args.batch_size, args.image_size, args.image_size, 3])
target = tf.random.uniform([args.batch_size, 1], minval=0, maxval=999, dtype=tf.int64)


def tf_variables(variables):
    # Horovod's tape and broadcast take tf.Variables; Keras 3 wraps each in its own Variable.
    return [v.value for v in variables]


@tf.function
def benchmark_step():
    # Horovod: (optional) compression algorithm.
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    with tf.GradientTape() as tape:
        loss = loss_fn(target, model(data, training=True))
    # Horovod: wrap the tape; its gradients come back averaged over ranks.
    tape = hvd.DistributedGradientTape(tape, compression=compression)
    grads = tape.gradient(loss, tf_variables(model.trainable_variables))
    opt.apply_gradients(zip(grads, model.trainable_variables))


def log(msg):
    # Horovod: print on rank 0 only.
    if hvd.rank() == 0:
        print(msg, flush=True)


log(f"Model: {args.model}, batch size {args.batch_size} per rank, image size {args.image_size}, "
    f"{hvd.size()} rank(s), {'cpu' if not gpus else 'gpu'}")
benchmark_step()
# Horovod: broadcast the initial variable states from rank 0 to all other processes, after the
# first step, once the optimizer has created its variables. (Outside the tf.function: a
# `first_batch` argument, as in Horovod's example, would trace the whole step twice.)
hvd.broadcast_variables(tf_variables(model.weights), root_rank=0)
hvd.broadcast_variables(tf_variables(opt.variables), root_rank=0)
log("Running warm-up...")
timeit.timeit(lambda: benchmark_step(), number=args.num_warmup_batches)

log("Running benchmark...")
img_secs = []
for i in range(args.num_iters):
    seconds = timeit.timeit(lambda: benchmark_step(), number=args.num_batches_per_iter)
    img_sec = args.batch_size * args.num_batches_per_iter / seconds
    log(f"Iter #{i}: {img_sec:.1f} img/sec on rank 0")
    img_secs.append(img_sec)

# Horovod: gather every rank's own measurement: a slow rank shows up here, where rank 0's rate
# times the number of ranks would hide it.
per_rank = hvd.allgather(tf.constant([np.mean(img_secs)], dtype=tf.float64), name="img_secs").numpy()
for rank, rate in enumerate(per_rank):
    log(f"rank {rank}: {rate:.1f} img/sec")
log(f"total: {per_rank.sum():.1f} img/sec on {hvd.size()} ranks")
