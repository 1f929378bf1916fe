"""The image augmentation, one rule for every framework and decoder (torch, DALI, TensorFlow):
which window of an image a training sample is cropped from, whether it is flipped, and which
window validation takes. Framework-free: each pipeline decodes (DALI and TensorFlow only the
window), resizes to size x size with its own filter and normalises with IMAGENET_MEAN/STD.

Training: torchvision's RandomResizedCrop rule (scale 0.08-1 of the area, aspect ratio 3/4-4/3,
10 tries, else the centre crop at the nearest allowed ratio), then a horizontal flip with
probability 1/2, both drawn from a generator seeded by (seed, epoch, sample index) alone: a run
resumed in the middle of an epoch crops every remaining sample as an uninterrupted run would.

Validation: the shorter side resized to size x 256/224, the centre size x size taken (the
ImageNet convention) - in the original image, the centre square of side 224/256 of the shorter
side, which is what a decoder that crops first (TensorFlow's decode_and_crop_jpeg) takes.
"""
from __future__ import annotations

import contextlib
import math
import threading
from typing import NamedTuple

import numpy as np

SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)  # torchvision's RandomResizedCrop defaults
VAL_RESIZE = 256 / 224  # validation: the shorter side to size x 256/224, then the centre crop


class Window(NamedTuple):
    """A crop in pixels of the original image, and whether the result is flipped left-right."""
    top: int
    left: int
    height: int
    width: int
    flip: bool = False


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, index])


def random_resized_crop(rng: np.random.Generator, height: int, width: int) -> tuple[int, int, int, int]:
    """(top, left, height, width) in pixels: torchvision's RandomResizedCrop.get_params."""
    area = height * width
    log_ratio = (math.log(RATIO[0]), math.log(RATIO[1]))
    for _ in range(10):
        target = area * rng.uniform(*SCALE)
        ratio = math.exp(rng.uniform(*log_ratio))
        w, h = int(round(math.sqrt(target * ratio))), int(round(math.sqrt(target / ratio)))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    in_ratio = width / height
    if in_ratio < RATIO[0]:
        w, h = width, int(round(width / RATIO[0]))
    elif in_ratio > RATIO[1]:
        h, w = height, int(round(height * RATIO[1]))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def train_window(seed: int, epoch: int, index: int, height: int, width: int) -> Window:
    """Training sample `index`'s crop and flip in `epoch`, for an image of height x width."""
    rng = sample_rng(seed, epoch, index)
    top, left, h, w = random_resized_crop(rng, height, width)
    return Window(top, left, h, w, bool(rng.integers(0, 2)))


def val_window(height: int, width: int, size: int) -> Window:
    """Validation's centre crop, in the original image's pixels (see the module's docstring)."""
    side = max(1, min(height, width, int(round(size * min(height, width) / int(size * VAL_RESIZE)))))
    return Window((height - side) // 2, (width - side) // 2, side, side)


# The sample a dataset is reading now, per thread: set by the torch trainer's SeededSamples around
# a sample's read, so that the transform it calls (images.TrainCrop) knows which sample it crops.
_reading = threading.local()


@contextlib.contextmanager
def reading_sample(seed: int, epoch: int, index: int):
    previous = getattr(_reading, "key", None)
    _reading.key = (seed, epoch, index)
    try:
        yield
    finally:
        _reading.key = previous


def current_sample() -> tuple[int, int, int] | None:
    """(seed, epoch, index) of the sample being read on this thread, or None."""
    return getattr(_reading, "key", None)
