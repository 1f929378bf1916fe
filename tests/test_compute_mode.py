"""The device choices of the torch trainer as plain functions the CPU suite runs (fast tier):
mixed precision, channels-last, the loss scale, the optimizer state's device, the bounded CUDA
phase clock, and the options that refuse what Horovod cannot do with them."""
import pytest
import torch

from hvdtrain.config import TrainConfig, build_parser, config_from_args
from hvdtrain.errors import UsageError
from hvdtrain.torch import compute_mode
from hvdtrain.torch.cuda_phases import CudaPhaseClock
from hvdtrain.torch.torch_distributed import state_on_cpu

CPU = torch.device("cpu")


def parse(*argv):
    return config_from_args("torch", build_parser("torch", ["resnet18", "mnist_cnn"], "t").parse_args(list(argv)))


def test_amp_alone_is_fp16_and_bf16_is_a_choice_and_the_old_switch_still_reads():
    assert parse().amp == "off"
    assert parse("--amp").amp == "fp16"
    assert parse("--amp", "bf16", "--model", "mnist_cnn").amp == "bf16"
    assert TrainConfig(amp=True).amp == "fp16" and TrainConfig(amp=False).amp == "off"  # old checkpoints, fit(amp=True)
    with pytest.raises(UsageError, match="unknown --amp mode 'fp32'"):
        TrainConfig(amp="fp32")


@pytest.mark.parametrize("amp, dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16), ("off", torch.float32)])
def test_autocast_runs_on_the_cpu_in_the_type_asked_for(amp, dtype):
    layer = torch.nn.Linear(4, 3)
    with compute_mode.autocast(amp, CPU):
        assert layer(torch.ones(2, 4)).dtype == dtype


def test_only_fp16_has_a_loss_scale_and_it_works_on_the_cpu():
    assert compute_mode.grad_scaler("off", CPU) is None and compute_mode.grad_scaler("bf16", CPU) is None
    scaler = compute_mode.grad_scaler("fp16", CPU)
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=1.0)
    scaler.scale((p * 2).sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert torch.equal(p.detach(), -torch.ones(3))        # unscaled: the gradient is 2, not 2 x 65536
    assert scaler.get_scale() == 65536.0


def test_channels_last_auto_is_for_resnets_on_cuda_and_never_under_adasum():
    cuda = torch.device("cuda", 0)
    assert compute_mode.channels_last("auto", "resnet50", cuda)
    assert not compute_mode.channels_last("auto", "mnist_cnn", cuda)
    assert not compute_mode.channels_last("auto", "resnet50", CPU)
    assert not compute_mode.channels_last("auto", "resnet50", cuda, use_adasum=True)
    assert compute_mode.channels_last("on", "mnist_cnn", CPU)          # asked for: on the CPU too
    assert not compute_mode.channels_last("off", "resnet50", cuda)
    assert compute_mode.cuda_math(CPU) == {}                            # nothing to switch on a CPU


@pytest.mark.parametrize("options, message", [
    (dict(amp="fp16", use_adasum=True), "--amp fp16 with --use-adasum is not supported"),
    (dict(channels_last="on", use_adasum=True), "--channels-last on with --use-adasum is not supported"),
])
def test_what_adasum_cannot_do_is_refused_in_one_line(options, message):
    with pytest.raises(UsageError, match=message):
        TrainConfig(framework="torch", backend="horovod", **options)
    TrainConfig(framework="torch", backend="horovod", use_adasum=True, amp="bf16")  # no loss scale: fine


def test_the_optimizer_state_is_broadcast_from_the_cpu():
    p = torch.nn.Parameter(torch.ones(2, 3))
    opt = torch.optim.Adam([p])
    p.grad = torch.ones(2, 3)
    opt.step()
    state = opt.state_dict()
    # What an object broadcast pickles: tensors that unpickle on the CPU, not on rank 0's GPU.
    moved = state_on_cpu(state)
    assert all(t.device.type == "cpu" for t in moved["state"][0].values())
    assert moved["param_groups"] == state["param_groups"]
    fresh = torch.optim.Adam([p])
    fresh.load_state_dict(state_on_cpu(state))
    assert torch.equal(fresh.state[p]["exp_avg"], opt.state[p]["exp_avg"])


class FakeEvent:
    """A CUDA event's interface on the CPU: recorded at `t` ms, passed by the 'GPU' once done."""

    def __init__(self, t, gpu):
        self.t, self.gpu = t, gpu

    def query(self):
        return self.t <= self.gpu["at"]

    def synchronize(self):
        self.gpu["at"] = max(self.gpu["at"], self.t)
        self.gpu["waits"] += 1

    def elapsed_time(self, later):
        return later.t - self.t


def test_the_cuda_phase_clock_holds_a_bounded_number_of_events_and_adds_up():
    gpu = {"at": 0.0, "waits": 0}
    now = [0.0]

    class Clock(CudaPhaseClock):
        def _event(self):
            return FakeEvent(now[0], gpu)

    clock = Clock(CPU, max_pending=64)
    clock.enabled = True
    clock.start()
    most = 0
    for step in range(5000):      # 25,000 marks: an ImageNet epoch held 6 x 5000 events before
        for phase, ms in (("data", 1.0), ("compute", 5.0), ("sync", 2.0), ("optimizer", 1.0), ("other", 1.0)):
            now[0] += ms
            clock.mark(phase)
            most = max(most, len(clock.pending))
        gpu["at"] = now[0] - 20.0  # the GPU runs 20 ms (two steps) behind the host
    clock.stop()
    assert most <= 65
    assert gpu["waits"] == 1       # only the epoch's end waited: the held events were passed already
    assert clock.seconds == pytest.approx({"data": 5.0, "compute": 25.0, "sync": 10.0, "optimizer": 5.0,
                                           "other": 5.0})


def test_deterministic_turns_autotuning_off_and_deterministic_kernels_on(monkeypatch):
    """--deterministic: what made two GPU runs of the same batches part (cuDNN's autotuned
    algorithms, nondeterministic kernels: docs/gpu.md, 2026-11-27) is off; the flags are set on
    a CPU as on a GPU (the CUDA device object needs no GPU), and restored after."""
    import os

    from hvdtrain.config import TrainConfig
    from hvdtrain.torch import compute_mode

    saved = (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic,
             torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        assert TrainConfig().deterministic is False
        assert compute_mode.cuda_math(torch.device("cuda", 0))["cudnn_benchmark"] is True
        assert torch.backends.cudnn.benchmark and not torch.backends.cudnn.deterministic
        compute_mode.deterministic_kernels(False)
        assert not torch.are_deterministic_algorithms_enabled() and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
        settings = compute_mode.cuda_math(torch.device("cuda", 0), deterministic=True)
        assert settings == {"cudnn_benchmark": False, "tf32": True, "deterministic": True}
        assert not torch.backends.cudnn.benchmark and torch.backends.cudnn.deterministic
        compute_mode.deterministic_kernels(True)
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert compute_mode.cuda_math(torch.device("cpu"), deterministic=True) == {}
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[:2]
        torch.use_deterministic_algorithms(saved[2], warn_only=saved[3])
