"""Which storage holds a checkpoint, and where: from an experiment's config or a location.

The harness reports where it put a checkpoint, and the master derives the same location
again from the experiment's config to accept the report and to delete the checkpoint, so
both follow the one rule written here.

On shared_fs each experiment has a directory of its own, `<root>/<experiment id>`, which
holds its checkpoints (`<uuid>`) and TensorBoard files (`tensorboard/trial-<id>`); an agent
that isolates its trials gives it to the experiment's group alone, so the trials of one
experiment cannot read, list or plant files among another's. Checkpoints written before
that layout sit at `<root>/<uuid>`: restores read them where their record says, and
garbage collection deletes them there (`earlier_storages`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from assay.common.storage._base import S3_SCHEME, StorageError, StorageManager, checkpoint_uuid
from assay.common.storage._s3 import S3Storage, parse_s3_location
from assay.common.storage._shared_fs import SharedFSStorage

if TYPE_CHECKING:
    from assay.config import CheckpointStorageConfig


def experiment_directory(root: Path | str, experiment_id: int) -> Path:
    """`<root>/<experiment_id>`: where shared_fs storage rooted at `root` keeps one
    experiment's checkpoints and TensorBoard files."""
    if isinstance(experiment_id, bool) or not isinstance(experiment_id, int) or experiment_id < 0:
        raise StorageError(f"experiment id {experiment_id!r} is not an integer >= 0")
    return Path(root) / str(experiment_id)


def _shared_root(config: CheckpointStorageConfig, default_root: Path | str | None) -> Path:
    root = config.host_directory or default_root
    if root is None:
        raise StorageError(
            "checkpoint_storage.host_path is not set and there is no default checkpoint root"
        )
    return Path(root)


def storage_for(
    config: CheckpointStorageConfig,
    default_root: Path | None = None,
    *,
    experiment_id: int | None = None,
) -> StorageManager:
    """The storage `config` describes; `default_root` for shared_fs without a host_path.

    shared_fs: rooted at `<root>/<experiment_id>` when `experiment_id` is given (every
    storage of an experiment on a cluster), at `<root>` itself otherwise (off the cluster,
    and the layout before experiments had directories of their own); s3 ignores it.
    """
    if config.type == "s3":
        return S3Storage.from_config(config)
    root = _shared_root(config, default_root)
    if experiment_id is not None:
        root = experiment_directory(root, experiment_id)
    return SharedFSStorage(root)


def earlier_storages(
    config: CheckpointStorageConfig,
    default_root: Path | None = None,
    *,
    experiment_id: int,
) -> tuple[StorageManager, ...]:
    """Where checkpoints of experiment `experiment_id` were put by earlier layouts, which
    deletion still looks in: shared_fs `<root>` (checkpoints at `<root>/<uuid>`, written
    before each experiment had a directory); none for s3, whose layout is unchanged."""
    if config.type == "s3":
        return ()
    experiment_directory(".", experiment_id)  # refuses what storage_for would refuse
    return (SharedFSStorage(_shared_root(config, default_root)),)


def trial_storage(config: CheckpointStorageConfig, checkpoint_root: Path | str) -> StorageManager:
    """The storage a trial on the cluster stores its checkpoints in: shared_fs, the
    directory the master named in its start (`checkpoint_root`: its experiment's
    directory, `<root>/<experiment id>`, which the master derives by `storage_for` with
    the experiment too, so the two agree); s3 as `config` says."""
    if config.type == "s3":
        return S3Storage.from_config(config)
    return SharedFSStorage(Path(checkpoint_root))


def checkpoint_location(
    config: CheckpointStorageConfig,
    uuid: str,
    default_root: Path | str | None = None,
    *,
    experiment_id: int | None = None,
) -> str:
    """Where checkpoint `uuid` of experiment `experiment_id`, whose storage is `config`,
    lives.

    shared_fs: `<root>/<experiment_id>/<uuid>`, the root being `host_path/storage_path`,
    else `default_root` (the master's checkpoint root); `<root>/<uuid>` without an
    experiment (off the cluster); s3: `s3://bucket/prefix/<uuid>`. The harness reports
    this location, and the master derives it again from the experiment's config to accept
    the report and to delete the checkpoint, so the two follow one rule.
    """
    root = None if default_root is None else Path(default_root)
    storage = storage_for(config, root, experiment_id=experiment_id)
    return storage.location(checkpoint_uuid(uuid))


TENSORBOARD = "tensorboard"


def tensorboard_name(trial_id: int) -> str:
    """Where a trial's TensorBoard event files live in its experiment's checkpoint
    storage, relative to the storage's root (shared_fs: the experiment's directory):
    `tensorboard/trial-<id>`, beside the checkpoints; never a checkpoint uuid, so garbage
    collection leaves it alone."""
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
    "earlier_storages",
    "experiment_directory",
    "is_remote",
    "storage_at",
    "storage_for",
    "tensorboard_name",
    "trial_storage",
]
