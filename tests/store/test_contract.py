"""The store's contract, run on SQLite and PostgreSQL alike (see conftest.py)."""

from __future__ import annotations

import math
import threading
import time

import pytest
from sqlalchemy import func, select

from assay.master.errors import ConflictError, InvalidArgumentError, NotFoundError, StaleRunError
from assay.master.store import (
    CheckpointRecord,
    LogLine,
    Metric,
    MetricReport,
    MetricsReported,
    Store,
    WriteBatch,
)
from assay.master.store._curves import RAW_READ_LIMIT
from tests.store import _seed as seed

_trial = seed.trial_with_run


def _reports(batches: range, **values: float) -> list[MetricReport]:
    return [MetricReport(b, {k: v + b for k, v in values.items()}) for b in batches]


def _metric_rows(store: Store, trial_id: int) -> int:
    with store.read() as s:
        return int(s.execute(select(func.count()).where(Metric.trial_id == trial_id)).scalar_one())


# --- experiments ----------------------------------------------------------------------------


def test_experiment_round_trip(store: Store) -> None:
    eid = seed.experiment(
        store,
        name="mnist",
        owner="alice",
        config={"searcher": {"name": "single"}},
        model_definition=b"\x1f\x8b archive",
        labels=["b", "a", "a"],
        priority=7,
        description="d",
    )
    e = store.get_experiment(eid)
    assert (e.name, e.owner, e.state, e.labels, e.priority) == (
        "mnist",
        "alice",
        "ACTIVE",
        ("a", "b"),
        7,
    )
    assert e.config == {"searcher": {"name": "single"}}
    assert store.get_model_definition(eid) == b"\x1f\x8b archive"
    store.update_experiment(eid, state="PAUSED", progress=0.5, searcher_state={"k": [1, 2]})
    e = store.get_experiment(eid)
    assert (e.state, e.progress, e.searcher_state) == ("PAUSED", 0.5, {"k": [1, 2]})
    with pytest.raises(InvalidArgumentError, match="cannot update experiment fields"):
        store.update_experiment(eid, owner_id=3)
    with pytest.raises(NotFoundError, match="experiment 999 does not exist"):
        store.get_experiment(999)


def test_experiment_list_filters_sorts_and_pages(store: Store) -> None:
    ids = []
    for i, (name, owner, state) in enumerate(
        [
            ("mnist-asha", "alice", "ACTIVE"),
            ("mnist_grid", "bob", "COMPLETED"),
            ("cifar 100%", "alice", "PAUSED"),
            ("Robert'); DROP TABLE experiments;--", "carol", "ACTIVE"),
        ]
    ):
        eid = seed.experiment(
            store,
            name=name,
            owner=owner,
            state=state,
            labels=["vision"] if i < 3 else ["nlp"],
            priority=10 + i,
        )
        ids.append(eid)
    assert store.list_experiments().total == 4
    assert [e.id for e in store.list_experiments(states=["ACTIVE"]).items] == [ids[3], ids[0]]
    assert [
        e.name for e in store.list_experiments(name="MNIST", sort="name", descending=False).items
    ] == [
        "mnist-asha",
        "mnist_grid",
    ]
    # LIKE metacharacters are literal text, not patterns.
    assert [e.id for e in store.list_experiments(name="_").items] == [ids[1]]
    assert [e.id for e in store.list_experiments(name="100%").items] == [ids[2]]
    assert [e.id for e in store.list_experiments(name="DROP TABLE").items] == [ids[3]]
    assert {e.id for e in store.list_experiments(label="vision").items} == set(ids[:3])
    assert [e.id for e in store.list_experiments(owner="bob").items] == [ids[1]]
    page = store.list_experiments(sort="priority", descending=False, limit=2, offset=1)
    assert [e.priority for e in page.items] == [11, 12]
    assert page.total == 4
    by_owner = store.list_experiments(sort="owner", descending=False)
    assert [e.owner for e in by_owner.items] == ["alice", "alice", "bob", "carol"]
    with pytest.raises(InvalidArgumentError, match="cannot sort by 'name; --'"):
        store.list_experiments(sort="name; --")
    with pytest.raises(InvalidArgumentError, match="limit must be between 1 and 1000"):
        store.list_experiments(limit=0)
    assert store.list_experiments().total == 4  # nothing was dropped


# --- trials ---------------------------------------------------------------------------------


def test_trials_are_unique_per_request_and_runs_count_up(store: Store) -> None:
    eid, tid, run = _trial(store)
    with pytest.raises(Exception, match="(?i)unique|duplicate"):
        seed.trial(store, eid, request_id="exp-r1")
    assert run == 1
    assert seed.start_run(store, tid) == 2
    seed.set_trial(store, tid, state="COMPLETED", restarts=1, best_validation=0.25)
    t = store.get_trial(tid)
    assert (t.run_id, t.state, t.restarts, t.best_validation, t.hparams) == (
        2,
        "COMPLETED",
        1,
        0.25,
        {"lr": 0.1},
    )
    assert [x.id for x in store.list_trials(eid)] == [tid]
    with pytest.raises(InvalidArgumentError):
        WriteBatch().set_trial(tid, experiment_id=9)


# --- metrics: idempotent, fenced, superseded ------------------------------------------------


def test_a_resent_identical_report_is_a_noop(store: Store) -> None:
    _, tid, run = _trial(store)
    reports = _reports(range(10), loss=1.0, acc=0.0)
    assert store.report_metrics(tid, run, "training", reports) == 20
    assert store.report_metrics(tid, run, "training", reports) == 0
    assert (
        store.report_metrics(
            tid, run, "training", reports[3:5] + _reports(range(10, 12), loss=1.0, acc=0.0)
        )
        == 4
    )
    assert _metric_rows(store, tid) == 24


def test_a_resent_different_report_is_refused_and_changes_nothing(store: Store) -> None:
    _, tid, run = _trial(store)
    store.report_metrics(tid, run, "validation", [MetricReport(100, {"loss": 0.5})])
    batch = [MetricReport(200, {"loss": 0.4}), MetricReport(100, {"loss": 0.6})]
    with pytest.raises(
        ConflictError, match="already reported validation metric 'loss' at batch 100"
    ):
        store.report_metrics(tid, run, "validation", batch)
    # The whole batch is one transaction: batch 200 was not written either.
    assert store.trial_curve(tid, "loss") == [(100, 0.5)]


def test_conflicting_values_inside_one_request_are_refused(store: Store) -> None:
    _, tid, run = _trial(store)
    with pytest.raises(ConflictError, match="twice with different values"):
        store.report_metrics(
            tid, run, "training", [MetricReport(1, {"x": 1.0}), MetricReport(1, {"x": 2.0})]
        )


def test_reports_from_a_replaced_run_are_fenced_off(store: Store) -> None:
    _, tid, old = _trial(store)
    new = seed.start_run(store, tid)
    with pytest.raises(StaleRunError, match=f"on run {new}; a report from run {old}"):
        store.report_metrics(tid, old, "training", [MetricReport(1, {"loss": 1.0})])
    with pytest.raises(ConflictError, match=f"has no run {new + 1}"):
        store.report_metrics(tid, new + 1, "training", [MetricReport(1, {"loss": 1.0})])
    with pytest.raises(NotFoundError):
        store.report_metrics(12345, 1, "training", [MetricReport(1, {"loss": 1.0})])
    assert _metric_rows(store, tid) == 0


def test_bad_metric_values_are_refused(store: Store) -> None:
    _, tid, run = _trial(store)
    for bad in ("high", True, [1.0]):
        with pytest.raises(InvalidArgumentError, match="must be a number"):
            store.report_metrics(tid, run, "training", [MetricReport(1, {"loss": bad})])  # type: ignore[dict-item]
    for batches in (-1, 2**63):
        with pytest.raises(InvalidArgumentError, match="integer from 0 to"):
            store.report_metrics(tid, run, "training", [MetricReport(batches, {"loss": 1.0})])
    with pytest.raises(InvalidArgumentError, match="too large for a float"):
        store.report_metrics(tid, run, "training", [MetricReport(1, {"loss": 10**400})])
    with pytest.raises(InvalidArgumentError, match="group"):
        store.report_metrics(tid, run, "", [MetricReport(1, {"loss": 1.0})])


def test_nan_is_stored_as_a_gap(store: Store) -> None:
    _, tid, run = _trial(store)
    store.report_metrics(
        tid,
        run,
        "training",
        [
            MetricReport(1, {"loss": 1.0}),
            MetricReport(2, {"loss": math.nan}),
            MetricReport(3, {"loss": math.inf}),
        ],
    )
    assert store.trial_curve(tid, "loss", group="training") == [(1, 1.0), (3, math.inf)]
    # a re-sent NaN is the same report
    assert store.report_metrics(tid, run, "training", [MetricReport(2, {"loss": math.nan})]) == 0


def test_restore_supersedes_metrics_past_the_checkpoint(store: Store) -> None:
    _, tid, run1 = _trial(store)
    store.report_metrics(tid, run1, "training", _reports(range(1, 11), loss=0.0))
    run2 = seed.start_run(store, tid, restored_batches=6)
    assert store.get_trial(tid).total_batches == 6
    assert [b for b, _ in store.trial_curve(tid, "loss", group="training")] == [1, 2, 3, 4, 5, 6]
    store.report_metrics(tid, run2, "training", _reports(range(7, 11), loss=100.0))
    curve = store.trial_curve(tid, "loss", group="training")
    assert curve == [(b, float(b)) for b in range(1, 7)] + [(b, 100.0 + b) for b in range(7, 11)]
    assert _metric_rows(store, tid) == 14  # superseded rows are kept, not deleted
    again = WriteBatch()
    again.supersede_metrics(tid, 100)  # idempotent: nothing past 100
    store.apply(again)
    assert store.trial_curve(tid, "loss", group="training") == curve


def test_a_rolled_back_runs_best_is_no_longer_the_trials_best(store: Store) -> None:
    """A run reported val 0.0001 at batch 30, then crashed; the next restores batch 20
    and reports 0.56 at 30: the trial's best is what is still live."""
    _, tid, run1 = _trial(store)
    for batches, value in ((10, 0.9), (20, 0.76), (30, 0.0001)):
        store.report_metrics_and_progress(
            tid,
            run1,
            "validation",
            [MetricReport(batches, {"vloss": value})],
            searcher_metric="vloss",
        )
    assert store.get_trial(tid).best_validation == 0.0001
    batch = WriteBatch()
    batch.set_trial(tid, run_id=run1 + 1, total_batches=20, best_validation=None)
    batch.supersede_metrics(tid, 20, "vloss", smaller_is_better=True)
    store.apply(batch)
    assert store.get_trial(tid).best_validation == 0.76
    done = store.report_metrics_and_progress(
        tid, run1 + 1, "validation", [MetricReport(30, {"vloss": 0.56})], searcher_metric="vloss"
    )
    assert done.best_validation == 0.56
    assert store.get_trial(tid).best_validation == 0.56


def test_a_report_of_thousands_of_rows_is_one_transaction(store: Store) -> None:
    _, tid, run = _trial(store)
    store.report_metrics(tid, run, "training", [MetricReport(2999, {"m": 0.0})])
    batch = _reports(range(3000), m=1.0)  # batch 2999 conflicts with the stored value
    with pytest.raises(ConflictError):
        store.report_metrics(tid, run, "training", batch)
    assert _metric_rows(store, tid) == 1
    assert store.report_metrics(tid, run, "training", batch[:2999]) == 2999


# --- metrics: the trial's progress, in the report's transaction ------------------------------


def _validate(
    store: Store, tid: int, run: int, *points: tuple[int, float], smaller: bool = True
) -> MetricsReported:
    reports = [MetricReport(b, {"loss": v, "other": -1e9}) for b, v in points]
    return store.report_metrics_and_progress(
        tid, run, "validation", reports, searcher_metric="loss", smaller_is_better=smaller
    )


def test_a_report_raises_total_batches_and_keeps_the_best_validation(store: Store) -> None:
    _, tid, run = _trial(store)
    assert _validate(store, tid, run, (10, 0.5), (20, 0.3)) == MetricsReported(4, 20, 0.3)
    assert _validate(store, tid, run, (30, 0.4)) == MetricsReported(2, 30, 0.3)
    # Training reports move total_batches only; a smaller count never lowers it.
    training = [MetricReport(25, {"loss": 0.01})]
    done = store.report_metrics_and_progress(tid, run, "training", training, searcher_metric="loss")
    assert done == MetricsReported(1, 30, 0.3)
    assert _validate(store, tid, run, (40, 0.2)) == MetricsReported(2, 40, 0.2)
    trial = store.get_trial(tid)
    assert (trial.total_batches, trial.best_validation) == (40, 0.2)
    # Without a searcher metric (or for a larger-is-better one) as told.
    assert store.report_metrics(tid, run, "training", [MetricReport(50, {"x": 1.0})]) == 1
    assert store.get_trial(tid).total_batches == 50
    _, other, other_run = _trial(store, "larger")
    assert (
        _validate(store, other, other_run, (1, 0.5), (2, 0.7), smaller=False).best_validation == 0.7
    )
    assert _validate(store, other, other_run, (3, 0.6), smaller=False).best_validation == 0.7


def test_non_finite_values_never_become_the_best(store: Store) -> None:
    _, tid, run = _trial(store)
    nothing = _validate(store, tid, run, (1, math.nan), (2, math.inf), (3, -math.inf))
    assert nothing == MetricsReported(6, 3, None)
    assert _validate(store, tid, run, (4, 0.5), (5, -math.inf)).best_validation == 0.5
    # A non-finite best stored by an older release gives way to the next finite value.
    seed.set_trial(store, tid, best_validation=-math.inf)
    assert _validate(store, tid, run, (6, 0.9)).best_validation == 0.9
    assert store.get_trial(tid).best_validation == 0.9


def test_a_stale_report_moves_nothing(store: Store) -> None:
    _, tid, old = _trial(store)
    _validate(store, tid, old, (10, 0.5))
    seed.start_run(store, tid)
    with pytest.raises(StaleRunError):
        _validate(store, tid, old, (20, 0.1))
    trial = store.get_trial(tid)
    assert (trial.total_batches, trial.best_validation) == (10, 0.5)
    assert _metric_rows(store, tid) == 2


def test_a_retried_report_leaves_the_progress_as_it_was(store: Store) -> None:
    _, tid, run = _trial(store)
    first = _validate(store, tid, run, (10, 0.5), (20, 0.3))
    _validate(store, tid, run, (30, 0.4))
    again = _validate(store, tid, run, (10, 0.5), (20, 0.3))
    assert (first.stored, again.stored) == (4, 0)
    assert again == MetricsReported(0, 30, 0.3)
    with pytest.raises(ConflictError):
        _validate(store, tid, run, (20, 0.1), (50, 0.05))
    assert store.get_trial(tid).best_validation == 0.3
    assert store.get_trial(tid).total_batches == 30


def test_concurrent_reports_never_lower_the_progress(store: Store) -> None:
    _, tid, run = _trial(store)
    errors: list[BaseException] = []
    values = {b: 1.0 + ((b * 7919) % 101) / 100 for b in range(1, 201)}

    def report(offset: int) -> None:
        try:
            for b in range(offset, 201, 4):  # each thread its own batches, in order
                _validate(store, tid, run, (b, values[b]))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=report, args=(k,)) for k in range(1, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    trial = store.get_trial(tid)
    assert (trial.total_batches, trial.best_validation) == (200, min(values.values()))


# --- curves ---------------------------------------------------------------------------------


def _sawtooth(n: int) -> list[MetricReport]:
    values = [math.sin(b / 500.0) for b in range(n)]
    values[n // 3] = 50.0  # a spike
    values[2 * n // 3] = -50.0  # a dip
    return [MetricReport(b, {"loss": v}) for b, v in enumerate(values)]


@pytest.mark.parametrize("rows", [500, RAW_READ_LIMIT + 5_000])
def test_curves_are_downsampled_keeping_extremes(store: Store, rows: int) -> None:
    _, tid, run = _trial(store)
    reports = _sawtooth(rows)
    for start in range(0, rows, 5000):
        store.report_metrics(tid, run, "training", reports[start : start + 5000])
    curve = store.trial_curve(tid, "loss", group="training", max_points=200)
    assert 100 <= len(curve) <= 200
    xs = [x for x, _ in curve]
    assert xs == sorted(xs)
    assert (rows // 3, 50.0) in curve
    assert (2 * rows // 3, -50.0) in curve
    assert xs[0] == 0
    assert xs[-1] == rows - 1


def test_rollups_follow_a_restore_on_long_curves(store: Store) -> None:
    _, tid, run = _trial(store)
    rows = RAW_READ_LIMIT + 10_000
    reports = _sawtooth(rows)
    for start in range(0, rows, 10_000):
        store.report_metrics(tid, run, "training", reports[start : start + 10_000])
    cut = rows // 2  # past the spike at rows/3, before the dip at 2*rows/3
    run2 = seed.start_run(store, tid, restored_batches=cut)
    curve = store.trial_curve(tid, "loss", group="training", max_points=300)
    assert max(x for x, _ in curve) == cut
    assert min(y for _, y in curve) > -2  # the dip was superseded
    assert (rows // 3, 50.0) in curve
    store.report_metrics(
        tid, run2, "training", [MetricReport(b, {"loss": 7.0}) for b in range(cut + 1, rows)]
    )
    curve = store.trial_curve(tid, "loss", group="training", max_points=300)
    assert curve[-1] == (rows - 1, 7.0)
    assert (rows // 3, 50.0) in curve


def test_experiment_curves_cover_every_trial(store: Store) -> None:
    eid, t1, r1 = _trial(store)
    t2 = seed.trial(store, eid, request_id="r2", seed=1)
    r2 = seed.start_run(store, t2)
    store.report_metrics(t1, r1, "validation", _reports(range(3), acc=0.0))
    store.report_metrics(t2, r2, "validation", _reports(range(5), acc=1.0))
    curves = store.experiment_curves(eid, "acc", max_points=10)
    assert curves == {t1: [(0, 0.0), (1, 1.0), (2, 2.0)], t2: [(b, 1.0 + b) for b in range(5)]}
    assert store.metric_names(t1) == {"validation": ["acc"]}
    with pytest.raises(InvalidArgumentError):
        store.trial_curve(t1, "acc", max_points=1)


# --- checkpoints, agents, allocations, logs ---------------------------------------------------


def test_checkpoints_are_idempotent_and_fenced(store: Store) -> None:
    _, tid, run = _trial(store)
    record = CheckpointRecord(
        uuid="c1",
        trial_id=tid,
        run_id=run,
        total_batches=100,
        state="COMPLETED",
        location="/ckpt/c1",
        files={"models.pt": 10, "metadata.json": 2},
        user_metadata={"a": 1},
    )
    store.add_checkpoint(record)
    store.add_checkpoint(record)
    assert store.get_checkpoint("c1") == record
    assert store.get_trial(tid).latest_checkpoint == "c1"
    with pytest.raises(ConflictError, match="already recorded"):
        store.add_checkpoint(CheckpointRecord("c1", tid, run, 200, "COMPLETED", "/other", {}))
    seed.start_run(store, tid)
    with pytest.raises(StaleRunError):
        store.add_checkpoint(CheckpointRecord("c2", tid, run, 300, "COMPLETED", "/c2", {}))
    store.set_checkpoint_state("c1", "DELETED")
    assert [c.state for c in store.list_checkpoints(tid)] == ["DELETED"]
    assert record.size_bytes == 12


def test_a_deleted_latest_checkpoint_gives_way_to_the_newest_one_still_stored(
    store: Store,
) -> None:
    _, tid, run = _trial(store)
    for uid, batches in (("a", 100), ("b", 200), ("c", 300)):
        store.add_checkpoint(CheckpointRecord(uid, tid, run, batches, "COMPLETED", f"/{uid}", {}))
    assert store.get_trial(tid).latest_checkpoint == "c"
    store.set_checkpoint_state("b", "DELETED")  # not the latest: the latest stays
    assert store.get_trial(tid).latest_checkpoint == "c"
    store.set_checkpoint_state("c", "DELETED")
    assert store.get_trial(tid).latest_checkpoint == "a"
    store.set_checkpoint_state("a", "DELETED")
    assert store.get_trial(tid).latest_checkpoint is None


def test_agents_and_allocations(store: Store) -> None:
    _, tid, run = _trial(store)
    for _ in range(2):  # a reconnecting agent registers again: one row, refreshed
        batch = WriteBatch()
        batch.agent_registered(
            "gpu-1", slot_type="cuda", slots=8, devices=[{"uuid": "G0"}], address="", now=seed.now()
        )
        store.apply(batch)
    batch = WriteBatch()
    batch.agent_state("gpu-1", "DISABLED")
    batch.agent_state("nope", "DISABLED")  # an agent without a row: nothing to change
    placement = [{"agent_id": "gpu-1", "slots": [0, 1]}]
    batch.add_allocation("a1", trial_id=tid, run_id=run, placement=placement, now=seed.now())
    store.apply(batch)
    [agent] = store.list_agents()
    assert (agent.id, agent.slots, agent.state) == ("gpu-1", 8, "DISABLED")
    [allocation] = store.active_allocations()
    assert (allocation.id, allocation.state, allocation.placement) == ("a1", "ASSIGNED", placement)
    batch = WriteBatch()
    batch.set_allocation("a1", state="TERMINATED", ended_at=seed.now())
    store.apply(batch)
    assert store.active_allocations() == []


def test_logs_tail_and_follow(store: Store) -> None:
    _, tid, run = _trial(store)
    last = store.append_logs(tid, run, [LogLine(f"line {i}", rank=i % 2) for i in range(5)])
    lines = store.tail_logs(tid)
    assert [line.message for line in lines] == [f"line {i}" for i in range(5)]
    assert lines[-1].id == last
    store.append_logs(tid, run, [LogLine("ERROR boom", level="ERROR")])
    assert [line.message for line in store.tail_logs(tid, after_id=last)] == ["ERROR boom"]
    assert [line.message for line in store.tail_logs(tid, level="ERROR")] == ["ERROR boom"]
    assert store.append_logs(tid, run, []) == 0


# --- concurrency ----------------------------------------------------------------------------


def test_concurrent_writers_never_see_a_locked_database(store: Store) -> None:
    eid, tid, run = _trial(store)
    others = [seed.trial(store, eid, request_id=f"t{i}", seed=i) for i in range(3)]
    runs = {t: seed.start_run(store, t) for t in others}
    errors: list[BaseException] = []

    def writer(trial_id: int, run_id: int, offset: int) -> None:
        try:
            for i in range(20):
                reports = _reports(range(offset + i * 50, offset + (i + 1) * 50), loss=0.0)
                store.report_metrics(trial_id, run_id, "training", reports)
                store.append_logs(trial_id, run_id, [LogLine(f"{offset} {i}")])
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(t, runs[t], 0)) for t in others]
    # Two threads send the SAME reports to one trial: idempotence under a race.
    threads += [threading.Thread(target=writer, args=(tid, run, 0)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for trial_id in [*others, tid]:
        assert _metric_rows(store, trial_id) == 1000


# --- edge cases found in review -----------------------------------------------------------


def test_reports_racing_a_restart_are_superseded_or_refused(store: Store) -> None:
    _, tid, run = _trial(store)
    cut = 20
    reported = threading.Event()
    outcome: list[BaseException] = []

    def report() -> None:
        # Reports from run 1 until the restart fences it off.
        try:
            for start in range(0, 1_000_000, 10):
                store.report_metrics(tid, run, "training", _reports(range(start, start + 10), x=0))
                if start > cut:
                    reported.set()
                time.sleep(0.001)  # as a training loop does: the restart gets its turn
        except BaseException as e:
            outcome.append(e)
        reported.set()

    thread = threading.Thread(target=report)
    thread.start()
    reported.wait()
    seed.start_run(store, tid, restored_batches=cut)
    thread.join()
    assert len(outcome) == 1
    assert isinstance(outcome[0], StaleRunError)
    # Whatever passed the fence before the restart was superseded with the rest.
    curve = store.trial_curve(tid, "x", group="training", max_points=100_000)
    assert curve == [(b, float(b)) for b in range(cut + 1)]


def test_short_curves_keep_their_extremes_too(store: Store) -> None:
    import random

    _, tid, run = _trial(store)
    rng = random.Random(4)
    values = [rng.gauss(0, 1) for _ in range(300)]
    store.report_metrics(
        tid, run, "training", [MetricReport(b, {"x": v}) for b, v in enumerate(values)]
    )
    curve = store.trial_curve(tid, "x", group="training", max_points=20)
    assert len(curve) == 20
    ys = [y for _, y in curve]
    assert min(values) in ys
    assert max(values) in ys


def test_huge_batch_counts_come_back_exactly(store: Store) -> None:
    _, tid, run = _trial(store)
    top = 2**63 - 1
    store.report_metrics(
        tid, run, "training", [MetricReport(2**53 + 1, {"x": 1.0}), MetricReport(top, {"x": 2.0})]
    )
    assert store.trial_curve(tid, "x", group="training") == [(2**53 + 1, 1.0), (top, 2.0)]


def test_checkpoint_retries_after_a_restart_are_still_noops(store: Store) -> None:
    _, tid, run = _trial(store)
    record = CheckpointRecord("c1", tid, run, 10, "COMPLETED", "/c1", {"m.pt": 1})
    store.add_checkpoint(record)
    seed.start_run(store, tid)
    store.add_checkpoint(record)  # the same content: fine, though run 1 is over
    with pytest.raises(ConflictError, match="other content"):
        store.add_checkpoint(CheckpointRecord("c1", tid, run, 10, "COMPLETED", "/c1", {"m.pt": 2}))


def test_sorting_places_missing_values_last_on_every_engine(store: Store) -> None:
    done = seed.experiment(store, name="done", owner="a")
    running = seed.experiment(store, name="running", owner="a")
    import datetime as dt

    store.update_experiment(done, end_time=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    for descending in (True, False):
        page = store.list_experiments(sort="end_time", descending=descending)
        assert [e.id for e in page.items] == [done, running]
