"""Which storage holds a checkpoint, and where: from an experiment's config or a location.

The harness reports where it put a checkpoint, and the master derives the same location
again from the experiment's config to accept the report and to delete the checkpoint, so
both follow the one rule written here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from assay.common.storage._base import S3_SCHEME, StorageError, StorageManager, checkpoint_uuid
from assay.common.storage._s3 import S3Storage, parse_s3_location
from assay.common.storage._shared_fs import SharedFSStorage

if TYPE_CHECKING:
    from assay.config import CheckpointStorageConfig


def storage_for(
    config: CheckpointStorageConfig, default_root: Path | None = None
) -> StorageManager:
    """The storage `config` describes; `default_root` for shared_fs without a host_path."""
    if config.type == "s3":
        return S3Storage.from_config(config)
    root = config.host_directory or default_root
    if root is None:
        raise StorageError(
            "checkpoint_storage.host_path is not set and there is no default checkpoint root"
        )
    return SharedFSStorage(root)


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
        bucket, prefix, uuid = parse_s3_location(location)
        return S3Storage.from_config(config, bucket=bucket, prefix=prefix), uuid
    if is_remote(location):
        scheme = location.split("://", 1)[0]
        raise StorageError(f"checkpoint location {location}: {scheme}:// storage is not supported")
    if not location:
        raise StorageError("the checkpoint has no location")
    path = Path(location)
    return SharedFSStorage(path.parent), path.name


__all__ = [
    "TENSORBOARD",
    "checkpoint_location",
    "is_remote",
    "storage_at",
    "storage_for",
    "tensorboard_name",
]
