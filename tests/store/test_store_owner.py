"""One master per store: a second master on the same SQLite file or PostgreSQL database
is refused at start-up, before it migrates or adopts anything."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from assay.errors import AssayError
from assay.master._store_owner import own_store


def test_a_store_has_one_owner_until_it_lets_go(db_url: str) -> None:
    first = own_store(db_url)
    try:
        with pytest.raises(AssayError, match="another Assay master is serving the store") as e:
            own_store(db_url)
        if db_url.startswith("sqlite"):
            assert f"pid {os.getpid()}" in str(e.value)
        else:
            assert "server pid" in str(e.value)
            assert "end its session now: SELECT pg_terminate_backend(" in str(e.value)
            assert "postgres@127.0.0.1" in str(e.value)
    finally:
        first.release()
    again = own_store(db_url)  # released: the next master may take it
    again.release()
    again.release()  # a second release is harmless


def test_a_second_master_on_the_same_state_directory_exits_with_one_line(tmp_path: Path) -> None:
    def master(*extra: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "assay.master.main",
            "--host",
            "127.0.0.1",
            "--state-dir",
            str(tmp_path),
            "--grpc-port",
            "0",
            "--http-port",
            "0",
            *extra,
        ]

    env = {**os.environ, "ASSAY_INITIAL_ADMIN_PASSWORD": "a-long-enough-password-1"}
    first = subprocess.Popen(
        master(), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        lock = tmp_path / "assay.db.master-lock"
        while not (lock.exists() and lock.read_text()):  # written once the store is its own
            assert first.poll() is None, "the first master exited"
            assert time.monotonic() < deadline, "the first master did not start"
            time.sleep(0.1)
        second = subprocess.run(
            master(), env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert second.returncode == 1
        assert "another Assay master is serving the store" in second.stderr, second.stderr
        assert "Traceback" not in second.stderr
        assert first.poll() is None  # the first one serves on
    finally:
        first.terminate()
        first.wait(timeout=30)
    # Its lock went with it: a master starts again on the same directory.
    third = subprocess.Popen(
        master(), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while lock.read_text().split()[:2] != ["pid", str(third.pid)]:
            assert third.poll() is None, third.stderr.read() if third.stderr else ""
            assert time.monotonic() < deadline, "the third master did not take the store"
            time.sleep(0.1)
    finally:
        third.terminate()
        third.wait(timeout=30)


def _end_lock_sessions(url: str) -> None:
    """End the session holding the master's lock, as a DBA or a failover would."""
    from sqlalchemy import create_engine, text

    from assay.master import _store_owner as owner

    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as c:
        ended = c.execute(
            text(f"SELECT pg_terminate_backend(l.pid) FROM pg_locks l WHERE {owner._LOCK_ROW}"),
            owner._KEY_PARTS,
        ).all()
    engine.dispose()
    assert ended, "no session held the lock"


def _wait_for(what: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_postgres_lock_whose_session_was_ended_is_taken_again(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from assay.master import _store_owner as owner

    monkeypatch.setattr(owner, "WATCH_S", 0.1)
    lost: list[AssayError] = []
    first = own_store(postgres_url)
    try:
        first.watch(lost.append)
        held = first._handle
        _end_lock_sessions(postgres_url)
        _wait_for("the lock taken again", lambda: first._handle is not held)
        with pytest.raises(AssayError, match="another Assay master is serving"):
            own_store(postgres_url)  # this master's again, not free for a second one
        assert lost == []
    finally:
        first.release()


def test_a_master_whose_lock_another_took_is_told_to_stop(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server ended the first master's session and a second master took the store
    before the first noticed: the first must stop (one master serves)."""
    from assay.master import _store_owner as owner

    monkeypatch.setattr(owner, "WATCH_S", 1.0)
    lost: list[AssayError] = []
    first = own_store(postgres_url)
    second = None
    try:
        first.watch(lost.append)
        _end_lock_sessions(postgres_url)
        second = own_store(postgres_url)
        _wait_for("the first master told", lambda: bool(lost))
        assert isinstance(lost[0], owner.StoreTakenError)
        assert "was taken by another Assay master" in str(lost[0])
    finally:
        first.release()
        if second is not None:
            second.release()
