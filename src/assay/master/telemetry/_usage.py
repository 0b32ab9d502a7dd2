"""Usage accounting on the master's side: which pool a part is charged to, the window a
report covers, and a report for one caller (a regular user sees only their own).

The records themselves are written with the allocations (`Interpreter`) and read by the
store (`store/_usage.py`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

from assay.master.errors import InvalidArgumentError
from assay.master.store import GROUP_BY, GroupBy, PoolUsage, Store, UsageRow, pool_usage

if TYPE_CHECKING:
    import threading

    from assay.master.fleet import Fleet


class _Master(Protocol):
    @property
    def lock(self) -> threading.RLock: ...

    @property
    def fleet(self) -> Fleet: ...


# A report's window when the caller names no start: the 30 days before its end.
DEFAULT_DAYS = 30
# The longest window a report covers (split by day, about ten years of rows per group).
MAX_DAYS = 3660


def pool_of(fleet: Fleet, agent_id: str) -> str:
    """The resource pool an agent's slots are charged to (its own, from its registration;
    the master's default pool for an agent the fleet does not know)."""
    return fleet.pool_of(agent_id) or fleet.scheduler.default


def connected_slots(fleet: Fleet) -> dict[str, list[tuple[str, int]]]:
    """Each pool's connected agents as (agent id, slots) (the caller holds the master's
    lock)."""
    slots: dict[str, list[tuple[str, int]]] = {}
    for handle in fleet.agents.values():
        if handle.connected:
            slots.setdefault(pool_of(fleet, handle.id), []).append((handle.id, handle.slots))
    return slots


def capacity(master: _Master) -> dict[str, list[tuple[str, int]]]:
    """`connected_slots` of the master's fleet, read under its lock."""
    with master.lock:
        return connected_slots(master.fleet)


def parse_time(text: str, what: str) -> dt.datetime:
    """A day (`2026-11-01`, midnight UTC) or an ISO 8601 time (UTC unless it says)."""
    value = text.strip()
    try:
        if len(value) == 10:
            day = dt.date.fromisoformat(value)
            return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC)
        when = dt.datetime.fromisoformat(value)
    except (ValueError, OverflowError):
        raise InvalidArgumentError(
            f"{what} {text!r} is not a date: give a day as YYYY-MM-DD (midnight UTC) or a "
            "time as YYYY-MM-DDTHH:MM[:SS][+HH:MM|Z]"
        ) from None
    try:
        return when.replace(tzinfo=dt.UTC) if when.tzinfo is None else when.astimezone(dt.UTC)
    except OverflowError:
        raise InvalidArgumentError(f"{what} {text!r} is out of range") from None


def window(since: str, until: str, now: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    """[since, until) from a request's text: until defaults to now, since to
    `DEFAULT_DAYS` before until."""
    end = parse_time(until, "until") if until.strip() else now
    try:
        start = parse_time(since, "since") if since.strip() else end - dt.timedelta(DEFAULT_DAYS)
    except OverflowError:
        raise InvalidArgumentError(f"until {until!r} is too early: give since too") from None
    if end <= start:
        raise InvalidArgumentError(
            f"until ({end.isoformat()}) must be after since ({start.isoformat()})"
        )
    if end - start > dt.timedelta(MAX_DAYS):
        raise InvalidArgumentError(
            f"the window from {start.date()} to {end.date()} is longer than {MAX_DAYS} days: "
            "ask for a shorter one"
        )
    return start, end


def group_by(text: str) -> GroupBy:
    by = text.strip() or "user"
    if by not in GROUP_BY:
        raise InvalidArgumentError(
            f"cannot group usage by {text!r}: use one of {', '.join(GROUP_BY)}"
        )
    return cast(GroupBy, by)


@dataclass(frozen=True)
class UsageReport:
    since: dt.datetime
    until: dt.datetime
    by: GroupBy
    groups: list[UsageRow]
    pools: list[PoolUsage]  # empty for a regular user
    all_users: bool  # False: the caller's own usage only


def report(
    store: Store,
    *,
    user_id: int | None,
    by: str,
    since: str,
    until: str,
    per_day: bool,
    capacity: Mapping[str, Sequence[tuple[str, int]]],
    now: dt.datetime | None = None,
) -> UsageReport:
    """Usage in a window for one caller: `user_id` None for an administrator (everyone's
    usage, and each pool's used and idle shares), else that user's own usage only."""
    at = now or dt.datetime.now(dt.UTC)
    grouping = group_by(by)
    start, end = window(since, until, at)
    groups = store.slot_usage(start, end, grouping, per_day=per_day, user_id=user_id, at=at)
    pools: list[PoolUsage] = []
    if user_id is None:
        used = groups if grouping == "pool" and not per_day else None
        if used is None:
            used = store.slot_usage(start, end, "pool", at=at)
        joined = store.agents_joined()
        agents = {p: [(n, joined.get(a)) for a, n in found] for p, found in capacity.items()}
        pools = pool_usage(used, agents, start, end, at)
    return UsageReport(start, end, grouping, groups, pools, user_id is None)


__all__ = [
    "UsageReport",
    "capacity",
    "connected_slots",
    "parse_time",
    "pool_of",
    "report",
    "window",
]
