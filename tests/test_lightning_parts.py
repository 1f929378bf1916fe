"""hvdtrain.lightning's pieces that need no ranks (fast tier): the strategy's registration, the
guards' options and checkpoint files, the comparison's parity verdict, the data module's refusals.
Their behaviour under real ranks: tests/test_lightning_strategy.py."""
from __future__ import annotations

import pytest
import torch

from hvdtrain.errors import UsageError


def test_importing_hvdtrain_lightning_makes_the_horovod_strategy_name():
    from lightning.pytorch.strategies import StrategyRegistry

    import hvdtrain.lightning

    assert StrategyRegistry["horovod"]["strategy"] is hvdtrain.lightning.HorovodStrategy
    hvdtrain.lightning.HorovodStrategy.register()  # a second import or call: no error, the same entry
    assert StrategyRegistry["horovod"]["strategy"] is hvdtrain.lightning.HorovodStrategy


@pytest.mark.parametrize("options, says", [
    ({"checkpoint_every": "soon"}, "checkpoint"),
    ({"watchdog_seconds": -1}, "--watchdog-seconds must be >= 0"),
])
def test_guards_refuse_bad_options_in_one_line(options, says):
    from hvdtrain.lightning import Guards

    with pytest.raises(UsageError, match=says):
        Guards(**options)


def test_guards_checkpoints_are_found_newest_last(tmp_path):
    from hvdtrain.lightning.guards import hpc_checkpoints

    for name in ("hpc_ckpt_9.ckpt", "hpc_ckpt_10.ckpt", "hpc_ckpt_2.ckpt", "last.ckpt", "hpc_ckpt_3.ckpt.tmp"):
        (tmp_path / name).write_text("")
    assert [n for n, _ in hpc_checkpoints(str(tmp_path))] == [2, 9, 10]
    assert hpc_checkpoints(str(tmp_path / "missing")) == []


def _records(digests=("a", "b"), first=(1.5, 1.25)):
    return [{"rank": r, "digests": [digests[r]], "first_loss": first[r]} for r in (0, 1)]


def test_parity_passes_for_the_same_batches_losses_and_weights():
    from hvdtrain.lightning.compare import compare_records

    w = {"w": torch.ones(3)}
    verdict = compare_records({"ddp": _records(), "horovod": _records()}, {"ddp": w, "horovod": w}, 1e-3)
    assert verdict["passed"] and verdict["weights_relative_distance"] == 0.0, verdict


@pytest.mark.parametrize("horovod, weights, says", [
    (_records(digests=("a", "c")), torch.ones(3), "rank(s) [1] received other batches under horovod"),
    (_records(first=(1.5, 1.3)), torch.ones(3), "first losses differ"),
    (_records(), torch.tensor([1.0, 1.0, 1.1]), "over the tolerance"),
])
def test_parity_fails_naming_what_differs(horovod, weights, says):
    from hvdtrain.lightning.compare import compare_records

    verdict = compare_records({"ddp": _records(), "horovod": horovod},
                              {"ddp": {"w": torch.ones(3)}, "horovod": {"w": weights}}, 1e-3)
    assert not verdict["passed"] and any(says in p for p in verdict["problems"]), verdict


def test_image_data_module_refuses_a_missing_directory(tmp_path):
    from hvdtrain.lightning import ImageDataModule

    with pytest.raises(UsageError, match="ImageDataModule: no directory"):
        ImageDataModule(str(tmp_path / "nowhere"))


def test_importing_hvdtrain_lightning_sets_open_mpis_settings_before_anything_starts_mpi():
    """Trainer(strategy="horovod") under mpirun: Lightning's MPIEnvironment starts MPI (mpi4py)
    before the strategy exists, and Open MPI reads its settings only then; set at the import, CPU
    ranks' MPI yields (without it the Horovod runs of benchmarks/lightning_overhead.py were 20 %
    slower than DDP's, and 22 % faster with it)."""
    import subprocess
    import sys

    from conftest import REPO, base_env

    env = {k: v for k, v in base_env().items() if not k.startswith("OMPI_MCA_")}
    code = ("import os, hvdtrain.lightning; "
            "print(os.environ.get('OMPI_MCA_mpi_yield_when_idle'), os.environ.get('OMPI_MCA_btl'))")
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "self,vader"], done.stdout  # a CPU process alone on this host
