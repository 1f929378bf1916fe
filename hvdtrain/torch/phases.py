"""The step's phases timed on a CUDA GPU (hvdtrain/phases.py has what they mean).

Host clocks cannot time GPU work: kernels are queued and the host runs ahead. Each mark records a
CUDA event on the current stream instead, and the events are read only when the meter asks for the
figures (at the end of an epoch, where the trainer synchronises anyway): no added synchronisation.
"""
from __future__ import annotations

import torch

from hvdtrain.phases import PhaseClock


class CudaPhaseClock(PhaseClock):
    def __init__(self, device: torch.device):
        super().__init__()
        self.device = device
        self.pending: list[tuple[str, torch.cuda.Event]] = []

    def _event(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def start(self) -> None:
        self.running = self.enabled
        self.pending = [("start", self._event())]

    def mark(self, phase: str) -> None:
        if self.running:
            self.pending.append((phase, self._event()))

    def resolve(self) -> None:
        if len(self.pending) < 2:
            return
        self.pending[-1][1].synchronize()
        for (_, before), (phase, after) in zip(self.pending, self.pending[1:]):
            self.seconds[phase] += before.elapsed_time(after) / 1000.0
        self.pending = self.pending[-1:]  # the next mark measures from the last one
