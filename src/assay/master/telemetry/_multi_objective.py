"""A multi-objective experiment's metric vectors, read from the store: what the searcher
is fed at each validation, and the Pareto front the experiment reports.

A trial's point is its final validation: the metrics of its latest validation report
that holds any of the objectives (a metric it did not report is missing, and a point with
a missing or non-finite metric ranks after every complete one, off the front). Values
are kept as reported; ranks compare them smaller-is-better per the config.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from assay.config import Objective, parse_objectives
from assay.master.searcher import orient, pareto_ranks
from assay.master.store import Metric, StoreBase, Trial

VALIDATION = "validation"


def validation_vector(
    store: StoreBase, trial_id: int, total_batches: int, names: Sequence[str]
) -> list[float | None]:
    """The trial's validation metrics `names` at `total_batches` (None where missing),
    from its latest run that reported them; a script that validated past its target
    (it reports the target as done) gives its latest validation's."""
    with store.read() as s:
        rows = s.execute(
            select(Metric.total_batches, Metric.name, Metric.value)
            .where(
                Metric.trial_id == trial_id,
                Metric.group == VALIDATION,
                Metric.name.in_(list(names)),
                Metric.superseded.is_(False),
            )
            .order_by(Metric.total_batches, Metric.run_id)
        ).all()
    at = [r for r in rows if r[0] == total_batches] or [r for r in rows if r[0] == rows[-1][0]]
    values = {name: value for _, name, value in at}  # the latest run's value wins
    return [values.get(name) for name in names]


@dataclass(frozen=True)
class ParetoPoint:
    """One trial's final validation vector and its non-domination rank (0: on the front)."""

    trial_id: int
    total_batches: int
    values: tuple[float | None, ...]
    rank: int

    @property
    def on_front(self) -> bool:
        return self.rank == 0 and all(v is not None for v in self.values)


def pareto_points(
    store: StoreBase, experiment_id: int, objectives: Sequence[Objective]
) -> list[ParetoPoint]:
    """Every validated trial of the experiment as a point, by trial id; empty without
    objectives."""
    if not objectives:
        return []
    names = [o.name for o in objectives]
    with store.read() as s:
        rows = s.execute(
            select(Metric.trial_id, Metric.total_batches, Metric.run_id, Metric.name, Metric.value)
            .join(Trial, Trial.id == Metric.trial_id)
            .where(
                Trial.experiment_id == experiment_id,
                Metric.group == VALIDATION,
                Metric.name.in_(names),
                Metric.superseded.is_(False),
            )
            .order_by(Metric.trial_id, Metric.total_batches, Metric.run_id)
        ).all()
    final: dict[int, tuple[int, dict[str, float | None]]] = {}
    for trial_id, batches, _, name, value in rows:
        latest = final.get(trial_id)
        if latest is None or batches > latest[0]:
            final[trial_id] = latest = (batches, {})
        latest[1][name] = value
    ids = sorted(final)
    vectors = [tuple(final[t][1].get(n) for n in names) for t in ids]
    oriented = [orient(v, [o.smaller_is_better for o in objectives]) for v in vectors]
    ranks = pareto_ranks(oriented)
    return [ParetoPoint(t, final[t][0], v, r) for t, v, r in zip(ids, vectors, ranks, strict=True)]


def objectives_of(config: Mapping[str, Any]) -> tuple[Objective, ...]:
    """The objectives of a stored (already validated) experiment config; () for one metric."""
    searcher = config.get("searcher")
    raw = searcher.get("metrics") if isinstance(searcher, Mapping) else None
    if raw is None:
        return ()
    objectives, _ = parse_objectives(raw)
    return objectives


def fill_pareto(
    store: StoreBase, experiment_id: int, config: Mapping[str, Any], response: Any
) -> None:
    """Set a GetExperimentResponse's `objectives` and `pareto_points`."""
    from assay.proto import api_pb2

    objectives = objectives_of(config)
    for o in objectives:
        response.objectives.append(
            api_pb2.Objective(name=o.name, smaller_is_better=o.smaller_is_better)
        )
    for p in pareto_points(store, experiment_id, objectives):
        response.pareto_points.append(
            api_pb2.ParetoPoint(
                trial_id=p.trial_id,
                total_batches=p.total_batches,
                values=[math.nan if v is None else v for v in p.values],
                rank=p.rank,
                on_front=p.on_front,
            )
        )
