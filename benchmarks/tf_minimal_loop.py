"""The smallest data-parallel TF training loop: the reference hvdtrain.tf is measured against.

    mpirun -np 2 python benchmarks/tf_minimal_loop.py --backend horovod --model resnet18 --threads 1
    mpirun -np 2 python benchmarks/tf_minimal_loop.py --backend mwms --model resnet18 --threads 1

Horovod's own TF2 synthetic benchmark in a few lines: one constant batch per rank (no input
pipeline unless --input dataset), a tf.function step with `hvd.DistributedGradientTape` (or
`strategy.run` under MultiWorkerMirroredStrategy), SGD with momentum, the model of hvdtrain.tf
(`hvdtrain.tf.models`). Each rank prints `MINIMAL rank=R img/s=X` over the timed steps.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", choices=("horovod", "mwms"), default="horovod")
    p.add_argument("--model", default="resnet18")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="TF intra- and inter-op threads")
    p.add_argument("--input", choices=("constant", "dataset", "pool"), default="constant",
                   help="dataset: the batch goes through tf.data (repeat + prefetch); pool: each batch "
                        "gathered from 64 images by tf.data, as hvdtrain's synthetic data is")
    a = p.parse_args()

    if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
        import tf_keras as keras
    else:
        import keras
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(a.threads)
    tf.config.threading.set_inter_op_parallelism_threads(a.threads)
    from hvdtrain.tf.devices import tf_variable
    from hvdtrain.tf.models import build_model

    classes = 1000
    if a.backend == "horovod":
        import horovod.tensorflow as hvd

        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        strategy = None
    else:
        from hvdtrain.cluster.env import ClusterEnv
        from hvdtrain.tf.backend_mwms import cluster_resolver

        env = ClusterEnv.from_environ()
        rank, size = env.rank, env.world_size
        strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=cluster_resolver(env))

    keras.utils.set_random_seed(0)
    scope = strategy.scope() if strategy else contextlib.nullcontext()
    with scope:
        model = build_model(keras, a.model, 3, classes, a.image_size)
        opt = keras.optimizers.SGD(learning_rate=0.01, momentum=0.9)
    x = tf.random.uniform([a.batch_size, a.image_size, a.image_size, 3])
    y = tf.random.uniform([a.batch_size], 0, classes, dtype=tf.int64)
    sources = [tf_variable(v) for v in model.trainable_variables]
    scale = 1.0 / size if strategy else 1.0  # tf.distribute sums gradients, Horovod averages

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
            scaled = loss * scale
        if not strategy:
            tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(scaled, sources)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def step(x, y):
        return strategy.run(replica_step, args=(x, y)) if strategy else replica_step(x, y)

    if not strategy:
        opt.build(model.trainable_variables)
        hvd.broadcast_variables([tf_variable(v) for v in model.variables + list(opt.variables)], root_rank=0)
    if a.input == "dataset":
        batches = iter(tf.data.Dataset.from_tensors((x, y)).repeat().prefetch(tf.data.AUTOTUNE))
    elif a.input == "pool":
        pool = tf.random.uniform([64, a.image_size, a.image_size, 3])
        index = tf.data.Dataset.range(1 << 30).batch(a.batch_size)
        batches = iter(index.map(lambda i: (tf.gather(pool, i % 64), tf.gather(y, i % a.batch_size)))
                       .prefetch(tf.data.AUTOTUNE))
    else:
        batches = iter(lambda: (x, y), None)

    def run(n):
        for _ in range(n):
            bx, by = next(batches)
            loss = step(bx, by)
            (loss.values[0] if hasattr(loss, "values") else loss).numpy()

    run(a.warmup_steps)
    start = time.perf_counter()
    run(a.steps)
    elapsed = time.perf_counter() - start
    print(f"MINIMAL rank={rank} img/s={a.batch_size * a.steps / elapsed:.3f}", flush=True)
    if not strategy:
        hvd.shutdown()


if __name__ == "__main__":
    main()
