"""`--loader dali` for TensorFlow: NVIDIA DALI decodes the image files, through its TensorFlow
plugin (DALIDatasetWithInputs), on the GPU (nvJPEG) or in its CPU mode (device_id=None), which runs
the same graph: the test suite runs it under mpirun. The graph is torch's (hvdtrain/data/dali_graph.py).

    pip install nvidia-dali-cuda130
    pip install --no-build-isolation nvidia-dali-tf-plugin-cuda130   # built for the installed TF
    srun python -m hvdtrain.tf --model resnet50 --dataset shards --data-dir $SHARDS --loader dali

What stays hvdtrain's, as with tf.data: which samples each rank reads in which order
(TFData.train_order), each sample's window and flip (TensorFlow's ops, data._window_from_draws:
the same windows torch and DALI under torch take), exact validation. tf.data reads the files
(shards many members a call) and packs each sample into one uint8 vector, a HEADER (the window,
4 float32 relative to the image's size; the label, int64; the flip, uint8) then the file's bytes:
DALI takes each input from a dataset of its own, and separate datasets would read every file
once per input. The graph slices the vector apart.
"""
from __future__ import annotations

import tensorflow as tf

from hvdtrain.data import dali_graph
from hvdtrain.errors import UsageError

HEADER = 25  # bytes: window 16, label 8, flip 1


def require():
    """DALI's modules and its TensorFlow plugin, or one line saying how to install them."""
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        raise UsageError("--loader dali needs NVIDIA DALI and its TensorFlow plugin, which are not installed: "
                         "pip install nvidia-dali-cuda130, then pip install --no-build-isolation "
                         "nvidia-dali-tf-plugin-cuda130 (or use the default loader)") from None
    try:
        import nvidia.dali.plugin.tf as dali_tf
    except ImportError as err:
        raise UsageError(f"--loader dali needs DALI's TensorFlow plugin, built for this TensorFlow "
                         f"({tf.__version__}): pip install --no-build-isolation nvidia-dali-tf-plugin-cuda130 "
                         f"({str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__})") from None
    from nvidia.dali import fn, pipeline_def, types

    return fn, pipeline_def, types, dali_tf


def pack(data, label, window, flip):
    """One sample as DALI's input: HEADER then the file's bytes (data, a tf.string). window:
    (top, left, height, width) relative to the image's size (a training crop or validation's
    centre), flip 0 or 1."""
    window = tf.cast(window, tf.float32)
    return tf.concat([tf.reshape(tf.bitcast(window, tf.uint8), [16]),
                      tf.reshape(tf.bitcast(tf.cast(label, tf.int64), tf.uint8), [8]),
                      tf.reshape(tf.cast(flip, tf.uint8), [1]), tf.io.decode_raw(data, tf.uint8)], 0)


def batches(samples: tf.data.Dataset, pack, *, count: int, batch_size: int, drop_remainder: bool,
            image_size: int, threads: int) -> tf.data.Dataset:
    """(images NHWC float32 normalised, labels int64) batches of the `count` samples that `samples`
    gives (i, or (i, draws) for training), in that order, decoded by DALI. pack(part): part's
    samples as DALI's input (the pipeline's packed samples: hvdtrain/tf/data.py). DALI makes full
    batches only: a short last one (validation) comes from a second DALI dataset of that size."""
    full = count // batch_size * batch_size
    parts = [(samples.take(full), batch_size)] if full else []
    if full < count and not drop_remainder:
        parts.append((samples.skip(full), count - full))
    out = None
    for part, size in parts:
        ds = _dali_dataset(pack(part), size, image_size, threads)
        out = ds if out is None else out.concatenate(ds)
    if out is None:  # no sample: an empty dataset of the same structure
        empty = (tf.zeros([0, image_size, image_size, 3]), tf.zeros([0], tf.int64))
        out = tf.data.Dataset.from_tensors(empty).take(0)
    return out


def _dali_dataset(packed: tf.data.Dataset, batch_size: int, size: int, threads: int) -> tf.data.Dataset:
    fn, pipeline_def, types, dali_tf = require()
    gpu = bool(tf.config.list_logical_devices("GPU"))  # the rank's one GPU (hvdtrain.tf.devices.pin_gpu)

    @pipeline_def(batch_size=batch_size, num_threads=max(1, threads), device_id=0 if gpu else None, seed=0)
    def graph():
        sample = fn.external_source(name="packed", dtype=types.UINT8)
        window = fn.reinterpret(fn.slice(sample, 0, 16, axes=[0]), dtype=types.FLOAT, shape=[4])
        label = fn.reinterpret(fn.slice(sample, 16, 8, axes=[0]), dtype=types.INT64, shape=[])
        mirror = fn.reshape(fn.cast(fn.slice(sample, 24, 1, axes=[0]), dtype=types.INT32), shape=[])
        files = fn.slice(sample, HEADER, 1 << 30, axes=[0], out_of_bounds_policy="trim_to_shape")
        images = dali_graph.images(fn, types, size=size, gpu=gpu, layout="HWC", files=files, window=window,
                                   mirror=mirror)
        return images, (label.gpu() if gpu else label)

    device = "/gpu:0" if gpu else "/cpu:0"
    with tf.device(device):
        # DALI's inputs are placed where the DALI dataset is (its documentation): on a GPU, copied there.
        inputs = packed.apply(tf.data.experimental.copy_to_device(device)) if gpu else packed
        return dali_tf.experimental.DALIDatasetWithInputs(
            pipeline=graph(), input_datasets={"packed": dali_tf.experimental.Input(inputs, batch=False)},
            batch_size=batch_size, output_dtypes=(tf.float32, tf.int64),
            output_shapes=((batch_size, size, size, 3), (batch_size,)), device_id=0 if gpu else None)
