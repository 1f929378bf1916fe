"""What each option of the training configuration declares about itself, beside its field
(hvdtrain/config.py), and what hvdtrain derives from that:

    batch_size: int = opt(32, help="samples per rank per backward pass", per_rank=False,
                          resume=RESIZE, at_least=1)

- the command line of each trainer (`config.build_parser`): flag, type, default, choices, help;
- the value checks of TrainConfig (`range_problems`): at_least / above;
- which backends honour it (`unhonoured`): any other refuses it when it is given;
- the start-up agreement of the ranks (`shared`): every option not per_rank must be the same on
  every rank (hvdtrain/trainer.py);
- what a resume does when it differs from the checkpoint's (`resume_keys`, hvdtrain/checkpoint/compatibility.py).

A field declared without opt() fails at import (`declared`); so does opt() without help,
per_rank or resume: a new option cannot be added without saying them.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import typing
from typing import Callable

from hvdtrain import backends

FRAMEWORKS = ("torch", "tf")
# What a resume does when an option differs from the checkpoint's:
MATCH = "match"    # refused: the option changes the shape or meaning of the saved state
RESIZE = "resize"  # refused unless --allow-resize: the option changes the global batch
FREE = "free"      # goes on with this run's value


@dataclasses.dataclass(frozen=True)
class Option:
    help: str        # its --help text; for a field that is no flag, what it holds
    per_rank: bool   # ranks may differ in it: local resources, outputs only rank 0 writes
    resume: str      # MATCH, RESIZE or FREE
    flag: bool = True                             # on the command line, as --name-with-dashes
    frameworks: tuple[str, ...] = FRAMEWORKS      # the trainers whose command line has it
    backends: tuple[str, ...] | None = None       # the only backends that honour it (None: all)
    choices: tuple | Callable[[str], list] | None = None  # or a function of the framework
    at_least: float | None = None                 # the lowest value allowed
    above: float | None = None                    # every value allowed is above this one
    const: object = None                          # the value of the flag given without one (--amp: fp16)

    def __post_init__(self):
        every_backend = {b.name for b in backends.BACKENDS}
        if not self.help or self.resume not in (MATCH, RESIZE, FREE) or not set(self.frameworks) <= set(FRAMEWORKS):
            raise TypeError(f"bad option declaration {self}: help, resume (MATCH, RESIZE or FREE), frameworks")
        # The refusal names the backends that honour it (Horovod, hvdtrain's own, honours every option).
        if self.backends is not None and ("horovod" not in self.backends or not set(self.backends) <= every_backend):
            raise TypeError(f"bad option declaration {self}: backends must name backends, horovod among them")
        if self.at_least is not None and self.above is not None:
            raise TypeError(f"bad option declaration {self}: at_least or above, not both")


def opt(default, *, help: str, per_rank: bool, resume: str, **more) -> dataclasses.Field:
    """A configuration field and its Option (`more`: Option's other attributes)."""
    return dataclasses.field(default=default, metadata={"option": Option(help, per_rank, resume, **more)})


def option(field: dataclasses.Field) -> Option:
    return field.metadata["option"]


def declared(cls):
    """Class decorator: every field of the dataclass `cls` carries an Option (made by opt())."""
    missing = [f.name for f in dataclasses.fields(cls) if not isinstance(f.metadata.get("option"), Option)]
    if missing:
        raise TypeError(f"{cls.__name__} fields without an option declaration: {', '.join(missing)} (declare each "
                        "with hvdtrain.options.opt(default, help=..., per_rank=..., resume=...))")
    return cls


# Flags whose name is not their field's: the first is the flag, the others its old spellings,
# still accepted. --warmup-steps read as the LR warm-up (--warmup-epochs); these steps are only
# left out of the throughput clock.
RENAMED = {"warmup_steps": ("--untimed-steps", "--warmup-steps")}


def flag(name: str) -> str:
    return RENAMED[name][0] if name in RENAMED else "--" + name.replace("_", "-")


def flag_spellings(name: str) -> tuple[str, ...]:
    """The flag of a field and its old spellings."""
    return RENAMED.get(name, (flag(name),))


@functools.cache
def _type_hints(cls) -> dict:
    return typing.get_type_hints(cls)  # the annotations are strings (from __future__ import annotations)


def value_type(cls, name: str) -> type:
    """The type of a field's values, None aside: int for `int | None`."""
    hint = _type_hints(cls)[name]
    types = [t for t in typing.get_args(hint) if t is not type(None)] or [hint]
    return types[0]


def range_problems(cfg) -> list[str]:
    """The fields of cfg outside their at_least / above bounds (None is always allowed)."""
    problems = []
    for f in dataclasses.fields(cfg):
        o, value = option(f), getattr(cfg, f.name)
        low = o.at_least if o.at_least is not None else o.above
        if low is None or value is None:
            continue
        if value_type(type(cfg), f.name) is int:
            if value < low:
                problems.append(f"{flag(f.name)} must be >= {low} (got {value})")
        elif not math.isfinite(value) or value < low or (value == low and o.above is not None):
            problems.append(f"{flag(f.name)} must be a finite number {'>' if o.above is not None else '>='} {low:g} "
                            f"(got {value:g})")
    return problems


def unhonoured(cfg) -> list[str]:
    """The options given to cfg's backend (a value other than the default) that it does not honour."""
    return [_unhonoured_line(f.name, cfg, option(f).backends) for f in dataclasses.fields(cfg)
            if option(f).backends is not None and cfg.backend not in option(f).backends
            and getattr(cfg, f.name) != f.default]


def _unhonoured_line(name: str, cfg, honoured_by: tuple[str, ...]) -> str:
    """Horovod's own options are said to be; one that other backends of this framework honour too
    (--loader: horovod and ddp) names them, not Horovod alone."""
    mine = [b.name for b in backends.BACKENDS if b.framework == cfg.framework and b.name in honoured_by]
    if mine == ["horovod"]:
        return f"{flag(name)} is a Horovod option, which --backend {cfg.backend} does not have (use --backend horovod)"
    return (f"{flag(name)} is honoured by --backend {' and '.join(mine)} only, not by --backend {cfg.backend} "
            "(use one of those)")


def shared(cfg) -> dict:
    """The options every rank must have alike (all but the per_rank ones), by name."""
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if not option(f).per_rank}


def resume_keys(cls, framework: str, resume: str) -> tuple[str, ...]:
    """The fields of `cls` that the trainer of `framework` treats as `resume` (MATCH, RESIZE) on a resume."""
    return tuple(f.name for f in dataclasses.fields(cls)
                 if option(f).resume == resume and framework in option(f).frameworks)


def not_of(cls, framework: str) -> set[str]:
    """The fields of `cls` that `framework`'s trainer does not have (torch's --amp for TF)."""
    return {f.name for f in dataclasses.fields(cls) if framework not in option(f).frameworks}


def flags(cls, framework: str) -> tuple[str, ...]:
    """The fields of `cls` that are options of the command line of `framework`'s trainer."""
    return tuple(f.name for f in dataclasses.fields(cls) if option(f).flag and framework in option(f).frameworks)
