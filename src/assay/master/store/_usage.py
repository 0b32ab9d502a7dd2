"""Slot usage: who held how many slots, where, and for how long (`slot_usage`).

Every allocation is also a usage record: one row per part (the slots it holds on one
agent), written in the batch that records the allocation and closed once, in the batch
that records its end. The master writes them through `WriteBatch` (the statements are
here); a master starting up closes any row whose allocation it no longer knows.

Reads count slot-seconds over a window [since, until): a row that spans a boundary
counts only its part inside, and an open row counts up to now. The rows that overlap the
window are read once (by index on their start and end) and clipped and summed here, the
same on SQLite and PostgreSQL (their date arithmetic differs); a day is a UTC day.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from sqlalchemy import (
    Insert,
    Update,
    bindparam,
    exists,
    func,
    insert,
    literal_column,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.orm import Session

from assay.master.store._base import StoreBase, now
from assay.master.store._models import Allocation, Experiment, SlotUsage, User

GroupBy = Literal["user", "experiment", "pool", "agent", "day"]
GROUP_BY: tuple[str, ...] = get_args(GroupBy)
DAY = dt.timedelta(days=1)


@dataclass(frozen=True)
class UsagePart:
    """The slots an allocation holds on one agent."""

    agent_id: str
    slots: int
    slot_type: str
    pool: str


@dataclass(frozen=True)
class UsageRow:
    """Slot-seconds of one group (and one day of it, when split by day) in a window."""

    key: str  # username, experiment id, pool, agent id, or the day (YYYY-MM-DD)
    name: str  # the experiment's name for experiments; else the key
    day: str  # YYYY-MM-DD when split by day too, else ""
    slot_seconds: float

    @property
    def slot_hours(self) -> float:
        return self.slot_seconds / 3600


@dataclass(frozen=True)
class PoolUsage:
    """How much of a pool's slot time was used in a window.

    `capacity_slot_seconds` counts the agents connected when asked, each from the later of
    the window's start and its first join to the window's end (or now): an agent that
    left during the window is not counted, and one that was away for part of it is
    counted as if it had been there.
    """

    pool: str
    used_slot_seconds: float
    capacity_slot_seconds: float

    @property
    def used_ratio(self) -> float:
        cap = self.capacity_slot_seconds
        return min(1.0, self.used_slot_seconds / cap) if cap > 0 else 0.0

    @property
    def idle_ratio(self) -> float:
        return 1.0 - self.used_ratio if self.capacity_slot_seconds > 0 else 0.0


# --- writes (run by WriteBatch in the master's group commit) -------------------------------


def open_statement() -> Insert:
    """One part of a new allocation, charged to the experiment's owner (user 0 if the
    experiment has no row: accounting never fails the batch it is part of). Written with
    executemany: the owner is looked up by the statement, not one query per part."""
    owner = (
        select(Experiment.owner_id)
        .where(Experiment.id == bindparam("experiment_id"))
        .scalar_subquery()
    )
    return insert(SlotUsage).values(
        allocation_id=bindparam("allocation_id"),
        agent_id=bindparam("agent_id"),
        slots=bindparam("slots"),
        slot_type=bindparam("slot_type"),
        pool=bindparam("pool"),
        user_id=func.coalesce(owner, literal_column("0")),
        experiment_id=bindparam("experiment_id"),
        trial_id=bindparam("trial_id"),
        run_id=bindparam("run_id"),
        started_at=bindparam("started_at"),
        ended_at=null(),
    )


def close_statement(one_agent: bool) -> Update:
    """End an allocation's open rows (with `one_agent`, one agent's): a row already
    closed keeps its end, so closing again changes nothing."""
    query = update(SlotUsage).where(
        SlotUsage.allocation_id == bindparam("allocation_id"), SlotUsage.ended_at.is_(None)
    )
    if one_agent:
        query = query.where(SlotUsage.agent_id == bindparam("agent_id"))
    return query.values(ended_at=bindparam("ended_at"))


def close_orphans(session: Session, when: dt.datetime) -> None:
    """End every open row whose allocation is not open any more: at the allocation's end
    when it has one, else at `when` (the moment the master found it gone)."""
    live = exists().where(Allocation.id == SlotUsage.allocation_id, Allocation.ended_at.is_(None))
    ended = (
        select(Allocation.ended_at)
        .where(Allocation.id == SlotUsage.allocation_id)
        .scalar_subquery()
    )
    session.execute(
        update(SlotUsage)
        .where(SlotUsage.ended_at.is_(None), ~live)
        .values(ended_at=func.coalesce(ended, utc(when)))
        .execution_options(synchronize_session=False)
    )


# --- reads ---------------------------------------------------------------------------------


class UsageQueries(StoreBase):
    """Slot usage over a window, by user, experiment, pool, agent or day."""

    def slot_usage(
        self,
        since: dt.datetime,
        until: dt.datetime,
        by: GroupBy,
        *,
        per_day: bool = False,
        user_id: int | None = None,
        at: dt.datetime | None = None,
    ) -> list[UsageRow]:
        """Slot-seconds in [since, until) per group, largest first (by day: in order).

        `per_day` splits each group by UTC day as well; `user_id` counts that user's
        allocations only; open rows count up to `at` (default: now).
        """
        if by not in GROUP_BY:
            raise ValueError(f"cannot group usage by {by!r}: use one of {', '.join(GROUP_BY)}")
        since, until = utc(since), utc(until)
        if until <= since:
            raise ValueError(f"the window is empty: until ({until}) is not after since ({since})")
        current = utc(at or now())
        totals: dict[tuple[str, str], float] = {}
        names: dict[str, str] = {}
        with self.read() as s:
            query = (
                select(
                    SlotUsage.started_at,
                    SlotUsage.ended_at,
                    SlotUsage.slots,
                    User.username,
                    SlotUsage.experiment_id,
                    Experiment.name,
                    SlotUsage.pool,
                    SlotUsage.agent_id,
                )
                .join(User, User.id == SlotUsage.user_id, isouter=True)
                .join(Experiment, Experiment.id == SlotUsage.experiment_id, isouter=True)
                .where(
                    SlotUsage.started_at < until,
                    or_(SlotUsage.ended_at.is_(None), SlotUsage.ended_at > since),
                )
            )
            if user_id is not None:
                query = query.where(SlotUsage.user_id == user_id)
            for row in s.execute(query):
                start = max(utc(row[0]), since)
                end = min(utc(row[1]) if row[1] is not None else current, until)
                if end <= start:
                    continue
                key, name = _group(by, row)
                if per_day or by == "day":
                    pieces = _split(start, end)
                else:
                    pieces = [("", (end - start).total_seconds())]
                for day, seconds in pieces:
                    group = (day, day) if by == "day" else (key, name)
                    names[group[0]] = group[1]
                    cell = (group[0], day if per_day else "")
                    totals[cell] = totals.get(cell, 0.0) + seconds * row[2]
        rows = [UsageRow(k, names[k], d, v) for (k, d), v in totals.items()]
        if by == "day" or per_day:
            rows.sort(key=lambda r: (r.day or r.key, r.key))
        else:
            rows.sort(key=lambda r: (-r.slot_seconds, r.key))
        return rows

    def experiment_slot_seconds(
        self, experiment_ids: Sequence[int], at: dt.datetime | None = None
    ) -> dict[int, float]:
        """All the slot-seconds each experiment's allocations held (open ones up to now)."""
        current = utc(at or now())
        totals = dict.fromkeys(experiment_ids, 0.0)
        if not experiment_ids:
            return totals
        with self.read() as s:
            rows = s.execute(
                select(
                    SlotUsage.experiment_id,
                    SlotUsage.started_at,
                    SlotUsage.ended_at,
                    SlotUsage.slots,
                ).where(SlotUsage.experiment_id.in_(list(experiment_ids)))
            )
            for experiment_id, start, end, slots in rows:
                span = (utc(end) if end is not None else current) - utc(start)
                totals[experiment_id] += max(0.0, span.total_seconds()) * slots
        return totals

    def open_usage(self) -> list[tuple[str, str]]:
        """(allocation id, agent id) of the rows not closed yet, in order."""
        with self.read() as s:
            rows = s.execute(
                select(SlotUsage.allocation_id, SlotUsage.agent_id)
                .where(SlotUsage.ended_at.is_(None))
                .order_by(SlotUsage.allocation_id, SlotUsage.agent_id)
            )
            return [(a, b) for a, b in rows]


def pool_usage(
    used: Sequence[UsageRow],
    capacity: Mapping[str, Sequence[tuple[int, dt.datetime | None]]],
    since: dt.datetime,
    until: dt.datetime,
    at: dt.datetime | None = None,
) -> list[PoolUsage]:
    """Each pool's used and available slot-seconds in [since, until), from its usage
    (`slot_usage(..., by="pool")`) and its connected agents as (slots, first joined; None:
    unknown, counted from `since`), see `PoolUsage`."""
    since, until = utc(since), utc(until)
    end = min(until, utc(at or now()))
    by_pool: dict[str, float] = {}
    for row in used:
        by_pool[row.key] = by_pool.get(row.key, 0.0) + row.slot_seconds
    available: dict[str, float] = {}
    for pool, agents in capacity.items():
        available[pool] = sum(
            slots * max(0.0, (end - max(since, utc(joined) if joined else since)).total_seconds())
            for slots, joined in agents
        )
    pools = sorted(set(by_pool) | set(available))
    return [PoolUsage(p, by_pool.get(p, 0.0), available.get(p, 0.0)) for p in pools]


def _group(by: str, row: Any) -> tuple[str, str]:
    if by == "user":
        username = row[3] if row[3] is not None else "(deleted user)"
        return username, username
    if by == "experiment":
        key = str(row[4])
        return key, row[5] if row[5] is not None else f"experiment {key} (deleted)"
    if by == "pool":
        return row[6], row[6]
    if by == "agent":
        return row[7], row[7]
    return "", ""  # by day: the key is each day's


def _split(start: dt.datetime, end: dt.datetime) -> list[tuple[str, float]]:
    """[start, end) as (UTC day, seconds in it) pairs."""
    out: list[tuple[str, float]] = []
    day = dt.datetime(start.year, start.month, start.day, tzinfo=dt.UTC)
    while day < end:
        nxt = day + DAY
        span = (min(end, nxt) - max(start, day)).total_seconds()
        if span > 0:
            out.append((day.date().isoformat(), span))
        day = nxt
    return out


def utc(when: dt.datetime) -> dt.datetime:
    # SQLite keeps no offset: every time is stored in UTC and read back as UTC.
    return when.replace(tzinfo=dt.UTC) if when.tzinfo is None else when.astimezone(dt.UTC)


__all__ = [
    "GROUP_BY",
    "GroupBy",
    "PoolUsage",
    "UsagePart",
    "UsageQueries",
    "UsageRow",
    "close_orphans",
    "close_statement",
    "open_statement",
    "pool_usage",
]
