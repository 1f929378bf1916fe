"""hvdtrain for your own torch model, data and loss, in one call:

    import hvdtrain.torch
    result = hvdtrain.torch.fit(MyNet(), train_set, val_set, loss=my_loss, epochs=10, batch_size=64,
                                checkpoint_dir="ckpt")

    srun python train.py             # or mpirun -np 4 python train.py; horovodrun; torchrun (backend="ddp")

`fit` runs the command line's trainer (hvdtrain/torch/train.py) on what it is given: every rank
starts from rank 0's weights, each trains on its shard of `train_data`, checkpoints are written by
rank 0 and resumed, stop signals checkpoint and requeue, the watchdog ends a hung job, validation
is exact; the options are the command line's (`python -m hvdtrain.torch --help`) under their field
names. Bad input ends every rank with the command line's one line and exit status 2, as a failure
on one rank does: no rank is left waiting for another.
"""
from __future__ import annotations

import gc

from hvdtrain import plugins
from hvdtrain.config import config_from_values
from hvdtrain.errors import UsageError, exits_on_usage_error
from hvdtrain.torch.workload import CROSS_ENTROPY, TorchWorkload, check_pairs

PROG = "hvdtrain.torch"


def fit(model, train_data, val_data=None, *, loss=None, **options) -> dict:
    """Train `model` (an nn.Module, or a function of no arguments building one) on `train_data`
    (a map-style Dataset of (input, target) pairs), validating on `val_data` after each epoch if
    given. `loss(outputs, targets)` returns a scalar tensor (default: cross-entropy, with accuracy
    reported). `options`: the command line's, e.g. epochs=, batch_size= (per rank), base_lr=,
    optimizer=, checkpoint_dir=, amp=, backend=. Returns what the result file holds (config,
    history, per-rank throughput and checksums)."""
    result = _fit(model, train_data, val_data, loss, options)
    gc.collect()  # the trainer's cycles, and with them the process group, go now (hvdtrain/cli.py)
    return result


@exits_on_usage_error(PROG)
def _fit(model, train_data, val_data, loss, options: dict) -> dict:
    from hvdtrain.torch.train import run

    given = sorted({"model", "dataset", "loss"} & set(options))
    if given:
        raise UsageError(f"fit() takes the model, the data and the loss as arguments, not as options "
                         f"({', '.join(given)}=)")
    names = {"model": plugins.describe(model), "dataset": plugins.describe(train_data),
             "loss": plugins.describe(loss) if loss is not None else CROSS_ENTROPY}
    cfg = config_from_values("torch", {**names, **options})
    unit = check_pairs(train_data, "fit(): train_data")
    if val_data is not None:
        check_pairs(val_data, "fit(): val_data")
    return run(cfg, TorchWorkload(model, train_data, val_data, loss, model_name=names["model"], sample_unit=unit))
