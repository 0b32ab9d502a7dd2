"""A trial runs its user's code and holds its allocation's token, so its checkpoint reports
may say anything. Only a checkpoint uuid at the place the experiment's storage gives it is
recorded, and deletion (garbage collection, `DeleteCheckpoints`) removes that place only,
never a location a record names: a trial cannot steer the master into deleting the shared
checkpoint directory, another experiment's checkpoint, or objects in a bucket it chose."""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
import yaml

from assay.common.storage import (
    S3Storage,
    SharedFSStorage,
    StorageError,
    checkpoint_location,
    checkpoint_uuid,
    trial_storage,
)
from assay.config import parse_config
from assay.master._server import MasterServer
from assay.master.checkpoints import delete_checkpoint
from assay.master.store import CheckpointRecord, Store
from assay.proto import agent_pb2, api_pb2, api_pb2_grpc, common_pb2, trial_pb2
from tests.credentials import authed_api, login
from tests.master.conftest import Process, ScriptedAgent, eventually, experiment_yaml, model_archive

S3 = {"type": "s3", "bucket": "mine", "prefix": "exp"}

# --- the rule both the harness and the master follow ------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "checkpoints",
        "",
        "..",
        "a/b",
        "123E4567-E89B-42D3-A456-426614174000",  # upper case
        "123e4567e89b42d3a456426614174000",  # no hyphens
        "{123e4567-e89b-42d3-a456-426614174000}",
        "urn:uuid:123e4567-e89b-42d3-a456-426614174000",
        " 123e4567-e89b-42d3-a456-426614174000",
        "123e4567-e89b-42d3-a456-426614174000/..",
    ],
)
def test_only_a_canonical_uuid_names_a_checkpoint(text: str) -> None:
    with pytest.raises(StorageError, match="is not a checkpoint uuid"):
        checkpoint_uuid(text)


def test_the_location_follows_the_experiments_storage(tmp_path: Path) -> None:
    name = str(uuidlib.uuid4())
    assert checkpoint_uuid(name) == name
    config = parse_config(_config()).checkpoint_storage
    assert checkpoint_location(config, name, tmp_path, experiment_id=7) == str(
        tmp_path / "7" / name
    )
    assert checkpoint_location(config, name, tmp_path) == str(tmp_path / name)  # off-cluster
    own = {"type": "shared_fs", "host_path": str(tmp_path / "fs"), "storage_path": "runs"}
    config = parse_config(_config(checkpoint_storage=own)).checkpoint_storage
    assert checkpoint_location(config, name, tmp_path, experiment_id=7) == str(
        tmp_path / "fs" / "runs" / "7" / name
    )
    # What a trial reports: its storage rooted at the directory the master named.
    assert trial_storage(config, tmp_path / "fs" / "runs" / "7").location(name) == str(
        tmp_path / "fs" / "runs" / "7" / name
    )
    for bad in (-1, True, "7"):
        with pytest.raises(StorageError, match="is not an integer"):
            checkpoint_location(config, name, tmp_path, experiment_id=bad)  # type: ignore[arg-type]
    config = parse_config(_config(checkpoint_storage=S3)).checkpoint_storage
    assert checkpoint_location(config, name, tmp_path) == f"s3://mine/exp/{name}"
    assert checkpoint_location(config, name, tmp_path, experiment_id=7) == f"s3://mine/exp/{name}"
    with pytest.raises(StorageError):
        checkpoint_location(config, "checkpoints", tmp_path)


# --- reports --------------------------------------------------------------------------------


@dataclass
class Running:
    """An experiment whose one trial runs, played by `process`."""

    experiment_id: int
    start: agent_pb2.StartAllocation
    process: Process

    def report(self, name: str, location: str, total: int = 10) -> None:
        checkpoint = common_pb2.Checkpoint(uuid=name, total_batches=total, location=location)
        self.process.stub.ReportCheckpoint(
            trial_pb2.ReportCheckpointRequest(
                trial_id=self.process.trial_id, run_id=self.process.run_id, checkpoint=checkpoint
            ),
            metadata=self.process.meta,
        )


@pytest.fixture
def agent(master: MasterServer) -> Iterator[ScriptedAgent]:
    agent = ScriptedAgent(master.port, "a1", slots=4)
    yield agent
    agent.close()


@pytest.fixture
def run(
    master: MasterServer, api: api_pb2_grpc.ApiStub, agent: ScriptedAgent
) -> Iterator[Callable[..., Running]]:
    processes: list[Process] = []

    def start(**overrides: Any) -> Running:
        eid = _create(api, **overrides)
        message = agent.next("start").start
        assert message.experiment_id == eid
        process = Process(master.port, message)
        processes.append(process)
        return Running(eid, message, process)

    yield start
    for process in processes:
        process.close()


def _config(**overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(experiment_yaml(**overrides))
    return config


def _create(api: api_pb2_grpc.ApiStub, **overrides: Any) -> int:
    response: api_pb2.CreateExperimentResponse = api.CreateExperiment(
        api_pb2.CreateExperimentRequest(
            config_yaml=experiment_yaml(**overrides),
            model_definition=model_archive(),
            activate=True,
        )
    )
    return int(response.experiment.id)


def _write_checkpoint(directory: Path) -> Path:
    directory.mkdir(parents=True)
    (directory / "models.pt").write_bytes(b"weights")
    (directory / "metadata.json").write_text("{}")
    return directory


def _refused(call: Callable[[], object], code: grpc.StatusCode, match: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() == code, info.value.details()
    assert match in (info.value.details() or "")


def test_the_reviewed_forgery_is_refused_and_deletes_nothing(
    master: MasterServer, api: api_pb2_grpc.ApiStub, run: Callable[..., Running]
) -> None:
    root = master.config.checkpoint_root
    kept = _write_checkpoint(root / str(uuidlib.uuid4()))  # another user's checkpoint
    attacker = run()

    _refused(
        lambda: attacker.report("checkpoints", str(root)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "is not a checkpoint uuid",
    )
    _refused(
        lambda: api.DeleteCheckpoints(api_pb2.DeleteCheckpointsRequest(uuids=["checkpoints"])),
        grpc.StatusCode.INVALID_ARGUMENT,
        "'checkpoints'",
    )

    assert master.store.list_checkpoints(attacker.start.trial_id) == []
    assert kept.is_dir()


def test_forged_shared_fs_locations_are_refused(
    master: MasterServer, run: Callable[..., Running], tmp_path: Path
) -> None:
    root = master.config.checkpoint_root
    victim = run()
    theirs = victim.process.report(10, 0.5)  # at root/<experiment>/<theirs>, the legit place
    attacker = run()
    own = root / str(attacker.experiment_id)
    assert attacker.start.checkpoint_root == str(own)
    mine = str(uuidlib.uuid4())
    forged = [
        (mine, str(tmp_path / "elsewhere" / mine)),  # outside the storage root
        (mine, str(root / str(victim.experiment_id) / theirs)),  # another's checkpoint
        (mine, str(root / str(victim.experiment_id) / mine)),  # in another's directory
        (mine, str(root / mine)),  # the flat place of checkpoints from before
        (mine, str(own)),  # its directory itself
        (mine, str(root)),  # the root itself
        (mine, f"{own}/../{mine}"),
        (mine, f"{own}/{mine}/"),
        (mine.upper(), str(own / mine.upper())),  # not the canonical uuid
        (mine, f"s3://mine/exp/{mine}"),
    ]
    for name, location in forged:
        _refused(
            lambda: attacker.report(name, location),  # noqa: B023
            grpc.StatusCode.INVALID_ARGUMENT,
            "checkpoint report refused",
        )
    # Its own place, with the other experiment's uuid: the uuid is taken.
    _refused(
        lambda: attacker.report(theirs, str(own / theirs)),
        grpc.StatusCode.FAILED_PRECONDITION,
        "already recorded",
    )

    assert master.store.list_checkpoints(attacker.start.trial_id) == []
    assert master.store.get_checkpoint(theirs).trial_id == victim.start.trial_id


def test_forged_s3_locations_are_refused(master: MasterServer, run: Callable[..., Running]) -> None:
    attacker = run(checkpoint_storage=S3)
    name = str(uuidlib.uuid4())
    for location in (
        f"s3://other-bucket/exp/{name}",
        f"s3://mine/other-prefix/{name}",
        f"s3://mine/{name}",
        "s3://mine/exp",
        str(master.config.checkpoint_root / name),
    ):
        _refused(
            lambda: attacker.report(name, location),  # noqa: B023
            grpc.StatusCode.INVALID_ARGUMENT,
            f"must be at s3://mine/exp/{name}",
        )

    attacker.report(name, f"s3://mine/exp/{name}")  # its own place is fine

    [recorded] = master.store.list_checkpoints(attacker.start.trial_id)
    assert recorded.location == f"s3://mine/exp/{name}"


def test_a_legit_report_is_recorded_and_deleted_by_its_owner(
    master: MasterServer, api: api_pb2_grpc.ApiStub, run: Callable[..., Running]
) -> None:
    mine = run()
    root = master.config.checkpoint_root / str(mine.experiment_id)
    older = mine.process.report(50, 0.9)
    newer = mine.process.report(100, 0.5)  # the latest: the running trial restores from it
    for name in (older, newer):
        _write_checkpoint(root / name)

    answer = api.DeleteCheckpoints(
        api_pb2.DeleteCheckpointsRequest(uuids=[f"  {older.upper()} ", older])
    )

    assert list(answer.deleted) == [older]
    assert dict(answer.failed) == {}
    assert not (root / older).exists()
    assert (root / newer).is_dir()
    assert master.store.get_checkpoint(older).state == "DELETED"
    assert master.store.get_checkpoint(older).location == str(root / older)


def test_in_default_viewers_and_editors_may_not_delete_anothers_an_admin_of_it_may(
    master: MasterServer, api: api_pb2_grpc.ApiStub, run: Callable[..., Running]
) -> None:
    admins = run()  # created by admin
    root = Path(admins.start.checkpoint_root)
    older = admins.process.report(50, 0.9)
    admins.process.report(100, 0.5)
    _write_checkpoint(root / older)
    api.CreateUser(api_pb2.CreateUserRequest(username="bob", password="bob-password-123"))
    member = api_pb2.SetWorkspaceMemberRequest(workspace="Default", username="bob", role="viewer")
    api.SetWorkspaceMember(member)
    address = f"127.0.0.1:{master.port}"
    bob, channel = authed_api(address, login(address, "bob", "bob-password-123"))
    try:
        for spelling in (older, f" {older.upper()}\n"):
            _refused(
                lambda: bob.DeleteCheckpoints(
                    api_pb2.DeleteCheckpointsRequest(uuids=[spelling])  # noqa: B023
                ),
                grpc.StatusCode.PERMISSION_DENIED,
                "bob is a viewer of workspace 'Default'",
            )
        # Default is every user's: an editor there deletes only their own checkpoints.
        member.role = "editor"
        api.SetWorkspaceMember(member)
        _refused(
            lambda: bob.DeleteCheckpoints(api_pb2.DeleteCheckpointsRequest(uuids=[older])),
            grpc.StatusCode.PERMISSION_DENIED,
            "belongs to admin: in the shared workspace 'Default' only its owner and admins",
        )
        assert (root / older).is_dir()
        assert master.store.get_checkpoint(older).state == "COMPLETED"
        member.role = "admin"
        api.SetWorkspaceMember(member)
        answer = bob.DeleteCheckpoints(api_pb2.DeleteCheckpointsRequest(uuids=[older]))
        assert list(answer.deleted) == [older]
    finally:
        channel.close()
    assert not (root / older).exists()
    assert master.store.get_checkpoint(older).state == "DELETED"


# --- records already in the store ----------------------------------------------------------


def _record(running: Running, name: str, location: str, total: int) -> CheckpointRecord:
    return CheckpointRecord(
        uuid=name,
        trial_id=running.start.trial_id,
        run_id=running.start.run_id,
        total_batches=total,
        state="COMPLETED",
        location=location,
        files={"models.pt": 7},
        user_metadata={},
    )


def test_forged_records_in_the_store_are_never_deleted_from_storage(
    master: MasterServer,
    api: api_pb2_grpc.ApiStub,
    agent: ScriptedAgent,
    run: Callable[..., Running],
    tmp_path: Path,
) -> None:
    root = master.config.checkpoint_root
    shared = _write_checkpoint(root / str(uuidlib.uuid4()))  # another user's checkpoint
    elsewhere = str(uuidlib.uuid4())
    outside = _write_checkpoint(tmp_path / "other-experiment" / elsewhere)
    trial = run()
    # As an older master recorded them from forged reports.
    master.store.add_checkpoint(_record(trial, "checkpoints", str(root), 10))
    master.store.add_checkpoint(_record(trial, elsewhere, str(outside), 20))
    legit = trial.process.report(50, 0.9)
    _write_checkpoint(root / str(trial.experiment_id) / legit)
    trial.process.validate(100, 0.5)
    assert trial.process.next_op(100).stop
    agent.exited(trial.start.allocation_id, [0])

    # The trial ended: garbage collection deletes all but its best and latest.
    eventually(lambda: master.store.get_checkpoint(legit).state == "DELETED")
    assert not (root / str(trial.experiment_id) / legit).exists()
    for name in ("checkpoints", elsewhere):
        assert master.store.get_checkpoint(name).state == "COMPLETED"
    assert shared.is_dir()
    assert outside.is_dir()

    answer = api.DeleteCheckpoints(api_pb2.DeleteCheckpointsRequest(uuids=[elsewhere]))

    assert list(answer.deleted) == []
    assert "not where its experiment's storage keeps it" in answer.failed[elsewhere]
    assert master.store.get_checkpoint(elsewhere).state == "COMPLETED"
    assert outside.is_dir()
    assert shared.is_dir()


class _Untouched:
    def set_checkpoint_state(self, uuid: str, state: str) -> None:
        raise AssertionError(f"checkpoint {uuid} was marked {state}")


def test_a_forged_s3_record_is_not_deleted_from_any_bucket() -> None:
    name = str(uuidlib.uuid4())
    storage = S3Storage("mine", "exp")
    record = CheckpointRecord(
        uuid=name,
        trial_id=1,
        run_id=1,
        total_batches=10,
        state="COMPLETED",
        location=f"s3://other-bucket/exp/{name}",
        files={},
        user_metadata={},
    )

    with pytest.raises(StorageError, match=f"s3://mine/exp/{name}"):
        delete_checkpoint(cast(Store, _Untouched()), record, storage)

    assert storage._client is None  # no S3 call was made


def test_records_of_the_flat_layout_are_deleted_there_and_nowhere_else(
    master: MasterServer, api: api_pb2_grpc.ApiStub, run: Callable[..., Running]
) -> None:
    root = master.config.checkpoint_root
    trial = run()
    flat, moved = str(uuidlib.uuid4()), str(uuidlib.uuid4())
    # Recorded before experiments had directories of their own: at root/<uuid>.
    old = _write_checkpoint(root / flat)
    master.store.add_checkpoint(_record(trial, flat, str(old), 10))
    # Recorded at the flat place while its files sit in the experiment's directory:
    # the record says where, so only that place is tried.
    master.store.add_checkpoint(_record(trial, moved, str(root / moved), 20))
    beside = _write_checkpoint(root / str(trial.experiment_id) / moved)
    trial.process.report(30, 0.5)  # the latest, kept while the trial runs

    answer = api.DeleteCheckpoints(api_pb2.DeleteCheckpointsRequest(uuids=[flat, moved]))

    assert sorted(answer.deleted) == sorted([flat, moved])
    assert list(answer.missing) == [moved]
    assert not old.exists()
    assert beside.is_dir()


def test_a_record_naming_another_experiments_directory_is_not_deleted(tmp_path: Path) -> None:
    name = str(uuidlib.uuid4())
    theirs = _write_checkpoint(tmp_path / "8" / name)
    record = CheckpointRecord(
        uuid=name,
        trial_id=1,
        run_id=1,
        total_batches=10,
        state="COMPLETED",
        location=str(theirs),
        files={},
        user_metadata={},
    )

    with pytest.raises(StorageError, match="not where its experiment's storage keeps it"):
        delete_checkpoint(
            cast(Store, _Untouched()),
            record,
            SharedFSStorage(tmp_path / "7"),
            [SharedFSStorage(tmp_path)],
        )

    assert theirs.is_dir()
