"""Tar shards (hvdtrain/data/shards.py) and the uint8 image pipeline (hvdtrain/torch/images.py), in one
process: what is written reads back exactly, in WebDataset's layout; damage is one line naming the
shard and the member; an unfinished conversion is refused. The distributed tier trains from them
(tests/test_shards_training.py)."""
import json
import os
import pickle
import re
import subprocess
import sys
import tarfile

import pytest
import torch

from conftest import PYTHON
from hvdtrain.data import shards
from hvdtrain.data.datasets import BadSample, write_digits_imagefolder
from hvdtrain.errors import UsageError


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_digits_imagefolder(str(tmp_path_factory.mktemp("digits") / "data"), per_class_train=6,
                                    per_class_val=2, size=16, fmt="jpg")


def source_files(root, split):
    return {open(os.path.join(root, split, c, f), "rb").read(): int(c)
            for c in os.listdir(os.path.join(root, split)) for f in os.listdir(os.path.join(root, split, c))}


def write_cli(*args):
    return subprocess.run([PYTHON, "-m", "hvdtrain.shards", *args], capture_output=True, text=True, timeout=120)


def test_an_imagefolder_round_trip_reads_back_every_file_and_label(folder, tmp_path):
    out = str(tmp_path / "shards")
    done = write_cli("write", "--imagefolder", folder, "--out", out, "--shard-mb", "0.01")
    assert done.returncode == 0, done.stderr
    assert "train 60 samples in" in done.stdout and "val 20 samples" in done.stdout
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    assert manifest["classes"] == [str(c) for c in range(10)]
    for split, count in (("train", 60), ("val", 20)):
        meta = manifest["splits"][split]
        assert meta["samples"] == count == sum(s["samples"] for s in meta["shards"])
        assert len(meta["shards"]) > 1  # 0.01 MB shards: several
        reader = shards.ShardReader(out, split)
        read = [reader.read(i) for i in range(len(reader))]
        # Every file's bytes under its label, once: nothing lost, altered or duplicated.
        assert sorted(read) == sorted(source_files(folder, split).items())
        # WebDataset's layout: KEY.jpg then KEY.cls in each tar, the label in decimal.
        with tarfile.open(os.path.join(out, meta["shards"][0]["name"])) as tar:
            names = tar.getnames()
            assert names[0].endswith(".jpg") and names[1] == names[0][:-4] + ".cls"
            label = int(tar.extractfile(names[1]).read())
            assert tar.extractfile(names[0]).read() == read[0][0] and label == read[0][1]
    # Shards mix classes: written in a shuffled order.
    assert len({label for _, label in read[:10]}) > 1
    assert write_cli("verify", out).returncode == 0


def test_a_pickled_index_is_written_as_shards(folder, tmp_path):
    """The JSC course's index: {relative path: label} (or (path, label) pairs) under a data root."""
    pairs = {split: [(os.path.join(split, c, f), int(c)) for c in sorted(os.listdir(os.path.join(folder, split)))
                     for f in sorted(os.listdir(os.path.join(folder, split, c)))] for split in ("train", "val")}
    pickle.dump(dict(pairs["train"]), open(tmp_path / "train.pkl", "wb"))
    pickle.dump(pairs["val"], open(tmp_path / "val.pkl", "wb"))
    out = str(tmp_path / "shards")
    done = write_cli("write", "--index", f"train={tmp_path / 'train.pkl'}", "--index", f"val={tmp_path / 'val.pkl'}",
                     "--root", folder, "--out", out)
    assert done.returncode == 0, done.stderr
    reader = shards.ShardReader(out, "val")
    assert sorted(reader.read(i) for i in range(len(reader))) == sorted(source_files(folder, "val").items())
    assert reader.classes == [str(c) for c in range(10)]


def test_shard_images_are_uint8_and_augmented_as_a_function_of_the_seed(folder, tmp_path):
    from hvdtrain.torch import images

    out = str(tmp_path / "shards")
    shards.write(out, *shards.imagefolder_sources(folder), progress=False)
    train = images.ShardImages(out, "train", images.train_augment(12))
    torch.manual_seed(3)
    x, y = train[5]
    torch.manual_seed(3)
    again, _ = train[5]
    assert x.dtype == torch.uint8 and x.shape == (3, 12, 12) and 0 <= y < 10
    assert torch.equal(x, again)
    # The device's normalisation: the float result is (x / 255 - mean) / std.
    model_input = images.to_model_input(x[None], train.input_normalization, channels_last=True)
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in train.input_normalization)
    assert torch.allclose(model_input, (x[None].float() / 255 - mean) / std, atol=1e-5)
    assert model_input.is_contiguous(memory_format=torch.channels_last)


def _flip_a_byte_of_member(out, reader, i):
    shard = reader.shards[reader.index["shard"][i]]
    with open(shard, "r+b") as f:
        f.seek(int(reader.index["offset"][i]) + int(reader.index["size"][i]) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    return shard


def test_a_damaged_member_is_one_line_naming_shard_and_member(folder, tmp_path):
    out = str(tmp_path / "shards")
    shards.write(out, *shards.imagefolder_sources(folder), shard_mb=0.01, progress=False)
    reader = shards.ShardReader(out, "train")
    shard = _flip_a_byte_of_member(out, reader, 7)
    with pytest.raises(BadSample) as err:
        shards.ShardReader(out, "train").read(7)  # a JPEG decoder might not notice one byte: the CRC does
    assert str(err.value).startswith(f"shard {shard}, member 00000007.jpg is damaged") and "\n" not in str(err.value)
    shards.ShardReader(out, "train").read(8)  # the others still read
    verify = write_cli("verify", out)
    assert verify.returncode == 1 and f"shard {shard} is damaged" in verify.stderr


def test_a_truncated_or_missing_shard_is_refused_at_the_start(folder, tmp_path):
    out = str(tmp_path / "shards")
    manifest = shards.write(out, *shards.imagefolder_sources(folder), shard_mb=0.01, progress=False)
    last = os.path.join(out, manifest["splits"]["train"]["shards"][-1]["name"])
    with open(last, "r+b") as f:
        f.truncate(os.path.getsize(last) - 700)
    with pytest.raises(UsageError, match=f"shard {last} is damaged: .* bytes"):
        shards.ShardReader(out, "train")
    os.unlink(last)
    with pytest.raises(UsageError, match=f"shard {last} is missing"):
        shards.ShardReader(out, "train")


def test_only_rank_0_checks_every_shards_size_at_the_start(folder, tmp_path, monkeypatch):
    """1,143 stats a rank for ImageNet, 293 k for 256 ranks at every start and requeue: now rank 0's
    alone (a truncated shard ends rank 0 with its line; the launcher ends the rest)."""
    out = str(tmp_path / "shards")
    manifest = shards.write(out, *shards.imagefolder_sources(folder), shard_mb=0.01, progress=False)
    last = os.path.join(out, manifest["splits"]["train"]["shards"][-1]["name"])
    with open(last, "r+b") as f:
        f.truncate(os.path.getsize(last) - 700)
    stats = []
    real_getsize = os.path.getsize
    monkeypatch.setattr(shards.os.path, "getsize", lambda p: stats.append(p) or real_getsize(p))
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    for rank in (1, 2, 3):
        monkeypatch.setenv("OMPI_COMM_WORLD_RANK", str(rank))
        shards.ShardReader(out, "train")
    assert stats == []
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    with pytest.raises(UsageError, match=f"shard {last} is damaged: .* bytes"):
        shards.ShardReader(out, "train")
    assert len(stats) == len(manifest["splits"]["train"]["shards"])


def test_an_unfinished_conversion_is_refused_and_an_existing_one_kept(folder, tmp_path):
    out = str(tmp_path / "shards")
    shards.write(out, *shards.imagefolder_sources(folder), progress=False)
    done = write_cli("write", "--imagefolder", folder, "--out", out)
    assert done.returncode == 2 and "already holds shards" in done.stderr and done.stderr.count("\n") == 1
    # Killed before the manifest: its temporary files are there, the manifest is not.
    os.rename(os.path.join(out, "manifest.json"), os.path.join(out, "manifest.json.partial"))
    with pytest.raises(UsageError, match="its conversion did not finish"):
        shards.read_manifest(out)
    bad_index = tmp_path / "bad.pkl"
    bad_index.write_bytes(b"not a pickle")
    done = write_cli("write", "--index", f"train={bad_index}", "--root", folder, "--out", str(tmp_path / "x"))
    assert done.returncode == 2 and "is not a pickled" in done.stderr and done.stderr.count("\n") == 1


def test_a_corrupt_image_file_is_named(tmp_path):
    from hvdtrain.torch import images

    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\xff\xd8 not really a jpeg")
    with pytest.raises(BadSample, match=f"cannot read image {bad} \\("):
        images.load_file(str(bad))


def test_the_tf_trainer_checks_the_shard_directory_before_importing_tensorflow(folder, tmp_path):
    """hvdtrain.tf reads shards too (tests/test_tf_trainer.py trains on them): a directory that is
    not one (an image folder given by mistake) is one line, exit 2, before TensorFlow is imported."""
    run = subprocess.run([PYTHON, "-m", "hvdtrain.tf", "--model", "mnist_cnn", "--dataset", "shards", "--data-dir",
                          folder], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stdout == "", run
    assert run.stderr.strip().splitlines() == [
        f"hvdtrain.tf: error [rank 0/1]: '{folder}' holds no manifest.json: not a shard directory "
        "(python -m hvdtrain.shards write ... --out DIR)"], run.stderr


def test_shards_given_as_an_image_folder_say_which_option_reads_them(folder, tmp_path):
    from hvdtrain.data.datasets import check_imagefolder

    written = str(tmp_path / "shards")
    shards.write(written, *shards.imagefolder_sources(folder), progress=False)
    with pytest.raises(UsageError, match=re.escape(f"data dir '{written}' holds shards (manifest.json), not class "
                                                   "folders: --dataset shards")):
        check_imagefolder(written)


# ---------------------------------------------------------------------------------------- ImageNet's scale
def test_each_rank_reads_a_few_shards_an_epoch_each_sample_once_and_as_many_as_every_other_rank():
    import numpy as np

    from hvdtrain.data.datasets import shard_blocked_order

    # ImageNet's 1,100 shards and 256 ranks, 40 samples a shard (1,164 in ImageNet: the same shape, faster)
    sample_shards = np.repeat(np.arange(1_100), 40)[np.random.default_rng(5).permutation(1_100 * 40)]
    orders = [shard_blocked_order(sample_shards, 7, 3, rank, 256) for rank in range(256)]
    assert {len(o) for o in orders} == {len(sample_shards) // 256}
    everything = np.concatenate(orders)
    assert len(np.unique(everything)) == len(everything)  # no sample twice in an epoch
    shards_read = [len(np.unique(sample_shards[o])) for o in orders]
    assert max(shards_read) <= 1_100 // 256 + 2, max(shards_read)  # not every shard: ~5 of 1,100
    # 15 workers, a batch each in turn: each opens its rank's few shards, 20 k opens, not 4.2 M.
    per_worker = [len(np.unique(sample_shards[o[k * 8:(k + 1) * 8]])) for o in orders for w in range(15)
                  for k in range(w, len(o) // 8, 15)]
    assert sum(shards_read) * 15 < 15 * (1_100 + 256) and max(per_worker) <= max(shards_read)
    again = shard_blocked_order(sample_shards, 7, 3, 100, 256)
    assert np.array_equal(again, orders[100])  # a resume repeats the order
    assert not np.array_equal(shard_blocked_order(sample_shards, 7, 4, 100, 256), again)  # each epoch its own
    assert not np.array_equal(shard_blocked_order(sample_shards, 8, 3, 100, 256), again)  # and each seed
    one_rank = shard_blocked_order(sample_shards[:5_000], 7, 3, 0, 1)  # one rank: a full permutation
    assert sorted(one_rank) == list(range(5_000)) and list(one_rank) != sorted(one_rank)


def test_exact_validation_gives_each_rank_one_block_of_samples():
    from hvdtrain.data.datasets import exact_shard

    blocks = [exact_shard(50_000, rank, 256) for rank in range(256)]
    assert [i for b in blocks for i in b] == list(range(50_000))  # each once, in blocks: a few shards each
    assert {len(b) for b in blocks} == {195, 196}


def test_the_index_is_memory_mapped_and_not_pickled_into_workers(folder, tmp_path):
    import numpy as np

    out = str(tmp_path / "shards")
    shards.write(out, *shards.imagefolder_sources(folder), shard_mb=0.01, progress=False)
    reader = shards.ShardReader(out, "train")
    with np.load(os.path.join(out, "train", "index.npz")) as written:
        assert sorted(written.files) == sorted(reader.index)
        for name in written.files:
            assert np.array_equal(written[name], reader.index[name]), name
            if name != "extensions":
                assert isinstance(reader.index[name], np.memmap), name
    sent = pickle.dumps(reader)
    for column in ("offset", "crc32"):  # what a DataLoader worker receives holds no index column
        assert reader.index[column].tobytes() not in sent, column
    copy = pickle.loads(sent)
    assert isinstance(copy.index["offset"], np.memmap) and copy.read(5) == reader.read(5)
    # A process maps its index through one open of the file (a worker's start: not one per column).
    count = ("import sys\nfrom hvdtrain.data import shards\nopens = []\n"
             "sys.addaudithook(lambda e, a: opens.append(a[0]) if e == 'open' and str(a[0]).endswith('index.npz') else 0)\n"
             f"shards.load_index({os.path.join(out, 'train', 'index.npz')!r})\nprint(len(opens))\n")
    assert subprocess.run([sys.executable, "-c", count], capture_output=True, text=True, check=True).stdout == "1\n"
    (tmp_path / "broken").mkdir()
    open(tmp_path / "broken" / "index.npz", "wb").write(b"not a zip")
    with pytest.raises(UsageError, match="cannot read the index .*index.npz"):
        shards.load_index(str(tmp_path / "broken" / "index.npz"))


def test_the_torch_loader_reads_shards_in_the_shard_blocked_order(folder, tmp_path):
    import loaders
    from hvdtrain.config import TrainConfig
    from hvdtrain.data.datasets import shard_blocked_order
    from hvdtrain.torch import data, images

    out = str(tmp_path / "shards")
    shards.write(out, *shards.imagefolder_sources(folder), shard_mb=0.002, progress=False)
    train = data.SeededSamples(images.ShardImages(out, "train", images.train_augment(16)), 3)
    assert len(set(train.dataset.sample_shards.tolist())) > 8  # several shards
    cfg = TrainConfig(seed=3, batch_size=4, batches_per_allreduce=1, num_workers=0)
    batches = loaders.rank_batches(train, cfg, 1, 3, 2)
    expected = shard_blocked_order(train.dataset.sample_shards, 3, 2, 1, 3)
    assert [i for b in batches for i in b] == expected[:len(batches) * 4].tolist()
    labels = [int(y) for _, ys in loaders.train_loader(train, cfg, 1, 3, 2, 0) for y in ys]
    assert labels == [int(train.dataset.reader.labels[i]) for b in batches for i in b]


def test_on_a_cpu_the_decode_workers_normalise_what_the_step_would_have(folder, tmp_path):
    from torch.utils.data import TensorDataset, default_collate

    from hvdtrain.config import TrainConfig
    from hvdtrain.torch import data, images, loader

    out = str(tmp_path / "shards")
    shards.write(out, *shards.imagefolder_sources(folder), shard_mb=0.01, progress=False)
    cfg = TrainConfig(num_workers=1, batch_size=4)
    for dataset in (data.SeededSamples(images.ShardImages(out, "train", images.val_augment(16)), 0),
                    data.SeededSamples(images.image_folder(f"{folder}/train", images.val_augment(16)), 0)):
        plan = loader.plan_loader(cfg, dataset, "train", "cpu")
        assert plan.normalised_in == "decode workers" and plan.source == "image files"
        assert "normalised in decode workers" in plan.describe() and "1 worker(s)" in plan.describe()
        # Where the device is not the CPU, or no worker decodes: the device normalises.
        assert loader.plan_loader(cfg, dataset, "train", "meta").normalised_in == "device"
        alone = loader.plan_loader(TrainConfig(num_workers=0, batch_size=4), dataset, "train", "cpu")
        assert alone.normalised_in == "device"
        # The workers' collate function: received with the dataset by the loader's workers.
        collate = pickle.loads(pickle.dumps(loader._dataloader(None, dataset, plan, batch_size=4).collate_fn))
        assert isinstance(collate, images.NormalizedBatches)
        samples = [dataset[i] for i in range(4)]
        x, y = default_collate(samples)
        xf, yf = collate(samples)
        assert x.dtype == torch.uint8 and xf.dtype == torch.float32 and torch.equal(y, yf)
        on_device = images.to_model_input(x, plan.normalization)
        assert torch.allclose(xf, on_device) and torch.equal(images.to_model_input(xf, (0, 1)), xf)
    users = TensorDataset(torch.zeros(4, 3, 8, 8, dtype=torch.uint8), torch.zeros(4))
    assert loader.plan_loader(cfg, users, "train", "cpu").normalised_in == "as given"  # a user's dataset is theirs
    passed = images.NormalizedBatches(images.IMAGENET_NORMALIZATION)([(torch.ones(2), 1)])  # not an image: unchanged
    assert torch.equal(passed[0], torch.ones(1, 2))


def test_the_feeder_thread_runs_on_a_gpu_or_where_a_core_is_left_for_it():
    from hvdtrain.runtime import feeder_thread_pays

    assert feeder_thread_pays(True, 1, 1, 1)
    assert not feeder_thread_pays(False, 2, 1, 1)  # a rank's two cores: its step and its decode worker
    assert feeder_thread_pays(False, 8, 1, 6)


def test_a_shard_that_cannot_be_read_during_training_is_one_line_naming_it(folder, tmp_path):
    out = str(tmp_path / "shards")
    shards.write(out, *shards.imagefolder_sources(folder), shard_mb=0.01, progress=False)
    reader = shards.ShardReader(out, "train")
    shard = reader.shards[reader.index["shard"][4]]
    os.unlink(shard)  # after the start's checks: moved, purged by the scratch file system's policy
    with pytest.raises(BadSample, match=rf"cannot read shard {re.escape(shard)}, member 00000004\.\w+ \(No such file"):
        reader.read(4)


def test_the_crop_key_reaches_hvdtrains_crop_through_subsets_and_compose(folder):
    """SeededSamples hands hvdtrain's crop the key (seed, epoch, sample) explicitly: through a
    Subset of the image folder and through a torchvision Compose around TrainCrop too; the window
    is the sample's, not one drawn from torch's generator."""
    from torch.utils.data import Subset
    from torchvision.transforms import v2

    from hvdtrain.config import TrainConfig
    from hvdtrain.torch import data, images, loader

    plain = images.image_folder(f"{folder}/train", images.train_augment(12))
    composed = images.image_folder(f"{folder}/train", v2.Compose([images.train_augment(12), v2.Identity()]))
    for dataset, inner, j in ((data.SeededSamples(Subset(plain, [5, 2, 7]), 3), plain, 2),
                              (data.SeededSamples(composed, 3), composed, 1)):
        x, _ = dataset[(4, 1)]  # epoch 4, sample 1
        expected = images.TrainCrop(12)(images.load_file(inner.samples[j][0]), (3, 4, 1))
        other = images.TrainCrop(12)(images.load_file(inner.samples[j][0]), (3, 5, 1))
        assert torch.equal(x, expected) and not torch.equal(x, other)
        assert loader.plan_loader(TrainConfig(num_workers=0), dataset, "train").crops.startswith("keyed")
    users = data.SeededSamples(torch.utils.data.TensorDataset(torch.zeros(4, 3, 8, 8)), 3)
    assert loader.plan_loader(TrainConfig(num_workers=0), users, "train").crops == "the dataset's own"
