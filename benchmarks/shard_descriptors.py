"""Shard files held open by one decode worker over a whole run, at ImageNet's scale.

    python benchmarks/shard_descriptors.py --ranks 8 --workers 4 --epochs 90 --out runs/descriptors

ImageNet's layout (1,281,167 training samples in 1,143 shards of about 1,121, as
`python -m hvdtrain.shards write` makes them at 128 MB), the training order of the trainer
(datasets.shard_blocked_order: each rank a contiguous run of the epoch's shard permutation,
shuffled) and the DataLoader's split of a rank's batches among its workers (batch k to worker
k mod workers): worker 0 of rank 0 reads its samples' shards through hvdtrain's OpenFiles
(hvdtrain/data/open_files.py) from 1,143 real, tiny files, epoch after epoch, under the open-file limit
of the process (prlimit it: a cluster's 1,024). Printed per epoch: files open at its end, the most
at once, files opened. Writes descriptors.json and the raw per-epoch rows beside it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from hvdtrain.data import datasets, open_files  # noqa: E402

SAMPLES, SHARDS = 1_281_167, 1_143


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--epochs", type=int, default=90)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--samples", type=int, default=SAMPLES, help="ImageNet's by default; fewer: smaller shards")
    p.add_argument("--out", default="runs/descriptors")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    sample_shards = (np.arange(a.samples) * SHARDS // a.samples).astype(np.int32)
    folder = tempfile.mkdtemp(prefix="shards-")
    paths = []
    for i in range(SHARDS):
        paths.append(os.path.join(folder, f"shard-{i:06d}.tar"))
        with open(paths[-1], "wb") as f:
            f.write(b"\0" * 16)
    files = open_files.OpenFiles(paths)
    rows, start = [], time.perf_counter()
    for epoch in range(a.epochs):
        order = datasets.shard_blocked_order(sample_shards, 42, epoch, 0, a.ranks)
        batches = len(order) // a.batch_size
        mine = np.concatenate([order[k * a.batch_size:(k + 1) * a.batch_size] for k in range(0, batches, a.workers)])
        opened_before, files.most_open = files.opened, 0
        for shard in sample_shards[mine]:
            files.pread(int(shard), 4, 0)
        row = {"epoch": epoch + 1, "reads": int(len(mine)), "open_at_end": len(files._open),
               "most_open": files.most_open, "opened": files.opened - opened_before,
               "shards_this_epoch": int(len(np.unique(sample_shards[mine]))),
               "process_descriptors": len(os.listdir("/proc/self/fd"))}
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = {"ranks": a.ranks, "workers": a.workers, "epochs": a.epochs, "batch_size": a.batch_size, "samples": a.samples,
               "keep": files.keep, "soft_limit": open_files.raise_soft_limit()[0], "reserve": open_files.RESERVE,
               "most_open_over_the_run": max(r["most_open"] for r in rows),
               "open_at_the_last_epoch_end": rows[-1]["open_at_end"],
               "opened_per_epoch_median": float(np.median([r["opened"] for r in rows])),
               "seconds": round(time.perf_counter() - start, 1), "rows": rows}
    with open(os.path.join(a.out, f"descriptors-{a.ranks}ranks{'' if a.samples == SAMPLES else f'-{a.samples}'}.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}))


if __name__ == "__main__":
    main()
