"""`python -m hvdtrain.tf`: parse and check the command line, choose the Keras for the loop, then
import TensorFlow and train (hvdtrain/tf/train.py).

    mpirun -np 2 python -m hvdtrain.tf --model mnist_cnn --dataset digits --loop fit --epochs 8
    python -m hvdtrain.tf --help

Bad input is reported as one line naming the rank, with exit status 2, on every rank.
"""
from __future__ import annotations

import os

from hvdtrain import cli, plugins
from hvdtrain.errors import UsageError
from hvdtrain.tf.models import MODELS, check_model_name

PROG = "hvdtrain.tf"


def train(cfg) -> None:
    from hvdtrain.tf import keras_compat

    keras = keras_compat.select(cfg.loop)  # before anything imports tensorflow
    from hvdtrain.tf.train import run

    run(cfg, keras)


def check(cfg) -> None:
    if plugins.is_reference(cfg.dataset):
        raise UsageError(f"--dataset {cfg.dataset}: hvdtrain.tf reads its built-in datasets, image folders and shards "
                         "(arrays or a tf.data.Dataset of your own: hvdtrain.tf.fit)")
    # A model of the user's (FILE.py:FUNCTION) is imported once the loop's Keras is chosen.
    if not plugins.is_reference(cfg.model):
        check_model_name(cfg.model)
    for option, value in (("--model", cfg.model), ("--loss", cfg.loss)):
        if plugins.is_reference(value):
            where, _ = plugins.split(value, option)
            if where.endswith(".py") and not os.path.isfile(where):
                raise UsageError(f"{option} {value}: no file {os.path.abspath(where)}")


def main(argv=None) -> None:
    cli.main("tf", MODELS, train, argv, check=check)
