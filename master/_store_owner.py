"""One master per store: a second one on the same database would adopt the first one's
runs as unconfirmed, requeue them, start them again on its own agents, and number runs
and ids the first one also uses, so each would refuse the other's reports.

SQLite: an exclusive `flock` on `<database file>.master-lock`, released by the kernel
when the master exits or dies. PostgreSQL: a session advisory lock held on a connection
of its own for the master's life, released by the server when that session ends (a
master killed outright included). Taken before the schema is migrated.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from assay.errors import AssayError

# The advisory lock's key: any fixed 64-bit number; "assay-ms" in ASCII.
_PG_LOCK_KEY = 0x61737361792D6D73
_PG_WAIT_S = 5.0


class StoreOwner:
    """The lock that makes this master the store's only one; `release()` at stop."""

    def __init__(self, handle: Any, release: Any) -> None:
        self._handle, self._release = handle, release

    def release(self) -> None:
        if self._handle is not None:
            with contextlib.suppress(Exception):
                self._release(self._handle)
            self._handle = None


def own_store(url: str) -> StoreOwner:
    """Take the store at `url` for this master, or raise `AssayError` saying another
    master holds it. An in-memory SQLite store needs no lock."""
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return StoreOwner(None, None)  # _open_store says what is wrong with the URL
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database
        if not database or database == ":memory:":
            return StoreOwner(None, None)
        return _own_sqlite(Path(database))
    if parsed.get_backend_name() == "postgresql":
        return _own_postgres(url, parsed.render_as_string(hide_password=True))
    return StoreOwner(None, None)


def _own_sqlite(database: Path) -> StoreOwner:
    path = database.with_name(database.name + ".master-lock")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise AssayError(f"cannot open the store at {database}: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise AssayError(
            f"another Assay master is serving the store {database} ({holder}): stop it "
            "first, or give this master a --state-dir (or --db-url) of its own"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    return StoreOwner(fd, os.close)


def _own_postgres(url: str, shown: str) -> StoreOwner:
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import OperationalError
    from sqlalchemy.pool import NullPool

    engine = create_engine(url, poolclass=NullPool)
    try:
        connection = engine.connect()
    except OperationalError as e:
        engine.dispose()
        reason = str(e.orig).strip().splitlines()[0] if e.orig else str(e)
        raise AssayError(f"cannot open the store at {shown}: {reason}") from None
    # A master killed a moment ago may still hold it until its server process notices:
    # try for a few seconds before refusing.
    deadline = time.monotonic() + _PG_WAIT_S
    while True:
        query = text("SELECT pg_try_advisory_lock(:k)")
        locked = bool(connection.execute(query, {"k": _PG_LOCK_KEY}).scalar())
        if locked or time.monotonic() > deadline:
            break
        connection.rollback()
        time.sleep(0.25)
    if not locked:
        holder = connection.execute(
            text(
                "SELECT a.client_addr, a.pid FROM pg_locks l JOIN pg_stat_activity a "
                "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
                "AND l.classid = :hi AND l.objid = :lo AND l.objsubid = 1 "
                "AND l.database = (SELECT oid FROM pg_database WHERE datname = "
                "current_database()) LIMIT 1"
            ),
            {"hi": _PG_LOCK_KEY >> 32, "lo": _PG_LOCK_KEY & 0xFFFFFFFF},
        ).first()
        connection.close()
        engine.dispose()
        where = (
            f"connected from {holder[0] or 'a local socket'}, server pid {holder[1]}"
            if holder
            else "unknown"
        )
        raise AssayError(
            f"another Assay master is serving the store {shown} ({where}): "
            "stop it first, or give this master a database of its own"
        )
    connection.commit()  # the lock is the session's, not the transaction's

    def release(conn: Any) -> None:
        conn.close()
        engine.dispose()

    return StoreOwner(connection, release)


__all__ = ["StoreOwner", "own_store"]
