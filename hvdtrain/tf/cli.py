"""`python -m hvdtrain.tf`: parse and check the command line, choose the Keras for the loop, then
import TensorFlow and train (hvdtrain/tf/train.py).

    mpirun -np 2 python -m hvdtrain.tf --model mnist_cnn --dataset digits --loop fit --epochs 8
    python -m hvdtrain.tf --help

Bad input is reported as one line naming the rank, with exit status 2, on every rank.
"""
from __future__ import annotations

import sys

from hvdtrain.config import build_parser, config_from_args
from hvdtrain.datasets import check_imagefolder
from hvdtrain.errors import UsageError, report_and_exit
from hvdtrain.tf.models import MODELS, check_model_name

PROG = "hvdtrain.tf"


def main(argv=None) -> None:
    parser = build_parser("tf", list(MODELS), f"python -m {PROG}")
    args = parser.parse_args(argv)
    try:
        cfg = config_from_args("tf", args)
        # Checks that need no framework come first: they fail in a second, on every rank alike.
        check_model_name(cfg.model)
        if cfg.dataset == "imagefolder":
            check_imagefolder(cfg.data_dir)
        from hvdtrain.tf import keras_compat

        keras = keras_compat.select(cfg.loop)  # before anything imports tensorflow
        from hvdtrain.tf.train import Trainer

        Trainer(cfg, keras).train()
    except UsageError as err:
        report_and_exit(err, PROG)
    sys.stdout.flush()
