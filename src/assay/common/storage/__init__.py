"""Checkpoint storage: where a checkpoint directory lives once the harness has written it.

Checkpoints are always written locally first (atomically, with their sha256 manifest, by
the harness); a `StorageManager` then puts the directory where the cluster keeps it,
fetches it back for a restore or a download, and deletes it for garbage collection.

- `SharedFSStorage`: a directory every machine mounts at the same path (`shared_fs`);
  each experiment's checkpoints go in a directory of its own, `<root>/<experiment id>`.
- `S3Storage`: `s3://bucket/prefix/<uuid>/` on AWS or any S3-compatible server.

`storage_for` picks the storage of an experiment's `checkpoint_storage`, `storage_at` the
one that holds a checkpoint location. Nothing here imports torch or boto3 at import time
(boto3 is imported when the first S3 client is made): the master and the CLI use it.
"""

from assay.common.storage._base import (
    MANIFEST,
    StorageError,
    StorageManager,
    checkpoint_files,
    checkpoint_uuid,
    safe_name,
)
from assay.common.storage._locations import (
    TENSORBOARD,
    checkpoint_location,
    earlier_storages,
    experiment_directory,
    is_remote,
    storage_at,
    storage_for,
    tensorboard_name,
    trial_storage,
)
from assay.common.storage._s3 import S3Storage, parse_s3_location
from assay.common.storage._shared_fs import SharedFSStorage

__all__ = [
    "MANIFEST",
    "TENSORBOARD",
    "S3Storage",
    "SharedFSStorage",
    "StorageError",
    "StorageManager",
    "checkpoint_files",
    "checkpoint_uuid",
    "checkpoint_location",
    "earlier_storages",
    "experiment_directory",
    "is_remote",
    "parse_s3_location",
    "safe_name",
    "storage_at",
    "storage_for",
    "tensorboard_name",
    "trial_storage",
]
