"""GC and `DeleteCheckpoints` against real stores (SQLite and PostgreSQL) and real storage
(a shared_fs directory, and S3 on a moto server on loopback)."""

from __future__ import annotations

import hashlib
import uuid as uuidlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from assay.common.storage import SharedFSStorage, StorageManager, storage_for
from assay.config import parse_config
from assay.master.checkpoints import collect, delete_checkpoints
from assay.master.errors import ConflictError, NotFoundError
from assay.master.store import CheckpointRecord, Store
from tests.conftest import S3Server, regression_config
from tests.store import _seed as seed


@dataclass
class Setup:
    store: Store
    storage: StorageManager
    config: dict[str, Any]
    experiment_id: int
    uuids: dict[str, str]  # name -> uuid
    trials: dict[str, int]

    @property
    def parsed(self) -> Any:
        return parse_config(self.config)

    def state(self, name: str) -> str:
        return self.store.get_checkpoint(self.uuids[name]).state

    def stored(self, name: str) -> bool:
        return self.storage.exists(self.uuids[name])


def _write(storage: StorageManager, tmp: Path, uuid: str) -> str:
    local = tmp / "local" / uuid
    local.mkdir(parents=True)
    (local / "models.pt").write_bytes(uuid.encode() * 100)
    (local / "metadata.json").write_text("{}")
    return storage.upload(local, uuid)


@pytest.fixture(params=["shared_fs", "shared_fs-flat", "s3"])
def setup(request: pytest.FixtureRequest, store: Store, tmp_path: Path) -> Setup:
    """Trial a (COMPLETED): a10 0.5, a20 0.3, a30 0.4, a40 without a metric (its latest);
    trial b (RUNNING): b10 0.1, b20 0.2 (its latest); save_* at their defaults (1, 1, 0).

    shared_fs: in the experiment's directory; shared_fs-flat: at `<root>/<uuid>`, where
    they were written before experiments had directories of their own."""
    config = regression_config(batches=40)
    if request.param.startswith("shared_fs"):
        config["checkpoint_storage"] = {"type": "shared_fs", "host_path": str(tmp_path / "fs")}
    else:
        server: S3Server = request.getfixturevalue("s3_server")
        config["checkpoint_storage"] = server.storage_config(server.new_bucket())
    eid = seed.experiment(store, name="gc", owner="alice", config=config)
    flat = request.param == "shared_fs-flat"
    storage = storage_for(
        parse_config(config).checkpoint_storage, experiment_id=None if flat else eid
    )
    uuids: dict[str, str] = {}
    trials: dict[str, int] = {}
    plan: dict[str, list[tuple[int, float | None]]] = {
        "a": [(10, 0.5), (20, 0.3), (30, 0.4), (40, None)],
        "b": [(10, 0.1), (20, 0.2)],
    }
    for trial, checkpoints in plan.items():
        tid = trials[trial] = seed.trial(store, eid, request_id=trial, seed=1)
        run = seed.start_run(store, tid)
        for batches, metric in checkpoints:
            name = f"{trial}{batches}"
            uuid = uuids[name] = str(uuidlib.uuid4())
            location = _write(storage, tmp_path, uuid)
            store.add_checkpoint(
                CheckpointRecord(
                    uuid=uuid,
                    trial_id=tid,
                    run_id=run,
                    total_batches=batches,
                    state="COMPLETED",
                    location=location,
                    files={"models.pt": 3600},
                    user_metadata={
                        "sha256": {"models.pt": hashlib.sha256(b"").hexdigest()},
                        "validation_metrics": {} if metric is None else {"val_loss": metric},
                    },
                )
            )
    seed.set_trial(store, trials["a"], state="COMPLETED")
    seed.set_trial(store, trials["b"], state="RUNNING")
    return Setup(store, storage, config, eid, uuids, trials)


def test_collect_deletes_what_the_policy_says_and_marks_it(setup: Setup) -> None:
    result = collect(
        setup.store, setup.experiment_id, setup.parsed, ended_trial_ids=[setup.trials["a"]]
    )

    assert sorted(result.deleted) == sorted([setup.uuids["a10"], setup.uuids["a30"]])
    assert result.missing == ()
    assert result.failed == {}
    for name in ("a10", "a30"):
        assert setup.state(name) == "DELETED"
        assert not setup.stored(name)
    for name in ("a20", "a40", "b10", "b20"):
        assert setup.state(name) == "COMPLETED"
        assert setup.stored(name)


def test_a_second_collection_does_nothing(setup: Setup) -> None:
    collect(setup.store, setup.experiment_id, setup.parsed, ended_trial_ids=[setup.trials["a"]])

    again = collect(
        setup.store, setup.experiment_id, setup.parsed, ended_trial_ids=[setup.trials["a"]]
    )

    assert (again.deleted, again.missing, dict(again.failed)) == ((), (), {})


def test_files_already_gone_count_as_deleted_and_missing(setup: Setup) -> None:
    assert setup.storage.delete(setup.uuids["a10"])

    result = collect(setup.store, setup.experiment_id, setup.parsed, ended_trial_ids=[])

    # Trial a is COMPLETED in the store: it counts as ended without being named.
    assert sorted(result.deleted) == sorted([setup.uuids["a10"], setup.uuids["a30"]])
    assert result.missing == (setup.uuids["a10"],)
    assert setup.state("a10") == "DELETED"


def test_experiment_end_with_experiment_best(setup: Setup) -> None:
    config = dict(setup.config)
    config["checkpoint_storage"] = {
        **config["checkpoint_storage"],
        "save_trial_best": 0,
        "save_trial_latest": 0,
        "save_experiment_best": 2,
    }
    seed.set_trial(setup.store, setup.trials["b"], state="COMPLETED")

    result = collect(setup.store, setup.experiment_id, parse_config(config), experiment_ended=True)

    kept = {name for name, u in setup.uuids.items() if u not in result.deleted}
    assert kept == {"b10", "b20"}
    assert all(not setup.stored(n) for n in ("a10", "a20", "a30", "a40"))


def test_the_latest_of_a_trial_that_has_not_ended_is_never_deleted(setup: Setup) -> None:
    config = dict(setup.config)
    config["checkpoint_storage"] = {
        **config["checkpoint_storage"],
        "save_trial_best": 0,
        "save_trial_latest": 0,
    }
    # A caller that wrongly names a RUNNING trial as ended.
    result = collect(
        setup.store,
        setup.experiment_id,
        parse_config(config),
        ended_trial_ids=[setup.trials["b"]],
    )

    assert setup.uuids["b10"] in result.deleted
    assert setup.uuids["b20"] not in result.deleted
    assert setup.stored("b20")


def test_a_storage_failure_is_reported_and_leaves_the_row(setup: Setup, tmp_path: Path) -> None:
    record = setup.store.get_checkpoint(setup.uuids["a10"])
    broken = tmp_path / "a-file"
    broken.write_text("not a directory")
    if isinstance(setup.storage, SharedFSStorage):
        bad_location = str(broken / record.uuid)
    else:
        bad_location = f"s3://no-such-bucket-{uuidlib.uuid4().hex[:8]}/runs/{record.uuid}"
    with setup.store.write() as s:  # a checkpoint whose storage has gone bad
        from assay.master.store._models import Checkpoint

        row = s.get(Checkpoint, record.uuid)
        assert row is not None
        row.location = bad_location

    result = collect(setup.store, setup.experiment_id, setup.parsed)

    assert result.deleted == (setup.uuids["a30"],)
    assert list(result.failed) == [record.uuid]
    assert record.uuid in result.failed[record.uuid]
    assert setup.state("a10") == "COMPLETED"


# --- DeleteCheckpoints ---------------------------------------------------------------------


def test_delete_refuses_the_latest_of_a_running_trial_and_deletes_nothing(setup: Setup) -> None:
    wanted = [setup.uuids["b10"], setup.uuids["b20"]]

    with pytest.raises(ConflictError, match=f"latest checkpoint of trial {setup.trials['b']}"):
        delete_checkpoints(setup.store, wanted)

    assert setup.state("b10") == setup.state("b20") == "COMPLETED"
    assert setup.stored("b10")


def test_delete_and_delete_again(setup: Setup) -> None:
    wanted = [setup.uuids["b10"], setup.uuids["a40"], setup.uuids["b10"]]

    first = delete_checkpoints(setup.store, wanted)
    second = delete_checkpoints(setup.store, wanted)

    assert first.deleted == (setup.uuids["b10"], setup.uuids["a40"])
    assert first.failed == {}
    assert not setup.stored("b10")
    assert not setup.stored("a40")  # the latest of a COMPLETED trial may go
    assert setup.state("a40") == "DELETED"
    assert sorted(second.deleted) == sorted(first.deleted)


def test_delete_of_an_unknown_uuid_deletes_nothing(setup: Setup) -> None:
    unknown = str(uuidlib.uuid4())
    with pytest.raises(NotFoundError, match=unknown):
        delete_checkpoints(setup.store, [setup.uuids["a10"], unknown])
    assert setup.stored("a10")


def test_shared_fs_checkpoints_are_deleted_in_either_layout(setup: Setup, tmp_path: Path) -> None:
    if not isinstance(setup.storage, SharedFSStorage):
        pytest.skip("shared_fs only")
    location = Path(setup.store.get_checkpoint(setup.uuids["a10"]).location)
    assert location.parent == setup.storage.root
    assert setup.storage.root in (tmp_path / "fs" / str(setup.experiment_id), tmp_path / "fs")

    delete_checkpoints(setup.store, [setup.uuids["a10"]], user="alice")

    assert not location.exists()
    assert setup.state("a10") == "DELETED"
    assert setup.stored("a20")


def test_a_flat_record_of_a_checkpoint_in_the_experiments_directory_is_not_found_there(
    setup: Setup, tmp_path: Path
) -> None:
    """A record's location decides the one place deleted: files elsewhere are left."""
    if not isinstance(setup.storage, SharedFSStorage) or setup.storage.root == tmp_path / "fs":
        pytest.skip("shared_fs in the experiment's directory only")
    uuid = setup.uuids["a10"]
    record = setup.store.get_checkpoint(uuid)
    decoy = tmp_path / "fs" / uuid
    decoy.mkdir(parents=True)  # at the flat place, beside the real one

    result = delete_checkpoints(setup.store, [uuid], user="alice")

    assert list(result.deleted) == [uuid]
    assert not Path(record.location).exists()
    assert decoy.is_dir()
