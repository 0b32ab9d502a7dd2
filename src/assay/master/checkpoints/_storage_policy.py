"""What checkpoint storage a user's config may make the master reach, and with whose keys.

The master itself talks to an experiment's storage (garbage collection, deleting
checkpoints) with what the experiment's config names. A config is a user's: its
`endpoint_url` could point the master's requests at any host and port inside the
network (server-side request forgery), and an S3 storage without keys would be reached
with the master's own credentials, letting a user delete from any bucket the master may
write. So:
- an `endpoint_url` must be one of the master's `s3_endpoints` (refused at submission,
  and checked again before each use, since settings change);
- the master uses its own credentials (its environment, instance role) only for the
  buckets of `s3_master_credential_buckets`, on AWS's own endpoint or an allowed one; an
  S3 storage elsewhere must carry its own `access_key`/`secret_key`, or the master leaves
  its checkpoints alone (the trials, on the agents, still write and read them).

On shared_fs the agents make each experiment's directory under `host_path/storage_path`,
as root when they isolate trials, and garbage collection deletes there. So a config's
`host_path` must be the master's checkpoint root or under one of its `shared_fs_host_paths`
(compared as written, `..` resolved); otherwise a user could have directories made, and
written by trials, anywhere (`/etc`, another experiment's directory).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from assay.config import CheckpointStorageConfig


def _items(text: str | None) -> frozenset[str]:
    return frozenset(part.strip().rstrip("/") for part in (text or "").split(",") if part.strip())


@dataclass(frozen=True)
class StoragePolicy:
    """The master's settings on storage, parsed once."""

    endpoints: frozenset[str] = frozenset()
    master_credential_buckets: frozenset[str] = frozenset()
    # Where shared_fs storage may be (with what is under them), and the master's own
    # checkpoint root (itself only: below it are its experiments' directories); neither:
    # anywhere (a policy built without the master's settings).
    host_paths: frozenset[str] = frozenset()
    own_root: str | None = None

    @classmethod
    def of(
        cls,
        endpoints: str | None,
        buckets: str | None,
        host_paths: str | None = None,
        checkpoint_root: str | None = None,
    ) -> StoragePolicy:
        """From the comma-separated settings `s3_endpoints`, `s3_master_credential_buckets`
        and `shared_fs_host_paths`, and the master's own `checkpoint_root` (always
        allowed)."""
        roots = frozenset(posixpath.normpath(p) for p in _items(host_paths) if p.startswith("/"))
        own = None if checkpoint_root is None else posixpath.normpath(checkpoint_root)
        return cls(_items(endpoints), _items(buckets), roots, own)

    def submission_problem(self, storage: CheckpointStorageConfig) -> str | None:
        """Why a config's storage is refused at submission, or None."""
        if storage.type == "shared_fs":
            return self._host_path_problem(storage)
        if storage.type != "s3" or storage.endpoint_url is None:
            return None
        if storage.endpoint_url.rstrip("/") in self.endpoints:
            return None
        allowed = ", ".join(sorted(self.endpoints)) or "none: only AWS's own endpoints"
        return (
            f"checkpoint_storage.endpoint_url {storage.endpoint_url!r} is not an endpoint this "
            f"master reaches (its s3_endpoints: {allowed}); ask an administrator to add it, "
            "or leave endpoint_url out for AWS S3"
        )

    def _host_path_problem(self, storage: CheckpointStorageConfig) -> str | None:
        if storage.host_path is None or not (self.host_paths or self.own_root):
            return None
        place = posixpath.normpath(posixpath.join(storage.host_path, storage.storage_path or ""))
        if place == self.own_root or any(
            place == root or place.startswith(root.rstrip("/") + "/") for root in self.host_paths
        ):
            return None
        allowed = ", ".join(sorted(self.host_paths)) or "none"
        return (
            f"checkpoint_storage.host_path {place!r} is not a directory this cluster keeps "
            f"checkpoints in (the master's shared_fs_host_paths: {allowed}); leave "
            "checkpoint_storage out to use the cluster's, or ask an administrator to add "
            "the directory to shared_fs_host_paths"
        )

    def use_problem(self, storage: CheckpointStorageConfig) -> str | None:
        """Why the master must not reach `storage` itself, or None. A shared_fs place is
        checked at submission only: an experiment stored before `shared_fs_host_paths`
        was set (or changed) keeps its garbage collection and downloads."""
        if storage.type != "s3":
            return None
        problem = self.submission_problem(storage)
        if problem is not None:
            return problem
        if storage.access_key is not None:
            return None
        if storage.bucket in self.master_credential_buckets:
            return None
        return (
            f"the master does not lend its own credentials to bucket {storage.bucket!r} "
            "(not in its s3_master_credential_buckets): give checkpoint_storage an access_key "
            "and secret_key, or ask an administrator to list the bucket"
        )


__all__ = ["StoragePolicy"]
