"""`assay user ...` against a real master: log in and out, tokens kept 0600, users managed.

The CLI runs as a subprocess without ASSAY_USER / ASSAY_PASSWORD, so it is only logged
in when `user login` stored a token.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from assay.master._server import MasterServer
from tests.credentials import ADMIN_PASSWORD
from tests.master.conftest import master

__all__ = ["master"]  # the fixture: a real master in this process


def _cli(
    master: MasterServer, auth_file: Path, *args: str, stdin: str = "", **env: str
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("ASSAY_USER", "ASSAY_PASSWORD")}
    return subprocess.run(
        [sys.executable, "-m", "assay.cli.main", "-m", f"127.0.0.1:{master.port}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**base, "ASSAY_AUTH_FILE": str(auth_file), **env},
    )


@pytest.fixture
def auth_file(tmp_path: Path) -> Path:
    return tmp_path / "home" / ".assay" / "auth.json"


def test_login_whoami_logout(master: MasterServer, auth_file: Path) -> None:
    refused = _cli(master, auth_file, "experiment", "list")
    assert refused.returncode == 1
    assert "assay user login" in refused.stderr
    done = _cli(
        master, auth_file, "user", "login", "admin", "--password-stdin", stdin=ADMIN_PASSWORD
    )
    assert done.returncode == 0, done.stderr
    assert "logged in" in done.stdout
    assert stat.S_IMODE(auth_file.stat().st_mode) == 0o600
    stored = json.loads(auth_file.read_text())
    token = stored["sessions"][f"127.0.0.1:{master.port}"]["token"]
    assert token.startswith("ast_")
    assert ADMIN_PASSWORD not in auth_file.read_text()
    me = _cli(master, auth_file, "user", "whoami", "--json")
    assert json.loads(me.stdout) == {"username": "admin", "admin": True, "active": True}
    assert _cli(master, auth_file, "experiment", "list").returncode == 0
    out = _cli(master, auth_file, "user", "logout")
    assert out.returncode == 0, out.stderr
    # The token no longer works anywhere, and the file forgot it.
    assert master.auth.cached(token) is None
    assert token not in auth_file.read_text()
    assert _cli(master, auth_file, "experiment", "list").returncode == 1


def test_a_wrong_password_is_one_clear_error(master: MasterServer, auth_file: Path) -> None:
    done = _cli(master, auth_file, "user", "login", "admin", "--password-stdin", stdin="nope-nope")
    assert done.returncode == 1
    assert done.stderr.strip() == "error: wrong username or password"
    assert not auth_file.exists()


def test_env_credentials_log_in_by_themselves(master: MasterServer, auth_file: Path) -> None:
    done = _cli(
        master, auth_file, "user", "whoami", ASSAY_USER="admin", ASSAY_PASSWORD=ADMIN_PASSWORD
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("admin (admin)")


def test_users_are_created_changed_and_deactivated(master: MasterServer, auth_file: Path) -> None:
    admin = {"ASSAY_USER": "admin", "ASSAY_PASSWORD": ADMIN_PASSWORD}
    created = _cli(
        master,
        auth_file,
        "user",
        "create",
        "erin",
        "--password-stdin",
        stdin="erin-pass-1",
        **admin,
    )
    assert created.returncode == 0, created.stderr
    erin_file = auth_file.parent / "erin.json"
    login = _cli(
        master, erin_file, "user", "login", "erin", "--password-stdin", stdin="erin-pass-1"
    )
    assert login.returncode == 0, login.stderr
    changed = _cli(
        master,
        erin_file,
        "user",
        "change-password",
        "--password-stdin",
        stdin="erin-pass-1\nerin-pass-2\n",
    )
    assert changed.returncode == 0, changed.stderr
    # A regular user may not create users.
    no = _cli(master, erin_file, "user", "create", "frank", "--password-stdin", stdin="x" * 10)
    assert no.returncode == 1
    assert "only an administrator" in no.stderr
    listed = _cli(master, auth_file, "user", "list", "--json", **admin)
    users = {u["username"]: u for u in json.loads(listed.stdout)}
    assert users["erin"] == {"username": "erin", "admin": False, "active": True}
    off = _cli(master, auth_file, "user", "deactivate", "erin", **admin)
    assert off.returncode == 0, off.stderr
    gone = _cli(master, erin_file, "user", "whoami")
    assert gone.returncode == 1
    relog = _cli(
        master, erin_file, "user", "login", "erin", "--password-stdin", stdin="erin-pass-2"
    )
    assert relog.returncode == 1
