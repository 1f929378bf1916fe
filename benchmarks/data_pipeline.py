"""Image input pipelines measured side by side in one run: img/s per core for each way of turning
a JPEG into a training sample, then the training throughput on JPEG shards and folders against
synthetic images in memory, and the feeder's effect on the `data` phase.

    python benchmarks/data_pipeline.py                      # about 3 minutes on 2 cores
    python benchmarks/data_pipeline.py --images 2000 --repeats 5 --train-model resnet50 --image-size 224

It writes ImageNet-sized JPEGs (500x375, quality 90, a smooth picture plus grain: about the bytes
of an ImageNet photo) as an image folder and as shards, under --out. Per-core figures run one
thread in this process, the pipelines alternated in each repeat (a noisy spell hits all alike);
the median of the repeats is printed. The training runs are `python -m hvdtrain.torch` processes,
one rank, --threads-per-rank compute threads and --num-workers decode workers.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np


def write_jpegs(root: str, count: int, classes: int = 10) -> float:
    """An imagefolder tree of ImageNet-sized JPEGs; their mean size in KB."""
    from PIL import Image

    rng = np.random.default_rng(0)
    classes = min(classes, count)  # every class in both splits
    sizes = []
    for split, n in (("train", count), ("val", max(classes, count // 10))):
        for i in range(n):
            folder = os.path.join(root, split, f"class{i % classes:02d}")
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"{i:06d}.jpg")
            if not os.path.exists(path):
                coarse = Image.fromarray(rng.integers(0, 255, (12, 16, 3), dtype=np.uint8)).resize((500, 375),
                                                                                                  Image.BICUBIC)
                grain = rng.normal(0, 12, (375, 500, 3))
                pixels = np.clip(np.asarray(coarse, dtype=np.float64) + grain, 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(path, quality=90)
            sizes.append(os.path.getsize(path))
    return sum(sizes) / len(sizes) / 1024


def jpeg_folder_and_shards(out: str, count: int) -> tuple[str, str, float]:
    """write_jpegs under out/folder and the same images as shards under out/shards (once):
    (folder, shards directory, mean JPEG size in KB)."""
    from hvdtrain.data import shards

    folder, shard_dir = os.path.join(out, "folder"), os.path.join(out, "shards")
    kb = write_jpegs(folder, count)
    if not os.path.exists(os.path.join(shard_dir, shards.MANIFEST)):
        shards.write(shard_dir, *shards.imagefolder_sources(folder), progress=False)
    return folder, shard_dir, kb


DALI_BATCH = 32


def pipelines(folder: str, shards_dir: str, size: int) -> dict:
    """name -> (a function of an index, how many indices, [images per call: 1])."""
    import torch
    from PIL import Image
    from torchvision import transforms as T

    from hvdtrain.torch import images

    files = sorted(os.path.join(dp, f) for dp, _, fs in os.walk(os.path.join(folder, "train")) for f in fs)
    blobs = [open(f, "rb").read() for f in files]  # decode speed, not the disk's: the bytes are read once
    norm = T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    before = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(), norm])
    pil_uint8 = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.PILToTensor()])
    augment = images.train_augment(size)

    def pil(i, transform):
        return transform(Image.open(io.BytesIO(blobs[i])).convert("RGB"))

    table = {
        "PIL + ToTensor + Normalize, float32 (hvdtrain before)": (lambda i: pil(i, before), len(blobs)),
        "PIL, uint8": (lambda i: pil(i, pil_uint8), len(blobs)),
    }
    import warnings

    from torchvision.io import decode_jpeg
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    table["torchvision decode_jpeg + v2, uint8"] = (
        lambda i: augment(decode_jpeg(torch.frombuffer(bytearray(blobs[i]), dtype=torch.uint8))), len(blobs))
    try:
        from torchcodec.decoders import decode_jpeg as codec_jpeg

        table["torchcodec decode_jpeg + v2, uint8"] = (lambda i: augment(codec_jpeg(blobs[i])), len(blobs))
    except ImportError:
        pass
    from torchvision.datasets import ImageFolder

    before_folder = ImageFolder(os.path.join(folder, "train"), transform=before)
    table["hvdtrain before, from a folder (ImageFolder, PIL, float32)"] = (lambda i: before_folder[i][0],
                                                                           len(before_folder))
    train_folder = images.image_folder(os.path.join(folder, "train"), augment)
    table[f"hvdtrain default from a folder ({images.DECODER})"] = (lambda i: train_folder[i][0], len(train_folder))
    train_shards = images.ShardImages(shards_dir, "train", augment)
    table["hvdtrain default from shards"] = (lambda i: train_shards[i][0], len(train_shards))
    try:  # DALI's CPU mode, one thread, when it is installed (pip install nvidia-dali-cuda130)
        from hvdtrain.torch import dali

        dali.require()
        batches = [list(range(k, k + DALI_BATCH)) for k in range(0, len(train_shards) - DALI_BATCH + 1, DALI_BATCH)]
        loader = dali.DaliLoader(train_shards, batches, train=True, epoch=0, size=size, threads=1,
                                 device=torch.device("cpu"))
        table[f"--loader dali, CPU mode, from shards (batches of {DALI_BATCH})"] = (
            lambda i: loader._run(batches[i % len(batches)]), len(batches), DALI_BATCH)
    except Exception as err:  # noqa: BLE001 - reported, the rest measured
        print(f"(DALI not measured: {str(err).splitlines()[0]})")
    try:
        table.update(tensorflow_pipelines(blobs, size))
    except ImportError as err:
        print(f"(TensorFlow not measured: {err})")
    return table


def loader_decoding_whole_images(read_bytes, labels, size: int, train: bool, uint8: bool = False):
    """hvdtrain/tf/data.py's _image_loader as it was at commit 28df670, its seed
    made from the sample index: the whole image decoded, converted to float32, resized to a
    1.14 x size square, then a random crop and flip (training) or the centre (validation). For the
    per-core rows here and tf_data_training.py's "before" run."""
    import tensorflow as tf

    from hvdtrain.data import datasets

    labels_t = tf.constant(labels, dtype=tf.int64)
    mean, std = tf.constant(datasets.IMAGENET_MEAN), tf.constant(datasets.IMAGENET_STD)

    def load(i, draws=None, data=None):
        image = tf.io.decode_image(read_bytes(i) if data is None else data, channels=3, expand_animations=False)
        image = tf.image.convert_image_dtype(image, tf.float32)
        image = tf.image.resize(image, [int(size * 1.14), int(size * 1.14)])
        if train:
            sample_seed = tf.stack([tf.constant(7, tf.int64), tf.cast(i, tf.int64)])
            crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(sample_seed, 2))
            image = tf.image.stateless_random_crop(image, [size, size, 3], seed=crop_seed)
            image = tf.image.stateless_random_flip_left_right(image, seed=flip_seed)
        else:
            image = tf.image.resize_with_crop_or_pad(image, size, size)
        return (image - mean) / std, labels_t[i]
    return load


TF_BATCH = 32


def tensorflow_pipelines(blobs: list[bytes], size: int) -> dict:
    """TensorFlow's per-sample function in a tf.data pipeline as hvdtrain.tf runs it (a map on one
    thread, batches of TF_BATCH): today's (hvdtrain/tf/data.py: only the window decoded,
    hvdtrain/data/augment.py's rule), as floats (a CPU's) and as uint8 (a GPU's, normalised on the
    device, as torch's rows here are uint8), and the one of commit 28df670 (the whole image decoded,
    resized to a 1.14 x size square, cropped)."""
    import tensorflow as tf

    from hvdtrain.data import augment
    from hvdtrain.tf import data as tf_data

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    files = tf.constant(blobs)
    draws = tf.constant(augment.sample_draws(7, 0, range(len(blobs))))
    before_load = loader_decoding_whole_images(lambda i: files[i], [0] * len(blobs), size, True)

    def before(i):
        return before_load(i)[0]

    def now(uint8):
        load = tf_data._image_loader(lambda i: files[i], [0] * len(blobs), size, True, uint8=uint8)
        return lambda i: load(i, draws[i])[0]

    options = tf_data.TFData(0, 0, None, None, None, None, None, True, threads=1).options()

    def batches(function):
        ds = tf.data.Dataset.range(len(blobs)).repeat().map(function, num_parallel_calls=1).batch(TF_BATCH)
        iterator = iter(ds.prefetch(1).with_options(options))
        return lambda i: next(iterator), len(blobs), TF_BATCH

    table = {"TensorFlow before (whole image, 1.14 x size square, random crop), float32": batches(before),
             "TensorFlow now (decode_and_crop_jpeg of hvdtrain's window), float32 (a CPU's)": batches(now(False)),
             "TensorFlow now, uint8 (a GPU's)": batches(now(True))}
    try:  # TensorFlow's --loader dali: tf.data packs, DALI's CPU mode decodes, one thread each
        from hvdtrain.tf import dali as tf_dali

        tf_dali.require()
        load = tf_data._image_loader(lambda i: files[i], [0] * len(blobs), size, True)
        packed = tf.data.Dataset.range(len(blobs)).repeat().map(lambda i: load.packed(i, draws[i]))
        dali_batches = iter(tf_dali._dali_dataset(packed.with_options(options), DALI_BATCH, size, 1))
        table[f"TensorFlow --loader dali, CPU mode (batches of {DALI_BATCH})"] = (
            lambda i: next(dali_batches), len(blobs), DALI_BATCH)
    except Exception as err:  # noqa: BLE001 - reported, the rest measured
        print(f"(TensorFlow's DALI not measured: {str(err).splitlines()[0]})")
    return table


def per_core(table: dict, repeats: int, seconds: float) -> dict:
    import torch

    torch.set_num_threads(1)
    rates = {name: [] for name in table}
    for _ in range(repeats):
        for name, (sample, n, *per_call) in table.items():
            # Per CPU-second of this process, every thread counted: DALI's dataset under
            # TensorFlow keeps its own thread and tf.data's busy at once (1.9 cores here), which
            # images per wall-second would count as one core's.
            done, i, start, cpu = 0, 0, time.perf_counter(), time.process_time()
            while time.perf_counter() - start < seconds:
                sample(i % n)
                i += 1
                done += per_call[0] if per_call else 1
            rates[name].append(done / (time.process_time() - cpu))
    return {name: statistics.median(r) for name, r in rates.items()}


def train(args, dataset: str, data_dir: str | None, feeder: str, out: str, extra=()) -> dict:
    result = os.path.join(out, f"train-{dataset}-{feeder}{'-'.join(('',) + tuple(extra))}.json")
    cmd = [sys.executable, "-m", "hvdtrain.torch", "--model", args.train_model, "--dataset", dataset,
           "--image-size", str(args.image_size), "--batch-size", str(args.batch_size), "--steps", str(args.steps),
           "--untimed-steps", "3", "--threads-per-rank", str(args.threads), "--num-workers", str(args.workers),
           "--feeder", feeder, "--validation", "off", "--log-interval", "5", "--result-json", result,
           "--synthetic-size", str(args.batch_size * (args.steps + 4))]
    if data_dir:
        cmd += ["--data-dir", data_dir]
    cmd += list(extra)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    with open(result) as f:
        r = json.load(f)
    return {"rate": r["throughput"]["total_images_per_sec"], "phases": r["ranks"][0].get("phases_ms") or {}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="/tmp/hvdtrain-data-pipeline")
    p.add_argument("--images", type=int, default=600, help="training JPEGs written (and a tenth for val)")
    p.add_argument("--size", type=int, default=224, help="the crop of the per-core figures")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seconds", type=float, default=2.0, help="per pipeline and repeat")
    p.add_argument("--train-model", default="resnet18")
    p.add_argument("--image-size", type=int, default=64, help="the training runs' crop")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--feeder-steps", type=int, default=6, help="steps of the 224 px feeder on/off runs")
    p.add_argument("--threads", type=int, default=1, help="compute threads of the training runs")
    p.add_argument("--workers", type=int, default=1, help="decode workers of the training runs")
    args = p.parse_args()

    from hvdtrain.data import shards

    folder, shards_dir = os.path.join(args.out, "folder"), os.path.join(args.out, "shards")
    kb = write_jpegs(folder, args.images)
    if not os.path.exists(os.path.join(shards_dir, shards.MANIFEST)):
        shards.write(shards_dir, *shards.imagefolder_sources(folder), shard_mb=16, progress=False)
    print(f"{args.images} training JPEGs of 500x375, {kb:.0f} KB on average, in {folder} and {shards_dir}")

    print(f"\nimages per CPU-second, every thread of this process (RandomResizedCrop {args.size} + flip; "
          f"median of {args.repeats}):")
    rates = per_core(pipelines(folder, shards_dir, args.size), args.repeats, args.seconds)
    base = next(iter(rates.values()))
    for name, rate in rates.items():
        print(f"  {rate:7.1f}  {rate / base:4.2f}x  {name}")
    folder_rate = rates[next(n for n in rates if n.startswith("hvdtrain default from a folder"))]
    before_rate = rates[next(n for n in rates if n.startswith("hvdtrain before, from a folder"))]
    print(f"  default / before, both from a folder: {folder_rate / before_rate:.2f}; shards / folder: "
          f"{rates['hvdtrain default from shards'] / folder_rate:.2f}")

    print(f"\ntraining {args.train_model} at {args.image_size}px, batch {args.batch_size}, {args.threads} compute "
          f"thread(s), {args.workers} decode worker(s), {args.steps} steps (img/s; data ms per step):")
    runs = {}
    configs = [("synthetic, in memory", "synthetic", None, "on", ()),
               ("synthetic, in memory, feeder off", "synthetic", None, "off", ()),
               ("JPEG shards", "shards", shards_dir, "on", ()),
               ("JPEG folder", "imagefolder", folder, "on", ()),
               ("JPEG shards, feeder off", "shards", shards_dir, "off", ())]
    if any(name.startswith("--loader dali") for name in rates):
        configs.append(("JPEG shards, --loader dali (CPU mode)", "shards", shards_dir, "on", ("--loader", "dali")))
    for name, dataset, data_dir, feeder, extra in configs:
        runs[name] = run = train(args, dataset, data_dir, feeder, args.out, extra)
        print(f"  {run['rate']:7.1f}  data {run['phases'].get('data', float('nan')):6.1f} ms of "
              f"{sum(run['phases'].values()):6.1f}  {name}", flush=True)
    # The feeder's own effect where the host's share is visible on a CPU: 224 px in-memory batches,
    # whose gather takes milliseconds (the plain loop's host time on a GPU).
    big = argparse.Namespace(**{**vars(args), "image_size": 224, "steps": args.feeder_steps})
    for feeder in ("on", "off"):
        run = train(big, "synthetic", None, feeder, os.path.join(args.out))
        print(f"  {run['rate']:7.1f}  data {run['phases'].get('data', float('nan')):6.1f} ms of "
              f"{sum(run['phases'].values()):6.1f}  synthetic at 224 px, in memory, feeder {feeder}", flush=True)
    synthetic = runs["synthetic, in memory"]["rate"]
    print(f"  JPEG shards / synthetic: {runs['JPEG shards']['rate'] / synthetic:.2f}; "
          f"JPEG folder / synthetic: {runs['JPEG folder']['rate'] / synthetic:.2f}")


if __name__ == "__main__":
    main()
