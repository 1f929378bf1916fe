"""The report of a comparison or a scaling study (hvdtrain.compare): from the trainers' own
result files to a summary per backend and size, the parity checks, compare.md and compare.png.

Every figure comes from a result file (`record_from_result`), so a report can be written again
from the files alone: the local comparison writes it as its runs end, a Slurm study when its jobs
are collected (hvdtrain/compare/study.py).
"""
from __future__ import annotations

import statistics

from hvdtrain import backends
from hvdtrain.phases import PHASES, slowest_rank_line

# Pairs that start from the same weights and see the same batches: their losses must agree.
PARITY_PAIRS = tuple((b.parity_with, b.label) for b in backends.BACKENDS if b.parity_with)


def median_phases(breakdowns: list[dict]) -> dict | None:
    """Phase by phase, the median of several breakdowns (ranks of a run, or runs of a size)."""
    return {phase: statistics.median(b[phase] for b in breakdowns) for phase in PHASES} if breakdowns else None


def record_from_result(result: dict, path: str) -> dict:
    """What a report takes from one trainer's result file (written by rank 0 at the run's end)."""
    tp = result.get("throughput") or {}
    final = result.get("final") or {}
    ranks = result["ranks"]
    timed = [r for r in ranks if r.get("phases_ms")]
    last = (result.get("history") or [{}])[-1]
    return {"total_images_per_sec": tp.get("total_images_per_sec"), "unit": tp.get("unit", "img"),
            "per_rank_images_per_sec": tp.get("per_rank_images_per_sec"),
            "val_acc": final.get("val_acc"), "val_count": final.get("val_count"),
            "loss_log": result.get("loss_log"), "param_checksums": [r["param_checksum"] for r in ranks],
            "threads": [r["threads"] for r in ranks], "launcher": result.get("launcher"),
            "hosts": sorted({r["host"] for r in ranks}),
            # The breakdown of the median rank in each phase, and the line naming the slowest rank.
            "phases_ms": median_phases([r["phases_ms"] for r in timed]),
            "slowest_rank": slowest_rank_line(timed) if timed else None,
            # Wall time per epoch, warm-up and validation included (fractional epochs count as such).
            "epoch_seconds": last["elapsed_s"] / last["epoch"] if last.get("elapsed_s") and last.get("epoch") else None,
            "history": [{k: h.get(k) for k in ("epoch", "elapsed_s", "val_acc")} for h in result.get("history") or []],
            "horovod_build_flags": result.get("horovod_build_flags"), "versions": result.get("versions"),
            "crops": result.get("crops"), "result_json": path}


def time_to_accuracy(history: list[dict], target: float) -> float | None:
    """Seconds from the run's start to the end of the first epoch validated at `target` or above."""
    return next((h["elapsed_s"] for h in history
                 if h.get("val_acc") is not None and h["val_acc"] >= target and h.get("elapsed_s") is not None), None)


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(measurements: list[dict], backends: list[str], sizes: list[int], with_accuracy: bool,
              size_key: str = "np", target_accuracy: float | None = None) -> list[dict]:
    """One row per backend and size (`size_key`: "np", ranks, for a comparison; "nodes" for a
    study): medians over repeats, and E(N) against the smallest size this backend has a figure
    for: E = (img/s per rank at N) / (img/s per rank at that size). A size without a successful
    run keeps its row, with the state of its runs (failed, pending, ...)."""
    rows = []
    for backend in backends:
        base = None
        for size in sizes:
            runs = [m for m in measurements if m["backend"] == backend and m[size_key] == size]
            ok = [m for m in runs if "error" not in m and m.get("state", "ok") == "ok"]
            ranks = runs[0]["np"] if runs else (size if size_key == "np" else None)
            rates = [m["total_images_per_sec"] for m in ok if m.get("total_images_per_sec")]
            total = statistics.median(rates) if rates else None
            per_rank = total / ranks if total and ranks else None
            if base is None and per_rank:
                base = per_rank
            # The slowest rank of each run: a rank that lags shows here before it shows in the total.
            slowest = [min(m["per_rank_images_per_sec"]) for m in ok if m.get("per_rank_images_per_sec")]
            # Random labels carry no accuracy: report it for accuracy workloads only.
            accs = [m["val_acc"] for m in ok if m.get("val_acc") is not None] if with_accuracy else []
            phased = [m["phases_ms"] for m in ok if m.get("phases_ms")]
            row = {"backend": backend, size_key: size, "np": ranks, "repeats": len(ok),
                   "state": "ok" if ok else _state_of(runs),
                   "total_images_per_sec": total,
                   "min_total_images_per_sec": min(rates) if rates else None,
                   "max_total_images_per_sec": max(rates) if rates else None,
                   "images_per_sec_per_rank": per_rank,
                   "slowest_rank_images_per_sec": statistics.median(slowest) if slowest else None,
                   "scaling_efficiency": per_rank / base if per_rank and base else None,
                   "val_acc": statistics.median(accs) if accs else None,
                   "epoch_seconds": _median(m.get("epoch_seconds") for m in ok),
                   "phases_ms": median_phases(phased),
                   "slowest_rank": next((m["slowest_rank"] for m in ok if m.get("slowest_rank")), None),
                   "weights_equal_across_ranks": all(len(set(m["param_checksums"])) == 1 for m in ok)}
            if target_accuracy is not None:
                reached = [time_to_accuracy(m.get("history") or [], target_accuracy) for m in ok]
                # A run that never reached the target has no time: the row says so rather than
                # reporting the median of the runs that did.
                row["time_to_accuracy_s"] = _median(reached) if reached and None not in reached else None
            if not ok and runs:
                row["error"] = next((m["error"] for m in runs if m.get("error")), None)
            rows.append(row)
    # Overhead against plain DDP on the same workload and size: the extra time per sample.
    ddp = {r[size_key]: r["total_images_per_sec"] for r in rows if r["backend"] == "ddp"}
    for r in rows:
        r["overhead_vs_ddp"] = (ddp[r[size_key]] / r["total_images_per_sec"] - 1
                                if ddp.get(r[size_key]) and r["total_images_per_sec"] else None)
    return rows


def _state_of(runs: list[dict]) -> str:
    """A row without a successful run: failed if any run failed, else what its runs wait for."""
    states = [m.get("state") or "failed" for m in runs]
    if not states:
        return "not run"
    return "failed" if "failed" in states else states[0]


# Overheads against plain DDP that the IDRIS/JSC course material states, shown beside the measured ones.
STATED_OVERHEADS = {
    "lightning": (0.05, "the Jean Zay page (IDRIS): Lightning over DDP costs \"of the order of 5 %\" of time in the "
                        "best case (their GPU runs)"),
}


def stated_overhead_lines(report: dict) -> list[str]:
    """For each backend with a stated overhead: the statement, the measured figures, and whether
    the statement held here (measured overhead at every N no more than the stated one)."""
    lines = []
    for backend, (stated, source) in STATED_OVERHEADS.items():
        rows = [r for r in report["summary"] if r["backend"] == backend and r.get("overhead_vs_ddp") is not None]
        if not rows:
            continue
        measured = ", ".join(f"{r['overhead_vs_ddp']:+.1%} at np {r['np']}" for r in rows)
        held = all(r["overhead_vs_ddp"] <= stated for r in rows)
        lines.append(f"{backend}: measured overhead vs ddp {measured}; {source}: "
                     f"{'held here' if held else 'not held here (more overhead than stated)'}.")
    return lines


def rate_unit(measurements: list[dict]) -> str:
    """What the report's rates count: 'samples/s' when a run's samples were not images (a user's
    own vectors: the result file's throughput.unit), else 'img/s'."""
    return "samples/s" if any(m.get("unit") == "samples" for m in measurements) else "img/s"


def reading(report: dict) -> list[str]:
    """A few generated sentences for the top of compare.md: the fastest backend at each rank
    count and by how much, the scaling, and whether parity held."""
    lines, unit = [], report.get("unit", "img/s")
    for np in report["nps"]:
        rows = sorted((r for r in report["summary"] if r["np"] == np and r["total_images_per_sec"]),
                      key=lambda r: -r["total_images_per_sec"])
        if not rows:
            continue
        best = rows[0]
        text = f"At {np} rank(s) {best['backend']} is fastest ({best['total_images_per_sec']:.1f} {unit}"
        if len(rows) > 1:
            text += f", {best['total_images_per_sec'] / rows[1]['total_images_per_sec'] - 1:.1%} ahead of {rows[1]['backend']}"
        text += ")"
        eff = [r for r in rows if r["scaling_efficiency"] is not None and np > 1]
        if eff:
            top = max(eff, key=lambda r: r["scaling_efficiency"])
            text += f"; the best scaling is {top['backend']}'s, E({np}) = {top['scaling_efficiency']:.2f}"
        lines.append(text + ".")
    checks = report["parity"]["checks"]
    if checks:
        failed = [c for c in checks if not c["ok"]]
        crops = " and every backend took the same crops of the image files" if any("crops" in c for c in checks) else ""
        lines.append(f"Parity held: each pair's losses agree{crops}, and the accuracies lie within the tolerance."
                     if not failed else f"Parity FAILED in {len(failed)} of {len(checks)} check(s): see below.")
    return lines + stated_overhead_lines(report)


def parity(measurements: list[dict], nps: list[int], steps: int, loss_tol: float, acc_tol: float,
           check_accuracy: bool) -> dict:
    def first(backend, np):  # a finished run's (a study's job still queued or running has no losses yet)
        return next((m for m in measurements if m["backend"] == backend and m["np"] == np and "error" not in m
                     and m.get("loss_log") is not None), None)

    checks = []
    for a, b in PARITY_PAIRS:
        for np in nps:
            ma, mb = first(a, np), first(b, np)
            if not ma or not mb:
                continue
            la, lb = [x[1] for x in ma["loss_log"][:steps]], [x[1] for x in mb["loss_log"][:steps]]
            n = min(len(la), len(lb))
            diff = max(abs(x - y) for x, y in zip(la[:n], lb[:n])) if n else None
            checks.append({"pair": [a, b], "np": np, "steps_compared": n, "max_abs_loss_diff": diff,
                           "tolerance": loss_tol, "ok": diff is not None and n == min(steps, len(la), len(lb))
                           and diff <= loss_tol})
    if check_accuracy:
        for np in nps:
            accs = {m["backend"]: m["val_acc"] for m in measurements
                    if m["np"] == np and "error" not in m and m.get("val_acc") is not None}
            if len(accs) > 1:
                spread = max(accs.values()) - min(accs.values())
                checks.append({"accuracy": accs, "np": np, "spread": spread, "tolerance": acc_tol,
                               "ok": spread <= acc_tol})
    crops = {f"{m['backend']} np {m['np']}": m["crops"]["digest"] for m in measurements
             if "error" not in m and m.get("crops")}
    if crops:  # image files: every backend's pipeline took the windows of hvdtrain's one rule
        samples = next(m["crops"]["samples"] for m in measurements if "error" not in m and m.get("crops"))
        checks.append({"crops": crops, "samples": samples, "ok": len(set(crops.values())) == 1})
    return {"checks": checks, "ok": all(c["ok"] for c in checks)}


def fmt(value, spec):
    return "n/a" if value is None else format(value, spec)


def write_markdown(path: str, report: dict) -> None:
    study, unit = report.get("size_key") == "nodes", report.get("unit", "img/s")
    if study:
        lines = study_header(report)
        lines += [f"| backend | nodes | ranks | state | total {unit} | min-max over repeats | {unit} per rank | "
                  "E(N) | s/epoch | " + (f"time to val acc {report['target_accuracy']:g} | "
                                         if report.get("target_accuracy") is not None else "")
                  + "ms/step: data + compute + sync + optimizer + other | slowest rank |",
                  "|---|---|---|---|---|---|---|---|---|" + ("---|" if report.get("target_accuracy") is not None
                                                             else "") + "---|---|"]
    else:
        lines = [f"# Comparison: workload `{report['workload']['name']}`", "", *reading(report), "",
                 *report.get("scaling_rule", []), "",
                 f"{report['launcher']} launcher, {report['threads_per_rank']} thread(s) per rank, "
                 f"median of {report['repeats']} repeat(s); host {report['environment']['host']} "
                 f"({report['environment']['cpu_count']} CPUs).", "",
                 f"| backend | np | total {unit} | min-max over repeats | {unit} per rank | slowest rank {unit} | "
                 "scaling efficiency E(N) | overhead vs ddp | final val acc |",
                 "|---|---|---|---|---|---|---|---|---|"]
    for r in report["summary"]:
        spread = (f"{r['min_total_images_per_sec']:.2f}-{r['max_total_images_per_sec']:.2f}"
                  if r.get("min_total_images_per_sec") is not None else "n/a")
        if study:
            phases = (" + ".join(f"{r['phases_ms'][p]:.1f}" for p in PHASES) if r.get("phases_ms") else "n/a")
            reach = ""
            if report.get("target_accuracy") is not None:
                seconds = r.get("time_to_accuracy_s")
                reach = ("n/a | " if r["state"] != "ok" else "not reached | " if seconds is None
                         else f"{seconds:.1f} s | ")
            lines.append(f"| {r['backend']} | {r['nodes']} | {fmt(r['np'], 'd')} | {r['state']} | "
                         f"{fmt(r['total_images_per_sec'], '.2f')} | {spread} | "
                         f"{fmt(r['images_per_sec_per_rank'], '.2f')} | {fmt(r['scaling_efficiency'], '.3f')} | "
                         f"{fmt(r.get('epoch_seconds'), '.1f')} | {reach}{phases} | {r.get('slowest_rank') or 'n/a'} |")
        else:
            lines.append(f"| {r['backend']} | {r['np']} | {fmt(r['total_images_per_sec'], '.2f')} | {spread} | "
                         f"{fmt(r['images_per_sec_per_rank'], '.2f')} | "
                         f"{fmt(r.get('slowest_rank_images_per_sec'), '.2f')} | "
                         f"{fmt(r['scaling_efficiency'], '.3f')} | {fmt(r.get('overhead_vs_ddp'), '+.1%')} | "
                         f"{fmt(r['val_acc'], '.4f')} |")
    size = "node count" if study else "N"
    lines += ["", f"E(N) = ({unit} per rank at N) / ({unit} per rank at the smallest {size} measured), per backend."
              + ("" if study else f" Overhead vs ddp = {unit} of ddp / {unit} of the backend - 1 at the same N: the "
                                  "extra time per sample (negative: faster than ddp)."), "",
              "## Parity", ""]
    for c in report["parity"]["checks"]:
        if "pair" in c:
            lines.append(f"- {c['pair'][0]} vs {c['pair'][1]}, np {c['np']}: max |loss difference| over the first "
                         f"{c['steps_compared']} steps = {fmt(c['max_abs_loss_diff'], '.2e')} "
                         f"(tolerance {c['tolerance']:g}): {'ok' if c['ok'] else 'FAILED'}")
        elif "crops" in c:
            same = len(set(c["crops"].values())) == 1
            lines.append(f"- crops: the windows of the first {c['samples']} training images, as each backend's own "
                         f"pipeline computed them, "
                         + (f"are the same in all {len(c['crops'])} runs (digest {next(iter(c['crops'].values()))}): "
                            "every backend saw the same crops: ok" if same else
                            f"differ: {c['crops']}: FAILED"))
        else:
            lines.append(f"- final accuracy at np {c['np']}: spread {c['spread']:.4f} (tolerance {c['tolerance']:g}) "
                         f"over {c['accuracy']}: {'ok' if c['ok'] else 'FAILED'}")
    if not report["parity"]["checks"]:
        lines.append("- no pair of backends that must agree was measured at the same size")
    failures = [m for m in report["measurements"] if "error" in m or m.get("state", "ok") != "ok"]
    if failures:
        lines += ["", "## Runs without a result", ""] + [
            f"- {m['backend']} {size_key_label(m, study)}: {m.get('state', 'failed')}"
            + (f": {m['error'].splitlines()[0]}" if m.get("error") else "") + f" (log: {m.get('log') or 'none yet'})"
            for m in failures]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def size_key_label(m: dict, study: bool) -> str:
    return f"{m['nodes']} node(s), {m['np']} rank(s)" if study else f"np {m['np']}"


def study_header(report: dict) -> list[str]:
    """The study's title, how the batch and LR were set per size, and the stack each backend ran on."""
    lines = [f"# Scaling study: `{report['workload']['name']}`", "", *report["scaling_rule"], "",
             f"{len(report['measurements'])} job(s); collected {report['collected_at']}.", ""]
    for backend in report["backends"]:
        done = next((m for m in report["measurements"] if m["backend"] == backend and m.get("versions")), None)
        if done:
            versions = ", ".join(f"{k} {v}" for k, v in sorted(done["versions"].items()))
            flags = done.get("horovod_build_flags")
            built = (" Horovod built with: " + ", ".join(k for k, v in sorted(flags.items()) if v) + "."
                     if flags else "")
            lines.append(f"- {backend}: {versions}.{built}")
    return lines + [""]


def write_plot(path: str, report: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = report.get("size_key", "np")
    xlabel = "nodes" if key == "nodes" else "ranks"
    fig, (ax_tp, ax_eff) = plt.subplots(1, 2, figsize=(10, 4))
    for backend in report["backends"]:
        rows = [r for r in report["summary"] if r["backend"] == backend and r["total_images_per_sec"]]
        if not rows:
            continue
        sizes = [r[key] for r in rows]
        totals = [r["total_images_per_sec"] for r in rows]
        spread = [[t - r.get("min_total_images_per_sec", t) for t, r in zip(totals, rows)],
                  [r.get("max_total_images_per_sec", t) - t for t, r in zip(totals, rows)]]
        line = ax_tp.errorbar(sizes, totals, yerr=spread, marker="o", capsize=3, label=backend)[0]
        # Linear scaling from this backend's smallest size: img/s per rank held at every size.
        base = rows[0]
        ax_tp.plot(sizes, [base["images_per_sec_per_rank"] * r["np"] for r in rows], linestyle=":",
                   color=line.get_color(), alpha=0.6)
        eff = [r for r in rows if r["scaling_efficiency"]]
        ax_eff.plot([r[key] for r in eff], [r["scaling_efficiency"] for r in eff], marker="o", label=backend)
    ax_tp.set(xlabel=xlabel, ylabel=f"total {report.get('unit', 'img/s')} (bars: min-max over repeats)",
              title=f"throughput: {report['workload']['name']} (dotted: linear scaling)")
    ax_eff.set(xlabel=xlabel, ylabel="E(N)", title="scaling efficiency", ylim=(0, 1.1))
    ax_eff.axhline(1.0, linestyle=":", color="grey", alpha=0.6)
    for ax in (ax_tp, ax_eff):
        ax.set_xticks(report["sizes"] if key == "nodes" else report["nps"])
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # no line at all when every run failed
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
