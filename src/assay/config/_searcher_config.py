"""The `searcher` section as parsed: `SearcherConfig`, its objectives and its bounds.

The schema (`assay.config._schema`) builds a `SearcherConfig`; the plan of a search
(`assay.config._search`) and of population-based training (`assay.config._pbt`) are read
from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from assay.config._length import Length

MODES = ("aggressive", "standard", "conservative")
SAMPLERS = ("random", "tpe", "bohb")
DEFAULT_RANDOM_FRACTION = 1 / 3
"""The share of the bohb sampler's trials drawn at random (BOHB's and HpBandSter's)."""
DEFAULT_DIVISOR = 4
DEFAULT_MAX_RUNGS = 5
MAX_RUNGS = 64  # past this a search is a typo, and a divisor near 1 makes the arithmetic slow
DEFAULT_MODE = "standard"
MAX_TRIALS = 100_000
"""The most trials a search may count (`max_trials`), as many as the largest grid: the
master keeps every trial of a live experiment, and the searcher's state grows with them."""
MAX_CONCURRENT_TRIALS = 1_000
"""The most trials a search runs or queues at once (`max_concurrent_trials`, given or by
default): the master creates that many trials in one step when the experiment starts."""
DEFAULT_MAX_CONCURRENT_TRIALS = 16
"""`max_concurrent_trials` of grid, random and bayesian searches when it is 0 or absent
(Determined's default): new trials are created as earlier ones end."""
NEEDS_MAX_TRIALS = ("random", "asha", "adaptive_asha", "bayesian")
"""The searchers whose config must give `max_trials`."""
MAX_OBJECTIVES = 8
"""The most metrics a multi-objective search (`searcher.metrics`) optimises at once."""
MULTI_OBJECTIVE_SEARCHERS = ("random", "grid", "bayesian")
"""The searchers that take `searcher.metrics`: those that never compare trials to stop one
early (ASHA, adaptive ASHA and PBT rank trials on one order)."""

Divisor = int | float
"""A successive-halving divisor: an integer >= 2 or a finite number > 1 (e.g. 2.5)."""


@dataclass(frozen=True)
class Objective:
    """One metric of a multi-objective search (`searcher.metrics`)."""

    name: str
    smaller_is_better: bool = True


def parse_objectives(value: Any) -> tuple[tuple[Objective, ...], list[str]]:
    """`searcher.metrics` as objectives, and every problem with it (as `key.path: fix`)."""
    problems: list[str] = []
    example = "e.g. [{name: val_loss, smaller_is_better: true}, {name: latency_ms}]"
    if not isinstance(value, list) or not 2 <= len(value) <= MAX_OBJECTIVES:
        got = f"{len(value)} entries" if isinstance(value, list) else repr(value)
        return (), [
            f"searcher.metrics: expected a list of 2 to {MAX_OBJECTIVES} metrics, {example}; "
            f"got {got} (one metric is searcher.metric)"
        ]
    objectives: list[Objective] = []
    for i, entry in enumerate(value):
        where = f"searcher.metrics[{i}]"
        if isinstance(entry, str):
            entry = {"name": entry}
        if not isinstance(entry, Mapping):
            problems.append(f"{where}: expected {{name, smaller_is_better}}, got {entry!r}")
            continue
        for extra in sorted(set(entry) - {"name", "smaller_is_better"}, key=str):
            problems.append(f"{where}.{extra}: unknown key; a metric has name, smaller_is_better")
        name, smaller = entry.get("name"), entry.get("smaller_is_better", True)
        if not isinstance(name, str) or not name.strip():
            problems.append(f"{where}.name: expected a validation metric's name, got {name!r}")
        elif any(o.name == name for o in objectives):
            problems.append(f"{where}.name: {name!r} is listed twice")
        if not isinstance(smaller, bool):
            problems.append(f"{where}.smaller_is_better: expected true or false, got {smaller!r}")
        if isinstance(name, str) and name.strip() and isinstance(smaller, bool):
            objectives.append(Objective(name, smaller))
    return (tuple(objectives), problems) if not problems else ((), problems)


@dataclass(frozen=True)
class SearcherConfig:
    """`searcher`: which search, on which metric, how long; `options` keeps the searcher's
    own keys (divisor, num_rungs, max_rungs, mode, bracket_rungs, sampler, random_fraction)
    as given."""

    name: str
    metric: str
    max_length: Length
    smaller_is_better: bool = True
    max_trials: int | None = None
    max_concurrent_trials: int = 0
    options: Mapping[str, Any] = field(default_factory=dict)
    # Determined 0.38's `time_metric`: the validation metric that measures how far a trial
    # has trained (scripts report it); lengths are then in its units (`max_time`).
    time_metric: str | None = None
    # A multi-objective search's metrics (`searcher.metrics`); `metric` and
    # `smaller_is_better` are then the first one's. Empty for one metric.
    objectives: tuple[Objective, ...] = ()

    @property
    def trial_length(self) -> Length:
        """The most one trial trains: `max_length`, except in pbt, where `max_length` is
        one round's length and a trial that survives every round trains all of them."""
        if self.name == "pbt" and self.max_length.bounded:
            rounds = int(self.options.get("num_rounds", 1))
            return replace(self.max_length, value=self.max_length.value * rounds)
        return self.max_length


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
