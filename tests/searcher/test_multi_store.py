"""A multi-objective experiment's vectors and Pareto points read from a real store (SQLite
and PostgreSQL): final validations, missing metrics, superseded rows, the response."""

from __future__ import annotations

import math

from assay.config import Objective
from assay.master.store import MetricReport, Store
from assay.master.telemetry import fill_pareto, objectives_of, pareto_points, validation_vector
from assay.proto import api_pb2
from tests.store import _seed as seed
from tests.store.conftest import db_url, postgres_url, store  # noqa: F401

OBJECTIVES = (Objective("loss"), Objective("acc", smaller_is_better=False))
CONFIG = {
    "searcher": {
        "name": "random",
        "metrics": [{"name": "loss"}, {"name": "acc", "smaller_is_better": False}],
    }
}


def _trial(db: Store, experiment_id: int, rid: str) -> tuple[int, int]:
    trial_id = seed.trial(db, experiment_id, request_id=rid)
    return trial_id, seed.start_run(db, trial_id)


def _validate(db: Store, trial_id: int, run_id: int, batches: int, **metrics: float) -> None:
    db.report_metrics(trial_id, run_id, "validation", [MetricReport(batches, metrics)])


def test_vectors_and_points(store: Store) -> None:  # noqa: F811
    eid = seed.experiment(store, config=CONFIG)
    a, ra = _trial(store, eid, "t0")
    b, rb = _trial(store, eid, "t1")
    c, rc = _trial(store, eid, "t2")
    d, rd = _trial(store, eid, "t3")
    _trial(store, eid, "t4")  # never validated: no point
    _validate(store, a, ra, 4, loss=0.5, acc=0.7)
    _validate(store, a, ra, 8, loss=0.2, acc=0.9)  # its final validation
    _validate(store, b, rb, 8, loss=0.1, acc=0.8)
    _validate(store, c, rc, 8, loss=0.3, acc=0.6)  # dominated by a
    _validate(store, d, rd, 8, loss=0.05)  # no acc: ranks last

    assert validation_vector(store, a, 4, ["loss", "acc"]) == [0.5, 0.7]
    assert validation_vector(store, d, 8, ["loss", "acc"]) == [0.05, None]
    # A target the script validated past: its latest validation.
    assert validation_vector(store, b, 6, ["loss", "acc"]) == [0.1, 0.8]

    points = pareto_points(store, eid, OBJECTIVES)
    assert [(p.trial_id, p.values, p.rank, p.on_front) for p in points] == [
        (a, (0.2, 0.9), 0, True),
        (b, (0.1, 0.8), 0, True),
        (c, (0.3, 0.6), 1, False),
        (d, (0.05, None), 2, False),
    ]
    assert pareto_points(store, eid, ()) == []

    response = api_pb2.GetExperimentResponse()
    fill_pareto(store, eid, CONFIG, response)
    assert [(o.name, o.smaller_is_better) for o in response.objectives] == [
        ("loss", True),
        ("acc", False),
    ]
    assert [p.trial_id for p in response.pareto_points if p.on_front] == [a, b]
    assert math.isnan(response.pareto_points[3].values[1])


def test_a_restarted_trial_counts_its_new_run(store: Store) -> None:  # noqa: F811
    eid = seed.experiment(store, config=CONFIG)
    t, run = _trial(store, eid, "t0")
    _validate(store, t, run, 8, loss=0.9, acc=0.1)
    run = seed.start_run(store, t, restored_batches=4)  # rows past batch 4 superseded
    assert validation_vector(store, t, 8, ["loss", "acc"]) == [None, None]
    _validate(store, t, run, 8, loss=0.4, acc=0.5)
    assert validation_vector(store, t, 8, ["loss", "acc"]) == [0.4, 0.5]
    assert [p.values for p in pareto_points(store, eid, OBJECTIVES)] == [(0.4, 0.5)]


def test_a_trials_point_is_one_validation_its_final_not_its_best_per_metric(
    store: Store,  # noqa: F811
) -> None:
    # The docs' choice (docs/search.md): a point is the vector of one validation, the
    # trial's last (as Optuna takes the values a trial reports as its result). Each
    # metric's best would mix validations into a point the model never reached: here
    # (0.1, 0.9), on the front.
    eid = seed.experiment(store, config=CONFIG)
    a, ra = _trial(store, eid, "t0")
    b, rb = _trial(store, eid, "t1")
    _validate(store, a, ra, 4, loss=0.1, acc=0.5)  # its best loss
    _validate(store, a, ra, 8, loss=0.3, acc=0.9)  # its best acc
    _validate(store, a, ra, 12, loss=0.4, acc=0.6)  # its final validation
    _validate(store, b, rb, 12, loss=0.2, acc=0.7)
    points = pareto_points(store, eid, OBJECTIVES)
    assert [(p.trial_id, p.total_batches, p.values, p.on_front) for p in points] == [
        (a, 12, (0.4, 0.6), False),
        (b, 12, (0.2, 0.7), True),
    ]
    # The searcher is told the same vector at that validation.
    assert validation_vector(store, a, 12, ["loss", "acc"]) == [0.4, 0.6]


def test_one_metric_configs_have_no_objectives() -> None:
    assert objectives_of({"searcher": {"name": "random", "metric": "loss"}}) == ()
    assert objectives_of({}) == ()
    assert objectives_of(CONFIG) == OBJECTIVES
