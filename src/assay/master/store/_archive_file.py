"""A model-definition archive kept in a file: an upload the master spooled to disk.

The master hands the store such a file rather than its bytes: the store reads it when
its row is written, in the commit, so the archive is in memory only for that write.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ArchiveFile:
    """The archive at `path`: `size` bytes whose SHA-256 is `sha256` (hex), both counted
    as it was written. The file stays until the experiment's row is committed."""

    path: Path
    size: int
    sha256: str

    def read(self) -> bytes:
        return self.path.read_bytes()


ModelDefinition = bytes | ArchiveFile
"""An archive as the master holds it: small ones as bytes, uploads as files."""


def size_of(archive: ModelDefinition) -> int:
    return archive.size if isinstance(archive, ArchiveFile) else len(archive)


__all__ = ["ArchiveFile", "ModelDefinition", "size_of"]
