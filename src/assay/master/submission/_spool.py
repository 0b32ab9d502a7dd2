"""Model-archive uploads written to disk as they arrive (`UploadSpool`).

An archive streamed in pieces (up to 96 MiB) is never gathered in memory: each piece is
appended to a file of its own under `<state_dir>/uploads` and hashed as it comes, so an
upload holds one piece of memory at a time, and the master's memory does not keep what
ten uploads brought. The file is then checked where it lies, handed to the store (which
reads it in the commit) and to the model cache (a hard link), and removed.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
from pathlib import Path

from assay.master.store import ArchiveFile


class Upload:
    """One upload's file, written piece by piece (`write`), then `finish`ed; `discard`
    removes it (idempotent: call it whatever happened)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        self._file = os.fdopen(os.open(path, flags, 0o600), "wb")
        self._digest = hashlib.sha256()
        self.size = 0

    def write(self, piece: bytes) -> None:
        self._file.write(piece)
        self._digest.update(piece)
        self.size += len(piece)

    def finish(self) -> ArchiveFile:
        self._file.close()
        return ArchiveFile(self.path, self.size, self._digest.hexdigest())

    def discard(self) -> None:
        self._file.close()
        self.path.unlink(missing_ok=True)


class UploadSpool:
    """The directory of uploads in progress (made private; emptied at start: what is
    left there belonged to uploads a stopped master never finished)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(mode=0o700, parents=True)

    def new(self) -> Upload:
        return Upload(self.directory / f"{secrets.token_hex(8)}.tar.gz.part")


__all__ = ["Upload", "UploadSpool"]
