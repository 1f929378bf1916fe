"""A user's script that trains at its top level, without `if __name__ == "__main__":`, under mpirun
and srun: DataLoader workers would import it again and start training too (MPI refuses them, and
the ranks used to stay alive minutes after their tracebacks). Every rank ends within seconds with
one line naming the script, its line and the guard."""
import time

import pytest

from conftest import PYTHON, assert_job_failed_with, launch

pytestmark = pytest.mark.slow

SCRIPT = '''import torch
from torch import nn
from torch.utils.data import Dataset
import hvdtrain.torch


class Squares(Dataset):  # map-style, per sample: loaded by DataLoader workers
    def __len__(self):
        return 64

    def __getitem__(self, i):
        x = torch.tensor([i / 64.0])
        return x, x ** 2


model = nn.Sequential(nn.Linear(1, 8), nn.ReLU(), nn.Linear(8, 1))
result = hvdtrain.torch.fit(model, Squares(), Squares(), loss=nn.functional.mse_loss, epochs=2, batch_size=8,
                            checkpoint_dir="ckpt", threads_per_rank=1, num_workers=1)
print(result["final"])
'''


@pytest.mark.parametrize("launcher", ["mpirun", "srun"])
def test_an_unguarded_script_ends_every_rank_with_one_line(tmp_path, launcher, request):
    if launcher == "srun":
        request.getfixturevalue("slurm_cluster")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    started = time.monotonic()
    run = launch(launcher, 2, [PYTHON, str(script)], timeout=60, cwd=str(tmp_path), check=False)
    assert time.monotonic() - started < 30, run.output[-3000:]
    lines = assert_job_failed_with(run, f"{script} trains at its top level (line 17): DataLoader worker processes "
                                        "import it again", 2)
    assert all('put the training under `if __name__ == "__main__":`' in m["message"] for m in lines)
    assert run.returncode == 2 if launcher == "mpirun" else run.returncode != 0
    assert "Traceback" not in run.output and "MPI_Init" not in run.output, run.output[-3000:]
