"""`python -m hvdtrain.tf`: parse and check the command line, choose the Keras for the loop, then
import TensorFlow and train (hvdtrain/tf/train.py).

    mpirun -np 2 python -m hvdtrain.tf --model mnist_cnn --dataset digits --loop fit --epochs 8
    python -m hvdtrain.tf --help

Bad input is reported as one line naming the rank, with exit status 2, on every rank.
"""
from __future__ import annotations

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
        raise UsageError(f"--dataset {cfg.dataset}: hvdtrain.tf trains its built-in datasets only "
                         "(your own datasets: hvdtrain.torch)")
    check_model_name(cfg.model)


def main(argv=None) -> None:
    cli.main("tf", MODELS, train, argv, check=check)
