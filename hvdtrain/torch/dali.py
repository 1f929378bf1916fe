"""NVIDIA DALI decodes the image files (`--loader dali`): on a GPU with `device="mixed"` (nvJPEG,
and the A100's and H100's hardware JPEG decoder), on a CPU with DALI's CPU mode (`device_id=None`),
which runs the same graph: the test suite runs it under mpirun.

    pip install nvidia-dali-cuda130        # nvidia-dali-cuda120 for a CUDA 12 torch
    srun python -m hvdtrain.torch --model resnet50 --dataset shards --data-dir $SHARDS --loader dali

Choose it when a GPU has few cores to decode with (docs/data.md: ResNet-50 on an H100 needs about
six cores of libjpeg-turbo; DALI decodes on the GPU itself).

What stays hvdtrain's: which samples each rank reads, in which order (the same (seed, epoch)
shards and batches as the torch loader: hvdtrain/torch/data.py `rank_batches`), exact
validation, and the random crop and flip of each sample, drawn here as a function of (seed,
epoch, sample index) and handed to DALI as arguments. So a resume in the middle of an epoch
reads the same samples with the same crops and ends with the weights of an uninterrupted run
(tests/test_dali.py). What is DALI's: reading the crop from the JPEG (it decodes only that
region), resizing (its filters, not torchvision's: the pixels differ slightly from
`--loader torch`) and the normalisation, whose float32 CHW output lands on the device.
"""
from __future__ import annotations


import numpy as np
import torch

from hvdtrain.data import augment, dali_graph, datasets, parallel_reads
from hvdtrain.errors import UsageError
from hvdtrain.torch import data, images


def require():
    """DALI's modules, or one line saying how to install it."""
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        cuda = (torch.version.cuda or "13.0").split(".")[0]
        raise UsageError(f"--loader dali needs NVIDIA DALI, which is not installed: pip install "
                         f"nvidia-dali-cuda{cuda}0 (for this torch's CUDA {torch.version.cuda or '-'}), or use "
                         "--loader torch") from None
    from nvidia.dali import fn, pipeline_def, types

    return fn, pipeline_def, types


# ---------------------------------------------------------------------------------------- the samples
class EncodedImages:
    """hvdtrain's image datasets (a folder, shards) as (file bytes, label) by index, undecoded."""

    def __init__(self, dataset):
        seeded = isinstance(dataset, data.SeededSamples)
        inner, self.seed = (dataset.dataset, dataset.seed) if seeded else (dataset, 0)
        found = images.encoded_samples(inner)
        if found is None:
            raise UsageError("--loader dali reads image files: --dataset imagefolder or --dataset shards")
        self.read, self.where, self.length = found

    def __len__(self):
        return self.length


# ---------------------------------------------------------------------------------------- the pipelines
def _pipeline(size: int, batch_size: int, threads: int, device: torch.device):
    fn, pipeline_def, types = require()
    gpu = device.type == "cuda"

    # prefetch_queue_depth=1: each run() decodes exactly the batch just fed (batches are ours).
    @pipeline_def(batch_size=batch_size, num_threads=max(1, threads), device_id=device.index if gpu else None,
                  prefetch_queue_depth=1, seed=0)
    def graph():
        files = fn.external_source(name="files", dtype=types.UINT8)
        window = fn.external_source(name="window", dtype=types.FLOAT)  # (top, left, height, width)
        mirror = fn.external_source(name="mirror", dtype=types.INT32)
        return dali_graph.images(fn, types, size=size, gpu=gpu, layout="CHW", files=files, window=window,
                                 mirror=mirror)

    pipe = graph()
    pipe.build()
    return pipe


_PIPELINES: dict = {}  # built once per split, shape and device: an epoch's loader reuses the last one


def pipeline(train: bool, size: int, batch_size: int, threads: int, device: torch.device):
    key = (train, size, batch_size, threads, str(device))
    if key not in _PIPELINES:
        _PIPELINES[key] = _pipeline(size, batch_size, threads, device)
    return _PIPELINES[key]


class DaliLoader:
    """(x, y) batches on the device for the given batches of sample indices (the torch loader's:
    hvdtrain/torch/loader.py makes this loader for a plan whose decoder is DALI): x float32 CHW,
    normalised; y int64. Iterated from one thread at a time (the feeder's)."""

    def __init__(self, dataset, batches: list[list[int]], plan, epoch: int):
        self.train, self.size = plan.split == "train", plan.image_size
        self.source, self.batches, self.epoch = EncodedImages(dataset), batches, epoch
        self.device = torch.device(plan.device)
        longest = max((len(b) for b in batches), default=1)
        self.pipe = pipeline(self.train, plan.image_size, longest, plan.workers, self.device)

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        for batch in self.batches:
            yield self._run(batch)

    def _run(self, batch: list[int]):
        files, labels, windows, mirrors = [], [], [], []
        # The batch's reads overlapped on a pool of threads (hvdtrain/data/parallel_reads.py).
        for i, (data, label) in zip(batch, parallel_reads.read_many(self.source.read, batch)):
            files.append(np.frombuffer(data, dtype=np.uint8))
            labels.append(label)
            # hvdtrain's rule (hvdtrain/data/augment.py), relative to the image's size
            height, width = images.image_shape(data, self.source.where(i))
            window = (augment.train_window(self.source.seed, self.epoch, i, height, width) if self.train
                      else augment.val_window(height, width, self.size))
            windows.append(augment.relative(window, height, width))
            mirrors.append(np.array(int(window.flip), np.int32))
        self.pipe.feed_input("files", files)
        self.pipe.feed_input("window", windows)
        self.pipe.feed_input("mirror", mirrors)
        try:
            (out,) = self.pipe.run()
        except RuntimeError as err:  # DALI names no sample: find the bad one by decoding alone
            raise datasets.BadSample(self._which_failed(batch) or f"DALI failed on a batch: "
                                     f"{str(err).strip().splitlines()[0]}") from None
        # Labels stay on the host, page-locked on a GPU machine: the feeder copies them without a
        # wait (a tensor made from a list straight on the GPU was a blocking copy).
        y = torch.as_tensor(labels, dtype=torch.int64)
        return self._to_torch(out), (y.pin_memory() if self.device.type == "cuda" else y)

    def _which_failed(self, batch) -> str | None:
        for i in batch:
            try:
                images.decode(self.source.read(i)[0], self.source.where(i))
            except datasets.BadSample as err:
                return str(err)
        return None

    def _to_torch(self, out) -> torch.Tensor:
        tensor = out.as_tensor()
        if self.device.type != "cuda":
            return torch.from_numpy(np.array(tensor))
        from nvidia.dali.plugin.pytorch import feed_ndarray

        x = torch.empty(tensor.shape(), dtype=torch.float32, device=self.device)
        feed_ndarray(tensor, x, cuda_stream=torch.cuda.current_stream(self.device))
        return x
