"""NVIDIA DALI's graph for hvdtrain's image files, the same for every framework: torch's
`--loader dali` (hvdtrain/torch/dali.py) feeds it from Python a batch at a time, TensorFlow's
(hvdtrain/tf/dali.py) from tf.data through DALI's TensorFlow plugin.

Each sample comes in as its file's bytes, its window (top, left, height, width, each relative to
the image's size) and its flip: hvdtrain's rule (hvdtrain/data/augment.py: a training sample's
crop, validation's centre), computed by the framework's side, so every decoder crops the same
pixels. DALI decodes only the window (`image_slice`; nvJPEG with device="mixed" on a GPU), resizes
it to size x size, flips and normalises it.
"""
from __future__ import annotations

from hvdtrain.data import datasets


# One rule for every decoder: a JPEG's EXIF orientation is not applied. torch's decoders
# (torchvision.io's, PIL) and TensorFlow's do not apply it, as torchvision's ImageNet reference
# trains; DALI's do by default, and a photo marked "rotated" was then cropped in other pixels.
EXIF_ORIENTATION = False


def images(fn, types, *, size: int, gpu: bool, layout: str, files, window, mirror):
    """The normalised float32 images (layout "CHW" or "HWC") of the batch whose files, windows
    (top, left, height, width relative to the image's size: augment.train_window's or val_window's)
    and flips DALI nodes give (fn.external_source or slices of one)."""
    decoder = "mixed" if gpu else "cpu"
    mean = [255 * m for m in datasets.IMAGENET_MEAN]
    std = [255 * s for s in datasets.IMAGENET_STD]
    # axis_names="HW": the window is (top, left, height, width). image_slice's default, "WH",
    # read it as (x, y) and (width, height): every crop transposed, its aspect ratio inverted
    # (1.33-2.37 on a 500x375 image where torchvision's are 0.75-1.33).
    decoded = fn.decoders.image_slice(files, fn.slice(window, 0, 2, axes=[0]), fn.slice(window, 2, 2, axes=[0]),
                                      axis_names="HW", device=decoder, output_type=types.RGB,
                                      normalized_anchor=True, normalized_shape=True,
                                      adjust_orientation=EXIF_ORIENTATION)
    decoded = fn.resize(decoded, resize_x=size, resize_y=size, antialias=True)
    return fn.crop_mirror_normalize(decoded, dtype=types.FLOAT, output_layout=layout, mirror=mirror,
                                    mean=mean, std=std)
