"""`DeleteExperiment` against real stores (SQLite and PostgreSQL) and real storage
(shared_fs in either layout, and S3 on a moto server): the refusals delete nothing, a
deletion takes files and every row of the experiment and nothing of another."""

from __future__ import annotations

import uuid as uuidlib
from pathlib import Path

import pytest
from sqlalchemy import func, select

from assay.master.checkpoints import delete_experiment
from assay.master.errors import CheckpointInUseError, ConflictError, NotFoundError
from assay.master.store import CheckpointRecord, LogLine, MetricReport, Store, WriteBatch
from assay.master.store._models import Checkpoint, Metric, MetricRollup, TaskLog, Trial
from tests.store import _seed as seed
from tests.store.test_gc import Setup, _write, setup

__all__ = ["setup"]  # the fixture, shared with test_gc


def _end(store: Store, experiment_id: int, state: str = "COMPLETED") -> None:
    batch = WriteBatch()
    batch.set_experiment(experiment_id, state=state)
    seed.commit(store, batch)


def _rows(store: Store, trial_ids: list[int]) -> dict[str, int]:
    with store.read() as s:
        return {
            table.__tablename__: s.execute(
                select(func.count()).select_from(table).where(table.trial_id.in_(trial_ids))
            ).scalar_one()
            for table in (Metric, MetricRollup, TaskLog, Checkpoint)
        }


def _other(setup: Setup, tmp_path: Path) -> tuple[int, str]:
    """Another experiment (same storage) with one checkpoint: what must survive."""
    other = seed.experiment(setup.store, name="other", owner="alice", config=setup.config)
    trial = seed.trial(setup.store, other, request_id="o", seed=1)
    run = seed.start_run(setup.store, trial)
    uuid = str(uuidlib.uuid4())
    location = _write(setup.storage, tmp_path / "other", uuid)
    setup.store.add_checkpoint(
        CheckpointRecord(uuid, trial, run, 10, "COMPLETED", location, {"models.pt": 1})
    )
    seed.set_trial(setup.store, trial, state="COMPLETED")
    _end(setup.store, other)
    return other, uuid


def test_refusals_delete_nothing_then_a_deletion_takes_files_and_rows(
    setup: Setup, tmp_path: Path
) -> None:
    store, eid = setup.store, setup.experiment_id
    trials = list(setup.trials.values())
    store.report_metrics(trials[0], 1, "validation", [MetricReport(10, {"val_loss": 0.5})])
    store.append_logs(trials[0], 1, [LogLine("hello")])
    other, kept = _other(setup, tmp_path)
    before = _rows(store, trials)
    assert before["metrics"] == 1
    assert before["task_logs"] == 1
    assert before["checkpoints"] == 6

    with pytest.raises(ConflictError, match=f"experiment {eid} is ACTIVE: kill it first"):
        delete_experiment(store, eid)
    _end(store, eid)
    seed.set_trial(store, setup.trials["b"], state="CANCELED")
    store.create_model("keeper", owner_id=store.user_id("alice"))
    store.register_version("keeper", setup.uuids["a20"], user_id=store.user_id("alice"))
    with pytest.raises(CheckpointInUseError, match="registered as model 'keeper' version 1"):
        delete_experiment(store, eid)
    assert _rows(store, trials) == before
    assert all(setup.stored(name) for name in setup.uuids)
    store.delete_version("keeper", 1)

    result = delete_experiment(store, eid)

    assert sorted(result.deleted) == sorted(setup.uuids.values())
    assert result.failed == {}
    assert not any(setup.stored(name) for name in setup.uuids)
    assert _rows(store, trials) == {k: 0 for k in before}
    with pytest.raises(NotFoundError, match=f"experiment {eid} does not exist"):
        store.get_experiment(eid)
    with pytest.raises(NotFoundError):
        store.get_checkpoint(setup.uuids["a10"])
    with store.read() as s:
        assert s.execute(select(Trial.id).where(Trial.id.in_(trials))).all() == []
    # The other experiment, its checkpoint and the model are as they were.
    assert store.get_experiment(other).state == "COMPLETED"
    assert store.get_checkpoint(kept).state == "COMPLETED"
    assert setup.storage.exists(kept)
    assert store.get_model("keeper").name == "keeper"
    with pytest.raises(NotFoundError):
        delete_experiment(store, eid)


def test_the_store_checks_again_under_lock(setup: Setup) -> None:
    """A version registered after the files went: the rows stay, the refusal names it."""
    store, eid = setup.store, setup.experiment_id
    _end(store, eid, "CANCELED")
    store.create_model("late", owner_id=store.user_id("alice"))
    store.register_version("late", setup.uuids["b10"], user_id=store.user_id("alice"))
    with pytest.raises(CheckpointInUseError, match="model 'late' version 1"):
        store.delete_experiment(eid)
    assert store.get_experiment(eid).state == "CANCELED"
    assert len(store.list_trials(eid)) == 2


def test_files_that_cannot_be_deleted_are_named_and_the_rows_go(
    setup: Setup, tmp_path: Path
) -> None:
    store, eid = setup.store, setup.experiment_id
    _end(store, eid, "ERROR")
    moved = str(tmp_path / "elsewhere" / setup.uuids["a10"])
    with store.write() as s:  # a record that is not where its storage keeps it
        row = s.get(Checkpoint, setup.uuids["a10"])
        assert row is not None
        row.location = moved

    result = delete_experiment(store, eid)

    assert list(result.failed) == [setup.uuids["a10"]]
    assert moved in result.failed[setup.uuids["a10"]]
    assert setup.stored("a10")  # left for an administrator
    assert len(result.deleted) == 5
    with pytest.raises(NotFoundError):
        store.get_experiment(eid)
