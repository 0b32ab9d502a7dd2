"""A checkpoint's validation metrics are the ones its run reported at its batch, whichever
of the two reports came first (a Core API script sends them separately), on SQLite and
PostgreSQL; garbage collection ranks checkpoints by them."""

from __future__ import annotations

import math
import uuid as uuidlib
from pathlib import Path
from typing import Any

import pytest

from assay.common.storage import storage_for
from assay.config import parse_config
from assay.master.checkpoints import collect, searcher_metric
from assay.master.errors import ConflictError
from assay.master.store import CheckpointRecord, MetricReport, Store
from tests.conftest import regression_config
from tests.store import _seed as seed


def _checkpoint(
    trial_id: int, run_id: int, batches: int, reported: dict[str, float] | None = None
) -> CheckpointRecord:
    uid = str(uuidlib.uuid4())
    return CheckpointRecord(
        uuid=uid,
        trial_id=trial_id,
        run_id=run_id,
        total_batches=batches,
        state="COMPLETED",
        location=f"/ckpt/{uid}",
        files={"state.pt": 10},
        user_metadata={"sha256": {"state.pt": "0" * 64}, "validation_metrics": reported or {}},
    )


def _validate(store: Store, trial_id: int, run_id: int, batches: int, **values: Any) -> None:
    store.report_metrics_and_progress(
        trial_id,
        run_id,
        "validation",
        [MetricReport(batches, values)],
        searcher_metric="vloss",
    )


def _metrics(record: CheckpointRecord) -> dict[str, float]:
    return dict(record.user_metadata.get("validation_metrics", {}))


def test_validation_reported_before_the_checkpoint_is_its_metric(store: Store) -> None:
    _, tid, run = seed.trial_with_run(store)
    _validate(store, tid, run, 20, vloss=0.1)
    checkpoint = _checkpoint(tid, run, 20)

    store.add_checkpoint(checkpoint)

    assert _metrics(store.get_checkpoint(checkpoint.uuid)) == {"vloss": 0.1}
    [listed] = store.list_checkpoints(tid)
    assert _metrics(listed) == {"vloss": 0.1}
    assert searcher_metric(listed, "vloss") == 0.1


def test_validation_reported_after_the_checkpoint_is_its_metric(store: Store) -> None:
    _, tid, run = seed.trial_with_run(store)
    checkpoint = _checkpoint(tid, run, 20)
    store.add_checkpoint(checkpoint)
    assert _metrics(store.get_checkpoint(checkpoint.uuid)) == {}

    _validate(store, tid, run, 20, vloss=0.1)

    assert _metrics(store.get_checkpoint(checkpoint.uuid)) == {"vloss": 0.1}
    assert [_metrics(c) for c in store.list_checkpoints(tid)] == [{"vloss": 0.1}]


def test_only_the_validation_at_the_checkpoints_own_batch_counts(store: Store) -> None:
    _, tid, run = seed.trial_with_run(store)
    _validate(store, tid, run, 10, vloss=0.5)
    at_15 = _checkpoint(tid, run, 15)
    at_20 = _checkpoint(tid, run, 20)
    for c in (at_15, at_20):
        store.add_checkpoint(c)
    _validate(store, tid, run, 20, vloss=0.1)
    _validate(store, tid, run, 30, vloss=0.05)
    store.report_metrics(tid, run, "training", [MetricReport(15, {"vloss": 9.0})])

    assert _metrics(store.get_checkpoint(at_15.uuid)) == {}
    assert searcher_metric(store.get_checkpoint(at_15.uuid), "vloss") is None
    assert [_metrics(c) for c in store.list_checkpoints(tid)] == [{}, {"vloss": 0.1}]


def test_metrics_reported_separately_at_one_batch_all_belong_to_it(store: Store) -> None:
    _, tid, run = seed.trial_with_run(store)
    _validate(store, tid, run, 20, vloss=0.1)
    checkpoint = _checkpoint(tid, run, 20)
    store.add_checkpoint(checkpoint)
    _validate(store, tid, run, 20, acc=0.9, broken=float("nan"))

    metrics = _metrics(store.get_checkpoint(checkpoint.uuid))

    assert metrics["vloss"] == 0.1
    assert metrics["acc"] == 0.9
    assert math.isnan(metrics["broken"])
    assert searcher_metric(store.get_checkpoint(checkpoint.uuid), "broken") is None


def test_what_the_report_of_the_checkpoint_carried_is_kept(store: Store) -> None:
    """A Trial's checkpoint report carries its validation: the rows only add to it."""
    _, tid, run = seed.trial_with_run(store)
    _validate(store, tid, run, 20, vloss=0.1, acc=0.9)
    checkpoint = _checkpoint(tid, run, 20, reported={"vloss": 0.1})
    store.add_checkpoint(checkpoint)

    assert _metrics(store.get_checkpoint(checkpoint.uuid)) == {"vloss": 0.1, "acc": 0.9}
    # A Trial checkpoint with no validation at its batch stays without one.
    later = _checkpoint(tid, run, 25)
    store.add_checkpoint(later)
    assert _metrics(store.get_checkpoint(later.uuid)) == {}


def test_another_runs_validation_at_the_same_batch_is_not_paired(store: Store) -> None:
    """Run 1 checkpoints at 30 and fails; run 2 resumes from 20 and reaches 30 again:
    each checkpoint at 30 has its own run's validation, superseded or not."""
    _, tid, first = seed.trial_with_run(store)
    old = _checkpoint(tid, first, 30)
    store.add_checkpoint(old)
    _validate(store, tid, first, 30, vloss=0.9)
    second = seed.start_run(store, tid, restored_batches=20)
    new = _checkpoint(tid, second, 30)
    store.add_checkpoint(new)
    _validate(store, tid, second, 30, vloss=0.3)

    assert _metrics(store.get_checkpoint(old.uuid)) == {"vloss": 0.9}
    assert _metrics(store.get_checkpoint(new.uuid)) == {"vloss": 0.3}
    by_uuid = {c.uuid: _metrics(c) for c in store.list_checkpoints(tid)}
    assert by_uuid == {old.uuid: {"vloss": 0.9}, new.uuid: {"vloss": 0.3}}


def test_a_retried_checkpoint_report_is_still_a_no_op_once_validated(store: Store) -> None:
    _, tid, run = seed.trial_with_run(store)
    checkpoint = _checkpoint(tid, run, 20)
    store.add_checkpoint(checkpoint)
    _validate(store, tid, run, 20, vloss=0.1)

    store.add_checkpoint(checkpoint)  # the retry of a report whose reply was lost
    with pytest.raises(ConflictError):
        store.add_checkpoint(CheckpointRecord(**{**checkpoint.__dict__, "location": "/elsewhere"}))

    assert [_metrics(c) for c in store.list_checkpoints(tid)] == [{"vloss": 0.1}]


@pytest.mark.parametrize("validation_first", [True, False])
def test_collection_keeps_the_best_script_checkpoint(
    store: Store, tmp_path: Path, validation_first: bool
) -> None:
    """The user's script: vloss 0.5, 0.1, 0.9, 0.8 at 10-40, a checkpoint at each; with
    save_trial_best 1 and save_trial_latest 1, batches 20 and 40 survive."""
    config = regression_config(batches=40)
    config["searcher"]["metric"] = "vloss"
    config["checkpoint_storage"] = {"type": "shared_fs", "host_path": str(tmp_path / "fs")}
    eid = seed.experiment(store, name="gc-best", config=config)
    tid = seed.trial(store, eid)
    run = seed.start_run(store, tid)
    storage = storage_for(parse_config(config).checkpoint_storage, experiment_id=eid)
    by_batches: dict[int, str] = {}
    for batches, vloss in ((10, 0.5), (20, 0.1), (30, 0.9), (40, 0.8)):
        if validation_first:
            _validate(store, tid, run, batches, vloss=vloss)
        uid = str(uuidlib.uuid4())
        local = tmp_path / "local" / uid
        local.mkdir(parents=True)
        (local / "state.pt").write_bytes(b"x" * 10)
        (local / "metadata.json").write_text("{}")
        location = storage.upload(local, uid)
        store.add_checkpoint(
            CheckpointRecord(
                uuid=uid,
                trial_id=tid,
                run_id=run,
                total_batches=batches,
                state="COMPLETED",
                location=location,
                files={"state.pt": 10},
                user_metadata={"validation_metrics": {}},
            )
        )
        by_batches[batches] = uid
        if not validation_first:
            _validate(store, tid, run, batches, vloss=vloss)
    seed.set_trial(store, tid, state="COMPLETED")

    result = collect(store, eid, parse_config(config), ended_trial_ids=[tid])

    assert sorted(result.deleted) == sorted([by_batches[10], by_batches[30]])
    states = {c.total_batches: c.state for c in store.list_checkpoints(tid)}
    assert states == {10: "DELETED", 20: "COMPLETED", 30: "DELETED", 40: "COMPLETED"}
    assert storage.exists(by_batches[20])
