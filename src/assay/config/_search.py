"""The search plan: the `searcher` options resolved into brackets, rungs and budgets.

This is the arithmetic of successive halving on plain integers, shared by the master's
searchers (`assay.master.searcher`) and by `assay preview-search`, which must show the
plan without importing the master. It lives beside the schema because the rules that make
an option valid (a rung must train longer than the one below it) are the same rules: the
schema parses the `searcher` section into `SearcherConfig` (`assay.config._searcher_config`)
and reports `searcher_problems` with the rest of the config; pbt's plan is
`assay.config._pbt`.

Rung rule: with `R` rungs and divisor `d`, rung `k` (0 = bottom) trains to
`floor(max_length / d**(R-1-k))` units, at least 1; the top rung is `max_length`. The rungs
strictly increase exactly when `max_length >= d**(R-1)`, so that is what a valid
`num_rungs` needs; `max_rungs` is a ceiling and is lowered silently to what fits (as in
Determined's adaptive ASHA).

The divisor may be a number such as 2.5 (Determined allows it). The arithmetic then runs on
exact fractions of the decimal the config wrote (2.5 is 5/2, 2.2 is 11/5), so rung lengths,
trial counts and promotion quotas are the integers that decimal means, with no floating-
point rounding at the edges (`floor(100 / 2.5**2)` is 16, never 15).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

from assay.config._hparams import (
    MAX_GRID_POINTS,
    Double,
    HParam,
    Log,
    grid_size,
    grid_values,
    leaves,
)
from assay.config._length import LengthUnit
from assay.config._pbt import PBTSpec, pbt_problems, pbt_spec
from assay.config._searcher_config import (
    DEFAULT_DIVISOR,
    DEFAULT_MAX_CONCURRENT_TRIALS,
    DEFAULT_MAX_RUNGS,
    DEFAULT_MODE,
    DEFAULT_RANDOM_FRACTION,
    MAX_CONCURRENT_TRIALS,
    MAX_RUNGS,
    MAX_TRIALS,
    MODES,
    MULTI_OBJECTIVE_SEARCHERS,
    NEEDS_MAX_TRIALS,
    SAMPLERS,
    Divisor,
    SearcherConfig,
    is_int,
)

# --- rung arithmetic ---------------------------------------------------------------------


def exact(divisor: Divisor) -> Fraction:
    """`divisor` as the exact fraction of the decimal it was written as (2.2 is 11/5)."""
    if isinstance(divisor, int):
        return Fraction(divisor)
    return Fraction(repr(float(divisor)))


def divide(n: int, divisor: Divisor) -> int:
    """`floor(n / divisor)`, exactly."""
    if isinstance(divisor, int):
        return n // divisor
    return math.floor(n / exact(divisor))


def rung_lengths(max_length: int, divisor: Divisor, num_rungs: int) -> tuple[int, ...]:
    """The length each rung trains to, bottom first (see the module docstring)."""
    d = exact(divisor)
    return tuple(
        max(math.floor(max_length / d ** (num_rungs - 1 - k)), 1) for k in range(num_rungs)
    )


def rungs_that_fit(n: int, divisor: Divisor) -> int:
    """The largest `R` with `divisor**(R-1) <= n` (1 for n < divisor), at most MAX_RUNGS."""
    d = exact(divisor)
    rungs, reach = 1, d
    while reach <= n and rungs < MAX_RUNGS:
        rungs, reach = rungs + 1, reach * d
    return rungs


def trials_per_rung(max_trials: int, divisor: Divisor, num_rungs: int) -> tuple[int, ...]:
    """How many trials reach each rung in synchronous successive halving (the preview's
    figure; asynchronous promotion may promote a few more)."""
    counts = [max_trials]
    for _ in range(num_rungs - 1):
        counts.append(divide(counts[-1], divisor))
    return tuple(counts)


def mode_brackets(mode: str, max_rungs: int) -> tuple[int, ...]:
    """Rung counts of the brackets a mode runs (Determined's three modes)."""
    if mode == "aggressive":
        return (max_rungs,)
    if mode == "standard":
        return tuple(range((max_rungs - 1) // 2 + 1, max_rungs + 1))
    if mode == "conservative":
        return tuple(range(1, max_rungs + 1))
    raise ValueError(f"mode must be one of {' | '.join(MODES)}, got {mode!r}")


def bracket_max_trials(
    max_trials: int, divisor: Divisor, brackets: Sequence[int]
) -> tuple[int, ...]:
    """Split `max_trials` so that each bracket gets about the same budget.

    A bracket of `R` rungs spends about `R` full lengths per `divisor**(R-1)` trials, so it
    gets trials in proportion to `divisor**(R-1) / R`; each gets at least one, the rest goes
    to the first bracket, and the total never exceeds `max_trials` (which must be at least
    the number of brackets).
    """
    if max_trials < len(brackets):
        raise ValueError(f"{len(brackets)} brackets need max_trials >= {len(brackets)}")
    weights = [float(divisor) ** (r - 1) / r for r in brackets]
    total = sum(weights)
    trials = [max(int(w / total * max_trials), 1) for w in weights]
    trials[0] += max(max_trials - sum(trials), 0)
    while sum(trials) > max_trials:
        trials[trials.index(max(trials))] -= 1
    return tuple(trials)


def bracket_max_concurrent(
    max_concurrent: int, divisor: Divisor, trials: Sequence[int]
) -> tuple[int, ...]:
    """Each bracket's concurrency limit: `max_concurrent` split evenly (the remainder to the
    first brackets, and at least 1 each); with 0, Determined's default of
    `max(trials of the last bracket, floor(divisor))` each, at most MAX_CONCURRENT_TRIALS."""
    n = len(trials)
    if max_concurrent == 0:
        return (min(max(trials[-1], math.floor(divisor)), MAX_CONCURRENT_TRIALS),) * n
    share, extra = divmod(max(max_concurrent, n), n)
    return tuple(share + (1 if i < extra else 0) for i in range(n))


# --- options ------------------------------------------------------------------------------


def searcher_problems(config: SearcherConfig, space: Mapping[str, HParam]) -> list[str]:
    """Every problem with the searcher's options, as `key.path: what to fix`.

    The config parser reports these with the rest of the config; `search_spec` raises them
    for a `SearcherConfig` built in code.
    """
    problems: list[str] = []

    def bad(key: str, message: str) -> None:
        problems.append(f"searcher.{key}: {message}")

    options = config.options
    name = config.name
    if name == "custom":
        return custom_problems(config)
    if config.objectives:
        problems.extend(_multi_objective_problems(config))
        if problems:
            return problems
    if name == "pbt":
        return pbt_problems(config)
    if name in NEEDS_MAX_TRIALS and config.max_trials is None:
        bad("max_trials", f"is required for the {name} searcher (how many trials to run)")
    if config.max_trials is not None and config.max_trials > MAX_TRIALS:
        # Under `searcher:`, not `searcher.max_trials:`: the schema keeps only its own
        # messages about a max_trials that is given.
        problems.append(
            f"searcher: max_trials must be at most {MAX_TRIALS:,} (the largest search the "
            f"master runs), got {config.max_trials:,}; split the search into experiments"
        )
    if config.max_concurrent_trials > MAX_CONCURRENT_TRIALS:
        bad(
            "max_concurrent_trials",
            f"must be at most {MAX_CONCURRENT_TRIALS:,} (trials running or queued at once), "
            f"got {config.max_concurrent_trials:,}",
        )
    if "sampler" in options:
        sampler = options["sampler"]
        if sampler not in SAMPLERS:
            bad("sampler", f"expected one of {' | '.join(SAMPLERS)}, got {sampler!r}")
        elif name == "bayesian" and sampler != "tpe":
            bad("sampler", "bayesian is random search with the tpe sampler; use name: random")
    if "random_fraction" in options:
        fraction = options["random_fraction"]
        if options.get("sampler") != "bohb":
            bad("random_fraction", "is a setting of the bohb sampler; add sampler: bohb")
        elif (
            isinstance(fraction, bool)
            or not isinstance(fraction, int | float)
            or not 0 <= fraction <= 1
        ):
            bad(
                "random_fraction",
                f"expected a number from 0 to 1 (the share of trials sampled at random; "
                f"default 1/3), got {fraction!r}",
            )
    _check_divisor(options, bad)
    _check_int(options, "num_rungs", 1, bad)
    _check_int(options, "max_rungs", 1, bad)
    for key in ("num_rungs", "max_rungs"):
        if is_int(options.get(key)) and options[key] > MAX_RUNGS:
            bad(key, f"must be at most {MAX_RUNGS}, got {options[key]}")
    if "mode" in options and options["mode"] not in MODES:
        bad("mode", f"expected one of {' | '.join(MODES)}, got {options['mode']!r}")
    divisor = options.get("divisor", DEFAULT_DIVISOR)
    if problems:
        return problems
    batches = config.max_length.value if config.max_length.unit is LengthUnit.BATCHES else None
    num_rungs, max_rungs = options.get("num_rungs"), options.get("max_rungs")
    if num_rungs is not None and max_rungs is not None and num_rungs > max_rungs:
        bad("num_rungs", f"({num_rungs}) must not exceed max_rungs ({max_rungs})")
    if (
        num_rungs is not None
        and batches is not None
        and batches < exact(divisor) ** (num_rungs - 1)
    ):
        bad("num_rungs", _too_short(num_rungs, divisor, batches))
    if "bracket_rungs" in options:
        _check_brackets(options["bracket_rungs"], divisor, batches, config.max_trials, bad)
    if name == "grid":
        problems.extend(_grid_problems(space))
    return problems


def custom_problems(config: SearcherConfig) -> list[str]:
    """Every problem with a custom searcher's keys: it optimises one metric (its
    `SearchMethod` is told that metric's value) and may bound the trials it creates."""
    problems: list[str] = []
    if config.objectives:
        problems.append(
            "searcher.metrics: the custom searcher's SearchMethod is told one metric per "
            "validation; give searcher.metric (and smaller_is_better)"
        )
    if config.time_metric is not None:
        problems.append(
            "searcher.time_metric: the custom searcher's lengths are batches; give "
            "max_length (optional) instead of max_time"
        )
    if config.max_trials is not None and config.max_trials > MAX_TRIALS:
        problems.append(
            f"searcher: max_trials must be at most {MAX_TRIALS:,} (the largest search the "
            f"master runs), got {config.max_trials:,}"
        )
    return problems


def _multi_objective_problems(config: SearcherConfig) -> list[str]:
    """Why `config`'s searcher cannot optimise several metrics, if it cannot."""
    name, sampler = config.name, config.options.get("sampler", "random")
    if name not in MULTI_OBJECTIVE_SEARCHERS:
        why = (
            "a single trial has no trade-off to search"
            if name == "single"
            else "its early stopping ranks trials on one metric, and several metrics give "
            "no one order"
        )
        return [
            f"searcher.metrics: the {name} searcher takes one metric ({why}); use name: "
            f"random (sampler: tpe for a multi-objective model), bayesian or grid, or "
            f"give searcher.metric"
        ]
    if sampler == "bohb":
        return [
            "searcher.metrics: the bohb sampler models one metric's rungs; use sampler: tpe "
            "(multi-objective) or random"
        ]
    return []


def _check_divisor(options: Mapping[str, Any], bad: Any) -> None:
    if "divisor" not in options:
        return
    value = options["divisor"]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        bad("divisor", f"expected a number greater than 1 (e.g. 4 or 2.5), got {value!r}")
    elif value <= 1:
        bad(
            "divisor",
            f"must be greater than 1 (each rung keeps 1/divisor of the one below), got {value}",
        )


def _check_int(options: Mapping[str, Any], key: str, minimum: int, bad: Any) -> None:
    if key not in options:
        return
    value = options[key]
    if not is_int(value):
        bad(key, f"expected an integer >= {minimum}, got {value!r}")
    elif value < minimum:
        bad(key, f"must be at least {minimum}, got {value}")


def _too_short(rungs: int, divisor: Divisor, batches: int) -> str:
    return (
        f"{rungs} rungs with divisor {divisor} need max_length >= "
        f"{math.ceil(exact(divisor) ** (rungs - 1))} "
        f"batches (divisor**(rungs-1)) so that each rung trains longer than the one below; "
        f"got {batches}"
    )


def _check_brackets(
    value: Any, divisor: Divisor, batches: int | None, max_trials: int | None, bad: Any
) -> None:
    if isinstance(value, list) and not value:
        return  # Determined's `bracket_rungs: []`: the mode's brackets
    if not isinstance(value, list) or not all(is_int(r) and 1 <= r <= MAX_RUNGS for r in value):
        bad("bracket_rungs", f"expected a list of integers from 1 to {MAX_RUNGS}, got {value!r}")
    elif len(set(value)) != len(value):
        bad("bracket_rungs", f"has a bracket twice: {value!r}")
    elif batches is not None and batches < exact(divisor) ** (max(value) - 1):
        bad("bracket_rungs", _too_short(max(value), divisor, batches))
    elif max_trials is not None and max_trials < len(value):
        bad("bracket_rungs", f"{len(value)} brackets need max_trials >= {len(value)}")


def _grid_problems(space: Mapping[str, HParam]) -> list[str]:
    problems = []
    for path, hp in leaves(space):
        if isinstance(hp, Double | Log) and hp.count is None:
            kind = "double" if isinstance(hp, Double) else "log"
            problems.append(
                f"hyperparameters.{'.'.join(path)}: grid search needs `count` on a {kind} "
                f"hyperparameter (how many evenly spaced values to try)"
            )
    if not problems:
        size = grid_size(space)
        if size > MAX_GRID_POINTS:
            problems.append(
                f"hyperparameters: the grid has {size:,} points, more than {MAX_GRID_POINTS:,}; "
                f"lower the counts (an int without count is every integer of its range)"
            )
    return problems


# --- the resolved plan --------------------------------------------------------------------


@dataclass(frozen=True)
class BracketSpec:
    """One bracket of successive halving: its rungs' lengths, trials and concurrency.

    `max_concurrent_trials` is the most trials of the bracket that run (or wait for slots)
    at once; `search_spec` gives every bracket a limit from 1 to MAX_CONCURRENT_TRIALS
    (0, unlimited, only in a spec built in code). Single, grid and random searches are
    one bracket of one rung.
    """

    lengths: tuple[int, ...]
    max_trials: int
    max_concurrent_trials: int

    @property
    def num_rungs(self) -> int:
        return len(self.lengths)


@dataclass(frozen=True)
class SearchSpec:
    """A searcher config resolved: defaults applied, rungs capped, trials split."""

    name: str
    sampler: str  # "random" | "tpe" | "bohb" | "grid" (the grid's points, in order)
    divisor: Divisor
    brackets: tuple[BracketSpec, ...]
    max_concurrent_trials: int  # across brackets; 0 = only the brackets' own limits
    unit: str
    max_length: int
    random_fraction: float = DEFAULT_RANDOM_FRACTION  # the bohb sampler's


def search_spec(config: SearcherConfig, space: Mapping[str, HParam]) -> SearchSpec:
    """Resolve `config`; raise ValueError listing every problem of its options.

    Concurrency is always bounded, so that the master creates trials as slots for them
    free up, never a whole search at once: grid, random and bayesian default to
    DEFAULT_MAX_CONCURRENT_TRIALS, and no default exceeds MAX_CONCURRENT_TRIALS.
    """
    problems = searcher_problems(config, space)
    if problems:
        raise ValueError("; ".join(problems))
    options = config.options
    divisor: Divisor = options.get("divisor", DEFAULT_DIVISOR)
    length = config.max_length.value
    concurrent = config.max_concurrent_trials
    max_trials = config.max_trials or 1
    name = config.name
    sampler = "tpe" if name == "bayesian" else str(options.get("sampler", "random"))
    flat = concurrent or DEFAULT_MAX_CONCURRENT_TRIALS
    if name == "single":
        brackets: tuple[BracketSpec, ...] = (BracketSpec((length,), 1, 1),)
    elif name == "grid":
        sampler = "grid"
        brackets = (BracketSpec((length,), grid_count(space), flat),)
    elif name in ("random", "bayesian"):
        brackets = (BracketSpec((length,), max_trials, flat),)
    elif name == "asha":
        rungs = options.get("num_rungs") or min(
            options.get("max_rungs", DEFAULT_MAX_RUNGS),
            rungs_that_fit(length, divisor),
            rungs_that_fit(max_trials, divisor),
        )
        default = max(min(math.floor(exact(divisor) ** (rungs - 1)), max_trials), 1)
        default = min(default, MAX_CONCURRENT_TRIALS)
        brackets = (
            BracketSpec(rung_lengths(length, divisor, rungs), max_trials, concurrent or default),
        )
    elif name == "adaptive_asha":
        brackets = _adaptive(options, divisor, length, max_trials, concurrent)
    else:
        raise ValueError(f"searcher.name: unknown searcher {name!r}")
    overall = concurrent if len(brackets) > 1 else 0
    if sum(b.max_concurrent_trials for b in brackets) > MAX_CONCURRENT_TRIALS:
        overall = MAX_CONCURRENT_TRIALS  # many brackets, each at its own default
    return SearchSpec(
        name=name,
        sampler=sampler,
        divisor=divisor,
        brackets=brackets,
        max_concurrent_trials=overall,
        unit=config.max_length.unit.value,
        max_length=length,
        random_fraction=float(options.get("random_fraction", DEFAULT_RANDOM_FRACTION)),
    )


def grid_count(space: Mapping[str, HParam]) -> int:
    """The number of points of the grid (int duplicates removed), without listing them."""
    return math.prod(len(grid_values(hp)) for _, hp in leaves(space))


def _adaptive(
    options: Mapping[str, Any], divisor: Divisor, length: int, max_trials: int, concurrent: int
) -> tuple[BracketSpec, ...]:
    rungs = options.get("bracket_rungs") or None  # [] is Determined's "the default"
    if rungs is None:
        max_rungs = min(
            options.get("max_rungs", DEFAULT_MAX_RUNGS),
            rungs_that_fit(length, divisor),
            rungs_that_fit(max_trials, divisor),
        )
        rungs = mode_brackets(options.get("mode", DEFAULT_MODE), max_rungs)
    # The brackets that stop most trials early go first: they pay off soonest.
    ordered = sorted(rungs, reverse=True)[:max_trials]
    trials = bracket_max_trials(max_trials, divisor, ordered)
    limits = bracket_max_concurrent(concurrent, divisor, trials)
    return tuple(
        BracketSpec(rung_lengths(length, divisor, r), t, c)
        for r, t, c in zip(ordered, trials, limits, strict=True)
    )


# --- the preview --------------------------------------------------------------------------


@dataclass(frozen=True)
class RungPreview:
    length: int
    trials: int


@dataclass(frozen=True)
class BracketPreview:
    num_rungs: int
    max_trials: int
    max_concurrent_trials: int
    rungs: tuple[RungPreview, ...]
    budget: int


@dataclass(frozen=True)
class RoundPreview:
    """A pbt round: its trials (`new_trials` of them created for it, copies of better
    ones after the first), the length all of them reach by its end, and its budget."""

    round: int
    trials: int
    new_trials: int
    length: int
    budget: int


@dataclass(frozen=True)
class Preview:
    """What a search will run, computed from the rung arithmetic alone (nothing runs):
    trials per bracket and rung, lengths per rung and the total budget, in `unit`."""

    searcher: str
    sampler: str
    unit: str
    max_length: int
    divisor: Divisor
    max_concurrent_trials: int
    brackets: tuple[BracketPreview, ...]
    total_trials: int
    total_budget: int
    rounds: tuple[RoundPreview, ...] = ()  # pbt's (its brackets are empty)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def preview(config: SearcherConfig, space: Mapping[str, HParam]) -> Preview:
    """The plan of `config` over `space`; raises ValueError for invalid options, and for
    the custom searcher, whose plan comes from user code."""
    if config.name == "custom":
        raise ValueError(
            "searcher custom: the plan comes from user code (a SearchMethod run by "
            "assay.client.searcher), not from the config"
        )
    if config.name == "pbt":
        return _pbt_preview(pbt_spec(config))
    spec = search_spec(config, space)
    brackets = []
    for b in spec.brackets:
        counts = trials_per_rung(b.max_trials, spec.divisor, b.num_rungs)
        budget, below = 0, 0
        for length, count in zip(b.lengths, counts, strict=True):
            budget += count * (length - below)
            below = length
        rungs = tuple(RungPreview(n, c) for n, c in zip(b.lengths, counts, strict=True))
        brackets.append(
            BracketPreview(b.num_rungs, b.max_trials, b.max_concurrent_trials, rungs, budget)
        )
    return Preview(
        searcher=spec.name,
        sampler=spec.sampler,
        unit=spec.unit,
        max_length=spec.max_length,
        divisor=spec.divisor,
        max_concurrent_trials=spec.max_concurrent_trials,
        brackets=tuple(brackets),
        total_trials=sum(b.max_trials for b in brackets),
        total_budget=sum(b.budget for b in brackets),
    )


def _pbt_preview(spec: PBTSpec) -> Preview:
    length = spec.length_per_round
    rounds = tuple(
        RoundPreview(
            round=r,
            trials=spec.population_size,
            new_trials=spec.population_size if r == 0 else spec.replaced_per_round,
            length=(r + 1) * length,
            budget=spec.population_size * length,
        )
        for r in range(spec.num_rounds)
    )
    return Preview(
        searcher="pbt",
        sampler="random",
        unit=spec.unit,
        max_length=spec.num_rounds * length,
        divisor=1,
        max_concurrent_trials=spec.population_size,
        brackets=(),
        total_trials=sum(r.new_trials for r in rounds),
        total_budget=sum(r.budget for r in rounds),
        rounds=rounds,
    )
