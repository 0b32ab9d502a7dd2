"""Checkpoint storage: shared_fs and S3 (a real moto server on loopback) through one contract."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from assay.common.storage import (
    MANIFEST,
    S3Storage,
    SharedFSStorage,
    StorageError,
    StorageManager,
    parse_s3_location,
    storage_at,
    storage_for,
)
from assay.config import CheckpointStorageConfig
from tests.conftest import S3Server

UUID = "0b6a3a52-5d7b-4a43-9a0e-2f6f3c1d0001"


def make_checkpoint(directory: Path) -> Path:
    directory.mkdir(parents=True)
    (directory / "models.pt").write_bytes(b"\x00w" * 5000)
    (directory / "sub").mkdir()
    (directory / "sub" / "extra.bin").write_bytes(b"x")
    (directory / MANIFEST).write_text('{"uuid": "u"}')
    return directory


@pytest.fixture(params=["shared_fs", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[StorageManager, str]]:
    if request.param == "shared_fs":
        yield SharedFSStorage(tmp_path / "shared"), str(tmp_path / "shared" / UUID)
        return
    server: S3Server = request.getfixturevalue("s3_server")
    bucket = server.new_bucket()
    config = CheckpointStorageConfig(**{**server.storage_config(bucket), "prefix": "a/b"})
    yield storage_for(config), f"s3://{bucket}/a/b/{UUID}"


def test_upload_download_delete_round_trip(
    storage: tuple[StorageManager, str], tmp_path: Path
) -> None:
    manager, expected_location = storage
    source = make_checkpoint(tmp_path / "local" / UUID)
    assert not manager.exists(UUID)

    location = manager.upload(source, UUID)

    assert location == expected_location == manager.location(UUID)
    assert manager.exists(UUID)
    copy = tmp_path / "copy"
    manager.download(UUID, copy)
    for name in ("models.pt", "sub/extra.bin", MANIFEST):
        assert (copy / name).read_bytes() == (source / name).read_bytes()
    assert manager.delete(UUID) is True
    assert not manager.exists(UUID)
    assert manager.delete(UUID) is False, "already gone: reported, not raised"
    with pytest.raises(StorageError, match=UUID):
        manager.download(UUID, tmp_path / "again")


def test_storage_at_finds_the_storage_of_a_location(
    storage: tuple[StorageManager, str], tmp_path: Path
) -> None:
    manager, _ = storage
    location = manager.upload(make_checkpoint(tmp_path / "local" / UUID), UUID)
    config = None
    if isinstance(manager, S3Storage):
        config = CheckpointStorageConfig(
            type="s3",
            bucket="another-bucket",
            endpoint_url=manager.endpoint_url,
            access_key="k",
            secret_key="s",
        )

    found, uuid = storage_at(location, config)

    assert uuid == UUID
    assert found.exists(UUID)
    assert found.location(UUID) == location


def test_s3_upload_puts_the_manifest_last(s3_server: S3Server, tmp_path: Path) -> None:
    bucket = s3_server.new_bucket()
    storage = S3Storage.from_config(CheckpointStorageConfig(**s3_server.storage_config(bucket)))
    uploaded: list[str] = []
    client = storage.client
    real = client.upload_file

    def spy(filename: str, bucket: str, key: str) -> None:
        uploaded.append(key)
        real(filename, bucket, key)

    client.upload_file = spy
    storage.upload(make_checkpoint(tmp_path / UUID), UUID)

    assert uploaded[-1] == f"runs/{UUID}/{MANIFEST}"
    assert sorted(uploaded) == s3_server.keys(bucket)


def test_s3_partial_upload_is_not_a_checkpoint(s3_server: S3Server, tmp_path: Path) -> None:
    bucket = s3_server.new_bucket()
    storage = S3Storage.from_config(CheckpointStorageConfig(**s3_server.storage_config(bucket)))
    s3_server.client().put_object(Bucket=bucket, Key=f"runs/{UUID}/models.pt", Body=b"half")

    assert not storage.exists(UUID)
    with pytest.raises(StorageError, match=f"not complete.*no {MANIFEST}"):
        storage.download(UUID, tmp_path / "out")
    assert storage.delete(UUID) is True  # what there is of it still goes
    assert s3_server.keys(bucket) == []


def test_s3_wrong_credentials_say_what_to_check(s3_server: S3Server, tmp_path: Path) -> None:
    storage = S3Storage("no-such-bucket-here", endpoint_url=s3_server.endpoint_url)
    storage._access_key, storage._secret_key = "k", "s"

    with pytest.raises(StorageError, match="cannot upload checkpoint .* s3://no-such-bucket"):
        storage.upload(make_checkpoint(tmp_path / UUID), UUID)


def test_shared_fs_delete_of_half_deleted_checkpoint(tmp_path: Path) -> None:
    storage = SharedFSStorage(tmp_path)
    make_checkpoint(tmp_path / f".deleting-{UUID}")  # a deletion cut short earlier

    assert storage.delete(UUID) is True
    assert list(tmp_path.iterdir()) == []


def test_shared_fs_upload_in_place_is_a_no_op(tmp_path: Path) -> None:
    storage = SharedFSStorage(tmp_path)
    written = make_checkpoint(tmp_path / UUID)

    assert storage.upload(written, UUID) == str(written)
    assert sorted(p.name for p in tmp_path.iterdir()) == [UUID]


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        (f"s3://b/{UUID}", ("b", "", UUID)),
        (f"s3://b/x/y/{UUID}", ("b", "x/y", UUID)),
        (f"s3://b/x//y/{UUID}/", ("b", "x/y", UUID)),
    ],
)
def test_parse_s3_location(location: str, expected: tuple[str, str, str]) -> None:
    assert parse_s3_location(location) == expected


@pytest.mark.parametrize("location", ["s3://", "s3://bucket", "s3://bucket/", "/local/path"])
def test_parse_s3_location_refuses_what_is_not_one(location: str) -> None:
    with pytest.raises(StorageError):
        parse_s3_location(location)


def test_unsafe_uuids_are_refused(tmp_path: Path) -> None:
    for manager in (SharedFSStorage(tmp_path), S3Storage("bucket")):
        for bad in ("../x", "a/b", ""):
            with pytest.raises(StorageError):
                manager.location(bad)


def test_cli_and_master_do_not_import_boto3_or_torch() -> None:
    code = (
        "import sys, assay.cli.main, assay.master.main, assay.common.storage\n"
        "print(sorted(m for m in ('boto3', 'botocore', 'torch') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"
