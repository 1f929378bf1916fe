"""The reading stage of TensorFlow's and `--loader dali`'s shard readers, one rank, with a parallel
file system's latency added to every read: one read after another (before) against the chunk's
reads overlapped on a pool of threads (hvdtrain/data/parallel_reads.py), side by side.

    python benchmarks/parallel_reads.py --latency-ms 0,0.5,1 --out runs/parallel-reads

Shards of real JPEGs (data_pipeline.jpeg_folder_and_shards, ImageNet-sized files), read through
hvdtrain's ShardReader (CRC-32 checked) in the rank's training order, in chunks of 64 samples (the
TensorFlow reader's READ_PER_CALL; DALI's batches are of the batch size). The latency is a sleep
before each pread of the process (it releases the GIL, as a wait on a file system does). Prints
samples a second per configuration; goal: 3,000 or more at 1 ms, where the cores allow.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data_pipeline import jpeg_folder_and_shards  # noqa: E402

from hvdtrain.data import datasets, open_files, parallel_reads, shards  # noqa: E402

CHUNK = 64


def with_latency(seconds: float):
    original = open_files.OpenFiles.pread

    def pread(self, index, size, offset):
        time.sleep(seconds)
        return original(self, index, size, offset)

    open_files.OpenFiles.pread = pread if seconds else original


def rate(reader, order, overlapped: bool) -> float:
    start = time.perf_counter()
    for k in range(0, len(order), CHUNK):
        chunk = [int(i) for i in order[k:k + CHUNK]]
        if overlapped:
            parallel_reads.read_many(reader.read, chunk)
        else:
            [reader.read(i) for i in chunk]
    return len(order) / (time.perf_counter() - start)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=2048)
    p.add_argument("--latency-ms", default="0,0.5,1")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="runs/parallel-reads")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    _, shard_dir, _ = jpeg_folder_and_shards(os.path.join(a.out, "data"), a.images)
    reader = shards.ShardReader(shard_dir, "train")
    order = datasets.shard_blocked_order(reader.index["shard"], 42, 0, 0, 1)
    rows = []
    for latency in (float(v) for v in a.latency_ms.split(",")):
        with_latency(latency / 1000)
        for repeat in range(a.repeats):  # alternated: a slow spell hits both alike
            for overlapped in (False, True):
                rows.append({"latency_ms": latency, "overlapped": overlapped, "repeat": repeat,
                             "samples_per_sec": rate(reader, order, overlapped)})
                print(json.dumps(rows[-1]), flush=True)
    with_latency(0)
    summary = []
    for latency in sorted({r["latency_ms"] for r in rows}):
        def median(overlapped):
            values = sorted(r["samples_per_sec"] for r in rows if r["latency_ms"] == latency
                            and r["overlapped"] == overlapped)
            return values[len(values) // 2]
        summary.append({"latency_ms": latency, "one_after_another": median(False), "overlapped": median(True)})
    lines = [f"{a.images} JPEGs from shards, chunks of {CHUNK}, {parallel_reads.read_threads()} read threads, "
             f"{len(os.sched_getaffinity(0))} cores; median of {a.repeats}", "",
             "| latency a read | one after another (before) | overlapped (now) | ratio |", "|---|---|---|---|"]
    lines += [f"| {s['latency_ms']:g} ms | {s['one_after_another']:.0f} /s | {s['overlapped']:.0f} /s | "
              f"{s['overlapped'] / s['one_after_another']:.2f}x |" for s in summary]
    print("\n" + "\n".join(lines))
    with open(os.path.join(a.out, "parallel-reads.json"), "w") as f:
        json.dump({"summary": summary, "rows": rows, "read_threads": parallel_reads.read_threads()}, f, indent=1)


if __name__ == "__main__":
    main()
