"""The prediction against what was measured: the N-rank runs on this node (`--measure`) or a
scaling study's jobs on the cluster (`--check`, hvdtrain.compare's study directory): img/s, the
exchange left after the backward (the trainer's `sync`), and the share of the exchange the
backward hid, which for DDP is its buckets' overlap, measured rather than assumed."""
from __future__ import annotations

import dataclasses
import json
import os

from hvdtrain.errors import UsageError
from hvdtrain.predict import model

# hvdtrain.compare's backend labels the model knows.
STUDY_BACKENDS = {"horovod-torch": "horovod", "ddp": "ddp"}


def hidden_share(exposed_s: float, total_s: float) -> float:
    """The share of an exchange of total_s that the backward hid, exposed_s being left after it."""
    return min(1.0, max(0.0, 1.0 - exposed_s / total_s)) if total_s > 0 else 1.0


def check_rows(work: model.Workload, cluster: model.Cluster, results: list[tuple[str, dict]]) -> list[dict]:
    """Predicted against measured for runs of several ranks (this node's, or a study's on the
    cluster), each (backend, result file): img/s, the exchange left after the backward, and the
    share of the exchange the backward hid."""
    rows = []
    for backend, result in results:
        n = result["world_size"]
        exchange = model.EXCHANGES[backend]
        predicted = model.step(work, n, cluster, exchange)
        alone = model.exposed_exchange_s(work, n, dataclasses.replace(cluster, overlap=False), exchange)
        syncs = [r["phases_ms"].get("sync", 0.0) / 1e3 for r in result["ranks"] if r.get("phases_ms")]
        exposed = sum(syncs) / len(syncs) if syncs else 0.0
        measured = result["throughput"]["total_images_per_sec"]
        rows.append({"backend": backend, "gpus": n, "predicted_images_per_s": predicted.images_per_s,
                     "measured_images_per_s": measured, "error": predicted.images_per_s / measured - 1,
                     "exchange_alone_ms": 1e3 * alone, "predicted_exposed_ms": 1e3 * predicted.exposed_s,
                     "measured_exposed_ms": 1e3 * exposed,
                     "predicted_hidden": hidden_share(predicted.exposed_s, alone),
                     "measured_hidden": hidden_share(exposed, alone)})
    return rows


def check_table(rows: list[dict], title: str) -> str:
    lines = [title, f"{'backend':8s} {'GPUs':>5s} {'predicted':>10s} {'measured':>10s} {'error':>7s} "
                    f"{'exchange ms':>11s} {'exposed ms: predicted':>21s} {'measured':>8s} {'hidden: predicted':>17s} "
                    f"{'measured':>8s}"]
    for r in rows:
        lines.append(f"{r['backend']:8s} {r['gpus']:5d} {r['predicted_images_per_s']:10.1f} "
                     f"{r['measured_images_per_s']:10.1f} {100 * r['error']:+6.1f}% {r['exchange_alone_ms']:11.1f} "
                     f"{r['predicted_exposed_ms']:21.1f} {r['measured_exposed_ms']:8.1f} "
                     f"{100 * r['predicted_hidden']:16.0f}% {100 * r['measured_hidden']:7.0f}%")
    return "\n".join(lines)


def study_results(out: str, batch: int) -> list[tuple[str, dict]]:
    """(backend, result) of a scaling study's finished jobs of more than one rank, at `batch`
    samples a rank (the prediction's; a study that scaled the batch is another workload)."""
    path = os.path.join(out, "study.json")
    try:
        with open(path) as f:
            jobs = json.load(f)["jobs"]
    except (OSError, ValueError, KeyError) as err:
        raise UsageError(f"--check {out}: not a scaling study's directory ({type(err).__name__}: {err})") from None
    results = []
    for job in jobs:
        backend = STUDY_BACKENDS.get(job.get("backend"))
        if backend is None or job.get("np", 1) < 2 or not os.path.exists(job.get("result_json", "")):
            continue
        with open(job["result_json"]) as f:
            result = json.load(f)
        cfg = result.get("config", {})
        if cfg.get("per_rank_batch_size", batch) * cfg.get("batches_per_allreduce", 1) != batch:
            raise UsageError(f"--check {out}: job {job['tag']} trained {cfg.get('per_rank_batch_size')} samples a rank, "
                             f"the prediction's run {batch}: compare runs of one batch a rank")
        if result.get("throughput"):
            results.append((backend, result))
    if not results:
        raise UsageError(f"--check {out}: no finished Horovod (torch) or DDP job of 2 or more ranks in the study")
    return results
