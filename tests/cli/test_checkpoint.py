"""`assay checkpoint list|download|delete`: download copies a shared_fs directory, or fetches
an s3 one from a moto server on loopback, and verifies it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import grpc
import pytest

from assay.common.storage import S3Storage
from assay.proto import api_pb2, common_pb2
from tests.conftest import S3Server

from .conftest import (
    CONFIG,
    TRACEBACK,
    FakeApi,
    assert_ok,
    assert_one_line_error,
    make_experiment,
    run_cli,
    struct,
)

UUID = "6f1c2a9e-0000-4000-8000-000000000001"


def stored_checkpoint(root: Path) -> common_pb2.Checkpoint:
    """A checkpoint directory on 'shared storage' and the record the master keeps of it."""
    files = {"state.pt": b"\x00weights" * 1000, "meta/trial.json": b'{"batches": 8}'}
    location = root / "storage" / UUID
    records = []
    for name, content in files.items():
        path = location / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        records.append(
            common_pb2.CheckpointFile(
                name=name, size_bytes=len(content), sha256=hashlib.sha256(content).hexdigest()
            )
        )
    return common_pb2.Checkpoint(
        uuid=UUID,
        trial_id=11,
        experiment_id=7,
        total_batches=8,
        state=common_pb2.CHECKPOINT_STATE_COMPLETED,
        location=str(location),
        files=records,
        validation_metrics={"val_loss": 0.25},
        user_metadata=struct({"note": "best"}),
    )


def test_list_json(master: FakeApi, tmp_path: Path) -> None:
    master.responses["ListCheckpoints"] = api_pb2.ListCheckpointsResponse(
        checkpoints=[stored_checkpoint(tmp_path)]
    )

    done = run_cli("c", "list", 7, "--json", master=master)

    assert_ok(done)
    [listed] = json.loads(done.stdout.strip().splitlines()[-1])
    assert listed["uuid"] == UUID
    assert (listed["trial_id"], listed["total_batches"], listed["state"]) == (11, 8, "COMPLETED")
    assert listed["validation_metrics"] == {"val_loss": 0.25}
    assert listed["user_metadata"] == {"note": "best"}
    assert [f["name"] for f in listed["files"]] == ["state.pt", "meta/trial.json"]
    assert master.calls("ListCheckpoints")[0].experiment_id == 7


def test_list_table(master: FakeApi, tmp_path: Path) -> None:
    master.responses["ListCheckpoints"] = api_pb2.ListCheckpointsResponse(
        checkpoints=[stored_checkpoint(tmp_path)]
    )

    done = run_cli("checkpoint", "list", 7, master=master)

    assert_ok(done)
    assert UUID in done.stdout
    assert "val_loss=0.25" in done.stdout


def test_download_copies_and_verifies(master: FakeApi, tmp_path: Path) -> None:
    ckpt = stored_checkpoint(tmp_path)
    master.responses["GetCheckpoint"] = ckpt
    dest = tmp_path / "out" / "ckpt"

    done = run_cli("c", "download", UUID, dest, master=master)

    assert_ok(done)
    source = Path(ckpt.location)
    for f in ckpt.files:
        assert (dest / f.name).read_bytes() == (source / f.name).read_bytes()
    assert "2 files" in done.stdout
    assert master.calls("GetCheckpoint")[0].uuid == UUID
    assert [p.name for p in dest.parent.iterdir()] == ["ckpt"], "no staging left behind"


def test_download_takes_determineds_output_dir_and_its_default(
    master: FakeApi, tmp_path: Path
) -> None:
    master.responses["GetCheckpoint"] = stored_checkpoint(tmp_path)
    work = tmp_path / "work"
    work.mkdir()

    by_flag = run_cli("c", "download", UUID, "-o", tmp_path / "flag", master=master)
    by_default = run_cli("c", "download", UUID, master=master, cwd=work)
    both = run_cli("c", "download", UUID, tmp_path / "a", "-o", tmp_path / "b", master=master)

    assert_ok(by_flag)
    assert (tmp_path / "flag" / "state.pt").is_file()
    assert_ok(by_default)
    assert (work / "checkpoints" / UUID / "state.pt").is_file()
    assert_one_line_error(both, "give DIR or --output-dir, not both")


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda p: p.write_bytes(b"\x01weights" * 1000), "sha256"),
        (lambda p: p.write_bytes(b"short"), "5 bytes but the checkpoint records 8000"),
    ],
)
def test_download_of_damaged_checkpoint_fails_clearly(
    master: FakeApi, tmp_path: Path, damage: object, expected: str
) -> None:
    ckpt = stored_checkpoint(tmp_path)
    master.responses["GetCheckpoint"] = ckpt
    damage(Path(ckpt.location) / "state.pt")  # type: ignore[operator]
    dest = tmp_path / "out"

    done = run_cli("c", "download", UUID, dest, master=master)

    assert_one_line_error(done, "state.pt", expected, "damaged")
    assert not dest.exists(), "nothing half-copied is left"
    assert list(tmp_path.iterdir()) == [tmp_path / "storage"]


def test_download_from_storage_not_mounted_here(master: FakeApi, tmp_path: Path) -> None:
    ckpt = stored_checkpoint(tmp_path)
    ckpt.location = "/mnt/cluster-checkpoints/" + UUID
    master.responses["GetCheckpoint"] = ckpt

    done = run_cli("c", "download", UUID, tmp_path / "out", master=master)

    assert_one_line_error(done, f"lives at /mnt/cluster-checkpoints/{UUID}", "storage")


def test_download_refuses_non_empty_directory(master: FakeApi, tmp_path: Path) -> None:
    master.responses["GetCheckpoint"] = stored_checkpoint(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")

    done = run_cli("c", "download", UUID, tmp_path / "out", master=master)

    assert_one_line_error(done, "not empty")
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


def test_download_refuses_unsafe_file_names(master: FakeApi, tmp_path: Path) -> None:
    ckpt = stored_checkpoint(tmp_path)
    ckpt.files.add(name="../../escape", size_bytes=1, sha256="")
    master.responses["GetCheckpoint"] = ckpt

    done = run_cli("c", "download", UUID, tmp_path / "out", master=master)

    assert_one_line_error(done, "unsafe file name")
    assert not (tmp_path / "escape").exists()


# --- DELETED checkpoints in the list ----------------------------------------------------------


def test_list_hides_deleted_checkpoints_unless_all(master: FakeApi, tmp_path: Path) -> None:
    live = stored_checkpoint(tmp_path)
    gone = common_pb2.Checkpoint()
    gone.CopyFrom(live)
    gone.uuid = "6f1c2a9e-0000-4000-8000-00000000dead"
    gone.state = common_pb2.CHECKPOINT_STATE_DELETED
    master.responses["ListCheckpoints"] = api_pb2.ListCheckpointsResponse(checkpoints=[live, gone])

    default = run_cli("c", "list", 7, master=master)
    everything = run_cli("c", "list", 7, "--all", master=master)
    as_json = run_cli("c", "list", 7, "--json", master=master)

    for done in (default, everything, as_json):
        assert_ok(done)
    assert UUID in default.stdout
    assert gone.uuid not in default.stdout
    assert gone.uuid in everything.stdout
    assert "DELETED" in everything.stdout
    assert [c["uuid"] for c in json.loads(as_json.stdout.strip().splitlines()[-1])] == [UUID]


# --- delete -------------------------------------------------------------------------------------

OTHER = "6f1c2a9e-0000-4000-8000-000000000002"


def test_delete_with_yes(master: FakeApi) -> None:
    master.responses["DeleteCheckpoints"] = api_pb2.DeleteCheckpointsResponse(
        deleted=[UUID, OTHER], missing=[OTHER]
    )

    done = run_cli("c", "delete", UUID, OTHER, UUID, "--yes", master=master)

    assert_ok(done)
    assert list(master.calls("DeleteCheckpoints")[0].uuids) == [UUID, OTHER]
    assert f"deleted {UUID}\n" in done.stdout
    assert f"deleted {OTHER} (its files were already gone)" in done.stdout


def test_delete_asks_first(master: FakeApi) -> None:
    done = run_cli("checkpoint", "delete", UUID, master=master)  # stdin gives no answer

    assert_one_line_error(done, "nothing deleted", "--yes")
    assert f"Delete {UUID} from checkpoint storage for good? [y/N]" in done.stdout
    assert not master.calls("DeleteCheckpoints")


def test_delete_refused_by_the_master(master: FakeApi) -> None:
    reason = f"checkpoint {UUID} is the latest checkpoint of trial 11, which is RUNNING"
    master.errors["DeleteCheckpoints"] = (grpc.StatusCode.FAILED_PRECONDITION, reason)

    done = run_cli("c", "delete", UUID, "-y", master=master)

    assert_one_line_error(done, reason)


def test_delete_reports_failures_and_exits_1(master: FakeApi) -> None:
    master.responses["DeleteCheckpoints"] = api_pb2.DeleteCheckpointsResponse(
        deleted=[UUID], failed={OTHER: "cannot delete checkpoint: AccessDenied"}
    )

    done = run_cli("c", "delete", UUID, OTHER, "--yes", master=master)

    assert done.returncode == 1
    assert f"deleted {UUID}" in done.stdout
    assert f"failed {OTHER}: cannot delete checkpoint: AccessDenied" in done.stderr
    assert "1 of 2 checkpoints could not be deleted" in done.stderr
    assert TRACEBACK not in done.stderr


# --- download from S3 (a moto server on loopback) -------------------------------------------


def s3_checkpoint(server: S3Server, tmp_path: Path) -> tuple[common_pb2.Checkpoint, str]:
    """The checkpoint of `stored_checkpoint`, uploaded to a fresh bucket as the harness does."""
    bucket = server.new_bucket()
    ckpt = stored_checkpoint(tmp_path)
    local = Path(ckpt.location)
    (local / "metadata.json").write_text(json.dumps({"uuid": UUID}))
    storage = S3Storage(
        bucket,
        "exp7",
        endpoint_url=server.endpoint_url,
        access_key=server.access_key,
        secret_key=server.secret_key,
        region=server.region,
    )
    ckpt.location = storage.upload(local, UUID)
    return ckpt, bucket


def serve_s3(master: FakeApi, ckpt: common_pb2.Checkpoint, storage: dict[str, Any]) -> None:
    master.responses["GetCheckpoint"] = ckpt
    config = {**CONFIG, "checkpoint_storage": storage}
    master.responses["GetExperiment"] = api_pb2.GetExperimentResponse(
        experiment=make_experiment(config=config)
    )


def test_download_from_s3_verifies_every_file(
    master: FakeApi, tmp_path: Path, s3_server: S3Server
) -> None:
    ckpt, bucket = s3_checkpoint(s3_server, tmp_path)
    assert ckpt.location == f"s3://{bucket}/exp7/{UUID}"
    serve_s3(master, ckpt, s3_server.storage_config(bucket, prefix="exp7"))
    dest = tmp_path / "out" / "ckpt"

    done = run_cli("c", "download", UUID, dest, master=master)

    assert_ok(done)
    source = tmp_path / "storage" / UUID
    for name in ("state.pt", "meta/trial.json", "metadata.json"):
        assert (dest / name).read_bytes() == (source / name).read_bytes()
    assert "2 files" in done.stdout
    assert master.calls("GetExperiment")[0].id == 7
    assert [p.name for p in dest.parent.iterdir()] == ["ckpt"]


def test_download_from_s3_with_credentials_from_the_environment(
    master: FakeApi, tmp_path: Path, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt, bucket = s3_checkpoint(s3_server, tmp_path)
    storage = s3_server.storage_config(bucket, prefix="exp7")
    del storage["access_key"], storage["secret_key"]
    serve_s3(master, ckpt, storage)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-env")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "from-env-secret")

    done = run_cli("c", "download", UUID, tmp_path / "out", master=master)

    assert_ok(done)
    assert (tmp_path / "out" / "state.pt").is_file()


def test_download_of_a_damaged_s3_checkpoint_fails_clearly(
    master: FakeApi, tmp_path: Path, s3_server: S3Server
) -> None:
    ckpt, bucket = s3_checkpoint(s3_server, tmp_path)
    serve_s3(master, ckpt, s3_server.storage_config(bucket, prefix="exp7"))
    s3_server.client().put_object(Bucket=bucket, Key=f"exp7/{UUID}/state.pt", Body=b"short")

    done = run_cli("c", "download", UUID, tmp_path / "out", master=master)

    assert_one_line_error(done, "state.pt", "5 bytes but the checkpoint records 8000", "damaged")
    assert not (tmp_path / "out").exists()


def test_download_of_an_s3_checkpoint_that_is_gone(
    master: FakeApi, tmp_path: Path, s3_server: S3Server
) -> None:
    ckpt, bucket = s3_checkpoint(s3_server, tmp_path)
    serve_s3(master, ckpt, s3_server.storage_config(bucket, prefix="exp7"))
    s3_server.client().delete_object(Bucket=bucket, Key=f"exp7/{UUID}/state.pt")

    done = run_cli("c", "download", UUID, tmp_path / "out", master=master)

    assert_one_line_error(done, f"checkpoint {UUID} has no state.pt in s3://{bucket}/exp7/{UUID}")


def test_describe_lines_up_its_fields_and_files(master: FakeApi, tmp_path: Path) -> None:
    checkpoint = stored_checkpoint(tmp_path)
    master.responses["GetCheckpoint"] = checkpoint

    done = run_cli("checkpoint", "describe", UUID, master=master)

    assert_ok(done)
    lines = done.stdout.splitlines()
    files_at = lines.index("Files (2):")
    fields = lines[:files_at]
    assert fields[0] == f"UUID:            {UUID}"
    assert "Validation:      val_loss=0.25" in fields
    assert {len(line) - len(line.split(":", 1)[1].lstrip()) for line in fields} == {17}
    header, *rows = lines[files_at + 1 :]
    assert header.split() == ["NAME", "SIZE", "SHA256"]
    assert len(rows) == 2
    # Names left, sizes right, hashes left: each column starts (or ends) where its head does.
    for row, f in zip(rows, checkpoint.files, strict=True):
        assert row.startswith(f"  {f.name}")
        assert row.index(f.sha256) == header.index("SHA256")
        assert row.index(f.sha256) - 2 == header.index("SIZE") + len("SIZE")
    assert rows[0].split()[1:3] == ["7.8", "KiB"]
    assert rows[1].split()[1:3] == ["14", "B"]
