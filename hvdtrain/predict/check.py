"""The prediction against what was measured: the N-rank runs on this node (`--measure`) or a
scaling study's jobs on the cluster (`--check`, hvdtrain.compare's study directory): img/s, the
exchange left after the backward (the trainer's `sync`), and the share of the model's exchange
the backward hid: for DDP, its buckets' overlap as the runs showed it."""
from __future__ import annotations

import dataclasses
import json
import os
import statistics

from hvdtrain.errors import UsageError
from hvdtrain.predict import model

# hvdtrain.compare's backend labels the model knows.
STUDY_BACKENDS = {"horovod-torch": "horovod", "ddp": "ddp"}


def hidden_share(exposed_s: float | None, total_s: float) -> float | None:
    """The share of an exchange of total_s that the backward hid, exposed_s being left after it."""
    if exposed_s is None:
        return None
    return min(1.0, max(0.0, 1.0 - exposed_s / total_s)) if total_s > 0 else 1.0


def _compute_s(result: dict) -> float | None:
    """The forward and backward of a run's slowest rank (its own work, which the model takes as
    one GPU's whatever the ranks)."""
    computes = [r["phases_ms"].get("compute", 0.0) / 1e3 for r in result["ranks"] if r.get("phases_ms")]
    return max(computes) if computes else None


def _exposed_s(result: dict) -> float | None:
    """The exchange a run left after the backward: the slowest rank's `sync` (the least of the
    ranks': the others' also holds their wait for it); None for a run without step phases."""
    syncs = [r["phases_ms"].get("sync", 0.0) / 1e3 for r in result["ranks"] if r.get("phases_ms")]
    return min(syncs) if syncs else None


def check_rows(work: model.Workload, cluster: model.Cluster, results: list[tuple[str, dict]],
               exchanges: dict[str, model.Exchange] | None = None) -> list[dict]:
    """Predicted against measured for runs of several ranks (this node's, or a study's on the
    cluster), each (backend, result file), repeats as their median: img/s, the exchange left
    after the backward, and against the model's exchange alone the share the backward hid. The
    ranks per node are the runs' own (their hosts), and so are Horovod's settings unless given
    (a study's jobs each record theirs)."""
    groups: dict[tuple, list[dict]] = {}
    for backend, result in results:
        groups.setdefault((backend, result["world_size"]), []).append(result)
    rows = []
    for (backend, n), runs in groups.items():
        nodes = len({r.get("host") for r in runs[0]["ranks"]}) or 1
        shaped = dataclasses.replace(cluster, gpus_per_node=-(-n // nodes))
        try:
            exchange = (exchanges or model.exchanges_in((runs[0].get("environment") or {}).get("env") or {}))[backend]
        except ValueError as err:
            raise UsageError(f"a {backend} run of {n} ranks: {err}") from None
        predicted = model.step(work, n, shaped, exchange)
        alone = model.exposed_exchange_s(work, n, dataclasses.replace(shaped, overlap=False), exchange)
        exposed = [e for e in map(_exposed_s, runs) if e is not None]
        exposed_s = statistics.median(exposed) if exposed else None
        computes = [c for c in map(_compute_s, runs) if c is not None]
        measured = statistics.median(r["throughput"]["total_images_per_sec"] for r in runs)
        rows.append({"backend": backend, "gpus": n, "nodes": nodes, "runs": len(runs),
                     "predicted_images_per_s": predicted.images_per_s, "measured_images_per_s": measured,
                     "error": predicted.images_per_s / measured - 1, "exchange_alone_ms": 1e3 * alone,
                     "predicted_compute_ms": 1e3 * work.compute_s,
                     "measured_compute_ms": 1e3 * statistics.median(computes) if computes else None,
                     "predicted_exposed_ms": 1e3 * predicted.exposed_s,
                     "measured_exposed_ms": None if exposed_s is None else 1e3 * exposed_s,
                     "predicted_hidden": hidden_share(predicted.exposed_s, alone),
                     "measured_hidden": hidden_share(exposed_s, alone)})
    return rows


def check_table(rows: list[dict], title: str) -> str:
    def fmt(value, spec):
        return "n/a" if value is None else format(value, spec)

    lines = [title, f"{'backend':8s} {'GPUs':>5s} {'nodes':>5s} {'img/s: predicted':>16s} {'measured':>8s} "
                    f"{'error':>7s} {'compute ms: one rank':>20s} {'these':>6s} {'model exchange ms':>17s} "
                    f"{'exposed ms: predicted':>21s} {'measured':>8s} {'hidden: predicted':>17s} {'measured':>8s}"]
    for r in rows:
        lines.append(f"{r['backend']:8s} {r['gpus']:5d} {r['nodes']:5d} {r['predicted_images_per_s']:16.1f} "
                     f"{r['measured_images_per_s']:8.1f} {100 * r['error']:+6.1f}% {r['predicted_compute_ms']:20.1f} "
                     f"{fmt(r['measured_compute_ms'], '6.1f')} {r['exchange_alone_ms']:17.1f} "
                     f"{r['predicted_exposed_ms']:21.1f} {fmt(r['measured_exposed_ms'], '8.1f')} "
                     f"{100 * r['predicted_hidden']:16.0f}% "
                     f"{fmt(None if r['measured_hidden'] is None else 100 * r['measured_hidden'], '7.0f')}%")
    lines.append("(compute: forward and backward, the slowest rank's in these runs, one GPU's in the model; exposed: "
                 "what the exchange left after the backward, the slowest rank's sync; hidden: the share of the model's "
                 "exchange alone the backward hid)")
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
        samples = cfg.get("per_rank_batch_size", batch) * cfg.get("batches_per_allreduce", 1)
        if samples != batch:
            raise UsageError(f"--check {out}: job {job['tag']} trained {samples} samples a rank a step, the "
                             f"prediction's run {batch}: compare runs of one batch a rank")
        if result.get("throughput"):
            results.append((backend, result))
    return results
