"""What the torch trainer trains, whoever names it: a function that builds the model, the training
and validation sets of (input, target) pairs, and the loss. The command line's built-in names
(`--model resnet50 --dataset digits`), its references to a user's code (`--model my_net.py:build
--dataset my_data.py:datasets --loss my_loss.py:loss`, hvdtrain/plugins.py) and the objects given
to `hvdtrain.torch.fit` all become one `TorchWorkload`; the trainer names no model or dataset.

    workload = from_config(cfg)                       # the command line
    workload = TorchWorkload(model, train, val, loss)  # fit()
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch
from torch import nn

from hvdtrain import plugins
from hvdtrain.errors import UsageError
from hvdtrain.result_file import sample_unit
from hvdtrain.torch import data, models

CROSS_ENTROPY = "cross_entropy"  # --loss's default: with accuracy reported


@dataclasses.dataclass
class TorchWorkload:
    model: nn.Module | Callable[[], nn.Module]  # a model, or a zero-argument function building one
    train_data: object                          # map-style Dataset of (input, target) pairs
    val_data: object | None = None
    loss: Callable | None = None                # (outputs, targets) -> scalar tensor; None: cross-entropy
    num_classes: int | None = None              # a built-in classifier's, kept in its checkpoints
    model_name: str = "the model"               # for messages: --model's value or fit's argument
    sample_unit: str = "img"                    # what the rates count (hvdtrain.result_file.sample_unit)

    def build_model(self) -> nn.Module:
        """The model (built now if a function was given; every rank seeds alike before)."""
        model = self.model
        if not isinstance(model, nn.Module):
            model = plugins.call(model, self.model_name, "--model") if callable(model) else model
        if not isinstance(model, nn.Module):
            raise UsageError(f"--model {self.model_name} gave a {type(model).__name__}, not a torch.nn.Module")
        return model


def check_pairs(dataset, what: str) -> str:
    """A map-style dataset with at least one sample, which is an (input, target) pair; what its
    rates count (hvdtrain.result_file.sample_unit of the input's shape)."""
    from torch.utils.data import DataLoader, IterableDataset

    if isinstance(dataset, DataLoader):  # model code's habit: the loader, where hvdtrain wants the dataset
        raise UsageError(f"{what} is a DataLoader: give its dataset (loader.dataset) and batch_size="
                         f"{dataset.batch_size} (per rank): hvdtrain makes each rank's loader, sampler and workers")
    if isinstance(dataset, IterableDataset):
        raise UsageError(f"{what} is an IterableDataset: hvdtrain needs a map-style Dataset (__len__ and "
                         "__getitem__) to give each rank its own samples, exact validation and an exact resume; "
                         "for files on a parallel file system, write them as shards (python -m hvdtrain.shards)")
    try:
        n = len(dataset)
        sample = dataset[0] if n else None
    except Exception as err:  # noqa: BLE001 - the user's dataset, in one line
        raise UsageError(f"{what} cannot be read as a map-style Dataset ({type(err).__name__}: {err}): it needs "
                         "__len__ and __getitem__") from None
    if not n:
        raise UsageError(f"{what} is empty")
    if not isinstance(sample, (tuple, list)) or len(sample) != 2:
        kind = f"a {len(sample)}-tuple" if isinstance(sample, (tuple, list)) else f"a {type(sample).__name__}"
        raise UsageError(f"{what} must give (input, target) pairs; its sample 0 is {kind}")
    return sample_unit(getattr(sample[0], "shape", ()))


def _user_datasets(cfg):
    """(train, val) from --dataset FILE.py:FUNCTION (val may be None)."""
    function = plugins.load(cfg.dataset, "--dataset")
    result = plugins.call(function, cfg.dataset, "--dataset")
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise UsageError(f"--dataset {cfg.dataset} must return (train, val) datasets (val may be None); it returned "
                         f"a {type(result).__name__}")
    train, val = result
    unit = check_pairs(train, f"--dataset {cfg.dataset}: the training set")
    if val is not None:
        check_pairs(val, f"--dataset {cfg.dataset}: the validation set")
    return train, val, unit


def _classes(dataset, reference: str) -> int:
    """How many classes a user's dataset has, for a built-in classifier: torchvision's `classes`
    (ImageFolder and the like) or a `num_classes` attribute."""
    found = getattr(dataset, "num_classes", None) or len(getattr(dataset, "classes", ()) or ())
    if not found:
        raise UsageError(f"--dataset {reference}: a built-in model needs the training set's number of classes: give "
                         "it a `classes` list (as torchvision's ImageFolder has) or a `num_classes` attribute")
    return int(found)


def from_config(cfg) -> TorchWorkload:
    """The workload cfg names: built-in names or references to the user's functions."""
    if plugins.is_reference(cfg.dataset):
        train, val, unit = _user_datasets(cfg)
        x = torch.as_tensor(train[0][0])
        in_channels, image_size = (x.shape[0], x.shape[-1]) if x.ndim == 3 else (None, None)
        num_classes = None if plugins.is_reference(cfg.model) else _classes(train, cfg.dataset)
    else:
        train, val, in_channels, num_classes, image_size = data.build_datasets(cfg)
        unit = "img"  # the built-in datasets are images
    if plugins.is_reference(cfg.model):
        model = plugins.load(cfg.model, "--model")
    else:
        models.check_model_name(cfg.model)
        if in_channels is None:
            raise UsageError(f"--model {cfg.model} takes images (channels, height, width); --dataset {cfg.dataset}'s "
                             "inputs are not")

        def model():
            return models.build_model(cfg.model, in_channels, num_classes, image_size)
    loss = None if cfg.loss == CROSS_ENTROPY else plugins.load(cfg.loss, "--loss")
    return TorchWorkload(model, train, val, loss, num_classes=num_classes, model_name=cfg.model, sample_unit=unit)
