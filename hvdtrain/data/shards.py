"""Image datasets as tar shards in WebDataset's layout: about a thousand files for ImageNet instead
of 1.28 million, which fits an inode quota (IDRIS: 500 k per project) and spares a parallel file
system one metadata lookup per sample.

    python -m hvdtrain.shards write --imagefolder $DATA_DIR --out $SCRATCH/imagenet-shards
    python -m hvdtrain.shards write --index train=train_index.pkl --index val=val_index.pkl \\
        --root $DATA_ROOT --out $SCRATCH/imagenet-shards        # the JSC course's pickled index
    python -m hvdtrain.shards verify $SCRATCH/imagenet-shards  # every shard against its checksum
    srun python -m hvdtrain.torch --model resnet50 --dataset shards --data-dir $SCRATCH/imagenet-shards

Layout of OUT:

    manifest.json                 classes, each split's sample count, each shard's size and sha256
    train/shard-000000.tar ...    members KEY.<jpg|png|...> (the source file's bytes, unchanged)
                                  and KEY.cls (the label, decimal), in that order: WebDataset's layout,
                                  which `tar tf`, webdataset and DALI's readers.webdataset read too
    train/index.npz               per sample: shard, data offset and size, CRC-32, label, extension
    val/...

Samples are written in an order shuffled once (seed 0), so each shard mixes classes. Training
reads a sample by its offset (`os.pread`; per process, the shards being read kept open, the
others closed, within the open-file limit: hvdtrain/data/open_files.py): the order is
hvdtrain's usual function of (seed, epoch), each rank its own samples, validation exact, a resume
continues at the same sample. Each read is checked against the sample's CRC-32, so a damaged
member is named (shard and member), never decoded into garbage or skipped.

Writing is atomic per file (a temporary name, then a rename) and the manifest is written last:
an interrupted conversion leaves no manifest, and a directory without one is refused.
This module is framework-free; hvdtrain/torch/images.py decodes what it reads.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import io
import json
import operator
import os
import pickle
import struct
import sys
import tarfile
import time
import zipfile
import zlib
from dataclasses import dataclass

import numpy as np

from hvdtrain.data import datasets, open_files
from hvdtrain.errors import UsageError

FORMAT = "hvdtrain-shards"
VERSION = 1
MANIFEST = datasets.SHARDS_MANIFEST
SPLITS = ("train", "val")
WRITE_SEED = 0  # the order samples are written in: shuffled once, so shards mix classes


@dataclass(frozen=True)
class Source:
    """One image to write: where its bytes are, its label."""
    path: str
    label: int

    @property
    def extension(self) -> str:
        ext = os.path.splitext(self.path)[1].lower().lstrip(".")
        return "jpg" if ext == "jpeg" else ext or "img"


# ---------------------------------------------------------------------------------------- sources
def imagefolder_sources(root: str) -> tuple[list[str], dict[str, list[Source]]]:
    """(classes, {split: sources}) of an ImageNet-style tree, as torchvision's ImageFolder sees it."""
    classes = datasets.check_imagefolder(root)
    splits = {}
    for split in SPLITS:
        sources = []
        for label, cls in enumerate(classes):
            folder = os.path.join(root, split, cls)
            sources += [Source(os.path.join(folder, f), label) for f in sorted(os.listdir(folder))
                        if f.lower().endswith(datasets.IMAGE_EXTENSIONS)]
        splits[split] = sources
    return classes, splits


def index_sources(indexes: dict[str, str], root: str) -> tuple[list[str], dict[str, list[Source]]]:
    """(classes, {split: sources}) from pickled indexes ({relative path: label} or (path, label)
    pairs, labels 0..K-1) of files under `root`: the JSC course's ImageNet index."""
    splits = {}
    for split, index_file in indexes.items():
        try:
            with open(index_file, "rb") as f:
                index = pickle.load(f)
            pairs = sorted(index.items()) if isinstance(index, dict) else list(index)
            splits[split] = [Source(os.path.join(root, path), operator.index(label)) for path, label in pairs]
        except OSError as err:
            raise UsageError(f"cannot read index {index_file} ({err.strerror or err})") from None
        except (pickle.UnpicklingError, EOFError, TypeError, ValueError, AttributeError) as err:
            raise UsageError(f"{index_file} is not a pickled {{relative path: label}} dict or list of (path, label) "
                             f"pairs ({type(err).__name__}: {err})") from None
        if not splits[split]:
            raise UsageError(f"index {index_file} holds no samples")
    labels = [s.label for sources in splits.values() for s in sources]
    if min(labels) < 0:
        raise UsageError(f"labels must be 0..K-1; the indexes hold {min(labels)}")
    return [str(c) for c in range(max(labels) + 1)], splits


# ---------------------------------------------------------------------------------------- writing
def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        raise UsageError(f"cannot read {path} ({err.strerror or err})") from None
    if not data:
        raise UsageError(f"{path} is empty")
    return data


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _member(name: str, size: int) -> tarfile.TarInfo:
    # Fixed owner, mode and time: the same source gives the same shard, byte for byte.
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o444, 0
    return info


class _ShardWriter:
    """One split's shards, each written under a temporary name and renamed once complete."""

    def __init__(self, out: str, split: str, shard_bytes: int):
        self.out, self.split, self.shard_bytes = out, split, shard_bytes
        os.makedirs(os.path.join(out, split), exist_ok=True)
        self.shards: list[dict] = []
        self.columns = {k: [] for k in ("shard", "offset", "size", "crc32", "label", "ext")}
        self.extensions: list[str] = []
        self._tar = None

    def add(self, key: str, data: bytes, source: Source) -> None:
        if self._tar is None:
            self._open()
        ext = source.extension
        if ext not in self.extensions:
            self.extensions.append(ext)
        self._tar.addfile(_member(f"{key}.{ext}", len(data)), io.BytesIO(data))
        label = str(source.label).encode()
        self._tar.addfile(_member(f"{key}.cls", len(label)), io.BytesIO(label))
        self.columns["shard"].append(len(self.shards))
        self.columns["size"].append(len(data))
        self.columns["crc32"].append(zlib.crc32(data))
        self.columns["label"].append(source.label)
        self.columns["ext"].append(self.extensions.index(ext))
        self._samples += 1
        if self._tar.offset >= self.shard_bytes:
            self.close_shard()

    def _open(self) -> None:
        self._name = f"{self.split}/shard-{len(self.shards):06d}.tar"
        self._tmp = os.path.join(self.out, self._name + ".partial")
        self._file = open(self._tmp, "wb")
        self._tar = tarfile.open(fileobj=self._file, mode="w", format=tarfile.USTAR_FORMAT)
        self._samples = 0

    def close_shard(self) -> None:
        if self._tar is None:
            return
        self._tar.close()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._tar = None
        # The data offsets as tar itself reads them back: the shard is checked whole this way.
        with tarfile.open(self._tmp, mode="r:") as tar:
            offsets = [m.offset_data for m in tar.getmembers() if not m.name.endswith(".cls")]
        if len(offsets) != self._samples:
            raise RuntimeError(f"{self._tmp}: {len(offsets)} images read back, {self._samples} written")
        self.columns["offset"] += offsets
        digest = _sha256(self._tmp)
        os.replace(self._tmp, os.path.join(self.out, self._name))
        self.shards.append({"name": self._name, "samples": self._samples,
                            "bytes": os.path.getsize(os.path.join(self.out, self._name)), "sha256": digest})

    def finish(self) -> dict:
        self.close_shard()
        index = os.path.join(self.out, self.split, "index.npz")
        tmp = index + ".partial.npz"
        np.savez(tmp, shard=np.array(self.columns["shard"], np.int32), offset=np.array(self.columns["offset"], np.int64),
                 size=np.array(self.columns["size"], np.int64), crc32=np.array(self.columns["crc32"], np.uint32),
                 label=np.array(self.columns["label"], np.int64), ext=np.array(self.columns["ext"], np.uint8),
                 extensions=np.array(self.extensions))
        os.replace(tmp, index)
        return {"samples": len(self.columns["label"]), "index": f"{self.split}/index.npz", "shards": self.shards}


def write(out: str, classes: list[str], splits: dict[str, list[Source]], shard_mb: float = 128.0,
          jobs: int = 8, progress: bool = True, source: str = "") -> dict:
    """Write `splits` as shards of about `shard_mb` MB under `out`; the manifest, written last."""
    if os.path.exists(os.path.join(out, MANIFEST)):
        raise UsageError(f"{out} already holds shards ({MANIFEST}); write to a new directory")
    from tqdm import tqdm

    manifest = {"format": FORMAT, "version": VERSION, "layout": "webdataset: KEY.<ext> (the image file) + KEY.cls",
                "source": source, "classes": classes, "splits": {}}
    total = sum(len(s) for s in splits.values())
    bar = tqdm(total=total, unit="img", desc="shards", disable=not progress, file=sys.stderr)
    # Reading is latency-bound on a parallel file system: several files are read at once, in
    # bounded chunks (a whole split's bytes are never held).
    with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
        for split, sources in splits.items():
            order = np.random.default_rng(WRITE_SEED).permutation(len(sources))
            writer = _ShardWriter(out, split, int(shard_mb * 2**20))
            chunk = 256
            for start in range(0, len(order), chunk):
                picked = [sources[i] for i in order[start:start + chunk]]
                for k, (src, data) in enumerate(zip(picked, pool.map(lambda s: _read(s.path), picked))):
                    writer.add(f"{start + k:08d}", data, src)
                    bar.update(1)
            manifest["splits"][split] = writer.finish()
    bar.close()
    tmp = os.path.join(out, MANIFEST + ".partial")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())  # on disk before its name says the shards are whole, as each shard is
    os.replace(tmp, os.path.join(out, MANIFEST))
    return manifest


# ---------------------------------------------------------------------------------------- reading
def read_manifest(root: str | None) -> dict:
    if not root:
        raise UsageError("--dataset shards needs --data-dir DIR (written by python -m hvdtrain.shards write)")
    path = os.path.join(root, MANIFEST)
    if not os.path.isdir(root):
        raise UsageError(f"data dir '{root}' does not exist")
    if not os.path.exists(path):
        partial = any(f.endswith(".partial") for _, _, files in os.walk(root) for f in files)
        raise UsageError(f"'{root}' holds no {MANIFEST}: "
                         + ("its conversion did not finish (write it again)" if partial else
                            "not a shard directory (python -m hvdtrain.shards write ... --out DIR)"))
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as err:
        raise UsageError(f"cannot read {path} ({err})") from None
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise UsageError(f"{path} is not a version-{VERSION} {FORMAT} manifest")
    return manifest


class ShardReader:
    """A split's samples by index: (image bytes, label). Open files are kept per process (each
    DataLoader worker opens its own), those it is reading now (hvdtrain/data/open_files.py)."""

    def __init__(self, root: str, split: str):
        manifest = read_manifest(root)
        if split not in manifest["splits"]:
            raise UsageError(f"'{root}' has no {split} split (it has: {', '.join(manifest['splits'])})")
        self.root, self.split, self.classes = root, split, manifest["classes"]
        meta = manifest["splits"][split]
        self.shards = [os.path.join(root, s["name"]) for s in meta["shards"]]
        for shard, expected in zip(self.shards, meta["shards"]) if sizes_checked_here() else ():
            try:
                size = os.path.getsize(shard)
            except OSError:
                raise UsageError(f"shard {shard} is missing ({meta['samples']} samples in {len(self.shards)} shards "
                                 f"expected by {MANIFEST})") from None
            if size != expected["bytes"]:
                raise UsageError(f"shard {shard} is damaged: {size} bytes, {expected['bytes']} written "
                                 f"(python -m hvdtrain.shards verify {root})")
        self.index_path = os.path.join(root, meta["index"])
        self.index = load_index(self.index_path)
        self.extensions = [str(e) for e in self.index["extensions"]]
        if len(self.index["label"]) != meta["samples"]:
            raise UsageError(f"{os.path.join(root, meta['index'])} holds {len(self.index['label'])} samples, "
                             f"{MANIFEST} {meta['samples']}")
        self.labels = self.index["label"]
        # Descriptors: the shards being read, within the process's share of its open-file limit
        # (hvdtrain/data/open_files.py): a rank's workers read a few shards an epoch in training
        # (datasets.shard_blocked_order), but a user's order may reach every one.
        open_files.check_limit(f"{len(self.shards)} shards in {root}", *open_files.raise_soft_limit())
        self.files = open_files.OpenFiles(self.shards)

    def __getstate__(self):  # to a DataLoader worker: not the index (mapped again there) nor descriptors
        return {k: v for k, v in self.__dict__.items() if k not in ("index", "labels")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.index = load_index(self.index_path)
        self.labels = self.index["label"]

    def __len__(self) -> int:
        return len(self.labels)

    def member(self, i: int) -> str:
        return f"{i:08d}.{self.extensions[self.index['ext'][i]]}"

    def where(self, i: int) -> str:
        return f"shard {self.shards[self.index['shard'][i]]}, member {self.member(i)}"

    def read(self, i: int) -> tuple[bytes, int]:
        shard, offset, size = int(self.index["shard"][i]), int(self.index["offset"][i]), int(self.index["size"][i])
        try:
            data = self.files.pread(shard, size, offset)
        except OSError as err:  # gone, unreadable, a failing file system: one line, on every rank
            raise datasets.BadSample(f"cannot read {self.where(i)} ({err.strerror or err})") from None
        if len(data) != size or zlib.crc32(data) != int(self.index["crc32"][i]):
            raise datasets.BadSample(f"{self.where(i)} is damaged ({'truncated' if len(data) != size else 'checksum'}"
                                     f" differs from {MANIFEST}; python -m hvdtrain.shards verify {self.root})")
        return data, int(self.labels[i])


def sizes_checked_here(environ=None) -> bool:
    """Whether this process checks every shard's size at its reader's start: the job's rank 0 only
    (rank from the launcher's variables, hvdtrain/cluster/env.py). On every rank it would be 1,143 stats
    each for ImageNet, 293 k for a 256-rank job at every start and requeue, for the same answer. A problem
    ends rank 0 with its line and the launcher ends the rest; a damaged member is still caught on
    every rank at its read, by its CRC-32."""
    from hvdtrain.cluster.env import ClusterEnv

    try:
        return ClusterEnv.from_environ(environ).rank == 0
    except UsageError:
        return True  # the launcher's variables will be said wrong elsewhere: check here too


def load_index(path: str) -> dict[str, np.ndarray]:
    """The arrays of an index.npz, each memory-mapped read-only where it is stored uncompressed (as
    np.savez writes them): the pages are shared through the page cache by every process of a node
    and read as used. Loaded (np.load), each decode worker held its own copy, pickled to it: about
    33 bytes a sample, 42 MB for ImageNet's 1.28 M, 630 MB for a rank's 15 workers."""
    arrays = {}
    try:
        # One open of the file: the archive's listing and every array's map go through it.
        with open(path, "rb") as f, zipfile.ZipFile(f) as archive:
            for member in archive.infolist():
                name = member.filename.removesuffix(".npy")
                if member.compress_type != zipfile.ZIP_STORED:
                    arrays[name] = np.load(archive.open(member))
                    continue
                # The member's bytes follow its local header: 30 bytes, then its name and extra field.
                f.seek(member.header_offset)
                local = f.read(30)
                name_size, extra_size = struct.unpack("<HH", local[26:30])
                f.seek(member.header_offset + 30 + name_size + extra_size)
                version = np.lib.format.read_magic(f)
                read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                    np.lib.format.read_array_header_2_0
                shape, fortran_order, dtype = read_header(f)
                if dtype.hasobject or not all(shape):  # never written by hvdtrain; an empty array maps nothing
                    arrays[name] = np.load(archive.open(member), allow_pickle=False)
                    continue
                arrays[name] = np.memmap(f, dtype=dtype, mode="r", offset=f.tell(), shape=shape,
                                         order="F" if fortran_order else "C")
    except (OSError, zipfile.BadZipFile, ValueError, struct.error) as err:
        raise UsageError(f"cannot read the index {path} ({err}): python -m hvdtrain.shards verify "
                         f"{os.path.dirname(os.path.dirname(path))}") from None
    return arrays


def verify(root: str, progress: bool = True) -> list[str]:
    """Each shard's problem against the manifest (missing, size, sha256), none when all are whole."""
    from tqdm import tqdm

    manifest = read_manifest(root)
    problems = []
    shards = [s for split in manifest["splits"].values() for s in split["shards"]]
    for shard in tqdm(shards, unit="shard", desc="verify", disable=not progress, file=sys.stderr):
        path = os.path.join(root, shard["name"])
        if not os.path.exists(path):
            problems.append(f"shard {path} is missing")
            continue
        if _sha256(path) != shard["sha256"]:
            problems.append(f"shard {path} is damaged (sha256 differs from {MANIFEST})")
    return problems


# ---------------------------------------------------------------------------------------- command line
def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m hvdtrain.shards", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write", help="write an image folder tree or pickled indexes as tar shards")
    w.add_argument("--imagefolder", metavar="DIR", help="a tree of train/<class>/<image> and val/<class>/<image>")
    w.add_argument("--index", action="append", default=[], metavar="SPLIT=FILE.pkl",
                   help="a pickled {relative path: label} dict or (path, label) list per split (train=..., val=...)")
    w.add_argument("--root", help="the folder the indexes' paths are relative to")
    w.add_argument("--out", required=True, help="a new directory for the shards and their manifest")
    w.add_argument("--shard-mb", type=float, default=128.0, help="shard size in MB (default: 128, about 1,100 "
                                                                 "shards for ImageNet)")
    w.add_argument("--jobs", type=int, default=8, help="files read at once (default: 8)")
    v = sub.add_parser("verify", help="check every shard against the manifest's checksums")
    v.add_argument("dir")
    args = p.parse_args(argv)
    try:
        if args.command == "verify":
            problems = verify(args.dir)
            for line in problems:
                print(f"hvdtrain.shards: {line}", file=sys.stderr)
            print(f"hvdtrain.shards: {'NOT OK' if problems else 'OK'}: {args.dir}")
            sys.exit(1 if problems else 0)
        if bool(args.imagefolder) == bool(args.index):
            raise UsageError("give --imagefolder DIR or --index SPLIT=FILE.pkl (with --root), not both or neither")
        if args.index:
            pairs = [item.partition("=") for item in args.index]
            bad = [split for split, eq, _ in pairs if not eq or split not in SPLITS]
            if bad or not args.root:
                raise UsageError("--index takes train=FILE.pkl and val=FILE.pkl, with --root DIR")
            classes, splits = index_sources({split: path for split, _, path in pairs}, args.root)
            source = f"index {', '.join(args.index)} under {args.root}"
        else:
            classes, splits = imagefolder_sources(args.imagefolder)
            source = f"imagefolder {args.imagefolder}"
        started = time.perf_counter()
        manifest = write(args.out, classes, splits, args.shard_mb, args.jobs, source=source)
        counts = ", ".join(f"{split} {m['samples']} samples in {len(m['shards'])} shards"
                           for split, m in manifest["splits"].items())
        print(f"hvdtrain.shards: wrote {args.out}: {counts}, {len(classes)} classes "
              f"({time.perf_counter() - started:.1f} s)")
    except UsageError as err:
        print(f"hvdtrain.shards: error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
