"""The agent's own credential: given by the master at the agent's first join, kept in a
file only the agent's user can read, and presented at every later connect.

The master keeps only the credential's sha256 and lets no other credential register
under the agent's name, so the file must outlive restarts (it is not in the work dir's
`allocations/`, which is wiped at start). Losing it locks the name until an admin runs
`assay agent remove NAME`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
from pathlib import Path

log = logging.getLogger("assay.agent")


class CredentialFile:
    """The credential at `path` ("" while there is none). Thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._value = self._read()

    def _read(self) -> str:
        try:
            info = self.path.stat()
            value = self.path.read_text().strip()
        except FileNotFoundError:
            return ""
        except OSError as e:
            log.error("cannot read this agent's credential from %s: %s", self.path, e)
            return ""
        if stat.S_IMODE(info.st_mode) & 0o077:
            log.warning(
                "%s can be read by other users (mode %o): chmod 600 it",
                self.path,
                stat.S_IMODE(info.st_mode),
            )
        return value

    @property
    def value(self) -> str:
        with self._lock:
            return self._value

    def save(self, credential: str) -> None:
        """Keep `credential`, in memory and in the file (mode 0600, replaced whole, so a
        crash leaves the old one or the new one). A file that cannot be written is
        logged: this process goes on with the credential in memory."""
        with self._lock:
            self._value = credential
            try:
                _write_private(self.path, credential + "\n")
            except OSError as e:
                log.error(
                    "cannot keep this agent's credential in %s (%s): the agent runs with it "
                    "until it stops, and after a restart the master refuses its name until "
                    "an admin runs `assay agent remove`; fix credential_file",
                    self.path,
                    e,
                )
                return
        log.info("the master gave this agent its credential; kept in %s", self.path)


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        raise


__all__ = ["CredentialFile"]
