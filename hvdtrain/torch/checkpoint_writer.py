"""Rank 0's background checkpoint writes, off the step's path (as torchtitan's and PyTorch's
asynchronous checkpointing stage them):

- the state is staged into host buffers allocated once and reused while its layout stays (one
  flat buffer per dtype, in shared memory: a few file descriptors whatever the model's size; on
  a GPU page-locked as well), not into freshly allocated pageable memory at every checkpoint;
- on a GPU the device-to-host copy is queued on a side stream after the step's event and does
  not block the host; the model's buffers, which the next forward changes (BatchNorm's
  statistics), are snapshotted on the device first, and the optimizer's next step waits for the
  copy (a step pre-hook), nothing else does;
- a long-lived writer process (`python -m hvdtrain.torch.checkpoint_writer`, a fresh interpreter:
  never a re-import of the user's script) serialises, signs and renames the checkpoint into place,
  so no thread holds this process's GIL during the steps. It ignores SIGTERM and SIGUSR1 (Slurm
  signals every process of the job: the write in flight completes, then rank 0 writes its stop
  checkpoint), and ends with its rank (PR_SET_PDEATHSIG) or when its socket closes.

Inline writes (epoch ends, stops) serialise on rank 0's main thread, as before."""
from __future__ import annotations

import ctypes
import math
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import weakref
from multiprocessing.connection import Connection

import torch

import hvdtrain


class TorchState:
    """A checkpoint's state as captured: references to the live tensors (the model's and the
    optimizer's own), which a background write stages before the next step changes them.
    Called, it serialises them now (an inline write)."""

    def __init__(self, state: dict, model=None, optimizer=None):
        self.state, self.model, self.optimizer = state, model, optimizer

    def __call__(self, f) -> None:
        # Device tensors copied to host memory, host ones as they are: serialised now.
        torch.save(_tree_map(lambda t: t.detach().cpu(), self.state), f)


def _tree_map(fn, state, leaf=torch.is_tensor):
    """`state` (dicts, lists and tuples of them) with each leaf replaced by fn(leaf)."""
    if leaf(state):
        return fn(state)
    if isinstance(state, dict):
        return {k: _tree_map(fn, v, leaf) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_tree_map(fn, v, leaf) for v in state)
    return state


class _Slot:
    """Where a tensor was in the state: the index of its view in the staging buffers."""
    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __reduce__(self):
        return _Slot, (self.index,)


def _flatten(state, tensors: list):
    """`state` with each tensor replaced by a _Slot (appended to `tensors`, in order)."""
    def slot(t):
        tensors.append(t.detach())
        return _Slot(len(tensors) - 1)
    return _tree_map(slot, state)


def _fill(skeleton, tensors: list):
    """The state again, each _Slot replaced by its tensor."""
    return _tree_map(lambda s: tensors[s.index], skeleton, leaf=lambda x: isinstance(x, _Slot))


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.split(".")[-1])


def _placements(layout: list):
    """Each tensor's (dtype, shape, first element in its dtype's flat buffer, elements), in the
    state's order: where the rank copies it and where the writer process reads it."""
    offsets: dict[str, int] = {}
    for dtype, shape in layout:
        start, numel = offsets.get(dtype, 0), math.prod(shape)
        offsets[dtype] = start + numel
        yield dtype, shape, start, numel


def _buffer_file(nbytes: int) -> str:
    """A file of nbytes with its space reserved: in shared memory's file system where it has the
    room (tmpfs: never written to a disk), else in the temporary directory. Reserved, not sparse:
    a tmpfs too small for the state (a container's 64 MiB /dev/shm) is found here, not by a
    SIGBUS at the copy."""
    tried = []
    for where in ("/dev/shm", tempfile.gettempdir()):
        if not (os.path.isdir(where) and os.access(where, os.W_OK)):
            continue
        fd, path = tempfile.mkstemp(prefix=f"hvdtrain-checkpoint-{os.getpid()}-", dir=where)
        try:
            os.posix_fallocate(fd, 0, max(nbytes, 1))
            return path
        except OSError as err:
            os.unlink(path)
            tried.append(f"{where}: {err.strerror or err}")
        finally:
            os.close(fd)
    raise OSError(f"no room for {nbytes / 2**20:.0f} MiB of checkpoint staging buffers ({'; '.join(tried)})")


class Staging:
    """The host buffers a background checkpoint is copied into: one flat buffer per dtype in a
    shared-memory file, allocated when the state's layout (dtypes and shapes) first appears or
    changes, reused for every checkpoint after."""

    def __init__(self):
        self.layout: list | None = None
        self.files: list[tuple[str, str, int]] = []  # (path, dtype, numel) of each flat buffer
        self.flat: dict[str, torch.Tensor] = {}
        self.views: list[torch.Tensor] = []
        self.pinned: list[int] = []  # addresses registered with CUDA
        self.side_stream = None
        self.copied = None  # the side stream's event after the copy (a GPU's), until a step waited
        self.awaiting_step = False  # a staged copy the optimizer's next step must wait for
        self.hooked = weakref.WeakKeyDictionary()  # optimizer -> its step pre-hook's handle

    def stage(self, write: TorchState) -> tuple[object, bool]:
        """Copy write's tensors into the buffers (a GPU's: queued on the side stream). Returns the
        state's skeleton (its tensors as slots) and whether the buffers are new."""
        tensors: list[torch.Tensor] = []
        skeleton = _flatten(write.state, tensors)
        layout = [(str(t.dtype), tuple(t.shape)) for t in tensors]
        new = layout != self.layout
        if new:
            self._allocate(layout)
        if write.optimizer is not None and write.optimizer not in self.hooked:
            self.hooked[write.optimizer] = write.optimizer.register_step_pre_hook(self._before_step)
        devices = {t.device for t in tensors if t.is_cuda}
        if devices:
            self._copy_on_side_stream(tensors, write.model, devices.pop())
        else:
            for t, view in zip(tensors, self.views):
                view.copy_(t)
        self.awaiting_step = True
        return skeleton, new

    def _copy_on_side_stream(self, tensors, model, device) -> None:
        compute = torch.cuda.current_stream(device)
        changed_by_forward = {b.data_ptr() for b in model.buffers()} if model is not None else set()
        # What the next forward changes in place is snapshotted on the device first (small).
        tensors = [t.clone() if t.is_cuda and t.data_ptr() in changed_by_forward else t for t in tensors]
        ready = torch.cuda.Event()
        ready.record(compute)
        if self.side_stream is None:
            self.side_stream = torch.cuda.Stream(device)
        with torch.cuda.stream(self.side_stream):
            self.side_stream.wait_event(ready)
            for t, view in zip(tensors, self.views):
                view.copy_(t, non_blocking=True)
                if t.is_cuda:
                    t.record_stream(self.side_stream)  # the allocator keeps it until the copy ran
        self.copied = torch.cuda.Event()
        self.copied.record(self.side_stream)

    def _before_step(self, optimizer, args, kwargs) -> None:
        """The optimizer's step changes the parameters and its state in place: on a GPU its
        kernels wait (on the device, not the host) for a staged copy still running."""
        if self.copied is not None:
            torch.cuda.current_stream().wait_event(self.copied)
            self.copied = None
        self.awaiting_step = False

    def _allocate(self, layout: list) -> None:
        self.release()
        totals = {dtype: start + numel for dtype, _, start, numel in _placements(layout)}  # the last's end
        for dtype, numel in totals.items():
            numel = max(numel, 1)
            path = _buffer_file(numel * _dtype(dtype).itemsize)
            self.flat[dtype] = torch.from_file(path, shared=True, size=numel, dtype=_dtype(dtype))
            self.files.append((path, dtype, numel))
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                self._pin(self.flat[dtype])
        self.layout = layout
        self.views = [self.flat[dtype][start:start + numel].view(shape)
                      for dtype, shape, start, numel in _placements(layout)]

    def _pin(self, buffer: torch.Tensor) -> None:
        """Page-locked, so that the side stream's copy is asynchronous (torch's pin_memory cannot
        pin memory it did not allocate: CUDA's host registration does, as torch's own
        asynchronous checkpointing does for its shared buffers)."""
        address, size = buffer.data_ptr(), buffer.numel() * buffer.element_size()
        if torch.cuda.cudart().cudaHostRegister(address, size, 0) == 0:
            self.pinned.append(address)
        else:  # unpinned, the copy then synchronous: slower, still right
            _clear_cuda_error()

    def release(self) -> None:
        for handle in list(self.hooked.values()):
            handle.remove()
        self.hooked.clear()
        for address in self.pinned:
            torch.cuda.cudart().cudaHostUnregister(address)
        for path, _, _ in self.files:
            try:
                os.unlink(path)
            except FileNotFoundError:  # the writer process unlinks them once it has them mapped
                pass
        self.pinned, self.files, self.flat, self.views, self.layout = [], [], {}, [], None


def _clear_cuda_error() -> None:
    """Reset CUDA's last error (cudaGetLastError) after a call that failed on purpose-tolerant
    grounds: left set, the next kernel launch's check would raise it far from its cause. torch
    binds no cudaGetLastError: it is called in the libcudart this process has loaded."""
    try:
        with open("/proc/self/maps") as maps:
            path = next(line.split()[-1] for line in maps if "libcudart.so" in line)
        ctypes.CDLL(path).cudaGetLastError()
    except (OSError, StopIteration, AttributeError):
        pass


class ProcessWrites:
    """checkpoint.Writer's background for torch: stages the state (Staging), and the writer
    process writes it. Started at the first background write."""

    def __init__(self):
        self.staging = Staging()
        self.process: subprocess.Popen | None = None
        self.conn: Connection | None = None
        self.sender: threading.Thread | None = None
        self.pending = False
        self.failure: BaseException | None = None

    def start(self, path: str, write, signed: bool, keep: int, slow: float) -> None:
        if not isinstance(write, TorchState):
            raise TypeError(f"a background torch checkpoint takes a TorchState, not {type(write).__name__}")
        self.prepare()
        skeleton, new = self.staging.stage(write)
        if new:
            self.conn.send(("buffers", self.staging.files, self.staging.layout))
        # Pickled here: what cannot be (a lambda in a state) fails this save in one line.
        message = pickle.dumps(("write", path, skeleton, signed, keep, slow))
        self.pending, self.failure = True, None
        copied = self.staging.copied  # the next step's pre-hook clears it: kept here
        if copied is None:
            self.conn.send_bytes(message)
            return

        def send_when_copied():  # a GPU's copy: the host waits for it here, not in the step
            try:
                copied.synchronize()
                self.conn.send_bytes(message)
            except BaseException as err:  # noqa: BLE001 - the write's failure, said by wait()
                self.failure = err
        self.sender = threading.Thread(target=send_when_copied, name="hvdtrain-checkpoint-stager", daemon=True)
        self.sender.start()

    def prepare(self) -> None:
        """The writer process running: started now if it is not (its start, an interpreter and
        torch's import, about a second of a core, overlaps whatever the rank does meanwhile)."""
        if self.process is None or self.process.poll() is not None:
            self._start_process()

    def busy(self) -> bool:
        if not self.pending:
            return False
        if self.sender is not None and self.sender.is_alive():
            return True
        return self.failure is None and not self.conn.poll()

    def wait(self) -> BaseException | None:
        """The write ended: its failure, or None."""
        if self.pending:
            if self.sender is not None:
                self.sender.join()
                self.sender = None
            if self.failure is None:  # sent: the process answers
                try:
                    self.failure = self.conn.recv()
                except (EOFError, OSError):
                    code = self.process.wait()
                    how = f"signal {-code}" if code < 0 else f"exit status {code}"
                    self.failure = RuntimeError(f"the checkpoint writer process ended ({how})")
                    self._forget_process()
            self.pending = False
        failure, self.failure = self.failure, None
        return failure

    def close(self) -> None:
        self.wait()
        if self.process is not None:
            try:
                self.conn.send(("exit",))
            except OSError:
                pass
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self._forget_process()
        self.staging.release()

    def __del__(self):  # a run dropped without close(): the process sees its socket close and ends
        if self.conn is not None:
            self.conn.close()

    def _forget_process(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn = self.process = None

    def _start_process(self) -> None:
        if self.process is not None:  # ended: reaped, its socket closed
            self.process.wait()
            self._forget_process()
        mine, theirs = socket.socketpair()
        env = dict(os.environ)
        # The same hvdtrain as this process's, whatever put it on this process's path.
        here = os.path.dirname(os.path.dirname(os.path.abspath(hvdtrain.__file__)))
        env["PYTHONPATH"] = os.pathsep.join([here] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env["OMP_NUM_THREADS"] = "1"
        self.process = subprocess.Popen([sys.executable, "-m", "hvdtrain.torch.checkpoint_writer",
                                         str(theirs.fileno()), str(os.getpid())],
                                        pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL)
        theirs.close()
        self.conn = Connection(mine.detach())
        self.staging.layout = None  # a new process maps the buffers anew


# ---------------------------------------------------------------------------------- the process
def _end_with_parent(parent: int) -> None:
    """SIGKILL when the rank that started this process ends (Linux), however it ends."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # it ended before the line above
        os._exit(1)


def _tensors_of(files: list, layout: list) -> list:
    """Each tensor of the state, in order, mapped from the buffers' files with a storage of its own
    (a numpy memmap of its bytes): saved, each holds its own bytes, as a checkpoint written
    inline does, not a view of one large storage."""
    import numpy as np

    where = {dtype: path for path, dtype, _ in files}
    tensors = []
    for dtype, shape, start, numel in _placements(layout):
        size = _dtype(dtype).itemsize
        if numel == 0:
            tensors.append(torch.empty(shape, dtype=_dtype(dtype)))
            continue
        raw = np.memmap(where[dtype], dtype=np.uint8, mode="r+", offset=start * size, shape=(numel * size,))
        tensors.append(torch.from_numpy(raw).view(_dtype(dtype)).reshape(shape))
    for path in where.values():
        os.unlink(path)  # mapped on both sides: nothing left behind in /dev/shm
    return tensors


def serve(conn: Connection) -> None:
    """The writer process's loop: map the buffers, write each checkpoint, answer with its failure
    (or None); end at ("exit",) or when the socket closes. A message it cannot read (a class
    only the rank's own script defines) is that write's failure, said by the rank."""
    import warnings

    from hvdtrain.checkpoint.writer import write_checkpoint

    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    tensors: list = []
    unusable: BaseException | None = None  # the buffers could not be mapped
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            message = pickle.loads(data)
        except BaseException as err:  # noqa: BLE001 - the write's failure, said by the rank
            conn.send(RuntimeError(f"the checkpoint writer process cannot read the state ({type(err).__name__}: "
                                   f"{err})"))
            continue
        if message[0] == "exit":
            return
        if message[0] == "buffers":
            try:
                tensors, unusable = _tensors_of(message[1], message[2]), None
            except OSError as err:
                tensors, unusable = [], err
            continue
        _, path, skeleton, signed, keep, slow = message
        try:
            if unusable is not None:
                raise unusable
            state = _fill(skeleton, tensors)
            write_checkpoint(path, lambda f: torch.save(state, f), signed, keep, slow)
            failure = None
        except BaseException as err:  # noqa: BLE001 - said by rank 0 on every rank
            failure = err
        try:
            conn.send(failure)
        except (pickle.PicklingError, TypeError, AttributeError):
            conn.send(RuntimeError(str(failure)))


def main() -> None:
    fd, parent = int(sys.argv[1]), int(sys.argv[2])
    _end_with_parent(parent)
    for stop in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(stop, signal.SIG_IGN)  # the rank decides when its writes end
    torch.set_num_threads(1)
    serve(Connection(fd))


if __name__ == "__main__":
    # The module under its own name, not __main__'s copy: the slots rank 0 pickles are its classes.
    from hvdtrain.torch.checkpoint_writer import main as _main
    _main()
