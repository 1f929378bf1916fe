"""tf.data pipelines built from hvdtrain.data.datasets: the same samples and split as the torch
trainer, images channels-last. No distributed code here: rank and world size are plain numbers.

    data = build_data(cfg)                        # a built-in dataset, an image folder, shards
    data = arrays_data((x, y), (x_val, y_val))    # arrays given to hvdtrain.tf.fit, in memory
    for x, y in data.train(epoch=0, skip_steps=0, rank=0, world_size=2, steps=10): ...

Training: each epoch one permutation of all samples, the same on every rank (seeded by seed and
epoch), of which each rank takes every world_size-th index (from shards: a few shards' samples
per rank, datasets.shard_blocked_order); every rank
runs the same number of full batches (a collective would hang otherwise). Resuming mid-epoch
skips the batches already trained. Validation: `datasets.exact_shard`, every sample on exactly
one rank, no padding; the last batch may be short.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from hvdtrain.data import augment, datasets, parallel_reads, shards
from hvdtrain.tf import dali

# tf.data traces every function given to map() with AutoGraph unless told not to. These branch on
# tensors with tf.cond only (their Python `if`s test Python values): traced as they are, a rank's
# start saves AutoGraph's conversion of them, about 0.8 CPU-s for an image pipeline here.
as_is = tf.autograph.experimental.do_not_convert

PREFETCH_BATCHES = 2  # the next batch is ready while a step runs, and one more for a slow file
# How far ahead of the step being trained a pipeline error can come from: the prefetched batches,
# the one being batched, the parallel map's elements in flight, and Keras fit's own prefetch; and
# the chunk of shard members read in one call (READ_PER_CALL samples, TFData.read_many).
READ_AHEAD_BATCHES = PREFETCH_BATCHES + 4
READ_PER_CALL = 64


def op_error_reason(err: tf.errors.OpError) -> str:
    """A TensorFlow op's error as a short reason: its first line without the function and op names."""
    text = (err.message or type(err).__name__).strip().splitlines()[0]
    text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", text)
    return re.sub(r"\s*\[Op:[^\]]*\].*$", "", text).strip() or type(err).__name__


@dataclass
class TFData:
    """Sample i of a split: load(i). For arrays, images come from a pool indexed i % len(pool)."""
    train_size: int
    val_size: int
    in_channels: int | None  # a built-in dataset's images (None: a user's arrays)
    num_classes: int | None
    image_size: int | None
    load_train: object    # batch of indices -> (images, labels), or one index for files
    load_val: object      # None: no validation set
    per_sample: bool      # files are decoded one by one; arrays are gathered a batch at a time
    threads: int = 1      # the rank's CPU threads: tf.data's own pool gets as many
    files: dict | None = None  # image files: {split: i -> (bytes, where)}, for bad_sample
    sample_shards: np.ndarray | None = None  # shards: each training sample's (see train_order)
    classes: list | None = None  # image files: the class names, in label order
    # (mean, std) in [0, 1] units where the images come as uint8, to be normalised on the device
    # by model_input (build_data's uint8); None: floats, normalised in the map already.
    input_normalization: tuple | None = None
    # Shards: {split: indices -> their members' bytes}, read READ_PER_CALL samples a call into Python
    # (one call per sample cost about 0.1 ms more an image); None: load(i) reads each file itself.
    read_many: dict | None = None
    # What decodes image files: "tf" (this module's map) or "dali" (hvdtrain/tf/dali.py).
    loader: str = "tf"

    def describe(self, split: str, batch_size: int) -> str:
        """The start's line about a split's batches (as the torch trainer's loader plan says it)."""
        files = self.files is not None
        source = ("image files (shards)" if self.read_many else "image files") if files else "tensors in memory"
        decoder = ("DALI" if self.loader == "dali" else "tf.data's map") if self.per_sample else "a gather"
        order = "exact shard" if split == "val" else "shard blocks" if self.sample_shards is not None else "permutation"
        normalised = ("by DALI" if self.per_sample and self.loader == "dali" else "on the device"
                      if self.input_normalization is not None else "in the map" if self.per_sample else "as given")
        crops = "keyed (seed, epoch, sample)" if files and split == "train" else "none"
        return (f"{split} input: {source}, decoded by {decoder} ({self.threads} thread(s)), {order} order (per rank), "
                f"crops {crops}, normalised {normalised}, {batch_size} a batch, prefetch {PREFETCH_BATCHES}")

    def options(self) -> tf.data.Options:
        """tf.data's threads within the rank's share, and no autotuning. By default tf.data
        sizes its own pool by the host's cores, not by the rank's share of them. Autotuning adds
        a model thread whose optimisation period grows towards a minute, and the end of the
        iterator waited for it: 18-19 s at the end of a ResNet-18 epoch on one rank of two,
        counted in the epoch's time while the other rank waited (docs/tf-overhead.md). Fixed
        depths do as well here."""
        options = tf.data.Options()
        options.threading.private_threadpool_size = self.threads
        options.threading.max_intra_op_parallelism = 1
        options.autotune.enabled = False
        return options

    def train_order(self, epoch: int, rank: int, world_size: int, seed: int, seen_before: tuple = ()) -> np.ndarray:
        """This rank's samples of an epoch, in order: every world_size-th of the epoch's permutation;
        from shards, a few shards' samples per rank, as the torch trainer's (datasets.shard_blocked_order).
        After a resize in the epoch's middle, the rank's share of the samples not yet seen
        (seen_before: see checkpoint.Position; datasets.rest_of_epoch)."""
        def orders(size):
            if self.sample_shards is not None:
                return datasets.shard_blocked_orders(self.sample_shards, seed, epoch, size)
            permutation = np.random.default_rng([seed, epoch]).permutation(self.train_size)
            return [permutation[r::size] for r in range(size)]
        if seen_before:
            return datasets.rest_of_epoch(orders, self.train_size, seen_before, world_size)[rank]
        if self.sample_shards is not None:  # this rank's alone: the others' shuffles are not needed
            return datasets.shard_blocked_order(self.sample_shards, seed, epoch, rank, world_size)
        return orders(world_size)[rank]

    def samples(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The first n training samples (images as the model takes them, labels), for trying a
        user's model and loss before the first step."""
        if self.per_sample:
            draws = augment.sample_draws(0, 0, range(n))
            pairs = [self.load_train(tf.constant(i, tf.int64), tf.constant(draws[i])) for i in range(n)]
            x = tf.stack([x for x, _ in pairs])
            return model_input(x, self.input_normalization).numpy(), np.stack([y.numpy() for _, y in pairs])
        x, y = self.load_train(tf.range(n, dtype=tf.int64))
        return x.numpy(), y.numpy()

    def val_order(self, rank: int, world_size: int) -> np.ndarray:
        return np.array(datasets.exact_shard(self.val_size, rank, world_size), dtype=np.int64)

    def train(self, epoch: int, skip_steps: int, rank: int, world_size: int, steps: int,
              batch_size: int, seed: int, seen_before: tuple = ()) -> tf.data.Dataset:
        """The epoch's batches from skip_steps up to steps (exclusive), in the epoch's order."""
        order = self.train_order(epoch, rank, world_size, seed, seen_before)[skip_steps * batch_size:steps * batch_size]
        ds = tf.data.Dataset.from_tensor_slices(order)
        if self.per_sample:
            # Crops and flips a function of (seed, epoch, sample), not of a stream: a run resumed in
            # the middle of an epoch draws what the uninterrupted run drew (hvdtrain/data/augment.py).
            ds = with_draws(ds, seed, tf.constant(epoch, tf.int64))
        return self._load(ds, "train", batch_size, len(order), drop_remainder=True)

    def val(self, rank: int, world_size: int, batch_size: int) -> tf.data.Dataset:
        order = self.val_order(rank, world_size)
        return self._load(tf.data.Dataset.from_tensor_slices(order), "val", batch_size, len(order),
                          drop_remainder=False)

    def crops_check(self, seed: int) -> dict | None:
        """The windows this pipeline's own code (_window_from_draws, TensorFlow's ops) takes from
        the first augment.CROP_CHECK_SAMPLES training images in epoch 0, as {"samples", "digest"}
        (augment.crops_digest): the torch trainer's reports the same where the crops are the
        same. None without image files."""
        if not self.files:
            return None
        samples = min(augment.CROP_CHECK_SAMPLES, self.train_size)
        draws = augment.sample_draws(seed, 0, range(samples))
        windows = []
        for i in range(samples):
            shape = _encoded_shape(tf.constant(self.files["train"](i)[0]))
            windows.append(_window_from_draws(tf.constant(draws[i]), shape[0], shape[1]).numpy().tolist())
        return {"samples": samples, "digest": augment.crops_digest(windows)}

    def bad_sample(self, split: str, indices) -> str | None:
        """The first of these samples (of "train" or "val") whose file cannot be read or decoded, as
        one line naming it; None when all decode (or the data are not files). tf.data's error names
        no file, only the op: the trainer looks here for the one it failed on, among the samples its
        pipeline had read ahead (READ_AHEAD_BATCHES)."""
        if not self.files:
            return None
        for i in indices:
            try:
                data, where = self.files[split](int(i))  # a shard's member checked against its CRC-32
            except datasets.BadSample as err:
                return str(err)
            try:
                tf.io.decode_image(data, channels=3, expand_animations=False)
            except tf.errors.OpError as err:
                return f"cannot read image {where} ({op_error_reason(err)})"
        return None

    def decoded(self, ds, split: str, packed: bool = False) -> tf.data.Dataset:
        """Image files: each element of `ds` (i, or (i, draws) for training) loaded, in parallel by
        the rank's threads, in TensorFlow's ops alone; a shard's bytes read beforehand, many
        samples a call (read_many). packed: not decoded but packed with its window for DALI
        (hvdtrain/tf/dali.py)."""
        load = self._split_loader(split)
        if packed:
            load = load.packed
        if self.read_many is None:
            return ds.map(as_is(load), num_parallel_calls=self.threads)
        read = self.read_many[split]

        def with_bytes(*element):  # a chunk of indices (and their draws): their bytes too
            data = tf.numpy_function(read, [element[0]], tf.string, stateful=False)
            return (*element, tf.ensure_shape(data, [None]))
        ds = ds.batch(READ_PER_CALL).map(as_is(with_bytes)).unbatch()
        return ds.map(as_is(lambda *element: load(*element[:-1], data=element[-1])), num_parallel_calls=self.threads)

    def _split_loader(self, split: str):
        return self.load_train if split == "train" else self.load_val

    def _load(self, ds, split, batch_size, count, drop_remainder):
        if self.per_sample and self.loader == "dali":
            def pack(part):  # a part's samples read, windowed and packed for DALI, here
                return self.decoded(part, split, packed=True).with_options(self.options())
            return dali.batches(ds, pack, count=count, batch_size=batch_size,
                                drop_remainder=drop_remainder, image_size=self.image_size, threads=self.threads)
        if self.per_sample:  # image files
            ds = self.decoded(ds, split).batch(batch_size, drop_remainder=drop_remainder)
        else:
            ds = ds.batch(batch_size, drop_remainder=drop_remainder).map(as_is(self._split_loader(split)))
        return ds.prefetch(PREFETCH_BATCHES).with_options(self.options())


class FitImages:
    """An image folder or shards read as hvdtrain's trainer reads them, for a user's own Keras
    `model.fit` (hvdtrain.tf.start()'s `hvd.image_data`):

        images = hvd.image_data(data_dir, image_size=224, batch_size=64, epochs=90)
        model = build_model(len(images.classes)); model.compile(...)
        callbacks = hvdtrain.tf.callbacks(model, checkpoint_dir="ckpt")
        model.fit(images.train(callbacks.initial_epoch), steps_per_epoch=images.steps_per_epoch,
                  epochs=90, initial_epoch=callbacks.initial_epoch, validation_data=images.val, ...)

    `train(first_epoch)`: this rank's batches of every epoch from `first_epoch` on, in the
    trainer's order (its share of each epoch's permutation; from shards a few shards' samples,
    datasets.shard_blocked_order) with its crops (hvdtrain/data/augment.py: a function of seed, epoch and
    sample, the windows torch and DALI take), as many full batches on every rank; one dataset
    for all epochs (Keras keeps its iterator across epochs when given steps_per_epoch). `val`:
    this rank's exact share of the validation images (each on one rank, none twice; Horovod's
    MetricAverageCallback then averages the ranks' means, exact when the shares are equal, as
    50,000 images on 8 ranks), or None without validation images. Images: normalised floats,
    channels-last."""

    def __init__(self, data_dir: str, *, image_size: int, batch_size: int, rank: int, world_size: int, seed: int,
                 epochs: int, threads: int):
        from types import SimpleNamespace

        from hvdtrain.errors import UsageError

        for name, value, least in (("image_size", image_size, 8), ("batch_size", batch_size, 1),
                                   ("epochs", epochs, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise UsageError(f"image_data(): {name} must be an integer >= {least} (got {value!r})")
        if not isinstance(data_dir, (str, os.PathLike)) or not os.path.isdir(data_dir):
            raise UsageError(f"image_data(): data dir {data_dir!r} is not a directory")
        data_dir = os.fspath(data_dir)
        kind = "shards" if os.path.exists(os.path.join(data_dir, shards.MANIFEST)) else "imagefolder"
        self.data = build_data(SimpleNamespace(dataset=kind, data_dir=data_dir, image_size=image_size), threads)
        self.rank, self.world_size, self.seed, self.epochs = rank, world_size, seed, epochs
        self.batch_size = batch_size
        self.classes = list(self.data.classes)
        self.steps_per_epoch = len(self.data.train_order(0, rank, world_size, seed)) // batch_size
        if self.steps_per_epoch == 0:
            raise UsageError(f"image_data(): {self.data.train_size} training images make no full batch of "
                             f"{batch_size} on each of {world_size} rank(s)")
        self.val = self.data.val(rank, world_size, batch_size) if self.data.val_size else None
        self.val_samples = len(self.data.val_order(rank, world_size))  # this rank's

    def train(self, first_epoch: int = 0) -> tf.data.Dataset:
        data, seed, n = self.data, self.seed, self.steps_per_epoch * self.batch_size

        def epoch_samples(epoch):  # (sample, its draws) of this rank's share of the epoch, in the trainer's order
            def order(e):
                return data.train_order(int(e), self.rank, self.world_size, seed)[:n].astype(np.int64)
            samples = tf.ensure_shape(tf.numpy_function(order, [epoch], tf.int64, stateful=False), [n])
            return with_draws(tf.data.Dataset.from_tensor_slices(samples), seed, epoch)

        epochs = tf.data.Dataset.range(first_epoch, max(self.epochs, first_epoch))
        return (data.decoded(epochs.flat_map(as_is(epoch_samples)), "train")
                .batch(self.batch_size, drop_remainder=True).prefetch(PREFETCH_BATCHES).with_options(data.options()))


def model_input(x, normalization):
    """A batch as the model takes it: uint8 images (build_data's uint8) cast and normalised with
    (mean, std), in one place, the step's device; other inputs as they are."""
    if normalization is None or x.dtype != tf.uint8:
        return x
    mean, std = (np.asarray(v, np.float32) * 255 for v in normalization)
    return (tf.cast(x, tf.float32) - mean) * (1 / std)


def build_data(cfg, threads: int = 1, uint8: bool = False) -> TFData:
    """cfg's dataset as tf.data pipelines. uint8: image files come as uint8 batches (a quarter of
    the bytes through tf.data and onto the device), which the step normalises (model_input):
    for a GPU's custom loop (hvdtrain/tf/devices.py's uint8_input); otherwise floats, normalised
    in the pipeline's parallel map. cfg.loader "dali": DALI decodes the image files (hvdtrain/tf/dali.py),
    normalised floats on the rank's device."""
    loader = "dali" if getattr(cfg, "loader", None) == "dali" else "tf"
    if loader == "dali":
        from hvdtrain.errors import UsageError

        if cfg.dataset not in ("imagefolder", "shards"):
            raise UsageError("--loader dali reads image files: --dataset imagefolder or --dataset shards")
        dali.require()  # one line now, not a traceback at the first batch
    if cfg.dataset in ("imagefolder", "shards"):
        # DALI's batches come normalised: no uint8 for the step to normalise.
        data = (_imagefolder if cfg.dataset == "imagefolder" else _shards)(cfg, threads, uint8 and loader == "tf")
        data.loader = loader
        return data
    if cfg.dataset == "digits":
        split = datasets.digits_split()
    else:
        split = datasets.synthetic_split(cfg.synthetic_size, cfg.image_size, seed=cfg.seed)
    return TFData(len(split.y_train), len(split.y_val), split.in_channels, split.num_classes,
                  split.image_size, _array_loader(_nhwc(split.x_train), split.y_train),
                  _array_loader(_nhwc(split.x_val), split.y_val), per_sample=False, threads=threads)


def arrays_data(train: tuple, val: tuple | None, threads: int = 1) -> TFData:
    """(x, y) arrays as they are (the model's layout), held in memory: hvdtrain.tf.fit's data."""
    return TFData(len(train[1]), len(val[1]) if val is not None else 0, None, None, None, _array_loader(*train),
                  _array_loader(*val) if val is not None else None, per_sample=False, threads=threads)


def _nhwc(x_nchw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x_nchw.transpose(0, 2, 3, 1))


def _array_loader(x: np.ndarray, y: np.ndarray):
    pool = len(x)
    x = tf.constant(x)
    labels = tf.constant(y)

    def load(idx):
        return tf.gather(x, idx % pool), tf.gather(labels, idx)
    return load


def _list_files(root: str, classes: list[str]) -> tuple[list[str], list[int]]:
    paths, labels = [], []
    for label, cls in enumerate(classes):
        for name in sorted(os.listdir(os.path.join(root, cls))):
            if name.lower().endswith(datasets.IMAGE_EXTENSIONS):
                paths.append(os.path.join(root, cls, name))
                labels.append(label)
    return paths, labels


DRAWS_PER_CALL = 256  # samples whose draws one call into Python makes (augment.sample_draws: vectorised)


def with_draws(samples: tf.data.Dataset, seed: int, epoch) -> tf.data.Dataset:
    """(i, draws) for each sample index i: hvdtrain/data/augment.py's numbers for its crop and flip,
    made by numpy a few hundred samples a call, so that the map that decodes runs TensorFlow's ops
    alone (a call into Python per image held the GIL: 0.36 ms an image). `epoch`: an int64
    tensor (one dataset for many epochs: FitImages)."""
    def draws(indices, e):
        return augment.sample_draws(seed, int(e), indices)

    def batch_draws(indices):
        found = tf.numpy_function(draws, [indices, epoch], tf.float64, stateful=False)
        return indices, tf.ensure_shape(found, [None, augment.DRAWS])
    return samples.batch(DRAWS_PER_CALL).map(as_is(batch_draws)).unbatch()


def _encoded_shape(data):
    """An image file's (height, width, channels) in TensorFlow's ops: a JPEG's from its header,
    another format's by decoding it."""
    return tf.cond(tf.io.is_jpeg(data), lambda: tf.io.extract_jpeg_shape(data),
                   lambda: tf.shape(tf.io.decode_image(data, channels=3, expand_animations=False)))


def _window_from_draws(draws, height, width):
    """augment.window_from_draws in TensorFlow's ops: (top, left, height, width, flip) int32. The
    same float64 operations (products, square roots, rounding half to even, floors), which IEEE
    754 makes exact alike: the windows torch and DALI take, to the pixel (tests/test_dali.py)."""
    f64 = tf.float64
    image_h, image_w = tf.cast(height, f64), tf.cast(width, f64)
    target, ratio = image_h * image_w * draws[0:20:2], draws[1:20:2]
    w, h = tf.round(tf.sqrt(target * ratio)), tf.round(tf.sqrt(target / ratio))
    fits = (w > 0) & (w <= image_w) & (h > 0) & (h <= image_h)
    k = tf.argmax(tf.cast(fits, tf.int32), output_type=tf.int32)  # the first try that fits
    w_k, h_k = w[k], h[k]
    top, left = tf.floor(draws[20] * (image_h - h_k + 1)), tf.floor(draws[21] * (image_w - w_k + 1))
    # No try fits: the centre crop at the nearest allowed ratio.
    in_ratio = image_w / image_h
    low, high = augment.RATIO
    centre_w = tf.where(in_ratio > high, tf.round(image_h * high), image_w)
    centre_h = tf.where(in_ratio < low, tf.round(image_w / low), image_h)
    centre = tf.stack([tf.floor((image_h - centre_h) / 2), tf.floor((image_w - centre_w) / 2), centre_h, centre_w])
    window = tf.where(tf.reduce_any(fits), tf.stack([top, left, h_k, w_k]), centre)
    return tf.concat([tf.cast(window, tf.int32), tf.cast([draws[22] < 0.5], tf.int32)], 0)


def _image_loader(read_bytes, labels, size: int, train: bool, uint8: bool = False):
    """load(i[, draws]) -> (normalised float image HWC, label) of sample i, whose file's bytes
    read_bytes(i) gives as a tf.string; training samples come with their draws (with_draws). The
    window is hvdtrain's rule (hvdtrain/data/augment.py), the one torch and DALI take; a JPEG is decoded
    only there (decode_and_crop_jpeg), other formats whole, then cropped. Then a resize to
    size x size (bilinear), the flip, the normalisation; uint8: the resized image rounded to uint8
    (as torchvision's uint8 resize gives it), not normalised."""
    labels_t = tf.constant(labels, dtype=tf.int64)
    # (x / 255 - mean) / std as x * scale + bias, with both spelled out to the image's shape: a
    # (3,) operand broadcast over the channels cost 0.55 ms an image on one core, the full
    # shape 0.1 (benchmarks/data_pipeline.py's figures, docs/data.md).
    scale = np.float32(1 / 255) / np.asarray(datasets.IMAGENET_STD, np.float32)
    bias = -np.asarray(datasets.IMAGENET_MEAN, np.float32) / np.asarray(datasets.IMAGENET_STD, np.float32)
    scale, bias = (tf.constant(np.broadcast_to(v, (size, size, 3)).copy()) for v in (scale, bias))

    def window(shape, draws):
        height, width = shape[0], shape[1]
        if train:
            return _window_from_draws(draws, height, width)
        # augment.val_window in TensorFlow's ops
        short = tf.cast(tf.minimum(height, width), tf.float64)
        side = tf.cast(tf.round(size * short / int(size * augment.VAL_RESIZE)), tf.int32)
        side = tf.clip_by_value(side, 1, tf.minimum(height, width))
        return tf.stack([(height - side) // 2, (width - side) // 2, side, side, 0])

    def load(i, draws=None, data=None):
        if data is None:
            data = read_bytes(i)

        def jpeg():
            win = window(tf.io.extract_jpeg_shape(data), draws)
            return tf.io.decode_and_crop_jpeg(data, win[:4], channels=3), win[4]

        def other():
            image = tf.io.decode_image(data, channels=3, expand_animations=False)
            win = window(tf.shape(image), draws)
            return tf.image.crop_to_bounding_box(image, win[0], win[1], win[2], win[3]), win[4]

        image, flip = tf.cond(tf.io.is_jpeg(data), jpeg, other)
        # Bilinear without antialiasing, as TensorFlow's own ImageNet preprocessing resizes: the
        # antialiased filter (torchvision's) cost 1.0 ms an image more, two thirds of the rest.
        image = tf.image.resize(image, [size, size], antialias=False)
        image = tf.cond(flip > 0, lambda: tf.image.flip_left_right(image), lambda: image)
        if uint8:
            return tf.saturate_cast(tf.round(image), tf.uint8), labels_t[i]
        return image * scale + bias, labels_t[i]

    def packed(i, draws=None, data=None):  # for DALI (hvdtrain/tf/dali.py): bytes, label, window, flip
        if data is None:
            data = read_bytes(i)
        shape = _encoded_shape(data)
        win = window(shape, draws)
        # Relative to the image's size, rounded to float32 as the torch side's (hvdtrain/torch/dali.py).
        whole = tf.cast(tf.stack([shape[0], shape[1], shape[0], shape[1]]), tf.float64)
        return dali.pack(data, labels_t[i], tf.cast(win[:4], tf.float64) / whole, win[4])

    load.packed = packed
    return load


def _imagefolder(cfg, threads: int, uint8: bool) -> TFData:
    classes = datasets.check_imagefolder(cfg.data_dir)
    files, loads, sizes = {}, {}, {}
    for split in ("train", "val"):
        paths, labels = _list_files(os.path.join(cfg.data_dir, split), classes)
        paths_t = tf.constant(paths)
        files[split] = lambda i, paths=paths: (datasets.read_image_file(paths[i]), paths[i])
        sizes[split] = len(paths)
        loads[split] = _image_loader(lambda i, paths_t=paths_t: tf.io.read_file(paths_t[i]), labels,
                                     cfg.image_size, split == "train", uint8)
    return TFData(sizes["train"], sizes["val"], 3, len(classes), cfg.image_size, loads["train"], loads["val"],
                  per_sample=True, threads=threads, files=files, classes=classes,
                  input_normalization=datasets.IMAGENET_NORMALIZATION if uint8 else None)


def _shards(cfg, threads: int, uint8: bool) -> TFData:
    """Tar shards written by python -m hvdtrain.shards: each sample read at its offset (and checked
    against its CRC-32) by the ShardReader that hvdtrain.torch uses, READ_PER_CALL samples a call
    into Python ahead of the parallel map that decodes them (read_many); load(i) alone (a model's
    trial samples) reads one."""
    readers = {split: shards.ShardReader(cfg.data_dir, split) for split in ("train", "val")}
    loads = {}
    for split, reader in readers.items():
        def read_bytes(i, reader=reader):
            data = tf.numpy_function(lambda j: reader.read(int(j))[0], [i], tf.string, stateful=False)
            return tf.ensure_shape(data, [])
        loads[split] = _image_loader(read_bytes, reader.labels, cfg.image_size, split == "train", uint8)
    files = {split: lambda i, reader=reader: (reader.read(i)[0], reader.where(i)) for split, reader in readers.items()}
    # The chunk's reads overlapped on a pool of threads (hvdtrain/data/parallel_reads.py): one after
    # another, a file system's 1 ms a read capped the rank at 1,000 samples a second.
    read_many = {split: lambda indices, reader=reader: np.array(
        [data for data, _ in parallel_reads.read_many(reader.read, [int(i) for i in indices])], object)
        for split, reader in readers.items()}
    return TFData(len(readers["train"]), len(readers["val"]), 3, len(readers["train"].classes), cfg.image_size,
                  loads["train"], loads["val"], per_sample=True, threads=threads, files=files,
                  sample_shards=readers["train"].index["shard"], classes=list(readers["train"].classes),
                  input_normalization=datasets.IMAGENET_NORMALIZATION if uint8 else None, read_many=read_many)
