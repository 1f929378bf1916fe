"""Image files to uint8 batches on the host; floats only on the device.

The stages, each swappable and measured alone (benchmarks/data_pipeline.py):
- decode: `decode()`, the one place that chooses the decoder (`_decoder`): TorchCodec's or
  torchvision's `decode_image` (libjpeg-turbo for JPEGs, libpng, libwebp) straight to a uint8 CHW
  tensor, with no PIL image object in between; measured per core against PIL in docs/data.md.
- augment: `train_augment` (TrainCrop: the window and flip of hvdtrain/data/augment.py's one rule, a
  function of the crop key (seed, epoch, sample) it is given, then torchvision's resized crop on
  the uint8 tensor) and `val_augment` (ValCrop: augment.val_window, the centre, resized): a
  resume augments as an uninterrupted run; DALI and TensorFlow take the same windows.
- normalise: `to_model_input`, on the device, after the copy (a uint8 batch is a quarter of the
  bytes of a float32 one through the workers' shared memory, the pinned buffer and the bus); or,
  where the CPU trains, in the decode workers (NormalizedBatches).

Datasets here (`image_folder`'s FolderImages, `ShardImages`) give (uint8 CHW tensor, label) and
say how their inputs are normalised by their `input_normalization` attribute ((mean, std) in
[0, 1] units), which the loader's plan reads (hvdtrain/torch/loader.py). `read_sample(i, crop_key)`
is a sample cropped by the key data.SeededSamples hands it; `dataset[i]` draws the window from
torch's generator.

    train = image_folder(f"{root}/train", train_augment(224))
    x = to_model_input(x_uint8.to(device, non_blocking=True), train.input_normalization)
"""
from __future__ import annotations

import torch
from torch.utils.data import Dataset
from torchvision.datasets import ImageFolder

from hvdtrain.data import augment, datasets, shards
from hvdtrain.torch import internals



def _decoder():
    """(name, function bytes -> uint8 RGB CHW tensor): TorchCodec's decoders where installed (torchvision
    deprecates its own in their favour from 0.29), else torchvision's, which a site's torchvision module
    has. Both are libjpeg-turbo for JPEGs; benchmarks/data_pipeline.py measures them side by side."""
    try:
        from torchcodec.decoders import decode_image as codec_decode

        return "torchcodec.decoders.decode_image", lambda data: codec_decode(data, mode="RGB")
    except ImportError:
        import warnings

        from torchvision.io import ImageReadMode, decode_image

        def decode_with_torchvision(data):
            with warnings.catch_warnings():  # its deprecation, once per image otherwise
                warnings.simplefilter("ignore", DeprecationWarning)
                return decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)

        return "torchvision.io.decode_image", decode_with_torchvision


DECODER, _decode = _decoder()


def decode(data: bytes, where: str) -> torch.Tensor:
    """An image file's bytes as a uint8 RGB (3, H, W) tensor; a bad file is one line naming `where`."""
    try:
        return _decode(data)
    except (RuntimeError, ValueError) as err:
        reason = str(err).strip().splitlines()[0].rsplit(", ", 1)[-1] if str(err).strip() else type(err).__name__
        raise datasets.BadSample(f"cannot read image {where} ({reason})") from None


read_file = datasets.read_image_file  # an image file's bytes, or one line naming it


def load_file(path: str) -> torch.Tensor:
    """torchvision ImageFolder's `loader`, to uint8."""
    return decode(read_file(path), path)


class TrainCrop:
    """hvdtrain's training augmentation (hvdtrain/data/augment.py: torchvision's RandomResizedCrop
    rule and a flip, the window a function of the crop key (seed, epoch, sample)), on a uint8 CHW
    tensor: the window DALI and TensorFlow take for the same sample. Without a key (a user's
    dataset calling it as a transform) a window is drawn from torch's generator."""

    def __init__(self, size: int):
        self.size = size

    def __call__(self, x: torch.Tensor, crop_key: tuple[int, int, int] | None = None) -> torch.Tensor:
        from torchvision.transforms.v2 import functional as F

        height, width = x.shape[-2:]
        key = crop_key if crop_key is not None else (int(torch.randint(0, 2**62, ())), 0, 0)
        top, left, h, w, flip = augment.train_window(*key, height, width)
        x = F.resized_crop(x, top, left, h, w, [self.size, self.size], antialias=True)
        return F.horizontal_flip(x) if flip else x

    def __repr__(self):
        return f"TrainCrop({self.size})"


def train_augment(size: int):
    return TrainCrop(size)


class ValCrop:
    """hvdtrain's validation crop (augment.val_window: the ImageNet centre crop as a window of the
    original image), resized to size x size on a uint8 CHW tensor: DALI's and TensorFlow's pixels."""

    def __init__(self, size: int):
        self.size = size

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        from torchvision.transforms.v2 import functional as F

        top, left, h, w, _ = augment.val_window(*x.shape[-2:], self.size)
        return F.resized_crop(x, top, left, h, w, [self.size, self.size], antialias=True)

    def __repr__(self):
        return f"ValCrop({self.size})"


def val_augment(size: int):
    return ValCrop(size)


_CONSTANTS: dict = {}  # (device, normalization) -> (mean x 255, 1 / (std x 255)), made once


def _normalization_constants(normalization, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch normalisation's constants on `device`, made once: built at every batch, each was
    a copy from pageable host memory, which makes the host wait for the GPU where it runs on the
    compute stream (Lightning's transfer hook)."""
    key = (str(device), tuple(map(tuple, normalization)))
    if key not in _CONSTANTS:
        mean, std = (torch.tensor(v, dtype=torch.float32).view(1, -1, 1, 1) * 255 for v in normalization)
        _CONSTANTS[key] = mean.to(device), (1 / std).to(device)
    return _CONSTANTS[key]


def to_model_input(x: torch.Tensor, normalization, channels_last: bool = False) -> torch.Tensor:
    """A uint8 image batch as the model's float input: scaled to [0, 1], normalised with
    (mean, std), channels-last if asked. Other inputs (floats, a user's own) pass unchanged but
    for the memory format."""
    if normalization is not None and x.dtype == torch.uint8:
        mean, inverse_std = _normalization_constants(normalization, x.device)
        if x.ndim == 3:  # one image (CHW), in a decode worker: NormalizedBatches
            mean, inverse_std = mean[0], inverse_std[0]
        x = x.float().sub_(mean).mul_(inverse_std)  # one new tensor, not three
    if channels_last and x.ndim == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    return x


IMAGENET_NORMALIZATION = datasets.IMAGENET_NORMALIZATION


class NormalizedBatches:
    """A decode worker's collate function: the samples' uint8 images stacked, then normalised as
    to_model_input would, into the shared-memory float batch the rank receives. One pass over the
    floats: normalised one image at a time, then collated, they took about three."""

    def __init__(self, normalization):
        self.normalization = normalization

    def __call__(self, batch):
        from torch.utils.data import default_collate, get_worker_info

        first = batch[0]
        if not (isinstance(first, (tuple, list)) and len(first) == 2 and isinstance(first[0], torch.Tensor)
                and first[0].dtype == torch.uint8 and first[0].ndim == 3):
            return default_collate(batch)  # not an image and its label: nothing of ours to normalise
        uint8 = torch.stack([x for x, _ in batch])
        mean, inverse_std = _normalization_constants(self.normalization, uint8.device)
        floats = torch.empty(0, dtype=torch.float32)
        if get_worker_info() is not None:  # made in shared memory, as default_collate does: not copied again to send
            floats = internals.shared_floats(uint8.numel())
        floats = floats.resize_(uint8.shape).copy_(uint8).sub_(mean).mul_(inverse_std)
        return [floats, default_collate([y for _, y in batch])]

    def __repr__(self):
        return f"NormalizedBatches({self.normalization})"


def ours(dataset) -> bool:
    """Whether `dataset` (through SeededSamples and Subset) is one of hvdtrain's image datasets,
    whose samples the loader may normalise in its decode workers; a user's dataset is theirs."""
    return isinstance(_inner(dataset), (FolderImages, ShardImages))


def _inner(dataset):
    while hasattr(dataset, "dataset") and not isinstance(dataset, ShardImages):  # SeededSamples, Subset
        dataset = dataset.dataset
    return dataset


def encoded_samples(dataset):
    """(read, where, length) of hvdtrain's own image datasets (a folder, shards; wrapped or not):
    read(i) -> (the file's bytes, label), undecoded; where(i) names the file. None for others."""
    inner = _inner(dataset)
    if isinstance(inner, ShardImages):
        return inner.reader.read, inner.reader.where, len(inner)
    if isinstance(inner, FolderImages):
        samples = inner.samples
        return (lambda i: (read_file(samples[i][0]), samples[i][1])), (lambda i: samples[i][0]), len(inner)
    return None


def image_shape(data: bytes, where: str) -> tuple[int, int]:
    """(height, width) from the file's header alone (PIL reads no pixels for it)."""
    import io

    from PIL import Image

    try:
        width, height = Image.open(io.BytesIO(data)).size
    except Exception as err:  # noqa: BLE001 - PIL raises many kinds for a bad header
        raise datasets.BadSample(f"cannot read image {where} ({type(err).__name__}: {err})") from None
    return height, width


def crops_check(dataset, seed: int) -> dict | None:
    """The windows hvdtrain's training crop (TrainCrop, and DALI's loader) takes from the first
    augment.CROP_CHECK_SAMPLES images of `dataset` (a folder or shards of hvdtrain's) in epoch 0,
    as {"samples", "digest"} (augment.crops_digest); None for other datasets."""
    found = encoded_samples(dataset)
    if found is None:
        return None
    read, where, length = found
    samples = min(augment.CROP_CHECK_SAMPLES, length)
    windows = []
    for i in range(samples):
        try:
            height, width = image_shape(read(i)[0], where(i))
        except datasets.BadSample:  # a format PIL does not read (the trainer's decoder did): no check
            return None
        windows.append(augment.train_window(seed, 0, i, height, width))
    return {"samples": samples, "digest": augment.crops_digest(windows)}


class _Images:
    """What hvdtrain's image datasets share: a sample decoded to uint8 (`_decoded`, each
    dataset's own), then its transform, which TrainCrop is given the crop key for."""

    input_normalization = IMAGENET_NORMALIZATION
    transform = None

    def __getitem__(self, i):
        return self.read_sample(i, None)

    def read_sample(self, i: int, crop_key):
        x, label = self._decoded(i)
        # The transform, or each of a torchvision Compose's: TrainCrop with the key.
        for transform in getattr(self.transform, "transforms", None) or [self.transform]:
            if isinstance(transform, TrainCrop):
                x = transform(x, crop_key)
            elif transform is not None:
                x = transform(x)
        return x, label


def image_folder(root: str, transform) -> FolderImages:
    """An image folder tree under `root` (torchvision's ImageFolder listing), decoding to uint8."""
    return FolderImages(root, transform)


class FolderImages(_Images, ImageFolder):
    """torchvision's ImageFolder over `root`, each file decoded to uint8 (see the module's docstring)."""

    def __init__(self, root: str, transform):
        ImageFolder.__init__(self, root, transform=transform, loader=load_file)

    def _decoded(self, i: int):
        path, label = self.samples[i]
        return load_file(path), label


class ShardImages(_Images, Dataset):
    """A split of tar shards written by `python -m hvdtrain.shards` (hvdtrain/data/shards.py):
    (uint8 image, label), in the index's order."""

    def __init__(self, root: str, split: str, transform):
        self.reader = shards.ShardReader(root, split)
        self.classes, self.transform = self.reader.classes, transform

    def __len__(self):
        return len(self.reader)

    @property
    def sample_shards(self):
        """Each sample's shard: the training order reads a few shards per rank (data.rank_order)."""
        return self.reader.index["shard"]

    def _decoded(self, i: int):
        data, label = self.reader.read(i)
        return decode(data, self.reader.where(i)), label
