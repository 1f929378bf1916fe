"""The device feeder: the next batches are read, copied to the device and made model inputs while
the current step runs, on a thread of their own.

    for x, y in DeviceFeeder(loader, device, prepare):   # x, y on the device, prepare(x) applied
        ...

Why a thread and not only a side stream (timm's PrefetchLoader): whatever the main thread does
between two steps is in series with the GPU once the step's end waits for the GPU, and with
Horovod it does: `synchronize()` spins until every allreduce has finished on the device, so a
batch prepared after it (a gather, a pinned copy, a collate of the workers' output) leaves the GPU
idle that long. Here those run on the feeder thread, during the step; torch's copies and gathers
release the GIL. On a CUDA device the copy and `prepare` (the uint8 -> float normalisation,
channels-last) run on a side stream, and the main thread's stream waits for them by an event.

What runs on the thread is only what cannot draw random numbers from torch's global generator,
which the main thread seeds at each step for dropout: batches already made by DataLoader workers,
or in-memory batches gathered whole (hvdtrain/torch/loader.py). A loader whose main process calls a
dataset's `__getitem__` (num_workers=0 over a per-sample dataset) is fed on the main thread.

`close()` (or the end of the `for`, or an exception) stops the thread before the loader ends; an
error raised while reading (a bad sample) is raised in the main thread at the batch it concerns.
"""
from __future__ import annotations

import contextlib
import os
import queue
import re
import threading
import traceback

import torch

from hvdtrain.errors import UsageError

_END = object()


_WORKER = re.compile(r"Caught (?P<kind>\w+) in DataLoader worker process (?P<worker>\d+)")
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)')


KILLED = ("killed from outside, most often for memory (the job's memory limit, or the kernel's out-of-memory "
          "killer: dmesg); fewer --num-workers or a smaller --batch-size need less")


def _lost_a_worker(err: BaseException) -> bool:
    """The rank's end of a pipe to a DataLoader worker broke (a reset connection, an end of file)
    inside multiprocessing: the worker on the other side died. torch says so itself when its
    check gets there first; otherwise this is all the rank sees (3 of 7 kills, measured)."""
    if not isinstance(err, (ConnectionError, EOFError)):
        return False
    return any(f"{os.sep}multiprocessing{os.sep}" in frame.filename for frame in traceback.extract_tb(err.__traceback__))


def reading_error(err: BaseException) -> str:
    """One line for an error raised while a batch was read: the exception, the file and line it
    came from, which worker; a worker that died (the kernel's out-of-memory killer) says so,
    whether torch noticed it or the rank's pipe to it broke first."""
    text = str(err).strip()
    if text.startswith("DataLoader worker") and ("exited unexpectedly" in text or "killed by signal" in text):
        return f"reading the data: {text.splitlines()[0]}: {KILLED}"
    if _lost_a_worker(err):
        return (f"reading the data: a DataLoader worker of this rank ended while it was sending a batch (the rank's "
                f"pipe to it: {type(err).__name__}): {KILLED}")
    worker = _WORKER.search(text)
    if worker:  # torch raised the worker's exception again, its traceback in the message
        lines = [line for line in text.splitlines() if line.strip()]
        frames = list(_FRAME.finditer(text))
        where = f" ({frames[-1]['file']}, line {frames[-1]['line']}, in {frames[-1]['function']})" if frames else ""
        return f"reading the data, in DataLoader worker {worker['worker']}: {lines[-1].strip()}{where}"
    frames = traceback.extract_tb(err.__traceback__)
    where = f" ({frames[-1].filename}, line {frames[-1].lineno}, in {frames[-1].name})" if frames else ""
    return f"reading the data: {type(err).__name__}: {(text or '?').splitlines()[0]}{where}"


class DeviceFeeder:
    def __init__(self, loader, device: torch.device, prepare=None, depth: int = 2, threaded: bool = True,
                 dataset=None):
        self.loader, self.device, self.prepare, self.depth = loader, torch.device(device), prepare, depth
        self.given_dataset = dataset
        self.threaded = threaded
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def __len__(self):
        return len(self.loader)

    @property
    def dataset(self):
        """The dataset the batches come from, as a DataLoader's `.dataset` (course code divides by
        `len(loader.dataset)`): the one given, else the loader's."""
        return self.given_dataset if self.given_dataset is not None else getattr(self.loader, "dataset", None)

    @property
    def batch_size(self):
        return getattr(self.loader, "batch_size", None)

    def _fed(self, batch):
        """(x, y, event): copied to the device and made model inputs; on CUDA on the side stream,
        the event after it."""
        with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
            x, y = batch[0], batch[1]
            x = x.to(self.device, non_blocking=True)
            y = y.to(self.device, non_blocking=True) if torch.is_tensor(y) else y
            if self.prepare is not None:
                x = self.prepare(x)
            if self.stream is None:
                return x, y, None
            event = torch.cuda.Event()
            event.record(self.stream)
        return x, y, event

    def _ready(self, item):
        x, y, event = item
        if event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            # Memory allocated on the side stream, used on this one: not reused before this
            # stream is done with it.
            for t in (x, y):
                if torch.is_tensor(t) and t.device.type == "cuda":
                    t.record_stream(current)
        return x, y

    def _made_on_side_stream(self, batches):
        """The loader's batches, each made with the side stream current: a loader that puts its
        batches on the GPU itself (DALI's copy out of its pipeline) queues that work there, where
        the event after the batch covers it, not on the step's stream."""
        if self.stream is None:
            yield from batches
            return
        while True:
            with torch.cuda.stream(self.stream):
                try:
                    batch = next(batches)
                except StopIteration:
                    return
            yield batch

    def __iter__(self):
        """The loader's batches on the device. An error while reading one (a dataset's exception,
        in a worker or here, a worker killed; also raised on this thread by torch's SIGCHLD
        handler while it waits for the next batch) becomes one line naming it and where it was
        raised (a traceback from the worker, then another from the rank, and the job's end left
        to the launcher). hvdtrain's own one-line errors (a damaged sample) pass as they are."""
        try:
            yield from self._batches()
        except UsageError:
            raise
        except Exception as err:  # noqa: BLE001 - any error of the input pipeline, in one line
            raise UsageError(reading_error(err)) from None

    def _batches(self):
        # The loader's iterator is made here, on the caller's thread: making it draws the
        # workers' base seed from torch's global generator, in the same place as without a feeder.
        batches = self._made_on_side_stream(iter(self.loader))
        if not self.threaded:
            for batch in batches:
                yield self._ready(self._fed(batch))
            return
        out: queue.Queue = queue.Queue(self.depth)
        stop = threading.Event()

        def put(item) -> bool:  # False once the caller stopped reading: the thread ends
            while not stop.is_set():
                try:
                    out.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def feed():
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            try:
                for batch in batches:
                    if not put(self._fed(batch)):
                        return
                put(_END)
            except BaseException as err:  # noqa: BLE001 - raised again on the caller's thread
                put(err)

        thread = threading.Thread(target=feed, name="hvdtrain-feeder", daemon=True)
        thread.start()
        try:
            while True:
                item = out.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield self._ready(item)
        finally:
            stop.set()
            thread.join()
            del batches  # the loader's workers end here, not at the next collection
