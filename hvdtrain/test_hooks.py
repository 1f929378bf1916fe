"""The only environment variables hvdtrain reads for its test suite: each makes on a CPU machine
a scene the tests need (a rank slower than the others, a checkpoint written as slowly as on a
busy parallel file system, TensorFlow's uint8 input path without a GPU). Users never set them;
a product module asks here, never the environment, so that every such hook is in this list.

| variable | what it does | read by |
|---|---|---|
| HVDTRAIN_TEST_SLOW_RANK=R:S | rank R sleeps S more seconds in every step (counted as compute) | the meters, the Keras callbacks, the tape loop |
| HVDTRAIN_TEST_SLOW_CHECKPOINT_WRITE=S | every checkpoint write sleeps S seconds after its first bytes | checkpoint.Writer |
| HVDTRAIN_TEST_TF_UINT8_INPUT=1 | TensorFlow's custom loop feeds uint8 batches on a CPU, as it does on a GPU | hvdtrain/tf/devices.py |
| HVDTRAIN_DOCTOR_SLOWDOWN=N | the doctor's compute kernel on this rank does N times the work it reports (the doctor names the rank slow) | hvdtrain/doctor |
"""
from __future__ import annotations

import os

SLOW_RANK = "HVDTRAIN_TEST_SLOW_RANK"
SLOW_CHECKPOINT_WRITE = "HVDTRAIN_TEST_SLOW_CHECKPOINT_WRITE"
TF_UINT8_INPUT = "HVDTRAIN_TEST_TF_UINT8_INPUT"
DOCTOR_SLOWDOWN = "HVDTRAIN_DOCTOR_SLOWDOWN"


def injected_delay(rank: int, environ=None) -> float:
    """Seconds rank `rank` sleeps in every step after its batch arrives (SLOW_RANK=R:S), so that
    tests can make one rank slow for real; 0 for the others and when unset."""
    spec = (environ if environ is not None else os.environ).get(SLOW_RANK, "")
    if not spec:
        return 0.0
    slow_rank, seconds = spec.split(":")
    return float(seconds) if int(slow_rank) == rank else 0.0


def slow_checkpoint_write() -> float:
    return float(os.environ.get(SLOW_CHECKPOINT_WRITE, "0") or 0)


def tf_uint8_input_on_cpu() -> bool:
    return os.environ.get(TF_UINT8_INPUT) == "1"


def doctor_slowdown(environ=None) -> int:
    """The doctor's work multiplier (DOCTOR_SLOWDOWN): 1 unless it is a whole number > 1."""
    text = (os.environ if environ is None else environ).get(DOCTOR_SLOWDOWN, "")
    return int(text) if text.strip().isdigit() and int(text) > 1 else 1
