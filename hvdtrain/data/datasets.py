"""Framework-free data: the digits split, synthetic images, imagefolder checks.

The torch and TF trainers build their loaders from these arrays and checks, so both see the
same samples in the same split. Arrays are channels-first float32 in [0, 1].

    python -m hvdtrain.data.datasets make-digits-folder /tmp/digits-png   # an imagefolder tree of real images
"""
from __future__ import annotations

import argparse
import gzip
import importlib.util
import os
from dataclasses import dataclass

import numpy as np

from hvdtrain.errors import UsageError

# 1797 digits: 397 (a prime, so exact sharding of the validation set is always exercised)
# for validation, the other 1400 for training.
DIGITS_VAL_SIZE = 397
# ImageNet's channel statistics: imagefolder images are normalised with them in both frameworks.
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
IMAGENET_NORMALIZATION = (IMAGENET_MEAN, IMAGENET_STD)  # (mean, std) in [0, 1] units, as datasets give it
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


@dataclass(frozen=True)
class ArraySplit:
    """Images and labels. Sample i is image x[i % len(x)] with label y[i]: synthetic splits keep
    a small pool of images instead of a copy per sample; for real data len(x) == len(y)."""
    x_train: np.ndarray   # (P, C, H, W) float32 in [0, 1]
    y_train: np.ndarray   # (N,) int64
    x_val: np.ndarray
    y_val: np.ndarray
    num_classes: int

    @property
    def in_channels(self) -> int:
        return int(self.x_train.shape[1])

    @property
    def image_size(self) -> int:
        return int(self.x_train.shape[2])


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """What sklearn.datasets.load_digits() returns as (images, target), read from the file it
    reads, without importing scikit-learn: its import costs about 1.4 s in every rank of every
    digits run (tests/test_datasets.py checks the two agree)."""
    spec = importlib.util.find_spec("sklearn")  # finds the package without running its __init__
    path = os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz") if spec else ""
    if not os.path.exists(path):  # another scikit-learn layout: ask it
        from sklearn.datasets import load_digits

        bunch = load_digits()
        return bunch.images, bunch.target
    with gzip.open(path, "rt") as f:
        data = np.loadtxt(f, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)


def digits_split(val_size: int = DIGITS_VAL_SIZE, seed: int = 0) -> ArraySplit:
    """scikit-learn's real 8x8 handwritten digits (values 0..16), shuffled once with `seed`."""
    images, target = digits_arrays()
    x = (images.astype(np.float32) / 16.0)[:, None, :, :]
    y = target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    x, y = x[order], y[order]
    return ArraySplit(x[val_size:], y[val_size:], x[:val_size], y[:val_size], 10)


def synthetic_split(train_size: int, image_size: int, num_classes: int = 1000, seed: int = 0,
                    channels: int = 3) -> ArraySplit:
    """Random images for throughput runs. A pool of 64 distinct images is indexed cyclically:
    generating (or storing) a fresh 224x224 image per sample would measure memory, not training."""
    rng = np.random.default_rng(seed)
    pool = rng.random((64, channels, image_size, image_size), dtype=np.float32)
    val_size = max(1, train_size // 4)
    y = rng.integers(0, num_classes, size=train_size + val_size).astype(np.int64)
    return ArraySplit(pool, y[:train_size], pool, y[train_size:], num_classes)


SHARDS_MANIFEST = "manifest.json"  # what `python -m hvdtrain.shards` writes last (shards.MANIFEST)


def read_image_file(path: str) -> bytes:
    """An image file's bytes; one that cannot be read is one line naming it (both trainers)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as err:
        raise BadSample(f"cannot read image {path} ({err.strerror or err})") from None


def check_imagefolder(data_dir: str | None) -> list[str]:
    """Validate an ImageNet-style tree (`train/<class>/*.jpg`, `val/<class>/*.jpg`); return classes."""
    if not data_dir:
        raise UsageError("--dataset imagefolder needs --data-dir DIR (with train/ and val/ class folders)")
    if not os.path.isdir(data_dir):
        raise UsageError(f"data dir '{data_dir}' does not exist")
    if os.path.exists(os.path.join(data_dir, SHARDS_MANIFEST)):
        raise UsageError(f"data dir '{data_dir}' holds shards ({SHARDS_MANIFEST}), not class folders: --dataset shards")
    classes = None
    for split in ("train", "val"):
        root = os.path.join(data_dir, split)
        if not os.path.isdir(root):
            raise UsageError(f"data dir '{data_dir}' has no '{split}/' folder (expected {split}/<class>/<image>)")
        found = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
        if not found:
            raise UsageError(f"'{root}' holds no class folders")
        counts = {c: sum(1 for f in os.listdir(os.path.join(root, c)) if f.lower().endswith(IMAGE_EXTENSIONS))
                  for c in found}
        if not any(counts.values()):
            raise UsageError(f"'{root}' holds no images ({', '.join(IMAGE_EXTENSIONS)})")
        empty = [c for c, n in counts.items() if n == 0]
        if empty:
            # torchvision's ImageFolder would end with a traceback; a class without samples
            # is also one the model could never learn.
            raise UsageError(f"'{root}' has class folders without images: {', '.join(empty[:10])}"
                             f"{' ...' if len(empty) > 10 else ''} ({', '.join(IMAGE_EXTENSIONS)})")
        if classes is None:
            classes = found
        elif found != classes:
            raise UsageError(f"train/ and val/ under '{data_dir}' have different class folders")
    return classes


class BadSample(UsageError):
    """A sample that cannot be read (corrupt, truncated, not an image). Raised in a DataLoader
    worker, it reaches the main process rebuilt from the worker's formatted traceback
    (`type(err)(text)`): keep only its own last line, so the user sees one line."""

    def __init__(self, message: str):
        lines = [line for line in str(message).strip().splitlines() if line.strip()]
        if len(lines) > 1:
            message = lines[-1].split(": ", 1)[-1]
        super().__init__(message)


def exact_shard(n: int, rank: int, world_size: int) -> range:
    """Indices of rank's share of n samples: each sample on exactly one rank, no padding. A
    contiguous block (sizes differ by one at most), so that from shards a rank reads a few of
    them, not every one."""
    return range(rank * n // world_size, (rank + 1) * n // world_size)


def shard_blocked_order(sample_shards: np.ndarray, seed: int, epoch: int, rank: int, world_size: int) -> np.ndarray:
    """Rank `rank`'s training samples of `epoch`, in order, for samples stored in shards
    (`sample_shards[i]`: sample i's shard). The epoch permutes the shards (seeded by seed and
    epoch) and lays their samples end to end; each rank takes an equal contiguous run of that
    sequence (the remainder, fewer than world_size samples, left out: every rank runs the same
    steps) and shuffles it. A rank then reads about shards / world_size + 1 shards an epoch, so
    its workers open that many each, not every shard: at 1,100 shards, 256 ranks and 15 workers
    about 15 x (1,100 + 256) = 20 k opens an epoch instead of 4.2 M. The price, in randomness: a
    rank's batches in an epoch mix samples of its few shards (each shard mixes classes, as
    written), not of all; the global batch still spans every rank's. On one rank it is a full
    permutation. A function of (seed, epoch, rank, world_size) only: a resume repeats it."""
    return _rank_run(_shard_sequence(sample_shards, seed, epoch), seed, epoch, rank, world_size)


def shard_blocked_orders(sample_shards: np.ndarray, seed: int, epoch: int, world_size: int) -> list[np.ndarray]:
    """shard_blocked_order of every rank, the shards' sequence computed once."""
    sequence = _shard_sequence(sample_shards, seed, epoch)
    return [_rank_run(sequence, seed, epoch, rank, world_size) for rank in range(world_size)]


def _shard_sequence(sample_shards, seed: int, epoch: int) -> np.ndarray:
    sample_shards = np.asarray(sample_shards)
    shard_count = int(sample_shards.max()) + 1 if len(sample_shards) else 0
    position = np.empty(shard_count, np.int64)
    position[np.random.default_rng([seed, epoch, 0]).permutation(shard_count)] = np.arange(shard_count)
    return np.argsort(position[sample_shards], kind="stable")


def _rank_run(sequence: np.ndarray, seed: int, epoch: int, rank: int, world_size: int) -> np.ndarray:
    per_rank = len(sequence) // world_size
    mine = sequence[rank * per_rank:(rank + 1) * per_rank]
    return mine[np.random.default_rng([seed, epoch, 1, rank]).permutation(per_rank)]


def rest_of_epoch(orders, sample_count: int, seen_before: tuple, world_size: int) -> list[np.ndarray]:
    """Every rank's samples of an epoch at `world_size` ranks, when its first samples were trained
    at other world sizes (a resume with --allow-resize in the middle of the epoch): exactly the
    samples not yet seen, each once. `orders(w)` gives the epoch's plain order at w ranks (a list
    of per-rank index arrays: the trainer's sampler); `seen_before` what was trained of the epoch
    before, ((world size, samples each rank trained), ...), oldest first. Without it, orders(world_size).

    The rest keeps the plain order's sequence (ranks' orders laid end to end: from shards, a rank
    still reads a few shards), the epoch's samples that order leaves out at the new size after it,
    and is cut into equal runs, one per rank; fewer than world_size samples are left out, as every
    epoch leaves out its remainder, and the loader drops what does not fill a batch."""
    seen = np.zeros(sample_count, bool)
    for size, trained in seen_before:
        for part in _unseen_runs(orders, seen, size):  # the runs are made before any is marked
            seen[part[:trained]] = True
    return _unseen_runs(orders, seen, world_size)


def _unseen_runs(orders, seen: np.ndarray, world_size: int) -> list[np.ndarray]:
    parts = [np.asarray(p, np.int64) for p in orders(world_size)]
    if not seen.any():
        return parts
    sequence = np.concatenate(parts)
    in_sequence = np.zeros(len(seen), bool)
    in_sequence[sequence] = True
    rest = np.concatenate([sequence[~seen[sequence]], np.flatnonzero(~seen & ~in_sequence)])
    per_rank = len(rest) // world_size
    return [rest[rank * per_rank:(rank + 1) * per_rank] for rank in range(world_size)]


def check_enough_samples(n: int, world_size: int, what: str) -> None:
    if n < world_size:
        raise UsageError(f"{what} has {n} samples, fewer than the {world_size} ranks")


def write_digits_imagefolder(root: str, per_class_train: int = 20, per_class_val: int = 5,
                             size: int = 32, fmt: str = "png") -> str:
    """Write real digit images as files in `root/{train,val}/<digit>/`: a small imagefolder tree."""
    from PIL import Image

    split = digits_split()
    for name, xs, ys, per_class in (("train", split.x_train, split.y_train, per_class_train),
                                    ("val", split.x_val, split.y_val, per_class_val)):
        for cls in range(10):
            folder = os.path.join(root, name, str(cls))
            os.makedirs(folder, exist_ok=True)
            for i, img in enumerate(xs[ys == cls][:per_class]):
                pixels = (img[0] * 255).astype(np.uint8)
                Image.fromarray(pixels, mode="L").resize((size, size)).convert("RGB").save(
                    os.path.join(folder, f"{i:04d}.{fmt}"))
    return root


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m hvdtrain.data.datasets")
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make-digits-folder", help="write the digits as an imagefolder tree of PNG files")
    m.add_argument("root")
    m.add_argument("--per-class-train", type=int, default=20)
    m.add_argument("--per-class-val", type=int, default=5)
    m.add_argument("--size", type=int, default=32)
    m.add_argument("--format", default="png", choices=("png", "jpg"))
    args = p.parse_args(argv)
    root = write_digits_imagefolder(args.root, args.per_class_train, args.per_class_val, args.size, args.format)
    print(f"wrote {root}")


if __name__ == "__main__":
    main()
