"""Session tokens the CLI and the SDK keep per master, in `~/.assay/auth.json` (mode 0600).

`assay user login` stores one; every later command to the same master sends it. With
`ASSAY_USER` and `ASSAY_PASSWORD` set, the CLI logs in by itself when it has no valid
token (scripts, CI). The file holds tokens only, never passwords; `ASSAY_AUTH_FILE`
moves it. Sessions are kept by master address as `master_key` writes it, so
`localhost:8090`, `127.0.0.1:8090` and `[::1]:8090` find the same one.
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

DEFAULT_PORT = 8090
# Names of this machine's loopback interface: one master, whichever a user types.
_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1", "ip6-localhost"})


@dataclass(frozen=True)
class StoredSession:
    """A session token the master issued to `username`, kept until `expires_at`."""

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


def master_key(master: str) -> str:
    """`master` as sessions are stored: HOST:PORT, lower case, the default port filled in,
    and this machine's loopback names written 127.0.0.1."""
    text = master.strip().lower()
    host, port = text, ""
    if text.startswith("["):  # [::1]:8090
        host, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":")
    elif text.count(":") == 1:
        host, port = text.split(":")
    host = "127.0.0.1" if host in _LOOPBACK else host
    port = port or str(DEFAULT_PORT)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def dial_address(master: str) -> str:
    """`master` as the client connects to it: as typed, with the default port filled in
    when none is given (gRPC's own default, 443, is never Assay's), so that a command
    reaches the master whose session `master_key` finds."""
    text = master.strip()
    if text.startswith("["):  # [::1] or [::1]:8090
        has_port = text.partition("]")[2].startswith(":")
    else:
        # One colon: HOST:PORT; none: HOST; more: a bare IPv6 address.
        has_port = text.count(":") == 1
        if text.count(":") > 1:
            text = f"[{text}]"
    return text if has_port else f"{text}:{DEFAULT_PORT}"


def _matching(sessions: dict[str, Any], master: str) -> list[str]:
    """The stored keys that name `master` (older files kept addresses as typed)."""
    key = master_key(master)
    return [k for k in sessions if master_key(k) == key]


def load_session(master: str) -> StoredSession | None:
    """The stored session for `master` (HOST:PORT), or None."""
    sessions = _read().get("sessions", {})
    if not isinstance(sessions, dict):
        return None
    keys = _matching(sessions, master)
    key = master_key(master)
    entry = sessions.get(key if key in keys else (keys[0] if keys else key))
    if not isinstance(entry, dict):
        return None
    try:
        expires = dt.datetime.fromisoformat(str(entry["expires_at"]))
        return StoredSession(str(entry["username"]), str(entry["token"]), expires)
    except (KeyError, ValueError):
        return None


def save_session(master: str, session: StoredSession) -> None:
    data = _read()
    sessions = data.setdefault("sessions", {})
    for old in _matching(sessions, master):
        del sessions[old]
    sessions[master_key(master)] = {
        "username": session.username,
        "token": session.token,
        "expires_at": session.expires_at.isoformat(),
    }
    _write(data)


def forget_session(master: str) -> bool:
    data = _read()
    sessions = data.get("sessions", {})
    found = _matching(sessions, master)
    if not found:
        return False
    for key in found:
        del sessions[key]
    _write(data)
    return True


def env_credentials() -> tuple[str, str] | None:
    """ASSAY_USER and ASSAY_PASSWORD, when both are set."""
    user, password = os.environ.get("ASSAY_USER"), os.environ.get("ASSAY_PASSWORD")
    return (user, password) if user and password else None
