"""What the Python environment of set-up already holds, asked by scripts/setup.sh.

Runs under the venv's python before hvdtrain is installed, so it imports nothing of hvdtrain:

    python scripts/stack.py frameworks      # "torch tf": the frameworks that import here
    python scripts/stack.py keep-pins       # pip constraints that keep what the site installed
    python scripts/stack.py version DIST    # a distribution's version, or "none"
    python scripts/stack.py horovod torch tf  # where Horovod comes from and whether its ops load

Why a site's packages are pinned rather than left alone: pip resolves every requirement again
and would happily "upgrade" a site's CUDA torch to PyPI's build to satisfy some range; a
constraint `torch==<installed>` makes that impossible, and a real conflict an error.
"""
from __future__ import annotations

import importlib
import importlib.metadata as md
import os
import re
import sys

# What a site provides and a user venv must never replace.
SITE_STACK = re.compile(r"^(torch|torchvision|torchaudio|tensorflow|tensorflow-cpu|tf-keras|keras|numpy|"
                        r"horovod|mpi4py|triton|jax|jaxlib|nvidia-.*|cuda-.*)$")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _imports(module: str) -> bool:
    try:
        importlib.import_module(module)
        return True
    except Exception:  # noqa: BLE001 - any failure means "not usable here"
        return False


def frameworks() -> list[str]:
    found = []
    if _imports("torch") and _imports("torchvision"):
        found.append("torch")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if _imports("tensorflow"):
        found.append("tf")
    return found


def keep_pins() -> list[str]:
    """`name==version` for every site-stack distribution visible to this interpreter (the venv's
    own site-packages, --system-site-packages and PYTHONPATH alike), first one found wins."""
    pins: dict[str, str] = {}
    for dist in md.distributions():
        name = dist.metadata.get("Name")
        if name and dist.version and SITE_STACK.match(_canonical(name)):
            pins.setdefault(_canonical(name), dist.version)
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


def version(dist: str) -> str:
    try:
        return md.version(dist).split("+")[0]
    except md.PackageNotFoundError:
        return "none"


def horovod(wanted: list[str]) -> str:
    """One line: `none`, or `<venv|pythonpath|site> <version> <path> ok|missing:<what>` where <what> lists
    the framework ops or controllers that do not load."""
    try:
        import horovod as hvd_pkg
    except Exception:  # noqa: BLE001
        return "none"
    path = os.path.dirname(os.path.abspath(hvd_pkg.__file__))
    pythonpath = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if path.startswith((sys.prefix + os.sep, os.path.realpath(sys.prefix) + os.sep)):
        where = "venv"
    elif any(path.startswith(p + os.sep) for p in pythonpath):
        where = "pythonpath"  # a module's: it comes before the venv's own site-packages
    else:
        where = "site"
    missing = []
    modules = {"torch": "horovod.torch", "tf": "horovod.tensorflow"}
    for fw in wanted:
        try:
            mod = importlib.import_module(modules[fw])
            # The extension is loaded lazily by some versions: touch a function that needs it.
            mod.mpi_built()
        except Exception:  # noqa: BLE001
            missing.append(f"{fw}-ops")
    if not missing:
        mod = importlib.import_module(modules[wanted[0]]) if wanted else None
        if mod is not None and not (mod.mpi_built() or mod.gloo_built()):
            missing.append("controller")
    version_ = getattr(hvd_pkg, "__version__", "?")
    return f"{where} {version_} {path} {'ok' if not missing else 'missing:' + ','.join(missing)}"


def main(argv: list[str]) -> None:
    cmd, args = argv[0], argv[1:]
    if cmd == "frameworks":
        print(" ".join(frameworks()))
    elif cmd == "keep-pins":
        print("\n".join(keep_pins()))
    elif cmd == "version":
        print(version(args[0]))
    elif cmd == "horovod":
        print(horovod(args))
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main(sys.argv[1:])
