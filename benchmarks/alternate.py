"""Run benchmark configurations alternated within each repeat, the way both overhead benchmarks
do (benchmarks/horovod_overhead.py, benchmarks/tf_overhead.py): a slow spell of this shared
machine then hits every configuration alike instead of one.

    runs, extras = run_alternated(table, names, repeats, env, parse, out_dir, cwd)

table: name -> (command, kind); parse(kind, output, result_json_path) -> (img/s, extra or None).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess


def run_alternated(table, names, repeats, env, parse, out_dir, cwd, describe=lambda extra: ""):
    runs = {n: [] for n in names}
    extras = {n: [] for n in names}
    for repeat in range(repeats):
        for name in names:  # every config once per repeat
            cmd, kind = table[name]
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=cwd)
            if done.returncode != 0:
                print(f"{name}: FAILED\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}", flush=True)
                continue
            rate, extra = parse(kind, done.stdout + done.stderr, os.path.join(out_dir, f"{name}.json"))
            runs[name].append(rate)
            if extra is not None:
                extras[name].append(extra)
            print(f"[repeat {repeat}] {name}: {rate:.2f} img/s{describe(extra) if extra is not None else ''}",
                  flush=True)
    return runs, extras


def medians(runs: dict) -> dict:
    return {n: statistics.median(v) for n, v in runs.items() if v}


def parse_args(doc: str, steps: int, out: str):
    """The options both overhead benchmarks take (ResNet-18's batch and image size, the repeats)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--only", default=None, help="comma-separated config names")
    p.add_argument("--out", default=out)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    return a


def mpirun(np: int, env: dict | None = None) -> list[str]:
    """hvdtrain's mpirun prefix for np ranks, with `-x KEY=VALUE` for each of env."""
    from hvdtrain.launch import launch_command

    cmd = launch_command("mpirun", np)
    for key, value in (env or {}).items():
        cmd += ["-x", f"{key}={value}"]
    return cmd
