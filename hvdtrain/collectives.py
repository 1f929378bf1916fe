"""What every backend (Horovod-torch, DDP, Horovod-TF, MultiWorkerMirroredStrategy) offers the
shared trainer code, with one signature each. Called on every rank, in the same order: the
`name` says what a collective is for (Horovod matches eager collectives across ranks by name).

Each framework declares what else its trainer calls in an interface that extends this one
(hvdtrain/torch/backend.py, hvdtrain/tf/backend.py); a backend subclasses its framework's
interface, so a method it lacks fails when it is built, not mid-run. Stand-ins (the meter's
tests) satisfy this protocol structurally, without subclassing it.
"""
from __future__ import annotations

import abc
from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Collectives(Protocol):
    name: str           # the backend's name, as --backend spells it
    rank: int
    world_size: int
    local_rank: int

    @abc.abstractmethod
    def allreduce_sum(self, values: np.ndarray, name: str) -> np.ndarray:
        """The element-wise sum over ranks of a float64 vector, as float64."""

    @abc.abstractmethod
    def broadcast_object(self, obj: Any, name: str) -> Any:
        """Rank 0's `obj` on every rank."""

    @abc.abstractmethod
    def allgather_object(self, obj: Any, name: str) -> list:
        """Every rank's `obj`, in rank order."""

    @abc.abstractmethod
    def barrier(self) -> None:
        """Returns once every rank has called it."""

    @abc.abstractmethod
    def describe(self) -> dict:
        """What the result file records of this backend."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Ends the backend (called once, after the result file)."""
