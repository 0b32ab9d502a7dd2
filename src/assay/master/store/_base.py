"""What every aggregate's queries share: the engine and the one transaction helper.

The store is split by aggregate (users and sessions, experiments and trials, metrics,
checkpoints, agents and allocations, logs): one class of queries each, all built on
`StoreBase`, and `Store` is composed of them. A query class uses only `read()`,
`write()` and `engine`, never another aggregate's methods, so each reads on its own.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from assay.master.store._engine import writer


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class StoreBase:
    """An engine, and transactions on it.

    Query classes that keep state of their own (a cache) set it up in `__init__` and
    pass the engine on, so that `Store` builds every part with one call.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._writer = writer(engine)

    def _members_changed(self) -> None:
        """A write committed a change of workspace membership (a new user joins the
        Default workspace): the directory's copy is stale (see _directory.py)."""

    @contextmanager
    def write(self) -> Iterator[Session]:
        """One write transaction: committed on success, rolled back on any error.

        On SQLite it takes the write lock up front (`BEGIN IMMEDIATE`, see _engine.py).
        """
        with Session(self._writer, expire_on_commit=False) as session, session.begin():
            yield session

    @contextmanager
    def read(self) -> Iterator[Session]:
        """One read transaction (never blocks behind writers)."""
        with Session(self.engine, expire_on_commit=False) as session, session.begin():
            yield session
