"""The doctor's health check: a short compute kernel (and, on GPUs, a host-to-GPU copy) timed on every
rank, and the ranks more than --slow-fraction below the median named with their host."""
from __future__ import annotations

import math
import statistics
import time


# ------------------------------------------------------------------------- per-rank health check
# The kernel is sized to be timed well (milliseconds per repetition) yet cheap: 2 x 512^3 =
# 0.27 GFLOP takes ~3 ms on one core of a current x86 server (~100 GFLOP/s) and still only 0.27 s at
# 1 GFLOP/s, where the warm-up and MIN_REPS make ~1.1 s: well under 2 s per rank on any CPU.
# 2 x 4096^3 = 137 GFLOP keeps a GPU busy for milliseconds, long past its launch latency.
CPU_MATMUL_N = 512
GPU_MATMUL_N = 4096
H2D_BYTES = 64 * 2**20       # pinned host memory to the GPU: what a data loader's batches cross
MIN_REPS, MAX_REPS, REPS_BUDGET_S = 3, 15, 0.5
HEALTH_ROUNDS = 3            # measured again, on every rank, while some rank looks slow (see _measure_health)


def median_seconds(once, sync=lambda: None) -> tuple[float, int]:
    """(median seconds of `once()` followed by `sync()`, repetitions timed). One untimed run first
    (allocations, BLAS/cuBLAS set-up); then MIN_REPS to MAX_REPS runs, fewer once REPS_BUDGET_S is
    spent. The median, not the mean: one repetition preempted by a daemon must not make a rank slow."""
    once()
    sync()
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < MAX_REPS and (len(times) < MIN_REPS or time.perf_counter() - started < REPS_BUDGET_S):
        t0 = time.perf_counter()
        once()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), len(times)


def matmul_gflops(n: int, seconds: float) -> float:
    """GFLOP/s of one n x n by n x n product (2 n^3 floating-point operations)."""
    return 2 * n**3 / seconds / 1e9 if seconds > 0 else 0.0


def torch_health(torch, device, threads: int, slowdown: int = 1) -> dict:
    """This rank's compute figure (and, on a GPU, its host-to-GPU copy bandwidth) with torch, on
    `device` (on a CPU with this rank's compute threads, as training would use them)."""
    on_gpu = device.type == "cuda"
    n = GPU_MATMUL_N if on_gpu else CPU_MATMUL_N
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    threads_before = torch.get_num_threads()
    if not on_gpu:
        torch.set_num_threads(threads)
    try:
        a, b = torch.rand(n, n, device=device), torch.rand(n, n, device=device)
        c = torch.empty(n, n, device=device)

        def product():
            for _ in range(slowdown):
                torch.mm(a, b, out=c)

        seconds, reps = median_seconds(product, sync)
    finally:
        torch.set_num_threads(threads_before)
    where = f"GPU {device.index} ({torch.cuda.get_device_name(device)})" if on_gpu else f"CPU, {threads} thread(s)"
    figures = {"kernel": f"torch matmul {n}x{n} float32 on {where}, median of {reps}",
               "gflops": matmul_gflops(n, seconds), "h2d_gbps": None, "slowdown": slowdown}
    if on_gpu:
        host = torch.empty(H2D_BYTES // 4, dtype=torch.float32, pin_memory=True)
        dev = torch.empty(H2D_BYTES // 4, dtype=torch.float32, device=device)
        copy_seconds, _ = median_seconds(lambda: dev.copy_(host, non_blocking=True), sync)
        figures["h2d_gbps"] = H2D_BYTES / copy_seconds / 1e9 if copy_seconds > 0 else 0.0
    return figures


def numpy_health(slowdown: int = 1) -> dict:
    """This rank's compute figure with numpy on its CPU (TensorFlow's checks, which never import
    torch). numpy's BLAS picks its own thread count, which the doctor cannot set once it is loaded."""
    import numpy as np

    n = CPU_MATMUL_N
    rng = np.random.default_rng(0)
    a, b = rng.random((n, n), dtype=np.float32), rng.random((n, n), dtype=np.float32)
    c = np.empty((n, n), dtype=np.float32)

    def product():
        for _ in range(slowdown):
            np.matmul(a, b, out=c)

    seconds, reps = median_seconds(product)
    return {"kernel": f"numpy matmul {n}x{n} float32 on CPU (numpy's BLAS threads), median of {reps}",
            "gflops": matmul_gflops(n, seconds), "h2d_gbps": None, "slowdown": slowdown}


def tf_gpu_health(tf, gpu: int, slowdown: int = 1) -> dict:
    """This rank's compute figure with TensorFlow on its GPU (TF's checks with GPUs)."""
    n = GPU_MATMUL_N
    with tf.device(f"/GPU:{gpu}"):
        a, b = tf.random.uniform((n, n)), tf.random.uniform((n, n))

    def product():
        with tf.device(f"/GPU:{gpu}"):
            for _ in range(slowdown):
                c = tf.linalg.matmul(a, b)
        c[0, 0].numpy()  # eager GPU ops run asynchronously: reading one value waits for them

    seconds, reps = median_seconds(product)
    return {"kernel": f"tf matmul {n}x{n} float32 on GPU {gpu} (TF32 where TensorFlow uses it), median of {reps}",
            "gflops": matmul_gflops(n, seconds), "h2d_gbps": None, "slowdown": slowdown}


def _fmt_rate(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 1 else f"{value:.3f}"


# The figures the health check compares across ranks: key in a rank's figures, name, unit.
HEALTH_FIGURES = (("gflops", "compute", "GFLOP/s"), ("h2d_gbps", "host-to-GPU copy", "GB/s"))


def rank_spread(figures: list[tuple[int, str, float]], what: str, unit: str,
                slow_fraction: float) -> tuple[list[str], str | None]:
    """(problems, summary) for one figure measured on every rank, as (rank, host, value): a problem
    for each rank more than `slow_fraction` below the median of all the ranks, naming its rank and
    host, or whose figure is not positive (its kernel did not really run); the summary line says
    that the ranks are even (min/median/max) when no rank is a problem, None otherwise."""
    if not figures:
        return [], None
    median = statistics.median(value for _, _, value in figures)
    problems = []
    for rank, host, value in sorted(figures):
        if median > 0 and value < (1 - slow_fraction) * median:
            problems.append(f"rank {rank} (host {host}): {what} {_fmt_rate(value)} {unit}, "
                            f"{(1 - value / median) * 100:.0f} % below the median of the ranks "
                            f"({_fmt_rate(median)} {unit}): a synchronous job runs at the speed of its slowest rank")
        elif not (value > 0) or math.isinf(value):
            problems.append(f"rank {rank} (host {host}): {what} measured {value} {unit}: "
                            "the check did not run properly")
    if problems:
        return problems, None
    values = [value for _, _, value in figures]
    if len(values) == 1:
        return [], f"{what}: {_fmt_rate(values[0])} {unit} on the only rank (nothing to compare it with)"
    return [], (f"{what}: the {len(values)} ranks are even (none more than {slow_fraction * 100:.0f} % below the "
                f"median): min {_fmt_rate(min(values))}, median {_fmt_rate(median)}, "
                f"max {_fmt_rate(max(values))} {unit}")


def best_figures(best: dict | None, figures: dict) -> dict:
    """A rank's figures over its rounds: the highest of each (the least disturbed round)."""
    if best is None:
        return dict(figures)
    merged = dict(best)
    for key, _, _ in HEALTH_FIGURES:
        values = [v for v in (best.get(key), figures.get(key)) if v is not None]
        merged[key] = max(values) if values else None
    if best.get(HEALTH_FIGURES[0][0]) is None:   # a round that failed before: this one says what ran
        merged["kernel"] = figures["kernel"]
    return merged


def health_findings(reports: list[dict], slow_fraction: float) -> tuple[list[str], list[str]]:
    """(summary lines, problems) of the health check over all the ranks' reports."""
    summaries, problems = [], []
    for key, what, unit in HEALTH_FIGURES:
        figures = [(r["rank"], r["host"], r["health"][key]) for r in reports
                   if r["health"].get(key) is not None]
        found, summary = rank_spread(figures, what, unit, slow_fraction)
        problems += found
        summaries += [summary] if summary else []
    return summaries, problems
