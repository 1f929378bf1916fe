"""hvdtrain for your own Keras model and data, in one call:

    import hvdtrain.tf
    result = hvdtrain.tf.fit(build_model, (x, y), (x_val, y_val), epochs=10, batch_size=64,
                             checkpoint_dir="ckpt")

    srun python train.py             # or mpirun -np 4 python train.py; horovodrun

`fit` runs the command line's trainer (hvdtrain/tf/train.py) on what it is given: every rank
starts from rank 0's weights, each trains on its shard of the data, checkpoints are written by
rank 0 and resumed, stop signals checkpoint and requeue, the watchdog ends a hung job, validation
is exact; the options are the command line's (`python -m hvdtrain.tf --help`) under their field
names. Bad input ends every rank with the command line's one line and exit status 2.

What it takes, and what it decides:
- model: a Keras model, or a function of no arguments that builds one. The function is called
  once hvdtrain has set this rank's threads and GPU, seeded alike on every rank. A model built
  before fit() (as a tf.data.Dataset made before it) has started TensorFlow: its thread pools
  stay TensorFlow's (the log says so), and on a node with GPUs it is refused, since its
  variables sit on every rank's first GPU: give a function there.
- loop: "custom" (a GradientTape step, Horovod's DistributedGradientTape) runs on the model's
  Keras, 3 or 2 (tf_keras); "fit" (Keras model.fit with horovod.tensorflow.keras) runs on tf_keras
  only, because Horovod 0.28.1's Keras layer is Keras 2: a Keras 3 model with loop="fit" is
  refused in one line. Not given: "fit" for a tf_keras model, "custom" for any other. A function
  builds with the loop's Keras (`keras = hvdtrain.tf.keras_compat.select(loop)` before TensorFlow
  is imported gives it: tf_keras for "fit", Keras 3 for "custom").
- data: numpy arrays (x, y), or an unbatched tf.data.Dataset of (input, target) pairs, which is
  read into arrays once: data that fits in memory (streaming pipelines are not handled yet).
  Inputs as the model takes them; float64 becomes float32. Every rank must pass the same samples
  in the same order (compared by checksum at the start): hvdtrain shuffles and shards them.
- loss: `loss(y_true, y_pred)` in Keras' order (a Keras loss object or function), giving the
  samples' losses or their mean. Not given: the loss a built model was compiled with, else the
  cross-entropy of logits against integer labels, the only case with accuracy reported (a loss of
  yours gives train_acc and val_acc None).
- optimizer: hvdtrain's, from the options, as on the command line (the `your-model` recipe: AdamW,
  LR 1e-3 per rank x ranks, constant; Adam under loop="fit", the same update at weight decay 0,
  since tf_keras' legacy optimizers have no AdamW). A compiled model's optimizer and metrics are
  not used; the fit loop compiles the model again.
- backend: Horovod (the command line's comparison backend, mwms, is not offered here).
"""
from __future__ import annotations

import dataclasses
import gc
import sys

from hvdtrain import plugins
from hvdtrain.config import config_from_values
from hvdtrain.errors import UsageError, report_and_exit
from hvdtrain.tf import workload as wl

PROG = "hvdtrain.tf"


def fit(model, train_data, val_data=None, *, loss=None, **options) -> dict:
    """Train `model` (a Keras model, or a function of no arguments building one) on `train_data`
    (numpy arrays (x, y), or an unbatched tf.data.Dataset of (input, target) pairs), validating on
    `val_data` after each epoch if given. `loss(y_true, y_pred)`: see the module's docstring.
    `options`: the command line's, e.g. epochs=, batch_size= (per rank), base_lr=, optimizer=,
    loop=, checkpoint_dir=, result_json=. Returns what the result file holds (config, history,
    per-rank throughput and checksums)."""
    try:
        given = sorted({"model", "dataset", "loss"} & set(options))
        if given:
            raise UsageError(f"fit() takes the model, the data and the loss as arguments, not as options "
                             f"({', '.join(given)}=)")
        cfg, keras, workload = prepare(model, train_data, val_data, loss, options)
        from hvdtrain.tf.train import run  # imports tensorflow: after the Keras is chosen

        result = run(cfg, keras, workload)
    except UsageError as err:
        report_and_exit(err, PROG)
    gc.collect()  # the trainer's cycles go while the interpreter is whole (hvdtrain/cli.py)
    return result


def prepare(model, train_data, val_data, loss, options: dict):
    """(config, the loop's Keras, workload) for fit()'s arguments; every check that needs no
    other rank is made here, before the backend starts."""
    from hvdtrain.tf import keras_compat

    model_keras = wl.keras_of(model)
    if model_keras is None and not callable(model):
        raise UsageError(f"fit(): model must be a Keras model (keras.Model or tf_keras.Model) or a function of no "
                         f"arguments building one; got a {type(model).__module__}.{type(model).__name__}")
    if model_keras is not None and model_keras.backend.backend() != "tensorflow":
        raise UsageError(f"fit(): the model is a Keras model on the {model_keras.backend.backend()} backend; "
                         "hvdtrain.tf trains TensorFlow's (KERAS_BACKEND=tensorflow, Keras 3's default)")
    loop = wl.choose_loop(options.pop("loop", None), model_keras and model_keras.__name__)
    if loss is None and model_keras is not None:
        loss = wl.compiled_loss(model, model_keras)
    if loss is not None and not callable(loss) and not isinstance(loss, str):
        raise UsageError(f"fit(): loss must be a function or a Keras loss, loss(y_true, y_pred), or its name as "
                         f"model.compile takes it ('mse'); got a {type(loss).__name__}")
    names = {"model": plugins.describe(model), "dataset": wl.data_name(train_data)}
    cfg = config_from_values("tf", {**names, **options, "loop": loop})
    if cfg.backend != "horovod":
        raise UsageError(f"fit() trains with Horovod; backend={cfg.backend!r} (the command line's comparison "
                         "backend) is not offered for your own model")
    changes = {"loss": wl.loss_name(loss)}  # kept in checkpoints: a resume with another loss is refused
    if loop == "fit" and options.get("optimizer") is None and cfg.optimizer == "adamw" and not cfg.weight_decay:
        changes["optimizer"] = "adam"  # the recipe's AdamW at weight decay 0: the same update
    if val_data is None:
        if cfg.validation == "on":
            raise UsageError("fit(): validation='on', but no val_data was given")
        changes["validation"] = "off"
    cfg = dataclasses.replace(cfg, **changes)
    started = model_keras is not None or any(wl.is_tf_dataset(d) for d in (train_data, val_data))
    if started and sys.modules["tensorflow"].config.list_physical_devices("GPU"):
        raise UsageError("fit(): on a node with GPUs, give a function that builds the model, and arrays: a model "
                         "(or tf.data.Dataset) made before fit() started TensorFlow, which placed its variables "
                         "on the first GPU of every rank before hvdtrain could give each rank its own")
    train = wl.as_arrays(train_data, "fit(): train_data", class_labels=loss is None)
    val = wl.as_arrays(val_data, "fit(): val_data", class_labels=loss is None) if val_data is not None else None
    wl.check_alike(train, val)
    # The loop's Keras; before TensorFlow is imported, when the model is still to be built.
    keras = keras_compat.select(loop) if loop == "fit" or model_keras is None else model_keras
    if isinstance(loss, str):  # 'mse', as model.compile takes it: that Keras's function, named by it
        loss = wl.named_loss(loss, keras)
        cfg = dataclasses.replace(cfg, loss=wl.loss_name(loss))
    return cfg, keras, wl.given(model, names["model"], train, val, loss)
