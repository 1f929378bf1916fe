"""The JSC course's own ImageNet Dataset (torch_examples/jsc_imagenet_dataset.py: a pickled
index of (relative path, label) under $DATA_ROOT) trains hvdtrain's built-in ResNet through
`--dataset FILE.py:datasets`, launched for real on small digit images."""
import json
import os
import pickle

import pytest

from conftest import PYTHON, REPO, base_env, launch
from hvdtrain.data.datasets import write_digits_imagefolder

pytestmark = pytest.mark.slow  # real ranks: the distributed tier

EXAMPLE = f"{REPO}/torch_examples/jsc_imagenet_dataset.py"


def write_indexed_images(root) -> dict:
    """Digit PNGs under root/{train,val}/<digit>/ and their indexes: train's a dict
    {relative path: label}, val's a list of (relative path, label) pairs (both forms are read)."""
    write_digits_imagefolder(str(root), per_class_train=8, per_class_val=3, size=20)
    index = {}
    for split in ("train", "val"):
        pairs = sorted((os.path.join(split, digit, name), int(digit))
                       for digit in os.listdir(root / split) for name in os.listdir(root / split / digit))
        index[split] = dict(pairs) if split == "train" else pairs
        with open(root / f"{split}_index.pkl", "wb") as f:
            pickle.dump(index[split], f)
    return index


def test_resnet_trains_on_the_jsc_imagenet_dataset(tmp_path):
    index = write_indexed_images(tmp_path / "data")
    result = tmp_path / "result.json"
    reference = f"{EXAMPLE}:datasets"
    env = {**base_env(), "DATA_ROOT": str(tmp_path / "data"), "IMAGE_SIZE": "16"}
    launch("mpirun", 2, [PYTHON, "-m", "hvdtrain.torch", "--model", "resnet18", "--dataset", reference,
                         "--image-size", "16", "--batch-size", "8", "--epochs", "1", "--threads-per-rank", "1",
                         "--num-workers", "1", "--result-json", str(result)], timeout=120, env=env)
    out = json.loads(result.read_text())
    assert len(index["train"]) == 80 and len(index["val"]) == 30
    assert out["world_size"] == 2 and out["history"][-1]["epoch"] == 1
    assert out["history"][-1]["val_count"] == len(index["val"])
    assert len({r["param_checksum"] for r in out["ranks"]}) == 1, out["ranks"]
    assert out["config"]["dataset"] == reference and out["config"]["model"] == "resnet18"
