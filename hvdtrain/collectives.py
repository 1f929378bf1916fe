"""What every backend (Horovod-torch, DDP, Horovod-TF, MultiWorkerMirroredStrategy) offers the
shared trainer code, with one signature each. Called on every rank, in the same order: the
`name` says what a collective is for (Horovod matches eager collectives across ranks by name).
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Collectives(Protocol):
    name: str           # the backend's name, as --backend spells it
    rank: int
    world_size: int
    local_rank: int

    def allreduce_sum(self, values: np.ndarray, name: str) -> np.ndarray:
        """The element-wise sum over ranks of a float64 vector, as float64."""

    def broadcast_object(self, obj: Any, name: str) -> Any:
        """Rank 0's `obj` on every rank."""

    def allgather_object(self, obj: Any, name: str) -> list:
        """Every rank's `obj`, in rank order."""

    def barrier(self) -> None:
        """Returns once every rank has called it."""

    def describe(self) -> dict:
        """What the result file records of this backend."""

    def shutdown(self) -> None:
        """Ends the backend (called once, after the result file)."""
