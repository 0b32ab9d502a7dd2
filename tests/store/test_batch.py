"""WriteBatch and reserved ids: the master's group-commit writes, on both engines."""

from __future__ import annotations

import datetime as dt

import pytest

from assay.master.errors import InvalidArgumentError
from assay.master.store import LogLine, MetricReport, Store, WriteBatch
from assay.master.store._experiments import _ID_BLOCK
from tests.store import _seed as seed

NOW = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def _experiment(batch: WriteBatch, store: Store, *, labels: tuple[str, ...] = ()) -> int:
    experiment_id = store.reserve_id("experiments")
    batch.add_experiment(
        experiment_id,
        name="exp",
        owner_id=store.user_id("admin"),
        config={"name": "exp"},
        model_definition=b"tar",
        state="ACTIVE",
        description="d",
        labels=labels,
        priority=42,
        now=NOW,
    )
    return experiment_id


def _trial(batch: WriteBatch, store: Store, experiment_id: int, request: str = "r0") -> int:
    trial_id = store.reserve_id("trials")
    batch.add_trial(
        trial_id,
        experiment_id=experiment_id,
        request_id=request,
        hparams={"lr": 0.1},
        seed=7,
        state="QUEUED",
        now=NOW,
    )
    return trial_id


def test_one_batch_writes_rows_that_depend_on_each_other(store: Store) -> None:
    batch = WriteBatch()
    experiment_id = _experiment(batch, store, labels=("b", "a", "a"))
    trial_id = _trial(batch, store, experiment_id)
    # Updates of rows inserted by the same batch merge into the insert.
    batch.set_trial(trial_id, state="RUNNING", run_id=1, start_time=NOW)
    batch.add_allocation(
        "1.1.x", trial_id=trial_id, run_id=1, placement=[{"agent_id": "a", "slots": [0]}], now=NOW
    )
    batch.set_allocation("1.1.x", state="RUNNING")
    assert len(batch) == 3 + 1  # three rows and the labels' call
    store.apply(batch)

    experiment = store.get_experiment(experiment_id)
    assert (experiment.name, experiment.state, experiment.labels) == ("exp", "ACTIVE", ("a", "b"))
    trial = store.get_trial(trial_id)
    assert (trial.state, trial.run_id, trial.hparams, trial.seed) == ("RUNNING", 1, {"lr": 0.1}, 7)
    assert [(a.id, a.state) for a in store.active_allocations()] == [("1.1.x", "RUNNING")]
    assert store.get_model_definition(experiment_id) == b"tar"


def test_updates_of_stored_rows_merge_per_row_and_group_by_fields(store: Store) -> None:
    setup = WriteBatch()
    experiment_id = _experiment(setup, store)
    trials = [_trial(setup, store, experiment_id, f"r{i}") for i in range(5)]
    store.apply(setup)

    batch = WriteBatch()
    for trial_id in trials:
        batch.set_trial(trial_id, state="RUNNING")
    batch.set_trial(trials[0], state="COMPLETED", end_time=NOW)  # merges with the first
    batch.set_trial(trials[1], restarts=2)
    batch.set_experiment(experiment_id, progress=0.5)
    assert len(batch) == 6
    store.apply(batch)

    by_id = {t.id: t for t in store.list_trials(experiment_id)}
    assert by_id[trials[0]].state == "COMPLETED"
    assert by_id[trials[0]].end_time is not None
    assert (by_id[trials[1]].state, by_id[trials[1]].restarts) == ("RUNNING", 2)
    assert {by_id[t].state for t in trials[2:]} == {"RUNNING"}
    assert store.get_experiment(experiment_id).progress == 0.5


def test_a_failing_batch_writes_nothing(store: Store) -> None:
    batch = WriteBatch()
    experiment_id = _experiment(batch, store)
    _trial(batch, store, experiment_id, "same")
    _trial(batch, store, experiment_id, "same")  # (experiment, request) must be unique
    with pytest.raises(Exception, match="(?i)unique|duplicate"):
        store.apply(batch)
    assert store.list_experiments().total == 0


def test_superseding_and_agent_rows_are_ordered_calls(store: Store) -> None:
    setup = WriteBatch()
    experiment_id = _experiment(setup, store)
    trial_id = _trial(setup, store, experiment_id)
    setup.set_trial(trial_id, run_id=1)
    store.apply(setup)
    store.report_metrics(
        trial_id, 1, "training", [MetricReport(b, {"loss": 1.0 / b}) for b in (10, 20, 30)]
    )

    batch = WriteBatch()
    batch.set_trial(trial_id, run_id=2, total_batches=20)
    batch.supersede_metrics(trial_id, 20)
    batch.agent_registered(
        "agent-1", slot_type="cpu", slots=2, devices=[{"name": "cpu"}], address="h", now=NOW
    )
    batch.agent_state("agent-1", "DISABLED")
    batch.agent_registered("agent-1", slot_type="cpu", slots=4, devices=[], address="h2", now=NOW)
    store.apply(batch)

    assert [b for b, _ in store.trial_curve(trial_id, "loss", group="training")] == [10, 20]
    (agent,) = store.list_agents()
    assert (agent.state, agent.slots, agent.address) == ("ACTIVE", 4, "h2")


def test_an_agents_credential_hash_is_kept_until_the_agent_is_removed(store: Store) -> None:
    batch = WriteBatch()
    batch.agent_registered("a", slot_type="cpu", slots=1, devices=[], address="h", now=NOW)
    batch.agent_registered(
        "b", slot_type="cpu", slots=1, devices=[], address="h", now=NOW, credential_sha256="f" * 64
    )
    store.apply(batch)
    assert store.agent_credentials() == {"b": "f" * 64}

    again = WriteBatch()  # a reconnect records no new credential: the row keeps its own
    again.agent_registered("b", slot_type="cpu", slots=2, devices=[], address="h2", now=NOW)
    again.agent_registered(
        "a", slot_type="cpu", slots=1, devices=[], address="h", now=NOW, credential_sha256="0" * 64
    )
    store.apply(again)
    assert store.agent_credentials() == {"a": "0" * 64, "b": "f" * 64}

    removed = WriteBatch()
    removed.agent_state("b", "DISCONNECTED")
    removed.agent_removed("b")
    store.apply(removed)
    assert store.agent_credentials() == {"a": "0" * 64}
    assert [agent.id for agent in store.list_agents()] == ["a"]


def test_unknown_fields_are_refused_when_recorded() -> None:
    batch = WriteBatch()
    with pytest.raises(InvalidArgumentError, match="cannot update trial fields"):
        batch.set_trial(1, hparams={})
    with pytest.raises(InvalidArgumentError, match="cannot update experiment fields"):
        batch.set_experiment(1, owner_id=2)
    assert not batch


def test_reserved_ids_are_unique_and_rows_written_meanwhile_keep_them_so(store: Store) -> None:
    count = _ID_BLOCK + 8  # more than one block
    reserved = [store.reserve_id("experiments") for _ in range(count)]
    assert len(set(reserved)) == count
    made = seed.experiment(store, owner="admin")
    assert made not in reserved
    assert store.reserve_id("experiments") not in [*reserved, made]
    trial_ids = {store.reserve_id("trials") for _ in range(3)}
    made_trial = seed.trial(store, made, request_id="r")
    assert made_trial not in trial_ids
    with pytest.raises(InvalidArgumentError, match="no ids are reserved"):
        store.reserve_id("users")


def test_a_second_store_on_the_same_database_continues_after_the_largest_id(db_url: str) -> None:
    first = Store.open(db_url)
    try:
        batch = WriteBatch()
        experiment_id = _experiment(batch, first)
        first.apply(batch)
    finally:
        first.close()
    second = Store.open(db_url)  # as a restarted master
    try:
        assert second.reserve_id("experiments") > experiment_id
    finally:
        second.close()


def test_the_masters_log_lines_of_a_batch_keep_their_order_after_trials_and_appends(
    store: Store,
) -> None:
    batch = WriteBatch()
    experiment_id = _experiment(batch, store)
    first, second = _trial(batch, store, experiment_id), _trial(batch, store, experiment_id, "r1")
    # Lines of trials the same batch inserts, interleaved between two trials.
    batch.log(first, 1, "first 1", level="INFO", now=NOW)
    batch.log(second, 1, "second 1", level="WARNING", now=NOW)
    batch.log(first, 1, "first 2", level="ERROR", now=NOW)
    store.apply(batch)
    store.append_logs(first, 1, [LogLine(message="from the trial", rank=0)])
    later = WriteBatch()
    later.log(first, 2, "first 3", level="INFO", now=NOW)
    store.apply(later)

    lines = store.tail_logs(first)
    assert [(line.message, line.level, line.run_id) for line in lines] == [
        ("first 1", "INFO", 1),
        ("first 2", "ERROR", 1),
        ("from the trial", None, 1),
        ("first 3", "INFO", 2),
    ]
    assert [line.id for line in lines] == sorted(line.id for line in lines)
    assert [(line.message, line.stream) for line in store.tail_logs(second)] == [
        ("second 1", "stderr")
    ]


def test_a_log_line_of_an_unknown_trial_fails_its_whole_batch(store: Store) -> None:
    from sqlalchemy.exc import IntegrityError

    experiment_id = seed.experiment(store, description="kept")
    batch = WriteBatch()
    batch.set_experiment(experiment_id, description="changed")
    batch.log(987654, 1, "nobody's", level="INFO", now=NOW)
    with pytest.raises(IntegrityError):
        store.apply(batch)
    assert store.tail_logs(987654) == []
    assert store.get_experiment(experiment_id).description == "kept"
