"""--loader dali (hvdtrain/torch/dali.py) in DALI's CPU mode (device_id=None: the graph a GPU runs
with device="mixed"), under mpirun -np 2 on tar shards: equal ranks, exact validation, a resume
in the middle of an epoch ending with the uninterrupted run's weights (the same samples and the
same crops); without DALI installed, one line saying how to install it.

DALI is an optional extra, not in the project venv: the tests install it once into the cache
(HVDTRAIN_CACHE/dali-VERSION-cudaN, about 700 MB, kept between runs) and give the ranks that
directory on PYTHONPATH."""
import json
import os
import shutil
import subprocess

import numpy as np
import pytest
import torch

from conftest import PYTHON, assert_weights_equal, base_env, digits_shards, launch

DALI_VERSION = "2.4.0"
# DALI's libraries, each without its Python dependencies, which the venv has (numpy, packaging, ...).
DALI_PACKAGES = {"13": [f"nvidia-dali-cuda130=={DALI_VERSION}", "nvidia-nvimgcodec-cu13==0.9.0.20",
                        "nvidia-nvjpeg==13.3.2.43", "nvidia-nvjpeg2k-cu13==0.11.0.51",
                        "nvidia-libnvcomp-cu13==5.3.0.16", "nvidia-nvtiff-cu13==0.8.0.82", "nvtx==0.2.17",
                        "makefun==1.16.0", "libcst==1.9.0"]}
DALI_TF_PLUGIN = {"13": f"nvidia-dali-tf-plugin-cuda130=={DALI_VERSION}"}
VAL = 49


@pytest.fixture(scope="module")
def dali_path():
    """The directory DALI is installed in, once per cache (pip's own cache holds the wheels)."""
    cuda = (torch.version.cuda or "13.0").split(".")[0]
    if cuda not in DALI_PACKAGES:
        pytest.fail(f"no DALI package list for CUDA {cuda} (torch {torch.__version__})")
    cache = os.environ.get("HVDTRAIN_CACHE", os.path.expanduser("~/.cache/hvdtrain"))
    target = os.path.join(cache, f"dali-{DALI_VERSION}-cuda{cuda}")
    stamp = os.path.join(target, ".installed")
    if not os.path.exists(stamp):
        done = subprocess.run([PYTHON, "-m", "pip", "install", "--quiet", "--no-deps", "--upgrade", "--target", target,
                               *DALI_PACKAGES[cuda]], capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        open(stamp, "w").write(" ".join(DALI_PACKAGES[cuda]) + "\n")
    # DALI's TensorFlow plugin (TensorFlow's --loader dali): an sdist that picks the library built
    # for the installed TensorFlow, so DALI must be importable while pip builds it, and it is
    # installed beside DALI's nvidia/ package (a second nvidia/ on PYTHONPATH would hide it).
    plugin_stamp = os.path.join(target, ".tf-plugin-installed")
    if not os.path.exists(plugin_stamp):
        scratch = target + ".tf-plugin"
        shutil.rmtree(scratch, ignore_errors=True)
        done = subprocess.run([PYTHON, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                               "--target", scratch, DALI_TF_PLUGIN[cuda]], capture_output=True, text=True, timeout=900,
                              env={**os.environ, "PYTHONPATH": target})
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        shutil.rmtree(os.path.join(target, "nvidia", "dali_tf_plugin"), ignore_errors=True)
        shutil.move(os.path.join(scratch, "nvidia", "dali_tf_plugin"), os.path.join(target, "nvidia"))
        shutil.rmtree(scratch)
        open(plugin_stamp, "w").write(DALI_TF_PLUGIN[cuda] + "\n")
    return target


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory):
    return digits_shards(str(tmp_path_factory.mktemp("dali-shards")))


def train(tmp_path, data_dir, name, *extra, dali=None, check=True, np_=2, framework="torch"):
    env = base_env()
    if dali:
        env["PYTHONPATH"] = dali + os.pathsep + env["PYTHONPATH"]
    result = tmp_path / f"{name}.json"
    own = ["--num-workers", "1"] if framework == "torch" else []
    run = launch("mpirun" if np_ > 1 else "single", np_,
                 [PYTHON, "-m", f"hvdtrain.{framework}", "--model", "mnist_cnn", *own, "--dataset", "shards",
                  "--data-dir", data_dir, "--loader", "dali", "--image-size", "16", "--batch-size", "8",
                  "--epochs", "2", "--base-lr", "0.01",
                  "--threads-per-rank", "1", "--log-interval", "4", "--result-json", str(result),
                  *extra], timeout=240, env=env, check=check)
    return json.loads(result.read_text()) if check else run


@pytest.mark.slow
def test_dali_cpu_mode_under_mpirun_resumes_to_the_uninterrupted_weights(dali_path, shard_dir, tmp_path):
    whole = train(tmp_path, shard_dir, "whole", "--checkpoint-dir", str(tmp_path / "whole"), dali=dali_path)
    assert whole["config"]["loader"] == "dali" and whole["world_size"] == 2
    assert whole["history"][-1]["val_count"] == VAL  # each validation sample once, on one rank
    assert len({r["param_checksum"] for r in whole["ranks"]}) == 1, whole["ranks"]
    # 12 steps an epoch; stopped at step 5 of epoch 2, then run again.
    assert train(tmp_path, shard_dir, "part", "--checkpoint-dir", str(tmp_path / "part"), "--steps", "17",
                 dali=dali_path)["global_step"] == 17
    rest = train(tmp_path, shard_dir, "rest", "--checkpoint-dir", str(tmp_path / "part"), dali=dali_path)
    assert rest["global_step"] == 24
    assert_weights_equal(tmp_path / "whole", tmp_path / "part")  # the same samples and crops


# A mid-epoch resume's batches under TensorFlow's --loader dali: the epoch from a step on is the
# tail of the whole epoch, pixel for pixel; validation is every sample once, the last batch short.
TF_DALI_BATCHES = r"""
import json, sys
from types import SimpleNamespace
import numpy as np
from hvdtrain.tf import data
d = data.build_data(SimpleNamespace(dataset="shards", data_dir=sys.argv[1], image_size=16, loader="dali"), 1)
assert d.loader == "dali"
whole = [(x.numpy(), y.numpy()) for x, y in d.train(1, 0, 0, 2, 12, 8, 42)]
tail = [(x.numpy(), y.numpy()) for x, y in d.train(1, 5, 0, 2, 12, 8, 42)]
val = [y.numpy() for _, y in d.val(1, 2, 8)]
print(json.dumps({"whole": len(whole), "tail": len(tail),
                  "same": all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(whole[5:], tail)),
                  "distinct": len({a[0].tobytes() for a in whole}), "val": [len(y) for y in val],
                  "val_order": [int(i) for y in val for i in y] == [int(d.load_val(i)[1]) for i in d.val_order(1, 2)]}))
"""


@pytest.mark.slow
def test_tensorflow_dali_cpu_mode_trains_under_mpirun_and_resumes_mid_epoch_on_the_same_batches(dali_path, shard_dir,
                                                                                                 tmp_path):
    """TensorFlow's --loader dali (hvdtrain/tf/dali.py: tf.data reads and packs, DALI's CPU mode
    decodes) under mpirun: every validation image once, the ranks in step. In one process: an
    epoch resumed at step 5 gives the whole epoch's batches from step 5 on, to the pixel, and
    the validation shard's last batch comes short, in order (DALI itself makes full batches only)."""
    run = train(tmp_path, shard_dir, "tf", dali=dali_path, framework="tf")
    assert run["config"]["loader"] == "dali" and run["images_normalised_in"] == "DALI", run["config"]
    assert run["history"][-1]["val_count"] == VAL and run["world_size"] == 2
    assert len({r["param_checksum"] for r in run["ranks"]}) == 1, run["ranks"]
    assert run["history"][-1]["train_loss"] < run["history"][0]["train_loss"], run["history"]
    env = base_env()
    env["PYTHONPATH"] = dali_path + os.pathsep + env["PYTHONPATH"]
    done = subprocess.run([PYTHON, "-c", TF_DALI_BATCHES, shard_dir], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    # Rank 0 of 2: 100 training samples, 12 batches of 8; rank 1: 25 of the 49 validation samples, 8, 8, 8, 1.
    assert found == {"whole": 12, "tail": 7, "same": True, "distinct": 12, "val": [8, 8, 8, 1], "val_order": True}, found


@pytest.mark.slow
def test_tensorflow_without_dali_or_its_plugin_the_loader_is_one_line(shard_dir, tmp_path):
    """In this process DALI is not importable (the suite keeps it out of the venv): build_data
    refuses before any batch, in one line; a dataset that is no image files is refused too. With
    DALI but not its TensorFlow plugin, the line names the plugin and this TensorFlow."""
    from types import SimpleNamespace

    from hvdtrain.errors import UsageError
    from hvdtrain.tf import data

    cfg = SimpleNamespace(dataset="shards", data_dir=shard_dir, image_size=16, loader="dali")
    with pytest.raises(UsageError, match=r"^--loader dali needs NVIDIA DALI and its TensorFlow plugin, which are not "
                                         r"installed: pip install nvidia-dali-cuda130, then pip install "
                                         r"--no-build-isolation nvidia-dali-tf-plugin-cuda130"):
        data.build_data(cfg)
    with pytest.raises(UsageError, match="^--loader dali reads image files: --dataset imagefolder or --dataset shards$"):
        data.build_data(SimpleNamespace(dataset="digits", image_size=16, loader="dali"))
    # DALI without the plugin: a DALI directory whose nvidia/ lacks dali_tf_plugin.
    env = base_env()
    fake = tmp_path / "dali-without-plugin" / "nvidia"
    (fake / "dali" / "plugin").mkdir(parents=True)
    for init in (fake / "__init__.py", fake / "dali" / "__init__.py", fake / "dali" / "plugin" / "__init__.py"):
        init.write_text("")
    (fake / "dali" / "plugin" / "tf.py").write_text("import nvidia.dali_tf_plugin\n")
    env["PYTHONPATH"] = str(fake.parent) + os.pathsep + env["PYTHONPATH"]
    run = subprocess.run([PYTHON, "-c", "from hvdtrain.tf import dali; dali.require()"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert "UsageError: --loader dali needs DALI's TensorFlow plugin, built for this TensorFlow (2." in run.stderr, \
        run.stderr[-2000:]
    assert "pip install --no-build-isolation nvidia-dali-tf-plugin-cuda130 (No module named 'nvidia.dali_tf_plugin')" \
        in run.stderr, run.stderr[-2000:]


@pytest.mark.slow
def test_without_dali_the_loader_is_one_line(shard_dir, tmp_path):
    run = train(tmp_path, shard_dir, "missing", check=False, np_=1)
    assert run.returncode == 2, run.output[-3000:]
    assert "--loader dali needs NVIDIA DALI, which is not installed: pip install nvidia-dali-cuda" in run.output
    assert "Traceback" not in run.output


def test_crop_windows_follow_random_resized_crop_and_the_sample():
    from hvdtrain.data import augment

    flips = 0
    for index in range(200):
        top, left, h, w, flip = augment.train_window(42, 3, index, 375, 500)
        assert 0 <= top and top + h <= 375 and 0 <= left and left + w <= 500
        area, ratio = h * w / (375 * 500), w / h
        assert 0.08 * 0.97 <= area <= 1.0 and 3 / 4 * 0.97 <= ratio <= 4 / 3 * 1.03, (area, ratio)
        # A function of (seed, epoch, index): what a resumed run draws again.
        assert (top, left, h, w, flip) == augment.train_window(42, 3, index, 375, 500)
        flips += flip
    assert 70 < flips < 130  # half of them flipped
    windows = {augment.train_window(42, epoch, 7, 375, 500) for epoch in range(5)}
    assert len(windows) == 5  # another epoch, another crop
    assert augment.train_window(0, 0, 0, 10, 1000)[:4] == (0, 493, 10, 13)  # the centre-crop fallback
    # One sample's draws, alone (torch, DALI) or among a batch's (TensorFlow's pipeline).
    np.testing.assert_array_equal(augment.sample_draws(42, 3, [7, 8, 9])[1], augment.sample_draws(42, 3, [8])[0])
    assert augment.val_window(375, 500, 224) == (23, 86, 328, 328, False)  # 224/256 of the shorter side, centred


CROP_CHECK = r"""
import io, sys
import numpy as np, torch
from PIL import Image
from hvdtrain.torch import dali

# A 500x375 image (ImageNet's usual shape) whose red grows left to right and green top to bottom.
h, w = 375, 500
image = np.zeros((h, w, 3), np.uint8)
image[..., 0] = np.linspace(0, 255, w)[None, :]
image[..., 1] = np.linspace(0, 255, h)[:, None]
buffer = io.BytesIO()
Image.fromarray(image).save(buffer, format="JPEG", quality=95)
pipe = dali._pipeline(32, 1, 1, torch.device("cpu"))
# (top, left, height, width): the right half of the columns, every row: a tall crop, 250 x 375.
pipe.feed_input("files", [np.frombuffer(buffer.getvalue(), np.uint8)])
pipe.feed_input("window", [np.array([0.0, 0.5, 1.0, 0.5], np.float32)])
pipe.feed_input("mirror", [np.array(0, np.int32)])
(out,) = pipe.run()
x = np.array(out.as_tensor())[0]  # CHW, normalised: back to 0-255
mean = np.array([255 * m for m in dali.datasets.IMAGENET_MEAN])[:, None, None]
std = np.array([255 * s for s in dali.datasets.IMAGENET_STD])[:, None, None]
x = x * std + mean
print(f"red {x[0, :, 0].mean():.0f} {x[0, :, -1].mean():.0f} green {x[1, 0, :].mean():.0f} {x[1, -1, :].mean():.0f}")
"""


@pytest.mark.slow
def test_dali_crops_the_window_torchvision_means(dali_path):
    """The train pipeline's crop window is (top, left, height, width): the right half of a 500x375
    image holds red from 128 to 255 across its width and green from 0 to 255 down its height.
    Transposed (image_slice reading the window as x, y, width, height), red would span 0-255
    and green 128-255. Checked at the crop's left and right columns and top and bottom rows."""
    env = base_env()
    env["PYTHONPATH"] = dali_path + os.pathsep + env["PYTHONPATH"]
    run = subprocess.run([PYTHON, "-c", CROP_CHECK], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    words = run.stdout.split()  # red LEFT RIGHT green TOP BOTTOM
    red_left, red_right, green_top, green_bottom = (float(words[i]) for i in (1, 2, 4, 5))
    assert 120 <= red_left <= 140 and red_right >= 245, run.stdout
    assert green_top <= 10 and green_bottom >= 245, run.stdout


# ---------------------------------------------------------------------------------------- one rule, three pipelines
SAME_CROPS = r"""
import json, sys
import numpy as np
from hvdtrain.data import augment
paths, size, seed, epoch = json.loads(sys.argv[2]), 64, 42, 3
out = {}
if sys.argv[1] == "tensorflow":
    import tensorflow as tf
    from hvdtrain.tf import data
    files = tf.constant(paths)
    for split, train in (("train", True), ("val", False)):
        load = data._image_loader(lambda i: tf.io.read_file(files[i]), [0] * len(paths), size, train)
        draws = augment.sample_draws(seed, epoch, range(len(paths)))
        out[split] = [np.transpose(load(tf.constant(i, tf.int64), tf.constant(draws[i]) if train else None)[0].numpy(),
                                   (2, 0, 1)) for i in range(len(paths))]
elif sys.argv[1] == "tf-dali":  # TensorFlow's windows, packed for DALI's graph (hvdtrain/tf/dali.py)
    import tensorflow as tf
    from hvdtrain.tf import dali, data
    files = tf.constant(paths)
    for split, train in (("train", True), ("val", False)):
        load = data._image_loader(lambda i: tf.io.read_file(files[i]), [0] * len(paths), size, train)
        draws = tf.constant(augment.sample_draws(seed, epoch, range(len(paths))))
        packed = tf.data.Dataset.range(len(paths)).map(lambda i: load.packed(i, draws[i] if train else None))
        batches = dali._dali_dataset(packed, 1, size, 1)
        out[split] = [np.transpose(x[0].numpy(), (2, 0, 1)) for x, _ in batches]
else:
    import torch
    from hvdtrain.torch import dali, images
    for split, train in (("train", True), ("val", False)):
        pipe, out[split] = dali._pipeline(size, 1, 1, torch.device("cpu")), []
        for i, path in enumerate(paths):
            encoded = np.fromfile(path, np.uint8)
            pipe.feed_input("files", [encoded])
            height, width = images.image_shape(encoded.tobytes(), path)
            window = augment.train_window(seed, epoch, i, height, width) if train else augment.val_window(height, width, size)
            pipe.feed_input("window", [augment.relative(window, height, width)])
            pipe.feed_input("mirror", [np.array(int(window.flip), np.int32)])
            out[split].append(np.array(pipe.run()[0].as_tensor())[0])
np.savez(sys.argv[3], **{f"{split}{i}": x for split, xs in out.items() for i, x in enumerate(xs)})
"""


@pytest.mark.slow
def test_torch_dali_and_tensorflow_take_the_same_crops(dali_path, tmp_path):
    """hvdtrain/data/augment.py's windows (training: crop and flip per (seed, epoch, sample); validation:
    the centre) through torch, DALI's CPU mode, TensorFlow and TensorFlow's DALI loader, on non-square images whose every
    region differs (red across, green down, a blue pattern): the pixels agree to within the
    decoders' and resize filters' differences, far closer than to another sample's crop."""
    from PIL import Image

    from hvdtrain.torch import images

    paths = []
    # The last JPEG says, in EXIF, that it is to be shown rotated (orientation 6): no decoder turns
    # it (DALI's did by default, and its crops then fell on other pixels than torch's and TF's).
    for k, (h, w, fmt) in enumerate(((375, 500, "jpg"), (450, 300, "jpg"), (333, 500, "png"), (400, 600, "jpg"),
                                     (300, 480, "jpg"))):
        y, x = np.mgrid[0:h, 0:w]
        picture = np.stack([x * 255 / w, y * 255 / h, 127 + 100 * np.sin(x / 23) * np.cos(y / 17)], -1)
        paths.append(str(tmp_path / f"{k}.{fmt}"))
        exif = Image.Exif()
        if k == 4:
            exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to display
        Image.fromarray(picture.astype(np.uint8)).save(paths[-1], quality=95, **({"exif": exif.tobytes()} if k == 4 else {}))
    torch_out = {"train": [], "val": []}
    for i, path in enumerate(paths):
        decoded = images.load_file(path)
        torch_out["train"].append(images.train_augment(64)(decoded, (42, 3, i)))
        torch_out["val"].append(images.val_augment(64)(decoded))
    for split in torch_out:
        torch_out[split] = [images.to_model_input(x[None], images.IMAGENET_NORMALIZATION)[0].numpy()
                            for x in torch_out[split]]
    env = base_env()
    env["PYTHONPATH"] = dali_path + os.pathsep + env["PYTHONPATH"]
    report, outputs = [], {}
    for pipeline in ("dali", "tensorflow", "tf-dali"):
        result = str(tmp_path / f"{pipeline}.npz")
        run = subprocess.run([PYTHON, "-c", SAME_CROPS, pipeline, json.dumps(paths), result], env=env,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        theirs = outputs[pipeline] = dict(np.load(result))
        for split in ("train", "val"):
            for i in range(len(paths)):
                mine, other = torch_out[split][i], theirs[f"{split}{i}"]
                assert mine.shape == other.shape == (3, 64, 64), (pipeline, split, i, other.shape)
                same = float(np.abs(mine - other).mean())
                # The same image's crop under another sample's window (training), or the whole
                # image squashed (validation: what TensorFlow did before): far off.
                if split == "train":
                    wrong = images.train_augment(64)(images.load_file(paths[i]), (42, 3, i + 10))
                else:
                    from torchvision.transforms import v2
                    wrong = v2.Resize([64, 64], antialias=True)(images.load_file(paths[i]))
                wrong = images.to_model_input(wrong[None], images.IMAGENET_NORMALIZATION)[0].numpy()
                off = float(np.abs(wrong - other).mean())
                # One limit for both splits: validation's centre is a window too (augment.val_window);
                # torch's resize-then-centre-crop differed from DALI's by 0.08-0.13 here.
                report.append((f"{pipeline} {split} {i}: {same:.3f} (another window {off:.3f})", same, off, 0.05))
    print("\n".join(line for line, *_ in report))
    # Mean absolute differences in normalised units (one grey level is about 0.017). Seen: training
    # 0.001-0.002 (DALI), 0.004-0.016 (TensorFlow); validation 0.08-0.13 (DALI) and 0.04-0.06
    # (TensorFlow): torch and DALI resize the whole image and then take its centre, with their own
    # resize filters, TensorFlow crops the centre's region first (a pixel's rounding apart at 64
    # px); another window 0.5-1.1.
    assert all(same < limit and off > 2.5 * same for _, same, off, limit in report), [line for line, *_ in report]
    # TensorFlow's --loader dali: its windows (TensorFlow's ops) through DALI's graph give torch's
    # DALI pixels exactly: the same windows, to the float32 that DALI reads.
    for key, pixels in outputs["dali"].items():
        assert np.array_equal(outputs["tf-dali"][key], pixels), (key, float(np.abs(outputs["tf-dali"][key] - pixels).max()))
