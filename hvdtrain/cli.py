"""The command line of both trainers: parse, build the config, run the checks that need no
framework (they fail within a second, on every rank alike), then train; a usage error anywhere
becomes one line naming the rank, with exit status 2 (hvdtrain/errors.py)."""
from __future__ import annotations

import gc
import sys
from typing import Callable, Iterable

from hvdtrain.config import TrainConfig, build_parser, config_from_args
from hvdtrain.data.datasets import check_imagefolder
from hvdtrain.errors import UsageError, report_and_exit
from hvdtrain.data.shards import read_manifest


def main(framework: str, models: Iterable[str], train: Callable[[TrainConfig], None],
         argv: list[str] | None = None, check: Callable[[TrainConfig], None] = lambda cfg: None) -> None:
    """Parse, build the config, `check` it (the framework's own checks), train."""
    prog = f"hvdtrain.{framework}"
    args = build_parser(framework, list(models), f"python -m {prog}").parse_args(argv)
    try:
        cfg = config_from_args(framework, args)
        check(cfg)
        if cfg.dataset == "imagefolder":
            check_imagefolder(cfg.data_dir)
        elif cfg.dataset == "shards":
            read_manifest(cfg.data_dir)
        train(cfg)
    except UsageError as err:
        report_and_exit(err, prog)
    # The trainer is held in reference cycles; collected here, its wrapped model and with it the
    # last reference to the process group go while the interpreter is whole. Left to the
    # interpreter's exit, a Gloo thread finishing its last work can take the GIL as Python
    # finalizes, and the rank aborts ("terminate called without an active exception", seen once
    # with Accelerate after the result file was written).
    gc.collect()
    sys.stdout.flush()
