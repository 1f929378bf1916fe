"""The Python half of scripts/gpu-check.sh: what each run had in force, and the report.

    python benchmarks/gpu_check.py hvdtrain SETTINGS.json -- ARGS...   # python -m hvdtrain.torch ARGS,
                                                                     # its settings written at its end
    python benchmarks/gpu_check.py compare-weights OUT.json REF=DIR NAME=DIR...  # newest checkpoints' distance
    python benchmarks/gpu_check.py report WORK OUT                     # WORK's figures -> OUT's report

A ratio hvdtrain / plain loop measures hvdtrain alone only if both ran with the same settings:
the same cudnn.benchmark, TF32, CPU threads, memory format of the weights, AMP mode and loss
scaler, and the same train loader (batch, workers, pinned memory). The plain loop records them
itself (benchmarks/plain_torch_loop.py); an hvdtrain run records them here, from inside the
trainer's process, when it finishes. The report compares them and says which differ.
"""
from __future__ import annotations

import json
import os
import re
import statistics
import sys
import time
import warnings

GOAL = 0.97  # hvdtrain / plain loop, one GPU, AMP on
JPEG_GOAL = 0.95  # hvdtrain on JPEG shards / the same run on synthetic images in memory
CKPT_GOAL = 0.02  # --checkpoint-every 50: at most this share of the run's speed


# ---------------------------------------------------------------- settings in force (in a training process)
def set_tf32(on: bool) -> None:
    import torch

    with warnings.catch_warnings():  # torch >= 2.9 prefers fp32_precision; allow_tf32 still works
        warnings.simplefilter("ignore")
        torch.backends.cuda.matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on


def adopt_settings(recorded: dict) -> dict:
    """Put this process in the speed settings another run recorded (torch_settings): cudnn.benchmark,
    TF32, float32 matmul precision, CPU threads. Returns those it set."""
    import torch

    adopted = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if recorded.get("cudnn_benchmark") is not None:
            torch.backends.cudnn.benchmark = adopted["cudnn_benchmark"] = bool(recorded["cudnn_benchmark"])
        if recorded.get("cudnn_tf32") is not None:
            torch.backends.cudnn.allow_tf32 = adopted["cudnn_tf32"] = bool(recorded["cudnn_tf32"])
        if recorded.get("float32_matmul_precision"):  # before matmul_tf32: "high" also turns that on
            torch.set_float32_matmul_precision(recorded["float32_matmul_precision"])
            adopted["float32_matmul_precision"] = recorded["float32_matmul_precision"]
        if recorded.get("matmul_tf32") is not None:
            torch.backends.cuda.matmul.allow_tf32 = adopted["matmul_tf32"] = bool(recorded["matmul_tf32"])
        if recorded.get("threads"):
            torch.set_num_threads(int(recorded["threads"]))
            adopted["threads"] = int(recorded["threads"])
    return adopted


def torch_settings(model=None, loader=None, amp=None, scaler=None) -> dict:
    """The settings of this process that change the speed of a step (None: unknown)."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = {"cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
             "cudnn_tf32": bool(torch.backends.cudnn.allow_tf32),
             "matmul_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
             "float32_matmul_precision": torch.get_float32_matmul_precision(),
             "threads": torch.get_num_threads()}
    s["channels_last"] = None
    if model is not None:
        weight = next((p for p in model.parameters() if p.dim() == 4), None)
        if weight is not None:
            s["channels_last"] = bool(weight.is_contiguous(memory_format=torch.channels_last)
                                      and not weight.is_contiguous())
        s["device"] = str(next(model.parameters()).device)
    s["amp"], s["grad_scaler"] = amp, scaler
    if loader is not None:
        s.update(loader_batch_size=loader.batch_size if loader.batch_size is not None
                 else len(next(iter(loader.batch_sampler))), loader_workers=loader.num_workers,
                 loader_pin_memory=bool(loader.pin_memory), dataset=type(loader.dataset).__name__)
    return s


def run_hvdtrain(settings_path: str, argv: list[str]) -> None:
    """python -m hvdtrain.torch ARGV, with its settings written to settings_path when the trainer
    finishes (from the trainer itself: its unwrapped model, its loader, its AMP scaler)."""
    from hvdtrain.torch import loader, train

    loaders = []
    make_loader = loader.create_loader

    def create_loader(plan, *args, **kwargs):
        made = make_loader(plan, *args, **kwargs)
        if plan.split == "train":
            loaders.append(made)
        return made

    loader.create_loader = create_loader  # the trainer calls loader.create_loader(...) each epoch
    finish = train.Trainer.finish

    def finish_and_record(self, *args, **kwargs):
        cfg = getattr(self, "cfg", None)
        settings = torch_settings(getattr(self, "raw_model", None), loaders[-1] if loaders else None,
                                  amp=getattr(cfg, "amp", None), scaler=getattr(self, "scaler", None) is not None)
        if getattr(self, "rank", 0) == 0:
            with open(settings_path, "w") as f:
                json.dump(settings, f, indent=1, sort_keys=True)
        return finish(self, *args, **kwargs)

    train.Trainer.finish = finish_and_record
    train.main(argv)


# ---------------------------------------------------------------- ranks sharing the GPU: their weights
# Two ranks against one rank of the same global batch and LR cannot end with equal weights where
# the model normalises over the batch: each rank's BatchNorm sees its half, one rank's micro-batches
# other halves (DistributedSampler gives rank r every 2nd sample; ResNet-18 at 32 px on a CPU,
# 3 steps: 1.3 x the distance the run moved; a BatchNorm-free model with dropout differs too, by
# its masks). What must agree is the reduction: Horovod and DDP reduce the same per-rank batches,
# so their weights differ only by the order of sums and AMP's rounding (exactly equal on a CPU).
# The one-rank distances are reported beside a control, one rank with the whole batch at once:
# BatchNorm over other groups of the same samples. Every shared run is --deterministic: on an
# H100 without it (2026-11-27), Horovod and DDP ended 1.04 apart, as far apart as unrelated runs
# (cuDNN's autotuned algorithms and atomics, amplified by an unstable first 30 steps); the same
# one-rank run twice measures what is left (0 where the kernels are deterministic).
SHARED_TOLERANCE = 0.05  # |w(Horovod) - w(DDP)| / |w(one rank) - w(start)|, parameters only


def compare_weights(out_path: str, reference: str, others: list[str]) -> dict:
    """The distance between the newest checkpoints of runs (NAME=DIR) and the reference run's,
    relative to how far the reference moved from the start: |w - w_ref| / |w_ref - w_0| over the
    parameters (BatchNorm's running statistics left out: they are per rank, averaged only at
    checkpoints). w_0 is the model as the trainer built it (its seed, before any step)."""
    import torch

    from hvdtrain.checkpoint import latest_checkpoint
    from hvdtrain.torch import models

    def load(item):
        name, directory = item.split("=", 1)
        path = latest_checkpoint(directory)
        if path is None:
            raise SystemExit(f"compare-weights: no checkpoint in {directory} ({name})")
        return name, path, torch.load(path, map_location="cpu", weights_only=True)

    ref_name, ref_path, ref = load(reference)
    cfg = ref["config"]
    torch.manual_seed(cfg["seed"])
    start = models.build_model(cfg["model"], 3, cfg["num_classes"], cfg["image_size"])
    names = sorted(n for n, _ in start.named_parameters())

    def flat(state):  # flatten() reads logical order, whatever the memory format (channels-last)
        return torch.cat([state[n].detach().double().flatten() for n in names])

    w0, wref = flat(start.state_dict()), flat(ref["model"])
    moved = float((wref - w0).norm())
    result = {"reference": ref_name, "reference_checkpoint": os.path.basename(ref_path),
              "reference_global_step": ref["global_step"], "reference_moved": moved,
              "tolerance": SHARED_TOLERANCE, "runs": {}}
    flats = {}
    for item in others:
        name, path, state = load(item)
        flats[name] = w = flat(state["model"])
        result["runs"][name] = {"checkpoint": os.path.basename(path), "global_step": state["global_step"],
                                "relative_distance": float((w - wref).norm()) / moved if moved else None}
    pairs = list(flats)
    if len(pairs) >= 2:  # the runs' distance to each other: the noise of a reduction's order and AMP
        a, b = pairs[:2]
        result["between"] = {"runs": [a, b], "relative_distance": float((flats[a] - flats[b]).norm()) / moved
                             if moved else None}
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    return result


# ---------------------------------------------------------------- where a rank's host time goes
def profile_summary(path: str, within: str = "_train_epoch", top: int = 10) -> dict | None:
    """py-spy's raw profile (`record --threads --idle --format raw`: one line a stack,
    root first, then its sample count) of the main thread while it trains (stacks through
    `within`): the share of samples of each innermost Python function (where the thread is,
    waiting included) and of each Python function on the stack (what it is doing that for)."""
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    innermost, inclusive, total, threads = {}, {}, 0, {}
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        thread = frames[0].split(": ", 1)[-1] if frames[0].startswith("thread (") else "?"
        threads[thread] = threads.get(thread, 0) + int(count)
        if thread != "MainThread" or not any(fr.startswith(within + " (") for fr in frames):
            continue
        total += int(count)

        def name(frame):  # "f (file.py:12)" -> "f (file.py)": a function, not a line
            head, _, where = frame.partition(" (")
            return f"{head} ({where.rsplit(':', 1)[0].rstrip(')')})" if where else head
        python = [fr for fr in frames if ".py:" in fr]  # a native leaf (libc, CUDA) says less than
        leaf = name(python[-1] if python else frames[-1])  # the Python line that called into it
        innermost[leaf] = innermost.get(leaf, 0) + int(count)
        for fn in {name(fr) for fr in frames[1:] if ".py:" in fr}:
            inclusive[fn] = inclusive.get(fn, 0) + int(count)

    def ranked(counts):
        return [[k, round(v / total, 4)] for k, v in sorted(counts.items(), key=lambda kv: -kv[1])[:top]] if total else []
    return {"samples_training": total, "samples_by_thread": threads, "innermost": ranked(innermost),
            "inclusive": ranked({k: v for k, v in inclusive.items() if v < total})}


# ---------------------------------------------------------------- the report
def _load(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _stages(work: str) -> list[dict]:
    rows = []
    try:
        with open(os.path.join(work, "stages.tsv")) as f:
            for line in f:
                name, status, seconds, limit, note = (line.rstrip("\n").split("\t") + [""] * 5)[:5]
                rows.append({"stage": name, "status": status, "seconds": float(seconds or 0),
                             "limit_s": float(limit or 0), "note": note})
    except OSError:
        pass
    return rows


def ratio_verdict(numerators: list, denominators: list, goal: float | None) -> dict:
    """A ratio measured in alternated pairs (runs A/B/A/B: numerators[i] / denominators[i]): each
    pair's ratio, their median and spread (largest less smallest), and the verdict against
    `goal` (at least): "met" or "NOT met" only where two pairs or more agree, their spread smaller
    than the median's distance from the goal; else "undecided" (more repeats would decide)."""
    ratios = [a / b for a, b in zip(numerators, denominators) if a and b]
    if not ratios:
        return {"ratios": [], "median": None, "spread": None, "verdict": "no figures"}
    median, spread = statistics.median(ratios), max(ratios) - min(ratios)
    if goal is None:
        verdict = "no goal"
    elif len(ratios) < 2 or spread >= abs(median - goal):
        verdict = "undecided"
    else:
        verdict = "met" if median >= goal else "NOT met"
    return {"ratios": ratios, "median": median, "spread": spread, "verdict": verdict}


def _hvdtrain_rate(result) -> float | None:
    try:
        return float(result["throughput"]["total_images_per_sec"])
    except (TypeError, KeyError, ValueError):
        return None


# The settings whose difference makes a ratio unfair, as the report names them.
SETTINGS = (("cudnn_benchmark", "cudnn.benchmark"), ("cudnn_tf32", "TF32 (cuDNN)"), ("matmul_tf32", "TF32 (matmul)"),
            ("float32_matmul_precision", "float32 matmul precision"), ("threads", "CPU threads"),
            ("channels_last", "channels-last weights"), ("amp", "AMP"), ("grad_scaler", "GradScaler"),
            ("loader_batch_size", "loader batch"), ("loader_workers", "loader workers"),
            ("loader_pin_memory", "pinned memory"), ("dataset", "dataset"))


def build_report(work: str, out: str) -> tuple[str, dict]:
    logs = os.path.join(work, "logs")
    meta = _load(os.path.join(logs, "check.json")) or {}
    env = _load(os.path.join(logs, "env.json")) or {}
    stages = _stages(work)
    plain_by_name = {n: _load(os.path.join(logs, f"{n}.json")) or {} for n in ("plain", "plain-2")}
    plain_runs = [r for r in plain_by_name.values() if r]
    plain_rate = {n: r.get("images_per_sec") for n, r in plain_by_name.items()}
    plain_rates = [r["images_per_sec"] for r in plain_runs if r.get("images_per_sec")]
    plain = sum(plain_rates) / len(plain_rates) if plain_rates else None
    runs = {n: _load(os.path.join(logs, f"{n}.json"))
            for n in ("horovod", "horovod-2", "ddp", "resume", "feeder-off", "jpeg", "jpeg-feeder-off", "ckpt-every",
                      "compile")}
    # hvdtrain and the plain loop alternated (horovod, plain, horovod-2, plain-2): the pairs' ratios.
    alternated = ratio_verdict([_hvdtrain_rate(runs[n]) for n in ("horovod", "horovod-2")],
                               [plain_rate["plain"], plain_rate["plain-2"]], None if meta.get("device") == "cpu" else GOAL)
    ceiling = (_load(os.path.join(logs, "ceiling.json")) or {}).get("images_per_sec")
    rates = {"plain": plain, **{n: _hvdtrain_rate(runs[n])
                                for n in ("horovod", "ddp", "feeder-off", "jpeg", "jpeg-feeder-off", "ckpt-every",
                                          "compile")}}
    ratios = {n: (rates[n] / plain if rates[n] and plain else None) for n in ("horovod", "ddp")}
    # Real JPEGs (shards, decoded by workers) against the same run on synthetic images in memory;
    # the feeder's effect: the Horovod run with it against without it.
    jpeg_ratio = rates["jpeg"] / rates["horovod"] if rates["jpeg"] and rates["horovod"] else None
    data_ms = {n: ((runs[n] or {}).get("ranks") or [{}])[0].get("phases_ms", {}) or {}
               for n in ("horovod", "feeder-off", "jpeg", "jpeg-feeder-off", "ckpt-every")}
    # Interval checkpoints' cost: the Horovod run with --checkpoint-every against without.
    ckpt_cost = 1 - rates["ckpt-every"] / rates["horovod"] if rates["ckpt-every"] and rates["horovod"] else None
    # --compile regions against eager (the Horovod run, same epochs on a GPU; its own epochs here),
    # and the stage's extra seconds: the compiler's (the epochs' own time aside).
    compile_speedup = rates["compile"] / rates["horovod"] if rates["compile"] and rates["horovod"] else None
    seconds = {row["stage"]: row["seconds"] for row in stages if row["status"] == "ok"}
    compile_seconds = seconds["compile"] - seconds["ckpt-every"] if {"compile", "ckpt-every"} <= set(seconds) else None
    shared = shared_summary(logs)
    profiles = {n: profile_summary(os.path.join(logs, f"profile-{n}.txt")) for n in ("horovod", "ddp")}

    # Resume: the resumed run started where the Horovod run ended and ran one more epoch.
    h, r = runs["horovod"], runs["resume"]
    resume = {"ran": False}
    try:
        with open(os.path.join(logs, "resume.log"), errors="replace") as f:
            resumed_line = next((line.strip() for line in f if "resumed from" in line), None)
    except OSError:
        resumed_line = None
    if h and r:
        resume = {"ran": bool(resumed_line) and r["global_step"] > h["global_step"] and r["epoch"] == h["epoch"] + 1,
                  "from_step": h["global_step"], "to_step": r["global_step"], "from_epoch": h["epoch"],
                  "to_epoch": r["epoch"], "line": resumed_line}

    settings = {"plain": (plain_runs[0] if plain_runs else {}).get("settings"),
                **{n: _load(os.path.join(logs, f"{n}-settings.json")) for n in ("horovod", "ddp")}}
    differ = []
    for key, label in SETTINGS:
        values = {n: (s or {}).get(key) for n, s in settings.items() if s}
        if len(values) > 1 and len({json.dumps(v) for v in values.values()}) > 1:
            differ.append(label)

    cpu = meta.get("device") == "cpu"
    failed = [s["stage"] for s in stages if s["status"] != "ok"]
    figures = {"when": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "check": meta, "environment": env,
               "images_per_sec": rates, "plain_runs_images_per_sec": plain_rates, "ratios": ratios,
               "jpeg_over_synthetic": jpeg_ratio, "jpeg_goal": None if cpu else JPEG_GOAL, "phases_ms": data_ms,
               "goal": None if cpu else GOAL, "alternated": alternated, "ceiling_images_per_sec": ceiling,
               # Met only as the alternated pairs decide it (None: undecided, or the CPU mode).
               "goal_met": {"met": True, "NOT met": False}.get(alternated["verdict"]),
               "checkpoint_every_cost": ckpt_cost, "checkpoint_every_goal": CKPT_GOAL,
               "compile_speedup": compile_speedup, "compile_seconds": compile_seconds, "shared_gpu": shared,
               "host_profiles": profiles,
               "resume": resume, "settings": settings, "settings_differ": differ, "stages": stages,
               "failed_stages": failed}

    def num(v, fmt="{:.1f}"):
        return fmt.format(v) if isinstance(v, (int, float)) else "-"

    device = env.get("device_name") or meta.get("device", "?")
    # The env stage runs before the build: the Horovod run's result file has the one it trained with.
    horovod_version = env.get("horovod") or ((runs.get("horovod") or {}).get("versions") or {}).get("horovod")
    lines = [f"# hvdtrain GPU check: {device}", "",
             f"{figures['when']}; torch {env.get('torch', '?')} (CUDA {env.get('torch_cuda') or '-'}), "
             f"Python {env.get('python', '?')}, Horovod {horovod_version or '-'}; {meta.get('model')} on synthetic "
             f"{meta.get('image_size')}x{meta.get('image_size')} images, batch {meta.get('batch_size')}, AMP "
             f"{meta.get('amp')}, channels-last {meta.get('channels_last')}, {meta.get('epochs')} epochs of "
             f"{meta.get('steps_per_epoch')} steps ({meta.get('warmup_steps')} warm-up steps untimed), one rank.", ""]
    if failed:
        lines += [f"**Failed: {', '.join(failed)}** (the stage table below; their logs are in the archive).", ""]
    if cpu:
        lines += ["CPU mode (`--cpu`): a check of the script itself at tiny sizes; these ratios are not the goal's.", ""]
    lines += shared_lines(shared, num)
    lines += ["## One rank", "",
              "| run | img/s | / plain loop (the mean of its runs; the goal's verdict: below) |", "|---|---|---|",
              f"| plain torch loop | {num(plain)} | 1.000 |" if plain else "| plain torch loop | FAILED | - |"]
    for name, label in (("horovod", "hvdtrain, Horovod"), ("ddp", "hvdtrain, DDP")):
        lines.append(f"| {label} | {num(rates[name]) if rates[name] else 'FAILED'} | {num(ratios[name], '{:.3f}')} |")
    lines += ["", "At one rank Horovod registers no gradient hook and communicates nothing, while DDP runs its "
              "reducer: Horovod against DDP here is not Horovod's overhead (the two-rank runs are).", ""]
    lines += ["### hvdtrain against the plain loop, alternated", "",
              "The plain loop fed as hvdtrain is (the next batch copied on a side stream during the step: "
              "`--feed prefetch`), the two run by turns:", "",
              "| pair | hvdtrain, Horovod | plain loop | ratio |", "|---|---|---|---|"]
    for a, b in (("horovod", "plain"), ("horovod-2", "plain-2")):
        mine, theirs = _hvdtrain_rate(runs[a]), plain_rate[b]
        lines.append(f"| {a} / {b} | {num(mine)} | {num(theirs)} | "
                     f"{num(mine / theirs if mine and theirs else None, '{:.3f}')} |")
    lines += ["", f"Median {num(alternated['median'], '{:.3f}')}, spread {num(alternated['spread'], '{:.3f}')} "
              f"over {len(alternated['ratios'])} pair(s): goal >= {GOAL}: **{alternated['verdict']}**"
              + (" (the spread is not smaller than the distance to the goal: more repeats would decide)"
                 if alternated["verdict"] == "undecided" else "") + ".",
              f"The ceiling (the plain loop on one batch held on the device, `--feed ceiling`): {num(ceiling)} img/s"
              + (f"; hvdtrain, Horovod at {rates['horovod'] / ceiling:.3f} of it." if ceiling and rates["horovod"]
                 else "."), ""]

    def step(name):
        phases = data_ms[name]
        return (f"data {phases['data']:.1f} of {sum(phases.values()):.1f} ms a step" if phases.get("data") is not None
                else "no step times")
    lines += ["| other run | img/s | |", "|---|---|---|",
              f"| Horovod, `--feeder off` (batches prepared in series) | {num(rates['feeder-off'])} | "
              f"{step('feeder-off')} (feeder on: {step('horovod')}) |",
              f"| Horovod, JPEG shards ({meta.get('jpegs')} JPEGs, {meta.get('jpeg_workers')} decode workers) | "
              f"{num(rates['jpeg'])} | / synthetic {num(jpeg_ratio, '{:.3f}')} (goal >= {JPEG_GOAL}); {step('jpeg')} |",
              f"| Horovod, JPEG shards, `--feeder off` | {num(rates['jpeg-feeder-off'])} | {step('jpeg-feeder-off')} |",
              f"| Horovod, `--checkpoint-every {meta.get('checkpoint_every')}` | {num(rates['ckpt-every'])} | cost "
              f"{num(None if ckpt_cost is None else 100 * ckpt_cost, '{:.1f}')} % of the run without (goal <= "
              f"{100 * CKPT_GOAL:.0f} %); {step('ckpt-every')} |",
              f"| Horovod, `--compile regions` ({meta.get('compile_backend')}) | {num(rates['compile'])} | "
              f"x{num(compile_speedup, '{:.3f}')} of eager; the stage {num(compile_seconds, '{:+.0f}')} s against "
              f"`ckpt-every`'s (the compiler) |",
              ""]
    for name, prof in profiles.items():
        if prof and prof["samples_training"]:
            lines += [f"Host time of the {name} run's main thread while training (py-spy, "
                      f"{prof['samples_training']} samples, waits included): innermost frames "
                      + ", ".join(f"{k} {100 * v:.0f} %" for k, v in prof["innermost"][:6])
                      + "; inside " + ", ".join(f"{k} {100 * v:.0f} %" for k, v in prof["inclusive"][:8]) + ".", ""]
    if len(plain_rates) > 1:
        lines += [f"The plain loop ran before and after the hvdtrain runs: {', '.join(f'{v:.1f}' for v in plain_rates)}"
                  " img/s; the table has their mean.", ""]
    lines += ["Settings in force (recorded inside each run): " +
              ("the same in every run." if not differ else f"DIFFERENT: {', '.join(differ)}; the ratios are unfair."), ""]
    if any(settings.values()):
        names = [n for n in ("plain", "horovod", "ddp") if settings.get(n)]
        lines += ["| setting | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        for key, label in SETTINGS:
            lines.append(f"| {label} | " + " | ".join(str(settings[n].get(key)) for n in names) + " |")
        lines.append("")
    if resume["ran"]:
        lines += [f"Resume: ran, from the Horovod run's checkpoint at step {resume['from_step']} (epoch "
                  f"{resume['from_epoch']}) to step {resume['to_step']} (epoch {resume['to_epoch']}).", ""]
    else:
        lines += ["Resume: FAILED (no resumed run that went on from the Horovod run's last checkpoint).", ""]
    lines += ["| stage | status | seconds | limit |", "|---|---|---|---|"]
    for s in stages:
        lines.append(f"| {s['stage']} | {s['status']} | {s['seconds']:.0f} | {s['limit_s']:.0f} |"
                     + (f" {s['note']}" if s["note"] else ""))
    lines += ["", f"Logs: `{os.path.basename(meta.get('archive', 'gpu-check-logs.tar.gz'))}` beside this file "
              "(each run's log and result file, the build's log, the doctor's)."]
    return "\n".join(lines) + "\n", figures


def shared_summary(logs: str) -> dict:
    """Two ranks sharing the GPU: each run's img/s and ranks' checksums, the resume, the weights."""
    runs = {n: _load(os.path.join(logs, f"{n}.json"))
            for n in ("shared-ref", "shared-ref-2", "shared-ref-big", "shared-hvd", "shared-ddp", "shared-resume")}
    summary = {"runs": {}}
    for name, r in runs.items():
        if not r:
            summary["runs"][name] = None
            continue
        checksums = [rank.get("param_checksum") for rank in r.get("ranks") or []]
        summary["runs"][name] = {"world_size": r.get("world_size"), "global_step": r.get("global_step"),
                                 "epoch": r.get("epoch"), "images_per_sec": _hvdtrain_rate(r),
                                 "device": (r.get("ranks") or [{}])[0].get("device"),
                                 "ranks_equal": len(checksums) == r.get("world_size") and len(set(checksums)) == 1}
    try:
        with open(os.path.join(logs, "shared-resume.log"), errors="replace") as f:
            summary["resumed_line"] = next((line[line.index("resumed from"):].strip() for line in f
                                            if "resumed from" in line), None)
    except OSError:
        summary["resumed_line"] = None
    hvd, res, ddp = summary["runs"]["shared-hvd"], summary["runs"]["shared-resume"], summary["runs"]["shared-ddp"]
    # Horovod's overhead against DDP's, where it exists: at two ranks (one rank communicates nothing).
    summary["horovod_over_ddp"] = (hvd["images_per_sec"] / ddp["images_per_sec"]
                                   if hvd and ddp and hvd["images_per_sec"] and ddp["images_per_sec"] else None)
    summary["resume_ran"] = bool(summary["resumed_line"] and hvd and res and res["global_step"] > hvd["global_step"])
    summary["weights"] = weights = _load(os.path.join(logs, "shared-weights.json"))
    between = ((weights or {}).get("between") or {}).get("relative_distance")
    summary["weights_within_tolerance"] = None if between is None else between <= SHARED_TOLERANCE
    try:
        with open(os.path.join(logs, "shared-doctor.log"), errors="replace") as f:
            doctor = f.read()
        summary["doctor_verdict"] = next((m[0].strip() for m in map(re.compile(r"(NOT )?READY\b.*").search,
                                                                    doctor.splitlines()) if m), None)
    except OSError:
        summary["doctor_verdict"] = None
    try:
        with open(os.path.join(logs, "shared-nccl.log"), errors="replace") as f:
            summary["nccl"] = [line.strip() for line in f if line.strip()]
    except OSError:
        summary["nccl"] = []
    return summary


def shared_lines(shared: dict, num) -> list[str]:
    lines = ["## Two ranks sharing the GPU (`HVDTRAIN_SHARE_GPU=1`)", ""]
    if shared["nccl"]:
        lines += ["NCCL: " + "; ".join(shared["nccl"]), ""]
    lines += ["| run | ranks | steps | img/s (all ranks) | device | ranks' weights equal |", "|---|---|---|---|---|---|"]
    labels = {"shared-ref": "one rank, same global batch (2 batches per allreduce)",
              "shared-ref-2": "the same one-rank run again (the floor)",
              "shared-ref-big": "one rank, same global batch at once (control)", "shared-hvd": "Horovod",
              "shared-ddp": "DDP", "shared-resume": "Horovod, resumed one more epoch"}
    for name, label in labels.items():
        r = shared["runs"].get(name)
        lines.append(f"| {label} | FAILED | | | | |" if not r else
                     f"| {label} | {r['world_size']} | {r['global_step']} | {num(r['images_per_sec'])} | {r['device']} | "
                     f"{'yes' if r['ranks_equal'] else 'NO'} |")
    w = shared["weights"]
    lines += ["", f"Horovod / DDP at two ranks: {num(shared['horovod_over_ddp'], '{:.3f}')} (one run each; both "
              "ranks on one GPU: the collectives under contention, not a multi-GPU figure)."]
    lines.append("")
    if w:
        d = {n: v.get("relative_distance") for n, v in w["runs"].items()}
        lines += [f"Weights after {w['reference_global_step']} steps, as distances relative to how far the one-rank run "
                  f"(2 batches per allreduce) moved from the start: **Horovod to DDP "
                  f"{num((w.get('between') or {}).get('relative_distance'), '{:.4f}')}** (the same per-rank batches: "
                  f"the order of sums and AMP's rounding; tolerance {w['tolerance']}: "
                  + ("within" if shared["weights_within_tolerance"] else "NOT within") + "); to the one-rank run: "
                  f"Horovod {num(d.get('shared-hvd'), '{:.4f}')}, DDP {num(d.get('shared-ddp'), '{:.4f}')}, and the "
                  f"control (one rank, the batch at once: BatchNorm over other groups) "
                  f"{num(d.get('shared-ref-big'), '{:.4f}')}; the one-rank run again (`--deterministic`'s floor) "
                  f"{num(d.get('shared-ref-2'), '{:.4f}')}.", ""]
    else:
        lines += ["Weights: not compared (a run or its checkpoint is missing).", ""]
    lines += [("Resume: ran (" + shared["resumed_line"] + ")." if shared["resume_ran"] else "Resume: FAILED."),
              f"Doctor on 2 ranks: {shared['doctor_verdict'] or 'no verdict'}.", ""]
    return lines


def write_report(work: str, out: str) -> None:
    text, figures = build_report(work, out)
    with open(os.path.join(out, "gpu-check.json"), "w") as f:
        json.dump(figures, f, indent=1, sort_keys=True)
    with open(os.path.join(out, "gpu-check.md"), "w") as f:
        f.write(text)
    sys.stdout.write(text)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) >= 2 and argv[0] == "hvdtrain":
        rest = argv[2:]
        run_hvdtrain(argv[1], rest[1:] if rest[:1] == ["--"] else rest)
    elif len(argv) >= 4 and argv[0] == "compare-weights":
        compare_weights(argv[1], argv[2], argv[3:])
    elif len(argv) == 3 and argv[0] == "report":
        write_report(argv[1], argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
