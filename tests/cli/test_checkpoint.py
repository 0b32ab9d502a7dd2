"""`assay checkpoint list|download`: download copies a shared_fs directory and verifies it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from assay.proto import api_pb2, common_pb2

from .conftest import FakeApi, assert_ok, assert_one_line_error, run_cli, struct

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
