"""Multi-objective search: Pareto ranks of metric vectors, and Optuna's multi-objective TPE.

A search with `searcher.metrics` feeds its searcher one vector per validation (each metric
in the config's order). Vectors are compared smaller-is-better after `orient` flips the
metrics that are larger-is-better. A point dominates another when it is no worse in every
metric and better in one; the Pareto front is the points nothing dominates. Equal points
do not dominate each other, so ties share a rank. A vector with a missing or non-finite
metric cannot be compared: it ranks after every complete one.

`MultiTPESampler` is `TPESampler` over vectors: every proposal rebuilds an Optuna study
with one "minimize" direction per metric from the plain-JSON history, so the snapshot
stays JSON and a restored searcher proposes what the original would have.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from assay.config import HParam

from ._samplers import derive_seed
from ._tpe import TPESampler, _distribution, _Leaf, _optuna


def orient(values: Sequence[float | None], smaller_is_better: Sequence[bool]) -> list[float]:
    """`values` as smaller-is-better; a missing or non-finite value becomes NaN."""
    out = []
    for value, smaller in zip(values, smaller_is_better, strict=True):
        v = float(value) if value is not None else math.nan
        out.append((v if smaller else -v) if math.isfinite(v) else math.nan)
    return out


def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    """`a` is no worse than `b` in every (smaller-is-better) metric and better in one."""
    return all(x <= y for x, y in zip(a, b, strict=True)) and any(
        x < y for x, y in zip(a, b, strict=True)
    )


def pareto_ranks(points: Sequence[Sequence[float]]) -> list[int]:
    """Each point's non-domination rank (0: the Pareto front; rank k: the front once ranks
    below k are removed). Points with a NaN share the rank after the last complete one."""
    complete = [i for i, p in enumerate(points) if all(math.isfinite(x) for x in p)]
    ranks = [0] * len(points)
    left, rank = set(complete), 0
    while left:
        front = {i for i in left if not any(dominates(points[j], points[i]) for j in left)}
        for i in front:
            ranks[i] = rank
        left -= front
        rank += 1
    for i in set(range(len(points))) - set(complete):
        ranks[i] = rank
    return ranks


def pareto_front(points: Sequence[Sequence[float]]) -> list[int]:
    """Indices, in order, of the complete points no other point dominates."""
    ranks = pareto_ranks(points)
    return [
        i
        for i, (p, r) in enumerate(zip(points, ranks, strict=True))
        if r == 0 and all(math.isfinite(x) for x in p)
    ]


class MultiTPESampler(TPESampler):
    """TPE over several metrics (Optuna's multi-objective TPE); `observe` takes a vector
    of smaller-is-better values, None when one of them is not finite."""

    def __init__(self, space: Mapping[str, HParam], seed: int, num_objectives: int) -> None:
        super().__init__(space, seed)
        self._num_objectives = num_objectives

    def _ask(self, index: int, searched: Mapping[str, _Leaf]) -> dict[str, Any]:
        optuna = _optuna()
        distributions = {name: _distribution(optuna, hp) for name, hp in searched.items()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.TPESampler(
                seed=derive_seed(self._seed, "tpe", index), multivariate=True
            )
            study = optuna.create_study(
                directions=["minimize"] * self._num_objectives, sampler=sampler
            )
            for entry in self.history.values():
                if entry["value"] is not None:
                    study.add_trial(
                        optuna.trial.create_trial(
                            params=entry["params"],
                            distributions=distributions,
                            values=list(entry["value"]),
                        )
                    )
            trial = study.ask(distributions)
        return {name: trial.params[name] for name in distributions}

    def observe_vector(self, request_id: str, length: int, values: Sequence[float]) -> None:
        """A validation's smaller-is-better vector (NaN where a metric is missing)."""
        complete = all(math.isfinite(v) for v in values)
        self.observe(request_id, length, None)
        entry = self.history.get(request_id)
        if entry is not None and entry["length"] == length and complete:
            entry["value"] = [float(v) for v in values]
