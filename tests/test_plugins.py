"""A user's own model, data and loss named on the command line (FILE.py:FUNCTION,
package.module:FUNCTION) or given to hvdtrain.torch.fit: each bad one is one line naming the
option and the reference (fast tier: no launch, the checks run before any backend starts)."""
import os
import subprocess
import sys
import textwrap

import pytest

from hvdtrain import checkpoint as ckpt
from hvdtrain.config import TrainConfig, config_from_values
from hvdtrain.errors import UsageError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER = os.path.join(REPO, "tests", "scripts", "user_regression.py")


@pytest.fixture
def plugin(tmp_path):
    """Writes tmp_path/<name>.py with `source`; returns its path."""
    def write(name, source):
        path = tmp_path / f"{name}.py"
        path.write_text(textwrap.dedent(source))
        return str(path)
    return write


def workload(**options):
    from hvdtrain.torch.workload import from_config

    return from_config(config_from_values("torch", options))


def test_references_load_a_users_model_data_and_loss():
    w = workload(model=f"{USER}:build_model", dataset=f"{USER}:datasets", loss=f"{USER}:mse")
    assert len(w.train_data) == 512 and len(w.val_data) == 128 and w.num_classes is None
    model = w.build_model().eval()
    assert type(model).__name__ == "Sequential"
    x, y = w.train_data[0]
    assert w.loss(model(x.unsqueeze(0)), y.unsqueeze(0)).ndim == 0


def test_a_built_in_model_on_a_users_image_dataset_takes_its_classes(plugin, tmp_path):
    from hvdtrain.data.datasets import write_digits_imagefolder

    root = write_digits_imagefolder(str(tmp_path / "data"), per_class_train=1, per_class_val=1, size=16)
    path = plugin("images", f"""
        from torchvision import datasets, transforms
        def datasets_():
            t = transforms.ToTensor()
            return datasets.ImageFolder("{root}/train", t), datasets.ImageFolder("{root}/val", t)
    """)
    w = workload(model="resnet18", dataset=f"{path}:datasets_")
    assert w.num_classes == 10 and w.build_model().fc.out_features == 10


@pytest.mark.parametrize("source, reference, message", [
    (None, "nowhere.py:f", "--model {ref}: no file {dir}/nowhere.py"),
    ("import not_a_module_anywhere\n", "{path}:f", "--model {ref}: cannot import {path} (ModuleNotFoundError: "
                                                   "No module named 'not_a_module_anywhere')"),
    ("def g(): pass\n", "{path}:f", "--model {ref}: {path} has no 'f'"),
    ("f = 3\n", "{path}:f", "--model {ref}: 'f' is a int, not a function"),
    ("def f(): return 'a net'\n", "{path}:f", "--model {ref} gave a str, not a torch.nn.Module"),
    ("def f(): raise ValueError('no GPU here')\n", "{path}:f", "--model {ref} raised ValueError: no GPU here"),
])
def test_a_bad_model_reference_is_one_line(plugin, tmp_path, monkeypatch, source, reference, message):
    monkeypatch.chdir(tmp_path)
    path = plugin("bad_model_" + str(abs(hash(reference + str(source))) % 10**6), source) if source else ""
    ref = reference.format(path=path)
    with pytest.raises(UsageError) as err:
        workload(model=ref, dataset=f"{USER}:datasets").build_model()
    assert str(err.value) == message.format(ref=ref, path=path, dir=tmp_path)


@pytest.mark.parametrize("body, message", [
    ("return 3", "must return (train, val) datasets (val may be None); it returned a int"),
    ("return [1, 2, 3], None", "the training set must give (input, target) pairs; its sample 0 is a int"),
    ("return [(1, 2, 3)], None", "the training set must give (input, target) pairs; its sample 0 is a 3-tuple"),
    ("return [], None", "the training set is empty"),
    ("return [(1, 2)], [4]", "the validation set must give (input, target) pairs; its sample 0 is a int"),
])
def test_a_dataset_that_does_not_give_pairs_is_one_line(plugin, body, message):
    path = plugin(f"bad_data_{abs(hash(body)) % 10**6}", f"def datasets():\n    {body}\n")
    with pytest.raises(UsageError) as err:
        workload(model=f"{USER}:build_model", dataset=f"{path}:datasets")
    assert str(err.value) == f"--dataset {path}:datasets: {message}".replace(": must return", " must return")


def test_a_dataloader_or_an_iterable_dataset_given_as_data_is_one_line():
    """fit(model, DataLoader(...)) is model code's habit: the line says to give its dataset and
    batch size; an IterableDataset cannot be sharded exactly by hvdtrain, and the line says so."""
    import torch
    from torch.utils.data import DataLoader, IterableDataset, TensorDataset

    from hvdtrain.torch.workload import check_pairs

    pairs = TensorDataset(torch.zeros(8, 2), torch.zeros(8, dtype=torch.long))
    assert check_pairs(pairs, "fit(): train_data") == "samples"
    with pytest.raises(UsageError, match=r"^fit\(\): train_data is a DataLoader: give its dataset \(loader.dataset\) "
                                         r"and batch_size=4 \(per rank\)"):
        check_pairs(DataLoader(pairs, batch_size=4), "fit(): train_data")

    class Stream(IterableDataset):
        def __iter__(self):
            return iter([(torch.zeros(2), 0)])

    with pytest.raises(UsageError, match=r"^fit\(\): val_data is an IterableDataset: hvdtrain needs a map-style"):
        check_pairs(Stream(), "fit(): val_data")


def test_a_reference_must_name_a_function():
    with pytest.raises(UsageError, match=r"--loss my_loss.py:: expected FILE.py:FUNCTION or package.module:FUNCTION"):
        workload(model=f"{USER}:build_model", dataset=f"{USER}:datasets", loss="my_loss.py:")


def test_unknown_options_of_fit_are_refused_with_a_hint():
    with pytest.raises(UsageError, match=r"unknown options for hvdtrain.torch: epoch \(did you mean epochs\?\), "
                                         r"tpyo"):
        config_from_values("torch", {"model": "m:f", "dataset": "d:f", "epoch": 3, "tpyo": 1})
    cfg = config_from_values("torch", {"model": "m:f", "dataset": "d:f", "epochs": 3})
    assert cfg.recipe == "your-model" and cfg.optimizer == "adamw" and cfg.epochs == 3


def test_a_resume_with_another_model_or_loss_is_refused():
    saved = {**TrainConfig(model="a.py:net", dataset="d.py:data", loss="l.py:mse").to_dict(),
             "num_classes": None, "format_version": ckpt.FORMAT_VERSION}
    for changed in ({"model": "a.py:other_net"}, {"loss": "cross_entropy"}, {"dataset": "d.py:more_data"}):
        current = {**saved, **changed}
        with pytest.raises(UsageError, match=f"{next(iter(changed))}: checkpoint"):
            ckpt.check_compatible("c.pt", saved, current)


def test_the_command_line_says_it_in_one_line_with_exit_2(plugin):
    path = plugin("no_function", "x = 1\n")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, "-m", "hvdtrain.torch", "--model", f"{path}:build", "--dataset",
                          f"{USER}:datasets"], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert run.returncode == 2 and run.stderr.strip().splitlines() == [
        f"hvdtrain.torch: error [rank 0/1]: --model {path}:build: {path} has no 'build'"], run.stderr


def test_fit_is_there_without_importing_the_trainer_first():
    code = "import sys, hvdtrain.torch as t; assert 'hvdtrain.torch.train' not in sys.modules; t.fit; print('ok')"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert run.stdout.strip() == "ok", run.stderr
