"""The torch data path walked, from the trainer's epoch to a batch the model takes: which of
hvdtrain's functions (hops) and files a reader follows to see how an option becomes a batch.

    python benchmarks/loader_walk.py [--dataset shards] [--num-workers 0]

One rank (Horovod's singleton) trains two steps of a tiny generated image folder (or its
shards) with the feeder inline and no decode workers, so that the whole path runs on the main
thread. A profiler records the stack of hvdtrain's frames, from the trainer's `_train_epoch` on,
at four events: the epoch's order made (a sampler), a torch DataLoader made, a training crop's
window computed (a sample read and cropped), a batch made the model's input. The walk from
option to batch is the union of the first three stacks but for the device feeder's frames; the
feeder's (hvdtrain/torch/feeder.py) and the last event's, the batch's way to the model, are
counted apart. Prints each stack and
the totals: hops (distinct hvdtrain functions besides `_train_epoch`) and files.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

PACKAGE = os.path.join(REPO, "hvdtrain") + os.sep
ROOT = "_train_epoch"
TO_MODEL = "batch made the model's input"


def make_folder(root: str, per_class: int = 8, size: int = 48) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for label in ("a", "b"):
            os.makedirs(f"{root}/{split}/{label}", exist_ok=True)
            for i in range(per_class):
                pixels = rng.integers(0, 255, (size, size + 8, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(f"{root}/{split}/{label}/{i}.jpg")


def chain(frame) -> list[tuple[str, str]] | None:
    """hvdtrain's frames on the stack, outermost first, from the trainer's epoch on."""
    frames = []
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(PACKAGE):
            frames.append((os.path.relpath(path, REPO), frame.f_code.co_qualname))
            if frame.f_code.co_name == ROOT:
                return frames[::-1]
        frame = frame.f_back
    return None


def walk(values: dict) -> dict[str, list[tuple[str, str]]]:
    import torch.utils.data

    from hvdtrain.data import augment
    from hvdtrain.config import config_from_values
    from hvdtrain.torch import images, train

    from hvdtrain.torch import data

    events = {"order made": (torch.utils.data.DistributedSampler.__init__.__code__,
                             data.ShardBlockedSampler.__init__.__code__),
              "DataLoader made": (torch.utils.data.DataLoader.__init__.__code__,),
              "crop window drawn": (augment.train_window.__code__,),
              TO_MODEL: (images.to_model_input.__code__,)}
    seen: dict[str, list] = {}

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        what = next((name for name, targets in events.items() if code in targets), None)
        if what and what not in seen:
            found = chain(frame)
            if found:
                seen[what] = found

    cfg = config_from_values("torch", values)
    sys.setprofile(profile)
    try:
        train.run(cfg)
    finally:
        sys.setprofile(None)
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=("imagefolder", "shards"), default="imagefolder")
    args = parser.parse_args()
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    with tempfile.TemporaryDirectory() as tmp:
        make_folder(f"{tmp}/folder")
        data_dir = f"{tmp}/folder"
        if args.dataset == "shards":
            from hvdtrain.data import shards
            shards.main(["write", "--imagefolder", f"{tmp}/folder", "--out", f"{tmp}/shards", "--shard-mb", "0.01"])
            data_dir = f"{tmp}/shards"
        seen = walk({"model": "resnet18", "dataset": args.dataset, "data_dir": data_dir, "image_size": 32,
                     "batch_size": 4, "steps": 2, "validation": "off", "num_workers": 0, "feeder": "off"})
    hops, files, onward = set(), set(), set()
    for what, frames in seen.items():
        print(f"{what}:")
        for path, name in frames:
            print(f"    {path}:{name}")
            if name.split(".")[-1] == ROOT:
                continue
            if path.endswith("feeder.py") or what == TO_MODEL:
                onward.add((path, name))
            else:
                hops.add((path, name))
                files.add(path)
    onward -= hops
    print(f"\noption to batch: {len(hops)} hops over {len(files)} files; then to the model's input: {len(onward)} "
          f"more (the feeder and the normalisation) (events seen: {len(seen)} of 4)")


if __name__ == "__main__":
    main()
