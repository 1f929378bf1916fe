"""Every row of the backend table (hvdtrain/backends.py) against its framework's interface
(hvdtrain/torch/backend.py, hvdtrain/tf/backend.py): it subclasses it, implements every abstract
method with the interface's signature, offers nothing the interface does not declare, and the
trainers call nothing the interfaces do not declare (fast tier: imports the backend modules,
hence torch and TensorFlow, each framework's in an interpreter of its own, but starts no backend)."""
import ast
import inspect
import os
import subprocess
import sys

import pytest

from hvdtrain import backends
from hvdtrain.collectives import Collectives

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def public_methods(cls) -> dict:
    return {name: member for name, member in inspect.getmembers(cls, inspect.isfunction)
            if not name.startswith("_")}


def shape(function) -> list:
    """A signature as the trainers rely on it: parameter names, kinds and defaults."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def problems(backend) -> list[str]:
    """What is wrong with one row's class, against its framework's interface."""
    cls, interface = backend.implementation(), backend.interface()
    found = []
    # (Collectives is a protocol with attributes, which issubclass refuses: hence the MRO.)
    if not (issubclass(cls, interface) and Collectives in interface.__mro__):
        found.append(f"{cls.__name__} does not subclass {interface.__name__}")
    if cls.name != backend.name:
        found.append(f"{cls.__name__}.name is {cls.name!r}, the table says {backend.name!r}")
    if inspect.isabstract(cls):
        found.append(f"{cls.__name__} lacks {sorted(cls.__abstractmethods__)}")
    declared = public_methods(interface)
    for name, method in public_methods(cls).items():
        if name not in declared:
            found.append(f"{cls.__name__} offers {name}, which {interface.__name__} does not declare")
        elif shape(method) != shape(declared[name]):
            found.append(f"{cls.__name__}.{name}{inspect.signature(method)} is not "
                         f"{interface.__name__}.{name}{inspect.signature(declared[name])}")
    return found


@pytest.mark.parametrize("framework", ["torch", "tf"])
def test_each_backend_implements_its_frameworks_interface(framework):
    # In a fresh interpreter: TensorFlow imported beside torch in this one crashes the torch
    # tests that follow (a segmentation fault).
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, os.path.abspath(__file__), framework], capture_output=True, text=True,
                         env=env, cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.splitlines() == [f"checked {b.label}" for b in backends.BACKENDS if b.framework == framework]


def test_the_interfaces_declare_their_optional_capabilities_with_defaults():
    from hvdtrain.tf.backend import TFBackend
    from hvdtrain.torch.backend import TorchBackend

    # What every backend must write itself; everything else has a default in the interface.
    assert TorchBackend.__abstractmethods__ == {"wrap_model", "wrap_optimizer", "broadcast_state", "average_buffers",
                                                *Collectives.__abstractmethods__}
    assert TFBackend.__abstractmethods__ == {"distributed_tape", "reduce_gradients", "broadcast_variables",
                                             "average_variables", *Collectives.__abstractmethods__}
    owning = [b.name for b in backends.BACKENDS if b.framework == "torch" and b.implementation().owns_loop]
    assert owning == ["lightning"]


# The names the trainers and loops use for their backend in these files.
CALLERS = {"torch": {"hvdtrain/torch/train.py": {"b", "self.backend"}, "hvdtrain/trainer.py": {"b", "self.backend"}},
           "tf": {"hvdtrain/tf/train.py": {"b", "self.backend"}, "hvdtrain/tf/loops.py": {"backend", "self.backend"},
                  "hvdtrain/trainer.py": {"b", "self.backend"}}}


def used_members(path: str, names: set) -> set:
    with open(os.path.join(REPO, path)) as f:
        tree = ast.parse(f.read())
    return {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and ast.unparse(node.value) in names}


@pytest.mark.parametrize("framework", ["torch", "tf"])
def test_the_trainers_call_only_what_the_interface_declares(framework):
    interface = next(b for b in backends.BACKENDS if b.framework == framework).interface()
    declared = {name for cls in interface.__mro__ for name in (*vars(cls), *getattr(cls, "__annotations__", {}))}
    for path, names in CALLERS[framework].items():
        used = used_members(path, names)
        assert used, f"{path}: no use of {names} found (renamed?)"
        assert used <= declared, f"{path} uses {sorted(used - declared)}, which {interface.__name__} does not declare"


if __name__ == "__main__":  # python tests/test_backend_interfaces.py torch|tf: the rows of one framework
    for row in (b for b in backends.BACKENDS if b.framework == sys.argv[1]):
        wrong = problems(row)
        print("\n".join(wrong) if wrong else f"checked {row.label}")
