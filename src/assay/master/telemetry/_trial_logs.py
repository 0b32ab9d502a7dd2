"""Trial logs on the master: what one trial may store, how long it is kept, and reading
it (a tail, a follow) for the gRPC and HTTP APIs.

- `LogKeeper` stores an allocation's lines within the trial's quota (`log_quota_mb`)
  and, when `log_retention_days` is set, deletes the logs of trials that ended longer
  ago than that, as Determined's `logging_retention` does: on its own thread, never
  under the master's lock, a few thousand lines per transaction.
- `FollowerLimit` bounds the log streams one user keeps open (`log_followers_per_user`):
  each polls the store while it lasts.
- `stream_trial_logs` is StreamTrialLogs: the last `tail` lines come from one backward
  read of the trial's index, then the lines after them, page by page; its filters (ranks,
  a lowest level, a time, a text; `log_filter`) are the store's query, not a scan here.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Protocol, TypeVar

from assay.master.errors import InvalidArgumentError, ResourceExhaustedError
from assay.master.lifecycle import TERMINAL_TRIAL
from assay.master.store import LOG_LEVELS, LogFilter, LogLine, Store

log = logging.getLogger("assay.master")
_T = TypeVar("_T")
PAGE = 1000
# How often a follower looks for new lines, and checks its caller's session.
POLL_S = 0.25
RECHECK_S = 5.0
RETENTION_INTERVAL_S = 3600.0
RETENTION_FIRST_S = 30.0  # after start: the master's recovery goes first
DELETE_BATCH = 5000
MAX_SEARCH_TEXT = 1000


class Reader(Protocol):
    """Runs a blocking store call off the event loop."""

    def __call__(self, call: Callable[[], _T]) -> Awaitable[_T]: ...


class LogKeeper:
    """A trial log's quota and retention; `close()` stops the retention thread."""

    def __init__(
        self,
        store: Store,
        *,
        quota_mb: int = 0,
        retention_days: int = -1,
        interval_s: float = RETENTION_INTERVAL_S,
        first_s: float = RETENTION_FIRST_S,
        batch: int = DELETE_BATCH,
    ) -> None:
        """`quota_mb` 0: no quota; `retention_days` -1: keep logs for ever."""
        self.store = store
        self.quota_bytes = quota_mb * 2**20 if quota_mb > 0 else None
        self.retention_days = retention_days
        self.batch = batch
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if retention_days >= 0:
            self._thread = threading.Thread(
                target=self._retain, args=(first_s, interval_s), name="log-retention", daemon=True
            )
            self._thread.start()

    def append(self, trial_id: int, run_id: int, lines: Sequence[LogLine]) -> None:
        self.store.append_logs(trial_id, run_id, lines, quota_bytes=self.quota_bytes)

    def expire(self, now: dt.datetime | None = None) -> int:
        """Delete the logs of trials that ended over `retention_days` ago; return how
        many lines went. Each transaction deletes at most `batch` lines, so the master's
        commits wait for one short delete at most."""
        now = now or dt.datetime.now(dt.UTC)
        cutoff = now - dt.timedelta(days=self.retention_days)
        deleted = 0
        while not self._stop.is_set():
            trials = self.store.expired_log_trials(cutoff)
            if not trials:
                break
            for trial_id in trials:
                while not self._stop.is_set():
                    count = self.store.delete_logs(trial_id, self.batch)
                    deleted += count
                    if count < self.batch:
                        break
                    self._stop.wait(0.01)  # let other writers in between batches
        if deleted:
            log.info(
                "deleted %d log lines of trials that ended over %d days ago (log_retention_days)",
                deleted,
                self.retention_days,
            )
        return deleted

    def _retain(self, first_s: float, interval_s: float) -> None:
        wait = first_s
        while not self._stop.wait(wait):
            wait = interval_s
            try:
                self.expire()
            except Exception:
                log.exception("deleting expired trial logs failed; trying again in %gs", wait)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


class FollowerLimit:
    """How many log streams each user follows now, at most `per_user` each. Used on the
    event loop only (gRPC and HTTP follows both run there), so it needs no lock."""

    def __init__(self, per_user: int) -> None:
        self.per_user = per_user
        self._open: dict[str, int] = {}

    def full(self, user: str) -> bool:
        return self._open.get(user, 0) >= self.per_user

    def refusal(self, user: str) -> str:
        return (
            f"{user} already follows {self.per_user} trial logs, the most one user may "
            "(the master's log_followers_per_user): end one (a browser tab on a trial, an "
            "`assay trial logs -f`) and try again, or read without following"
        )

    @contextmanager
    def hold(self, user: str) -> Iterator[None]:
        """A follower's slot for as long as the block runs; `ResourceExhaustedError` when the
        user holds `per_user` already."""
        if self.full(user):
            raise ResourceExhaustedError(self.refusal(user))
        self._open[user] = self._open.get(user, 0) + 1
        try:
            yield
        finally:
            self._open[user] -= 1
            if not self._open[user]:
                del self._open[user]


def log_filter(
    ranks: Sequence[int],
    min_level: str,
    since: str,
    search_text: str,
    *,
    head: int,
    tail: int,
    follow: bool,
) -> LogFilter | None:
    """StreamTrialLogs's filters as the store reads them (None: every line), or
    InvalidArgumentError saying which one is wrong and how to write it."""
    if head < 0 or tail < 0:
        raise InvalidArgumentError("head and tail must not be negative")
    if head and (tail or follow):
        raise InvalidArgumentError("head cannot be combined with tail or follow")
    if any(rank < 0 for rank in ranks):
        raise InvalidArgumentError(f"ranks count from 0, got {min(ranks)}")
    level = min_level.upper() or None
    if level is not None and level not in LOG_LEVELS:
        raise InvalidArgumentError(
            f"min_level must be one of {', '.join(LOG_LEVELS)}, got {min_level[:40]!r}"
        )
    since_time = None
    if since:
        try:
            since_time = dt.datetime.fromisoformat(since)
            if since_time.tzinfo is not None:
                since_time = since_time.astimezone(dt.UTC)  # as the store keeps times
        except (ValueError, OverflowError):  # not a time; a year 1 ahead of UTC
            since_time = None
        if since_time is None or since_time.tzinfo is None:
            raise InvalidArgumentError(
                "since must be an RFC 3339 time with its offset, such as "
                f"2026-01-02T15:04:05Z, got {since[:40]!r}"
            )
    if len(search_text) > MAX_SEARCH_TEXT or "\x00" in search_text:
        raise InvalidArgumentError(
            f"search_text must be at most {MAX_SEARCH_TEXT} characters, without NUL"
        )
    found = LogFilter(
        ranks=frozenset(ranks) if ranks else None,
        min_level=level,
        since=since_time,
        text=search_text or None,
    )
    return None if found.everything else found


async def stream_trial_logs(
    store: Store,
    read: Reader,
    trial_id: int,
    *,
    after_id: int = 0,
    tail: int = 0,
    head: int = 0,
    follow: bool = False,
    where: LogFilter | None = None,
    still_allowed: Callable[[], Awaitable[object]] | None = None,
) -> AsyncGenerator[LogLine, None]:
    """The trial's lines after `after_id` that `where` matches (every line when None):
    only the last `tail` of them when `tail` > 0, or the first `head` when `head` > 0;
    then, when following, each new one until the trial ends. `read` runs a store call
    off the event loop; `still_allowed` raises when the caller's session has ended."""
    after = after_id
    if tail > 0:
        lines = await read(partial(store.last_logs, trial_id, tail, where=where))
        for line in lines:
            if line.id > after:
                yield line
        after = max([after, *(line.id for line in lines)])
        if not follow:
            return
    left = head if head > 0 else None
    loop = asyncio.get_running_loop()
    checked = loop.time()
    ending = False
    while True:
        newest = None
        if where is not None and follow:
            # The lines up to the newest one now are all readable (a trial's appends
            # commit in id order): a follower whose filter matched none of them need not
            # read them again at its next poll.
            last = await read(partial(store.last_logs, trial_id, 1))
            newest = last[-1].id if last else 0
        limit = PAGE if left is None else min(PAGE, left)
        page = await read(
            partial(store.tail_logs, trial_id, after_id=after, limit=limit, where=where)
        )
        for line in page:
            yield line
            after = line.id
        if left is not None:
            left -= len(page)
            if left <= 0:
                return
        if len(page) == limit:
            continue
        if newest is not None:
            after = max(after, newest)
        if ending or not follow:
            return
        if still_allowed is not None and loop.time() - checked > RECHECK_S:
            # A follow may last days: a logout or deactivation ends it too.
            await still_allowed()
            checked = loop.time()
        trial = await read(partial(store.get_trial, trial_id))
        if trial.state in TERMINAL_TRIAL:
            ending = True  # one more read: the lines written as it ended
            continue
        await asyncio.sleep(POLL_S)


__all__ = ["FollowerLimit", "LogKeeper", "log_filter", "stream_trial_logs"]
