"""Defaults per model (hvdtrain/recipes.py): the recipe fills what the command line leaves out,
never what it gives (fast tier)."""
import pytest

from hvdtrain import checkpoint as ckpt
from hvdtrain import recipes
from hvdtrain.config import build_parser, config_from_args
from hvdtrain.errors import UsageError


def parse(framework: str, *argv: str):
    return config_from_args(framework, build_parser(framework, ["resnet50", "resnet18", "mnist_cnn"], "p").parse_args(argv))


@pytest.mark.parametrize("framework", ["torch", "tf"])
def test_each_model_gets_its_recipe(framework):
    cnn = parse(framework, "--model", "mnist_cnn")
    assert (cnn.recipe, cnn.optimizer, cnn.base_lr, cnn.weight_decay, cnn.recipe_overrides) == \
        ("small-cnn", "adam", 0.005, 0.0, ())
    resnet = parse(framework, "--model", "resnet50")
    assert (resnet.recipe, resnet.optimizer, resnet.base_lr, resnet.momentum, resnet.weight_decay) == \
        ("imagenet", "sgd", 0.0125, 0.9, 5e-5)
    assert parse(framework).recipe == "imagenet"  # resnet50 is the default model


def test_options_given_win_even_when_zero_or_equal_to_the_recipe():
    cfg = parse("torch", "--model", "resnet18", "--weight-decay", "0", "--optimizer", "sgd", "--base-lr", "0.1")
    assert (cfg.weight_decay, cfg.optimizer, cfg.base_lr, cfg.lr_schedule) == (0.0, "sgd", 0.1, "cosine")
    assert set(cfg.recipe_overrides) == {"weight_decay", "optimizer", "base_lr"}
    line = recipes.describe(cfg)
    assert line.startswith("imagenet for resnet18 (") and "base_lr 0.1" in line and "weight_decay 0" in line
    assert line.endswith("given on the command line: optimizer, base_lr, weight_decay")


def test_checkpoint_from_another_recipe_is_refused_with_the_options_that_resume_it():
    saved = {"format_version": ckpt.FORMAT_VERSION, "framework": "torch", "model": "mnist_cnn",
             "dataset": "digits", "image_size": 224, "optimizer": "sgd", "num_classes": 10}
    current = {**saved, "optimizer": "adam"}
    with pytest.raises(UsageError, match=r"optimizer: checkpoint 'sgd', this run 'adam' \(to resume it, pass "
                                         r"--optimizer sgd; or use another --checkpoint-dir\)"):
        ckpt.check_compatible("/x/ckpt-e1-s10.pt", saved, current)
