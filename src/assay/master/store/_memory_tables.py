"""The in-memory store's data: tables of plain rows, and transactions on them.

A `MemoryDatabase` outlives the stores opened on it, as a database file outlives a
master: a restarted master opens a new `MemoryStore` on the same database. Every read
and write holds the database's lock; a write goes through a `Transaction`, which keeps
the old value of each row it changes and puts them back if the write raises, so a write
is all or nothing as a SQL transaction is.

Rows hold what the SQL columns hold: JSON columns are stored as JSON would give them
back (`as_json`: tuples become lists, keys strings), so a reader never shares a
mutable value with the writer.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

Row = dict[str, Any]
DEFAULT_WORKSPACE_ID = 1
DEFAULT_PROJECT_ID = 1


def as_json(value: Any) -> Any:
    """`value` as a JSON column gives it back."""
    return json.loads(json.dumps(value))


class MemoryDatabase:
    """The tables, by name: each maps a row's key to the row."""

    TABLES = (
        "users",
        "workspaces",
        "projects",
        "members",
        "experiments",
        "labels",
        "trials",
        "allocations",
        "agents",
        "slot_usage",
        "metrics",
        "checkpoints",
        "task_logs",
        "secrets",
        "pool_bindings",
    )

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.tables: dict[str, dict[Any, Row]] = {name: {} for name in self.TABLES}
        self._sequences: dict[str, int] = {}
        # What the schema's first migration writes: the Default workspace and its project.
        self.tables["workspaces"][DEFAULT_WORKSPACE_ID] = {
            "id": DEFAULT_WORKSPACE_ID,
            "name": "Default",
            "archived": False,
        }
        self.tables["projects"][DEFAULT_PROJECT_ID] = {
            "id": DEFAULT_PROJECT_ID,
            "workspace_id": DEFAULT_WORKSPACE_ID,
            "name": "Uncategorized",
            "description": "Experiments that name no project",
            "archived": False,
        }

    def __getitem__(self, table: str) -> dict[Any, Row]:
        return self.tables[table]

    def next_id(self, table: str) -> int:
        """One past the largest integer key of `table` (an autoincrement column)."""
        return max((k for k in self.tables[table] if isinstance(k, int)), default=0) + 1

    def new_id(self, table: str) -> int:
        """A new id of a row of `table` from its sequence: never one given before, even
        if the row that took it was rolled back or deleted."""
        self._sequences[table] = self._sequences.get(table, 0) + 1
        return self._sequences[table]

    @contextmanager
    def read(self) -> Iterator[MemoryDatabase]:
        with self.lock:
            yield self

    @contextmanager
    def write(self) -> Iterator[Transaction]:
        """One write: every change is undone if the block raises."""
        with self.lock:
            transaction = Transaction(self)
            try:
                yield transaction
            except BaseException:
                transaction.rollback()
                raise


class Transaction:
    """Changes to a `MemoryDatabase`, each recorded so that `rollback` can undo it."""

    def __init__(self, database: MemoryDatabase) -> None:
        self.db = database
        self._undo: list[tuple[str, Any, Row | None]] = []  # (table, key, the row before)

    def __getitem__(self, table: str) -> dict[Any, Row]:
        """A table, to read (write through `insert`, `update` and `delete`)."""
        return self.db.tables[table]

    def _remember(self, table: str, key: Any) -> None:
        before = self.db.tables[table].get(key)
        self._undo.append((table, key, None if before is None else dict(before)))

    def insert(self, table: str, key: Any, row: Row) -> None:
        """Add a row; `KeyError` if the key is taken (a unique violation)."""
        if key in self.db.tables[table]:
            raise KeyError(f"{table}: a row with key {key!r} exists")
        self._remember(table, key)
        self.db.tables[table][key] = row

    def update(self, table: str, key: Any, **fields: Any) -> bool:
        """Set fields of the row `key`; False (nothing done) if there is none."""
        row = self.db.tables[table].get(key)
        if row is None:
            return False
        self._remember(table, key)
        row.update(fields)
        return True

    def delete(self, table: str, key: Any) -> None:
        if key in self.db.tables[table]:
            self._remember(table, key)
            del self.db.tables[table][key]

    def rollback(self) -> None:
        for table, key, before in reversed(self._undo):
            if before is None:
                self.db.tables[table].pop(key, None)
            else:
                self.db.tables[table][key] = before
        self._undo.clear()


__all__ = ["DEFAULT_PROJECT_ID", "DEFAULT_WORKSPACE_ID", "MemoryDatabase", "Transaction", "as_json"]
