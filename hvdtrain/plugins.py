"""A user's own model, data or loss named on the command line, as a function to call:

    --model my_model.py:build          a file (relative to the working directory, or absolute)
    --dataset my_pkg.data:datasets     an importable module

`load(reference, option)` imports the file or module and returns the function; anything wrong
(no such file, an import error inside it, no such name, not callable) is one line naming the
option and the reference (hvdtrain/errors.py). A file's folder is put first on sys.path and the
file imported by its name, so that the DataLoader workers (forked from a server that imports by
name) can unpickle the classes it defines.

A name without ':' is no reference: the trainers' built-in models and datasets keep their names.
"""
from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import Callable

from hvdtrain.errors import UsageError


def is_reference(name: str) -> bool:
    return ":" in name


def split(reference: str, option: str) -> tuple[str, str]:
    where, _, name = reference.rpartition(":")
    if not where or not name.isidentifier():
        raise UsageError(f"{option} {reference}: expected FILE.py:FUNCTION or package.module:FUNCTION")
    return where, name


def _import(where: str, option: str, reference: str):
    if where.endswith(".py"):
        path = os.path.abspath(where)
        if not os.path.isfile(path):
            raise UsageError(f"{option} {reference}: no file {path}")
        folder, module_name = os.path.split(path[:-3])
        if folder not in sys.path:
            sys.path.insert(0, folder)
        # Also for processes this one starts (DataLoader workers, a forkserver started later).
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [folder, os.environ.get("PYTHONPATH")]))
        loaded = sys.modules.get(module_name)
        if loaded is not None and os.path.abspath(getattr(loaded, "__file__", "") or "") != path:
            raise UsageError(f"{option} {reference}: a module named '{module_name}' is imported already from "
                             f"{loaded.__file__}; rename {os.path.basename(path)}")
    else:
        module_name = where
    try:
        return importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - whatever the user's module raises, in one line
        raise UsageError(f"{option} {reference}: cannot import {where} ({type(err).__name__}: {err})") from None


def load(reference: str, option: str) -> Callable:
    """The function `reference` names (FILE.py:FUNCTION or package.module:FUNCTION)."""
    where, name = split(reference, option)
    module = _import(where, option, reference)
    if not hasattr(module, name):
        raise UsageError(f"{option} {reference}: {where} has no '{name}'")
    function = getattr(module, name)
    if not callable(function):
        raise UsageError(f"{option} {reference}: '{name}' is a {type(function).__name__}, not a function")
    return function


def call(function: Callable, reference: str, option: str, *args):
    """function(*args), an exception in it reported as one line naming the reference."""
    try:
        return function(*args)
    except UsageError:
        raise
    except Exception as err:  # noqa: BLE001 - the user's code, in one line
        raise UsageError(f"{option} {reference} raised {type(err).__name__}: {err}") from None


def describe(obj) -> str:
    """How the configuration, checkpoints and results name what fit() was given: module:Name of the
    function or class (of its class for an object), the form --model and --dataset take."""
    named = obj if inspect.isfunction(obj) or inspect.isclass(obj) or inspect.ismethod(obj) else type(obj)
    return f"{named.__module__}:{named.__qualname__}"
