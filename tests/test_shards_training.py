"""Training from tar shards under mpirun -np 2 (the distributed tier): each rank its own samples,
validation exact, a resume in the middle of an epoch ending with the uninterrupted run's weights
(same samples, same crops: augmentation is a function of (seed, epoch, sample)), and a damaged
member ending every rank with one line naming the shard and the member."""
import json
import shutil

import pytest

from conftest import PYTHON, assert_job_failed_with, assert_weights_equal, digits_shards, launch
from hvdtrain.data import shards

pytestmark = pytest.mark.slow

VAL = 49  # odd: one rank validates one sample more, each sample counted once


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory):
    return digits_shards(str(tmp_path_factory.mktemp("shards")))


def train(tmp_path, data_dir, name, *extra, check=True):
    result = tmp_path / f"{name}.json"
    run = launch("mpirun", 2, [PYTHON, "-m", "hvdtrain.torch", "--model", "mnist_cnn", "--dataset", "shards",
                               "--data-dir", data_dir, "--image-size", "16", "--batch-size", "8", "--epochs", "2",
                               "--base-lr", "0.01", "--threads-per-rank", "1", "--num-workers", "1",
                               "--log-interval", "4", "--result-json", str(result), *extra], timeout=180, check=check)
    return json.loads(result.read_text()) if check else run


def test_a_resume_from_shards_mid_epoch_ends_with_the_uninterrupted_weights(shard_dir, tmp_path):
    whole = train(tmp_path, shard_dir, "whole", "--checkpoint-dir", str(tmp_path / "whole"))
    assert whole["config"]["dataset"] == "shards" and whole["config"]["num_workers"] == 1
    # A CPU, a core per rank: its worker normalises, no feeder thread competes for the core.
    assert whole["images_normalised_in"] == "decode workers" and whole["feeder_thread"] is False
    assert whole["history"][-1]["val_count"] == VAL
    # What a step allreduces, for hvdtrain.predict: the model's trainable parameters' bytes.
    from hvdtrain.torch.models import build_model
    built = build_model("mnist_cnn", 3, 10, 16)
    assert whole["gradient_bytes"] == 4 * sum(p.numel() for p in built.parameters()), whole["gradient_bytes"]
    assert len({r["param_checksum"] for r in whole["ranks"]}) == 1, whole["ranks"]
    # 200 images, 2 ranks, batch 8: 12 steps an epoch; stopped at step 5 of epoch 2.
    part = train(tmp_path, shard_dir, "part", "--checkpoint-dir", str(tmp_path / "part"), "--steps", "17")
    assert part["global_step"] == 17
    rest = train(tmp_path, shard_dir, "rest", "--checkpoint-dir", str(tmp_path / "part"))
    assert rest["global_step"] == 24 and rest["history"][-1]["val_count"] == VAL
    assert_weights_equal(tmp_path / "whole", tmp_path / "part")


def test_a_damaged_member_ends_every_rank_with_one_line(shard_dir, tmp_path):
    damaged = tmp_path / "damaged"
    shutil.copytree(shard_dir, damaged)
    reader = shards.ShardReader(str(damaged), "train")
    shard, offset = reader.shards[reader.index["shard"][3]], int(reader.index["offset"][3])
    with open(shard, "r+b") as f:
        f.seek(offset + 100)
        f.write(b"\x00\x01\x02")
    run = train(tmp_path, str(damaged), "damaged", check=False)
    assert_job_failed_with(run, f"shard {shard}, member 00000003.jpg is damaged", 2)


def test_more_shards_than_open_files_train_an_epoch_with_several_workers(tmp_path):
    """benchmarks/imagenet_scale.py's case, reduced: 320 training shards, a hard open-file limit of 400 (nothing to
    raise the soft one to: 144 shards kept open per process), one rank reading them all with 3
    decode workers: the epoch trains, validates every sample and ends."""
    from hvdtrain.data.datasets import write_digits_imagefolder

    folder = write_digits_imagefolder(str(tmp_path / "folder"), per_class_train=64, per_class_val=4, size=16, fmt="jpg")
    data = str(tmp_path / "shards")
    manifest = shards.write(data, *shards.imagefolder_sources(folder), shard_mb=0.003, progress=False)
    assert len(manifest["splits"]["train"]["shards"]) >= 300
    result = tmp_path / "result.json"
    launch("single", 1, ["prlimit", "--nofile=400:400", PYTHON, "-m", "hvdtrain.torch", "--model", "mnist_cnn",
                         "--dataset", "shards", "--data-dir", data, "--image-size", "16", "--batch-size", "16",
                         "--threads-per-rank", "1", "--num-workers", "3", "--result-json", str(result)], timeout=180)
    done = json.loads(result.read_text())
    assert done["global_step"] == 40 and done["history"][-1]["val_count"] == 40
