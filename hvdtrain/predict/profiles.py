"""Cluster profiles: small TOML files, one a partition, each figure with where it comes from.

    python -m hvdtrain.predict --cluster juwels-booster ...       # hvdtrain/predict/clusters/juwels-booster.toml
    python -m hvdtrain.predict --cluster ./my-cluster.toml ...    # your own, in the same form

A profile's keys are hvdtrain.predict.model.Cluster's fields; `sources` lists what each figure
rests on (a centre's documentation page, a measurement: nccl-tests, `python -m hvdtrain.doctor`)."""
from __future__ import annotations

import dataclasses
import os
import tomllib

from hvdtrain.errors import UsageError
from hvdtrain.predict.model import Cluster

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "clusters")


def names() -> list[str]:
    return sorted(f[:-5] for f in os.listdir(HERE) if f.endswith(".toml"))


def load(name_or_path: str) -> Cluster:
    """A built-in profile by name, or a TOML file by path; anything wrong is one line."""
    path = name_or_path if name_or_path.endswith(".toml") else os.path.join(HERE, f"{name_or_path}.toml")
    if not os.path.isfile(path):
        raise UsageError(f"--cluster {name_or_path}: no such profile (built in: {', '.join(names())}; or a .toml "
                         "file of your own, in their form)")
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise UsageError(f"--cluster {path}: {err}") from None
    fields = {f.name: f for f in dataclasses.fields(Cluster)}
    unknown = sorted(set(raw) - set(fields))
    missing = sorted(n for n, f in fields.items() if n not in raw and f.default is dataclasses.MISSING)
    if unknown or missing:
        raise UsageError(f"--cluster {path}: " + "; ".join(
            ([f"unknown keys {', '.join(unknown)}"] if unknown else []) + ([f"missing {', '.join(missing)}"] if missing else [])))
    raw["sources"] = tuple(raw.get("sources", ()))
    if not isinstance(raw.get("overlap", True), bool):
        raise UsageError(f"--cluster {path}: overlap must be true or false")
    wrong = [n for n, f in fields.items() if n in raw and f.type in ("int", "float")
             and not (isinstance(raw[n], (int, float)) and not isinstance(raw[n], bool) and raw[n] > 0)]
    if wrong:
        raise UsageError(f"--cluster {path}: {', '.join(wrong)} must be numbers above 0")
    return Cluster(**raw)
