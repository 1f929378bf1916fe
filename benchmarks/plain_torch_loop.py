"""A plain single-process torch training loop: the reference the GPU check holds hvdtrain to.

    python benchmarks/plain_torch_loop.py --model resnet50 --batch-size 128 --image-size 224 --amp \
        --epochs 2 --synthetic-size 10240 --warmup-steps 10

What a user would write without hvdtrain, so that the ratio hvdtrain / this loop measures
hvdtrain alone (scripts/gpu-check.sh), fed as --feed says:
- prefetch (the default; the fair reference): the next batch copied to the device on a side CUDA
  stream while the step runs, the compute stream waiting for it by an event (NVIDIA's ResNet-50
  example's data_prefetcher; hvdtrain's feeder copies on a side stream too);
- inline: each batch gathered, then copied on the compute stream, in series with the step (what
  most scripts do);
- ceiling: one batch put on the device once and reused at every step (NVIDIA's and Horovod's
  synthetic benchmarks): no input cost at all, the most a model can give;
- the data: hvdtrain's synthetic Dataset through hvdtrain's own train loader (hvdtrain.torch.loader's
  plan and create_loader, one rank): same samples, batch, sampler, workers and pinned memory, a new
  loader each epoch; each batch copied to the device with non_blocking=True;
- the model: torchvision's, built as hvdtrain builds it (weights=None, 1000 classes, seeded);
- the options hvdtrain.torch takes, with its choices: --channels-last {auto,on,off} (auto: on
  for ResNets on CUDA), --amp [{off,fp16,bf16}] (--amp alone: fp16 autocast + GradScaler; bf16:
  autocast, no scaler); SGD with the ImageNet recipe's momentum and weight decay;
- the clock: the first --warmup-steps steps are not timed; each epoch is timed from its first
  timed step to its end, the device synchronised at both ends (as hvdtrain's meter times
  epochs, leaving out loader start-up and what happens between epochs).
cudnn.benchmark, TF32 and the CPU threads are torch's defaults unless --cudnn-benchmark, --tf32,
--threads say otherwise, or --same-as takes them from an hvdtrain run's record (what the GPU
check does: benchmarks/gpu_check.py records them inside the trainer's process).

Prints `PLAIN img/s=X` and, with --result-json, writes the figures and the settings in force.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torchvision

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # hvdtrain from this checkout
from hvdtrain.config import TrainConfig  # noqa: E402
from hvdtrain.torch import data, loader as make_loader  # noqa: E402
from hvdtrain.torch.models import CHANNELS_LAST_MODELS  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_check  # noqa: E402  (benchmarks/gpu_check.py: the settings record, shared with the check)

AMP_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


FEEDS = ("prefetch", "inline", "ceiling")


class Fed:
    """The loader's batches on the device, as `feed` brings them (see the module's docstring);
    `fetched` counts the batches taken from the loader."""

    def __init__(self, loader, device: torch.device, feed: str, channels_last: bool):
        self.loader, self.device, self.feed, self.channels_last = loader, device, feed, channels_last
        self.stream = torch.cuda.Stream(device) if feed == "prefetch" and device.type == "cuda" else None
        self.fetched = 0

    def _to_device(self, batch):
        self.fetched += 1
        x, y = batch[0].to(self.device, non_blocking=True), batch[1].to(self.device, non_blocking=True)
        return (x.contiguous(memory_format=torch.channels_last) if self.channels_last else x), y

    def __iter__(self):
        batches = iter(self.loader)
        if self.feed == "ceiling":
            held = self._to_device(next(batches))
            while True:  # the caller stops after its steps
                yield held
        if self.feed == "inline":
            for batch in batches:
                yield self._to_device(batch)
            return
        ahead = self._ahead(batches)
        while ahead is not None:
            if self.stream is not None:  # the step's stream waits for the copy, not the host
                current = torch.cuda.current_stream(self.device)
                current.wait_stream(self.stream)
                for t in ahead:
                    t.record_stream(current)
            batch, ahead = ahead, self._ahead(batches)  # the next copy queued before this step runs
            yield batch

    def _ahead(self, batches):
        batch = next(batches, None)
        if batch is None:
            return None
        if self.stream is None:
            return self._to_device(batch)
        with torch.cuda.stream(self.stream):
            return self._to_device(batch)


def set_switch(value: str, setter) -> None:
    if value != "default":
        setter(value == "on")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet50", choices=sorted(CHANNELS_LAST_MODELS))
    p.add_argument("--dataset", default="synthetic", choices=("synthetic",), help="hvdtrain's synthetic images")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--synthetic-size", type=int, default=1024, help="synthetic training samples (as hvdtrain's)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=None, help="stop after this many steps in all")
    p.add_argument("--warmup-steps", type=int, default=2, help="steps left out of the clock")
    p.add_argument("--num-workers", type=int, default=2, help="DataLoader workers (as hvdtrain's)")
    p.add_argument("--amp", nargs="?", const="fp16", default="off", choices=("off", "fp16", "bf16"))
    p.add_argument("--channels-last", default="auto", choices=("auto", "on", "off"))
    p.add_argument("--cudnn-benchmark", default="default", choices=("default", "on", "off"))
    p.add_argument("--tf32", default="default", choices=("default", "on", "off"),
                   help="TF32 for matmuls and cuDNN convolutions (default: torch's own defaults)")
    p.add_argument("--threads", type=int, default=None, help="torch's CPU threads (default: torch's own)")
    p.add_argument("--same-as", metavar="SETTINGS_JSON",
                   help="take cudnn.benchmark, TF32 and threads from an hvdtrain run's record "
                        "(benchmarks/gpu_check.py); a missing file leaves the options above")
    p.add_argument("--feed", default="prefetch", choices=FEEDS, help="how batches reach the device (above)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--result-json")
    return p.parse_args(argv)


def main(argv=None):
    a = parse_args(argv)
    device = torch.device(a.device)
    set_switch(a.cudnn_benchmark, lambda on: setattr(torch.backends.cudnn, "benchmark", on))
    set_switch(a.tf32, gpu_check.set_tf32)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.same_as:
        try:
            with open(a.same_as) as f:
                adopted = gpu_check.adopt_settings(json.load(f))
            print(f"PLAIN settings taken from {a.same_as}: {json.dumps(adopted, sort_keys=True)}", flush=True)
        except (OSError, ValueError) as err:
            print(f"PLAIN settings not taken from {a.same_as} ({err}): the options' own", flush=True)
    cfg = TrainConfig(model=a.model, dataset="synthetic", batch_size=a.batch_size, image_size=a.image_size,
                      synthetic_size=a.synthetic_size, num_workers=a.num_workers)
    train_ds, _, _, num_classes, _ = data.build_datasets(cfg)
    plan = make_loader.plan_loader(cfg, train_ds, "train", device)

    torch.manual_seed(cfg.seed)
    model = getattr(torchvision.models, a.model)(weights=None, num_classes=num_classes).to(device)
    channels_last = a.channels_last == "on" or (a.channels_last == "auto" and device.type == "cuda")
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    amp = a.amp != "off"
    scaler = torch.amp.GradScaler(device.type) if a.amp == "fp16" else None

    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    steps_per_epoch = len(train_ds) // a.batch_size
    total = min(a.steps or steps_per_epoch * a.epochs, steps_per_epoch * a.epochs)
    done, timed_steps, timed_seconds, loss, fetched = 0, 0, 0.0, None, 0
    loader = None
    for epoch in range(a.epochs):
        if done == total:
            break
        loader = make_loader.create_loader(plan, train_ds, 0, 1, epoch)
        fed = Fed(loader, device, a.feed, channels_last)
        start = None
        for i, (x, y) in enumerate(fed):
            if i == steps_per_epoch or done == total:
                break
            if start is None and done >= a.warmup_steps:
                synchronize()
                start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=AMP_DTYPES.get(a.amp), enabled=amp):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            if scaler:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                optimizer.step()
            done += 1
            timed_steps += start is not None
        if start is not None:
            synchronize()
            timed_seconds += time.perf_counter() - start
        fetched += fed.fetched
    rate = a.batch_size * timed_steps / timed_seconds if timed_seconds else None
    settings = gpu_check.torch_settings(model, loader, amp=a.amp, scaler=scaler is not None)
    print(f"PLAIN settings {json.dumps(settings, sort_keys=True)}", flush=True)
    print(f"PLAIN feed={a.feed} steps={done} timed_steps={timed_steps} batches_fetched={fetched} "
          f"last_loss={loss.item() if loss is not None else 'nan'}", flush=True)
    print(f"PLAIN img/s={rate:.2f}" if rate else "PLAIN img/s=none (no timed step: fewer steps than --warmup-steps)",
          flush=True)
    if a.result_json:
        with open(a.result_json, "w") as f:
            json.dump({"images_per_sec": rate, "feed": a.feed, "batches_fetched": fetched,
                       "last_loss": loss.item() if loss is not None else None, "steps": done, "timed_steps": timed_steps,
                       "timed_seconds": timed_seconds, "batch_size": a.batch_size, "settings": settings,
                       "argv": sys.argv[1:]}, f, indent=1, sort_keys=True)
    if not rate:
        sys.exit(1)


if __name__ == "__main__":
    main()
