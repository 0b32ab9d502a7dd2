"""What every checkpoint storage shares: the manifest rule, the errors, the interface.

A checkpoint is complete only when its manifest, `metadata.json`, is there: uploads put it
last and deletions remove it first, so a half-copied or half-deleted checkpoint never looks
complete. Names inside a checkpoint and checkpoint uuids are checked here, once, for every
storage.
"""

from __future__ import annotations

import logging
import os
import uuid as uuidlib
from pathlib import Path, PurePosixPath
from typing import Protocol

from assay.errors import AssayError

log = logging.getLogger("assay")

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
    """The regular files of a checkpoint directory (or of a TensorBoard one), as relative
    POSIX names, manifest last. A symbolic link is left out, with a warning: what a trial
    uploads is what it wrote, never what a link in its directory points to."""
    names = []
    for path in directory.rglob("*"):
        name = path.relative_to(directory).as_posix()
        if path.is_symlink():
            log.warning("not uploading %s: a symbolic link (to %s)", name, os.readlink(path))
        elif path.is_file():
            names.append(name)
    names.sort()
    if MANIFEST in names:
        names.remove(MANIFEST)
        names.append(MANIFEST)
    return names


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


__all__ = [
    "MANIFEST",
    "S3_SCHEME",
    "StorageError",
    "StorageManager",
    "checkpoint_files",
    "checkpoint_uuid",
    "safe_name",
]
