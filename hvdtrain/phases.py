"""Where each rank's step time goes: waiting for data, computing, waiting for the other ranks.

Synchronous data parallelism makes every rank as slow as the slowest: the throughput each rank
reports is the same, and a slow rank only shows as the others' time waiting in the gradient
synchronisation. So each rank splits its timed steps into phases, and rank 0 compares the ranks:

    data       waiting for the next batch (the loader, the copy to the device)
    compute    forward and backward, up to the last local gradient
    sync       the gradient synchronisation not hidden behind compute: Horovod's synchronize(),
               the end of DDP's backward, the TF custom loop's allreduce (Horovod's or MWMS's),
               the metrics' reduction, the epoch's closing barrier
    optimizer  the optimizer step and the LR schedule
    other      the trainer's own bookkeeping: metrics, the stop vote, logging

The trainer marks the end of each phase (`clock.mark("compute")`): a phase's time is from the
previous mark to its own, so the phases of a step add up to the step. Host marks use the monotonic
clock; on a GPU the torch trainer records CUDA events instead and reads them at the end of each
epoch (hvdtrain/torch/cuda_phases.py), adding no synchronisation. The TF custom loop runs its step as
three tf.functions (compute, sync, optimizer) with host marks between their calls when asked
(HVDTRAIN_TF_PHASES=1: the split costs small models throughput), on a CPU only:
on a GPU a call returns once its kernels are queued, and TF has no device-side timer the host
could read later without synchronising (as torch's CUDA events), so the TF step is not split
there; nor under Keras fit, which runs the step itself (hvdtrain/tf/loops.py).
"""
from __future__ import annotations

import os
import statistics
import time

PHASES = ("data", "compute", "sync", "optimizer", "other")


def phases_enabled(environ=None) -> bool:
    """HVDTRAIN_PHASES=0 turns the marks off (benchmarks/phases_overhead.py measures their cost)."""
    return (environ if environ is not None else os.environ).get("HVDTRAIN_PHASES", "1") != "0"


def tf_split_requested(environ=None) -> bool:
    """HVDTRAIN_TF_PHASES=1 splits the TF custom loop's step into three functions so that its
    phases can be timed. Asked for, not the default: the split step gives up the allreduce's
    overlap with backward and pays two more function calls, about a quarter of a digits CNN's
    8 ms step (nothing measurable on ResNet-18), which would change the throughput a user measures
    and compares (hvdtrain.compare)."""
    environ = environ if environ is not None else os.environ
    return environ.get("HVDTRAIN_TF_PHASES", "0") == "1" and phases_enabled(environ)


class PhaseClock:
    """Seconds per phase over the timed steps of this rank (host clock)."""

    def __init__(self, enabled: bool | None = None):
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.running = False
        # False: a loop hvdtrain does not drive (Lightning's) is not split.
        self.enabled = phases_enabled() if enabled is None else enabled

    def disable(self) -> None:
        self.enabled = self.running = False

    def start(self) -> None:
        self.running, self.last = self.enabled, time.perf_counter()

    def stop(self) -> None:
        self.resolve()
        self.running = False

    def mark(self, phase: str) -> None:
        if self.running:
            now = time.perf_counter()
            self.seconds[phase] += now - self.last
            self.last = now

    def resolve(self) -> None:
        """Bring pending device timings into self.seconds (nothing to do on the host clock)."""

    def per_step_ms(self, steps: int) -> dict | None:
        self.resolve()
        if not steps or not self.enabled:
            return None
        return {phase: 1000.0 * s / steps for phase, s in self.seconds.items()}


def phases_summary(phases_ms: dict) -> str:
    """`data 1.2 + compute 80.1 + ... = 95.0 ms/step`."""
    parts = " + ".join(f"{phase} {phases_ms[phase]:.1f}" for phase in PHASES)
    return f"{parts} = {sum(phases_ms.values()):.1f} ms/step"


def slowest_rank_line(ranks: list[dict], even_within: float = 0.05) -> str:
    """One line on rank 0 about the ranks' breakdowns ({"rank", "host", "phases_ms"} each): the
    rank whose own work (data + compute + optimizer) per step is furthest above the median of the
    other ranks, in which phase and by how much, and how long the others wait for it; or that the
    ranks are even (no rank more than `even_within` above the others' median)."""
    timed = [r for r in ranks if r.get("phases_ms")]
    if len(timed) < 2:
        return "one rank timed: nothing to compare"

    def own(r):
        p = r["phases_ms"]
        return p["data"] + p["compute"] + p["optimizer"]

    def peers_median(phase_of, slow):
        return statistics.median(phase_of(r) for r in timed if r is not slow)

    slow = max(timed, key=own)
    if own(slow) <= peers_median(own, slow) * (1 + even_within):
        spread = [own(r) for r in timed]
        return (f"ranks even: own work (data + compute + optimizer) {min(spread):.1f}-{max(spread):.1f} "
                f"ms/step, none more than {100 * even_within:.0f} % above the others")
    phase = max(("data", "compute", "optimizer"),
                key=lambda ph: slow["phases_ms"][ph] - peers_median(lambda r: r["phases_ms"][ph], slow))
    mine, theirs = slow["phases_ms"][phase], peers_median(lambda r: r["phases_ms"][phase], slow)
    above = f"{100.0 * (mine / theirs - 1):.0f} % above" if theirs > 0 else "above"
    wait = peers_median(lambda r: r["phases_ms"]["sync"], slow) - slow["phases_ms"]["sync"]
    host = f" ({slow['host']})" if slow.get('host') else ""
    return (f"slowest rank {slow['rank']}{host}: {phase} {mine:.1f} ms/step, {above} the other "
            f"ranks' median ({theirs:.1f}); the other ranks wait {max(0.0, wait):.1f} ms/step for it in sync")
