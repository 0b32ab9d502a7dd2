"""Trial logs: lines appended by a trial's processes (and the master), read in order.

Lines get increasing ids per trial; a follower asks for the lines after the last id it
saw, so it never misses or repeats one. `last_logs` reads the newest N lines backwards
on the (trial_id, id) index, whatever the size of the log.

A trial's log may hold `quota_bytes` of message text (UTF-8): the lines past it are
dropped, and one line of stream `assay` says so where they would have been. The bytes a
trial holds are counted once per trial from the table (the first append after the master
starts) and kept in memory after that, so an append pays for its own lines only.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine, Select, and_, case, cast, delete, exists, func, insert, or_, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import GenericFunction
from sqlalchemy.types import Integer, LargeBinary

from assay.master.errors import InvalidArgumentError, NotFoundError
from assay.master.store._base import StoreBase, now
from assay.master.store._models import TaskLog, Trial
from assay.master.store._records import LOG_LEVELS, LogFilter, LogLine

# The stream of the lines Assay itself writes into a trial's log (gaps, the quota).
MARKER_STREAM = "assay"
QUOTA_MARKER = "assay: this trial's log reached its quota"
MAX_READ = 100_000


def message_bytes(message: str) -> int:
    """The UTF-8 size of a line's text (an ASCII line's length, without encoding it)."""
    return len(message) if message.isascii() else len(message.encode("utf-8", "replace"))


def line_rows(run_id: int, lines: Sequence[LogLine]) -> list[dict[str, object]]:
    """The rows of a run's lines, stamped now where the line has no time of its own."""
    return [
        {
            "run_id": run_id,
            "rank": line.rank,
            "stream": line.stream,
            "level": line.level,
            "timestamp": line.timestamp or now(),
            "message": line.message,
        }
        for line in lines
    ]


def quota_line(quota_bytes: int, run_id: int) -> dict[str, object]:
    mib = quota_bytes / 2**20
    return {
        "run_id": run_id,
        "rank": 0,
        "stream": MARKER_STREAM,
        "level": "WARNING",
        "timestamp": now(),
        "message": f"{QUOTA_MARKER} of {mib:g} MiB (the master's log_quota_mb): the lines "
        "after this one are dropped. Print less (log every N batches), or ask an "
        "administrator to raise log_quota_mb.",
    }


class LogQueries(StoreBase):
    """Trial logs."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        # trial id -> bytes of message text stored, and whether its quota marker is in.
        self._log_bytes: dict[int, tuple[int, bool]] = {}
        self._log_bytes_lock = threading.Lock()

    def append_logs(
        self,
        trial_id: int,
        run_id: int,
        lines: Sequence[LogLine],
        *,
        quota_bytes: int | None = None,
    ) -> int:
        """Append lines in one transaction; return the id of the last one (0 if none).

        With `quota_bytes`, only the lines that fit in the trial's quota are stored; the
        first append that reaches it adds one marker line, later ones store nothing.
        Not idempotent: a retried append stores its lines again.
        """
        if not lines:
            return 0
        with self.write() as s:
            # Appends of one trial are serialised, so ids become visible in order and a
            # follower reading "after id N" never skips a line committed late.
            if s.get(Trial, trial_id, with_for_update=True) is None:
                raise NotFoundError(f"trial {trial_id} does not exist")
            rows = line_rows(run_id, lines)
            if quota_bytes is not None:
                rows = self._within_quota(s, trial_id, run_id, rows, quota_bytes)
                if not rows:
                    return 0
            for row in rows:
                row["trial_id"] = trial_id
            s.execute(insert(TaskLog), rows)
            last = s.execute(select(func.max(TaskLog.id)).where(TaskLog.trial_id == trial_id))
            return int(last.scalar() or 0)

    def _within_quota(
        self,
        s: Session,
        trial_id: int,
        run_id: int,
        rows: list[dict[str, object]],
        quota_bytes: int,
    ) -> list[dict[str, object]]:
        """The rows that fit (a prefix), plus the marker when this append reaches the
        quota. Called holding the trial's row lock, so the count cannot race."""
        with self._log_bytes_lock:
            known = self._log_bytes.get(trial_id)
        if known is None:
            known = _stored_bytes(s, trial_id)
        used, marked = known
        if marked:
            return []
        kept = len(rows)
        total = used
        for i, row in enumerate(rows):
            size = message_bytes(str(row["message"]))
            if total + size > quota_bytes:
                kept = i
                break
            total += size
        if kept < len(rows):
            rows = [*rows[:kept], quota_line(quota_bytes, run_id)]
            marked = True
        # Written back before the commit: a failed commit leaves a count too high by this
        # batch, which drops a little early rather than letting a log grow past its quota.
        with self._log_bytes_lock:
            self._log_bytes[trial_id] = (total, marked)
        return rows

    def tail_logs(
        self,
        trial_id: int,
        *,
        after_id: int = 0,
        limit: int = 1000,
        level: str | None = None,
        where: LogFilter | None = None,
    ) -> list[LogLine]:
        """Lines with id > `after_id`, oldest first (follow by passing the last id seen);
        `where` keeps only the lines it matches."""
        _check_limit(limit)
        query = _lines_of(trial_id, level, where).where(TaskLog.id > after_id)
        return self._read_lines(query.order_by(TaskLog.id).limit(limit))

    def last_logs(
        self,
        trial_id: int,
        count: int,
        *,
        level: str | None = None,
        where: LogFilter | None = None,
    ) -> list[LogLine]:
        """The newest `count` lines (that `where` matches), oldest first: one backward
        walk of the trial's index, however long its log is."""
        _check_limit(count)
        query = _lines_of(trial_id, level, where).order_by(TaskLog.id.desc()).limit(count)
        return self._read_lines(query)[::-1]

    def _read_lines(self, query: Select[TaskLog]) -> list[LogLine]:
        with self.read() as s:
            return [
                LogLine(
                    message=r.message,
                    rank=r.rank,
                    stream=r.stream,
                    level=r.level,
                    timestamp=r.timestamp,
                    id=r.id,
                    run_id=r.run_id,
                )
                for r in s.execute(query).scalars()
            ]

    def expired_log_trials(self, ended_before: dt.datetime, limit: int = 1000) -> list[int]:
        """Trials that ended before `ended_before` and still have log lines."""
        has_lines = exists().where(TaskLog.trial_id == Trial.id)
        query = (
            select(Trial.id)
            .where(Trial.end_time.is_not(None), Trial.end_time < ended_before, has_lines)
            .order_by(Trial.id)
            .limit(limit)
        )
        with self.read() as s:
            return list(s.execute(query).scalars())

    def delete_logs(self, trial_id: int, batch: int = 5000) -> int:
        """Delete up to `batch` of the trial's oldest lines in one short transaction;
        return how many went (fewer than `batch`: the log is empty now). Idempotent."""
        oldest = (
            select(TaskLog.id)
            .where(TaskLog.trial_id == trial_id)
            .order_by(TaskLog.id)
            .limit(batch)
            .scalar_subquery()
        )
        with self.write() as s:
            deleted = s.execute(delete(TaskLog).where(TaskLog.id.in_(oldest)))
        with self._log_bytes_lock:
            self._log_bytes.pop(trial_id, None)
        return int(deleted.rowcount)  # type: ignore[attr-defined]


class _position(GenericFunction[int]):  # noqa: N801 - named as SQL functions are
    """Where a text first occurs in another, from 1 (0: nowhere): a plain, case-sensitive
    search, as LIKE (which reads % and _) is not; strpos on PostgreSQL, instr on SQLite."""

    type = Integer()
    name = "assay_position"
    inherit_cache = True


@compiles(_position)
def _strpos(element: _position, compiler: SQLCompiler, **kw: Any) -> str:
    return f"strpos({compiler.process(element.clauses, **kw)})"


@compiles(_position, "sqlite")
def _instr(element: _position, compiler: SQLCompiler, **kw: Any) -> str:
    return f"instr({compiler.process(element.clauses, **kw)})"


def _check_limit(limit: int) -> None:
    if not 1 <= limit <= MAX_READ:
        raise InvalidArgumentError(f"limit must be 1-{MAX_READ}, got {limit}")


def _lines_of(trial_id: int, level: str | None, where: LogFilter | None = None) -> Select[TaskLog]:
    query = select(TaskLog).where(TaskLog.trial_id == trial_id)
    if level is not None:
        query = query.where(TaskLog.level == level)
    if where is None or where.everything:
        return query
    if where.ranks is not None:
        query = query.where(TaskLog.rank.in_(sorted(where.ranks)))
    below = where.levels_below()
    if "INFO" in below:  # a line without a level (or another) counts as INFO: left out too
        query = query.where(TaskLog.level.in_(LOG_LEVELS[len(below) :]))
    elif below:
        query = query.where(or_(TaskLog.level.is_(None), TaskLog.level.not_in(below)))
    if where.since is not None:
        query = query.where(TaskLog.timestamp >= where.since.astimezone(dt.UTC))
    if where.text:
        query = query.where(_position(TaskLog.message, where.text) > 0)
    return query


def _stored_bytes(s: Session, trial_id: int) -> tuple[int, bool]:
    """The bytes of message text a trial's log holds, and whether its quota marker is in
    (one pass over the trial's lines, once per trial per master start)."""
    if s.get_bind().dialect.name == "postgresql":
        size = func.octet_length(TaskLog.message)
    else:
        size = func.length(cast(TaskLog.message, LargeBinary))
    marker = case(
        (
            and_(
                TaskLog.stream == MARKER_STREAM,
                TaskLog.message.startswith(QUOTA_MARKER, autoescape=True),
            ),
            1,
        ),
        else_=0,
    )
    found = s.execute(
        select(func.coalesce(func.sum(size), 0), func.coalesce(func.max(marker), 0)).where(
            TaskLog.trial_id == trial_id
        )
    ).one()
    return int(found[0]), bool(found[1])


__all__ = ["MARKER_STREAM", "LogQueries", "message_bytes"]
