"""Session tokens the CLI keeps per master, in `~/.assay/auth.json` (mode 0600).

`assay user login` stores one; every later command to the same master sends it. With
`ASSAY_USER` and `ASSAY_PASSWORD` set, the CLI logs in by itself when it has no valid
token (scripts, CI). The file holds tokens only, never passwords; `ASSAY_AUTH_FILE`
moves it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from assay.errors import AssayError


@dataclass(frozen=True)
class Session:
    username: str
    token: str
    expires_at: dt.datetime

    def valid(self, now: dt.datetime | None = None) -> bool:
        return self.expires_at > (now or dt.datetime.now(dt.UTC))


def auth_file() -> Path:
    configured = os.environ.get("ASSAY_AUTH_FILE")
    return Path(configured) if configured else Path.home() / ".assay" / "auth.json"


def _read() -> dict[str, Any]:
    path = auth_file()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise AssayError(f"cannot read {path} ({e}); delete it and log in again") from None
    return data if isinstance(data, dict) else {}


def _write(data: dict[str, Any]) -> None:
    path = auth_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Written whole and renamed, created 0600 from the start: never readable by others.
        fd, tmp = tempfile.mkstemp(prefix=".auth-", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(data, out, indent=1, sort_keys=True)
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as e:
        raise AssayError(f"cannot write {path}: {e}") from None


def load(master: str) -> Session | None:
    """The stored session for `master` (HOST:PORT), or None."""
    entry = _read().get("sessions", {}).get(master)
    if not isinstance(entry, dict):
        return None
    try:
        expires = dt.datetime.fromisoformat(str(entry["expires_at"]))
        return Session(str(entry["username"]), str(entry["token"]), expires)
    except (KeyError, ValueError):
        return None


def save(master: str, session: Session) -> None:
    data = _read()
    sessions = data.setdefault("sessions", {})
    sessions[master] = {
        "username": session.username,
        "token": session.token,
        "expires_at": session.expires_at.isoformat(),
    }
    _write(data)


def forget(master: str) -> bool:
    data = _read()
    sessions = data.get("sessions", {})
    if master not in sessions:
        return False
    del sessions[master]
    _write(data)
    return True


def env_credentials() -> tuple[str, str] | None:
    """ASSAY_USER and ASSAY_PASSWORD, when both are set."""
    user, password = os.environ.get("ASSAY_USER"), os.environ.get("ASSAY_PASSWORD")
    return (user, password) if user and password else None
