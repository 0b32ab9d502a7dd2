"""The contract of `MasterStore`, aggregate by aggregate: the same assertions on the SQL
store (a SQLite file and PostgreSQL) and on the in-memory store the lifecycle simulation
runs on. Each test speaks to the store only through the Protocols and `WriteBatch`, as
the master does."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError

from assay.master.errors import (
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    StaleRunError,
)
from assay.master.lifecycle import ExperimentStatus, TrialStatus
from assay.master.store import (
    CheckpointRecord,
    LogFilter,
    LogLine,
    MasterStore,
    MemoryStore,
    MetricReport,
    Store,
    UsagePart,
    WriteBatch,
)

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@pytest.fixture(params=["sqlite", "postgresql", "memory"])
def master_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MasterStore]:
    """An empty store of each kind a master runs on, seen only as a `MasterStore`."""
    if request.param == "memory":
        yield MemoryStore()
        return
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'assay.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
        engine = create_engine(url)
        with engine.begin() as c:
            c.execute(text("DROP SCHEMA public CASCADE"))
            c.execute(text("CREATE SCHEMA public"))
        engine.dispose()
    store = Store.open(url)
    try:
        yield store
    finally:
        store.close()


# --- writing as the master does: one batch per call -------------------------------------------


def _experiment(
    store: MasterStore, *, owner: str = "alice", state: str = "ACTIVE", **fields: Any
) -> int:
    experiment_id = store.reserve_id("experiments")
    batch = WriteBatch()
    batch.add_experiment(
        experiment_id,
        name=fields.pop("name", "exp"),
        owner_id=store.user_id(owner),
        config=fields.pop("config", {"searcher": {"name": "single"}}),
        model_definition=fields.pop("model_definition", b"archive"),
        state=state,
        description="",
        labels=fields.pop("labels", ()),
        priority=fields.pop("priority", 42),
        now=T0,
    )
    store.apply(batch)
    return experiment_id


def _trial(store: MasterStore, experiment_id: int, request_id: str = "r1") -> int:
    trial_id = store.reserve_id("trials")
    batch = WriteBatch()
    batch.add_trial(
        trial_id,
        experiment_id=experiment_id,
        request_id=request_id,
        hparams={"lr": 0.1, "layers": (1, 2)},
        seed=7,
        state="QUEUED",
        now=T0,
    )
    store.apply(batch)
    return trial_id


def _set_trial(store: MasterStore, trial_id: int, **fields: Any) -> None:
    batch = WriteBatch()
    batch.set_trial(trial_id, **fields)
    store.apply(batch)


def _running(store: MasterStore) -> tuple[int, int]:
    """(trial id, run id): a trial of a new experiment on its first run."""
    trial_id = _trial(store, _experiment(store))
    _set_trial(store, trial_id, run_id=1, state="RUNNING")
    return trial_id, 1


def _checkpoint(trial_id: int, run_id: int, uuid: str, batches: int) -> CheckpointRecord:
    return CheckpointRecord(uuid, trial_id, run_id, batches, "COMPLETED", f"/c/{uuid}", {"f": 3})


# --- ids, experiments and trials ---------------------------------------------------------------


def test_reserved_ids_count_up_and_only_for_experiments_and_trials(
    master_store: MasterStore,
) -> None:
    ids = [master_store.reserve_id("experiments") for _ in range(3)]
    assert ids == sorted(set(ids))
    assert ids[0] >= 1
    assert master_store.reserve_id("trials") >= 1
    with pytest.raises(InvalidArgumentError):
        master_store.reserve_id("agents")


def test_an_experiment_comes_back_as_written_filed_in_the_default_project(
    master_store: MasterStore,
) -> None:
    config = {"searcher": {"name": "single", "shape": (1, 2)}}
    eid = _experiment(master_store, name="mnist", config=config, labels=["b", "a", "a"], priority=7)
    e = master_store.get_experiment(eid)
    assert (e.name, e.owner, e.state, e.labels, e.priority, e.progress) == (
        "mnist",
        "alice",
        "ACTIVE",
        ("a", "b"),
        7,
        0.0,
    )
    assert e.config == {"searcher": {"name": "single", "shape": [1, 2]}}  # as JSON
    assert (e.project, e.workspace, e.searcher_state, e.archived) == (
        "Uncategorized",
        "Default",
        None,
        False,
    )
    assert master_store.get_model_definition(eid) == b"archive"
    assert master_store.experiment_workspaces([eid, eid + 100]) == {eid: 1}


def test_missing_rows_raise_not_found(master_store: MasterStore) -> None:
    for read in (
        lambda: master_store.get_experiment(404),
        lambda: master_store.get_model_definition(404),
        lambda: master_store.get_trial(404),
        lambda: master_store.get_checkpoint("nope"),
        lambda: master_store.set_checkpoint_state("nope", "DELETED"),
        lambda: master_store.add_checkpoint(_checkpoint(404, 1, "c", 1)),
        lambda: master_store.report_metrics(404, 1, "training", [MetricReport(1, {"x": 1.0})]),
    ):
        with pytest.raises(NotFoundError):
            read()
    assert master_store.list_trials(404) == []


def test_model_definitions_are_counted_per_owner(master_store: MasterStore) -> None:
    _experiment(master_store, owner="alice", model_definition=b"12345")
    _experiment(master_store, owner="alice", model_definition=b"123")
    _experiment(master_store, owner="bob", model_definition=b"1")
    assert master_store.model_definition_bytes(master_store.user_id("alice")) == 8
    assert master_store.model_definition_bytes(master_store.user_id("nobody")) == 0


def test_experiments_are_listed_by_state_sorted_and_paged(master_store: MasterStore) -> None:
    ids = [_experiment(master_store, state=s) for s in ("ACTIVE", "PAUSED", "COMPLETED")]
    ids.append(_experiment(master_store, state="ACTIVE"))
    live = master_store.list_experiments(states=["ACTIVE", "PAUSED"], sort="id", descending=False)
    assert [e.id for e in live.items] == [ids[0], ids[1], ids[3]]
    page = master_store.list_experiments(descending=True, limit=2, offset=1)
    assert ([e.id for e in page.items], page.total) == ([ids[2], ids[1]], 4)
    for bad in ({"sort": "model_definition"}, {"limit": 0}, {"offset": -1}):
        with pytest.raises(InvalidArgumentError):
            master_store.list_experiments(**bad)


def test_trials_are_listed_by_id_with_their_fields_as_written(master_store: MasterStore) -> None:
    eid = _experiment(master_store)
    first, second = _trial(master_store, eid, "r1"), _trial(master_store, eid, "r2")
    _set_trial(master_store, second, state=TrialStatus.COMPLETED, end_time=T0, restarts=2)
    trials = master_store.list_trials(eid)
    assert [t.id for t in trials] == [first, second]
    t = master_store.get_trial(second)
    assert (t.request_id, t.hparams, t.seed, t.state, t.restarts) == (
        "r2",
        {"lr": 0.1, "layers": [1, 2]},
        7,
        "COMPLETED",
        2,
    )
    assert type(t.state) is str  # an enum written comes back as its value
    assert t.end_time is not None
    assert t.end_time.replace(tzinfo=None) == T0.replace(tzinfo=None)  # SQLite keeps no zone
    assert (t.parent_trial_id, t.search_round) == (None, None)


# --- batches ------------------------------------------------------------------------------------


def test_a_batch_merges_updates_into_its_inserts_and_skips_missing_rows(
    master_store: MasterStore,
) -> None:
    eid = master_store.reserve_id("experiments")
    batch = WriteBatch()
    batch.add_experiment(
        eid,
        name="e",
        owner_id=master_store.user_id("alice"),
        config={},
        model_definition=b"",
        state="ACTIVE",
        description="",
        labels=(),
        priority=1,
        now=T0,
    )
    batch.set_experiment(eid, state=ExperimentStatus.PAUSED, progress=0.5)
    batch.set_experiment(eid + 1000, state="PAUSED")  # no such row: nothing changes
    assert len(batch) == 2
    master_store.apply(batch)
    e = master_store.get_experiment(eid)
    assert (e.state, e.progress) == ("PAUSED", 0.5)
    with pytest.raises(InvalidArgumentError):
        WriteBatch().set_experiment(eid, owner_id=3)
    master_store.apply(WriteBatch())  # an empty batch writes nothing


def test_a_batch_is_written_all_or_nothing(master_store: MasterStore) -> None:
    eid = _experiment(master_store)
    trial_id = _trial(master_store, eid)
    batch = WriteBatch()
    batch.set_experiment(eid, state="PAUSED")
    batch.set_trial(trial_id, state="PAUSED")
    batch.add_trial(
        master_store.reserve_id("trials"),
        experiment_id=eid + 1000,  # no such experiment
        request_id="orphan",
        hparams={},
        seed=0,
        state="QUEUED",
        now=T0,
    )
    with pytest.raises((IntegrityError, NotFoundError)):  # a foreign key, as each store says it
        master_store.apply(batch)
    assert master_store.get_experiment(eid).state == "ACTIVE"
    assert [t.state for t in master_store.list_trials(eid)] == ["QUEUED"]


# --- metrics ------------------------------------------------------------------------------------


def test_a_report_is_stored_once_and_fenced_by_run(master_store: MasterStore) -> None:
    trial_id, run = _running(master_store)
    reports = [MetricReport(b, {"loss": 1.0 / b}) for b in (1, 2)]
    assert master_store.report_metrics(trial_id, run, "training", reports) == 2
    assert master_store.report_metrics(trial_id, run, "training", reports) == 0
    with pytest.raises(ConflictError):
        master_store.report_metrics(trial_id, run, "training", [MetricReport(1, {"loss": 9.0})])
    with pytest.raises(ConflictError):  # a run the trial has not started
        master_store.report_metrics(trial_id, run + 1, "training", reports)
    _set_trial(master_store, trial_id, run_id=run + 1)
    with pytest.raises(StaleRunError):
        master_store.report_metrics(trial_id, run, "training", [MetricReport(3, {"loss": 0.1})])
    with pytest.raises(InvalidArgumentError):
        master_store.report_metrics(trial_id, run + 1, "", reports)


def test_progress_never_goes_back_and_the_best_moves_only_when_better(
    master_store: MasterStore,
) -> None:
    trial_id, run = _running(master_store)

    def report(batches: int, loss: float) -> tuple[int, float | None]:
        done = master_store.report_metrics_and_progress(
            trial_id,
            run,
            "validation",
            [MetricReport(batches, {"loss": loss})],
            searcher_metric="loss",
        )
        return done.total_batches, done.best_validation

    assert report(10, 0.5) == (10, 0.5)
    assert report(5, 0.7) == (10, 0.5)  # worse, and earlier: neither moves
    assert report(20, math.nan) == (20, 0.5)  # NaN is stored as a gap, never a best
    assert report(30, 0.2) == (30, 0.2)
    t = master_store.get_trial(trial_id)
    assert (t.total_batches, t.best_validation) == (30, 0.2)


def test_a_report_past_the_names_cap_is_refused_whole(master_store: MasterStore) -> None:
    trial_id, run = _running(master_store)
    master_store.report_metrics(
        trial_id, run, "training", [MetricReport(1, {"a": 1.0})], max_names=2
    )
    with pytest.raises(ResourceExhaustedError):
        master_store.report_metrics(
            trial_id,
            run,
            "training",
            [MetricReport(2, {"a": 1.0, "b": 2.0, "c": 3.0})],
            max_names=2,
        )
    assert master_store.get_trial(trial_id).total_batches == 1  # nothing of it was written
    assert (
        master_store.report_metrics(
            trial_id, run, "training", [MetricReport(2, {"a": 2.0, "b": 2.0})], max_names=2
        )
        == 2
    )


def test_a_restore_supersedes_later_metrics_and_their_best(master_store: MasterStore) -> None:
    trial_id, run = _running(master_store)
    master_store.report_metrics_and_progress(
        trial_id,
        run,
        "validation",
        [MetricReport(10, {"loss": 0.5}), MetricReport(20, {"loss": 0.1})],
        searcher_metric="loss",
    )
    # What the master takes into memory before the batch below is written.
    assert master_store.best_validation_through(trial_id, 10, "loss", True) == 0.5
    assert master_store.best_validation_through(trial_id, 20, "loss", False) == 0.5
    assert master_store.best_validation_through(trial_id, 9, "loss", True) is None
    batch = WriteBatch()
    batch.set_trial(trial_id, run_id=run + 1, total_batches=10)
    batch.supersede_metrics(trial_id, 10, "loss", smaller_is_better=True)
    master_store.apply(batch)
    assert master_store.get_trial(trial_id).best_validation == 0.5
    assert master_store.best_validation_through(trial_id, 20, "loss", True) == 0.5
    # The next run reports batch 20 again: a new row, not a conflict with the hidden one.
    assert (
        master_store.report_metrics(
            trial_id, run + 1, "validation", [MetricReport(20, {"loss": 0.3})]
        )
        == 1
    )


# --- checkpoints --------------------------------------------------------------------------------


def test_checkpoints_are_idempotent_fenced_and_the_newest_is_the_latest(
    master_store: MasterStore,
) -> None:
    trial_id, run = _running(master_store)
    first = _checkpoint(trial_id, run, "c1", 100)
    master_store.add_checkpoint(first)
    master_store.add_checkpoint(first)  # a retry: nothing changes
    assert master_store.get_checkpoint("c1") == first
    with pytest.raises(ConflictError):
        master_store.add_checkpoint(_checkpoint(trial_id, run, "c1", 200))
    master_store.add_checkpoint(_checkpoint(trial_id, run, "c0", 50))  # older: not the latest
    t = master_store.get_trial(trial_id)
    assert (t.latest_checkpoint, t.total_batches) == ("c1", 100)
    assert [c.uuid for c in master_store.list_checkpoints(trial_id)] == ["c0", "c1"]
    _set_trial(master_store, trial_id, run_id=run + 1)
    with pytest.raises(StaleRunError):
        master_store.add_checkpoint(_checkpoint(trial_id, run, "c2", 300))
    master_store.add_checkpoint(first)  # a retry after the trial moved on: still a no-op
    assert master_store.checkpoint_references(["c1"]) == {}


def test_a_checkpoint_carries_the_validation_of_its_run_at_its_batch(
    master_store: MasterStore,
) -> None:
    trial_id, run = _running(master_store)
    master_store.report_metrics(
        trial_id,
        run,
        "validation",
        [MetricReport(100, {"loss": 0.25, "acc": None}), MetricReport(50, {"loss": 0.5})],
    )
    master_store.add_checkpoint(_checkpoint(trial_id, run, "c1", 100))
    metrics = master_store.get_checkpoint("c1").user_metadata["validation_metrics"]
    assert metrics["loss"] == 0.25
    assert math.isnan(metrics["acc"])
    [listed] = master_store.list_checkpoints(trial_id)
    assert listed.user_metadata["validation_metrics"]["loss"] == 0.25


def test_a_deleted_latest_checkpoint_gives_way_to_the_newest_left(
    master_store: MasterStore,
) -> None:
    trial_id, run = _running(master_store)
    for uuid, batches in (("a", 100), ("b", 200), ("c", 300)):
        master_store.add_checkpoint(_checkpoint(trial_id, run, uuid, batches))
    master_store.set_checkpoint_state("b", "DELETED")  # not the latest: the latest stays
    assert master_store.get_trial(trial_id).latest_checkpoint == "c"
    master_store.set_checkpoint_state("c", "DELETED")
    assert master_store.get_trial(trial_id).latest_checkpoint == "a"
    master_store.set_checkpoint_state("a", "DELETED")
    assert master_store.get_trial(trial_id).latest_checkpoint is None
    assert [c.state for c in master_store.list_checkpoints(trial_id)] == ["DELETED"] * 3


# --- agents, allocations and usage -------------------------------------------------------------


def _register(store: MasterStore, agent_id: str, credential: str | None = None) -> None:
    batch = WriteBatch()
    batch.agent_registered(
        agent_id,
        slot_type="cuda",
        slots=2,
        devices=[{"uuid": "G0"}],
        address="10.0.0.1",
        now=T0,
        credential_sha256=credential,
    )
    store.apply(batch)


def test_agents_keep_their_credential_until_withdrawn_or_removed(
    master_store: MasterStore,
) -> None:
    _register(master_store, "b", credential="d1")
    _register(master_store, "a")
    _register(master_store, "b")  # back again: one row, its credential kept
    batch = WriteBatch()
    batch.agent_state("a", "DISABLED")
    batch.agent_state("nobody", "DISABLED")  # no row: nothing changes
    master_store.apply(batch)
    agents = master_store.list_agents()
    assert [(a.id, a.state, a.devices) for a in agents] == [
        ("a", "DISABLED", [{"uuid": "G0"}]),
        ("b", "ACTIVE", [{"uuid": "G0"}]),
    ]
    assert master_store.agent_credentials() == {"b": "d1"}
    batch = WriteBatch()
    batch.agent_credential_withdrawn("b", "another")  # not the one it holds: kept
    master_store.apply(batch)
    assert master_store.agent_credentials() == {"b": "d1"}
    batch = WriteBatch()
    batch.agent_credential_withdrawn("b", "d1")
    batch.agent_removed("a")
    master_store.apply(batch)
    assert master_store.agent_credentials() == {}
    assert [a.id for a in master_store.list_agents()] == ["b"]


def test_allocations_and_their_usage_are_open_until_ended(master_store: MasterStore) -> None:
    trial_id, run = _running(master_store)
    experiment_id = master_store.get_trial(trial_id).experiment_id
    batch = WriteBatch()
    for allocation_id, agents in (("x2", ["a", "b"]), ("x1", ["a"])):
        placement = [{"agent_id": a, "slots": [0]} for a in agents]
        batch.add_allocation(
            allocation_id, trial_id=trial_id, run_id=run, placement=placement, now=T0
        )
        batch.usage_started(
            allocation_id,
            experiment_id=experiment_id,
            trial_id=trial_id,
            run_id=run,
            parts=[UsagePart(a, 1, "cuda", "default") for a in agents],
            now=T0,
        )
    batch.set_allocation("x1", stopping="preempt")  # merged into its insert
    master_store.apply(batch)
    active = master_store.active_allocations()
    assert [(a.id, a.state, a.stopping) for a in active] == [
        ("x1", "ASSIGNED", "preempt"),
        ("x2", "ASSIGNED", None),
    ]
    assert active[1].placement == [{"agent_id": "a", "slots": [0]}, {"agent_id": "b", "slots": [0]}]
    assert master_store.open_usage() == [("x1", "a"), ("x2", "a"), ("x2", "b")]
    batch = WriteBatch()
    batch.usage_ended("x2", T0 + dt.timedelta(hours=1), agent_id="b")  # one part
    batch.set_allocation("x1", state="TERMINATED", ended_at=T0 + dt.timedelta(hours=1))
    master_store.apply(batch)
    assert [a.id for a in master_store.active_allocations()] == ["x2"]
    assert master_store.open_usage() == [("x1", "a"), ("x2", "a")]
    batch = WriteBatch()
    batch.usage_orphans_closed(T0 + dt.timedelta(hours=2))  # x1 ended: its record closes
    master_store.apply(batch)
    assert master_store.open_usage() == [("x2", "a")]
    batch = WriteBatch()
    batch.usage_ended("x2", T0 + dt.timedelta(hours=3))
    master_store.apply(batch)
    assert master_store.open_usage() == []


# --- users, secrets and the directory ----------------------------------------------------------


def test_users_secrets_and_the_default_workspace(master_store: MasterStore) -> None:
    alice = master_store.user_id("alice")
    assert master_store.user_id("alice") == alice != master_store.user_id("bob")
    key = master_store.secret("tokens")
    assert len(key) == 32
    assert master_store.secret("tokens") == key != master_store.secret("other")
    snapshot = master_store.directory.get()
    default = snapshot.by_name["Default"]
    assert snapshot.projects[(default.id, "Uncategorized")].workspace == "Default"
    assert snapshot.roles[alice] == {default.id: "editor"}
    assert snapshot.pools == {}


def test_pools_are_bound_to_workspaces_once(master_store: MasterStore) -> None:
    eid = _experiment(master_store)
    default = master_store.directory.get().by_name["Default"]
    assert master_store.experiment_place(eid) == (default.id, 1)
    with pytest.raises(NotFoundError):
        master_store.experiment_place(eid + 100)
    team = master_store.settings_workspace("team")
    assert master_store.settings_workspace("team") == team
    assert master_store.bind_pool("gpu", team.id)
    assert not master_store.bind_pool("gpu", team.id)
    with pytest.raises(NotFoundError):
        master_store.bind_pool("gpu", team.id + 100)
    assert master_store.directory.get().pools == {"gpu": frozenset({team.id})}
    assert master_store.unbind_pool("gpu", team.id)
    assert not master_store.unbind_pool("gpu", team.id)
    assert master_store.directory.get().pools == {}


# --- experiments' other writes, and logs -------------------------------------------------------


def test_an_experiment_is_updated_and_deleted_only_once_ended(master_store: MasterStore) -> None:
    trial_id, run = _running(master_store)
    eid = master_store.get_trial(trial_id).experiment_id
    master_store.report_metrics(trial_id, run, "training", [MetricReport(1, {"loss": 1.0})])
    master_store.add_checkpoint(_checkpoint(trial_id, run, "c1", 1))
    master_store.append_logs(trial_id, run, [LogLine("hello")])
    master_store.update_experiment(eid, description="d", config={"k": (1,)})
    assert master_store.get_experiment(eid).config == {"k": [1]}
    with pytest.raises(InvalidArgumentError):
        master_store.update_experiment(eid, owner_id=2)
    with pytest.raises(NotFoundError):
        master_store.update_experiment(eid + 100, description="d")
    with pytest.raises(ConflictError):
        master_store.delete_experiment(eid)  # still ACTIVE
    master_store.update_experiment(eid, state="COMPLETED")
    assert master_store.checkpoint_pins(["c1"]) == {}
    master_store.delete_experiment(eid)
    for gone in (
        lambda: master_store.get_experiment(eid),
        lambda: master_store.get_trial(trial_id),
        lambda: master_store.get_checkpoint("c1"),
        lambda: master_store.delete_experiment(eid),
    ):
        with pytest.raises(NotFoundError):
            gone()
    assert master_store.tail_logs(trial_id) == []


def test_logs_are_read_in_order_and_kept_within_their_quota(master_store: MasterStore) -> None:
    trial_id, run = _running(master_store)
    with pytest.raises(NotFoundError):
        master_store.append_logs(trial_id + 100, run, [LogLine("x")])
    assert master_store.append_logs(trial_id, run, []) == 0
    last = master_store.append_logs(trial_id, run, [LogLine(f"line {i}") for i in range(3)])
    lines = master_store.tail_logs(trial_id)
    assert [(line.message, line.run_id) for line in lines] == [(f"line {i}", run) for i in range(3)]
    assert lines[-1].id == last
    assert [line.message for line in master_store.tail_logs(trial_id, after_id=lines[0].id)] == [
        "line 1",
        "line 2",
    ]
    master_store.append_logs(trial_id, run, [LogLine("oops", level="ERROR")])
    assert [line.message for line in master_store.last_logs(trial_id, 2)] == ["line 2", "oops"]
    assert [line.message for line in master_store.tail_logs(trial_id, level="ERROR")] == ["oops"]
    with pytest.raises(InvalidArgumentError):
        master_store.tail_logs(trial_id, limit=0)
    # 24 bytes stored; a quota of 30 takes "abcde" and then the marker, and nothing after.
    master_store.append_logs(trial_id, run, [LogLine("abcde"), LogLine("fghij")], quota_bytes=30)
    assert master_store.append_logs(trial_id, run, [LogLine("more")], quota_bytes=30) == 0
    tail = master_store.last_logs(trial_id, 2)
    assert tail[0].message == "abcde"
    assert (tail[1].stream, tail[1].level) == ("assay", "WARNING")
    assert master_store.expired_log_trials(T0 + dt.timedelta(days=1)) == []
    _set_trial(master_store, trial_id, end_time=T0)
    assert master_store.expired_log_trials(T0 + dt.timedelta(days=1)) == [trial_id]
    assert master_store.delete_logs(trial_id, batch=4) == 4
    assert master_store.delete_logs(trial_id) == 2  # 6 lines: 3, "oops", "abcde", the marker
    assert master_store.tail_logs(trial_id) == []
    assert master_store.expired_log_trials(T0 + dt.timedelta(days=1)) == []


def test_log_filters_are_the_same_on_every_store(master_store: MasterStore) -> None:
    """`assay trial logs --rank/--level/--since/--grep`: the master's query, the same on
    SQLite, PostgreSQL and in memory. A line without a level counts as INFO."""
    trial_id, run = _running(master_store)
    stamp = [T0 + dt.timedelta(minutes=i) for i in range(6)]
    master_store.append_logs(
        trial_id,
        run,
        [
            LogLine("plain print 50%", rank=0, timestamp=stamp[0]),
            LogLine("DEBUG noisy", rank=1, level="DEBUG", timestamp=stamp[1]),
            LogLine("INFO step 10 loss", rank=0, level="INFO", timestamp=stamp[2]),
            LogLine("WARNING Loss is high", rank=1, level="WARNING", timestamp=stamp[3]),
            LogLine("ERROR loss is nan", rank=2, level="ERROR", timestamp=stamp[4]),
            LogLine("odd level", rank=0, level="NOTICE", timestamp=stamp[5]),
        ],
    )

    def read(where: LogFilter, last: int = 0) -> list[str]:
        if last:
            found = master_store.last_logs(trial_id, last, where=where)
        else:
            found = master_store.tail_logs(trial_id, where=where)
        return [line.message.split()[0] for line in found]

    assert read(LogFilter()) == ["plain", "DEBUG", "INFO", "WARNING", "ERROR", "odd"]
    assert read(LogFilter(ranks=frozenset({1, 2}))) == ["DEBUG", "WARNING", "ERROR"]
    assert read(LogFilter(min_level="TRACE")) == read(LogFilter())
    assert read(LogFilter(min_level="INFO")) == ["plain", "INFO", "WARNING", "ERROR", "odd"]
    assert read(LogFilter(min_level="WARNING")) == ["WARNING", "ERROR"]
    assert read(LogFilter(min_level="CRITICAL")) == []
    assert read(LogFilter(since=stamp[3])) == ["WARNING", "ERROR", "odd"]
    # Another offset, the same instant.
    assert read(LogFilter(since=stamp[3].astimezone(dt.timezone(dt.timedelta(hours=-5))))) == [
        "WARNING",
        "ERROR",
        "odd",
    ]
    assert read(LogFilter(text="loss")) == ["INFO", "ERROR"]  # case-sensitive
    assert read(LogFilter(text="50%")) == ["plain"]  # no LIKE wildcards
    assert read(LogFilter(text="_")) == []
    both = LogFilter(ranks=frozenset({0, 1}), min_level="INFO", text="oss")
    assert read(both) == ["INFO", "WARNING"]
    assert read(LogFilter(min_level="INFO"), last=2) == ["ERROR", "odd"]
