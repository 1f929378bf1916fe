"""The step's phases timed on a CUDA GPU (hvdtrain/phases.py has what they mean).

Host clocks cannot time GPU work: kernels are queued and the host runs ahead. Each mark records a
CUDA event on the current stream instead, and the events are read without waiting for the GPU:
those it has passed already are added up once more than `max_pending` are held (about ten steps),
so an epoch of any length holds a bounded number; the rest when the meter asks for the figures (at
the end of an epoch, where the trainer synchronises anyway). Only `_event` needs a GPU: the tests
run this clock on the CPU with events of their own.
"""
from __future__ import annotations

import torch

from hvdtrain.phases import PhaseClock


class CudaPhaseClock(PhaseClock):
    def __init__(self, device: torch.device, max_pending: int = 64):
        super().__init__()
        self.device, self.max_pending = device, max_pending
        self.pending: list[tuple[str, object]] = []

    def _event(self):
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def start(self) -> None:
        self.running = self.enabled
        self.pending = [("start", self._event())]

    def mark(self, phase: str) -> None:
        if self.running:
            self.pending.append((phase, self._event()))
            if len(self.pending) > self.max_pending:
                self._add_up(self._passed())

    def _passed(self) -> int:
        """How many of the pending events the GPU has passed (events of one stream complete in
        order); at least one more than the first, waiting for it if need be: the host is then
        max_pending marks ahead of the GPU, and holding more would grow without bound."""
        done = next((i for i in range(len(self.pending) - 1, 0, -1) if self.pending[i][1].query()), 0)
        if done == 0:
            self.pending[1][1].synchronize()
            done = 1
        return done

    def _add_up(self, upto: int) -> None:
        """Add the phases ending at pending events 1..upto; the last of them starts the next."""
        for (_, before), (phase, after) in zip(self.pending[:upto], self.pending[1:upto + 1]):
            self.seconds[phase] += before.elapsed_time(after) / 1000.0
        self.pending = self.pending[upto:]

    def resolve(self) -> None:
        if len(self.pending) < 2:
            return
        self.pending[-1][1].synchronize()
        self._add_up(len(self.pending) - 1)
