"""What the TF trainer trains, whoever names it: the data (built once the backend has started and
placed TensorFlow's devices), a function that builds the model with the loop's Keras, and the
loss. The command line's built-in names and the objects given to `hvdtrain.tf.fit` both become
one `TFWorkload`; the trainer (hvdtrain/tf/train.py) names no model or dataset.

    workload = from_config(cfg)                      # python -m hvdtrain.tf
    workload = given(model, train, val, loss, ...)   # hvdtrain.tf.fit (hvdtrain/tf/api.py)

Importing this module imports no framework: fit() checks its arguments here before it chooses
the Keras (hvdtrain/tf/keras_compat.py), and a tf.data.Dataset is read only when one is given
(TensorFlow is imported then already).
"""
from __future__ import annotations

import dataclasses
import sys
import zlib
from typing import Callable

import numpy as np

from hvdtrain import plugins
from hvdtrain.errors import UsageError
from hvdtrain.result_file import sample_unit

CROSS_ENTROPY = "cross_entropy"  # the default loss: cross-entropy of logits, with accuracy reported
KERAS_PACKAGES = ("keras", "tf_keras")  # Keras 3, and Keras 2 (what --loop fit runs on)
READ_BATCH = 4096  # a tf.data.Dataset is read into arrays this many elements at a time


@dataclasses.dataclass
class TFWorkload:
    data: Callable[..., object]   # (rank's threads, uint8=False) -> hvdtrain.tf.data.TFData (build_data's uint8)
    build_model: Callable[[object, object], object]  # (keras, TFData) -> a Keras model, built
    loss: Callable | None = None              # loss(y_true, y_pred) (Keras' order); None: cross-entropy
    fingerprint: str | None = None            # of the data given to fit(): every rank must have the same
    sample_unit: str = "img"                  # what the rates count (hvdtrain.result_file.sample_unit)


def from_config(cfg) -> TFWorkload:
    """The command line's built-in dataset, and its built-in model or the user's (--model
    FILE.py:FUNCTION, a function of no arguments returning a Keras model; --loss FILE.py:FUNCTION,
    loss(y_true, y_pred)). The user's files are imported here, after the loop's Keras was chosen."""
    from hvdtrain.tf.data import build_data
    from hvdtrain.tf.models import build_model

    loss = None if cfg.loss == CROSS_ENTROPY else plugins.load(cfg.loss, "--loss")
    if plugins.is_reference(cfg.model):
        function = plugins.load(cfg.model, "--model")

        def build(keras, d):
            x, y = d.samples(2)
            return user_model(function, cfg.model, (x, y), loss, None if loss is not None else d.num_classes - 1,
                              who="--model")(keras, d)
    else:
        def build(keras, d):
            return build_model(keras, cfg.model, d.in_channels, d.num_classes, d.image_size)
    return TFWorkload(data=lambda threads, uint8=False: build_data(cfg, threads, uint8), build_model=build, loss=loss)


def given(model, model_name: str, train: tuple, val: tuple | None, loss) -> TFWorkload:
    """fit()'s workload: its model (or model function), its arrays (as_arrays) and loss."""
    def data(threads, uint8=False):  # arrays: as given
        from hvdtrain.tf.data import arrays_data

        return arrays_data(train, val, threads)
    max_label = int(train[1].max()) if loss is None else None
    return TFWorkload(data, user_model(model, model_name, train, loss, max_label), loss,
                      fingerprint(*train, *(val or ())), sample_unit(train[0].shape[1:]))


# ---------------------------------------------------------------------- fit()'s arguments
def keras_of(model):
    """The Keras package (module) whose Model `model` is, or None when it is no Keras model. Only
    a package already imported can have made it."""
    for name in KERAS_PACKAGES:
        package = sys.modules.get(name)
        if package is not None and isinstance(model, package.Model):
            return package
    return None


def choose_loop(loop: str | None, model_keras_name: str | None) -> str:
    """The loop for a model of the Keras package named (None: a function, not built yet). Not
    given: `fit` for a tf_keras (Keras 2) model, the custom loop otherwise (the command line's
    default). The fit loop runs on tf_keras only (Horovod 0.28.1's Keras layer is Keras 2); the
    custom loop runs on either."""
    if loop is None:
        return "fit" if model_keras_name == "tf_keras" else "custom"
    if loop not in ("fit", "custom"):
        raise UsageError(f"fit(): loop must be 'fit' or 'custom' (got {loop!r})")
    if loop == "fit" and model_keras_name == "keras":
        raise UsageError("fit(): loop='fit' runs on Keras 2 (tf_keras: Horovod 0.28.1's Keras layer needs it), and "
                         "this model is a Keras 3 model: build it with tf_keras (keras = "
                         "hvdtrain.tf.keras_compat.select('fit'), before TensorFlow is imported), or use loop='custom'")
    return loop


def named_loss(name: str, keras, what: str = "loss="):
    """A loss named as model.compile takes it ('mse', 'sparse_categorical_crossentropy'), as
    keras.losses.get resolves it in the loop's Keras."""
    try:
        return keras.losses.get(name)
    except Exception as err:  # noqa: BLE001 - the user's setting, in one line
        raise UsageError(f"fit(): {what} {name!r}, which {keras.__name__} does not know "
                         f"({type(err).__name__}: {err})") from None


def compiled_loss(model, keras):
    """The loss `model` was compiled with (a name resolved by its Keras), or None."""
    loss = getattr(model, "loss", None)
    if loss is None or (isinstance(loss, (dict, list, tuple)) and not loss):  # tf_keras: {} when compiled without
        return None
    if isinstance(loss, str):
        return named_loss(loss, keras, "the model is compiled with loss")
    if not callable(loss):
        raise UsageError(f"fit(): the model is compiled with a {type(loss).__name__} of losses; hvdtrain trains one "
                         "loss of one output: pass it as loss=")
    return loss


def loss_name(loss) -> str:
    """How configurations, checkpoints and results name a loss."""
    return CROSS_ENTROPY if loss is None else plugins.describe(loss)


def data_name(data) -> str:
    """How they name what fit() was given, as module:Name: "tensorflow.data:Dataset" (whatever
    pipeline made it), or the type of the inputs of (x, y) arrays ("numpy:ndarray")."""
    if is_tf_dataset(data):
        return "tensorflow.data:Dataset"
    if isinstance(data, (tuple, list)) and data:
        return plugins.describe(data[0])
    return plugins.describe(data)


def is_tf_dataset(data) -> bool:
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(data, tf.data.Dataset)


def batched_by(data) -> str | None:
    """The batch size of the batch() in a tf.data pipeline, as text ("16", "?"), found through its
    inputs (a map or prefetch after it); None when it has none, or an unbatch() after it.
    (tf.data keeps each stage's input as `_input_dataset`: its structure, not a public API, so
    anything unexpected counts as no batch.)"""
    stage = data
    for _ in range(100):
        name = type(stage).__name__
        if "Unbatch" in name:
            return None
        if name.endswith("BatchDataset"):  # batch, padded_batch, a parallel batch
            try:
                return str(int(stage._batch_size))
            except Exception:  # noqa: BLE001 - a size not known here
                return "?"
        stage = getattr(stage, "_input_dataset", None)
        if stage is None:
            return None
    return None


def _read_dataset(data, what: str) -> tuple:
    """An unbatched tf.data.Dataset of (input, target) pairs, read once into two arrays."""
    tf = sys.modules["tensorflow"]
    batch = batched_by(data)
    if batch is not None:
        # Read as it is, each batch would count as one sample; unbatched quietly, its batch size
        # would be replaced by fit()'s batch_size unsaid. (image_dataset_from_directory batches by 32.)
        raise UsageError(f"{what} is batched (a batch() in its pipeline, batches of {batch}): give it unbatched "
                         f"({what.split(': ')[-1]}.unbatch()) and the batch size to fit() (batch_size={batch}, per rank): "
                         "hvdtrain batches each rank's share itself")
    spec = data.element_spec
    if not isinstance(spec, tuple) or len(spec) != 2 or not all(isinstance(s, tf.TensorSpec) for s in spec):
        raise UsageError(f"{what} must give (input, target) pairs of tensors; its elements are {spec}")
    if data.cardinality() == tf.data.INFINITE_CARDINALITY:
        raise UsageError(f"{what} is infinite (repeat()?); give fit() one pass over the data: hvdtrain runs the "
                         "epochs itself")
    xs, ys = [], []
    try:
        for x, y in data.batch(READ_BATCH).as_numpy_iterator():
            xs.append(x)
            ys.append(y)
    except Exception as err:  # noqa: BLE001 - the user's pipeline, in one line
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise UsageError(f"{what} cannot be read ({type(err).__name__}: {first}); give it unbatched, as "
                         "(input, target) pairs of one shape") from None
    if not xs:
        raise UsageError(f"{what} is empty")
    return np.concatenate(xs), np.concatenate(ys)


def as_arrays(data, what: str, class_labels: bool) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) of `data`: numpy arrays (x, y), or an unbatched tf.data.Dataset of
    (input, target) pairs read into arrays (it must fit in memory). float64 is taken as float32
    (Keras' float); with class_labels (the cross-entropy loss), targets are integer labels, as int64."""
    if is_tf_dataset(data):
        x, y = _read_dataset(data, what)
    elif isinstance(data, (tuple, list)) and len(data) == 2:
        try:
            x, y = np.asarray(data[0]), np.asarray(data[1])
        except Exception as err:  # noqa: BLE001 - whatever the user gave, in one line
            raise UsageError(f"{what}: cannot make arrays of (x, y) ({type(err).__name__}: {err})") from None
    else:
        kind = f"a {len(data)}-{type(data).__name__}" if isinstance(data, (tuple, list)) else \
            f"a {type(data).__module__}.{type(data).__name__}"
        raise UsageError(f"{what} must be numpy arrays (x, y) or an unbatched tf.data.Dataset of (input, target) "
                         f"pairs; got {kind}")
    if x.ndim == 0 or y.ndim == 0:
        raise UsageError(f"{what}: x and y must be arrays of samples (got shapes {x.shape} and {y.shape})")
    if len(x) != len(y):
        raise UsageError(f"{what}: x has {len(x)} samples and y {len(y)}")
    if not len(x):
        raise UsageError(f"{what} is empty")
    for name, a in (("x", x), ("y", y)):
        if a.dtype.kind not in "biuf":
            raise UsageError(f"{what}: {name} holds {a.dtype} values, not numbers")
    x = x.astype(np.float32) if x.dtype == np.float64 else x
    if class_labels:
        if y.ndim == 2 and y.shape[1] == 1:
            y = y[:, 0]
        if y.ndim != 1 or y.dtype.kind not in "biu" or (len(y) and y.min() < 0):
            raise UsageError(f"{what}: without loss=, the targets are class labels for the cross-entropy: integers "
                             f">= 0, one per sample (got {y.dtype} of shape {y.shape}); give loss= for other targets")
        y = y.astype(np.int64)
    else:
        y = y.astype(np.float32) if y.dtype == np.float64 else y
    return np.ascontiguousarray(x), np.ascontiguousarray(y)


def check_alike(train: tuple, val: tuple | None) -> None:
    """Validation samples shaped and typed as training samples."""
    if val is None:
        return
    for name, a, b in (("x", train[0], val[0]), ("y", train[1], val[1])):
        if a.shape[1:] != b.shape[1:] or a.dtype != b.dtype:
            raise UsageError(f"fit(): val_data's {name} is {b.dtype} of samples {b.shape[1:]}, train_data's "
                             f"{a.dtype} of samples {a.shape[1:]}")


def fingerprint(*arrays) -> str:
    """A checksum of arrays (their shapes, types and bytes): equal on every rank that was given
    the same samples in the same order."""
    crc = 0
    for a in arrays:
        if a is None:
            continue
        crc = zlib.crc32(f"{a.dtype.str}{a.shape}".encode(), crc)
        crc = zlib.crc32(memoryview(np.ascontiguousarray(a)).cast("B"), crc)
    return f"{crc:08x}"


def check_labels(max_label: int, outputs_shape, who: str = "fit()") -> None:
    """The cross-entropy's labels index the model's outputs (logits, one per class)."""
    loss, data = ("loss=", "train_data") if who == "fit()" else ("--loss", "the training set")
    if len(outputs_shape) != 2:
        raise UsageError(f"{who}: without {loss}, the model gives logits of shape (batch, classes) for the "
                         f"cross-entropy; it gives {tuple(outputs_shape)}; give {loss} for other outputs")
    if max_label >= outputs_shape[1]:
        raise UsageError(f"{who}: {data}'s labels go up to {max_label}, but the model gives {outputs_shape[1]} "
                         "outputs per sample (logits, one per class)")


def user_model(model, model_name: str, train: tuple, loss, max_label: int | None, who: str = "fit()"):
    """build_model for fit(): the model given, or built now by the function given (every rank
    seeded alike before), checked to be of the loop's Keras, built by a call on two training
    samples, with the loss tried on them: a wrong model or loss is one line now, not a traceback
    inside the first step."""
    x, y = train[0][:2], train[1][:2]

    def build(keras, data):
        cli = who != "fit()"
        built = model if keras_of(model) is not None else \
            plugins.call(model, model_name, "--model" if cli else "fit(): model")
        if keras_of(built) is not keras:
            got = (f"a {keras_of(built).__name__} model" if keras_of(built) else
                   f"a {type(built).__module__}.{type(built).__name__}, not a Keras model")
            loops = ("--loop fit runs on tf_keras, --loop custom on Keras 3 (import keras in your file)" if cli else
                     "loop='fit' runs on tf_keras; the custom loop on the model's Keras")
            raise UsageError(f"{who}: model {model_name} gave {got}; this loop runs on {keras.__name__} ({loops})")
        if built is not model and loss is None and compiled_loss(built, keras) is not None:
            raise UsageError(f"{who}: the model {model_name} builds is compiled with a loss: pass it as "
                             + ("--loss FILE.py:FUNCTION" if cli else
                                "loss= (a model built before fit() gives its compiled loss itself)"))
        outputs = _tried(lambda: built(x, training=False), f"model {model_name}", who)
        if loss is None:
            check_labels(max_label, tuple(outputs.shape), who)
        else:
            _tried(lambda: loss(y, outputs), f"the loss {loss_name(loss)}", who)
        return built
    return build


def _tried(call, what: str, who: str = "fit()"):
    try:
        return call()
    except Exception as err:  # noqa: BLE001 - the user's model or loss, in one line
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise UsageError(f"{who}: {what} failed on two training samples ({type(err).__name__}: {first})") from None
