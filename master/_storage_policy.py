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
"""

from __future__ import annotations

from dataclasses import dataclass

from assay.config import CheckpointStorageConfig


def _items(text: str | None) -> frozenset[str]:
    return frozenset(part.strip().rstrip("/") for part in (text or "").split(",") if part.strip())


@dataclass(frozen=True)
class StoragePolicy:
    """The master's settings on storage, parsed once."""

    endpoints: frozenset[str] = frozenset()
    master_credential_buckets: frozenset[str] = frozenset()

    @classmethod
    def of(cls, endpoints: str | None, buckets: str | None) -> StoragePolicy:
        """From the comma-separated settings `s3_endpoints` and
        `s3_master_credential_buckets`."""
        return cls(_items(endpoints), _items(buckets))

    def submission_problem(self, storage: CheckpointStorageConfig) -> str | None:
        """Why a config's storage is refused at submission, or None."""
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

    def use_problem(self, storage: CheckpointStorageConfig) -> str | None:
        """Why the master must not reach `storage` itself, or None."""
        problem = self.submission_problem(storage)
        if problem is not None or storage.type != "s3":
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
