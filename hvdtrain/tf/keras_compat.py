"""Which Keras this process uses: decided here, once, before TensorFlow is imported.

TensorFlow >= 2.16 makes `tf.keras` and `import keras` Keras 3. Horovod 0.28.1's Keras layer
(`horovod.tensorflow.keras`) was written for Keras 2: it does `from keras import backend as K`
and drives the optimizer through Keras 2 APIs (`K.get_value(optimizer.lr)`), so under Keras 3 it
fails with `AttributeError`s. Keras 2 lives on as the `tf_keras` package (tf-keras); TensorFlow
routes `tf.keras` to it when TF_USE_LEGACY_KERAS=1 is set before `import tensorflow`.

    from hvdtrain.tf import keras_compat
    keras = keras_compat.select("fit")          # Keras 2 (tf_keras), before tensorflow is imported
    hvd = keras_compat.import_horovod_keras()   # horovod.tensorflow.keras, working

`--loop custom` needs no Horovod Keras code (only DistributedGradientTape), so it runs on the
current Keras 3.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import sys
from types import ModuleType

from hvdtrain.errors import UsageError

_LEGACY_ENV = "TF_USE_LEGACY_KERAS"
_INSTALL = "pip install tf-keras==<your TensorFlow version>"
_WHY_FIT = "--loop fit needs Keras 2 because Horovod 0.28.1's Keras layer uses Keras 2 APIs"


def _tf_keras_is_legacy() -> bool:
    """Whether `tf.keras` resolves to tf_keras (only meaningful once tensorflow is imported)."""
    import tensorflow as tf

    return tf.keras.Model.__module__.startswith("tf_keras.")


def legacy_keras_requested() -> bool:
    return os.environ.get(_LEGACY_ENV) in ("1", "true", "True")


def select(loop: str) -> ModuleType:
    """The Keras package the given loop runs on. For "fit" that is Keras 2 (tf_keras), routed
    into `tf.keras` too; call this before anything imports tensorflow."""
    if loop != "fit":
        if legacy_keras_requested():
            # The user chose Keras 2 for the process; the custom loop works on it too.
            return _import_tf_keras(f"{_LEGACY_ENV}=1 asks for Keras 2")
        with _optional_packages_hidden():
            import keras

        return keras
    # TensorFlow reads this at import (it preloads one Keras' optimizers) and again when
    # tf.keras is first touched.
    os.environ[_LEGACY_ENV] = "1"
    tf_keras = _import_tf_keras(_WHY_FIT)
    if not _tf_keras_is_legacy():
        raise UsageError(f"{_WHY_FIT}, but tf.keras was already bound to Keras 3 in this process; "
                         f"set {_LEGACY_ENV}=1 in the environment before Python starts")
    return tf_keras


# Packages Keras 3 (and TensorFlow's own legacy Keras, which `import tensorflow` loads) import when
# installed, each behind `try: ... except ImportError`, for what the trainer never uses:
# scikit-learn for Keras' scikit-learn wrappers, matplotlib for its image-gallery plots, SciPy for
# sparse inputs to TF 1's Keras. hvdtrain has them installed (the digits' data file, the
# comparison's plots). Measured here per rank start: scikit-learn 0.7 CPU-s, matplotlib 0.4,
# SciPy about 0.3. Keras 3 loads SciPy lazily where it does use it (its `module_utils`), so that
# still works afterwards.
_OPTIONAL_FOR_KERAS = ("sklearn", "matplotlib", "scipy")


@contextlib.contextmanager
def _optional_packages_hidden():
    """While Keras is imported, `import sklearn` (matplotlib, scipy) fails, so Keras takes its "not
    installed" branch; afterwards the process imports them normally. One already imported stays."""
    hidden = [name for name in _OPTIONAL_FOR_KERAS if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # an ImportError for `import name` (the import system's rule)
    try:
        yield
    finally:
        for name in hidden:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]


def _import_tf_keras(why: str) -> ModuleType:
    try:
        import tf_keras
    except ImportError as err:
        raise UsageError(f"{why}, and TensorFlow's Keras 2 package tf-keras is not importable ({err}); "
                         f"{_INSTALL}") from None
    import tensorflow as tf

    tf_minor, keras_minor = tf.__version__.split(".")[:2], tf_keras.__version__.split(".")[:2]
    if tf_minor != keras_minor:
        raise UsageError(f"tf-keras {tf_keras.__version__} does not match TensorFlow {tf.__version__}; "
                         f"{_INSTALL}")
    return tf_keras


def import_horovod_keras() -> ModuleType:
    """`horovod.tensorflow.keras`, imported while `keras` names tf_keras.

    Horovod binds `K = keras.backend` at import time, so the mapping is needed only for the
    import; it is undone afterwards so that other code's `import keras` is unaffected.
    """
    tf_keras = _import_tf_keras("horovod.tensorflow.keras needs Keras 2")
    if not _tf_keras_is_legacy():
        raise UsageError("horovod.tensorflow.keras needs tf.keras to be Keras 2: call "
                         "keras_compat.select('fit') before importing tensorflow")
    saved = {name: sys.modules[name] for name in ("keras", "keras.backend") if name in sys.modules}
    sys.modules["keras"], sys.modules["keras.backend"] = tf_keras, tf_keras.backend
    try:
        hvd_keras = importlib.import_module("horovod.tensorflow.keras")
    except ImportError as err:
        raise UsageError(f"horovod.tensorflow.keras is not importable ({str(err).splitlines()[0]}); "
                         "Horovod must be built with HOROVOD_WITH_TENSORFLOW=1 (bash scripts/setup.sh)") from None
    finally:
        for name in ("keras", "keras.backend"):
            if name in saved:
                sys.modules[name] = saved[name]
            else:
                sys.modules.pop(name, None)
    if not hasattr(hvd_keras.callbacks.K, "get_value"):
        raise UsageError("horovod.tensorflow.keras was imported earlier against Keras 3 "
                         "(its Keras backend has no get_value); import it only through "
                         "hvdtrain.tf.keras_compat, or set TF_USE_LEGACY_KERAS=1")
    return hvd_keras
