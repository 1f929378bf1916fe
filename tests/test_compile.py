"""--compile (hvdtrain/torch/compiled.py): regions compiled in place, Horovod's allreduces started
during the backward (seen, under mpirun), the same losses as eager, checkpoints that eager and
compiled runs resume from each other. The suite compiles with aot_eager (AOTAutograd's forward
and backward graphs, as inductor gets them, without generating code); inductor's speed-up is
benchmarks/compile_speed.py's."""
import json

import pytest
import torch

from conftest import PYTHON, launch
from hvdtrain.errors import UsageError
from hvdtrain.torch.compiled import compile_model


def blocks():
    torch.manual_seed(0)
    return torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()) for _ in range(3)),
                               torch.nn.Linear(8, 2))


@pytest.mark.parametrize("mode", ["regions", "model"])
def test_compiled_in_place_keeps_the_keys_and_the_outputs(mode):
    eager, compiled = blocks(), blocks()
    names = compile_model(compiled, mode, backend="aot_eager")
    assert names == (["0", "1", "2", "3"] if mode == "regions" else [""])
    assert list(compiled.state_dict()) == list(eager.state_dict())  # no "_orig_mod."
    x = torch.randn(4, 8)
    assert torch.allclose(compiled(x), eager(x), rtol=1e-6, atol=1e-6)
    compiled(x).sum().backward()
    eager(x).sum().backward()
    for a, b in zip(compiled.parameters(), eager.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-6, atol=1e-6)
    regions = [m for m in compiled.children() if getattr(m, "_compiled_call_impl", None) is not None]
    assert len(regions) == (4 if mode == "regions" else 0)
    assert (getattr(compiled, "_compiled_call_impl", None) is not None) == (mode == "model")


def test_named_regions_and_a_wrong_name():
    model = blocks()
    assert compile_model(model, "regions", backend="aot_eager", regions=["1", "3"]) == ["1", "3"]
    with pytest.raises(UsageError, match=r"--compile regions: the model has no submodule 'encoder' \(its children: "
                                         r"0, 1, 2, 3\)"):
        compile_model(blocks(), "regions", backend="aot_eager", regions=["encoder"])
    assert compile_model(torch.nn.Linear(2, 2), "regions", backend="aot_eager") == [""]  # one region
    assert compile_model(blocks(), "off") == []


OVERLAP = r"""
import json, sys, time
import torch
import horovod.torch.optimizer as hvd_optimizer
import hvdtrain.torch.loop
from hvdtrain.torch.compiled import compile_model

run = hvdtrain.torch.loop.start(seed=0, threads=1)
torch.manual_seed(0)
# Three regions; the first one's backward, the last to run, is the long one (about 2 GFLOP).
model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU()),
                            torch.nn.Sequential(torch.nn.Linear(2048, 64), torch.nn.ReLU()),
                            torch.nn.Linear(64, 4))
compile_model(model, sys.argv[1], backend="aot_eager")
model, optimizer = run.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
real, calls = hvd_optimizer.allreduce_async_, []


def seen(tensor, *args, **kwargs):  # Horovod's own call, its time recorded, then made
    calls.append(time.perf_counter())
    return real(tensor, *args, **kwargs)


hvd_optimizer.allreduce_async_ = seen
losses, spreads = [], []
for step in range(4):
    g = torch.Generator().manual_seed(step * 2 + run.rank)
    x, y = torch.randn(512, 1024, generator=g), torch.randint(0, 4, (512,), generator=g)
    optimizer.zero_grad()
    calls.clear()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    assert len(calls) == 6, calls
    spreads.append(calls[-1] - calls[0])  # from the first allreduce handed to Horovod to the last
    losses.append(float(run.sum([loss.detach()])[0]))
if run.is_rank0:
    json.dump({"spreads": spreads[1:], "losses": losses}, open(sys.argv[2], "w"))  # the first step compiles
run.finish()
"""


@pytest.mark.slow
def test_regions_start_horovods_allreduces_during_the_backward_with_eagers_losses(tmp_path):
    """2 ranks under mpirun, a model of three regions whose first region's backward is long:
    compiled by regions, the last regions' gradients go to Horovod's allreduce while that
    backward still runs (the first allreduce and the last are that backward apart); compiled
    whole, every allreduce starts after the whole backward (all within moments). The losses
    are eager's either way."""
    script = tmp_path / "overlap.py"
    script.write_text(OVERLAP)
    out = {}
    for mode in ("off", "regions", "model"):
        result = tmp_path / f"{mode}.json"
        launch("mpirun", 2, [PYTHON, str(script), mode, str(result)], timeout=240)
        out[mode] = json.loads(result.read_text())
    regions, whole = min(out["regions"]["spreads"]), min(out["model"]["spreads"])
    assert regions > 0.005 and regions > 20 * whole, (out["regions"]["spreads"], out["model"]["spreads"])
    for mode in ("regions", "model"):
        assert out[mode]["losses"] == pytest.approx(out["off"]["losses"], rel=1e-5), mode


@pytest.mark.slow
def test_the_trainer_compiled_trains_as_eager_and_resumes_across_compiled_and_eager(tmp_path):
    """python -m hvdtrain.torch --compile regions under mpirun: the start says what was compiled,
    the losses are eager's, and an eager run's checkpoint resumes a compiled run (and back):
    the keys are the eager ones."""
    common = ["-m", "hvdtrain.torch", "--model", "mnist_cnn", "--dataset", "digits", "--threads-per-rank", "1",
              "--compile-backend", "aot_eager", "--batch-size", "32"]

    def run(name, *more):
        result = tmp_path / f"{name}.json"
        done = launch("mpirun", 2, [PYTHON, *common, "--result-json", str(result), *more], timeout=300)
        return done.output, json.loads(result.read_text())

    eager_out, eager = run("eager", "--epochs", "1")
    compiled_out, compiled = run("compiled", "--epochs", "1", "--compile", "regions")
    assert "compile: off" not in compiled_out and "region(s) (aot_eager):" in compiled_out, compiled_out[-3000:]
    assert compiled["final"]["train_loss"] == pytest.approx(eager["final"]["train_loss"], rel=1e-4)
    ckpt = str(tmp_path / "ckpt")
    run("first", "--epochs", "1", "--checkpoint-dir", ckpt)  # eager
    out, resumed = run("second", "--epochs", "2", "--checkpoint-dir", ckpt, "--compile", "regions")
    assert "resumed from" in out and resumed["final"]["epoch"] == 2, out[-3000:]
    out, back = run("third", "--epochs", "3", "--checkpoint-dir", ckpt)  # eager again, from the compiled one's
    assert "resumed from" in out and back["final"]["epoch"] == 3, out[-3000:]
    out, ddp = run("ddp", "--epochs", "1", "--backend", "ddp", "--compile", "model")  # DDP's compiled path
    assert "the whole model (aot_eager); DDP's compiled path" in out, out[-3000:]
    assert ddp["final"]["train_loss"] == pytest.approx(eager["final"]["train_loss"], rel=1e-4)
