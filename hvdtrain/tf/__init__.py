"""Horovod data-parallel training on TensorFlow 2.21: `python -m hvdtrain.tf` (Keras `fit` or a
GradientTape loop). Importing this package imports no framework; TensorFlow is loaded by
hvdtrain.tf.train once hvdtrain.tf.keras_compat has chosen the Keras version.

    mpirun -np 2 python -m hvdtrain.tf --model mnist_cnn --dataset digits --loop custom --epochs 8

Your own Keras `model.fit`: `hvdtrain.tf.start()` first, then
`model.fit(..., callbacks=hvdtrain.tf.callbacks(model, ...))` (hvdtrain/tf/keras_callbacks.py; loaded
when first used, example tf_examples/keras_own_fit.py); on image files, `hvd.image_data(...)` gives
the trainer's pipeline as tf.data datasets for it (example tf_examples/keras_own_fit_images.py).

Your own GradientTape loop: `job = hvdtrain.tf.start_tape_loop(seed=0)` first, then `job.resume`,
`job.tape(tape)`, `job.dataset`, `job.step_done`, `job.should_stop`, `job.save`, `job.finish`
(hvdtrain/tf/tape_loop.py; loaded when first used, example tf_examples/tape_loop_digits.py).

Your own Keras model trained by hvdtrain's trainer: `hvdtrain.tf.fit(model, (x, y), (x_val, y_val),
loss=..., **options)` (hvdtrain/tf/api.py; example tf_examples/keras_model_fit.py).
"""


def __getattr__(name):
    if name == "fit":  # hvdtrain.tf.fit(model, train_data, val_data, loss=..., **options): hvdtrain/tf/api.py
        from hvdtrain.tf.api import fit

        return fit
    if name in ("start", "callbacks"):  # your own model.fit: hvdtrain/tf/keras_callbacks.py
        from hvdtrain.tf import keras_callbacks

        return getattr(keras_callbacks, name)
    if name == "start_tape_loop":  # your own GradientTape loop: hvdtrain/tf/tape_loop.py
        from hvdtrain.tf import tape_loop

        return tape_loop.start
    raise AttributeError(f"module 'hvdtrain.tf' has no attribute '{name}'")
