"""A trial writes its TensorBoard files and checkpoints where its user's code can plant
anything: a symbolic link to `~/.ssh/id_rsa`, a FIFO, its whole directory swapped for a
link, an S3 key with `..` in it. Whoever downloads them (`assay trial
download-tensorboard`, `assay checkpoint download`, and so `model download` and the
SDK's `Checkpoint.download()`) must get what the trial wrote and nothing of their own
machine: a link is never followed, what is left out is said, and a checkpoint whose
recorded file is now a link is refused (a real `assay-master` process; the trial is
played by the test, on shared_fs and on S3 at a local moto server)."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from assay.common.storage import S3Storage
from assay.config import CheckpointStorageConfig
from assay.proto import api_pb2, common_pb2, trial_pb2
from tests.conftest import S3Server
from tests.credentials import authed_api
from tests.e2e.conftest import Cluster, start_cluster, stop_cluster
from tests.master.conftest import experiment_yaml, model_archive
from tests.security.conftest import PlayedTrial, play_trial

CANARY = f"PRIVATE-KEY-{uuid.uuid4().hex}"


@dataclass
class Setup:
    cluster: Cluster
    secret: Path  # the downloader's own secret file
    s3: S3Server
    bucket: str


@pytest.fixture(scope="module")
def setup(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    home = tmp_path_factory.mktemp("home")
    secret = home / ".ssh" / "id_rsa"
    secret.parent.mkdir()
    secret.write_text(CANARY)
    env = {"ASSAY_S3_ENDPOINTS": s3_server.endpoint_url}
    tmp = tmp_path_factory.mktemp("links")
    cluster = start_cluster(tmp, None, agents=0, slots=1, master_env=env)
    try:
        yield Setup(cluster, secret, s3_server, s3_server.new_bucket())
    finally:
        stop_cluster(cluster)


@pytest.fixture
def aws_env(setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI reads an S3 experiment's keys from boto3's chain (the master masks them)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", setup.s3.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", setup.s3.secret_key)
    monkeypatch.setenv("AWS_DEFAULT_REGION", setup.s3.region)


def _trial(setup: Setup, name: str, storage: dict[str, object] | None = None) -> PlayedTrial:
    """A trial of a new experiment, started on a scripted agent of its own."""
    overrides = {"checkpoint_storage": storage} if storage else {}
    config = yaml.safe_load(experiment_yaml(name=name, **overrides))
    api, channel = authed_api(setup.cluster.address)
    with channel:
        request = api_pb2.CreateExperimentRequest(
            config_yaml=yaml.safe_dump(config), model_definition=model_archive(), activate=True
        )
        api.CreateExperiment(request, timeout=30)
    return play_trial(setup.cluster, agent_id=name)


def _report(trial: PlayedTrial, name: str, location: str, files: dict[str, bytes]) -> None:
    """Report checkpoint `name` at `location` with `files` (sha256 left out: a record of
    an older Assay, checked by size only)."""
    process = trial.process
    checkpoint = common_pb2.Checkpoint(
        uuid=name,
        total_batches=1,
        location=location,
        trial_id=process.trial_id,
        run_id=process.run_id,
        files=[common_pb2.CheckpointFile(name=n, size_bytes=len(d)) for n, d in files.items()],
    )
    request = trial_pb2.ReportCheckpointRequest(
        trial_id=process.trial_id, run_id=process.run_id, checkpoint=checkpoint
    )
    process.stub.ReportCheckpoint(request, metadata=process.meta, timeout=30)


def _leaked(directory: Path) -> list[str]:
    """Files under `directory` holding the secret, and links there."""
    if not directory.exists():
        return []
    found = []
    for path in directory.rglob("*"):
        if path.is_symlink():
            found.append(f"{path} is a link")
        elif path.is_file() and CANARY in path.read_text(errors="replace"):
            found.append(str(path))
    return found


def _write_checkpoint(directory: Path, files: dict[str, bytes]) -> None:
    directory.mkdir(parents=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    manifest = {"files": {n: hashlib.sha256(d).hexdigest() for n, d in files.items()}}
    (directory / "metadata.json").write_text(json.dumps(manifest))


def test_tensorboard_files_on_shared_fs_are_copied_without_what_was_planted(
    setup: Setup, tmp_path: Path
) -> None:
    trial = _trial(setup, "tb-shared")
    tid = trial.process.trial_id
    root = Path(trial.start.checkpoint_root)
    checkpoint = str(uuid.uuid4())  # which tells the CLI where the experiment's files are
    _write_checkpoint(root / checkpoint, {"model.pt": b"weights"})
    _report(trial, checkpoint, str(root / checkpoint), {"model.pt": b"weights"})
    board = root / "tensorboard" / f"trial-{tid}"
    (board / "train").mkdir(parents=True)
    (board / "train" / "events.out.tfevents.1").write_bytes(b"real events")
    (board / "stolen").symlink_to(setup.secret)
    (board / "ssh").symlink_to(setup.secret.parent, target_is_directory=True)
    os.mkfifo(board / "pipe")  # a reader that followed it would wait for ever

    out = tmp_path / "board"
    done = setup.cluster.cli("trial", "download-tensorboard", str(tid), str(out), timeout=60)
    assert done.returncode == 0, done.stderr
    assert (out / "train" / "events.out.tfevents.1").read_bytes() == b"real events"
    assert _leaked(out) == []
    for name, what in [("stolen", "symbolic link"), ("ssh", "symbolic link"), ("pipe", "FIFO")]:
        assert f"skipped tensorboard/trial-{tid}/{name}: a {what}" in done.stderr, done.stderr
    assert str(setup.secret) in done.stderr  # where the link led

    # Its whole directory swapped for a link to the downloader's ~/.ssh: refused.
    board.rename(board.with_name("moved"))
    board.symlink_to(setup.secret.parent, target_is_directory=True)
    out = tmp_path / "swapped"
    done = setup.cluster.cli("trial", "download-tensorboard", str(tid), str(out), timeout=60)
    assert done.returncode == 1
    assert "a symbolic link" in done.stderr
    assert "not followed" in done.stderr
    assert _leaked(out) == []
    trial.close()


def test_a_checkpoint_on_shared_fs_is_read_without_following_links(
    setup: Setup, tmp_path: Path
) -> None:
    trial = _trial(setup, "ckpt-shared")
    root = Path(trial.start.checkpoint_root)
    size = len(CANARY)  # the attacker knows the secret's size; no sha256 was recorded
    weights = b"w" * size

    # A recorded file replaced by a link after the report: refused, naming it.
    swapped = str(uuid.uuid4())
    _write_checkpoint(root / swapped, {"model.pt": weights})
    _report(trial, swapped, str(root / swapped), {"model.pt": weights})
    (root / swapped / "model.pt").unlink()
    (root / swapped / "model.pt").symlink_to(setup.secret)
    out = tmp_path / "swapped"
    done = setup.cluster.cli("checkpoint", "download", swapped, str(out), timeout=60)
    assert done.returncode == 1
    assert "model.pt: a symbolic link" in done.stderr
    assert "not followed" in done.stderr
    assert not out.exists()

    # Its manifest (not recorded) planted as a link: the checkpoint comes, the link not.
    manifest = str(uuid.uuid4())
    _write_checkpoint(root / manifest, {"model.pt": weights})
    _report(trial, manifest, str(root / manifest), {"model.pt": weights})
    (root / manifest / "metadata.json").unlink()
    (root / manifest / "metadata.json").symlink_to(setup.secret)
    out = tmp_path / "manifest"
    done = setup.cluster.cli("checkpoint", "download", manifest, str(out), timeout=60)
    assert done.returncode == 0, done.stderr
    assert (out / "model.pt").read_bytes() == weights
    assert _leaked(out) == []
    assert "skipped" in done.stderr
    assert "metadata.json: a symbolic link" in done.stderr

    # Recorded without files (copied unverified): the links in it are skipped.
    unlisted = str(uuid.uuid4())
    _write_checkpoint(root / unlisted, {"model.pt": weights})
    (root / unlisted / "notes.txt").symlink_to(setup.secret)
    _report(trial, unlisted, str(root / unlisted), {})
    out = tmp_path / "unlisted"
    done = setup.cluster.cli("checkpoint", "download", unlisted, str(out), timeout=60)
    assert done.returncode == 0, done.stderr
    assert (out / "model.pt").read_bytes() == weights
    assert _leaked(out) == []
    assert f"skipped {unlisted}/notes.txt: a symbolic link" in done.stderr

    # The checkpoint's directory itself swapped for a link to the downloader's ~/.ssh.
    (root / unlisted).rename(root / "moved")
    (root / unlisted).symlink_to(setup.secret.parent, target_is_directory=True)
    out = tmp_path / "swapped-dir"
    done = setup.cluster.cli("checkpoint", "download", unlisted, str(out), timeout=60)
    assert done.returncode == 1
    assert f"{unlisted}: a symbolic link" in done.stderr
    assert _leaked(out) == []
    trial.close()


def _s3(setup: Setup) -> tuple[dict[str, object], S3Storage]:
    storage = setup.s3.storage_config(setup.bucket, prefix=f"runs-{uuid.uuid4().hex[:8]}")
    return storage, S3Storage.from_config(CheckpointStorageConfig(**storage))


@pytest.mark.usefixtures("aws_env")
def test_tensorboard_files_on_s3_carry_no_link_and_no_escaping_key(
    setup: Setup, tmp_path: Path
) -> None:
    storage, s3 = _s3(setup)
    trial = _trial(setup, "tb-s3", storage)
    tid = trial.process.trial_id
    # The trial's own directory, uploaded as the harness does at each checkpoint.
    local = tmp_path / "trial" / "tensorboard"
    (local / f"trial-{tid}").mkdir(parents=True)
    (local / f"trial-{tid}" / "events.out.tfevents.1").write_bytes(b"real events")
    (local / f"trial-{tid}" / "stolen").symlink_to(setup.secret)
    s3.upload_part(local, "tensorboard")
    # And an object of its own making, named to land outside the download's directory.
    escape = f"{storage['prefix']}/tensorboard/trial-{tid}/../../../escape.txt"
    setup.s3.client().put_object(Bucket=setup.bucket, Key=escape, Body=CANARY.encode())

    out = tmp_path / "board"
    done = setup.cluster.cli("trial", "download-tensorboard", str(tid), str(out), timeout=60)
    assert done.returncode == 0, done.stderr
    assert (out / "events.out.tfevents.1").read_bytes() == b"real events"
    assert sorted(p.name for p in out.rglob("*")) == ["events.out.tfevents.1"]
    assert _leaked(out) == []
    assert not (out / "../../../escape.txt").resolve().exists()
    assert f"skipped s3://{setup.bucket}/{escape}: a name that leaves" in done.stderr
    trial.close()


@pytest.mark.usefixtures("aws_env")
def test_a_checkpoint_on_s3_carries_no_link(setup: Setup, tmp_path: Path) -> None:
    storage, s3 = _s3(setup)
    trial = _trial(setup, "ckpt-s3", storage)
    name = str(uuid.uuid4())
    local = tmp_path / "trial" / name
    _write_checkpoint(local, {"model.pt": b"weights"})
    (local / "notes.txt").symlink_to(setup.secret)
    _report(trial, name, s3.upload(local, name), {})

    out = tmp_path / "checkpoint"
    done = setup.cluster.cli("checkpoint", "download", name, str(out), timeout=60)
    assert done.returncode == 0, done.stderr
    assert (out / "model.pt").read_bytes() == b"weights"
    assert not (out / "notes.txt").exists()
    assert _leaked(out) == []
    trial.close()
