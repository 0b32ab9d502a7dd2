"""Engines and transactions: SQLite (WAL, BEGIN IMMEDIATE) and PostgreSQL behave alike.

SQLite lets one writer in at a time. A deferred transaction that reads and then writes
can fail with "database is locked" whatever the busy timeout; one that starts with
`BEGIN IMMEDIATE` takes the write lock first and waits its turn (up to the busy
timeout). So every write transaction begins IMMEDIATE, and read transactions begin
deferred and never block behind writers (WAL).
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import Connection

BUSY_TIMEOUT_MS = 60_000
WRITE = "assay_write"


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for `url` (sqlite:///path or postgresql+psycopg://...)."""
    kwargs.setdefault("hide_parameters", True)  # errors are logged: rows hold secrets
    if url.startswith("sqlite"):
        engine = create_engine(
            url,
            connect_args={"timeout": BUSY_TIMEOUT_MS / 1000, "check_same_thread": False},
            **kwargs,
        )
        _configure_sqlite(engine)
        return engine
    engine = create_engine(url, pool_pre_ping=True, **kwargs)
    event.listen(engine, "checkin", _close_if_marked)
    return engine


CLOSE_AT_CHECKIN = "assay_close_at_checkin"


def _close_if_marked(_dbapi_connection: Any, record: Any) -> None:
    """Close a connection a write marked (`CLOSE_AT_CHECKIN` in its info) as it goes back
    to the pool: libpq keeps its send buffer as large as the largest message it sent, so
    a connection that sent a model archive would hold that much memory for its life."""
    if record.info.pop(CLOSE_AT_CHECKIN, False):
        record.invalidate()


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Autocommit at the driver: transactions are begun explicitly below.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        if engine.url.database not in (None, "", ":memory:"):
            _enable_wal(cursor)
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        write = connection.get_execution_options().get(WRITE, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def _enable_wal(cursor: Any) -> None:
    """Switch the file to WAL (persistent: only a new file needs it).

    Changing the journal mode needs the database to itself, and SQLite answers "database
    is locked" at once instead of calling the busy handler, so the switch is retried while
    another connection (say, a second master creating the schema) holds it.
    """
    if cursor.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
        return
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def writer(engine: Engine) -> Engine:
    """The same engine, whose transactions take the write lock up front on SQLite."""
    return engine.execution_options(**{WRITE: True})
