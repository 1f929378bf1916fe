"""A rehearsal at ImageNet's scale, not the test suite's: 1,281,167 training and 50,000 validation
samples in 1,100 + 43 shards, 8 ranks x 4 decode workers (oversubscribed on a small machine),
under an open-file limit of 1,024 (soft and hard: nothing to raise it to).

    python benchmarks/imagenet_scale.py --out /tmp/imagenet-scale        # ~15 min on 2 cores

Data: written cheaply, but through the product's shard writer and index format. Each shard holds
a few real tiny JPEGs (20 px); the index then holds ImageNet's count of entries, each shard's
entries pointing at its own members in turn, so that every read is a real pread of a real shard,
checked against its CRC-32 and decoded; only the images' bytes repeat.

Measured:
1. start-up to the first step (the first step's log line after the launch), for a fresh run
   and for a resume at sample 640,000 of the epoch;
2. per decode worker, sampled every second from /proc: descriptors in all, shard files open,
   resident memory (RSS) and private dirty memory (its own: not the page cache's file pages); the shard files a worker opened in
   the epoch are the most it held at once (the limit keeps 896 open: none is closed here);
3. opens an epoch: measured (the sum over workers), beside the computed figure for the order
   (datasets.shard_blocked_order) and for the design before it (every worker every shard), here
   and at 256 ranks x 15 workers;
4. the index's memory in a worker, side by side: pickled to it as a loaded copy (before commit
   4a20dce) against mapped (now);
5. the epoch ends with exact validation: every one of the 50,000 validation samples once.

Run 1 trains to sample 640,000 (--steps) and stops, writing its checkpoint; run 2 resumes there,
ends the epoch and validates. A scale rehearsal, not a CI test (docs/data.md has the figures).

    python benchmarks/imagenet_scale.py --epochs 5 --out /tmp/imagenet-epochs

Over several epochs instead (one launch, no resume): every shard file a process opens is counted
exactly, not sampled (a Python audit hook, through sitecustomize, appends each open's time, process
and path to opens.log: the raw record, kept beside the figures), and attributed to the epoch whose
training or validation it falls in (epoch ends as the log says them); per decode worker and epoch,
the shard files it opened and the most it held open at once (descriptors sampled every second).
The figure to watch is the last: it stays near one epoch's working set (idle files close) instead
of growing by one epoch's set at every epoch until the limit.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from hvdtrain.data import datasets, shards  # noqa: E402
from hvdtrain.launch import launch_command, launch_env  # noqa: E402

TRAIN, VAL, CLASSES = 1_281_167, 50_000, 1_000
TRAIN_SHARDS, VAL_SHARDS = 1_100, 43
MEMBERS = 4  # real images per shard
LIMIT = 1_024


# ---------------------------------------------------------------------------------------- the data
def _jpegs(count: int) -> list[bytes]:
    from PIL import Image

    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def write_dataset(out: str, train_samples: int = TRAIN, train_shards: int = TRAIN_SHARDS) -> float:
    """ImageNet's sample counts in ImageNet's shard count, through hvdtrain's writer; seconds."""
    started = time.perf_counter()
    images = _jpegs(16)
    tmp = tempfile.mkdtemp(prefix="scale-src-")
    paths = []
    for k, data in enumerate(images):
        paths.append(os.path.join(tmp, f"{k}.jpg"))
        with open(paths[-1], "wb") as f:
            f.write(data)
    rng = np.random.default_rng(1)
    manifest = {"format": shards.FORMAT, "version": shards.VERSION, "layout": "webdataset: KEY.<ext> + KEY.cls",
                "source": "benchmarks/imagenet_scale.py", "classes": [f"n{c:08d}" for c in range(CLASSES)],
                "splits": {}}
    for split, samples, shard_count in (("train", train_samples, train_shards), ("val", VAL, VAL_SHARDS)):
        writer = shards._ShardWriter(out, split, 1 << 40)  # shards closed by hand: MEMBERS each
        for s in range(shard_count):
            for m in range(MEMBERS):
                k = s * MEMBERS + m
                writer.add(f"{k:08d}", images[k % len(images)], shards.Source(paths[k % len(images)], k % CLASSES))
            writer.close_shard()
        written = writer.finish()
        # ImageNet's count of entries: shard s's entries (in order, as the writer lays them) point
        # at its members in turn.
        small = np.load(os.path.join(out, split, "index.npz"))
        shard = np.repeat(np.arange(shard_count, dtype=np.int32), np.diff(np.linspace(0, samples, shard_count + 1)
                                                                            .astype(np.int64)))
        within = np.arange(samples) - np.searchsorted(shard, shard, side="left")
        member = shard.astype(np.int64) * MEMBERS + within % MEMBERS
        np.savez(os.path.join(out, split, "index.npz.partial.npz"), shard=shard, offset=small["offset"][member],
                 size=small["size"][member], crc32=small["crc32"][member],
                 label=rng.integers(0, CLASSES, samples).astype(np.int64), ext=small["ext"][member],
                 extensions=small["extensions"])
        os.replace(os.path.join(out, split, "index.npz.partial.npz"), os.path.join(out, split, "index.npz"))
        written["samples"] = samples
        manifest["splits"][split] = written
    with open(os.path.join(out, shards.MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
    return time.perf_counter() - started


# ---------------------------------------------------------------------------------------- watching workers
class WorkerWatch(threading.Thread):
    """Every second: each decode worker's descriptors, shard files open, RSS and private dirty memory (the maxima)."""

    def __init__(self, root_pid: int, epoch_ends: list | None = None):
        super().__init__(daemon=True)
        self.root_pid, self.stop, self.workers = root_pid, threading.Event(), {}
        self.epoch_ends = epoch_ends if epoch_ends is not None else []  # grows as the epochs end
        self.per_epoch = {}  # (pid, epoch index) -> the most shard files open at once

    def run(self):
        import psutil

        while not self.stop.wait(1.0):
            try:
                tree = psutil.Process(self.root_pid).children(recursive=True)
            except psutil.Error:
                continue
            for proc in tree:
                try:
                    # DataLoader workers: children of a rank's forkserver (hvdtrain/torch/workers.py)
                    if "forkserver" not in " ".join(proc.parent().cmdline()):
                        continue
                    fds = os.listdir(f"/proc/{proc.pid}/fd")
                    targets = []
                    for fd in fds:
                        try:
                            targets.append(os.readlink(f"/proc/{proc.pid}/fd/{fd}"))
                        except OSError:  # closed meanwhile
                            pass
                    mem = proc.memory_info()
                    private = private_mb(proc.pid)
                except (psutil.Error, OSError):
                    continue
                seen = self.workers.setdefault(proc.pid, {"fds": 0, "shard_files": 0, "rss_mb": 0.0, "private_mb": 0.0})
                seen["fds"] = max(seen["fds"], len(fds))
                for split in ("train", "val"):  # a training loader's workers, or validation's
                    count = sum(f"/{split}/shard-" in t for t in targets)
                    if count:
                        seen["split"] = split
                        seen["shard_files"] = max(seen["shard_files"], count)
                        key = (proc.pid, len(self.epoch_ends))
                        self.per_epoch[key] = max(self.per_epoch.get(key, 0), count)
                seen["rss_mb"] = max(seen["rss_mb"], mem.rss / 2**20)
                seen["private_mb"] = max(seen["private_mb"], private)


# Installed in every Python process of a launch (ranks, forkservers, and so the workers they fork)
# through sitecustomize: each open of a shard file or an index, one line (time, pid, path).
OPENS_HOOK = """import os, sys, time
_log = os.environ.get("IMAGENET_SCALE_OPENS_LOG")
if _log:
    _fd = {}
    def _record(event, args):
        if event == "open" and isinstance(args[0], str) and ("/shard-" in args[0] or args[0].endswith("index.npz")):
            pid = os.getpid()
            if pid not in _fd:  # after a fork: this process's own descriptor (O_APPEND: whole lines)
                _fd.clear()
                _fd[pid] = os.open(_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(_fd[pid], f"{time.time():.4f} {pid} {args[0]}\\n".encode())
    sys.addaudithook(_record)
"""


def train(data: str, ckpt: str, ranks: int, workers: int, batch: int, steps: int | None, log: str,
          epochs: int = 1, opens_log: str | None = None) -> dict:
    """One launch under the open-file limit; its start-up, workers, result and epoch ends (the
    clock when each epoch's line came)."""
    result = os.path.join(os.path.dirname(log), os.path.basename(log) + ".json")
    argv = [sys.executable, "-m", "hvdtrain.torch", "--model", "mnist_cnn", "--dataset", "shards", "--data-dir", data,
            "--image-size", "16", "--batch-size", str(batch), "--num-workers", str(workers), "--threads-per-rank", "1",
            "--epochs", str(epochs), "--checkpoint-dir", ckpt, "--log-interval", "1", "--result-json", result,
            "--watchdog-seconds", "600", *(["--steps", str(steps)] if steps else [])]
    command = ["bash", "-c", f'ulimit -Sn {LIMIT} -Hn {LIMIT} && exec "$@"', "limit",
               *launch_command("mpirun", ranks), *argv]
    path = REPO
    if opens_log:
        hooks = os.path.join(os.path.dirname(opens_log), "hooks")
        os.makedirs(hooks, exist_ok=True)
        with open(os.path.join(hooks, "sitecustomize.py"), "w") as f:
            f.write(OPENS_HOOK)
        path = hooks + os.pathsep + REPO
    env = launch_env(PYTHONUNBUFFERED="1", PYTHONPATH=path, CUDA_VISIBLE_DEVICES="",
                     **({"IMAGENET_SCALE_OPENS_LOG": opens_log} if opens_log else {}))
    started = time.monotonic()
    first_step = None
    epoch_ends = []
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        watch = WorkerWatch(proc.pid, epoch_ends)
        watch.start()
        seen = b""
        while chunk := os.read(proc.stdout.fileno(), 1 << 16):  # the progress bar's updates end in \r
            out.write(chunk)
            seen = seen[-4096:] + chunk
            if first_step is None and re.search(rb"\| 1/\d+ \[", seen):  # the first step's progress bar
                first_step = time.monotonic() - started
            while re.search(rb"hvdtrain\.torch: epoch %d\.00: " % (len(epoch_ends) + 1), seen):
                epoch_ends.append(time.time())  # the epoch's line: its training and validation are over
        proc.wait()
        watch.stop.set()
    if proc.returncode:
        raise SystemExit(f"imagenet_scale: the run exited {proc.returncode}: see {log}")
    with open(result) as f:
        report = json.load(f)
    return {"seconds": time.monotonic() - started, "first_step_s": first_step, "workers": list(watch.workers.values()),
            "result": report, "epoch_ends": epoch_ends,
            "held_per_epoch": [{"pid": pid, "epoch": epoch + 1, "split": watch.workers[pid].get("split"),
                                "shard_files_max": most} for (pid, epoch), most in sorted(watch.per_epoch.items())]}


# ---------------------------------------------------------------------------------------- the index in a worker
def private_mb(pid: int | str = "self") -> float:
    """A process's private dirty memory: what it alone holds and nothing can reclaim (a copy sent
    to it, its own heap); not the file pages it maps, which the page cache holds once for every
    process of the node, nor the pages a forked worker still shares with its forkserver."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Private_Dirty:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _index_worker(payload, queue):
    index = payload.index if isinstance(payload, shards.ShardReader) else payload
    # A worker reads entries all over the index in an epoch: touch every page.
    total = sum(int(np.asarray(index[k]).view(np.uint8).sum() & 1) for k in ("shard", "offset", "size", "crc32",
                                                                             "label"))
    queue.put((private_mb(), total))


def index_memory(data: str) -> dict:
    """A worker's private dirty memory after using the index: sent to it as a loaded copy (np.load,
    before commit 4a20dce) or mapped (now); and with nothing (the baseline)."""
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    reader = shards.ShardReader(data, "train")
    with np.load(os.path.join(data, "train", "index.npz")) as f:
        loaded = {k: f[k] for k in f.files}
    out = {}
    for name, payload in (("empty", {}), ("loaded copy", loaded), ("mapped", reader)):
        queue = ctx.Queue()
        p = ctx.Process(target=_index_worker if name != "empty" else _index_baseline, args=(payload, queue))
        p.start()
        out[name] = round(queue.get(timeout=300)[0], 1)
        p.join()
    return out


def _index_baseline(payload, queue):
    queue.put((private_mb(), 0))


# ---------------------------------------------------------------------------------------- figures
def opens_per_epoch(sample_shards: np.ndarray, ranks: int, workers: int, batch: int) -> int:
    """Shard opens in an epoch when rank r's batch k is read by worker k mod workers: the distinct
    shards of each worker's batches, summed."""
    total = 0
    for rank in range(ranks):
        order = datasets.shard_blocked_order(sample_shards, 0, 0, rank, ranks)
        usable = len(order) // batch * batch
        by_batch = sample_shards[order[:usable]].reshape(-1, batch)
        for w in range(workers):
            total += len(np.unique(by_batch[w::workers]))
    return total


def over_epochs(args, data: str, ckpt: str) -> dict:
    """One launch over args.epochs epochs; per epoch: shard files opened (exactly: opens.log), by
    the training and validation workers, and per training worker the most it held open at once."""
    opens_log = os.path.join(args.out, "opens.log")
    if os.path.exists(opens_log):
        os.remove(opens_log)
    run = train(data, ckpt, args.ranks, args.workers, args.batch_size, None, os.path.join(args.out, "epochs.log"),
                epochs=args.epochs, opens_log=opens_log)
    ends = run["epoch_ends"]
    with open(os.path.join(args.out, "held_per_epoch.json"), "w") as f:
        json.dump(run["held_per_epoch"], f, indent=0)
    rows = []
    with open(opens_log) as f:
        opens = [line.split(" ", 2) for line in f]
    for e in range(args.epochs):
        start, end = (ends[e - 1] if e else 0.0), (ends[e] if e < len(ends) else float("inf"))
        mine = [(pid, path.strip()) for t, pid, path in opens if start <= float(t) < end]
        train_opens = [p for p in mine if "/train/shard-" in p[1]]
        held = [r["shard_files_max"] for r in run["held_per_epoch"] if r["epoch"] == e + 1 and r["split"] == "train"]
        rows.append({"epoch": e + 1, "train_shard_opens": len(train_opens),
                     "train_processes_opening": len({pid for pid, _ in train_opens}),
                     "val_shard_opens": sum("/val/shard-" in p for _, p in mine),
                     "index_opens": sum(p.endswith("index.npz") for _, p in mine),
                     "held_per_train_worker_max": max(held, default=0),
                     "held_per_train_worker_mean": round(sum(held) / len(held), 1) if held else 0})
        print(f"imagenet_scale: epoch {e + 1}: {json.dumps(rows[-1])}", flush=True)
    return {"seconds": round(run["seconds"], 1), "first_step_s": run["first_step_s"],
            "global_step": run["result"].get("global_step"), "per_epoch": rows,
            "raw": {"opens": opens_log, "held_per_epoch": os.path.join(args.out, "held_per_epoch.json"),
                    "log": os.path.join(args.out, "epochs.log")}}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "hvdtrain-imagenet-scale"))
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=250)
    p.add_argument("--resume-at", type=int, default=640_000, help="the sample the second run resumes at")
    p.add_argument("--train-samples", type=int, default=TRAIN, help="ImageNet's by default (a smaller trial run)")
    p.add_argument("--train-shards", type=int, default=TRAIN_SHARDS)
    p.add_argument("--json", help="also write the figures here")
    p.add_argument("--epochs", type=int, default=1,
                   help="more than 1: one launch over this many epochs, opens counted exactly (no resume run)")
    args = p.parse_args(argv)

    data = os.path.join(args.out, "shards")
    figures = {"ranks": args.ranks, "workers": args.workers, "batch_size": args.batch_size, "open_file_limit": LIMIT}
    if not os.path.exists(os.path.join(data, shards.MANIFEST)):
        os.makedirs(data, exist_ok=True)
        figures["write_s"] = round(write_dataset(data, args.train_samples, args.train_shards), 1)
        print(f"imagenet_scale: wrote {args.train_samples:,} + {VAL:,} samples in {args.train_shards:,} + {VAL_SHARDS} shards "
              f"({figures['write_s']} s)", flush=True)
    index_bytes = os.path.getsize(os.path.join(data, "train", "index.npz"))
    figures["index_mb"] = round(index_bytes / 2**20, 1)
    figures["index_private_mb"] = index_memory(data)
    print(f"imagenet_scale: the index ({figures['index_mb']} MB) in a worker, private dirty MB: {figures['index_private_mb']}",
          flush=True)

    reader = shards.ShardReader(data, "train")
    sample_shards = np.asarray(reader.index["shard"])
    figures["opens_per_epoch_computed"] = {
        "here": opens_per_epoch(sample_shards, args.ranks, args.workers, args.batch_size),
        "here_every_worker_every_shard": args.ranks * args.workers * args.train_shards,
        "256x15": opens_per_epoch(sample_shards, 256, 15, 256),
        "256x15_every_worker_every_shard": 256 * 15 * args.train_shards,
        "rank_start_stats": args.train_shards + VAL_SHARDS}
    print(f"imagenet_scale: opens an epoch (computed): {figures['opens_per_epoch_computed']}", flush=True)

    ckpt = os.path.join(args.out, f"ckpt-{int(time.time())}")
    if args.epochs > 1:
        figures["epochs"] = over_epochs(args, data, ckpt)
        print(json.dumps(figures, indent=1))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(figures, f, indent=1)
        return
    global_batch = args.ranks * args.batch_size
    stop = args.resume_at // global_batch
    runs = {}
    for name, steps in (("to_sample_%d" % (stop * global_batch), stop), ("resumed_to_epoch_end", None)):
        run = train(data, ckpt, args.ranks, args.workers, args.batch_size, steps,
                    os.path.join(args.out, f"{name}.log"))
        workers = run.pop("workers")
        result = run.pop("result")
        run.update(global_step=result.get("global_step"),
                   val_count=(result.get("history") or [{}])[-1].get("val_count"))
        for split in ("train", "val"):
            mine = [w for w in workers if w.get("split") == split]
            run[split + "_workers"] = {
                "seen": len(mine), "fds_max": max((w["fds"] for w in mine), default=0),
                "shard_files_max": max((w["shard_files"] for w in mine), default=0),
                "opens_measured": sum(w["shard_files"] for w in mine),
                "rss_mb_max": round(max((w["rss_mb"] for w in mine), default=0), 1),
                "private_mb_max": round(max((w["private_mb"] for w in mine), default=0), 1)}
        runs[name] = run
        print(f"imagenet_scale: {name}: {json.dumps(run)}", flush=True)
    figures["runs"] = runs
    print(json.dumps(figures, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
