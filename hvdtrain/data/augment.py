"""The image augmentation, one rule for every framework and decoder (torch, DALI, TensorFlow):
which window of an image a training sample is cropped from, whether it is flipped, and which
window validation takes. Framework-free: each pipeline decodes (DALI and TensorFlow only the
window), resizes to size x size with its own filter and normalises with IMAGENET_MEAN/STD.

Training: torchvision's RandomResizedCrop rule (scale 0.08-1 of the area, aspect ratio 3/4-4/3,
10 tries, else the centre crop at the nearest allowed ratio), then a horizontal flip with
probability 1/2, drawn from (seed, epoch, sample index) alone: a run resumed in the middle of an
epoch crops every remaining sample as an uninterrupted run would. In two parts, so that
TensorFlow computes the second in its own ops, with no call into Python per image:
- `sample_draws(seed, epoch, indices)`: each sample's DRAWS numbers, none depending on the image
  (10 tries' scale and aspect ratio, top and left as fractions, the flip), from a counter-based
  hash (SplitMix64) of (seed, epoch, index, k), vectorised: microseconds a batch, not a generator
  made per sample.
- `window_from_draws(draws, height, width)`: the window, by arithmetic whose every step (products,
  square roots, rounding half to even, comparisons, floors) IEEE 754 gives alike in numpy, Python
  and TensorFlow: the same windows to the pixel (hvdtrain/tf/data.py's `_window_from_draws`).

Validation: `val_window`, the centre square of side 224/256 of the shorter side, in the original
image, resized to size x size: the ImageNet convention (the shorter side resized to size x
256/224, the centre size x size taken) as a window, so every decoder crops first (DALI's
image_slice, TensorFlow's decode_and_crop_jpeg) and all take the same pixels as torch.
"""
from __future__ import annotations

import math
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


DRAWS = 23  # a training sample's numbers: 10 tries x (scale, ratio), top, left, flip
_TOP, _LEFT, _FLIP = 20, 21, 22
_MASK = (1 << 64) - 1


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 (wrapping arithmetic): a well-mixed 64-bit hash."""
    x = (x + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(_MASK)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def sample_draws(seed: int, epoch: int, indices) -> np.ndarray:
    """(len(indices), DRAWS) float64: each training sample's draws (module docstring), uniform in
    [0, 1) but the ratios, already exp(uniform log-ratio) within RATIO."""
    with np.errstate(over="ignore"):
        key = _splitmix64(_splitmix64(np.array([seed & _MASK], np.uint64)) ^ np.uint64(epoch & _MASK))
        sample = _splitmix64(key ^ np.asarray(indices, np.int64).astype(np.uint64))
        counters = sample[:, None] ^ (np.arange(1, DRAWS + 1, dtype=np.uint64) * np.uint64(0xD1B54A32D192ED03))
        draws = (_splitmix64(counters) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    draws[:, 0:20:2] = SCALE[0] + (SCALE[1] - SCALE[0]) * draws[:, 0:20:2]
    log_ratio = (math.log(RATIO[0]), math.log(RATIO[1]))
    draws[:, 1:20:2] = np.exp(log_ratio[0] + (log_ratio[1] - log_ratio[0]) * draws[:, 1:20:2])
    return draws


def window_from_draws(draws, height: int, width: int) -> Window:
    """(top, left, height, width, flip) in pixels: torchvision's RandomResizedCrop.get_params, its
    numbers taken from one row of sample_draws."""
    area = float(height * width)
    for k in range(10):
        target, ratio = area * float(draws[2 * k]), float(draws[2 * k + 1])
        w, h = int(round(math.sqrt(target * ratio))), int(round(math.sqrt(target / ratio)))
        if 0 < w <= width and 0 < h <= height:
            top = int(math.floor(float(draws[_TOP]) * (height - h + 1)))
            left = int(math.floor(float(draws[_LEFT]) * (width - w + 1)))
            return Window(top, left, h, w, bool(draws[_FLIP] < 0.5))
    in_ratio = width / height
    if in_ratio < RATIO[0]:
        w, h = width, int(round(width / RATIO[0]))
    elif in_ratio > RATIO[1]:
        h, w = height, int(round(height * RATIO[1]))
    else:
        w, h = width, height
    return Window((height - h) // 2, (width - w) // 2, h, w, bool(draws[_FLIP] < 0.5))


def train_window(seed: int, epoch: int, index: int, height: int, width: int) -> Window:
    """Training sample `index`'s crop and flip in `epoch`, for an image of height x width."""
    return window_from_draws(sample_draws(seed, epoch, [index])[0], height, width)


CROP_CHECK_SAMPLES = 16  # training images whose windows each trainer reports (crops_digest)


def crops_digest(windows) -> str:
    """A short digest of crop windows (top, left, height, width, flip): what each trainer reports
    for the first CROP_CHECK_SAMPLES training images of epoch 0, computed by its own pipeline's
    code (TensorFlow's in its ops), so that the comparison can say every backend took the same."""
    import hashlib

    text = ";".join(",".join(str(int(v)) for v in window) for window in windows)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def val_window(height: int, width: int, size: int) -> Window:
    """Validation's centre crop, in the original image's pixels (see the module's docstring)."""
    side = max(1, min(height, width, int(round(size * min(height, width) / int(size * VAL_RESIZE)))))
    return Window((height - side) // 2, (width - side) // 2, side, side)


def relative(window: Window, height: int, width: int) -> np.ndarray:
    """(top, left, height, width) as fractions of the image's, float32: what DALI's image_slice takes."""
    return np.array((window.top / height, window.left / width, window.height / height, window.width / width),
                    np.float32)
