"""Checkpoint storage: where a checkpoint directory lives once the harness has written it.

Checkpoints are always written locally first (atomically, with their sha256 manifest, by
`assay._checkpoint`); a `StorageManager` then puts the directory where the cluster keeps
it, fetches it back for a restore or a download, and deletes it for garbage collection.

- `SharedFSStorage`: a directory every machine mounts at the same path (`shared_fs`). The
  harness writes straight into it, so `upload` of a checkpoint already in place is a no-op.
- `S3Storage` (in `assay._s3`, boto3 imported on first use): `s3://bucket/prefix/<uuid>/`.

A checkpoint is complete only when its manifest, `metadata.json`, is there: uploads put it
last and deletions remove it first, so a half-copied or half-deleted checkpoint never looks
complete. Nothing here imports torch or boto3 at import time: the master and the CLI use it.
"""

from __future__ import annotations

import os
import shutil
import uuid as uuidlib
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Protocol

from assay.errors import AssayError

if TYPE_CHECKING:
    from assay.config import CheckpointStorageConfig

MANIFEST = "metadata.json"  # the same name as assay._checkpoint.MANIFEST
S3_SCHEME = "s3://"


class StorageError(AssayError):
    """Checkpoint storage refused or failed an operation (the message says which and why)."""


class StorageManager(Protocol):
    """Moves whole checkpoint directories, named by their uuid, in and out of storage."""

    def location(self, uuid: str) -> str:
        """Where checkpoint `uuid` lives: a directory path, or `s3://bucket/prefix/uuid`."""
        ...

    def upload(self, local_dir: Path, uuid: str) -> str:
        """Store `local_dir` as checkpoint `uuid` (manifest last); return its location."""
        ...

    def download(self, uuid: str, local_dir: Path) -> None:
        """Copy checkpoint `uuid` into `local_dir` (created if needed); no verification."""
        ...

    def delete(self, uuid: str) -> bool:
        """Remove checkpoint `uuid`; False if nothing of it was there (already deleted)."""
        ...

    def exists(self, uuid: str) -> bool:
        """Whether checkpoint `uuid` is stored complete (its manifest is there)."""
        ...


def safe_name(name: str) -> PurePosixPath:
    """A file name inside a checkpoint, refused when it could escape the directory."""
    path = PurePosixPath(name)
    if not name or path.is_absolute() or ".." in path.parts or "\\" in name:
        raise StorageError(f"checkpoint lists an unsafe file name {name!r}; refusing it")
    return path


def checkpoint_files(directory: Path) -> list[str]:
    """The files of a checkpoint directory, as relative POSIX names, manifest last."""
    names = sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())
    if MANIFEST in names:
        names.remove(MANIFEST)
        names.append(MANIFEST)
    return names


class SharedFSStorage:
    """Checkpoints as directories `root/<uuid>` on a filesystem shared by every machine."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"SharedFSStorage({str(self.root)!r})"

    def _dir(self, uuid: str) -> Path:
        if safe_name(uuid).name != uuid:
            raise StorageError(f"{uuid!r} is not a checkpoint uuid")
        return self.root / uuid

    def location(self, uuid: str) -> str:
        return str(self._dir(uuid))

    def upload(self, local_dir: Path, uuid: str) -> str:
        final = self._dir(uuid)
        if final.exists() and final.resolve() == Path(local_dir).resolve():
            return str(final)  # written in place by the harness
        tmp = self.root / f".tmp-{uuid}"
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.copytree(local_dir, tmp)
            os.replace(tmp, final)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise StorageError(f"cannot store checkpoint {uuid} in {self.root}: {e}") from None
        return str(final)

    def download(self, uuid: str, local_dir: Path) -> None:
        source = self._dir(uuid)
        if not source.is_dir():
            raise StorageError(f"checkpoint {uuid} is not in {self.root}")
        try:
            shutil.copytree(source, local_dir, dirs_exist_ok=True)
        except OSError as e:
            raise StorageError(f"cannot copy checkpoint {uuid} from {source}: {e}") from None

    def delete(self, uuid: str) -> bool:
        path = self._dir(uuid)
        # Renamed away first, so that a deletion cut short leaves no half checkpoint that
        # looks like one; a later run finishes it.
        doomed = self.root / f".deleting-{uuid}"
        try:
            os.rename(path, doomed)
        except FileNotFoundError:
            if not doomed.exists():
                return False
        except OSError as e:
            raise StorageError(f"cannot delete checkpoint {uuid} at {path}: {e}") from None
        try:
            shutil.rmtree(doomed)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise StorageError(f"cannot delete checkpoint {uuid} at {doomed}: {e}") from None
        return True

    def exists(self, uuid: str) -> bool:
        return (self._dir(uuid) / MANIFEST).is_file()


def storage_for(
    config: CheckpointStorageConfig, default_root: Path | None = None
) -> StorageManager:
    """The storage `config` describes; `default_root` for shared_fs without a host_path."""
    if config.type == "s3":
        from assay._s3 import S3Storage

        return S3Storage.from_config(config)
    root = config.host_directory or default_root
    if root is None:
        raise StorageError(
            "checkpoint_storage.host_path is not set and there is no default checkpoint root"
        )
    return SharedFSStorage(root)


def checkpoint_uuid(text: str) -> str:
    """`text`, when it is a uuid written the one way the harness writes it (lowercase,
    hyphenated: `str(uuid.uuid4())`); a `StorageError` otherwise.

    A checkpoint's uuid names its directory or prefix, so nothing else may pass for one.
    """
    try:
        canonical: str | None = str(uuidlib.UUID(text))
    except ValueError:
        canonical = None
    if canonical != text:
        raise StorageError(
            f"{text!r} is not a checkpoint uuid: expected a lowercase, hyphenated UUID such "
            "as 123e4567-e89b-42d3-a456-426614174000"
        )
    return text


def checkpoint_location(
    config: CheckpointStorageConfig, uuid: str, default_root: Path | str | None = None
) -> str:
    """Where checkpoint `uuid` of an experiment whose storage is `config` lives.

    shared_fs: `root/<uuid>`, the root being `host_path/storage_path`, else `default_root`
    (the master's checkpoint root); s3: `s3://bucket/prefix/<uuid>`. The harness reports
    this location, and the master derives it again from the experiment's config to accept
    the report and to delete the checkpoint, so the two follow one rule.
    """
    root = None if default_root is None else Path(default_root)
    return storage_for(config, root).location(checkpoint_uuid(uuid))


TENSORBOARD = "tensorboard"


def tensorboard_name(trial_id: int) -> str:
    """Where a trial's TensorBoard event files live in its experiment's checkpoint
    storage, relative to the storage root: `tensorboard/trial-<id>` (beside the
    checkpoints; never a checkpoint uuid, so garbage collection leaves it alone)."""
    return f"{TENSORBOARD}/trial-{int(trial_id)}"


def is_remote(location: str) -> bool:
    """Whether a checkpoint location is in object storage rather than on a filesystem."""
    return "://" in location


def storage_at(
    location: str, config: CheckpointStorageConfig | None = None
) -> tuple[StorageManager, str]:
    """The storage that holds the checkpoint at `location`, and the checkpoint's uuid.

    For `s3://bucket/prefix/uuid`, the bucket and prefix come from the location and the
    endpoint and credentials from `config` when it is s3 storage (else boto3's defaults);
    for a directory, its parent is the shared_fs root.
    """
    if location.startswith(S3_SCHEME):
        from assay._s3 import S3Storage, parse_s3_location

        bucket, prefix, uuid = parse_s3_location(location)
        return S3Storage.from_config(config, bucket=bucket, prefix=prefix), uuid
    if is_remote(location):
        scheme = location.split("://", 1)[0]
        raise StorageError(f"checkpoint location {location}: {scheme}:// storage is not supported")
    if not location:
        raise StorageError("the checkpoint has no location")
    path = Path(location)
    return SharedFSStorage(path.parent), path.name
