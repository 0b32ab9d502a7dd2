"""Trial logs: lines appended by a trial's processes (and the master), read in order.

Lines get increasing ids per trial; a follower asks for the lines after the last id it
saw, so it never misses or repeats one.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, insert, select

from assay.master.errors import InvalidArgumentError, NotFoundError
from assay.master.store._base import StoreBase, now
from assay.master.store._models import TaskLog, Trial
from assay.master.store._records import LogLine


class LogQueries(StoreBase):
    """Trial logs."""

    def append_logs(self, trial_id: int, run_id: int, lines: Sequence[LogLine]) -> int:
        """Append lines in one transaction; return the id of the last one (0 if none)."""
        if not lines:
            return 0
        with self.write() as s:
            # Appends of one trial are serialised, so ids become visible in order and a
            # follower reading "after id N" never skips a line committed late.
            if s.get(Trial, trial_id, with_for_update=True) is None:
                raise NotFoundError(f"trial {trial_id} does not exist")
            s.execute(
                insert(TaskLog),
                [
                    {
                        "trial_id": trial_id,
                        "run_id": run_id,
                        "rank": line.rank,
                        "stream": line.stream,
                        "level": line.level,
                        "timestamp": line.timestamp or now(),
                        "message": line.message,
                    }
                    for line in lines
                ],
            )
            last = s.execute(select(func.max(TaskLog.id)).where(TaskLog.trial_id == trial_id))
            return int(last.scalar() or 0)

    def tail_logs(
        self, trial_id: int, *, after_id: int = 0, limit: int = 1000, level: str | None = None
    ) -> list[LogLine]:
        """Lines with id > `after_id`, oldest first (follow by passing the last id seen)."""
        if not 1 <= limit <= 100_000:
            raise InvalidArgumentError(f"limit must be 1-100000, got {limit}")
        query = select(TaskLog).where(TaskLog.trial_id == trial_id, TaskLog.id > after_id)
        if level is not None:
            query = query.where(TaskLog.level == level)
        with self.read() as s:
            rows = s.execute(query.order_by(TaskLog.id).limit(limit)).scalars()
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
                for r in rows
            ]


__all__ = ["LogQueries"]
