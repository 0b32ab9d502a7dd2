"""Copy a stored checkpoint out of the cluster's storage, every file verified against the
size and sha256 the master recorded for it.

A `shared_fs` checkpoint is read where its storage is mounted on this machine, without
following any link a trial planted there (`_download`); an `s3` one is downloaded with the
experiment's S3 settings (the master masks its keys: boto3's own chain supplies them).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, BinaryIO

from assay.errors import AssayError

from ._download import NotFollowedError, copy_tree, opened_dir, opened_file, write_new
from ._records import checkpoint_state, struct

if TYPE_CHECKING:
    from assay.common.storage import S3Storage
    from assay.config import CheckpointStorageConfig
    from assay.proto import common_pb2

    from ._api import Client

_CHUNK = 1 << 20
MANIFEST = "metadata.json"
# Copies a checkpoint's files into a staging directory; returns (files, bytes).
Fetch = Callable[[Path], tuple[int, int]]


def download_checkpoint(api: Client, uuid: str, directory: Path) -> tuple[int, int]:
    """Copy checkpoint `uuid` into `directory` (new or empty), every file verified against
    what the master recorded; (files, bytes). Nothing is left behind on failure."""
    ckpt = api.get_checkpoint(uuid)
    if checkpoint_state(ckpt.state) == "DELETED":
        raise AssayError(f"checkpoint {uuid} was deleted")
    fetch = _s3_fetcher(ckpt, api) if "://" in ckpt.location else _shared_fs_fetcher(ckpt)
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise AssayError(f"{directory} already exists and is not empty")
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        count, total = fetch(staging)
        if directory.exists():
            directory.rmdir()
        os.replace(staging, directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return count, total


def _shared_fs_fetcher(ckpt: common_pb2.Checkpoint) -> Fetch:
    """Its files read from the storage mounted here; the trial that wrote them may have
    planted links there, so nothing is read through one (`_download`)."""
    uuid, location = ckpt.uuid, ckpt.location
    source = Path(location)
    if not location or not source.parent.is_dir() or not os.path.lexists(source):
        raise AssayError(
            f"checkpoint {uuid} lives at {location or '(no location)'} on the cluster's "
            "checkpoint storage, which is not visible from this machine; mount that storage "
            "here at the same path, or run this on a machine that has it"
        )

    def fetch(staging: Path) -> tuple[int, int]:
        try:
            with opened_dir(source.parent, PurePosixPath(source.name)) as fd:
                return _fetch_shared_fs(ckpt, fd, source, staging)
        except NotFollowedError as e:
            raise AssayError(
                f"checkpoint {uuid}: {e} (a checkpoint holds regular files only: the stored "
                "checkpoint was changed after its trial reported it)"
            ) from None

    return fetch


def _fetch_shared_fs(
    ckpt: common_pb2.Checkpoint, fd: int, source: Path, staging: Path
) -> tuple[int, int]:
    if not ckpt.files:
        _warn(f"checkpoint {ckpt.uuid} lists no files; copied unverified")
        copied = copy_tree(source.parent, PurePosixPath(source.name), staging)
        _say_skipped(copied.skipped)
        return copied.files, copied.bytes
    for f in ckpt.files:
        name = _safe_name(f.name)
        shown = str(source.joinpath(*name.parts))
        try:
            with opened_file(fd, name) as reader:
                dst = staging.joinpath(*name.parts)
                _copy_verified(reader, shown, dst, f.size_bytes, f.sha256)
        except FileNotFoundError:
            raise AssayError(
                f"checkpoint {ckpt.uuid} lists {f.name}, missing from {source}"
            ) from None
    if MANIFEST not in {f.name for f in ckpt.files}:  # so that the copy can be restored from
        try:
            with opened_file(fd, PurePosixPath(MANIFEST)) as reader:
                write_new(reader, staging / MANIFEST)
        except FileNotFoundError:
            pass
        except NotFollowedError as e:
            _say_skipped([f"{source.name}/{e}"])
    return len(ckpt.files), sum(f.size_bytes for f in ckpt.files)


def _say_skipped(skipped: list[str]) -> None:
    for line in skipped:
        _warn(f"skipped {line}")


def _s3_fetcher(ckpt: common_pb2.Checkpoint, api: Client) -> Fetch:
    from assay.common.storage import StorageError, storage_at

    try:
        storage, uuid = storage_at(ckpt.location, storage_config(ckpt.experiment_id, api))
    except StorageError as e:
        raise AssayError(f"checkpoint {ckpt.uuid}: {e}") from None
    s3: S3Storage = storage  # type: ignore[assignment]  # storage_at gives S3 for s3://

    def fetch(staging: Path) -> tuple[int, int]:
        if not ckpt.files:
            _warn(f"checkpoint {uuid} lists no files; copied unverified")
            s3.download(uuid, staging)
            files = [p for p in staging.rglob("*") if p.is_file()]
            return len(files), sum(p.stat().st_size for p in files)
        for f in ckpt.files:
            name = _safe_name(f.name)
            target = staging.joinpath(*name.parts)
            s3.download_file(uuid, name.as_posix(), target)
            _verify(target, f"{ckpt.location}/{f.name}", f.size_bytes, f.sha256)
        s3.download_file(uuid, MANIFEST, staging / MANIFEST)
        return len(ckpt.files), sum(f.size_bytes for f in ckpt.files)

    return fetch


def storage_config(experiment_id: int, api: Client) -> CheckpointStorageConfig | None:
    """The experiment's S3 settings (endpoint, region, keys), as far as they are set."""
    from assay.config import CheckpointStorageConfig

    config = struct(api.get_experiment(experiment_id).experiment.config)
    storage = config.get("checkpoint_storage")
    if not isinstance(storage, dict) or storage.get("type") != "s3":
        return None

    def text(key: str) -> str | None:
        value = storage.get(key)
        # The master masks keys as "********": boto3's chain (AWS_*, ~/.aws) supplies them.
        return value if isinstance(value, str) and value and value != "********" else None

    return CheckpointStorageConfig(
        type="s3",
        bucket=text("bucket"),
        prefix=text("prefix") or "",
        endpoint_url=text("endpoint_url"),
        region=text("region"),
        access_key=text("access_key"),
        secret_key=text("secret_key"),
    )


def _safe_name(name: str) -> PurePosixPath:
    path = PurePosixPath(name)
    if not name or path.is_absolute() or ".." in path.parts or "\\" in name:
        raise AssayError(f"checkpoint lists an unsafe file name {name!r}; refusing to copy it")
    return path


def _copy_verified(reader: BinaryIO, shown: str, dst: Path, size: int, sha256: str) -> None:
    digest = hashlib.sha256()
    copied = 0
    dst.parent.mkdir(parents=True, exist_ok=True)
    with dst.open("xb") as writer:
        while chunk := reader.read(_CHUNK):
            digest.update(chunk)
            writer.write(chunk)
            copied += len(chunk)
    _check(shown, copied, digest.hexdigest(), size, sha256)


def _verify(path: Path, shown: str, size: int, sha256: str) -> None:
    digest = hashlib.sha256()
    with path.open("rb") as reader:
        while chunk := reader.read(_CHUNK):
            digest.update(chunk)
    _check(shown, path.stat().st_size, digest.hexdigest(), size, sha256)


def _check(shown: str, got_size: int, got_sha: str, size: int, sha256: str) -> None:
    if got_size != size:
        raise AssayError(
            f"{shown} is {got_size} bytes but the checkpoint records {size}: "
            "the stored checkpoint is damaged or was changed"
        )
    if sha256 and got_sha != sha256.lower():
        raise AssayError(
            f"{shown} has sha256 {got_sha} but the checkpoint records {sha256}: "
            "the stored checkpoint is damaged or was changed"
        )


def _warn(text: str) -> None:
    """A line on stderr, as every command's warnings are (the download goes on)."""
    print(f"warning: {text}", file=sys.stderr)
