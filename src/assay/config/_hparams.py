"""The hyperparameter space: one frozen dataclass per `type`, parsed with key paths.

Determined's spelling is kept: a bare value is a constant, `{type: int|double|log|
categorical|const, ...}` a range or choice, and a mapping without `type` a nested group.
`log` bounds are exponents of `base`.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator, Mapping
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


def overflow_problems(space: Mapping[str, HParam], path: str) -> list[str]:
    """A problem for each double or log range of `space` (at `path`) whose samples can be
    infinite: a trial's hyperparameters are stored as JSON, which has no infinity."""
    problems = []
    for names, hp in _leaves(space, ()):
        where = ".".join((path, *names))
        if isinstance(hp, Double) and not math.isfinite(hp.maxval - hp.minval):
            problems.append(
                f"{where}: the range {hp.minval} to {hp.maxval} overflows a float; narrow it"
            )
        elif isinstance(hp, Log):
            for end in (hp.minval, hp.maxval):
                try:
                    finite = math.isfinite(hp.base**end)
                except OverflowError:
                    finite = False
                if not finite:
                    problems.append(
                        f"{where}: {hp.base} ** {end} overflows a float (about 1.8e308 at "
                        "most); narrow the exponents"
                    )
                    break
    return problems


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


# --- grid search ---------------------------------------------------------------------------

MAX_GRID_POINTS = 100_000
"""The largest grid `grid_points` builds: beyond it a typo in `count` would hang the master."""


def grid_axis_size(hp: Const | Int | Double | Log | Categorical) -> int | None:
    """How many values the grid tries for `hp` (an upper bound for int, before duplicates
    are removed); None for a double or log without `count`, which has no grid."""
    if isinstance(hp, Const):
        return 1
    if isinstance(hp, Categorical):
        return len(hp.vals)
    if isinstance(hp, Int):
        span = hp.maxval - hp.minval + 1
        return span if hp.count is None else min(span, hp.count)
    return hp.count


def grid_values(hp: Const | Int | Double | Log | Categorical) -> list[Any]:
    """The values the grid tries for one hyperparameter, in increasing order.

    `count` values evenly spaced from minval to maxval, both included (in the exponent for
    log); one value is the midpoint. An int range rounds each value half up and drops the
    duplicates; an int without `count` is every integer of its range. A double or log
    without `count` raises ValueError: a continuous range has no grid.
    """
    if isinstance(hp, Const):
        return [hp.val]
    if isinstance(hp, Categorical):
        return list(hp.vals)
    if isinstance(hp, Int):
        span = hp.maxval - hp.minval + 1
        if hp.count is None or hp.count >= span:
            return list(range(hp.minval, hp.maxval + 1))
        ints = (math.floor(x + 0.5) for x in _spaced(hp.minval, hp.maxval, hp.count))
        return list(dict.fromkeys(ints))
    if hp.count is None:
        raise ValueError(f"a {type(hp).__name__.lower()} hyperparameter needs `count` for grid")
    points = _spaced(hp.minval, hp.maxval, hp.count)
    if isinstance(hp, Log):
        points = [hp.base**x for x in points]
    return list(dict.fromkeys(points))


def _spaced(lo: float, hi: float, count: int) -> list[float]:
    if count == 1:
        return [(lo + hi) / 2]
    step = (hi - lo) / (count - 1)
    return [lo + i * step for i in range(count - 1)] + [hi]


def grid_size(space: Mapping[str, HParam]) -> int:
    """The number of grid points before int duplicates are removed (an upper bound)."""
    total = 1
    for _, hp in _leaves(space, ()):
        size = grid_axis_size(hp)
        if size is None:
            raise ValueError("a double or log hyperparameter without `count` has no grid")
        total *= size
    return total


def grid_points(space: Mapping[str, HParam]) -> list[dict[str, Any]]:
    """Every point of the Cartesian product of `grid_values`, nested like `space`.

    Names are taken in sorted order at every level, and the first name varies slowest, so
    the order is stable across runs. Raises ValueError beyond MAX_GRID_POINTS.
    """
    size = grid_size(space)
    if size > MAX_GRID_POINTS:
        raise ValueError(f"the grid has {size:,} points, more than {MAX_GRID_POINTS:,}")
    leaves = list(_leaves(space, ()))
    axes = [grid_values(hp) for _, hp in leaves]
    points: list[dict[str, Any]] = []
    paths = [path for path, _ in leaves]
    for combo in itertools.product(*axes):
        points.append(assemble(space, dict(zip(paths, combo, strict=True))))
    return points


def assemble(space: Mapping[str, HParam], values: Mapping[tuple[str, ...], Any]) -> dict[str, Any]:
    """Nest leaf values given by path into the shape of `space` (groups kept, even empty)."""
    point: dict[str, Any] = _empty_groups(space)
    for path, value in values.items():
        target = point
        for name in path[:-1]:
            target = target[name]
        target[path[-1]] = value
    return point


def _leaves(
    space: Mapping[str, HParam], prefix: tuple[str, ...]
) -> Iterator[tuple[tuple[str, ...], Const | Int | Double | Log | Categorical]]:
    """(path, hparam) of every non-group entry, names sorted at each level."""
    for name in sorted(space):
        hp = space[name]
        if isinstance(hp, Const | Int | Double | Log | Categorical):
            yield (*prefix, name), hp
        else:
            yield from _leaves(hp, (*prefix, name))


def _empty_groups(space: Mapping[str, HParam]) -> dict[str, Any]:
    """The nested groups of `space` as empty dicts, so that empty groups survive too."""
    return {
        name: _empty_groups(hp)
        for name, hp in space.items()
        if not isinstance(hp, Const | Int | Double | Log | Categorical)
    }


def log_bound_warnings(space: Mapping[str, HParam]) -> list[str]:
    """A `log` hyperparameter whose bounds look like values, not exponents (both in
    (0, 1], as Optuna's or Ray's `loguniform(1e-4, 0.1)` are written): it searches
    base**minval to base**maxval, e.g. 1.0002 to 1.26, which is rarely what was meant."""
    out = []
    for path, hp in leaves(space):
        if isinstance(hp, Log) and 0 < hp.minval < hp.maxval <= 1:
            lo, hi = hp.base**hp.minval, hp.base**hp.maxval
            name = ".".join(path)
            out.append(
                f"hyperparameters.{name}: type log takes exponents of base {hp.base:g}, so it "
                f"searches {lo:.6g} to {hi:.6g}; for values from {hp.minval:g} to "
                f"{hp.maxval:g} give minval: {math.log(hp.minval, hp.base):.4g}, maxval: "
                f"{math.log(hp.maxval, hp.base):.4g}"
            )
    return out


def leaves(
    space: Mapping[str, HParam],
) -> list[tuple[tuple[str, ...], Const | Int | Double | Log | Categorical]]:
    """(path, hparam) of every leaf of `space` (names sorted at each level)."""
    return list(_leaves(space, ()))
