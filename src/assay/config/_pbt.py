"""Population-based training's plan: the `pbt` searcher's keys checked and resolved.

After each round of `length_per_round` but the last, the worst `truncate_fraction` of the
population are closed and replaced by copies of the best (exploit), whose hyperparameters
are perturbed or redrawn (explore); the master's `assay.master.searcher._pbt` runs it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from assay.config._searcher_config import (
    MAX_CONCURRENT_TRIALS,
    MAX_TRIALS,
    SearcherConfig,
    is_int,
)

PBT_KEYS = ("population_size", "num_rounds", "replace_function", "explore_function")
"""`searcher` keys of pbt kept in `SearcherConfig.options` (`length_per_round` becomes
its `max_length`)."""
PBT_DEFAULTS = {"truncate_fraction": 0.25, "resample_probability": 0.25, "perturb_factor": 0.2}
MAX_PBT_ROUNDS = 10_000


@dataclass(frozen=True)
class PBTSpec:
    """A pbt search resolved: `population_size` trials train `length_per_round` units per
    round for `num_rounds` rounds; after each round but the last, the worst
    `truncate_fraction` are closed and replaced by copies of the best (exploit), whose
    hyperparameters are perturbed (explore)."""

    population_size: int
    num_rounds: int
    length_per_round: int
    truncate_fraction: float
    resample_probability: float
    perturb_factor: float
    unit: str = "batches"

    @property
    def replaced_per_round(self) -> int:
        """How many of the worst trials each round closes and replaces (at most all but
        one: the best always goes on)."""
        return min(
            math.floor(self.truncate_fraction * self.population_size), self.population_size - 1
        )


def pbt_problems(config: SearcherConfig) -> list[str]:
    """Every problem with a pbt searcher's keys, as `key.path: what to fix`."""
    problems: list[str] = []
    options = config.options

    def bad(key: str, message: str) -> None:
        problems.append(f"searcher.{key}: {message}")

    for key, minimum, maximum, what in (
        ("population_size", 2, MAX_CONCURRENT_TRIALS, "trials trained at once"),
        ("num_rounds", 1, MAX_PBT_ROUNDS, "rounds of training, exploit and explore"),
    ):
        value = options.get(key)
        if value is None:
            bad(key, f"is required for the pbt searcher ({what}), e.g. {key}: {minimum * 4}")
        elif not is_int(value) or not minimum <= value <= maximum:
            bad(key, f"expected an integer from {minimum} to {maximum:,} ({what}), got {value!r}")
    for group, keys in (
        ("replace_function", ("truncate_fraction",)),
        ("explore_function", ("resample_probability", "perturb_factor")),
    ):
        section = options.get(group, {})
        if not isinstance(section, Mapping):
            bad(group, f"expected a mapping of {', '.join(keys)}, got {section!r}")
            continue
        for extra in sorted(set(section) - set(keys), key=str):
            bad(f"{group}.{extra}", f"unknown key; {group} takes {', '.join(keys)}")
        for key in keys:
            if key in section:
                problem = _fraction_problem(key, section[key])
                if problem:
                    bad(f"{group}.{key}", problem)
    if problems:
        return problems
    spec = pbt_spec_of(config)
    if spec.replaced_per_round == 0 and spec.num_rounds > 1:
        bad(
            "replace_function.truncate_fraction",
            f"replaces no trial: {spec.truncate_fraction} of a population of "
            f"{spec.population_size} is less than one; raise it to at least "
            f"{1 / spec.population_size:.3g}",
        )
    trials = spec.population_size + (spec.num_rounds - 1) * spec.replaced_per_round
    if trials > MAX_TRIALS:
        problems.append(
            f"searcher: pbt would create {trials:,} trials, more than {MAX_TRIALS:,}; "
            f"lower num_rounds or population_size"
        )
    return problems


def _fraction_problem(key: str, value: Any) -> str | None:
    """What is wrong with a pbt fraction: truncate_fraction in (0, 0.5],
    resample_probability in [0, 1], perturb_factor in (0, 1)."""
    what = {
        "truncate_fraction": "the share of the population replaced each round",
        "resample_probability": "the chance each hyperparameter is redrawn",
        "perturb_factor": "a numeric hyperparameter is multiplied by 1 +- it",
    }[key]
    interval = {
        "truncate_fraction": "(0, 0.5]",
        "resample_probability": "[0, 1]",
        "perturb_factor": "(0, 1)",
    }[key]
    number = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
    if number and key == "truncate_fraction":
        ok = 0 < value <= 0.5
    elif number and key == "resample_probability":
        ok = 0 <= value <= 1
    else:
        ok = number and 0 < value < 1
    return None if ok else f"expected a number in {interval} ({what}), got {value!r}"


def pbt_spec_of(config: SearcherConfig) -> PBTSpec:
    """The pbt plan of `config` (its options checked by `pbt_problems`); `max_length` is the
    length of one round."""
    options = config.options
    replace = dict(options.get("replace_function") or {})
    explore = dict(options.get("explore_function") or {})
    return PBTSpec(
        population_size=int(options["population_size"]),
        num_rounds=int(options["num_rounds"]),
        length_per_round=config.max_length.value,
        truncate_fraction=float(
            replace.get("truncate_fraction", PBT_DEFAULTS["truncate_fraction"])
        ),
        resample_probability=float(
            explore.get("resample_probability", PBT_DEFAULTS["resample_probability"])
        ),
        perturb_factor=float(explore.get("perturb_factor", PBT_DEFAULTS["perturb_factor"])),
        unit=config.max_length.unit.value,
    )


def pbt_spec(config: SearcherConfig) -> PBTSpec:
    """`pbt_spec_of` after checking; raise ValueError listing every problem."""
    problems = pbt_problems(config)
    if problems:
        raise ValueError("; ".join(problems))
    return pbt_spec_of(config)
