"""A user's own Horovod TF code, as Horovod's documentation writes it, on the Horovod set-up builds.

Runs under `mpirun -np 2` with TensorFlow 2.21's default Keras 3 (`import keras`) or, with
TF_USE_LEGACY_KERAS=1, Keras 2 (`tf.keras` = tf_keras). Each case prints one line
`CASE <name> rank <r>: <result>` that tests/test_horovod_keras.py reads; a case that raises
prints `CASE <name> rank <r>: error <type>: <first line>`, which is what a user would see.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

LEGACY = os.environ.get("TF_USE_LEGACY_KERAS") == "1"
if LEGACY:
    keras = tf.keras  # tf_keras
else:
    import keras  # noqa: E402

hvd.init()
rank, size = hvd.rank(), hvd.size()
tf.random.set_seed(rank)  # different initial weights per rank: the broadcasts must fix them

digits = load_digits()
x = (digits.images / 16.0).astype("float32").reshape(-1, 64)
y = digits.target.astype("int64")
order = np.random.default_rng(0).permutation(len(y))
x, y = x[order], y[order]
x_val, y_val, x_train, y_train = x[:397], y[:397], x[397:], y[397:]
x_mine, y_mine = x_train[rank::size], y_train[rank::size]  # each rank its own shard


def report(case, result):
    # One write per line: print's separate newline lets mpirun's tagged output run lines together.
    sys.stdout.write(f"CASE {case} rank {rank}: {result}\n")
    sys.stdout.flush()


def make_model():
    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                             keras.layers.Dense(10)])


def accuracy(model):
    """Validation accuracy over all ranks, each digit counted once."""
    xs, ys = x_val[rank::size], y_val[rank::size]
    correct = np.sum(np.argmax(model(xs, training=False), axis=1) == ys)
    totals = hvd.allreduce(tf.constant([correct, len(ys)], tf.float64), op=hvd.Sum).numpy()
    return totals[0] / totals[1]


def spread(variables):
    """The largest difference between ranks, over every element of these variables."""
    flat = tf.concat([tf.reshape(tf.convert_to_tensor(v), [-1]) for v in variables], 0)
    everyone = hvd.allgather(flat[None, :]).numpy()
    return float(np.max(np.abs(everyone - everyone[0])))


def batches(steps, batch=32):
    rng = np.random.default_rng(rank)
    for _ in range(steps):
        pick = rng.integers(0, len(y_mine), batch)
        yield x_mine[pick], y_mine[pick]


def tape_case(partial):
    model = make_model()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = keras.optimizers.SGD(0.05 * size, momentum=0.9)
    local = model.layers[-1] if partial else None

    @tf.function
    def step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        if partial:
            tape = hvd.PartialDistributedGradientTape(tape, local_layers=[local])
        else:
            tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    shared = [v for v in model.variables if not partial or all(v is not w for w in local.weights)]
    for i, (images, labels) in enumerate(batches(150)):
        step(images, labels)
        if i == 0:  # after the first step, once the optimizer has its variables
            hvd.broadcast_variables(shared, root_rank=0)  # Keras variables, as users pass them
            if not partial:  # (a local layer keeps its own momentum)
                variables = opt.variables  # a list in Keras 3, a method in Keras 2
                hvd.broadcast_variables(variables() if callable(variables) else variables, root_rank=0)
    result = f"accuracy {accuracy(model):.4f} shared_spread {spread(shared):.3g}"
    if partial:
        result += f" local_spread {spread(local.weights):.3g}"
    return result


def fit_case(momentum_correction, jit_compile=False):
    import horovod.tensorflow.keras as hvd_keras
    model = make_model()
    opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.05 * size, momentum=0.9))
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=jit_compile)
    callbacks = [hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd_keras.callbacks.MetricAverageCallback(),
                 hvd_keras.callbacks.LearningRateWarmupCallback(
                     initial_lr=0.05 * size, warmup_epochs=2, momentum_correction=momentum_correction)]
    history = model.fit(x_mine, y_mine, batch_size=32, epochs=4, callbacks=callbacks, verbose=0)
    lr = float(np.asarray(history.history["lr"][-1]))
    # MetricAverageCallback: every rank's logged loss is the mean over ranks, so they agree.
    loss_spread = spread([tf.constant([history.history["loss"][-1]], tf.float32)])
    return (f"accuracy {accuracy(model):.4f} shared_spread {spread(model.variables):.3g} "
            f"lr {lr:.4g} loss_spread {loss_spread:.3g}")


def sync_batch_norm_case():
    layer = hvd.SyncBatchNormalization(momentum=0.0)  # moving stats = the last batch's stats
    data = tf.constant(np.random.default_rng(rank).normal(3.0 * rank, 1.0 + rank, (64, 4)), tf.float32)
    layer(data, training=True)
    everyone = hvd.allgather(data).numpy()
    expected_mean, expected_var = everyone.mean(0), everyone.var(0)
    mean = np.asarray(layer.moving_mean)
    var = np.asarray(layer.moving_variance)
    error = max(np.max(np.abs(mean - expected_mean)), np.max(np.abs(var - expected_var)))
    return f"stats_error {error:.3g} rank_mean {data.numpy().mean():.3g}"


CASES = {
    "tape": lambda: tape_case(partial=False),
    "partial": lambda: tape_case(partial=True),
    "fit": lambda: fit_case(momentum_correction=False),
    "fit_momentum_correction": lambda: fit_case(momentum_correction=True),
    "fit_xla": lambda: fit_case(momentum_correction=False, jit_compile=True),
    "sync_batch_norm": sync_batch_norm_case,
}
for name in sys.argv[1:] or CASES:
    try:
        report(name, CASES[name]())
    except Exception as error:  # what the user would read, on one line
        report(name, f"error {type(error).__name__}: {str(error).splitlines()[0]}")
sys.stdout.write(f"DONE rank {rank} keras {'2 (tf_keras)' if LEGACY else keras.version()}\n")
