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
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from assay.errors import AssayError

log = logging.getLogger("assay.master")

# The advisory lock's key: any fixed 64-bit number; "assay-ms" in ASCII.
_PG_LOCK_KEY = 0x61737361792D6D73
_PG_WAIT_S = 5.0
_KEY_PARTS = {"hi": _PG_LOCK_KEY >> 32, "lo": _PG_LOCK_KEY & 0xFFFFFFFF}
# Who holds the lock (any session), and whether this session does.
_LOCK_ROW = (
    "l.locktype = 'advisory' AND l.granted AND l.classid = :hi AND l.objid = :lo "
    "AND l.objsubid = 1 AND l.database = (SELECT oid FROM pg_database WHERE datname = "
    "current_database())"
)
_HOLDER = (
    "SELECT a.client_addr, a.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
    f"WHERE {_LOCK_ROW} LIMIT 1"
)
_MINE = f"SELECT count(*) FROM pg_locks l WHERE l.pid = pg_backend_pid() AND {_LOCK_ROW}"
# libpq's keepalives (this side notices a dead server) and the server's (it notices a
# dead master, and frees its lock, in about a minute).
_KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
}
_SERVER_KEEPALIVES = (
    "SET tcp_keepalives_idle = 30",
    "SET tcp_keepalives_interval = 10",
    "SET tcp_keepalives_count = 3",
)
WATCH_S = 15.0


class StoreTakenError(AssayError):
    """Another master took the store after this master's lock was lost."""


class StoreOwner:
    """The lock that makes this master the store's only one; `release()` at stop."""

    def __init__(self, handle: Any, release: Any) -> None:
        self._handle, self._release = handle, release

    def watch(self, on_lost: Callable[[StoreTakenError], None]) -> None:
        """Call `on_lost` if the lock is lost to another master (only a PostgreSQL lock
        can be: the server may end its session)."""

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
        return _PostgresOwner(url, parsed.render_as_string(hide_password=True))
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


class _PostgresOwner(StoreOwner):
    """A session advisory lock on a connection of its own. The session sends keepalives
    both ways, so the server frees the lock about a minute after this master's host
    dies; a watchdog checks every WATCH_S that the lock is still this session's, takes
    it again if the server ended the session, and says so if another master has it."""

    def __init__(self, url: str, shown: str) -> None:
        from sqlalchemy import create_engine
        from sqlalchemy.pool import NullPool

        self._shown = shown
        self._engine = create_engine(url, poolclass=NullPool, connect_args=_KEEPALIVES)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        deadline = time.monotonic() + _PG_WAIT_S
        while True:
            # A master killed a moment ago may still hold it until its server process
            # notices: try for a few seconds before refusing.
            connection, holder = self._take()
            if connection is not None or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        if connection is None:
            self._engine.dispose()
            raise AssayError(_held_by_another(shown, holder))
        super().__init__(connection, self._close)

    def _take(self) -> tuple[Any, Any]:
        """(the connection holding the lock, None), or (None, the holder's address and
        server pid, or None)."""
        from sqlalchemy import text
        from sqlalchemy.exc import OperationalError

        try:
            connection = self._engine.connect()
        except OperationalError as e:
            reason = str(e.orig).strip().splitlines()[0] if e.orig else str(e)
            raise AssayError(f"cannot open the store at {self._shown}: {reason}") from None
        try:
            for setting in _SERVER_KEEPALIVES:
                connection.execute(text(setting))
            query = text("SELECT pg_try_advisory_lock(:k)")
            if connection.execute(query, {"k": _PG_LOCK_KEY}).scalar():
                connection.commit()  # the lock is the session's, not the transaction's
                return connection, None
            holder = connection.execute(text(_HOLDER), _KEY_PARTS).first()
        except BaseException:
            connection.close()
            raise
        connection.close()
        return None, holder

    def watch(self, on_lost: Callable[[StoreTakenError], None]) -> None:
        self._thread = threading.Thread(
            target=self._watch, args=(on_lost,), name="store-lock", daemon=True
        )
        self._thread.start()

    def _watch(self, on_lost: Callable[[StoreTakenError], None]) -> None:
        from sqlalchemy import text

        while not self._stop.wait(WATCH_S):
            try:
                held = self._handle.execute(text(_MINE), _KEY_PARTS).scalar()
                self._handle.rollback()
                if held:
                    continue
            except Exception:  # the server ended the session, or cannot be reached
                log.warning("the store lock's database session is gone", exc_info=True)
            if self._stop.is_set():
                return  # released meanwhile: never take it again
            with contextlib.suppress(Exception):
                self._handle.close()
            try:
                connection, holder = self._take()
            except AssayError as e:
                log.warning("cannot take the store lock again yet: %s", e)
                continue  # the database is away: the master's own writes say so
            if connection is not None:
                self._handle = connection
                log.warning("the store lock's database session had ended; it is taken again")
                continue
            self._handle = None
            on_lost(StoreTakenError(_held_by_another(self._shown, holder, lost=True)))
            return

    def _close(self, connection: Any) -> None:
        self._stop.set()
        connection.close()
        self._engine.dispose()


def _held_by_another(shown: str, holder: Any, *, lost: bool = False) -> str:
    where = (
        f"connected from {holder[0] or 'a local socket'}, server pid {holder[1]}"
        if holder
        else "unknown"
    )
    if lost:
        return (
            f"the store {shown} was taken by another Assay master ({where}) after this "
            "master's lock session was ended: this master stops, so that one master serves"
        )
    stale = f"SELECT pg_terminate_backend({holder[1]})" if holder else "pg_terminate_backend"
    return (
        f"another Assay master is serving the store {shown} ({where}): stop it first, or "
        "give this master a database of its own. If that master's host is gone, the "
        f"server frees the store within about a minute; or end its session now: {stale}"
    )


__all__ = ["StoreOwner", "StoreTakenError", "own_store"]
