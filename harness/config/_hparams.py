"""The hyperparameter space: one frozen dataclass per `type`, parsed with key paths.

Determined's spelling is kept: a bare value is a constant, `{type: int|double|log|
categorical|const, ...}` a range or choice, and a mapping without `type` a nested group.
`log` bounds are exponents of `base`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from assay.config._reader import REQUIRED, Section, type_name


@dataclass(frozen=True)
class Const:
    val: Any


@dataclass(frozen=True)
class Int:
    minval: int
    maxval: int
    count: int | None = None


@dataclass(frozen=True)
class Double:
    minval: float
    maxval: float
    count: int | None = None


@dataclass(frozen=True)
class Log:
    minval: float
    maxval: float
    base: float = 10.0
    count: int | None = None


@dataclass(frozen=True)
class Categorical:
    vals: tuple[Any, ...]


HParam: TypeAlias = "Const | Int | Double | Log | Categorical | Mapping[str, HParam]"

HPARAM_TYPES = ("const", "int", "double", "log", "categorical")


def parse_hparams(section: Section) -> dict[str, HParam]:
    """Parse every entry of the `hyperparameters` mapping at `section`."""
    space: dict[str, HParam] = {}
    for name, value in section.data.items():
        section.raw(name)
        if not isinstance(name, str):
            section.error(None, f"hyperparameter names must be strings, got {name!r}")
            continue
        parsed = _parse_one(value, section.key_path(name), section.problems)
        if parsed is not None:
            space[name] = parsed
    return space


def _parse_one(value: Any, path: str, problems: list[str]) -> HParam | None:
    if not isinstance(value, Mapping):
        return Const(value)
    if "type" not in value:
        nested = Section(value, path, problems)
        return parse_hparams(nested)
    s = Section(value, path, problems)
    kind = s.get_required_choice("type", HPARAM_TYPES)
    if kind is None:
        return None  # the other keys mean nothing without a valid type
    parsed: HParam | None = None
    if kind == "const":
        s.raw("val")
        if "val" not in value:
            s.error("val", "is required for type const")
        parsed = Const(value.get("val"))
    elif kind == "int":
        lo, hi = s.get_int("minval", REQUIRED), s.get_int("maxval", REQUIRED)
        count = s.get_int("count", None, minimum=1)
        if lo is not None and hi is not None:
            parsed = _checked_range(s, Int(lo, hi, count))
    elif kind in ("double", "log"):
        lo_f, hi_f = s.get_number("minval", REQUIRED), s.get_number("maxval", REQUIRED)
        count = s.get_int("count", None, minimum=1)
        if kind == "log":
            base = s.get_number("base", 10.0)
            if (base is not None and base <= 0) or base == 1:
                s.error("base", f"must be positive and not 1, got {base}")
            if lo_f is not None and hi_f is not None and base is not None:
                parsed = _checked_range(s, Log(lo_f, hi_f, base, count))
        elif lo_f is not None and hi_f is not None:
            parsed = _checked_range(s, Double(lo_f, hi_f, count))
    elif kind == "categorical":
        vals = s.raw("vals")
        if not isinstance(vals, list) or not vals:
            s.error("vals", f"expected a non-empty list, got {type_name(vals)} ({vals!r})")
        else:
            parsed = Categorical(tuple(vals))
        if "count" in value:
            s.raw("count")
            s.error("count", "is only allowed on int, double and log hyperparameters")
    s.finish()
    return parsed


def _checked_range(s: Section, hp: Int | Double | Log) -> Int | Double | Log | None:
    if hp.minval > hp.maxval:
        s.error(None, f"minval ({hp.minval}) must not exceed maxval ({hp.maxval})")
        return None
    return hp


def sample_hparams(space: Mapping[str, HParam], rng: random.Random) -> dict[str, Any]:
    """Draw one point of `space` uniformly (log types uniformly in the exponent)."""
    values: dict[str, Any] = {}
    for name in sorted(space):
        hp = space[name]
        if isinstance(hp, Const):
            values[name] = hp.val
        elif isinstance(hp, Int):
            values[name] = rng.randint(hp.minval, hp.maxval)
        elif isinstance(hp, Double):
            values[name] = rng.uniform(hp.minval, hp.maxval)
        elif isinstance(hp, Log):
            values[name] = hp.base ** rng.uniform(hp.minval, hp.maxval)
        elif isinstance(hp, Categorical):
            values[name] = hp.vals[rng.randrange(len(hp.vals))]
        else:
            values[name] = sample_hparams(hp, rng)
    return values
