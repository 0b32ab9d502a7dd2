"""The in-memory store's trial logs, as `LogQueries` keeps them (_logs.py).

Lines take ids that count up across every trial; a trial's log holds at most
`quota_bytes` of message text, and the append that reaches it stores what fits and one
marker line, after which that trial's appends store nothing.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from assay.master.errors import InvalidArgumentError, NotFoundError
from assay.master.store._logs import (
    MARKER_STREAM,
    MAX_READ,
    QUOTA_MARKER,
    line_rows,
    message_bytes,
    quota_line,
)
from assay.master.store._memory_tables import MemoryDatabase, Row, Transaction
from assay.master.store._records import LogFilter, LogLine


class MemoryLogs:
    """Trial logs in a `MemoryDatabase`."""

    database: MemoryDatabase

    def append_logs(
        self,
        trial_id: int,
        run_id: int,
        lines: Sequence[LogLine],
        *,
        quota_bytes: int | None = None,
    ) -> int:
        """Append lines all or nothing; return the id of the last one (0 if none)."""
        if not lines:
            return 0
        with self.database.write() as tx:
            if trial_id not in tx["trials"]:
                raise NotFoundError(f"trial {trial_id} does not exist")
            rows: list[Row] = line_rows(run_id, lines)
            if quota_bytes is not None:
                rows = _within_quota(tx, trial_id, run_id, rows, quota_bytes)
                if not rows:
                    return 0
            last = 0
            for row in rows:
                last = tx.db.new_id("task_logs")
                tx.insert("task_logs", last, {**row, "id": last, "trial_id": trial_id})
            return last

    def tail_logs(
        self,
        trial_id: int,
        *,
        after_id: int = 0,
        limit: int = 1000,
        level: str | None = None,
        where: LogFilter | None = None,
    ) -> list[LogLine]:
        """Lines with id > `after_id` (that `where` matches), oldest first."""
        _check_limit(limit)
        with self.database.read() as db:
            lines = (_line(r) for r in _lines_of(db, trial_id, level) if r["id"] > after_id)
            return [line for line in lines if where is None or where.matches(line)][:limit]

    def last_logs(
        self,
        trial_id: int,
        count: int,
        *,
        level: str | None = None,
        where: LogFilter | None = None,
    ) -> list[LogLine]:
        """The newest `count` lines (that `where` matches), oldest first."""
        _check_limit(count)
        with self.database.read() as db:
            lines = [_line(r) for r in _lines_of(db, trial_id, level)]
            return [line for line in lines if where is None or where.matches(line)][-count:]

    def expired_log_trials(self, ended_before: dt.datetime, limit: int = 1000) -> list[int]:
        """Trials that ended before `ended_before` and still have log lines."""
        with self.database.read() as db:
            logged = {row["trial_id"] for row in db["task_logs"].values()}
            ended = [
                t["id"]
                for t in db["trials"].values()
                if t["end_time"] is not None and t["end_time"] < ended_before and t["id"] in logged
            ]
            return sorted(ended)[:limit]

    def delete_logs(self, trial_id: int, batch: int = 5000) -> int:
        """Delete up to `batch` of the trial's oldest lines; return how many went."""
        with self.database.write() as tx:
            doomed = [r["id"] for r in _lines_of(tx.db, trial_id, None)[:batch]]
            for log_id in doomed:
                tx.delete("task_logs", log_id)
            return len(doomed)


def _check_limit(limit: int) -> None:
    if not 1 <= limit <= MAX_READ:
        raise InvalidArgumentError(f"limit must be 1-{MAX_READ}, got {limit}")


def _lines_of(db: MemoryDatabase, trial_id: int, level: str | None) -> list[Row]:
    rows = (r for r in db["task_logs"].values() if r["trial_id"] == trial_id)
    return sorted((r for r in rows if level is None or r["level"] == level), key=_id)


def _id(row: Row) -> int:
    return int(row["id"])


def _line(r: Row) -> LogLine:
    return LogLine(
        message=r["message"],
        rank=r["rank"],
        stream=r["stream"],
        level=r["level"],
        timestamp=r["timestamp"],
        id=r["id"],
        run_id=r["run_id"],
    )


def _within_quota(
    tx: Transaction, trial_id: int, run_id: int, rows: list[Row], quota_bytes: int
) -> list[Row]:
    """The rows that fit (a prefix), plus the marker when this append reaches the quota."""
    stored = _lines_of(tx.db, trial_id, None)
    if any(r["stream"] == MARKER_STREAM and r["message"].startswith(QUOTA_MARKER) for r in stored):
        return []
    total = sum(message_bytes(r["message"]) for r in stored)
    for i, row in enumerate(rows):
        size = message_bytes(str(row["message"]))
        if total + size > quota_bytes:
            return [*rows[:i], quota_line(quota_bytes, run_id)]
        total += size
    return rows


__all__ = ["MemoryLogs"]
