"""A registered checkpoint is pinned: GC keeps it, deleting it is refused naming the
versions of models in its own workspace, and once its last version is deleted it is a
checkpoint like any other. A version of a model in another workspace keeps it from GC
but never from its owner: deleting it marks that version. Real stores (SQLite and
PostgreSQL) and real shared_fs storage."""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass
from pathlib import Path

import pytest

from assay.common.storage import StorageManager, storage_for
from assay.config import parse_config
from assay.master.checkpoints import collect, delete_checkpoints
from assay.master.errors import CheckpointInUseError
from assay.master.store import CheckpointRecord, Store
from tests.conftest import regression_config
from tests.store import _seed as seed


@dataclass
class Setup:
    store: Store
    storage: StorageManager
    config: dict[str, object]
    experiment_id: int
    trial_id: int
    uuids: dict[int, str]  # batches -> uuid


@pytest.fixture
def setup(store: Store, tmp_path: Path) -> Setup:
    """A COMPLETED trial with checkpoints at 10, 20 and 30 batches (val_loss 0.5, 0.3,
    0.4): with save_trial_best 1 and save_trial_latest 1, GC deletes the one at 10."""
    config = regression_config(batches=30)
    config["checkpoint_storage"] = {"type": "shared_fs", "host_path": str(tmp_path / "fs")}
    eid = seed.experiment(store, name="pin", owner="alice", config=config)
    storage = storage_for(parse_config(config).checkpoint_storage, experiment_id=eid)
    tid = seed.trial(store, eid, request_id="a", seed=1)
    run = seed.start_run(store, tid)
    uuids: dict[int, str] = {}
    for batches, metric in ((10, 0.5), (20, 0.3), (30, 0.4)):
        uuid = uuids[batches] = str(uuidlib.uuid4())
        local = tmp_path / "local" / uuid
        local.mkdir(parents=True)
        (local / "model.pt").write_bytes(b"w" * 10)
        (local / "metadata.json").write_text("{}")
        store.add_checkpoint(
            CheckpointRecord(
                uuid=uuid,
                trial_id=tid,
                run_id=run,
                total_batches=batches,
                state="COMPLETED",
                location=storage.upload(local, uuid),
                files={"model.pt": 10},
                user_metadata={"validation_metrics": {"val_loss": metric}},
            )
        )
    seed.set_trial(store, tid, state="COMPLETED")
    return Setup(store, storage, config, eid, tid, uuids)


def _register(setup: Setup, model: str, batches: int) -> None:
    store = setup.store
    try:
        store.get_model(model)
    except Exception:
        store.create_model(model, owner_id=store.user_id("alice"))
    store.register_version(model, setup.uuids[batches], user_id=store.user_id("bob"))


def test_gc_keeps_a_registered_checkpoint_its_policy_would_delete(setup: Setup) -> None:
    _register(setup, "m", 10)

    result = collect(
        setup.store, setup.experiment_id, parse_config(setup.config), experiment_ended=True
    )

    assert result.deleted == ()
    assert setup.store.get_checkpoint(setup.uuids[10]).state == "COMPLETED"
    assert setup.storage.exists(setup.uuids[10])


def test_gc_deletes_it_once_no_version_pins_it(setup: Setup) -> None:
    _register(setup, "m", 10)
    setup.store.delete_version("m", 1)

    result = collect(
        setup.store, setup.experiment_id, parse_config(setup.config), experiment_ended=True
    )

    assert result.deleted == (setup.uuids[10],)
    assert not setup.storage.exists(setup.uuids[10])


def test_deleting_a_registered_checkpoint_is_refused_naming_the_versions(setup: Setup) -> None:
    _register(setup, "m", 10)
    _register(setup, "other", 10)

    with pytest.raises(CheckpointInUseError, match=r"'m' version 1, model 'other' version 1"):
        delete_checkpoints(setup.store, [setup.uuids[20], setup.uuids[10]])

    # The whole request was refused: the unregistered one is still there too.
    for batches in (10, 20):
        assert setup.store.get_checkpoint(setup.uuids[batches]).state == "COMPLETED"
        assert setup.storage.exists(setup.uuids[batches])


def _register_elsewhere(setup: Setup, batches: int) -> None:
    """Register the checkpoint in bob's model of another workspace than its own."""
    store = setup.store
    elsewhere = store.create_workspace("elsewhere", store.user_id("bob")).id
    store.create_model("bobs", owner_id=store.user_id("bob"), workspace_id=elsewhere)
    store.register_version("bobs", setup.uuids[batches], user_id=store.user_id("bob"))


def test_gc_keeps_a_checkpoint_registered_from_another_workspace(setup: Setup) -> None:
    _register_elsewhere(setup, 10)

    result = collect(
        setup.store, setup.experiment_id, parse_config(setup.config), experiment_ended=True
    )

    assert result.deleted == ()
    assert setup.storage.exists(setup.uuids[10])


def test_its_owner_deletes_it_all_the_same_and_the_version_says_so(setup: Setup) -> None:
    _register_elsewhere(setup, 10)
    _register(setup, "m", 20)  # of its own workspace: this one stays pinned

    result = delete_checkpoints(setup.store, [setup.uuids[10]])

    assert (result.deleted, result.failed) == ((setup.uuids[10],), {})
    assert not setup.storage.exists(setup.uuids[10])
    version = setup.store.get_version("bobs", 1)
    assert version.checkpoint_deleted_at is not None
    assert setup.store.checkpoint_references([setup.uuids[10]]) == {}
    with pytest.raises(CheckpointInUseError, match="'m' version 1"):
        delete_checkpoints(setup.store, [setup.uuids[20]])
